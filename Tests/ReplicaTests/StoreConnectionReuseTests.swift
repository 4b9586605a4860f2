import CSQLite
import Foundation
import Testing
@testable import Replica

/// An in-memory store hands the connection that created it to its first owner (context or sync engine), and owners
/// that go away give their connections back for the next one (see `Store.reuse(_:)`): a short-lived container opens
/// one connection per concurrent owner, not one per owner plus one to keep the database alive. Per-process layouts
/// (schema SQL, entity statements, template database) are shared by every store with the same entities.
@Suite("Store connection reuse and layouts")
struct StoreConnectionReuseTests {
    private func container(inMemory: Bool = true, synced: Bool = false, seed: UInt64 = 1) throws -> ModelContainer {
        let environment = ReplicaEnvironment.seeded(seed: seed, directory: FileManager.default.temporaryDirectory
            .appendingPathComponent("replica-reuse-\(UUID().uuidString)"))
        return try ModelContainer(for: Schema([Trip.self, Item.self]), configurations: [
            ModelConfiguration("main", isStoredInMemoryOnly: inMemory, cloudKitDatabase: synced ? .private("iCloud.test") : .none),
        ], environment: environment)
    }

    @Test func theFirstOwnerGetsTheConnectionThatCreatedTheStoreAndOwnersGiveTheirsBack() throws {
        let container = try container()
        let store = container.stores[0]
        let first = try store.openConnection()
        let second = try store.openConnection()
        #expect(first !== second)
        let handle = first.handle
        store.reuse(first)
        let again = try store.openConnection()
        #expect(again.handle == handle, "a connection given back is the next one handed out")
        store.reuse(again)
        store.reuse(second)
    }

    @Test func inMemoryDataOutlivesEveryOwnerWhileTheContainerLives() throws {
        let container = try container(synced: true)
        do {
            // The engine takes the connection that created the store; the context opens another.
            let engine = try SyncEngine(container: container, storeName: "main")
            let context = ModelContext(container)
            context.insert(Trip(name: "Lisbon"))
            try context.save()
            _ = try engine.status()
        }
        // Both went away: their connections wait in the store, so the database is still there.
        #expect(try ModelContext(container).fetch(Trip.self).map(\.name) == ["Lisbon"])
        let engine = try SyncEngine(container: container, storeName: "main")
        #expect(try engine.status().pendingRecords == 1)
    }

    @Test func aConnectionGivenBackInsideATransactionIsRolledBack() throws {
        let container = try container()
        let store = container.stores[0]
        let db = try store.openConnection()
        try db.begin(.immediate)
        try db.run("INSERT INTO replica_metadata (key, value) VALUES ('uncommitted', 1)")
        store.reuse(db)
        #expect(!db.isInTransaction)
        let next = try store.openConnection()
        #expect(next === db)
        #expect(try next.scalar("SELECT value FROM replica_metadata WHERE key = 'uncommitted'") == nil)
        // It can write again (no transaction left open, no savepoint depth left over).
        try next.transaction { try next.run("INSERT INTO replica_metadata (key, value) VALUES ('committed', 1)") }
        #expect(try ModelContext(container).connection(for: 0).scalar("SELECT value FROM replica_metadata WHERE key = 'committed'") == .integer(1))
    }

    @Test func aConnectionGivenBackWithAnUnfinishedQueryIsReset() throws {
        let container = try container()
        let context = ModelContext(container)
        for name in ["a", "b", "c"] { context.insert(Trip(name: name)) }
        try context.save()
        let store = container.stores[0]
        let db = try store.openConnection()
        // A query stepped once and never reset holds a read transaction open (an old snapshot).
        let statement = try db.cachedStatement("SELECT name FROM \"Trip\" ORDER BY name")
        #expect(try statement.step())
        #expect(sqlite3_stmt_busy(statement.handle) != 0)
        store.reuse(db)
        #expect(sqlite3_stmt_busy(statement.handle) == 0)
        // The next owner sees what others commit after it was given back.
        context.insert(Trip(name: "d"))
        try context.save()
        let next = try store.openConnection()
        #expect(next === db)
        #expect(try next.rows("SELECT count(*) FROM \"Trip\"") == [[.integer(4)]])
    }

    @Test func fileStoresDoNotKeepConnections() throws {
        let container = try container(inMemory: false)
        let store = container.stores[0]
        let db = try store.openConnection()
        store.reuse(db)
        #expect(try store.openConnection() !== db)
    }

    @Test func contextsOfOneInMemoryContainerTakeTurnsWithOneConnection() throws {
        let container = try container()
        var handles: Set<OpaquePointer> = []
        for i in 0..<5 {
            let context = ModelContext(container)
            context.insert(Trip(name: "t\(i)"))
            try context.save()
            handles.insert(try context.connection(for: 0).handle)
        }
        #expect(handles.count == 1)
        #expect(try ModelContext(container).fetchCount(FetchDescriptor<Trip>()) == 5)
    }

    @Test func storesWithTheSameEntitiesShareOneLayout() throws {
        let a = try container(seed: 1), b = try container(seed: 2)
        #expect(a.stores[0].statements.map { ObjectIdentifier($0.insertKey) } == b.stores[0].statements.map { ObjectIdentifier($0.insertKey) })
        #expect(a.stores[0].identity != b.stores[0].identity)
        // Different data all the same: the stores are separate databases.
        let context = ModelContext(a)
        context.insert(Trip(name: "only in a"))
        try context.save()
        #expect(try ModelContext(b).fetch(Trip.self).isEmpty)
    }

    @Test func aNewSyncedStoreRecordsItsIdentityAndDefaultsInOneStep() throws {
        for inMemory in [true, false] {
            let container = try container(inMemory: inMemory, synced: true)
            let db = try container.stores[0].openConnection()
            let fingerprint = Store.defaultsFingerprint(container.stores[0].entities)
            #expect(try db.scalar("SELECT value FROM replica_metadata WHERE key = 'synced_defaults'") == .text(fingerprint), "in memory: \(inMemory)")
            #expect(try db.scalar("SELECT value FROM replica_metadata WHERE key = 'identity'") == container.stores[0].identity.sqliteValue)
        }
    }

    @Test func memoryDatabaseNamesAreEscapedOnlyWhenTheyNeedIt() {
        #expect(Connection.uriPath("replica-main-1-0A1B") == "replica-main-1-0A1B")
        #expect(Connection.uriPath("a?b#c%d e") == "a%3Fb%23c%25d%20e")
    }

    @Test("contexts on many threads at once share an in-memory store's connections without losing or leaking writes")
    func manyThreadsManyContexts() async throws {
        let environment = ReplicaEnvironment.seeded(seed: 4, directory: FileManager.default.temporaryDirectory
            .appendingPathComponent("replica-reuse-\(UUID().uuidString)"))
        let container = try ModelContainer(for: Schema([Trip.self, Item.self]), configurations: [
            ModelConfiguration("main", isStoredInMemoryOnly: true)], environment: environment)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for worker in 0..<8 {
                group.addTask {
                    for i in 0..<25 {
                        let context = ModelContext(container)
                        context.author = "w\(worker)"
                        context.insert(Trip(name: "w\(worker)-\(i)"))
                        if i % 5 == 0 {
                            // Leave a transaction open and an unfinished statement behind.
                            let db = try context.connection(for: 0)
                            try db.begin(.deferred)
                            let statement = try db.cachedStatement("SELECT name FROM \"Trip\"")
                            _ = try statement.step()
                            continue
                        }
                        try context.save()
                    }
                }
            }
            try await group.waitForAll()
        }
        let context = ModelContext(container)
        #expect(try context.fetchCount(FetchDescriptor<Trip>()) == 8 * 20)
        let history = try context.fetchHistory()
        #expect(history.count == 8 * 20)
        for transaction in history {
            let names = try transaction.changes.compactMap { change -> String? in
                guard case let .insert(id) = change, id.entityName == "Trip" else { return nil }
                return try context.model(Trip.self, id: id.id)?.name
            }
            #expect(names.allSatisfy { $0.hasPrefix(transaction.author ?? "?") }, "author of another owner leaked: \(transaction.author ?? "nil") \(names)")
        }
    }

    @Test("an in-memory store's sync engine dropped with a request outstanding: the next engine gets its connection and uploads everything once")
    func engineDroppedMidRequest() throws {
        let cloud = InMemoryCloudDatabase()
        var environment = ReplicaEnvironment.seeded(seed: 61, directory: temporaryTestDirectory())
        environment.canaries = []
        let clock = environment.clock as! ManualClock
        let container = try ModelContainer(for: Schema([SyncNote.self]), configurations: [
            ModelConfiguration("notes", isStoredInMemoryOnly: true, cloudKitDatabase: .private("iCloud.test"))], environment: environment)
        let context = ModelContext(container)
        for i in 0..<5 { context.insert(SyncNote(title: "n\(i)")) }
        try context.save()
        for round in 0..<3 {
            let engine = try SyncEngine(container: container, storeName: "notes")
            engine.setNeedsFetch()
            // Perform a few requests, then leave one outstanding (its answer never handled) and drop the engine.
            for _ in 0..<(round + 1) {
                guard let request = try engine.nextRequest() else { break }
                try engine.handle(request.id, cloud.performNow(request.operation))
            }
            if let request = try engine.nextRequest() { _ = cloud.performNow(request.operation) }
            context.insert(SyncNote(title: "r\(round)"))
            try context.save()
        }
        let engine = try SyncEngine(container: container, storeName: "notes")
        engine.setNeedsFetch()
        for _ in 0..<200 {
            if let request = try engine.nextRequest() {
                try engine.handle(request.id, cloud.performNow(request.operation))
            } else if let wake = engine.wakeTime {
                clock.set(milliseconds: wake)
            } else { break }
        }
        #expect(try engine.status().pendingRecords == 0)
        #expect(cloud.records(in: "notes").count == 8)
        #expect(Set(cloud.records(in: "notes").compactMap { $0.fields["title"]?.value }).count == 8)
    }
}

@Suite("Store connection reuse: statements still held")
struct StoreConnectionReuseHeldStatementTests {
    @Test("a connection whose uncached statement is still held elsewhere is not handed to another owner")
    func heldStatementBlocksReuse() throws {
        let environment = ReplicaEnvironment.seeded(seed: 3, directory: FileManager.default.temporaryDirectory
            .appendingPathComponent("replica-reuse-\(UUID().uuidString)"))
        let container = try ModelContainer(for: Schema([Trip.self, Item.self]), configurations: [
            ModelConfiguration("main", isStoredInMemoryOnly: true)], environment: environment)
        let store = container.stores[0]
        let first = try store.openConnection()
        let held = try Statement(connection: first, sql: "SELECT 1")
        store.reuse(first)
        let next = try store.openConnection()
        #expect(next !== first, "a statement of the returned connection is still alive: it must not be reused")
        _ = held
        // Once nothing outside the caches is held, a returned connection is reused again.
        store.reuse(next)
        #expect(try store.openConnection() === next)
    }

    @Test("an in-memory store's only connection refused for reuse (a statement still held) does not take the database with it")
    func refusedReuseKeepsTheDatabase() throws {
        let environment = ReplicaEnvironment.seeded(seed: 3, directory: FileManager.default.temporaryDirectory
            .appendingPathComponent("replica-reuse-\(UUID().uuidString)"))
        let container = try ModelContainer(for: Schema([Trip.self, Item.self]), configurations: [
            ModelConfiguration("main", isStoredInMemoryOnly: true)], environment: environment)
        var held: Statement?
        do {
            // The first context takes the connection that created the store (the only one).
            let context = ModelContext(container)
            context.insert(Trip(name: "kept"))
            try context.save()
            held = try Statement(connection: context.connection(for: 0), sql: "SELECT 1")
        }
        // The context is gone; its connection was not taken back (a statement is still held) and closes once the
        // statement goes.
        held = nil
        _ = held
        #expect(try ModelContext(container).fetch(Trip.self).map(\.name) == ["kept"])
    }
}
