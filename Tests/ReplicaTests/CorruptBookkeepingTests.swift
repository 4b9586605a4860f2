import Foundation
import Testing
@testable import Replica

/// SyncNote with other declared defaults (the same entity): reopening a store with it applies the new defaults.
private struct SyncNoteNewDefaults: PersistentModel, Codable, Equatable {
    static var entityName: String { "SyncNote" }
    var id = UUID.unassigned
    var title: String = "untitled"
    var body: String?
    var rating: Int = 5
    static let entity = ModelEntity<SyncNoteNewDefaults>([
        .attribute("title", \.title, default: "untitled", options: .preserveValueOnDeletion),
        .attribute("body", \.body),
        .attribute("rating", \.rating, default: 5),
    ])
}

/// One unreadable value per bookkeeping column of `replica_sync_record`, as raw SQL (each holds bytes that look
/// like a secret, to check that no report carries them).
private let corruptions: [(column: String, sql: String)] = [
    ("stamps", "x'01FF'"),
    ("created", "'not a stamp: secret-bytes'"),
    ("unknown", "'{\"secret-bytes\": '"),
    ("causal_length", "'secret-bytes'"),
    ("redirect", "x'0102'"),
    ("change_tag", "x'00ff'"),
    ("local_version", "-5"),
    ("pending", "7"),
    ("state", "'secret-bytes'"),
    ("waiting_for", "'secret-bytes'"),
    ("entity", "x'00'"),
]

@Suite("Corrupt sync bookkeeping")
struct CorruptBookkeepingTests {
    /// A device with one note synced twice (so its own upload came back and is held: nothing more to fetch).
    private func syncedDevice(_ cloud: InMemoryCloudDatabase, seed: UInt64 = 1, directory: URL? = nil) throws -> (Device, SyncNote) {
        let device = try Device("A", seed: seed, directory: directory)
        let note = device.context.insert(SyncNote(title: "t", body: "b", rating: 3))
        try device.context.save()
        try device.sync(cloud)
        try device.sync(cloud)
        return (device, note)
    }

    private func corrupt(_ device: Device, _ column: String, _ sql: String, id: UUID) throws {
        try device.engine.db.run("UPDATE replica_sync_record SET \(column) = \(sql) WHERE id = ?", [id.sqliteValue])
    }

    @Test("garbage in a record's stamps never uploads it without its fields: reported corrupt, the edit kept, repaired by the next sync")
    func garbageStamps() throws {
        let cloud = InMemoryCloudDatabase()
        let (a, note) = try syncedDevice(cloud)
        try corrupt(a, "stamps", "x'01FF'", id: note.id)
        #expect(try a.engine.verifyBookkeeping() == 1)
        let status = try a.engine.status()
        #expect(status.corruptRecords == 1)
        #expect(!status.isUpToDate)
        let entry = try #require(try a.engine.ledgerEntry(for: note.persistentModelID))
        #expect(entry.state == .corrupt(BookkeepingCorruption(store: "notes", recordID: note.id, column: "stamps")))
        #expect(try a.engine.ledgerEntries(in: .corrupt).map(\.id) == [note.persistentModelID])
        #expect(try a.engine.replicationState(of: note.id)?.corruption?.column == "stamps")
        // A local edit of the corrupt record is saved and stamped.
        var local = note
        local.rating = 4
        a.context.update(local)
        try a.context.save()
        #expect(try a.engine.status().corruptRecords == 1, "still waiting for the cloud copy")
        // The next sync reads the zone, repairs the record from its cloud copy and uploads it whole.
        #expect(try a.sync(cloud).isUpToDate)
        let record = try #require(cloud.records(in: "notes").first)
        #expect(record.fields["title"]?.value == .text("t"))
        #expect(record.fields["body"]?.value == .text("b"))
        #expect(record.fields["rating"]?.value == .integer(4))
        #expect(try a.engine.replicationState(of: note.id)?.corruption == nil)
        #expect(try a.engine.ledgerEntry(for: note.persistentModelID)?.state == .synced)
        let b = try Device("B", seed: 2)
        try b.sync(cloud)
        #expect(try b.notes().map { [$0.title, $0.body ?? "", "\($0.rating)"] } == [["t", "b", "4"]])
    }

    @Test("garbage in a record's unknown fields never drops the field a newer app version wrote")
    func garbageUnknownFields() throws {
        let cloud = InMemoryCloudDatabase()
        let v2 = try Device("V2", seed: 2, models: [SyncNoteV2.self], version: Schema.Version(2, 0, 0))
        let v1 = try Device("V1", seed: 1)
        let note = v2.context.insert(SyncNoteV2(title: "t", mood: "happy"))
        try v2.context.save()
        try v2.sync(cloud)
        try v1.sync(cloud)
        try v1.sync(cloud)
        try corrupt(v1, "unknown", "'garbage'", id: note.id)
        var local = try #require(try v1.context.model(SyncNote.self, id: note.id))
        local.title = "edited"
        v1.context.update(local)
        try v1.context.save()
        #expect(try v1.engine.ledgerEntry(for: PersistentIdentifier(entityName: "SyncNote", id: note.id))?.state.kind == .corrupt)
        #expect(try v1.sync(cloud).isUpToDate)
        let record = try #require(cloud.records(in: "notes").first)
        #expect(record.fields["mood"]?.value == .text("happy"))
        #expect(record.fields["title"]?.value == .text("edited"))
        try v2.sync(cloud)
        #expect(try v2.context.model(SyncNoteV2.self, id: note.id).map { [$0.title, $0.mood] } == ["edited", "happy"])
    }

    @Test("garbage in a tombstone's preserved values is repaired from the cloud copy, never taken for none")
    func garbageTombstone() throws {
        let cloud = InMemoryCloudDatabase()
        let (a, note) = try syncedDevice(cloud)
        a.context.delete(note)
        try a.context.save()
        try a.sync(cloud)
        try a.sync(cloud)
        #expect(try a.engine.replicationState(of: note.id)?.tombstone["title"]?.value == .text("t"))
        try corrupt(a, "tombstone", "'[1,2'", id: note.id)
        // Inspection reads only; nothing touched the record since: the engine learns of it from a verification.
        #expect(try a.engine.replicationState(of: note.id)?.corruption?.column == "tombstone")
        #expect(try a.engine.status().corruptRecords == 0)
        #expect(try a.engine.verifyBookkeeping() == 1)
        #expect(try a.engine.ledgerEntry(for: note.persistentModelID)?.state.kind == .corrupt)
        #expect(try a.sync(cloud).isUpToDate)
        let state = try #require(try a.engine.replicationState(of: note.id))
        #expect(state.corruption == nil)
        #expect(state.tombstone["title"]?.value == .text("t"))
        #expect(!state.isAlive)
    }

    @Test("every unreadable bookkeeping column is reported by its column (never its bytes) and repaired by the next sync",
          arguments: corruptions.map(\.column))
    func everyColumn(_ column: String) throws {
        let sql = try #require(corruptions.first { $0.column == column }?.sql)
        let cloud = InMemoryCloudDatabase()
        let (a, note) = try syncedDevice(cloud)
        let other = a.context.insert(SyncNote(title: "other", rating: 9))
        try a.context.save()
        try a.sync(cloud)
        try corrupt(a, column, sql, id: note.id)
        #expect(try a.engine.verifyBookkeeping() == 1)
        #expect(try a.engine.status().corruptRecords == 1)
        let corrupt = try a.engine.ledgerEntries(in: .corrupt)
        #expect(corrupt.count == 1)
        guard case let .corrupt(corruption)? = corrupt.first?.state else {
            Issue.record("\(column): no corrupt entry, got \(corrupt)")
            return
        }
        #expect(corruption.column == column && corruption.recordID == note.id && corruption.store == "notes")
        for text in [corruption.description, String(describing: corrupt), String(describing: try a.engine.status())] {
            #expect(!text.contains("secret"), "\(column): \(text)")
        }
        // The other record is untouched by it; the next sync repairs the corrupt one and uploads nothing wrong.
        #expect(try a.engine.ledgerEntry(for: other.persistentModelID)?.state == .synced)
        #expect(try a.sync(cloud).isUpToDate, "\(column)")
        #expect(try a.engine.ledgerEntries().allSatisfy { $0.state == .synced }, "\(column)")
        #expect(try a.engine.replicationStates().allSatisfy { $0.corruption == nil }, "\(column)")
        let notes = try a.notes().sorted { $0.title < $1.title }
        #expect(notes.map { "\($0.title) \($0.body ?? "-") \($0.rating)" } == ["other - 9", "t b 3"], "\(column)")
        let record = try #require(cloud.records(in: "notes").first { $0.recordID == note.id })
        #expect(record.fields.mapValues(\.value) == ["title": .text("t"), "body": .text("b"), "rating": .integer(3)], "\(column)")
    }

    @Test("lowest stamps of a rebuilt record never override another device's edit; the local edit wins over older ones")
    func rebuiltStampsLoseToRealWrites() throws {
        let cloud = InMemoryCloudDatabase()
        let (a, note) = try syncedDevice(cloud)
        let b = try Device("B", seed: 2)
        try b.sync(cloud)
        var onB = try #require(try b.context.model(SyncNote.self, id: note.id))
        onB.title = "title from b"
        b.context.update(onB)
        try b.context.save()
        try b.sync(cloud)
        // A has not seen B's edit; its stamps become unreadable; it edits another field.
        try corrupt(a, "stamps", "x'01FF'", id: note.id)
        var onA = note
        onA.rating = 7
        a.context.update(onA)
        try a.context.save()
        #expect(try a.sync(cloud).isUpToDate)
        try b.sync(cloud)
        for device in [a, b] {
            #expect(try device.notes().map { "\($0.title) \($0.body ?? "-") \($0.rating)" } == ["title from b b 7"], "\(device.name)")
        }
    }

    @Test("a record only this device holds, with unreadable stamps, uploads with its values once the full read finds no copy; others keep syncing")
    func corruptRecordTheZoneLacks() throws {
        let cloud = InMemoryCloudDatabase()
        let (a, _) = try syncedDevice(cloud)
        let fresh = a.context.insert(SyncNote(title: "only here", body: "x", rating: 2))
        let beside = a.context.insert(SyncNote(title: "beside", rating: 1))
        try a.context.save()
        try corrupt(a, "stamps", "x'01FF'", id: fresh.id)
        // The upload read finds it: it is never sent in a wrong form, the other record goes up.
        let upload = try #require(try a.nextUpload(cloud))
        guard case let .modifyRecords(records, _) = upload.operation else { Issue.record("no upload"); return }
        #expect(records.map(\.recordID) == [beside.id])
        try a.engine.handle(upload.id, cloud.performNow(upload.operation))
        #expect(try a.engine.ledgerEntry(for: fresh.persistentModelID)?.state.kind == .corrupt)
        #expect(try a.sync(cloud).isUpToDate)
        let record = try #require(cloud.records(in: "notes").first { $0.recordID == fresh.id })
        #expect(record.fields.mapValues(\.value) == ["title": .text("only here"), "body": .text("x"), "rating": .integer(2)])
        #expect(cloud.records(in: "notes").count == 3)
    }

    @Test("an unreadable store clock is rebuilt from the stamps the store holds, never zero: a later edit orders after an earlier one",
          arguments: ["UPDATE replica_metadata SET value = 'not a clock' WHERE key = 'hlc'",
                      "UPDATE replica_metadata SET value = x'00' WHERE key = 'hlc'",
                      "DELETE FROM replica_metadata WHERE key = 'hlc'"])
    func unreadableClock(_ damage: String) throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        let id = UUID()
        // Another device, a minute ahead (within the drift bound), wrote the title.
        let remote = noteRecord(id, stamp: foreignStamp(seededStart + 60_000), title: .text("remote"))
        try a.deliver([remote], cloud: cloud)
        try a.engine.db.run(damage)
        let rebuilt = try SyncLedger.loadHLC(a.engine.db, replica: a.container.stores[0].identity)
        #expect(rebuilt.physical == seededStart + 60_000)
        var note = try #require(try a.context.model(SyncNote.self, id: id))
        note.title = "local, later"
        a.context.update(note)
        try a.context.save()
        // The same remote record arriving again must not undo the later local edit.
        try a.deliver([remote], cloud: cloud)
        #expect(try a.context.model(SyncNote.self, id: id)?.title == "local, later")
        #expect(try a.engine.replicationState(of: id)?.stamps["title"]?.clock.physical == seededStart + 60_000)
    }

    @Test("an unreadable server change token is read as expired: a full, idempotent re-read")
    func unreadableToken() throws {
        let cloud = InMemoryCloudDatabase()
        let (a, note) = try syncedDevice(cloud)
        let history = try a.context.fetchHistory().count
        try a.engine.db.run("UPDATE replica_metadata SET value = x'00ff' WHERE key = 'server_change_token'")
        a.engine.setNeedsFetch()
        let request = try #require(try a.engine.nextRequest())
        guard case let .fetchZoneChanges(_, token, _) = request.operation else { Issue.record("\(request.operation.name)"); return }
        #expect(token == nil)
        try a.engine.handle(request.id, cloud.performNow(request.operation))
        #expect(try a.sync(cloud).isUpToDate)
        #expect(try a.context.fetchHistory().count == history, "merging the same versions again changes nothing")
        #expect(try a.notes().map(\.id) == [note.id])
    }

    @Test("a causal length of Int64.max in the ledger is unreadable, not a crash: a local delete still works")
    func hugeLocalCausalLength() async throws {
        await #expect(processExitsWith: .success) {
            let cloud = InMemoryCloudDatabase()
            let a = try Device("A", seed: 1, inMemory: true)
            let note = a.context.insert(SyncNote(title: "x"))
            try a.context.save()
            try a.sync(cloud)
            try a.engine.db.run("UPDATE replica_sync_record SET causal_length = ?", [.integer(Int64.max)])
            a.context.delete(note)
            try a.context.save()
            guard try a.sync(cloud).isUpToDate, cloud.records(in: "notes").first?.causalLength == 2 else { exit(3) }
        }
    }

    @Test("opening a store with new defaults never overwrites the values of a record whose stamps cannot be read")
    func newDefaultsSkipUnreadableStamps() throws {
        let directory = temporaryTestDirectory()
        let cloud = InMemoryCloudDatabase()
        var id: UUID
        do {
            let (a, note) = try syncedDevice(cloud, directory: directory)
            id = note.id
            try corrupt(a, "stamps", "x'01FF'", id: note.id)
        }
        let reopened = try Device("A", seed: 1, models: [SyncNoteNewDefaults.self], directory: directory)
        let note = try #require(try reopened.context.model(SyncNoteNewDefaults.self, id: id))
        #expect([note.title, note.body ?? "-", "\(note.rating)"] == ["t", "b", "3"])
    }
}
