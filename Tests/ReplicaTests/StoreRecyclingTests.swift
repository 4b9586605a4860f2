import CSQLite
import Foundation
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

@Suite("In-memory store recycling")
struct StoreRecyclingTests {


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
}
