// Prepared-statement sharing: statement keys with one SQL text share one statement per connection, and the entity
// statements that several paths use resolve to one text.
import Foundation
import Testing
@testable import Replica

@Suite("Statement sharing")
struct StatementSharingTests {
    let directory = TestDirectory()

    var databaseURL: URL { directory.url.appendingPathComponent("sharing.sqlite") }

    @Test func keysWithOneTextShareOneStatement() throws {
        let db = try Connection(location: .file(databaseURL))
        try db.execute("CREATE TABLE t (x INTEGER)")
        let baseline = db.cachedStatementCount
        let sql = "SELECT x FROM t WHERE x = ?"
        let key = StatementKey(sql)
        let byKey = try db.cachedStatement(key)
        #expect(db.cachedStatementCount == baseline + 1)
        #expect(try db.cachedStatement(key) === byKey)
        // A second key with the same text (e.g. another store's entity statements) finds the same statement.
        let twin = StatementKey(sql)
        #expect(try db.cachedStatement(twin) === byKey)
        #expect(db.cachedStatementCount == baseline + 1)
        // A different text is a different statement.
        let other = StatementKey("SELECT x FROM t")
        #expect(try db.cachedStatement(other) !== byKey)
        #expect(db.cachedStatementCount == baseline + 2)
        // The text cache is separate (a text asked for both ways is prepared once for each).
        _ = try db.cachedStatement(sql)
        #expect(db.cachedStatementCount == baseline + 3)

        // Shared statements run correctly through every key.
        for i in 0..<3 { try db.run("INSERT INTO t (x) VALUES (?)", [.integer(Int64(i))]) }
        #expect(try db.scalar(key, [.integer(2)]) == .integer(2))
        #expect(try db.scalar(twin, [.integer(1)]) == .integer(1))
        #expect(try db.scalar(twin, [.integer(7)]) == nil)
        #expect(try db.rows(other) == [[.integer(0)], [.integer(1)], [.integer(2)]])
        // Another connection prepares its own.
        let second = try Connection(location: .file(databaseURL))
        #expect(try second.cachedStatement(twin) !== byKey)
        #expect(try second.scalar(key, [.integer(0)]) == .integer(0))
    }

    @Test func sharedStatementsLeaveTheConnectionReusable() throws {
        let db = try Connection(location: .memory(name: "statement-sharing-\(UUID().uuidString)"))
        try db.execute("CREATE TABLE t (x INTEGER)")
        let sql = "SELECT x FROM t"
        _ = try db.cachedStatement(StatementKey(sql))
        _ = try db.cachedStatement(sql)
        try db.run("INSERT INTO t (x) VALUES (1)")
        // Every allocated statement is a cached one: the connection can go back to its store's pool.
        #expect(db.liveStatements.value == db.cachedStatementCount)
        #expect(db.resetForReuse())
        // A statement left mid-step is reset for the next owner.
        let statement = try db.cachedStatement(sql)
        #expect(try statement.step())
        #expect(db.resetForReuse())
        #expect(try db.rows(sql) == [[.integer(1)]])
    }
}

@Suite("Statement sharing: entity statements")
struct EntityStatementSharingTests {
    let directory = TestDirectory()

    /// Entities of different shapes in one store: each gets its own lookup, and each lookup reads its own table.
    private static let entities: [Schema.Entity] = (0..<6).map { index in
        Schema.Entity(name: "E\(index)", attributes: (0...index).map {
            Schema.Attribute(name: "f\($0)", type: .integer, isOptional: true)
        })
    }

    @Test func lookupByIDIsOneStatementPerEntityAndConnection() throws {
        let db = try Connection(location: .file(directory.url.appendingPathComponent("entities.sqlite")))
        let statements = Self.entities.map(EntityStatements.init)
        for (entity, sql) in zip(Self.entities, statements) {
            let columns = entity.fieldNames.map { "\(quoted($0)) INTEGER" }.joined(separator: ", ")
            try db.execute("CREATE TABLE \(sql.table) (\"id\" BLOB PRIMARY KEY, \(columns))")
        }
        let ids = Self.entities.indices.map { UUID(uuid: (0, 0, 0, 0, 0, 0, 0x70, 0, 0x80, 0, 0, 0, 0, 0, 0, UInt8($0 + 1))) }
        for (index, sql) in statements.enumerated() {
            try db.run(sql.insert, [ids[index].sqliteValue] + (0...index).map { .integer(Int64(100 * index + $0)) })
        }
        let baseline = db.cachedStatementCount
        for (index, sql) in statements.enumerated() {
            let row = try #require(try db.rows(sql.selectByIDKey, [ids[index].sqliteValue]).first)
            #expect(row == [ids[index].sqliteValue] + (0...index).map { .integer(Int64(100 * index + $0)) })
            // Existence checks use the same statement; another entity's ID is not in this table.
            #expect(try db.scalar(sql.selectByIDKey, [ids[index].sqliteValue]) != nil)
            #expect(try db.scalar(sql.selectByIDKey, [ids[(index + 1) % ids.count].sqliteValue]) == nil)
        }
        #expect(db.cachedStatementCount == baseline + statements.count)

        // A second store's statements for the same entities (same text, other keys) find the prepared statements.
        let again = Self.entities.map(EntityStatements.init)
        for (index, sql) in again.enumerated() {
            #expect(try db.cachedStatement(sql.selectByIDKey) === db.cachedStatement(statements[index].selectByIDKey))
            #expect(try db.rows(sql.selectByIDKey, [ids[index].sqliteValue]).count == 1)
        }
        #expect(db.cachedStatementCount == baseline + statements.count)
    }

    @Test func modelLookupByIDSharesTheStoreLookup() throws {
        // `model(_:id:)` and the store's row reads (save, merge, upload) run the same text on one connection.
        #expect(Trip.entity.storage.oneIDLookup.sql == EntityStatements(Trip.entity.schemaEntity).selectByIDKey.sql)
        #expect(Item.entity.storage.oneIDLookup.sql == EntityStatements(Item.entity.schemaEntity).selectByIDKey.sql)
        #expect(Trip.entity.storage.oneIDLookup.sql != Item.entity.storage.oneIDLookup.sql)
    }

    @Test func updatesOfDifferentFieldSetsWriteTheRightRows() throws {
        let container = try ModelContainer(for: Trip.self, Item.self, environment: directory.environment())
        let context = ModelContext(container)
        var first = context.insert(Trip(name: "A", destination: "X", rating: 1))
        var second = context.insert(Trip(name: "B", destination: "Y", rating: 2))
        var item = context.insert(Item(title: "t"))
        try context.save()
        // Different changed-field sets on one entity, the same set twice, and another entity, over several saves.
        first.rating = 5
        second.name = "B2"
        second.destination = nil
        context.update(first)
        context.update(second)
        try context.save()
        first.rating = 6
        item.title = "u"
        item.trip = Reference(first)
        context.update(first)
        context.update(item)
        try context.save()
        second.rating = 7
        context.update(second)
        try context.save()

        let reader = ModelContext(container)
        let storedFirst = try #require(try reader.model(Trip.self, id: first.id))
        #expect(storedFirst.name == "A" && storedFirst.destination == "X" && storedFirst.rating == 6)
        let storedSecond = try #require(try reader.model(Trip.self, id: second.id))
        #expect(storedSecond.name == "B2" && storedSecond.destination == nil && storedSecond.rating == 7)
        let storedItem = try #require(try reader.model(Item.self, id: item.id))
        #expect(storedItem.title == "u" && storedItem.trip?.id == first.id)
    }
}
