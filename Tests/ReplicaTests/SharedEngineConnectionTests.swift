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

    /// A fetch result applied while the context enumerates (same connection, a read statement in progress): the
    /// enumeration finishes without error and the merged rows are visible afterwards.
    @Test func aMergeAppliedWhileTheContextEnumeratesOnTheSameConnection() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try container(seed: 1), b = try container(seed: 2)
        let ca = ModelContext(a), cb = ModelContext(b)
        let ea = try SyncEngine(container: a, storeName: "main", sharingConnectionOf: ca)
        let eb = try SyncEngine(container: b, storeName: "main", sharingConnectionOf: cb)
        for i in 0..<5 { _ = cb.insert(Trip(name: "b\(i)")) }
        try cb.save()
        for i in 0..<5 { _ = ca.insert(Trip(name: "a\(i)")) }
        try ca.save()
        try sync(ea, cloud)
        try sync(eb, cloud)
        // b edits everything; a enumerates its trips and syncs in the middle.
        for var trip in try cb.fetch(Trip.self) { trip.rating = 9; cb.update(trip) }
        try cb.save()
        try sync(eb, cloud)
        var seen = 0
        try ca.enumerate(FetchDescriptor<Trip>(), batchSize: 2) { _ in
            seen += 1
            if seen == 3 { try sync(ea, cloud) }
        }
        #expect(seen == 10)
        #expect(try ca.fetch(Trip.self).map(\.rating) == Array(repeating: 9, count: 10))
        #expect(try ea.status().pendingRecords == 0)
    }

    /// Unsaved context edits survive a merge on the shared connection, and saving them afterwards wins over the
    /// merged (older) version; rollback afterwards leaves the merged data.
    @Test func unsavedEditsAcrossAMergeOnTheSharedConnection() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try container(seed: 3), b = try container(seed: 4)
        let ca = ModelContext(a), cb = ModelContext(b)
        let ea = try SyncEngine(container: a, storeName: "main", sharingConnectionOf: ca)
        let eb = try SyncEngine(container: b, storeName: "main", sharingConnectionOf: cb)
        let trip = ca.insert(Trip(name: "Lisbon", rating: 1))
        let other = ca.insert(Trip(name: "Porto", rating: 1))
        try ca.save()
        try sync(ea, cloud)
        try sync(eb, cloud)
        var remote = try #require(try cb.model(Trip.self, id: trip.id))
        remote.rating = 5
        cb.update(remote)
        var remoteOther = try #require(try cb.model(Trip.self, id: other.id))
        remoteOther.destination = "north"
        cb.update(remoteOther)
        try cb.save()
        try sync(eb, cloud)

        var local = try #require(try ca.model(Trip.self, id: trip.id))
        local.rating = 7
        ca.update(local)
        var localOther = try #require(try ca.model(Trip.self, id: other.id))
        localOther.rating = 3
        ca.update(localOther)
        try sync(ea, cloud) // merges b's edits while a has unsaved edits
        #expect(ca.hasChanges, "the merge does not drop the context's unsaved edits")
        try ca.save()
        try sync(ea, cloud)
        try sync(eb, cloud)
        let onA = try ca.fetch(Trip.self).map { "\($0.name) \($0.rating) \($0.destination ?? "-")" }.sorted()
        let onB = try cb.fetch(Trip.self).map { "\($0.name) \($0.rating) \($0.destination ?? "-")" }.sorted()
        #expect(onA == ["Lisbon 7 -", "Porto 3 north"], "a's later edits win, b's untouched field merges in")
        #expect(onA == onB)

        // A rollback after a merge drops only the unsaved edit.
        var x = try #require(try ca.model(Trip.self, id: trip.id))
        x.rating = 100
        ca.update(x)
        var y = try #require(try cb.model(Trip.self, id: trip.id))
        y.name = "Lisboa"
        cb.update(y)
        try cb.save()
        try sync(eb, cloud)
        try sync(ea, cloud)
        ca.rollback()
        #expect(try ca.fetch(Trip.self).map { "\($0.name) \($0.rating)" }.sorted() == ["Lisboa 7", "Porto 3"])
    }

    /// Crash-like drop: an engine goes away between taking a request and its answer (an upload in flight, a fetch
    /// in flight); the context keeps working, a new engine on the same context picks up, and both devices converge.
    @Test func anEngineDroppedWithRequestsInFlightThenANewOneOnTheSameContext() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try container(seed: 7), b = try container(seed: 8)
        let ca = ModelContext(a), cb = ModelContext(b)
        let eb = try SyncEngine(container: b, storeName: "main", sharingConnectionOf: cb)
        for i in 0..<3 { _ = cb.insert(Trip(name: "b\(i)")) }
        try cb.save()
        try sync(eb, cloud)
        do {
            let ea = try SyncEngine(container: a, storeName: "main", sharingConnectionOf: ca)
            _ = ca.insert(Trip(name: "a0"))
            try ca.save()
            ea.setNeedsFetch()
            // Perform requests at the cloud but drop the engine before handing it the answers.
            for _ in 0..<3 {
                guard let request = try ea.nextRequest() else { break }
                _ = cloud.performNow(request.operation)
            }
        }
        _ = ca.insert(Trip(name: "a1"))
        try ca.save()
        let again = try SyncEngine(container: a, storeName: "main", sharingConnectionOf: ca)
        try sync(again, cloud)
        try sync(eb, cloud)
        try sync(again, cloud)
        #expect(try ca.fetch(Trip.self).map(\.name).sorted() == ["a0", "a1", "b0", "b1", "b2"])
        #expect(try cb.fetch(Trip.self).map(\.name).sorted() == ["a0", "a1", "b0", "b1", "b2"])
        #expect(try again.status().pendingRecords == 0)
    }

    /// Two engines created on one context (same connection, same store): both sync without corrupting each other,
    /// and a second device sees every change.
    @Test func twoEnginesSharingOneContext() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try container(seed: 5), b = try container(seed: 6)
        let ca = ModelContext(a), cb = ModelContext(b)
        let e1 = try SyncEngine(container: a, storeName: "main", sharingConnectionOf: ca)
        let e2 = try SyncEngine(container: a, storeName: "main", sharingConnectionOf: ca)
        let eb = try SyncEngine(container: b, storeName: "main", sharingConnectionOf: cb)
        for i in 0..<4 { _ = ca.insert(Trip(name: "t\(i)")) }
        try ca.save()
        // Interleave the two engines' requests.
        e1.setNeedsFetch(); e2.setNeedsFetch()
        for _ in 0..<300 {
            let r1 = try e1.nextRequest(), r2 = try e2.nextRequest()
            if r1 == nil && r2 == nil { break }
            let res1 = r1.map { cloud.performNow($0.operation) }
            let res2 = r2.map { cloud.performNow($0.operation) }
            if let r1, let res1 { try e1.handle(r1.id, res1) }
            if let r2, let res2 { try e2.handle(r2.id, res2) }
        }
        try sync(e1, cloud)
        try sync(e2, cloud)
        try sync(eb, cloud)
        #expect(try cb.fetch(Trip.self).map(\.name).sorted() == ["t0", "t1", "t2", "t3"])
        #expect(try e1.status().pendingRecords == 0)
        #expect(try e2.status().pendingRecords == 0)
        #expect(try ca.fetch(Trip.self).count == 4)
    }
}
