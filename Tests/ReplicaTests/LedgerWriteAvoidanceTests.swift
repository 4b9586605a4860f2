import CSQLite
import Foundation
import Testing
@testable import Replica

/// The ledger writes the sync engine leaves out because they would change nothing, and the statements it runs
/// instead of a load and a full upsert: each keeps exactly the stored state the longer path wrote.
@Suite("Ledger write avoidance")
struct LedgerWriteAvoidanceTests {
    /// A device with one note uploaded and acknowledged; returns the device and the cloud's copy of the note.
    private func syncedNote() throws -> (Device, InMemoryCloudDatabase, CloudRecord) {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("a", seed: 1)
        device.context.insert(SyncNote(title: "one", body: "first", rating: 1))
        try device.context.save()
        try device.sync(cloud)
        let record = try #require(cloud.records(in: "notes").first)
        return (device, cloud, record)
    }

    private func merge(_ record: CloudRecord, into device: Device) throws {
        let store = device.container.stores[0]
        try device.engine.db.transaction {
            var hlc = try SyncLedger.loadHLC(device.engine.db, replica: store.identity)
            _ = try SyncLedger.merge(record, store: store, db: device.engine.db, hlc: &hlc, wall: 0)
        }
    }

    private func ledgerRow(_ device: Device, _ id: UUID) throws -> [SQLiteValue] {
        try #require(try device.engine.db.rows("""
            SELECT entity, causal_length, created, stamps, unknown, tombstone, redirect, change_tag, local_version, pending, state, reason
            FROM replica_sync_record WHERE id = ?
            """, [id.sqliteValue]).first)
    }

    @Test("merging a record's own version again writes no ledger row")
    func unchangedMergeWritesNothing() throws {
        let (device, _, record) = try syncedNote()
        let before = try ledgerRow(device, record.recordID)
        let changes = sqlite3_total_changes64(device.engine.db.handle)
        try merge(record, into: device)
        #expect(sqlite3_total_changes64(device.engine.db.handle) == changes)
        #expect(try ledgerRow(device, record.recordID) == before)
        #expect(try device.engine.ledgerEntry(for: PersistentIdentifier(entityName: "SyncNote", id: record.recordID))?.state == .synced)
    }

    @Test("a merge that changes only the ledger state derived from the outbox flag still writes it")
    func stateOnlyChangeIsWritten() throws {
        let (device, _, record) = try syncedNote()
        // As the outbox marks a record whose data row is gone: out of the outbox, rejected.
        try device.engine.db.run("UPDATE replica_sync_record SET state = 'rejected', reason = 'missing local row' WHERE id = ?",
                                 [record.recordID.sqliteValue])
        try merge(record, into: device)
        let row = try ledgerRow(device, record.recordID)
        #expect(row[10] == .text("synced"))
        #expect(try device.engine.ledgerEntry(for: PersistentIdentifier(entityName: "SyncNote", id: record.recordID))?.state == .synced)
    }

    @Test("a merge that changes a field writes the ledger row")
    func changedMergeWrites() throws {
        let (device, _, record) = try syncedNote()
        var newer = record
        let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: (record.fields["title"]?.stamp.clock.physical ?? 0) + 1_000, logical: 0,
                                                          replica: UUID(uuidString: "00000000-0000-7000-8000-00000000000B")!))
        newer.fields["title"] = CloudField(value: .text("two"), stamp: stamp)
        try merge(newer, into: device)
        let state = try #require(try device.engine.replicationState(of: record.recordID))
        #expect(state.stamps["title"] == stamp)
        #expect(try device.notes().first?.title == "two")
    }

    @Test("an acknowledged upload clears the outbox flag only for the version uploaded, and supersedes a rejected version")
    func acknowledgements() throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("a", seed: 1)
        var note = device.context.insert(SyncNote(title: "one", rating: 1))
        try device.context.save()
        let id = PersistentIdentifier(entityName: "SyncNote", id: note.id)
        // A version kept aside as unappliable, which the next saved upload supersedes.
        try device.engine.db.run("INSERT INTO replica_sync_rejected (id, record_type, record, reason) VALUES (?, 'SyncNote', '{}', 'bad')",
                                 [note.id.sqliteValue])
        let upload = try #require(try device.nextUpload(cloud))
        // A local change after the upload was built: the acknowledgement keeps the record in the outbox.
        note.title = "two"
        device.context.update(note)
        try device.context.save()
        try device.engine.handle(upload.id, cloud.performNow(upload.operation))
        #expect(try device.engine.ledgerEntry(for: id)?.state == .pending)
        #expect(try device.engine.db.scalar("SELECT count(*) FROM replica_sync_rejected") == .integer(0))
        let tag = try device.engine.ledgerEntry(for: id)?.changeTag
        #expect(tag != nil)
        // The next upload is acknowledged for the current version: out of the outbox.
        try device.sync(cloud)
        #expect(try device.engine.ledgerEntry(for: id)?.state == .synced)
        #expect(try device.engine.status().isUpToDate)
    }
}
