import Foundation
import Testing
@testable import Replica

/// Version 1 and 2 of one local entity (`Code`): version 2 retypes `value` from an integer to a string.
struct CodeV1: PersistentModel, Codable, Equatable {
    static var entityName: String { "Code" }
    var id = UUID.unassigned
    var value: Int = 0
    static let entity = ModelEntity<CodeV1>([.attribute("value", \.value)])
}

struct CodeV2: PersistentModel, Codable, Equatable {
    static var entityName: String { "Code" }
    var id = UUID.unassigned
    var value: String = ""
    static let entity = ModelEntity<CodeV2>([.attribute("value", \.value)])
}

/// A local entity whose table a foreign tool created.
struct Ledger: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var memo: String = ""
    static let entity = ModelEntity<Ledger>([.attribute("memo", \.memo)])
}

@Suite("Store files Replica did not write")
struct ForeignStoreFileTests {
    let directory = TestDirectory()

    /// The container opens the store, then either refuses it with a load issue naming the problem, or reads and
    /// writes it faithfully. It never silently stores a value it cannot read back.
    @Test("a retyped attribute of a local store is refused at load, or its new values read back")
    func retypedAttribute() throws {
        do {
            let container = try ModelContainer(for: CodeV1.self, environment: directory.environment(seed: 1))
            let context = ModelContext(container)
            context.insert(CodeV1(value: 7))
            try context.save()
        }
        let container: ModelContainer
        do {
            container = try ModelContainer(for: CodeV2.self, environment: directory.environment(seed: 2))
        } catch let ReplicaError.loadIssueModelContainer(_, reason) {
            #expect(reason.contains("Code") && reason.contains("value"))
            return
        }
        let context = ModelContext(container)
        let saved = context.insert(CodeV2(value: "007"))
        try context.save()
        #expect(try ModelContext(container).model(CodeV2.self, id: saved.id)?.value == "007")
    }

    @Test("a table whose id is not a 16-byte ID column is refused at load, not silently hidden")
    func foreignIDColumn() throws {
        let db = try rawConnection(directory.storeURL())
        try db.execute("CREATE TABLE Ledger (id INTEGER PRIMARY KEY, memo TEXT); INSERT INTO Ledger (id, memo) VALUES (1, 'kept')")
        let container: ModelContainer
        do {
            container = try ModelContainer(for: Ledger.self, environment: directory.environment())
        } catch let ReplicaError.loadIssueModelContainer(_, reason) {
            #expect(reason.contains("Ledger") && reason.contains("id"))
            #expect(try rowCount("Ledger", in: directory.storeURL()) == 1)
            return
        }
        // Opened: then its records cannot be invisible, and a save must work.
        let context = ModelContext(container)
        #expect(try context.fetch(Ledger.self).count == 1, "the existing row is silently hidden")
        context.insert(Ledger(memo: "new"))
        #expect(throws: Never.self) { try context.save() }
    }

    @Test("a truncated store is a typed error, never a crash, and the file is left as it was")
    func truncatedStore() throws {
        do {
            let container = try ModelContainer(for: Ledger.self, environment: directory.environment(seed: 1))
            let context = ModelContext(container)
            for i in 0..<400 { context.insert(Ledger(memo: String(repeating: "memo \(i) ", count: 20))) }
            try context.save()
        }
        // Fold the WAL into the main file, then cut the file in half.
        let url = directory.storeURL()
        try rawConnection(url).execute("PRAGMA wal_checkpoint(TRUNCATE)")
        let bytes = try Data(contentsOf: url)
        let truncated = bytes.prefix(bytes.count / 2)
        try truncated.write(to: url)
        do {
            let container = try ModelContainer(for: Ledger.self, environment: directory.environment(seed: 2))
            _ = try? ModelContext(container).fetch(Ledger.self)
        } catch let error as ReplicaError {
            guard case .loadIssueModelContainer = error else {
                Issue.record("expected a load issue, got \(error)")
                return
            }
        }
        #expect(try Data(contentsOf: url) == truncated)
    }

    @Test("a synced store whose unknown-record table predates the outbox flag is migrated, keeping its records")
    func unknownRecordTableMigrated() throws {
        let directory = temporaryTestDirectory()
        do { _ = try Device("A", seed: 1, directory: directory) }
        let url = directory.appendingPathComponent("notes.store")
        try rawConnection(url).execute("""
            DROP TABLE replica_sync_unknown_record;
            CREATE TABLE replica_sync_unknown_record (id BLOB PRIMARY KEY NOT NULL, record_type TEXT NOT NULL, record TEXT NOT NULL);
            INSERT INTO replica_sync_unknown_record VALUES (x'00112233445566778899aabbccddeeff', 'Sticker', '{}');
            """)
        let device = try Device("A", seed: 2, directory: directory)
        #expect(try device.engine.db.rows("SELECT record_type, pending, seen FROM replica_sync_unknown_record")
                == [[.text("Sticker"), .integer(0), .integer(0)]])
        #expect(try device.engine.status().pendingRecords == 0)
    }
}
