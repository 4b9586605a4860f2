import Foundation
import Testing
@testable import Replica

/// Cloud records come from outside: whatever their bytes say, decoding and merging them give a typed error or a
/// refused record, never a trap and never a local row the app cannot use. Inputs found by the fuzz target
/// `replica-sim fuzz --target cloud-record`.
@Suite("Cloud records from outside: IDs and stamps at the edges")
struct CloudRecordBoundsTests {
    /// `{"causalLength":1,"created":"8000000000000000019b76dc2ea00000019b76daa800700080000000000000ff","fields":{},
    /// "recordID":"019B76DA-A800-7000-8000-000000000001","recordType":"Trip"}` (fuzz target cloud-record, seed 1,
    /// iteration 601, minimized): the fast stamp parser refused the incarnation 2^63, and a slower fallback then
    /// converted it with `Int64(_:)`, which trapped. (An exit test: a trap would end the test process.)
    @Test("a stamp whose incarnation does not fit in 64 signed bits is refused when decoded, not a trap")
    func stampIncarnationBeyondInt64() async {
        await #expect(processExitsWith: .success) {
            let stamp = "8000000000000000019b76dc2ea00000019b76daa800700080000000000000ff"
            guard FieldStamp(stamp) == nil else { exit(2) }
            // Signs and spaces are not hex digits, though Swift's integer parsing would take a sign.
            guard FieldStamp("+000000000000001019b76dc2ea00000019b76daa800700080000000000000ff") == nil else { exit(4) }
            guard FieldStamp("7fffffffffffffff019b76dc2ea00000019b76daa800700080000000000000ff")?.incarnation == .max else { exit(5) }
            let json = #"{"causalLength":1,"created":"8000000000000000019b76dc2ea00000019b76daa800700080000000000000ff","fields":{},"recordID":"019B76DA-A800-7000-8000-000000000001","recordType":"Trip"}"#
            guard (try? JSONDecoder().decode(CloudRecord.self, from: Data(json.utf8))) == nil else { exit(3) }
        }
    }

    /// A record whose ID is the nil UUID (`UUID.unassigned`, the ID of a model not inserted yet) was merged: the app
    /// then fetched a model it could never update (`ModelContext.update(_:)` traps on `.unassigned`,
    /// ModelContext.swift) or delete by value. Found by the fuzz target cloud-record (seed 1, iteration 201).
    @Test("a remote record with the nil ID is refused: no row the app could not update")
    func nilRecordID() throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("P0", seed: 1, inMemory: true)
        let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: 1_767_225_700_000, logical: 0, replica: UUID(uuidString: "019B76DA-A800-7000-8000-0000000000FF")!))
        let record = CloudRecord(recordID: .unassigned, recordType: "SyncNote", causalLength: 1, created: stamp,
                                 fields: ["title": CloudField(value: .text("hostile"), stamp: stamp)])
        try device.deliver([record], cloud: cloud)
        let notes = try device.notes()
        let rejected = try device.engine.ledgerEntries(in: .rejected)
        #expect(notes.allSatisfy { $0.id != .unassigned })
        #expect(rejected.contains { $0.id.id == .unassigned })
        #expect(rejected.first?.state == .rejected(reason: RecordRejection.nilRecordID.description))
    }
}

@Suite("Malformed cloud records")
struct MalformedCloudRecordTests {
    @Test("a record whose field has the wrong type never makes the entity unreadable")
    func wrongValueType() throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("A", seed: 1)
        device.context.insert(SyncNote(title: "mine", rating: 3))
        try device.context.save()
        try device.sync(cloud)
        let bad = noteRecord(UUID(), stamp: foreignStamp(seededStart + 5), rating: .text("lots"))
        try device.deliver([bad], cloud: cloud)
        // The device's own data stays readable.
        let notes = try device.notes()
        #expect(notes.map(\.title).contains("mine"))
        // The bad record is not silently accepted either: it is kept, rejected with a reason that names the field
        // (never the value), and status is honest about it.
        #expect(try !device.engine.status().isUpToDate)
        let entry = try device.engine.ledgerEntry(for: PersistentIdentifier(entityName: "SyncNote", id: bad.recordID))
        guard case let .rejected(reason)? = entry?.state else {
            Issue.record("expected a rejected ledger entry, got \(String(describing: entry))")
            return
        }
        #expect(reason.contains("rating"))
        #expect(!reason.contains("lots"))
    }

    @Test("a local edit replaces a cloud version no device can read, and the device settles")
    func localEditReplacesUnreadableVersion() throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("A", seed: 1)
        var note = device.context.insert(SyncNote(title: "mine", rating: 3))
        try device.context.save()
        try device.sync(cloud)
        // A buggy writer replaces the cloud's version with one whose rating is text.
        var bad = try #require(cloud.records(in: "notes").first)
        bad.fields["rating"] = CloudField(value: .text("lots"), stamp: foreignStamp(seededStart + 60_000, incarnation: 1))
        #expect(try cloud.modifyRecords([bad], in: "notes").count == 1)
        note.title = "edited here"
        device.context.update(note)
        try device.context.save()
        let status = try device.sync(cloud)
        #expect(status.isUpToDate)
        let stored = try #require(cloud.records(in: "notes").first)
        #expect(stored.fields["title"]?.value == .text("edited here"))
        #expect(stored.fields["rating"]?.value == .integer(3))
        #expect(try device.notes().map(\.rating) == [3])
    }

    @Test("a huge causal length from the cloud never crashes a later local delete")
    func hugeCausalLength() async throws {
        await #expect(processExitsWith: .success) {
            let cloud = InMemoryCloudDatabase()
            let device = try Device("A", seed: 1, inMemory: true)
            let id = UUID(uuidString: "01900000-0000-7000-8000-000000000001")!
            try device.deliver([noteRecord(id, causalLength: Int64.max, stamp: foreignStamp(1_767_225_600_005, incarnation: Int64.max))],
                               cloud: cloud)
            if let note = try device.context.model(SyncNote.self, id: id) {
                device.context.delete(note)
                try? device.context.save()
            }
            try device.sync(cloud)
        }
    }

    @Test("a stamp beyond the 48-bit physical range never erases the record's other stamps")
    func physicalBeyond48Bits() throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("A", seed: 1)
        let note = device.context.insert(SyncNote(title: "mine", body: "kept", rating: 3))
        try device.context.save()
        try device.sync(cloud)
        // A record from a device whose clock is absurd (year 10889+) edits only the rating.
        var record = try #require(cloud.records(in: "notes").first)
        record.fields = ["rating": CloudField(value: .integer(4), stamp: foreignStamp(1 << 48))]
        try device.deliver([record], cloud: cloud)
        // Whatever is done with the absurd stamp, the record's own fields keep their stamps: a later local
        // edit of the body still uploads title and body with their values.
        var local = try #require(try device.context.model(SyncNote.self, id: note.id))
        local.body = "edited"
        device.context.update(local)
        try device.context.save()
        try device.sync(cloud)
        let uploaded = try #require(cloud.records(in: "notes").first { $0.recordID == note.id })
        #expect(uploaded.fields["title"]?.value == .text("mine"))
        #expect(uploaded.fields["body"]?.value == .text("edited"))
    }

    @Test("a remote record whose ID is a local record of another entity never corrupts the local record")
    func idCollidesWithAnotherEntity() throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("A", seed: 1, models: [SyncNote.self, SyncTag.self])
        let note = device.context.insert(SyncNote(title: "mine", rating: 3))
        try device.context.save()
        try device.sync(cloud)
        let tag = CloudRecord(recordID: note.id, recordType: "SyncTag", causalLength: 1, created: foreignStamp(seededStart + 5),
                              fields: ["label": CloudField(value: .text("clash"), stamp: foreignStamp(seededStart + 5))])
        try device.deliver([tag], cloud: cloud)
        // The note is still a note in the ledger and uploads whole, as a note, after a local edit.
        #expect(try device.engine.ledgerEntry(for: note.persistentModelID)?.id.entityName == "SyncNote")
        var local = try #require(try device.context.model(SyncNote.self, id: note.id))
        local.rating = 9
        device.context.update(local)
        try device.context.save()
        let upload = try #require(try device.nextUpload(cloud))
        guard case let .modifyRecords(records, _) = upload.operation, let uploaded = records.first(where: { $0.recordID == note.id }) else {
            Issue.record("the note is not uploaded")
            return
        }
        #expect(uploaded.recordType == "SyncNote")
        #expect(uploaded.fields["rating"]?.value == .integer(9))
        #expect(uploaded.fields["title"]?.value == .text("mine"), "the note's stamps were replaced by the tag's")
        // The tag cannot be tracked under an ID the note owns: it is not materialized as a live SyncTag.
        #expect(try ModelContext(device.container).fetch(SyncTag.self).isEmpty)
    }

    @Test("a version kept aside is forgotten once the zone no longer holds it (a reset), so the status can settle")
    func keptAsideVersionGoneFromTheZone() throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("A", seed: 1)
        device.context.insert(SyncNote(title: "mine"))
        try device.context.save()
        try device.sync(cloud)
        let bad = noteRecord(UUID(), stamp: foreignStamp(seededStart + 5), rating: .text("lots"))
        _ = try cloud.modifyRecords([bad], in: "notes")
        #expect(try !device.sync(cloud).isUpToDate)
        #expect(try device.engine.status().rejectedRecords == 1)
        // The zone is reset: the unreadable version is gone from the cloud for good.
        cloud.resetZone("notes")
        let status = try device.sync(cloud)
        #expect(status.isUpToDate)
        #expect(cloud.records(in: "notes").count == 1)
    }

    @Test("a cloud record whose type is an entity of a local-only store of this app is kept, never materialized there")
    func recordTypeOfALocalOnlyEntity() throws {
        let directory = temporaryTestDirectory()
        let container = try ModelContainer(for: Schema([SyncNote.self, LocalDraft.self]), configurations: [
            ModelConfiguration("notes", schema: Schema([SyncNote.self]), cloudKitDatabase: .private("iCloud.test")),
            ModelConfiguration("drafts", schema: Schema([LocalDraft.self])),
        ], environment: .seeded(seed: 1, directory: directory))
        let engine = try SyncEngine(container: container, storeName: "notes")
        let cloud = InMemoryCloudDatabase()
        try cloud.createZone("notes")
        let stamp = foreignStamp(seededStart + 5)
        _ = try cloud.modifyRecords([CloudRecord(recordID: UUID(), recordType: "LocalDraft", causalLength: 1, created: stamp,
                                                 fields: ["text": CloudField(value: .text("injected"), stamp: stamp)])], in: "notes")
        engine.setNeedsFetch()
        while let request = try engine.nextRequest() { try engine.handle(request.id, cloud.performNow(request.operation)) }
        #expect(try ModelContext(container).fetch(LocalDraft.self).isEmpty)
        #expect(try engine.db.rows("SELECT record_type FROM replica_sync_unknown_record") == [[.text("LocalDraft")]])
    }
}
