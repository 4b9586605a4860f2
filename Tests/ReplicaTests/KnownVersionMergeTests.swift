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

    /// Review finding (session 6): a version that failed to decrypt keeps its tag in the ledger; once a new key opens
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

    /// Review finding (session 6): fields an older schema kept as unknown become columns after an upgrade; a re-read
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

    /// Found in session 6 (an idempotence failure of the simulator once held versions were merged in full during a
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
}
