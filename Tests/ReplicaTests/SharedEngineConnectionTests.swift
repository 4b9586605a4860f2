import Foundation
import Testing
@_spi(Simulation) @testable import Replica

/// A sync engine created with `sharingConnectionOf:` runs on its context's connection (one connection per store for
/// a single-threaded driver such as the simulator): it syncs as an engine with its own connection does, keeps the
/// context alive, and leaves the connection to the context when it goes away.
@Suite("Sync engine sharing its context's connection")
struct SharedEngineConnectionTests {
    private func container(seed: UInt64) throws -> ModelContainer {
        let environment = ReplicaEnvironment.seeded(seed: seed, directory: FileManager.default.temporaryDirectory
            .appendingPathComponent("replica-shared-\(UUID().uuidString)"))
        return try ModelContainer(for: Schema([Trip.self, Item.self]), configurations: [
            ModelConfiguration("main", isStoredInMemoryOnly: true, cloudKitDatabase: .private("iCloud.test")),
        ], environment: environment)
    }

    private func sync(_ engine: SyncEngine, _ cloud: InMemoryCloudDatabase) throws {
        engine.setNeedsFetch()
        for _ in 0..<200 {
            guard let request = try engine.nextRequest() else { return }
            try engine.handle(request.id, cloud.performNow(request.operation))
        }
        Issue.record("the engine did not settle")
    }

    @Test func twoDevicesSyncInsertsEditsAndDeletesThroughSharedConnections() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try container(seed: 1), b = try container(seed: 2)
        let contextA = ModelContext(a), contextB = ModelContext(b)
        let engineA = try SyncEngine(container: a, storeName: "main", sharingConnectionOf: contextA)
        let engineB = try SyncEngine(container: b, storeName: "main", sharingConnectionOf: contextB)
        #expect(engineA.db === (try contextA.connection(for: 0)))

        let lisbon = contextA.insert(Trip(name: "Lisbon", rating: 3)), porto = contextA.insert(Trip(name: "Porto"))
        try contextA.save()
        try sync(engineA, cloud)
        try sync(engineB, cloud)
        #expect(try contextB.fetch(Trip.self).map(\.name).sorted() == ["Lisbon", "Porto"])

        var edited = try #require(try contextB.model(Trip.self, id: lisbon.id))
        edited.rating = 5
        contextB.update(edited)
        contextB.delete(try #require(try contextB.model(Trip.self, id: porto.id)))
        try contextB.save()
        try sync(engineB, cloud)
        try sync(engineA, cloud)
        #expect(try contextA.fetch(Trip.self).map { "\($0.name) \($0.rating)" } == ["Lisbon 5"])
        #expect(try engineA.status().pendingRecords == 0)
        #expect(try engineB.status().pendingRecords == 0)
    }

    @Test func theEngineKeepsItsContextAndLeavesTheConnectionToIt() throws {
        let container = try container(seed: 3)
        let store = container.stores[0]
        var context: ModelContext? = ModelContext(container)
        weak let weakContext = context
        var engine: SyncEngine? = try SyncEngine(container: container, storeName: "main", sharingConnectionOf: context!)
        let shared = try #require(engine?.db)
        _ = context?.insert(Trip(name: "Lisbon"))
        try context?.save()
        context = nil
        #expect(weakContext != nil, "the engine keeps the context whose connection it uses")
        #expect(try engine?.status().pendingRecords == 1)

        // A context that outlives its engine keeps using the connection: the engine does not give it back to the store.
        let second = ModelContext(container)
        var secondEngine: SyncEngine? = try SyncEngine(container: container, storeName: "main", sharingConnectionOf: second)
        let secondShared = try #require(secondEngine?.db)
        secondEngine = nil
        let other = try store.openConnection()
        #expect(other !== secondShared, "a connection still used by its context is not handed to another owner")
        store.reuse(other)
        _ = second.insert(Trip(name: "Porto"))
        try second.save()

        // When the engine goes, its context goes too and gives the connection back for the next owner.
        engine = nil
        #expect(weakContext == nil)
        let next = try store.openConnection()
        #expect(next === shared)
        store.reuse(next)
        #expect(try ModelContext(container).fetch(Trip.self).map(\.name).sorted() == ["Lisbon", "Porto"])
    }
}
