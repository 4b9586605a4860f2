// ModelActor, DefaultSerialModelExecutor, mainContext and identifier hand-off, in the Swift 6 language mode: these
// tests compile only if the API is clean under strict concurrency.
import Foundation
import Testing
@testable import Replica

/// A background actor in SwiftData's shape, written out as the `@ModelActor` macro would generate it.
actor OImporter: ModelActor {
    let modelContainer: ModelContainer
    let modelExecutor: any ModelExecutor

    init(modelContainer: ModelContainer) {
        self.modelContainer = modelContainer
        self.modelExecutor = DefaultSerialModelExecutor(modelContainer: modelContainer)
    }

    /// Inserts lists and returns their identifiers (what crosses back to the caller).
    func importLists(_ names: [String]) throws -> [PersistentIdentifier] {
        let ids = names.map { modelContext.insert(OList(name: $0)).persistentModelID }
        try modelContext.save()
        return ids
    }

    /// Renames the list `id` (handed over from another isolation domain).
    func rename(_ id: PersistentIdentifier, to name: String) throws -> Bool {
        guard var list = try modelContext.model(for: id, as: OList.self) else { return false }
        list.name = name
        modelContext.update(list)
        try modelContext.save()
        return true
    }

    func name(of id: PersistentIdentifier) throws -> String? {
        try modelContext.model(for: id, as: OList.self)?.name
    }

    /// Registers a change with autosave on and returns without saving.
    func insertWithAutosave(_ name: String) -> PersistentIdentifier {
        modelContext.autosaveEnabled = true
        return modelContext.insert(OList(name: name)).persistentModelID
    }

    func hasChanges() -> Bool { modelContext.hasChanges }
    func autosaveEnabledByDefault() -> Bool { modelContext.autosaveEnabled }
}

@Suite("Model actors and the main context")
struct ModelActorTests {
    @Test("a ModelActor saves through its own context; identifiers cross to the main actor and back")
    @MainActor
    func handOffBetweenActors() async throws {
        let container = try observationContainer()
        let importer = OImporter(modelContainer: container)
        #expect(await importer.autosaveEnabledByDefault() == false)
        let ids = try await importer.importLists(["Groceries", "Travel"])
        // The main context reads what the actor saved.
        let main = container.mainContext
        #expect(try main.model(for: ids[0], as: OList.self)?.name == "Groceries")
        // The main actor edits, the actor sees the edit.
        var travel = try #require(try main.model(for: ids[1], as: OList.self))
        travel.name = "Trips"
        main.update(travel)
        try main.save()
        #expect(try await importer.name(of: ids[1]) == "Trips")
        // And the other way round.
        #expect(try await importer.rename(ids[0], to: "Food"))
        #expect(try main.model(for: ids[0], as: OList.self)?.name == "Food")
        #expect(try main.model(for: ids[0], as: OTask.self) == nil)
    }

    @Test("mainContext is one context per container, made on first use, with autosave on")
    @MainActor
    func mainContextIsUnique() throws {
        let container = try observationContainer()
        #expect(container.mainContext === container.mainContext)
        #expect(container.mainContext.autosaveEnabled)
        #expect(ModelContext(container).autosaveEnabled == false)
    }

    @Test("several actors and tasks write concurrently; every save lands")
    func concurrentActorsAndTasks() async throws {
        let container = try observationContainer(file: true)
        let importers = (0..<3).map { _ in OImporter(modelContainer: container) }
        let all = try await withThrowingTaskGroup(of: [PersistentIdentifier].self) { group in
            for (index, importer) in importers.enumerated() {
                group.addTask { try await importer.importLists((0..<5).map { "list \(index)-\($0)" }) }
            }
            // A plain task with a context of its own.
            group.addTask {
                let context = ModelContext(container)
                let id = context.insert(OList(name: "from a task")).persistentModelID
                try context.save()
                return [id]
            }
            var ids: [PersistentIdentifier] = []
            for try await batch in group { ids += batch }
            return ids
        }
        #expect(all.count == 16)
        #expect(try ModelContext(container).fetchCount(FetchDescriptor<OList>()) == 16)
    }

    @Test("registeredModel(for:) returns pending changes only; model(for:) reads the store")
    func registeredModel() throws {
        let container = try observationContainer()
        let context = ModelContext(container)
        let list = context.insert(OList(name: "pending"))
        #expect(try context.registeredModel(for: list.persistentModelID, as: OList.self)?.name == "pending")
        try context.save()
        #expect(try context.registeredModel(for: list.persistentModelID, as: OList.self) == nil)
        #expect(try context.model(for: list.persistentModelID, as: OList.self)?.name == "pending")
    }

    @Test("a ModelActor's context autosaves after the actor's current job when enabled")
    func actorAutosave() async throws {
        let container = try observationContainer()
        let importer = OImporter(modelContainer: container)
        let id = await importer.insertWithAutosave("autosaved")
        // The autosave runs on the actor's queue after the job that registered the change.
        var turns = 0
        while await importer.hasChanges(), turns < 1_000 {
            turns += 1
            await Task.yield()
        }
        #expect(await importer.hasChanges() == false)
        #expect(try ModelContext(container).model(for: id, as: OList.self)?.name == "autosaved")
    }
}
