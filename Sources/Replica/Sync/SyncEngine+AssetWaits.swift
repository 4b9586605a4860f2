import Foundation

// Versions of records that wait for their assets (R19; `Specs/external-storage.md`, "Assets in sync"): a fetched
// version whose asset this device lacks is kept in `replica_sync_asset_wait` instead of merging, joined with the
// versions that arrive after it, and merged once its assets are here (or replaced by a newer version or the
// tombstone). The transfers themselves are in SyncEngine+Assets.swift.

extension SyncEngine {
    // MARK: Waiting for assets

    /// Merges, in one import transaction, the waiting records whose assets are all here.
    func mergeWaitingRecordsIfReady() throws {
        var ready = false
        for row in try db.rows("SELECT assets FROM replica_sync_asset_wait ORDER BY id, record_type", cache: false) {
            if try Self.neededAssets(row[0]).allSatisfy(isHere) {
                ready = true
                break
            }
        }
        guard ready else { return }
        try importing { try mergeRecords([]) }
    }

    /// Takes the waiting records whose assets are all here out of `replica_sync_asset_wait`, for the merge under way
    /// (inside its transaction). A record whose ledger moved on to another version meanwhile (a local change was
    /// uploaded) loses its change tag, so merging it does not take the ledger back, and is returned in `requeue`: the
    /// cloud's version may lack its writes, so the merged result goes up again.
    func takeReadyWaitingRecords() throws -> (records: [CloudRecord], requeue: [UUID]) {
        guard try db.scalar(Self.anyWaitingSQL) == .integer(1) else { return ([], []) }
        var records: [CloudRecord] = [], requeue: [UUID] = []
        for row in try db.rows("SELECT id, record_type, record, assets FROM replica_sync_asset_wait ORDER BY id, record_type", cache: false) {
            guard try Self.neededAssets(row[3]).allSatisfy(isHere), case let .text(json) = row[2],
                  var record = ReplicaJSON.decode(CloudRecord.self, json) else { continue }
            try db.run("DELETE FROM replica_sync_asset_wait WHERE id = ? AND record_type = ?", [row[0], row[1]])
            if case let .text(tag)? = try db.scalar("SELECT change_tag FROM replica_sync_record WHERE id = ?", [row[0]]), tag != record.changeTag {
                record.changeTag = nil
                requeue.append(record.recordID)
            }
            records.append(record)
        }
        return (records, requeue)
    }

    /// After merging records taken by ``takeReadyWaitingRecords()``: those not waiting again whose ledger had moved on
    /// go back to the outbox.
    func requeueAfterWaiting(_ ids: [UUID]) throws {
        for id in ids {
            guard try db.scalar("SELECT EXISTS (SELECT 1 FROM replica_sync_asset_wait WHERE id = ?)", [id.sqliteValue]) == .integer(0) else { continue }
            try db.run("""
                UPDATE replica_sync_record SET pending = 1, local_version = local_version + 1,
                    state = CASE WHEN state IN ('rejected', 'undecryptable', 'corrupt') THEN state ELSE 'pending' END
                WHERE id = ?
                """, [id.sqliteValue])
        }
    }

    /// `remote` as it can be merged here — each asset reference of an external-storage field resolved — or `nil`
    /// when it waits for an asset this device does not have (then kept in `replica_sync_asset_wait`, joined with a
    /// version of it waiting already). Inside the merge's transaction.
    ///
    /// A reference whose value cannot win here (the local write of the field has a stamp at least as high: the same
    /// write, or a newer one) takes the local value, so nothing is downloaded for it. Otherwise a store file keeps the
    /// reference when it has the asset's file; an in-memory store takes the staged bytes (`arrived` collects their
    /// hashes: the staged chunks are dropped once the merge is done). Tombstones never wait (their preserved values
    /// are history; a file missing there leaves the reference in it), and end the wait of a version they delete. A
    /// version waiting already is joined with `fetched` first, so the join waits only for the assets of the values that
    /// win: an older value's asset, which a zone reset may have taken for good, is never waited for.
    func resolvingAssets(_ fetched: CloudRecord, arrived: inout Set<String>) throws -> CloudRecord? {
        guard let entityIndex = store.entityIndex[fetched.recordType] else { return fetched }
        let names = store.entities[entityIndex].attributes.filter(\.isExternalData).map(\.name).sorted()
        guard !names.isEmpty else { return fetched }
        guard fetched.isAlive else {
            try dropWaitingVersions(endedBy: fetched)
            return fetched
        }
        // A version of it waiting already is joined with this one, and the join resolved: it waits only for the assets
        // of the fields it still needs (after a zone reset, an older value's asset may be gone for good).
        let remote = try joiningWaitingVersion(fetched)
        let (record, missing) = try resolvingAssetFields(remote, names: names, entityIndex: entityIndex, arrived: &arrived)
        guard missing.isEmpty else {
            try waitForAssets(remote)
            // The join waits for an asset of the waiting version. The fetched version alone — the cloud's, whose change
            // tag the wait adopts — may be complete: merged now, so that the local row, and what this device uploads
            // under that tag, never falls behind it (large-files seed 328: the device's own older title replaced a newer
            // one in the cloud while the join waited for an asset a zone reset took).
            guard remote != fetched else { return nil }
            let (alone, missingAlone) = try resolvingAssetFields(fetched, names: names, entityIndex: entityIndex, arrived: &arrived)
            return missingAlone.isEmpty ? alone : nil
        }
        return record
    }

    /// `remote` with each asset reference of its external-storage fields `names` resolved (see
    /// ``resolvingAssets(_:arrived:)``), and the assets it still lacks.
    private func resolvingAssetFields(_ remote: CloudRecord, names: [String], entityIndex: Int,
                                      arrived: inout Set<String>) throws -> (CloudRecord, [CloudAssetReference]) {
        guard names.contains(where: { if case .text? = remote.fields[$0]?.value { true } else { false } }) else { return (remote, []) }
        var record = remote
        var missing: [CloudAssetReference] = []
        var local: SyncLedger.RecordState?? = nil
        let statements = store.statements[entityIndex]
        for name in names {
            guard let field = record.fields[name], case let .text(text) = field.value else { continue }
            let asset: CloudAssetReference
            let sealed = SealedAssetReference(fieldValue: text)
            if let sealed {
                // A sealed asset: the plaintext it was opened into, once it was.
                if let plain = try openedAsset(sealed.sealed.hash) {
                    asset = plain
                    record.fields[name]!.value = .text(plain.fieldValue)
                } else {
                    asset = sealed.sealed
                }
            } else {
                guard let plain = CloudAssetReference(fieldValue: text) else { continue }
                asset = plain
            }
            let opened = sealed == nil || asset != sealed!.sealed
            if opened, let files = store.assets, files.hasFile(asset) { continue }
            if local == nil { local = .some(try SyncLedger.load(remote.recordID, store: store, db, entity: remote.recordType)) }
            if let state = local!, state.isAlive, let stamp = state.stamps[name], stamp >= field.stamp,
               let row = try db.rows("SELECT \(quoted(name)) FROM \(statements.table) WHERE \"id\" = ?", [remote.recordID.sqliteValue]).first {
                record.fields[name]!.value = row[0]
                continue
            }
            guard opened else {
                missing.append(asset)
                continue
            }
            if store.assets == nil, try hasAsset(asset) {
                var data = Data(capacity: Int(asset.size))
                for index in 0..<asset.chunkCount { data.append(try stagedChunk(asset, index)) }
                record.fields[name]!.value = .blob(data)
                arrived.insert(asset.hash)
                continue
            }
            missing.append(asset)
        }
        return (record, missing)
    }

    /// `fetched` joined field by field with a waiting version of its record (taken out of `replica_sync_asset_wait`:
    /// the join waits again if it must), or `fetched` when none waits.
    private func joiningWaitingVersion(_ fetched: CloudRecord) throws -> CloudRecord {
        guard try db.scalar(Self.anyWaitingSQL) == .integer(1), let waiting = try waitingVersion(of: fetched) else { return fetched }
        if container.environment.canaries.contains(.waitingVersionOutlivesNewer) { return fetched }
        try dropWaitingVersion(of: fetched)
        // On a tie the fetched value wins: the same write sealed again under a new key set (after a zone reset) names
        // other sealed bytes, and the waiting one's may be gone with the old zone.
        var joined = container.environment.canaries.contains(.waitingValueWinsTie)
            ? SyncLedger.mergeOpaque(waiting, fetched) : SyncLedger.mergeOpaque(fetched, waiting)
        joined.changeTag = fetched.changeTag
        return joined
    }

    /// Drops a waiting version of `tombstone`'s record that the delete ends (an incarnation up to the tombstone's): it
    /// needs its assets no more, and after a zone reset they may be gone for good — its author sends the tombstone
    /// again, never the asset — so it would wait for ever (files-zone-reset seed 86). A waiting re-insert after the
    /// delete (a higher causal length) keeps waiting.
    private func dropWaitingVersions(endedBy tombstone: CloudRecord) throws {
        guard try db.scalar(Self.anyWaitingSQL) == .integer(1), let waiting = try waitingVersion(of: tombstone),
              waiting.causalLength <= tombstone.causalLength,
              !container.environment.canaries.contains(.waitingVersionOutlivesNewer) else { return }
        try dropWaitingVersion(of: tombstone)
    }

    /// The version of `record`'s record (same ID and record type) waiting for its assets, if any.
    private func waitingVersion(of record: CloudRecord) throws -> CloudRecord? {
        guard case let .text(json)? = try db.scalar("SELECT record FROM replica_sync_asset_wait WHERE id = ? AND record_type = ?",
                                                    [record.recordID.sqliteValue, .text(record.recordType)]) else { return nil }
        return ReplicaJSON.decode(CloudRecord.self, json)
    }

    /// Removes the version of `record`'s record waiting for its assets.
    func dropWaitingVersion(of record: CloudRecord) throws {
        try db.run("DELETE FROM replica_sync_asset_wait WHERE id = ? AND record_type = ?", [record.recordID.sqliteValue, .text(record.recordType)])
    }

    /// Keeps `remote` until its assets are here, joined field by field with a waiting version of it (so no version
    /// replaces another). A local record with changes to upload takes its change tag, as for a held version: its
    /// upload replaces the cloud's version instead of conflicting with it while the asset downloads.
    private func waitForAssets(_ remote: CloudRecord) throws {
        var record = remote
        if let existing = try waitingVersion(of: remote) {
            record = SyncLedger.mergeOpaque(existing, remote)
        }
        let needed = assetReferenceTexts(in: record).joined(separator: "\n")
        try db.run("""
            INSERT INTO replica_sync_asset_wait (id, record_type, record, change_tag, assets) VALUES (?, ?, ?, ?, ?)
            ON CONFLICT (id, record_type) DO UPDATE SET record = excluded.record, change_tag = excluded.change_tag, assets = excluded.assets
            """, [remote.recordID.sqliteValue, .text(remote.recordType), .text(try ReplicaJSON.string(record)),
                  record.changeTag.map(SQLiteValue.text) ?? .null, .text(needed)])
        if let tag = remote.changeTag { try SyncLedger.adoptChangeTag(tag, of: remote.recordID, db) }
    }

    /// Drops the staged chunks of assets that arrived in an in-memory store (their bytes are in the rows now) and of
    /// assets no waiting record needs any more.
    func dropStagedChunks(_ arrived: Set<String>) throws {
        // Opened sealed assets no waiting record needs any more (their plaintext is in rows or files now).
        try db.run("DELETE FROM replica_sync_sealed_asset WHERE NOT EXISTS (SELECT 1 FROM replica_sync_asset_wait w WHERE instr(w.assets, sealed_hash) > 0)")
        for hash in arrived.sorted() {
            let stillNeeded = try db.scalar("SELECT EXISTS (SELECT 1 FROM replica_sync_asset_wait WHERE instr(assets, ?) > 0)", [.text(hash)]) == .integer(1)
            if !stillNeeded { try db.run("DELETE FROM replica_sync_asset_chunk WHERE hash = ?", [.text(hash)]) }
        }
    }
}
