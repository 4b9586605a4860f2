import Foundation
import Testing
@testable import Replica

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
