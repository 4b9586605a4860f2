import Foundation
import Testing
@testable import Replica

// Models of the reference-loading tests: a shelf holds folders, a folder holds notes.

struct RShelf: PersistentModel, Codable {
    var id = UUID.unassigned
    var room: String = ""
    var folders: [Reference<RFolder>] = []
    static let entity = ModelEntity<RShelf>([
        .attribute("room", \.room, default: ""),
        .toMany("folders", \.folders, inverse: "shelf"),
    ])
}

struct RFolder: PersistentModel, Codable {
    var id = UUID.unassigned
    var name: String = ""
    var color: String?
    var shelf: Reference<RShelf>?
    var notes: [Reference<RNote>] = []
    static let entity = ModelEntity<RFolder>([
        .attribute("name", \.name, default: ""),
        .attribute("color", \.color),
        .toOne("shelf", \.shelf, inverse: "folders"),
        .toMany("notes", \.notes, inverse: "folder"),
    ])
}

struct RNote: PersistentModel, Codable {
    var id = UUID.unassigned
    var text: String = ""
    var folder: Reference<RFolder>?
    static let entity = ModelEntity<RNote>([
        .attribute("text", \.text, default: ""),
        .toOne("folder", \.folder, inverse: "notes"),
    ])
}

/// A model with a required reference (local stores only).
struct RPage: PersistentModel, Codable {
    var id = UUID.unassigned
    var number: Int = 0
    var note: Reference<RNote>
    static let entity = ModelEntity<RPage>([
        .attribute("number", \.number, default: 0),
        .toOne("note", \.note),
    ])
}

@Suite("References that load their targets on access")
struct ReferenceLoadingTests {
    /// A container with a shelf, a folder on it and two notes in the folder, saved.
    static func seeded(file: Bool = false) throws -> (ModelContainer, shelf: RShelf, folder: RFolder, notes: [RNote]) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-reference-\(UUID().uuidString)")
        let container = try ModelContainer(for: RShelf.self, RFolder.self, RNote.self, RPage.self,
                                           configurations: ModelConfiguration("refs", isStoredInMemoryOnly: !file),
                                           environment: .seeded(seed: 7, directory: directory))
        let context = ModelContext(container)
        let shelf = context.insert(RShelf(room: "study"))
        let folder = context.insert(RFolder(name: "Recipes", color: "red", shelf: Reference(shelf)))
        let notes = [context.insert(RNote(text: "bread", folder: Reference(folder))),
                     context.insert(RNote(text: "soup", folder: Reference(folder)))]
        try context.save()
        return (container, shelf, folder, notes)
    }

    @Test("a to-one target that was not prefetched loads on access through the context that fetched the model")
    func toOneLoadsOnAccess() throws {
        let (container, _, folder, _) = try Self.seeded()
        let context = ModelContext(container)
        let note = try #require(try context.fetch(FetchDescriptor<RNote>(sortBy: [SortDescriptor(\.text)])).first)
        #expect(note.folder?.resolved == nil, "not prefetched")
        #expect(note.folder?.name == "Recipes")
        #expect(note.folder?.color == "red")
        #expect(try note.folder?.loadTarget()?.id == folder.id)
        // Prefetching stays the fast path: the target comes with the fetch.
        var descriptor = FetchDescriptor<RNote>()
        descriptor.relationshipKeyPathsForPrefetching = [\.folder]
        #expect(try context.fetch(descriptor).allSatisfy { $0.folder?.resolved?.name == "Recipes" })
    }

    @Test("targets chain: a loaded target's own references load too, and to-many members load on access")
    func chainedAndToManyLoads() throws {
        let (container, _, _, _) = try Self.seeded(file: true)
        let context = ModelContext(container)
        let note = try #require(try context.fetch(FetchDescriptor<RNote>(sortBy: [SortDescriptor(\.text)])).first)
        #expect(note.folder?.shelf?.room == "study")
        let shelf = try #require(try context.fetch(RShelf.self).first)
        #expect(shelf.folders.first?.name == "Recipes")
        #expect(shelf.folders.first?.notes?.count == 2)
        let folder = try #require(try context.fetch(RFolder.self).first)
        #expect(Set(folder.notes.compactMap(\.text)) == ["bread", "soup"])
    }

    @Test("a loaded target is cached for its context until that context saves")
    func cachedUntilTheContextSaves() throws {
        let (container, _, folder, _) = try Self.seeded()
        let context = ModelContext(container)
        let note = try #require(try context.fetch(RNote.self).first)
        #expect(note.folder?.name == "Recipes")

        let other = ModelContext(container)
        var renamed = try #require(try other.model(RFolder.self, id: folder.id))
        renamed.name = "Baking"
        other.update(renamed)
        try other.save()
        #expect(note.folder?.name == "Recipes", "cached: the first load is what this context saw")

        context.insert(RShelf(room: "kitchen"))
        try context.save()
        #expect(note.folder?.name == "Baking", "the context's save clears its cache")
    }

    @Test("a reference whose context is gone reads nil, and loadTarget says why")
    func contextGone() throws {
        let (container, _, _, _) = try Self.seeded()
        var note: RNote?
        do {
            let context = ModelContext(container)
            note = try context.fetch(RNote.self).first
        }
        let orphan = try #require(note)
        let reference = try #require(orphan.folder)
        #expect(reference.name == nil)
        #expect(throws: ReplicaError.noContextForReference(reference.persistentModelID)) { try reference.loadTarget() }
        // Any context loads it explicitly.
        #expect(try reference.load(in: ModelContext(container))?.name == "Recipes")
    }

    @Test("a reference made from an ID or decoded carries no context: nil, a typed error, or load(in:)")
    func referencesWithoutContext() throws {
        let (container, _, folder, _) = try Self.seeded()
        let made = Reference<RFolder>(folder.id)
        #expect(made.name == nil)
        #expect(throws: ReplicaError.noContextForReference(made.persistentModelID)) { try made.loadTarget() }
        let decoded = try JSONDecoder().decode(Reference<RFolder>.self, from: JSONEncoder().encode(made))
        #expect(decoded.color == nil)
        let context = ModelContext(container)
        #expect(try decoded.load(in: context)?.name == "Recipes")
        // load(in:) sees the context's unsaved changes.
        var pending = try #require(try context.model(RFolder.self, id: folder.id))
        pending.name = "Unsaved"
        context.update(pending)
        #expect(try decoded.load(in: context)?.name == "Unsaved")
    }

    @Test("a deleted target reads nil, never traps; a required reference does too")
    func deletedTarget() throws {
        let (container, _, folder, notes) = try Self.seeded()
        let writer = ModelContext(container)
        let page = writer.insert(RPage(number: 1, note: Reference(notes[0])))
        try writer.save()

        let context = ModelContext(container)
        let note = try #require(try context.model(RNote.self, id: notes[0].id))
        let fetchedPage = try #require(try context.model(RPage.self, id: page.id))
        writer.delete(try #require(try writer.model(RFolder.self, id: folder.id)))
        writer.delete(try #require(try writer.model(RNote.self, id: notes[0].id)))
        try writer.save()

        // The fetched copies still name the deleted records.
        #expect(note.folder?.id == folder.id)
        #expect(note.folder?.name == nil)
        #expect(try note.folder?.loadTarget() == nil)
        #expect(fetchedPage.note.text == nil)
        #expect(try fetchedPage.note.loadTarget() == nil)
    }

    @Test("models with loadable references stay Sendable: another task reads through them")
    func readFromAnotherTask() async throws {
        let (container, _, _, _) = try Self.seeded(file: true)
        let context = ModelContext(container)
        let notes = try context.fetch(FetchDescriptor<RNote>(sortBy: [SortDescriptor(\.text)]))
        let names = try await withThrowingTaskGroup(of: String?.self) { group in
            for note in notes { group.addTask { note.folder?.shelf?.room } }
            var names: [String?] = []
            for try await name in group { names.append(name) }
            return names
        }
        #expect(names == ["study", "study"])
        withExtendedLifetime(context) {}
    }

    @Test("a context's loader gives its connections back when the context goes away")
    func loaderFreesItsConnections() throws {
        let (container, _, _, _) = try Self.seeded(file: true)
        let location = Connection.Location.file(try #require(container.url(of: "refs")))
        #expect(Connection.openCount(at: location) == 0)
        var note: RNote?
        do {
            let context = ModelContext(container)
            note = try context.fetch(RNote.self).first
            #expect(note?.folder?.name == "Recipes")
            #expect(Connection.openCount(at: location) == 2, "the context's connection and its loader's")
        }
        #expect(Connection.openCount(at: location) == 0)
        #expect(note?.folder?.name == nil)
    }
}
