import CSQLite
import Foundation
import Synchronization
import Testing
@testable import Replica

/// An in-memory store that goes away leaves one connection to its layout; the next new in-memory store with the same
/// entities starts from it, emptied (`StoreLayout.takeRetired()`): its schema is parsed and its statements prepared
/// already. The recycled store must be indistinguishable from a new one.
/// Models of their own per test: the retired connections wait per layout (entities), and tests run in parallel.
struct RecycleTrip: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    var rating: Int = 0
    var stops: [Reference<RecycleStop>] = []
    static let entity = ModelEntity<RecycleTrip>([
        .attribute("name", \.name, default: "", options: .preserveValueOnDeletion),
        .attribute("rating", \.rating, default: 0),
        .toMany("stops", \.stops, inverse: "trip", deleteRule: .cascade),
    ])
}

struct RecycleStop: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var title: String = ""
    var trip: Reference<RecycleTrip>?
    static let entity = ModelEntity<RecycleStop>([
        .attribute("title", \.title, default: ""),
        .toOne("trip", \.trip, inverse: "stops"),
    ])
}

struct RecycleSchemaChange: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    static let entity = ModelEntity<RecycleSchemaChange>([.attribute("name", \.name, default: "")])
}

struct RecycleHeld: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    static let entity = ModelEntity<RecycleHeld>([.attribute("name", \.name, default: "")])
}

struct RecycleKinds: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    static let entity = ModelEntity<RecycleKinds>([.attribute("name", \.name, default: "")])
}

struct RecycleKindsExtra: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    static let entity = ModelEntity<RecycleKindsExtra>([.attribute("name", \.name, default: "")])
}

struct RecycleLive: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    static let entity = ModelEntity<RecycleLive>([.attribute("name", \.name, default: "")])
}

struct RecycleOverlay: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    static let entity = ModelEntity<RecycleOverlay>([.attribute("name", \.name, default: "")])
}

struct RecycleConcurrent: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    static let entity = ModelEntity<RecycleConcurrent>([.attribute("name", \.name, default: "")])
}

struct RecycleSynced: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    var rating: Int = 0
    static let entity = ModelEntity<RecycleSynced>([
        .attribute("name", \.name, default: ""),
        .attribute("rating", \.rating, default: 0),
    ])
}

@Suite("In-memory store recycling")
struct StoreRecyclingTests {
    /// Rows of every TEMP table of the store's next connection, as "table: count".
    private func tempRows(_ container: ModelContainer) throws -> [String] {
        let store = container.stores[0]
        let db = try store.openConnection()
        defer { store.reuse(db) }
        var result: [String] = []
        for row in try db.rows("SELECT name FROM sqlite_temp_master WHERE type = 'table' ORDER BY name", cache: false) {
            guard case let .text(table) = row[0] else { continue }
            if case let .integer(count)? = try db.scalar("SELECT count(*) FROM temp.\(quoted(table))"), count > 0 {
                result.append("\(table): \(count)")
            }
        }
        return result
    }

    /// Every row of every table (sqlite_sequence included), as text, table by table.
    private func contents(_ container: ModelContainer) throws -> [String] {
        let store = container.stores[0]
        let db = try store.openConnection()
        defer { store.reuse(db) }
        var result: [String] = []
        for row in try db.rows("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name", cache: false) {
            guard case let .text(table) = row[0] else { continue }
            // Sorted as text: some tables have no rowid.
            result += try db.rows("SELECT * FROM main.\(quoted(table))", cache: false).map { "\(table): " + $0.map(render).joined(separator: ", ") }.sorted()
        }
        return result
    }

    private func render(_ value: SQLiteValue) -> String {
        switch value {
        case .null: return "null"
        case let .integer(v): return "i\(v)"
        case let .real(v): return "r\(v)"
        case let .text(v): return "t'\(v)'"
        case let .blob(v): return "x'" + v.map { String(format: "%02x", $0) }.joined() + "'"
        }
    }

    /// The same writes, saves and sync on a container (the same seed gives the same identifiers and clock).
    private func work(_ container: ModelContainer, cloud: InMemoryCloudDatabase) throws {
        let context = ModelContext(container)
        let trip = context.insert(RecycleTrip(name: "Lisbon", rating: 2))
        _ = context.insert(RecycleStop(title: "tram 28", trip: Reference(trip)))
        try context.save()
        var edited = trip
        edited.rating = 4
        context.update(edited)
        try context.save()
        let engine = try SyncEngine(container: container, storeName: "main")
        engine.setNeedsFetch()
        for _ in 0..<50 {
            guard let request = try engine.nextRequest() else { break }
            try engine.handle(request.id, cloud.performNow(request.operation))
        }
    }

    @Test func aRecycledStoreHoldsWhatANewOneHoldsAfterTheSameWork() throws {
        let models: [any PersistentModel.Type] = [RecycleTrip.self, RecycleStop.self]
        var old: ModelContainer? = try inMemoryContainer(seed: 7, models: models)
        let fresh = try inMemoryContainer(seed: 9, models: models)
        try work(old!, cloud: InMemoryCloudDatabase())
        let oldHandle = try nextConnectionHandle(old!)
        let oldIdentity = old!.stores[0].identity
        old = nil

        let recycled = try inMemoryContainer(seed: 9, models: models)
        #expect(try nextConnectionHandle(recycled) == oldHandle, "the new store starts from the connection the old one left")
        #expect(recycled.stores[0].identity != oldIdentity)
        #expect(try contents(recycled) == (try contents(fresh)), "emptied, it holds what a new store holds")
        #expect(try ModelContext(recycled).fetch(RecycleTrip.self).isEmpty)

        try work(recycled, cloud: InMemoryCloudDatabase())
        try work(fresh, cloud: InMemoryCloudDatabase())
        let after = try contents(recycled)
        #expect(after.contains { $0.hasPrefix("sqlite_sequence: ") }, "the history's AUTOINCREMENT counter is in the comparison")
        #expect(after == (try contents(fresh)), "the same work leaves the same rows, history tokens and sequences")
    }

    @Test func aStoreWhoseSchemaChangedIsNotRecycled() throws {
        var old: ModelContainer? = try inMemoryContainer(seed: 1, models: [RecycleSchemaChange.self])
        let oldLocation = old!.stores[0].location
        do {
            let store = old!.stores[0]
            let db = try store.openConnection()
            try db.execute("CREATE TABLE extra (x)")
            store.reuse(db)
        }
        old = nil
        let next = try inMemoryContainer(seed: 2, models: [RecycleSchemaChange.self])
        #expect(next.stores[0].location != oldLocation)
        let tables = try next.stores[0].openConnection().rows("SELECT name FROM sqlite_master WHERE name = 'extra'", cache: false)
        #expect(tables.isEmpty)
    }

    @Test func storesOfOtherEntitiesOrKindsDoNotShareConnections() throws {
        var synced: ModelContainer? = try inMemoryContainer(seed: 1, models: [RecycleKinds.self])
        let syncedHandle = try nextConnectionHandle(synced!)
        synced = nil
        let local = try inMemoryContainer(seed: 2, synced: false, models: [RecycleKinds.self])
        #expect(try nextConnectionHandle(local) != syncedHandle, "a local store has another layout (no sync tables)")
        let more = try inMemoryContainer(seed: 3, models: [RecycleKinds.self, RecycleKindsExtra.self])
        #expect(try nextConnectionHandle(more) != syncedHandle)
        let same = try inMemoryContainer(seed: 4, models: [RecycleKinds.self])
        #expect(try nextConnectionHandle(same) == syncedHandle)
    }

    @Test func aStoreWhoseConnectionIsStillReadElsewhereIsNotRecycled() throws {
        var old: ModelContainer? = try inMemoryContainer(seed: 1, models: [RecycleHeld.self])
        do {
            let context = ModelContext(old!)
            _ = context.insert(RecycleHeld(name: "kept"))
            try context.save()
        }
        // A statement outside the caches outlives the container (as a lazily read result could).
        let held: Statement
        do {
            let store = old!.stores[0]
            let db = try store.openConnection()
            held = try Statement(connection: db, sql: "SELECT name FROM \"RecycleHeld\"")
            store.reuse(db)
        }
        let oldLocation = old!.stores[0].location
        old = nil
        let next = try inMemoryContainer(seed: 2, models: [RecycleHeld.self])
        #expect(next.stores[0].location != oldLocation, "the database is still read through the held statement")
        #expect(try held.step())
        #expect(held.string(0) == "kept")
    }

    /// A fetch with unsaved changes fills a TEMP table with the pending rows (QueryEngine.overlay). TEMP tables are
    /// per connection, so `takeRetired()` must empty them too (`resetForReuse()` does not drop them): otherwise the
    /// next, unrelated in-memory store holds the unsaved data of the store that went away on its connection. The API
    /// never reads it without first deleting it (overlay starts with `DELETE FROM temp...`), so no query result would
    /// show it — but the data would outlive its store in memory, and the new store's database would not be
    /// "indistinguishable from a new one".
    @Test func unsavedRowsInTempOverlayTablesDoNotSurviveRecycling() throws {
        var old: ModelContainer? = try inMemoryContainer(seed: 1, synced: false, models: [RecycleOverlay.self])
        var oldHandle: OpaquePointer?
        do {
            let context = ModelContext(old!)
            _ = context.insert(RecycleOverlay(name: "unsaved secret"))
            #expect(try context.fetch(RecycleOverlay.self).map(\.name) == ["unsaved secret"], "the fetch overlays the pending insert")
            context.rollback()
        }
        // The context gave its connection back: it is the one the store hands out next (and would retire).
        oldHandle = try nextConnectionHandle(old!)
        #expect(try tempRows(old!).isEmpty == false, "the overlay's TEMP table holds the pending row")
        old = nil
        let next = try inMemoryContainer(seed: 2, synced: false, models: [RecycleOverlay.self])
        let recycled = try nextConnectionHandle(next) == oldHandle
        #expect(recycled, "the new store starts from the old one's connection")
        #expect(try ModelContext(next).fetch(RecycleOverlay.self).isEmpty)
        if recycled {
            let leftover = try tempRows(next)
            // Regression: `takeRetired()` emptied only `main` tables; TEMP tables of the connection
            // (QueryEngine's pending-change overlays) kept the old store's unsaved rows
            // (["replica_pending_RecycleOverlay_0: 1"]).
            #expect(leftover == [], "no row of the old store stays on the recycled connection")
        }
    }

    /// Stores with the same entities created, used and dropped from several threads at once: every store sees only
    /// its own rows, history and identity.
    @Test func storesMadeConcurrentlyFromSeveralThreadsStayIsolated() throws {
        let failures = Mutex<[String]>([])
        let identities = Mutex<[UUID]>([])
        DispatchQueue.concurrentPerform(iterations: 8) { worker in
            for round in 0..<25 {
                do {
                    let container = try inMemoryContainer(seed: UInt64(worker * 1000 + round), synced: true, models: [RecycleConcurrent.self])
                    let context = ModelContext(container)
                    let name = "w\(worker)-r\(round)"
                    let before = try context.fetch(RecycleConcurrent.self).map(\.name)
                    if !before.isEmpty { failures.withLock { $0.append("\(name): a new store holds \(before)") } }
                    _ = context.insert(RecycleConcurrent(name: name))
                    try context.save()
                    let names = try ModelContext(container).fetch(RecycleConcurrent.self).map(\.name)
                    let history = try context.fetchHistory()
                    let engine = try SyncEngine(container: container, storeName: "main")
                    let pending = try engine.status().pendingRecords
                    if names != [name] || history.count != 1 || pending != 1 {
                        failures.withLock { $0.append("\(name): rows \(names), history \(history.count), pending \(pending)") }
                    }
                    identities.withLock { $0.append(container.stores[0].identity) }
                } catch {
                    failures.withLock { $0.append("w\(worker)-r\(round): \(error)") }
                }
            }
        }
        #expect(failures.withLock { $0 } == [])
        let all = identities.withLock { $0 }
        #expect(Set(all).count == all.count, "every store has its own replica identity")
    }

    /// A recycled synced store used for sync with a new cloud uploads nothing of the store that went away, and its
    /// HLC is not carried over: it ends up exactly as a device with a never-used store.
    @Test func aRecycledSyncedStoreUploadsNothingOfTheOldOne() throws {
        var old: ModelContainer? = try inMemoryContainer(seed: 11, synced: true, models: [RecycleSynced.self])
        do {
            let context = ModelContext(old!)
            for i in 0..<5 { _ = context.insert(RecycleSynced(name: "old \(i)", rating: i)) }
            try context.save()
            let engine = try SyncEngine(container: old!, storeName: "main")
            try sync(engine, InMemoryCloudDatabase())
            // An unsynced edit left behind as well.
            var first = try #require(try context.fetch(RecycleSynced.self).first)
            first.rating = 99
            context.update(first)
            try context.save()
        }
        let oldHandle = try nextConnectionHandle(old!)
        old = nil

        let recycled = try inMemoryContainer(seed: 12, synced: true, models: [RecycleSynced.self])
        #expect(try nextConnectionHandle(recycled) == oldHandle, "the new store starts from the old one's connection")
        let cloud = InMemoryCloudDatabase()
        let engine = try SyncEngine(container: recycled, storeName: "main")
        #expect(try engine.status().pendingRecords == 0)
        try sync(engine, cloud)
        #expect(cloud.records(in: "main").isEmpty, "nothing of the old store reaches the cloud")
        #expect(try ModelContext(recycled).fetch(RecycleSynced.self).isEmpty)
        #expect(try ModelContext(recycled).fetchHistory().isEmpty)
    }

    /// Two in-memory containers with the same entities alive at once never share a database, even when retired
    /// connections wait.
    @Test func twoLiveContainersNeverShareADatabase() throws {
        var dropped: [ModelContainer?] = try (0..<3).map { try inMemoryContainer(seed: UInt64(20 + $0), synced: false, models: [RecycleLive.self]) }
        for container in dropped {
            let context = ModelContext(container!)
            _ = context.insert(RecycleLive(name: "dropped"))
            try context.save()
        }
        dropped = []
        let a = try inMemoryContainer(seed: 30, synced: false, models: [RecycleLive.self])
        let b = try inMemoryContainer(seed: 31, synced: false, models: [RecycleLive.self])
        #expect(a.stores[0].location != b.stores[0].location)
        let ca = ModelContext(a), cb = ModelContext(b)
        _ = ca.insert(RecycleLive(name: "a"))
        try ca.save()
        #expect(try cb.fetch(RecycleLive.self).isEmpty)
        #expect(try ca.fetch(RecycleLive.self).map(\.name) == ["a"])
    }

    /// Read-only in-memory stores between writable ones: a writable store never gets a read-only connection, and a
    /// read-only store never sees a dropped store's rows.
    @Test func readOnlyInMemoryStoresAmongRecycledOnes() throws {
        func make(_ seed: UInt64, allowsSave: Bool) throws -> ModelContainer {
            let environment = ReplicaEnvironment.seeded(seed: seed, directory: FileManager.default.temporaryDirectory
                .appendingPathComponent("replica-recycle-ro-\(UUID().uuidString)"))
            return try ModelContainer(for: Schema([RecycleSynced.self]), configurations: [
                ModelConfiguration("main", isStoredInMemoryOnly: true, allowsSave: allowsSave, cloudKitDatabase: .none),
            ], environment: environment)
        }
        for round in 0..<3 {
            do {
                let writable = try make(UInt64(100 + round), allowsSave: true)
                let context = ModelContext(writable)
                _ = context.insert(RecycleSynced(name: "w\(round)"))
                try context.save()
            }
            // A read-only in-memory store cannot be opened at all ("no such table: replica_metadata": nothing creates
            // its schema) — also on first use, with no recycling involved; what matters here is the stores around it.
            if let readOnly = try? make(UInt64(200 + round), allowsSave: false) {
                #expect(try ModelContext(readOnly).fetch(RecycleSynced.self).isEmpty)
            }
            let writable = try make(UInt64(300 + round), allowsSave: true)
            let context = ModelContext(writable)
            #expect(try context.fetch(RecycleSynced.self).isEmpty)
            _ = context.insert(RecycleSynced(name: "x\(round)"))
            try context.save()
            #expect(try ModelContext(writable).fetch(RecycleSynced.self).map(\.name) == ["x\(round)"])
        }
    }
}
