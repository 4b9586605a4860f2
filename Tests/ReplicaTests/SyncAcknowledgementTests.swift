import Foundation
import Testing
@testable import Replica

/// What an acknowledged upload does to the ledger: it marks the record synced only when the version uploaded is still
/// the latest, clears the reason of an earlier refusal, and removes a cloud version kept aside as unappliable only for
/// its own record (and type) — once the cloud holds a version this device wrote.
@Suite("Acknowledgements and rejected versions")
struct SyncAcknowledgementTests {
    @Test("an acknowledgement deletes only its own record's rejected version, also when another record's is kept")
    func ackDeletesOnlyItsRejectedVersion() throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("a", seed: 1)
        let kept = device.context.insert(SyncNote(title: "kept aside"))
        try device.context.save()
        try device.sync(cloud)
        var edited = device.context.insert(SyncNote(title: "edited"))
        try device.context.save()
        try device.sync(cloud)
        // Versions of both records kept aside as unappliable; one of another type under the edited record's ID.
        for (id, type) in [(kept.id, "SyncNote"), (edited.id, "SyncNote"), (edited.id, "SyncTag")] {
            try device.engine.db.run("INSERT INTO replica_sync_rejected (id, record_type, record, reason) VALUES (?, ?, '{}', 'bad')",
                                     [id.sqliteValue, .text(type)])
        }
        edited.title = "edited again"
        device.context.update(edited)
        try device.context.save()
        try device.sync(cloud)
        let rows = try device.engine.db.rows("SELECT id, record_type FROM replica_sync_rejected ORDER BY record_type")
        #expect(rows.count == 2)
        #expect(rows.contains { $0 == [kept.id.sqliteValue, .text("SyncNote")] })
        #expect(rows.contains { $0 == [edited.id.sqliteValue, .text("SyncTag")] })
        #expect(try device.engine.ledgerEntry(for: noteID(edited.id))?.state == .synced)
    }

    @Test("an acknowledgement for a record rejected for good, then edited and uploaded, leaves it synced; a stale one leaves it pending")
    func ackOfPreviouslyRejectedRecord() throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("a", seed: 1)
        var note = device.context.insert(SyncNote(title: "one"))
        try device.context.save()
        try device.sync(cloud)
        // The cloud refused a version for good (as a `.failed` answer records it).
        try device.engine.db.run("UPDATE replica_sync_record SET state = 'rejected', reason = 'refused', pending = 1 WHERE id = ?",
                                 [note.id.sqliteValue])
        note.title = "two"
        device.context.update(note)
        try device.context.save()
        #expect(try device.engine.ledgerEntry(for: noteID(note.id))?.state == .pending)
        let upload = try #require(try device.nextUpload(cloud))
        note.title = "three"
        device.context.update(note)
        try device.context.save()
        try device.engine.handle(upload.id, cloud.performNow(upload.operation))
        #expect(try device.engine.ledgerEntry(for: noteID(note.id))?.state == .pending)
        try device.sync(cloud)
        #expect(try device.engine.ledgerEntry(for: noteID(note.id))?.state == .synced)
        #expect(cloud.records(in: "notes").first?.fields["title"]?.value == .text("three"))
        let reason = try device.engine.db.scalar("SELECT reason FROM replica_sync_record WHERE id = ?", [note.id.sqliteValue])
        #expect(reason == .null)
    }

    @Test("a cloud version this device cannot apply, then a local edit of the record: the edit reaches the cloud and the kept version goes")
    func localEditOverRejectedCloudVersion() async throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1), b = try Device("B", seed: 2)
        var note = a.context.insert(SyncNote(title: "one", rating: 1))
        try a.context.save()
        try a.sync(cloud)
        try b.sync(cloud)
        // A faulty client writes a rating of the wrong type.
        var bad = try #require(cloud.records(in: "notes").first)
        bad.fields["rating"] = CloudField(value: .text("lots"), stamp: foreignStamp(seededStart + 60_000))
        _ = try cloud.modifyRecords([bad], in: "notes")
        try a.sync(cloud)
        #expect(try a.engine.db.scalar("SELECT count(*) FROM replica_sync_rejected") == .integer(1))
        #expect(try a.notes().map(\.rating) == [1])
        a.clock.advance(by: 120_000)
        note.title = "two"
        a.context.update(note)
        try a.context.save()
        let requests = try await drive(a, cloud)
        #expect(requests < 50, "\(requests) requests")
        let record = try #require(cloud.records(in: "notes").first)
        #expect(record.fields["title"]?.value == .text("two"))
        try b.sync(cloud)
        try a.sync(cloud)
        #expect(try a.notes().map(\.title) == ["two"])
        #expect(try b.notes().map(\.title) == ["two"])
        #expect(try a.engine.status().pendingRecords == 0)
        // The cloud's version is now one this device wrote: the version kept aside is superseded.
        #expect(try a.engine.db.scalar("SELECT count(*) FROM replica_sync_rejected") == .integer(0))
    }
}
