import CSQLite
import Foundation
import Testing
@testable import Replica

/// The ledger writes the sync engine leaves out because they would change nothing, and the statements it runs
/// instead of a load and a full upsert: each keeps exactly the stored state the longer path wrote.
@Suite("Ledger write avoidance")
struct LedgerWriteAvoidanceTests {
    private static let people: [any PersistentModel.Type] = [DPerson.self, DAddress.self]

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
        newer.changeTag = "newer"  // another version has another tag (see `CloudRecord.changeTag`)
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

    /// The ledger states of the items of `records` on `device`: waiting for the trip, or not.
    private func waitingItems(_ device: Device, _ records: [CloudRecord]) throws -> [UUID: Bool] {
        var result: [UUID: Bool] = [:]
        for record in records where record.recordType == "Item" {
            guard let entry = try device.engine.ledgerEntry(for: PersistentIdentifier(entityName: "Item", id: record.recordID)) else { continue }
            if case .waitingForParent = entry.state { result[record.recordID] = true } else { result[record.recordID] = false }
        }
        return result
    }

    @Test("waiting marks stay exact when batches hold children and their parent in any order and grouping, with duplicates",
          arguments: 0..<6)
    func waitingAcrossBatches(split: Int) throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1, models: [STrip.self, SItem.self, SStep.self])
        let trip = a.context.insert(STrip(name: "Iceland"))
        for title in ["lights", "spring", "glacier"] { a.context.insert(SItem(title: title, trip: Reference(trip))) }
        try a.context.save()
        try a.sync(cloud)
        let records = cloud.records(in: "notes")
        let parent = try #require(records.first { $0.recordType == "Trip" })
        let items = records.filter { $0.recordType == "Item" }
        // Children first; the parent in the batch `split` selects; a child delivered again in a batch of its own.
        let batches: [[CloudRecord]] = switch split {
        case 0: [items + [parent]]
        case 1: [[items[0]], [items[1], parent, items[2]]]
        case 2: [items, [items[0]], [parent]]
        case 3: [[items[0], items[1]], [items[1]], [items[2], parent], [items[0]]]
        case 4: [[items[2]], [items[2], items[0]], [parent, items[1]]]
        default: [[items[0]], [parent], [items[0], items[1], items[2]]]
        }
        let device = try Device("B", seed: 2, models: [STrip.self, SItem.self, SStep.self])
        var delivered: [CloudRecord] = []
        for batch in batches {
            #expect(try device.deliver(batch, cloud: cloud))
            delivered += batch
            let parentArrived = delivered.contains { $0.recordType == "Trip" }
            for (_, waiting) in try waitingItems(device, delivered) { #expect(waiting == !parentArrived, "split \(split)") }
            // The ledger's own view agrees with the status query over the whole table.
            let expectedWaiting = parentArrived ? 0 : Set(delivered.filter { $0.recordType == "Item" }.map(\.recordID)).count
            #expect(try device.engine.status().waitingForParent == expectedWaiting, "split \(split)")
        }
        #expect(try device.engine.ledgerEntries(in: .waitingForParent).isEmpty)
    }

    @Test("the largest-ID bound reads a 16-byte ID in place, pads a shorter blob, cuts a longer one and ignores other values")
    func largestIDBound() throws {
        let db = try Connection(location: .memory(name: "replica-largest-id-\(UUID().uuidString)"))
        try db.execute("CREATE TABLE t (id)")
        let key = StatementKey("SELECT max(id) FROM t")
        #expect(try SyncLedger.largestID(key, db) == nil)
        try db.run("INSERT INTO t VALUES (42), ('text')")
        #expect(try SyncLedger.largestID(key, db) == nil)
        let id = UUID(uuidString: "01234567-89AB-7CDE-8F01-23456789ABCD")!
        try db.run("INSERT INTO t VALUES (?)", [id.sqliteValue])
        #expect(try SyncLedger.largestID(key, db) == id)
        try db.run("INSERT INTO t VALUES (x'FF01')")
        #expect(try SyncLedger.largestID(key, db) == UUID(uuidString: "FF010000-0000-0000-0000-000000000000"))
        try db.run("INSERT INTO t VALUES (x'FF0200000000000000000000000000000000AA')")
        #expect(try SyncLedger.largestID(key, db) == UUID(uuidString: "FF020000-0000-0000-0000-000000000000"))
    }

    @Test("one save that re-inserts a deleted ID beside new records starts a new incarnation (the ledger bound of the save is shared)")
    func saveReusesLedgerBound() throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("a", seed: 1)
        let old = device.context.insert(SyncNote(title: "old"))
        try device.context.save()
        device.context.delete(old)
        try device.context.save()
        try device.sync(cloud)
        #expect(try device.engine.replicationState(of: old.id)?.causalLength == 2)
        // New IDs sort after the tombstone's: the bound skips their lookups, never the re-inserted one's.
        let fresh = device.context.insert(SyncNote(title: "fresh"))
        device.context.insert(SyncNote(id: old.id, title: "again"))
        let later = device.context.insert(SyncNote(title: "later"))
        try device.context.save()
        #expect(try device.engine.replicationState(of: old.id)?.causalLength == 3)
        #expect(try device.engine.replicationState(of: fresh.id)?.causalLength == 1)
        #expect(try device.engine.replicationState(of: later.id)?.causalLength == 1)
        try device.sync(cloud)
        #expect(try Set(device.notes().map(\.title)) == ["fresh", "again", "later"])
        #expect(try device.engine.status().isUpToDate)
    }

    @Test("versions of one record delivered repeatedly and out of order, within and across batches, while a local edit is pending")
    func repeatedDeliveriesWithPendingEdit() throws {
        let cloud = InMemoryCloudDatabase()
        let laptop = try Device("laptop", seed: 1), phone = try Device("phone", seed: 2)
        var note = laptop.context.insert(SyncNote(title: "v1", rating: 1))
        try laptop.context.save()
        try laptop.sync(cloud)
        try phone.sync(cloud)
        var versions: [CloudRecord] = []
        for rating in [2, 3] {
            phone.clock.advance(by: 1_000)
            var copy = try #require(try phone.context.model(SyncNote.self, id: note.id))
            copy.rating = rating
            phone.context.update(copy)
            try phone.context.save()
            try phone.sync(cloud)
            versions.append(try #require(cloud.records(in: "notes").first))
        }
        laptop.clock.advance(by: 5_000)
        note.title = "laptop title"
        laptop.context.update(note)
        try laptop.context.save()
        #expect(try laptop.deliver([versions[1], versions[0], versions[1]], cloud: cloud))
        let afterFirst = try laptop.engine.replicationState(of: note.id)
        let rowBefore = try laptop.engine.db.rows("SELECT * FROM replica_sync_record WHERE id = ?", [note.id.sqliteValue])
        #expect(try laptop.notes().map(\.rating) == [3])
        #expect(try laptop.notes().map(\.title) == ["laptop title"])
        #expect(try laptop.engine.ledgerEntry(for: noteID(note.id))?.state == .pending)
        // Delivered again, in separate batches: nothing changes.
        #expect(try laptop.deliver([versions[0]], cloud: cloud))
        #expect(try laptop.deliver([versions[1], versions[1]], cloud: cloud))
        #expect(try laptop.engine.replicationState(of: note.id) == afterFirst)
        #expect(try laptop.engine.db.rows("SELECT * FROM replica_sync_record WHERE id = ?", [note.id.sqliteValue]) == rowBefore)
        #expect(try laptop.engine.ledgerEntry(for: noteID(note.id))?.state == .pending)
        try settle([laptop, phone], cloud)
        for device in [laptop, phone] {
            #expect(try device.notes().map(\.title) == ["laptop title"], "\(device.name)")
            #expect(try device.notes().map(\.rating) == [3], "\(device.name)")
            #expect(try device.engine.status().isUpToDate, "\(device.name)")
        }
    }

    @Test("a child received before its parent waits; deleted locally while waiting, then the parent and the child again arrive: nothing waits, the delete wins")
    func waiterDeletedBeforeParentArrives() throws {
        let cloud = InMemoryCloudDatabase()
        let models: [any PersistentModel.Type] = [STrip.self, SItem.self, SStep.self]
        let a = try Device("A", seed: 1, models: models)
        let trip = a.context.insert(STrip(name: "Iceland"))
        let item = a.context.insert(SItem(title: "lights", trip: Reference(trip)))
        try a.context.save()
        try a.sync(cloud)
        let records = cloud.records(in: "notes")
        let parent = try #require(records.first { $0.recordType == "Trip" })
        let child = try #require(records.first { $0.recordType == "Item" })
        let b = try Device("B", seed: 2, models: models)
        #expect(try b.deliver([child, child], cloud: cloud))
        #expect(try b.engine.ledgerEntry(for: PersistentIdentifier(entityName: "Item", id: item.id))?.state == .waitingForParent(trip.id))
        b.clock.advance(by: 1_000)
        let local = try #require(try b.context.model(SItem.self, id: item.id))
        b.context.delete(local)
        try b.context.save()
        #expect(try b.deliver([child, parent, child], cloud: cloud))
        #expect(try b.engine.status().waitingForParent == 0)
        #expect(try ModelContext(b.container).fetch(SItem.self).isEmpty)
        #expect(try ModelContext(b.container).fetch(STrip.self).map(\.name) == ["Iceland"])
        try settle([a, b], cloud)
        for device in [a, b] {
            #expect(try ModelContext(device.container).fetch(SItem.self).isEmpty, "\(device.name)")
            #expect(try ModelContext(device.container).fetch(STrip.self).map(\.name) == ["Iceland"], "\(device.name)")
            #expect(try device.engine.status().isUpToDate, "\(device.name)")
            #expect(try device.engine.status().waitingForParent == 0, "\(device.name)")
        }
    }

    @Test("a save rolled back by a validation failure (beside a re-insert of a tombstoned ID) and saved again after the fix")
    func rolledBackSaveThenSave() throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("a", seed: 1, models: Self.people)
        let old = device.context.insert(DPerson(email: "old@example.com", name: "old"))
        try device.context.save()
        device.context.delete(old)
        try device.context.save()
        try device.sync(cloud)
        #expect(try device.engine.replicationState(of: old.id)?.causalLength == 2)
        let existing = device.context.insert(DPerson(email: "taken@example.com", name: "first"))
        var duplicate = device.context.insert(DPerson(email: "draft@example.com", name: "second"))
        try device.context.save()
        // One save: a new record, the tombstoned ID again, and an update onto a taken unique key (an insert of a taken
        // key is an upsert; an update onto one fails the whole save).
        let fresh = device.context.insert(DPerson(email: "fresh@example.com", name: "fresh"))
        device.context.insert(DPerson(id: old.id, email: "again@example.com", name: "again"))
        duplicate.email = "taken@example.com"
        device.context.update(duplicate)
        #expect(throws: (any Error).self) { try device.context.save() }
        #expect(try device.engine.replicationState(of: fresh.id) == nil)
        #expect(try device.engine.replicationState(of: old.id)?.causalLength == 2)
        duplicate.email = "second@example.com"
        device.context.update(duplicate)
        try device.context.save()
        #expect(try device.engine.replicationState(of: old.id)?.causalLength == 3)
        #expect(try device.engine.replicationState(of: fresh.id)?.causalLength == 1)
        #expect(try device.engine.replicationState(of: duplicate.id)?.causalLength == 1)
        #expect(try device.engine.replicationState(of: existing.id)?.causalLength == 1)
        try device.sync(cloud)
        let other = try Device("other", seed: 2, models: Self.people)
        try other.sync(cloud)
        #expect(try peopleState(other) == peopleState(device))
        #expect(try ModelContext(other.container).fetch(DPerson.self).count == 4)
        #expect(try device.engine.status().isUpToDate)
    }

    @Test("IDs not in time order: a save that inserts IDs below the ledger's largest (one of them tombstoned remotely) beside new ones")
    func idsBelowTheLedgerBound() throws {
        let cloud = InMemoryCloudDatabase()
        let models: [any PersistentModel.Type] = [SyncNote.self, SyncTag.self]
        let device = try Device("a", seed: 1, models: models)
        // Another device's records with IDs far above and below this device's time-ordered ones.
        let high = UUID(uuidString: "FFFFFFFF-0000-7000-8000-000000000001")!
        let low = UUID(uuidString: "00000001-0000-7000-8000-000000000001")!
        let stamp = foreignStamp(seededStart - 10_000)
        var tombstone = noteRecord(low, causalLength: 2, stamp: stamp, title: .text("low"))
        tombstone.fields = ["title": CloudField(value: .text("low"), stamp: stamp)]
        let foreign = [noteRecord(high, stamp: stamp, title: .text("high")), tombstone]
        try cloud.createZone("notes")
        _ = try cloud.modifyRecords(foreign, in: "notes")
        #expect(try device.deliver(cloud.records(in: "notes"), cloud: cloud))
        #expect(try device.notes().map(\.title) == ["high"])
        // One save: the remotely deleted low ID again, a new ID (below `high`), and an ID just below `high`.
        let middle = UUID(uuidString: "FFFFFFFE-0000-7000-8000-000000000001")!
        device.context.insert(SyncNote(id: low, title: "low again"))
        let fresh = device.context.insert(SyncNote(title: "fresh"))
        device.context.insert(SyncNote(id: middle, title: "middle"))
        try device.context.save()
        #expect(try device.engine.replicationState(of: low)?.causalLength == 3)
        #expect(try device.engine.replicationState(of: fresh.id)?.causalLength == 1)
        #expect(try device.engine.replicationState(of: middle)?.causalLength == 1)
        #expect(try device.engine.replicationState(of: high)?.causalLength == 1)
        // An ID the ledger holds for another entity is refused, even above every ID of this save.
        device.context.insert(SyncTag(id: high, label: "clash"))
        #expect(throws: (any Error).self) { try device.context.save() }
        device.context.rollback()
        device.context.insert(SyncNote(title: "after"))
        try device.context.save()
        try device.sync(cloud)
        let other = try Device("other", seed: 2, models: models)
        try other.sync(cloud)
        let titles = try other.notes().map(\.title).sorted()
        #expect(titles == ["after", "fresh", "high", "low again", "middle"])
        #expect(cloud.records(in: "notes").first { $0.recordID == low }?.causalLength == 3)
        #expect(try device.engine.status().isUpToDate)
    }
}
