import CSQLite
import Foundation
import Testing
@testable import Replica

/// A fetched version the ledger already holds (same change tag, nothing pending or set aside since) is not merged
/// again: merging is idempotent, so the merge skips reading the data row and writing anything. Versions whose tag the
/// ledger took without applying them, or that meet local changes, still get the full merge.
@Suite("Merging a version the ledger already holds")
struct KnownVersionMergeTests {
    /// The SQL texts a connection runs (SQLITE_TRACE_STMT: each statement as it starts).
    final class StatementLog {
        var texts: [String] = []

        func record(_ db: Connection, _ body: () throws -> Void) rethrows {
            sqlite3_trace_v2(db.handle, UInt32(SQLITE_TRACE_STMT), { _, context, _, text in
                guard let context, let text else { return 0 }
                Unmanaged<StatementLog>.fromOpaque(context).takeUnretainedValue().texts
                    .append(String(cString: text.assumingMemoryBound(to: CChar.self)))
                return 0
            }, Unmanaged.passUnretained(self).toOpaque())
            defer { sqlite3_trace_v2(db.handle, 0, nil, nil) }
            try body()
        }

        /// Whether any statement read or wrote the data table of `entity`.
        func touches(_ entity: String) -> Bool { texts.contains { $0.contains("\"\(entity)\"") } }
        /// Whether any statement wrote the sync ledger.
        var writesLedger: Bool {
            texts.contains { $0.contains("replica_sync_record") && ($0.hasPrefix("INSERT") || $0.hasPrefix("UPDATE")) }
        }
    }

    /// Merges `record` as an incremental fetch does (`fullRead`: as a full resync does).
    private func merge(_ record: CloudRecord, into device: Device, fullRead: Bool = false) throws {
        let store = device.container.stores[0]
        try device.engine.db.transaction {
            var hlc = try SyncLedger.loadHLC(device.engine.db, replica: store.identity)
            let batch = try SyncLedger.MergeBatch(device.engine.db)
            batch.skipsHeldVersions = !fullRead
            _ = try SyncLedger.merge(record, store: store, db: device.engine.db, hlc: &hlc, wall: 0, batch: batch)
        }
    }

    /// A device holding one note it uploaded (acknowledged), and the cloud's copy.
    private func syncedNote() throws -> (Device, InMemoryCloudDatabase, CloudRecord) {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("a", seed: 1)
        device.context.insert(SyncNote(title: "one", body: "first", rating: 1))
        try device.context.save()
        try device.sync(cloud)
        return (device, cloud, try #require(cloud.records(in: "notes").first))
    }

    @Test func anAcknowledgedVersionComingBackIsNotMergedAgain() throws {
        let (device, _, record) = try syncedNote()
        let log = StatementLog()
        try log.record(device.engine.db) { try merge(record, into: device) }
        #expect(!log.texts.isEmpty, "the trace sees the merge's statements")
        #expect(!log.touches("SyncNote"), "the data row is neither read nor written: \(log.texts)")
        #expect(!log.writesLedger)
        #expect(try device.context.fetch(SyncNote.self).map(\.title) == ["one"])
    }

    @Test func aFullReadMergesHeldVersionsInFull() throws {
        // A full read may come from another zone incarnation or cloud database, whose tags may repeat held ones.
        let (device, _, record) = try syncedNote()
        let log = StatementLog()
        try log.record(device.engine.db) { try merge(record, into: device, fullRead: true) }
        #expect(log.touches("SyncNote"))
        #expect(!log.writesLedger, "the full merge of the same version still writes nothing")
    }

    @Test func aMergedVersionFetchedAgainIsNotMergedAgainButANewerOneIs() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("a", seed: 1), b = try Device("b", seed: 2)
        let note = a.context.insert(SyncNote(title: "one", rating: 1))
        try a.context.save()
        try a.sync(cloud)
        try b.sync(cloud)
        let first = try #require(cloud.records(in: "notes").first)
        let again = StatementLog()
        try again.record(b.engine.db) { try merge(first, into: b) }
        #expect(!again.touches("SyncNote"))

        var edited = try #require(try a.context.model(SyncNote.self, id: note.id))
        edited.rating = 2
        a.context.update(edited)
        try a.context.save()
        try a.sync(cloud)
        let second = try #require(cloud.records(in: "notes").first)
        #expect(second.changeTag != first.changeTag)
        let newer = StatementLog()
        try newer.record(b.engine.db) { try merge(second, into: b) }
        #expect(newer.touches("SyncNote"), "a newer version is merged into the row")
        #expect(try b.context.model(SyncNote.self, id: note.id)?.rating == 2)
    }

    @Test func aKnownVersionMeetingALocalChangeIsMergedInFullAndTheChangeStaysPending() throws {
        let (device, _, record) = try syncedNote()
        var note = try #require(try device.context.fetch(SyncNote.self).first)
        note.rating = 7
        device.context.update(note)
        try device.context.save()
        let log = StatementLog()
        try log.record(device.engine.db) { try merge(record, into: device) }
        #expect(log.touches("SyncNote"), "with a local change pending, the full merge runs")
        #expect(try device.context.model(SyncNote.self, id: record.recordID)?.rating == 7)
        #expect(try device.engine.status().pendingRecords == 1)
    }

    @Test func aVersionTheLedgerSetAsideIsMergedInFull() throws {
        let (device, _, record) = try syncedNote()
        // The tag of a version set aside (rejected or undecryptable) is one the ledger did not apply.
        for state in ["rejected", "undecryptable"] {
            try device.engine.db.run("UPDATE replica_sync_record SET state = ?, reason = 'test' WHERE id = ?",
                                     [.text(state), record.recordID.sqliteValue])
            let log = StatementLog()
            try log.record(device.engine.db) { try merge(record, into: device) }
            #expect(log.touches("SyncNote"), "state \(state): the full merge runs")
            #expect(try device.engine.ledgerEntry(for: PersistentIdentifier(entityName: "SyncNote", id: record.recordID))?.state == .synced)
        }
    }

    /// Regression: a version that failed to decrypt keeps its tag in the ledger; once a new key opens
    /// it, the record's state goes back to synced before the merge, and the version must still be merged.
    @Test func aVersionThatOpensOnceANewKeyIsReadIsMergedInFull() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try CryptoDevice("A", seed: 1, encryption: Keys.raw(5))
        let b = try CryptoDevice("B", seed: 2, encryption: Keys.raw(5))
        var note = a.context.insert(Diary(title: "t", secret: secretText("s", 1)))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        #expect(try b.diaries().first?.title == "t")
        // B starts a cycle and reads the keys (version 1 only); A rotates and edits the record under version 2.
        b.engine.setNeedsFetch()
        #expect(try b.step(cloud) == "fetchZoneMetadata")
        try a.engine.rotateEncryptionKey()
        note.title = "edited"
        note.mood = 3
        a.context.update(note)
        try a.context.save()
        try a.sync(cloud)
        #expect(try b.step(cloud) == "fetchZoneChanges")
        #expect(try b.engine.status().undecryptableRecords == 1)
        #expect(try b.diaries().first?.title == "t", "the version B cannot open leaves its values as they were")
        // B reads the keys again, learns version 2 and reads the zone again: the held version opens and is merged.
        #expect(try b.sync(cloud).isUpToDate)
        #expect(try b.diaries().first.map { "\($0.title) \($0.mood)" } == "edited 3")
        #expect(try b.engine.undecryptableRecords().isEmpty)
    }

    /// Regression: fields an older schema kept as unknown become columns after an upgrade; a re-read
    /// of the same version must fill them in (the full merge does), not skip the version as already held.
    @Test func aKnownVersionCarryingFieldsTheUpgradedSchemaNowKnowsIsMergedInFull() throws {
        let cloud = InMemoryCloudDatabase()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-known-upgrade-\(UUID().uuidString)")
        let newer = try Device("new", seed: 2, models: [SyncNoteV2.self], version: Schema.Version(2, 0, 0))
        newer.context.insert(SyncNoteV2(title: "one", rating: 1, mood: "happy"))
        try newer.context.save()
        try newer.sync(cloud)
        do {
            let older = try Device("old", seed: 1, directory: directory)
            try older.sync(cloud)
            #expect(try older.context.fetch(SyncNote.self).map(\.title) == ["one"])
        }
        // The same file opened by the upgraded app: `mood` gets a column (with its default until merged).
        let upgraded = try Device("old", seed: 1, models: [SyncNoteV2.self], version: Schema.Version(2, 0, 0), directory: directory)
        let record = try #require(cloud.records(in: "notes").first)
        try merge(record, into: upgraded)
        #expect(try upgraded.context.fetch(SyncNoteV2.self).map(\.mood) == ["happy"])
    }

    /// Regression (an idempotence failure the simulator found once held versions were merged in full during a
    /// full re-read): a local delete kept the stamps of the incarnation it ended, which merging the record's own
    /// upload back would drop. The ledger row of a local delete is now the one a merge stores.
    @Test func aLocalDeleteStoresTheTombstoneAMergeWouldStore() throws {
        let (device, cloud, record) = try syncedNote()
        let note = try #require(try device.context.model(SyncNote.self, id: record.recordID))
        device.context.delete(note)
        try device.context.save()
        #expect(try device.engine.replicationState(of: record.recordID)?.stamps == [:])
        try device.sync(cloud)
        let tombstone = try #require(cloud.records(in: "notes").first)
        #expect(tombstone.causalLength == 2)
        let changes = sqlite3_total_changes64(device.engine.db.handle)
        try merge(tombstone, into: device, fullRead: true)
        #expect(sqlite3_total_changes64(device.engine.db.handle) == changes, "merging the acknowledged tombstone back changes nothing")
    }

    /// A row edited by a process that opened the file without sync (local-only configuration) after the record was
    /// synced: the ledger still says "synced, tag T". A later full re-read returns version T: skipped by the shortcut.
    /// The devices must still converge (the edit reaches the other device, or the remote version is restored).
    @Test func anEditMadeWithoutSyncThenAFullReRead() throws {
        let cloud = InMemoryCloudDatabase()
        let dirB = FileManager.default.temporaryDirectory.appendingPathComponent("replica-known-nosync-\(UUID().uuidString)")
        let a = try Device("a", seed: 1)
        let note = a.context.insert(SyncNote(title: "one", rating: 1))
        try a.context.save()
        try a.sync(cloud)
        do {
            let b = try Device("b", seed: 2, directory: dirB)
            try b.sync(cloud)
        }
        do {
            var environment = ReplicaEnvironment.seeded(seed: 4, directory: dirB)
            environment.canaries = []
            let local = try ModelContainer(for: Schema([SyncNote.self]), configurations: [
                ModelConfiguration("notes", isStoredInMemoryOnly: false, cloudKitDatabase: .none),
            ], environment: environment)
            let context = ModelContext(local)
            var edited = try #require(try context.model(SyncNote.self, id: note.id))
            edited.rating = 5
            context.update(edited)
            try context.save()
        }
        let b = try Device("b", seed: 3, directory: dirB)
        cloud.expireChangeTokens(in: "notes")
        try b.sync(cloud)
        try a.sync(cloud)
        let onA = try a.notes().map(\.rating), onB = try b.notes().map(\.rating)
        // Regression (merge shortcut): b kept 5, a and the cloud 1, for good, while the shortcut skipped the re-read
        // version (the full merge rewrites b's row, and they converge). SyncLedger's own comment names this case
        // ("a row can predate it ... saved ... by a process that opened the file without sync"): the shortcut's premise
        // "the row is what version T says" does not hold for such rows. Held versions are now skipped only while no
        // full resync is under way.
        #expect(onB == onA, "a and b converge")
    }

    /// Change tags are only unique within one cloud database. When the device's store moves to another cloud
    /// database (account switch, a rebuilt server database), a version there can carry a tag the ledger holds from
    /// the old cloud for a different version. The shortcut then skips it, and the device keeps stale data while the
    /// cloud and the other device have newer data: they diverge for good (no later fetch delivers it again).
    /// Regression: failed with the first version of the shortcut. A read of another cloud database starts from no
    /// valid token, so it is a full resync, which merges every version in full.
    @Test func aTagRepeatedByAnotherCloudDatabaseIsNotMistakenForAHeldVersion() throws {
        let cloud1 = InMemoryCloudDatabase()
        let a = try Device("a", seed: 1), b = try Device("b", seed: 2)
        let note = a.context.insert(SyncNote(title: "one", rating: 1))
        try a.context.save()
        try a.sync(cloud1)
        try b.sync(cloud1)
        #expect(try b.notes().map(\.rating) == [1])

        // Both move to a new cloud database; a edits the note and uploads it there first.
        let cloud2 = InMemoryCloudDatabase()
        var edited = try #require(try a.context.model(SyncNote.self, id: note.id))
        edited.rating = 2
        a.context.update(edited)
        try a.context.save()
        try a.sync(cloud2)
        // b reads the new cloud from scratch (its token is not valid there).
        cloud2.expireChangeTokens(in: "notes")
        try b.sync(cloud2)
        try a.sync(cloud2)
        let cloudRating = cloud2.records(in: "notes").first.flatMap { record -> Int64? in
            if case let .integer(value)? = record.fields["rating"]?.value { return value } else { return nil }
        }
        #expect(try a.notes().map(\.rating) == [2])
        #expect(try b.notes().map(\.rating) == (try a.notes().map(\.rating)), "b converges with a and the cloud (\(String(describing: cloudRating)))")
    }

    /// A device on an older schema keeps a newer device's extra field as unknown; after upgrading it must show it.
    @Test func aFieldUnknownBeforeAnUpgradeShowsAfterIt() throws {
        let cloud = InMemoryCloudDatabase()
        let dirB = FileManager.default.temporaryDirectory.appendingPathComponent("replica-known-upgrade-\(UUID().uuidString)")
        let a = try Device("a", seed: 1, models: [SyncNoteV2.self], version: Schema.Version(2, 0, 0))
        let note = a.context.insert(SyncNoteV2(title: "one", rating: 1, mood: "stormy"))
        try a.context.save()
        try a.sync(cloud)
        do {
            let b = try Device("b", seed: 2, directory: dirB)
            try b.sync(cloud)
            #expect(try b.notes().map(\.title) == ["one"])
        }
        let upgraded = try Device("b", seed: 3, models: [SyncNoteV2.self], version: Schema.Version(2, 0, 0), directory: dirB)
        try upgraded.sync(cloud)
        // Regression (older than the merge shortcut): on upgrade, a field the ledger kept as unknown (R9) was not
        // moved into the row; the upgraded device showed the default "calm" while the record says "stormy". An
        // upgrade that adds tables or columns to a synced store now starts a full resync.
        let moods = try ModelContext(upgraded.container).fetch(SyncNoteV2.self).map(\.mood)
        #expect(moods == ["stormy"])
        _ = note
    }

    private func upgradedDevice(_ cloud: InMemoryCloudDatabase) throws -> (Device, Device) {
        let dirB = FileManager.default.temporaryDirectory.appendingPathComponent("replica-known-upgrade-\(UUID().uuidString)")
        let a = try Device("a", seed: 1, models: [SyncNoteV2.self], version: Schema.Version(2, 0, 0))
        _ = a.context.insert(SyncNoteV2(title: "one", rating: 1, mood: "stormy"))
        try a.context.save()
        try a.sync(cloud)
        do {
            let b = try Device("b", seed: 2, directory: dirB)
            try b.sync(cloud)
        }
        let upgraded = try Device("b", seed: 3, models: [SyncNoteV2.self], version: Schema.Version(2, 0, 0), directory: dirB)
        return (a, upgraded)
    }

    /// As above, then a full re-read of the zone (expired token). Before the shortcut, the full resync merged the
    /// record again and the now-known field arrived. The shortcut's premise (P3: "by R10 merging it again changes
    /// nothing") does not hold across a schema upgrade: the same version merged under the new schema changes the row.
    @Test func aFullResyncAfterAnUpgradeBringsTheNowKnownField() throws {
        let cloud = InMemoryCloudDatabase()
        let (_, b) = try upgradedDevice(cloud)
        cloud.expireChangeTokens(in: "notes")
        try b.sync(cloud)
        // Regression (merge shortcut): the re-read version's tag is in the ledger, state synced, so the shortcut
        // (SyncLedger.swift, "A version this device holds already") skipped it although merging it under the new
        // schema sets the field.
        let moods = try ModelContext(b.container).fetch(SyncNoteV2.self).map(\.mood)
        // A full resync now merges held versions in full, and so does a held version carrying a field the ledger
        // keeps as unknown that the schema now knows.
        #expect(moods == ["stormy"])
    }

    /// After the upgrade, the upgraded device edits another field and uploads: the newer device's value of the field
    /// the older version did not know must survive (R9: an older app version never erases what a newer one wrote).
    @Test func anUpgradedDeviceEditingAnotherFieldDoesNotEraseTheFormerlyUnknownOne() throws {
        let cloud = InMemoryCloudDatabase()
        let (a, b) = try upgradedDevice(cloud)
        try b.sync(cloud)
        var note = try #require(try ModelContext(b.container).fetch(SyncNoteV2.self).first)
        note.title = "edited on b"
        b.context.update(note)
        try b.context.save()
        try b.sync(cloud)
        try a.sync(cloud)
        let onA = try ModelContext(a.container).fetch(SyncNoteV2.self).map { "\($0.title) \($0.mood)" }
        let onB = try ModelContext(b.container).fetch(SyncNoteV2.self).map { "\($0.title) \($0.mood)" }
        #expect(onA == ["edited on b stormy"])
        // Regression (older than the merge shortcut; fixed as above): b's row kept "calm" while a and the cloud had
        // "stormy" — the devices diverged for good.
        #expect(onB == onA)
    }

    /// Control for the tag-collision test: the same moves, but the new cloud gives the note a tag b never saw
    /// (another record takes the first sequence number there): b converges. The difference is the repeated tag.
    @Test func controlAnotherCloudWithFreshTagsConverges() throws {
        let cloud1 = InMemoryCloudDatabase()
        let a = try Device("a", seed: 1), b = try Device("b", seed: 2)
        let note = a.context.insert(SyncNote(title: "one", rating: 1))
        try a.context.save()
        try a.sync(cloud1)
        try b.sync(cloud1)
        let cloud2 = InMemoryCloudDatabase()
        let c = try Device("c", seed: 3)
        c.context.insert(SyncNote(title: "from c"))
        try c.context.save()
        try c.sync(cloud2)
        var edited = try #require(try a.context.model(SyncNote.self, id: note.id))
        edited.rating = 2
        a.context.update(edited)
        try a.context.save()
        try a.sync(cloud2)
        cloud2.expireChangeTokens(in: "notes")
        try b.sync(cloud2)
        try a.sync(cloud2)
        #expect(try b.notes().map(\.rating).sorted() == (try a.notes().map(\.rating).sorted()))
        #expect(try b.notes().contains { $0.id == note.id && $0.rating == 2 })
    }

    /// A zone reset in the same cloud, then the record re-uploaded and edited: tags stay unique across resets of one
    /// InMemoryCloudDatabase (epochs outlive resets), so b converges.
    @Test func zoneResetThenReuploadConverges() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("a", seed: 1), b = try Device("b", seed: 2)
        let note = a.context.insert(SyncNote(title: "one", rating: 1))
        try a.context.save()
        try a.sync(cloud)
        try b.sync(cloud)
        cloud.resetZone("notes")
        var edited = try #require(try a.context.model(SyncNote.self, id: note.id))
        edited.rating = 2
        a.context.update(edited)
        try a.context.save()
        try a.sync(cloud)
        try b.sync(cloud)
        try a.sync(cloud)
        try b.sync(cloud)
        #expect(try a.notes().map(\.rating) == [2])
        #expect(try b.notes().map(\.rating) == [2])
    }

    /// A record deleted and re-inserted on one device, fetched by another that held the earlier version.
    @Test func deleteThenReinsertElsewhereConverges() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("a", seed: 1), b = try Device("b", seed: 2)
        let note = a.context.insert(SyncNote(title: "one", rating: 1))
        try a.context.save()
        try a.sync(cloud)
        try b.sync(cloud)
        a.context.delete(try #require(try a.context.model(SyncNote.self, id: note.id)))
        try a.context.save()
        try a.sync(cloud)
        // b misses the delete: it reads from scratch later
        var again = note
        again.rating = 7
        a.context.insert(again)
        try a.context.save()
        try a.sync(cloud)
        cloud.expireChangeTokens(in: "notes")
        try b.sync(cloud)
        try a.sync(cloud)
        #expect(try b.notes().map(\.rating) == (try a.notes().map(\.rating)))
        #expect(try a.notes().map(\.rating) == [7])
    }
}
