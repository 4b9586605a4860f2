import Foundation
import Testing
@_spi(Simulation) @testable import Replica
import CSQLite
import CSodium

/// The outbox is read in ID order through an index on `(pending, id)`, so building an upload never sorts the pending
/// records in a temporary B-tree; stores made before that index existed get it when they are opened.
@Suite("Outbox index")
struct OutboxIndexTests {
    private func plan(_ db: Connection) throws -> String {
        try db.rows("EXPLAIN QUERY PLAN " + SyncLedger.outboxSQL(entities: ["SyncNote"]).sql, [.integer(100)])
            .map { row in if case let .text(s) = row[3] { s } else { "" } }.joined(separator: " | ")
    }

    private func indexes(_ db: Connection) throws -> Set<String> {
        Set(try db.rows("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'replica_sync_record'").compactMap {
            if case let .text(name) = $0[0] { name } else { nil }
        })
    }

    @Test("the outbox is read in ID order from the (pending, id) index, without a sort")
    func outboxReadNeedsNoSort() throws {
        let device = try Device("a", seed: 1)
        for i in 0..<40 { device.context.insert(SyncNote(title: "n\(i)", rating: i)) }
        try device.context.save()
        let db = try device.context.connection(for: 0)
        try db.execute("ANALYZE")
        let detail = try plan(db)
        #expect(detail.contains("replica_sync_record_outbox"), "\(detail)")
        #expect(!detail.contains("TEMP B-TREE"), "\(detail)")
        // And it still returns the records in ID order.
        let outbox = try SyncLedger.outbox(limit: 100, store: device.container.stores[0], db: db)
        #expect(outbox.count == 40)
        let ids = outbox.map { $0.record.recordID.uuidString }
        let notes = try device.context.fetch(FetchDescriptor<SyncNote>())
        #expect(outbox.map(\.record.recordID) == notes.map(\.id).sorted { a, b in
            withUnsafeBytes(of: a.uuid) { x in withUnsafeBytes(of: b.uuid) { y in x.lexicographicallyPrecedes(y) } }
        }, "\(ids)")
    }

    @Test("a store made with the old outbox index gets the new one when opened, and keeps its pending records")
    func oldStoresGetTheIndex() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-outbox-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        do {
            let device = try Device("a", seed: 2, directory: directory)
            for i in 0..<5 { device.context.insert(SyncNote(title: "n\(i)")) }
            try device.context.save()
            // As an earlier version left it: the index on `pending` alone.
            let db = try device.context.connection(for: 0)
            try db.execute("DROP INDEX replica_sync_record_outbox")
            try db.execute("CREATE INDEX replica_sync_record_pending ON replica_sync_record (pending) WHERE pending = 1")
            #expect(try plan(db).contains("TEMP B-TREE"))
        }
        let reopened = try Device("a", seed: 3, directory: directory)
        let db = try reopened.context.connection(for: 0)
        let names = try indexes(db)
        #expect(names.contains("replica_sync_record_outbox"))
        #expect(!names.contains("replica_sync_record_pending"))
        #expect(!(try plan(db)).contains("TEMP B-TREE"))
        #expect(try SyncLedger.outbox(limit: 100, store: reopened.container.stores[0], db: db).count == 5)
    }
}

@Suite("Outbox index edge cases", .serialized)
struct OutboxIndexEdgeTests {
    private func oldLayout(_ db: Connection) throws {
        try db.execute("DROP INDEX IF EXISTS replica_sync_record_outbox")
        try db.execute("CREATE INDEX IF NOT EXISTS replica_sync_record_pending ON replica_sync_record (pending) WHERE pending = 1")
    }

    private func expectedOutbox(_ db: Connection) throws -> [UUID] {
        try db.rows("""
            SELECT id FROM replica_sync_record NOT INDEXED WHERE pending = 1 AND state NOT IN ('rejected', 'undecryptable') ORDER BY id
            """).compactMap { try? UUID(sqliteValue: $0[0]) }
    }

    @Test("old layout: read-only open, two containers opening at once, an older version reopening; the outbox stays whole and ordered")
    func oldLayoutLifecycle() throws {
        let directory = temporaryTestDirectory("outbox")
        defer { try? FileManager.default.removeItem(at: directory) }
        do {
            let device = try Device("a", seed: 2, directory: directory)
            for i in 0..<300 { device.context.insert(SyncNote(title: "n\(i)", rating: i)) }
            try device.context.save()
            let db = try device.context.connection(for: 0)
            try db.execute("UPDATE replica_sync_record SET state = 'rejected' WHERE rowid % 7 = 0")
            try oldLayout(db)
        }
        // Read-only open of the old layout: no migration possible; the outbox still reads right.
        do {
            var environment = ReplicaEnvironment.seeded(seed: 5, directory: directory)
            environment.canaries = []
            let container = try ModelContainer(for: Schema([SyncNote.self]), configurations: [
                ModelConfiguration("notes", allowsSave: false, cloudKitDatabase: .private("iCloud.test")),
            ], environment: environment)
            let context = ModelContext(container)
            #expect(try context.fetch(FetchDescriptor<SyncNote>()).count == 300)
            let db = try context.connection(for: 0)
            let expected = try expectedOutbox(db)
            #expect(expected.count > 200)
            for limit in [1, 7, 100, 1000] {
                let got = try SyncLedger.outbox(limit: limit, store: container.stores[0], db: db).map(\.record.recordID)
                #expect(got == Array(expected.prefix(limit)))
            }
        }
        // Two "processes" open the old-layout file at once.
        final class Box: @unchecked Sendable { var devices: [Device?] = [nil, nil]; var errors: [Error?] = [nil, nil] }
        let box = Box()
        let lock = NSLock()
        DispatchQueue.concurrentPerform(iterations: 2) { i in
            do {
                let d = try Device(i == 0 ? "b" : "c", seed: UInt64(10 + i), directory: directory)
                lock.withLock { box.devices[i] = d }
            } catch {
                lock.withLock { box.errors[i] = error }
            }
        }
        let devices = box.devices, errors = box.errors
        #expect(errors.allSatisfy { $0 == nil }, "\(errors)")
        let b = try #require(devices[0]), c = try #require(devices[1])
        let db = try b.context.connection(for: 0)
        let names = Set(try db.rows("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'replica_sync_record'").compactMap {
            if case let .text(n) = $0[0] { n } else { nil }
        })
        #expect(names.contains("replica_sync_record_outbox") && !names.contains("replica_sync_record_pending"), "\(names)")
        let expected = try expectedOutbox(db)
        #expect(try SyncLedger.outbox(limit: 1000, store: b.container.stores[0], db: db).map(\.record.recordID) == expected)
        let cdb = try c.context.connection(for: 0)
        #expect(try SyncLedger.outbox(limit: 1000, store: c.container.stores[0], db: cdb).map(\.record.recordID) == expected)
        // An older version reopens it (its createSQL adds the pending-only index back) while this one is open.
        try cdb.execute("CREATE INDEX IF NOT EXISTS replica_sync_record_pending ON replica_sync_record (pending) WHERE pending = 1")
        try cdb.execute("ANALYZE")
        #expect(try SyncLedger.outbox(limit: 1000, store: b.container.stores[0], db: db).map(\.record.recordID) == expected)
        #expect(try SyncLedger.outbox(limit: 50, store: c.container.stores[0], db: cdb).map(\.record.recordID) == Array(expected.prefix(50)))
    }
}
