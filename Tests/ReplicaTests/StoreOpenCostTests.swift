// Opening a store file that is up to date skips the schema statements that would change nothing, a new store gets
// the bookkeeping columns added since the first release in its CREATE TABLE (the same stored text as the ALTER
// TABLE statements give an older store), and the connection that opened a store file is the first one handed out.
import CSQLite
import Foundation
import Testing
@testable import Replica

/// A synced entity with a unique attribute (so its table has an index of its own).
private struct OpenedNote: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var text: String = ""
    var slug: String = ""

    static let entity = ModelEntity<OpenedNote>([
        .attribute("text", \.text, default: ""),
        .attribute("slug", \.slug, default: "", options: .unique),
    ])
}

@Suite("Opening store files")
struct StoreOpenCostTests {
    let directory = TestDirectory()

    private func container(_ name: String = "notes", synced: Bool = true) throws -> ModelContainer {
        let configuration = ModelConfiguration(name, url: directory.url.appendingPathComponent("\(name).store"),
                                               cloudKitDatabase: synced ? .private("iCloud.test") : .none)
        return try ModelContainer(for: Schema([OpenedNote.self]), configurations: [configuration], environment: directory.environment())
    }

    private func sql(of name: String, in url: URL) throws -> String? {
        let db = try Connection(location: .file(url))
        guard case let .text(text)? = try db.scalar("SELECT sql FROM sqlite_master WHERE name = ?", [.text(name)]) else { return nil }
        return text
    }

    @Test("the objects of idempotent schema SQL are read from its statements; anything else is not skipped")
    func createdNames() {
        #expect(IdempotentSchemaSQL.createdNames(HistoryLog.createSQL)
                == ["replica_history_transaction", "replica_history_transaction_timestamp", "replica_history_change"])
        #expect(IdempotentSchemaSQL.createdNames(#"CREATE UNIQUE INDEX IF NOT EXISTS "a_b" ON "T" ("x")"#) == ["a_b"])
        #expect(IdempotentSchemaSQL.createdNames("CREATE TABLE t (x)") == nil)
        #expect(IdempotentSchemaSQL.createdNames("CREATE TABLE IF NOT EXISTS a (x); DROP INDEX IF EXISTS b") == nil)
        #expect(IdempotentSchemaSQL.createdNames(#"CREATE TABLE IF NOT EXISTS "two words" (x)"#) == nil)
        #expect(IdempotentSchemaSQL.createdNames(SyncLedger.createSQL)?.contains("replica_sync_record") == true)
    }

    @Test("reopening a store file whose bookkeeping lost a table or an index creates it again")
    func reopenRecreatesMissingObjects() throws {
        var first: ModelContainer? = try container()
        let context = ModelContext(first!)
        context.insert(OpenedNote(text: "a", slug: "a"))
        try context.save()
        let url = try #require(first!.url(of: "notes"))
        first = nil
        do {
            let db = try Connection(location: .file(url))
            try db.execute("DROP INDEX replica_history_transaction_timestamp")
            try db.execute("DROP TABLE replica_sync_conflict")
            try db.execute(#"DROP INDEX "replica_OpenedNote_unique0""#)
        }
        let reopened = try container()
        #expect(try sql(of: "replica_history_transaction_timestamp", in: url) != nil)
        #expect(try sql(of: "replica_sync_conflict", in: url) != nil)
        #expect(try sql(of: "replica_OpenedNote_unique0", in: url) != nil)
        #expect(try ModelContext(reopened).fetch(FetchDescriptor<OpenedNote>()).map(\.text) == ["a"])
    }

    @Test("a new synced store's unknown-record table is stored as the ALTER TABLE statements leave an older one")
    func freshLedgerTableText() throws {
        let fresh = try container()
        let url = try #require(fresh.url(of: "notes"))
        let older = try Connection(location: .memory(name: "older-ledger-\(UUID().uuidString)"))
        try older.execute(SyncLedger.createSQL)
        for (_, statement) in SyncLedger.addedColumns { try older.execute(statement) }
        guard case let .text(expected)? = try older.scalar("SELECT sql FROM sqlite_master WHERE name = 'replica_sync_unknown_record'") else {
            Issue.record("no table")
            return
        }
        #expect(try sql(of: "replica_sync_unknown_record", in: url) == expected)
        #expect(!SyncLedger.freshCreateSQL.contains("ALTER TABLE"))
    }

    @Test("the connection that opened a store file is the first one handed out, and only once")
    func openingConnectionHandedOut() throws {
        let container = try container("local", synced: false)
        let location = Connection.Location.file(try #require(container.url(of: "local")))
        #expect(Connection.openCount(at: location) == 1, "the connection that opened the store waits for its first owner")
        let first = try container.stores[0].openConnection()
        #expect(Connection.openCount(at: location) == 1)
        let second = try container.stores[0].openConnection()
        #expect(second !== first)
        #expect(Connection.openCount(at: location) == 2)
    }
}
