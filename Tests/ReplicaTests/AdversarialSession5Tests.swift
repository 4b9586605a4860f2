import Foundation
import Testing
@testable import Replica

/// Adversarial tests of what changed on 2026-11-30: acknowledgements in one UPDATE (and the rejected-version delete
/// skipped when none is kept), merges that skip unchanged ledger writes and `waiting_for` writes (per-batch knowledge),
/// redirect lookups skipped for plain tombstones, and the ledger bound a save shares between its store writer and its
/// ledger writes. Two containers on one file stand for two processes of an app group.
@Suite("Adversarial session 5")
struct AdversarialSession5Tests {
    private static let people: [any PersistentModel.Type] = [DPerson.self, DAddress.self]

    /// Every live person (email, name) and address (city → the email of its person, or "-") of a device, sorted.
    private static func peopleState(_ device: Device) throws -> [String] {
        let context = ModelContext(device.container)
        let persons = try context.fetch(DPerson.self)
        let byID = Dictionary(uniqueKeysWithValues: persons.map { ($0.id, $0) })
        var lines = persons.map { "person \($0.id) \($0.email) \($0.name)" }
        for address in try context.fetch(DAddress.self) {
            let owner = address.person.map { byID[$0.id].map { "\($0.id)" } ?? "dangling \($0.id)" } ?? "-"
            lines.append("address \(address.id) \(address.city) -> \(owner)")
        }
        return lines.sorted()
    }

    private static func settle(_ devices: [Device], _ cloud: InMemoryCloudDatabase, rounds: Int = 3) throws {
        for _ in 0..<rounds { for device in devices { try device.sync(cloud) } }
    }

    private static func note(_ id: UUID) -> PersistentIdentifier { PersistentIdentifier(entityName: "SyncNote", id: id) }

    // MARK: Two processes on one file

    @Test("two processes on one file: an acknowledgement arriving after the other process edited the record keeps it pending")
    func staleAckAfterOtherProcessEdit() throws {
        let cloud = InMemoryCloudDatabase()
        let directory = adversarialDirectory()
        let app = try Device("app", seed: 1, directory: directory)
        let ext = try Device("ext", seed: 1, directory: directory)
        let note = app.context.insert(SyncNote(title: "v1", rating: 1))
        try app.context.save()
        let upload = try #require(try app.nextUpload(cloud))
        var theirs = try #require(try ext.context.model(SyncNote.self, id: note.id))
        theirs.title = "v2 by the extension"
        ext.context.update(theirs)
        try ext.context.save()
        try app.engine.handle(upload.id, cloud.performNow(upload.operation))
        #expect(try app.engine.ledgerEntry(for: Self.note(note.id))?.state == .pending)
        #expect(try app.engine.status().pendingRecords == 1)
        try app.sync(cloud)
        #expect(cloud.records(in: "notes").first?.fields["title"]?.value == .text("v2 by the extension"))
        #expect(try app.engine.status().isUpToDate)
        #expect(try ext.engine.status().pendingRecords == 0)
        let other = try Device("other", seed: 2)
        try other.sync(cloud)
        #expect(try other.notes().map(\.title) == ["v2 by the extension"])
    }

    @Test("two processes on one file: the other process deletes and re-inserts the record while its upload is in flight",
          arguments: [false, true])
    func staleAckAfterOtherProcessDeleteAndReinsert(reinsert: Bool) throws {
        let cloud = InMemoryCloudDatabase()
        let directory = adversarialDirectory()
        let app = try Device("app", seed: 1, directory: directory)
        let ext = try Device("ext", seed: 1, directory: directory)
        let note = app.context.insert(SyncNote(title: "v1", rating: 1))
        try app.context.save()
        let upload = try #require(try app.nextUpload(cloud))
        let theirs = try #require(try ext.context.model(SyncNote.self, id: note.id))
        ext.context.delete(theirs)
        try ext.context.save()
        if reinsert {
            ext.context.insert(SyncNote(id: note.id, title: "reborn", rating: 7))
            try ext.context.save()
        }
        try app.engine.handle(upload.id, cloud.performNow(upload.operation))
        // The cloud holds incarnation 1 alive; the ledger holds a later state: still to upload.
        #expect(try app.engine.ledgerEntry(for: Self.note(note.id))?.state == .pending)
        #expect(try app.engine.replicationState(of: note.id)?.causalLength == (reinsert ? 3 : 2))
        try app.sync(cloud)
        let record = try #require(cloud.records(in: "notes").first { $0.recordID == note.id })
        #expect(record.causalLength == (reinsert ? 3 : 2))
        #expect(try app.engine.status().isUpToDate)
        let other = try Device("other", seed: 2)
        try other.sync(cloud)
        #expect(try other.notes().map(\.title) == (reinsert ? ["reborn"] : []))
        #expect(try other.notes().map(\.rating) == (reinsert ? [7] : []))
    }

    @Test("two processes on one file: the other process merges a remote edit of the record while this one's upload is in flight")
    func mergeByOtherProcessDuringUpload() throws {
        let cloud = InMemoryCloudDatabase()
        let directory = adversarialDirectory()
        let app = try Device("app", seed: 1, directory: directory)
        let ext = try Device("ext", seed: 1, directory: directory)
        let phone = try Device("phone", seed: 2)
        var note = app.context.insert(SyncNote(title: "v1", rating: 1))
        try app.context.save()
        try app.sync(cloud)
        try phone.sync(cloud)
        note.title = "title by app"
        app.context.update(note)
        try app.context.save()
        let upload = try #require(try app.nextUpload(cloud))
        // The phone edits another field and uploads first.
        phone.clock.advance(by: 500)
        var copy = try #require(try phone.context.model(SyncNote.self, id: note.id))
        copy.rating = 42
        phone.context.update(copy)
        try phone.context.save()
        try phone.sync(cloud)
        // The extension's engine fetches the phone's version into the shared file before the app's answer arrives.
        let phoneVersion = try #require(cloud.records(in: "notes").first)
        #expect(try ext.deliver([phoneVersion, phoneVersion], cloud: cloud))
        #expect(try app.notes().first?.rating == 42)
        #expect(try app.notes().first?.title == "title by app")
        #expect(try app.engine.ledgerEntry(for: Self.note(note.id))?.state == .pending)
        try app.engine.handle(upload.id, cloud.performNow(upload.operation))
        try Self.settle([app, ext, phone], cloud)
        for device in [app, ext, phone] {
            let notes = try device.notes()
            #expect(notes.map(\.title) == ["title by app"], "\(device.name)")
            #expect(notes.map(\.rating) == [42], "\(device.name)")
            #expect(try device.engine.status().pendingRecords == 0, "\(device.name)")
        }
        let record = try #require(cloud.records(in: "notes").first)
        #expect(record.fields["title"]?.value == .text("title by app"))
        #expect(record.fields["rating"]?.value == .integer(42))
    }

    @Test("two processes on one file: interleaved saves and a merge each get their own history token, with their own changes")
    func historyTokensOfInterleavedProcesses() throws {
        let cloud = InMemoryCloudDatabase()
        let directory = adversarialDirectory()
        let app = try Device("app", seed: 1, directory: directory)
        let ext = try Device("ext", seed: 1, directory: directory)
        let phone = try Device("phone", seed: 2)
        app.context.author = "app"
        ext.context.author = "ext"
        let a = app.context.insert(SyncNote(title: "a"))
        try app.context.save()
        var copy = try #require(try ext.context.model(SyncNote.self, id: a.id))
        copy.rating = 5
        ext.context.update(copy)
        try ext.context.save()
        let remote = phone.context.insert(SyncNote(title: "from the phone"))
        try phone.context.save()
        try phone.sync(cloud)
        #expect(try app.deliver(cloud.records(in: "notes"), cloud: cloud))
        // A save that fails validation writes no history; the next one does.
        let b = ext.context.insert(SyncNote(id: a.id, title: "clash"))
        #expect(throws: (any Error).self) { try ext.context.save() }
        ext.context.rollback()
        let c = ext.context.insert(SyncNote(title: "c"))
        try ext.context.save()
        _ = b
        for device in [app, ext] {
            let history = try ModelContext(device.container).fetchHistory(HistoryDescriptor(storeNames: ["notes"]))
            #expect(history.map(\.author) == ["app", "ext", HistoryTransaction.syncAuthor, "ext"], "\(device.name)")
            #expect(history.map(\.token) == history.map(\.token).sorted(), "\(device.name)")
            #expect(Set(history.map(\.token)).count == history.count, "\(device.name)")
            guard history.count == 4 else { continue }
            #expect(history[0].changes == [.insert(Self.note(a.id))], "\(device.name)")
            #expect(history[1].changes == [.update(Self.note(a.id), updatedAttributes: ["rating"])], "\(device.name)")
            #expect(history[2].changes.map(\.changedPersistentIdentifier) == [Self.note(remote.id)], "\(device.name)")
            #expect(history[3].changes == [.insert(Self.note(c.id))], "\(device.name)")
            let after = try ModelContext(device.container).fetchHistory(HistoryDescriptor(after: history[1].token, storeNames: ["notes"]))
            #expect(after.map(\.token) == [history[2].token, history[3].token], "\(device.name)")
        }
    }

    @Test("two processes on one file: while one holds the upload lease the other does not upload; after it releases, the other does, and the first waits again")
    func leaseAlternatesBetweenProcesses() throws {
        let cloud = InMemoryCloudDatabase()
        let directory = adversarialDirectory()
        let app = try Device("app", seed: 1, directory: directory)
        let ext = try Device("ext", seed: 1, directory: directory)
        app.context.insert(SyncNote(title: "one"))
        try app.context.save()
        let upload = try #require(try app.nextUpload(cloud))
        #expect(try ext.nextUpload(cloud).map { _ in true } == nil)
        try app.engine.handle(upload.id, cloud.performNow(upload.operation))
        app.engine.releaseLease()
        ext.context.insert(SyncNote(title: "two"))
        try ext.context.save()
        // The extension waits out the wait it began while the app held the lease.
        if let wake = ext.engine.wakeTime { ext.clock.set(milliseconds: wake) }
        let extUpload = try #require(try ext.nextUpload(cloud))
        app.context.insert(SyncNote(title: "three"))
        try app.context.save()
        // The lease text changed since the app last parsed it (its own): the app must see the extension's lease.
        #expect(try app.nextUpload(cloud).map { _ in true } == nil)
        try ext.engine.handle(extUpload.id, cloud.performNow(extUpload.operation))
        ext.engine.releaseLease()
        try app.sync(cloud)
        #expect(Set(cloud.records(in: "notes").compactMap { $0.fields["title"]?.value }) == [.text("one"), .text("two"), .text("three")])
        #expect(try app.engine.status().isUpToDate)
    }

    // MARK: Acknowledgements and rejected versions

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
        #expect(try device.engine.ledgerEntry(for: Self.note(edited.id))?.state == .synced)
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
        #expect(try device.engine.ledgerEntry(for: Self.note(note.id))?.state == .pending)
        let upload = try #require(try device.nextUpload(cloud))
        note.title = "three"
        device.context.update(note)
        try device.context.save()
        try device.engine.handle(upload.id, cloud.performNow(upload.operation))
        #expect(try device.engine.ledgerEntry(for: Self.note(note.id))?.state == .pending)
        try device.sync(cloud)
        #expect(try device.engine.ledgerEntry(for: Self.note(note.id))?.state == .synced)
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

    // MARK: Merges

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
        #expect(try laptop.engine.ledgerEntry(for: Self.note(note.id))?.state == .pending)
        // Delivered again, in separate batches: nothing changes.
        #expect(try laptop.deliver([versions[0]], cloud: cloud))
        #expect(try laptop.deliver([versions[1], versions[1]], cloud: cloud))
        #expect(try laptop.engine.replicationState(of: note.id) == afterFirst)
        #expect(try laptop.engine.db.rows("SELECT * FROM replica_sync_record WHERE id = ?", [note.id.sqliteValue]) == rowBefore)
        #expect(try laptop.engine.ledgerEntry(for: Self.note(note.id))?.state == .pending)
        try Self.settle([laptop, phone], cloud)
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
        try Self.settle([a, b], cloud)
        for device in [a, b] {
            #expect(try ModelContext(device.container).fetch(SItem.self).isEmpty, "\(device.name)")
            #expect(try ModelContext(device.container).fetch(STrip.self).map(\.name) == ["Iceland"], "\(device.name)")
            #expect(try device.engine.status().isUpToDate, "\(device.name)")
            #expect(try device.engine.status().waitingForParent == 0, "\(device.name)")
        }
    }

    /// A cloud holding a losing duplicate (redirected to the winner, its address retargeted), a person deleted
    /// normally with its address (plain tombstones), and the winner with an address of its own. Returns the cloud
    /// and the settled reference state.
    private static func dedupCloud() throws -> (InMemoryCloudDatabase, [String]) {
        let cloud = InMemoryCloudDatabase()
        let laptop = try Device("laptop", seed: 1, models: people), phone = try Device("phone", seed: 2, models: people)
        let winner = laptop.context.insert(DPerson(email: "ada@example.com", name: "winner"))
        laptop.context.insert(DAddress(city: "Oslo", person: Reference(winner)))
        try laptop.context.save()
        phone.clock.advance(by: 1_000)
        let loser = phone.context.insert(DPerson(email: "ada@example.com", name: "loser"))
        phone.context.insert(DAddress(city: "Bergen", person: Reference(loser)))
        let bob = phone.context.insert(DPerson(email: "bob@example.com", name: "bob"))
        phone.context.insert(DAddress(city: "Tromsø", person: Reference(bob)))
        try phone.context.save()
        try phone.sync(cloud)
        try laptop.sync(cloud)
        try phone.sync(cloud)
        // A third device adds an address to bob, concurrently with the phone deleting bob (and, by cascade, his
        // address): a live child of a plain tombstone.
        let other = try Device("other", seed: 4, models: people)
        try other.sync(cloud)
        other.clock.advance(by: 1_500)
        other.context.insert(DAddress(city: "Narvik", person: Reference(bob)))
        try other.context.save()
        phone.clock.advance(by: 1_000)
        phone.context.delete(try #require(try phone.context.model(DPerson.self, id: bob.id)))
        try phone.context.save()
        try other.sync(cloud)
        #expect(cloud.records(in: "notes").contains { $0.recordType == "Address" && $0.fields["city"]?.value == .text("Narvik") })
        try phone.sync(cloud)
        try settle([other, laptop, phone], cloud)
        let reference = try peopleState(laptop)
        #expect(try peopleState(phone) == reference)
        #expect(try peopleState(other) == reference)
        #expect(cloud.records(in: "notes").contains { $0.recordID == loser.id && $0.redirect == winner.id })
        return (cloud, reference)
    }

    @Test("a new device receiving redirected and plain tombstones with their children in any order and batching reaches the same state",
          arguments: 0..<10)
    func tombstonesInAnyOrder(seed: UInt64) throws {
        let (cloud, reference) = try Self.dedupCloud()
        var generator = SplitMix(seed: seed)
        let records = cloud.records(in: "notes").shuffled(using: &generator)
        let tablet = try Device("tablet", seed: 3, models: Self.people)
        // Seeds 0..<5: one batch; otherwise batches of random sizes (a record may repeat in a later batch).
        var batches: [[CloudRecord]] = []
        if seed < 5 {
            batches = [records]
        } else {
            var rest = records[...]
            while !rest.isEmpty {
                let size = Int.random(in: 1...max(1, rest.count), using: &generator)
                var batch = Array(rest.prefix(size))
                rest = rest.dropFirst(size)
                if let again = batches.last?.randomElement(using: &generator) { batch.append(again) }
                batches.append(batch)
            }
        }
        for batch in batches { #expect(try tablet.deliver(batch, cloud: cloud)) }
        #expect(try Self.peopleState(tablet) == reference, "seed \(seed)")
        #expect(try tablet.engine.status().waitingForParent == 0, "seed \(seed)")
        try tablet.sync(cloud)
        #expect(try Self.peopleState(tablet) == reference, "seed \(seed)")
        #expect(try tablet.engine.status().isUpToDate, "seed \(seed)")
    }

    // MARK: The ledger bound of a save

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
        try device.context.save()
        // One save: a new record, the tombstoned ID again, and a duplicate of a unique key (fails the whole save).
        let fresh = device.context.insert(DPerson(email: "fresh@example.com", name: "fresh"))
        device.context.insert(DPerson(id: old.id, email: "again@example.com", name: "again"))
        var duplicate = device.context.insert(DPerson(email: "taken@example.com", name: "second"))
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
        #expect(try Self.peopleState(other) == Self.peopleState(device))
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

/// A small seeded generator (SplitMix64) for reproducible shuffles.
private struct SplitMix: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed &+ 0x9E37_79B9_7F4A_7C15 }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49EB_133A_11EB
        return z ^ (z >> 31)
    }
}
