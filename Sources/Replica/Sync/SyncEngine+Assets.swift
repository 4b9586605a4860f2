import Foundation

// Assets in sync (issue 24 item 3; `Specs/external-storage.md`, "Assets in sync"; `Specs/replication-protocol.md` R19).
//
// A value of an attribute marked `.externalStorage` (type Data) travels outside its record: the record's field holds
// the asset's reference (`replica-asset:sha256:<hash>:<size>`), and the bytes move in 1 MiB chunks.
// - Upload: before the records of an outbox batch go out, every asset they reference that the zone may lack is
//   uploaded (`prepareAssetUpload` tells which chunks the zone holds: an interrupted upload resumes, an asset the zone
//   has is not sent again). The batch's records go out only once the zone holds all of them complete.
// - Download: a fetched record whose asset this device lacks is not merged: it is kept in `replica_sync_asset_wait`
//   (with the change token, in the import's transaction), its assets are downloaded chunk by chunk into
//   `replica_sync_asset_chunk`, written to the store's asset file (hash checked), and then it is merged. Until then it
//   counts in `SyncStatus.waitingForAsset` and its ledger entry says `waitingForAsset`. A value never arrives inline.
// - Values that an older writer sent inline (BLOBs) merge as they are, and are uploaded as assets when sent again.
// - Attributes also marked `.allowsCloudEncryption` keep travelling inline, sealed with their record, until sealed
//   assets exist.

/// What a sync engine knows of its asset transfers. Internal; confined to its engine.
final class AssetTransfers {
    /// Where the bytes of an asset to upload are.
    enum Source {
        /// The store's file of the asset.
        case file
        /// Bytes a row holds (an in-memory store, or a value written inline before synced stores kept files).
        case bytes(Data)
    }

    /// An asset the zone may lack, with the outbox records that reference it.
    struct Upload {
        var asset: CloudAssetReference
        var source: Source
        var records: [(id: UUID, version: Int64, entity: String, field: String)]
        /// The chunks the zone lacks; `nil` until the zone was asked.
        var missing: [Int]?
        /// Whether the file was checked against the asset's hash (before its first chunk goes).
        var checked = false
    }

    /// Uploads owed before the next batch of records, in order.
    var uploads: [Upload] = []
    /// Assets the zone holds complete, with when this engine learned it (environment milliseconds). Trusted for
    /// ``completeFor`` only: an asset no record references yet may be collected by the server's prune after an hour.
    var complete: [String: Int64] = [:]
    /// Downloads the cloud could not serve in this sync cycle (asked again once a fetch of the zone completes).
    var unavailable: Set<String> = []

    static let completeFor: Int64 = 10 * 60_000
}

extension Schema.Attribute {
    /// Whether values of this attribute travel as assets when synced (`.externalStorage` data).
    var isExternalData: Bool { options.contains(.externalStorage) && type == .data }
}

extension SyncEngine {
    // MARK: Which fields

    /// The names of entity `index`'s external-storage data attributes whose values travel as assets, and of those
    /// that travel inline, sealed with their record (also `.allowsCloudEncryption`).
    func externalFields(ofEntityAt index: Int) -> (assets: [String], inline: [String]) {
        var assets: [String] = [], inline: [String] = []
        for attribute in store.entities[index].attributes where attribute.isExternalData {
            if attribute.options.contains(.allowsCloudEncryption) { inline.append(attribute.name) } else { assets.append(attribute.name) }
        }
        return (assets, inline)
    }

    /// The asset references in the external-storage fields of `record` (known entities only), in field-name order.
    func assetReferences(in record: CloudRecord) -> [CloudAssetReference] {
        guard let index = store.entityIndex[record.recordType] else { return [] }
        return store.entities[index].attributes.filter(\.isExternalData).map(\.name).sorted().compactMap { name in
            if case let .text(text)? = record.fields[name]?.value { CloudAssetReference(fieldValue: text) } else { nil }
        }
    }

    private var nowMilliseconds: Int64 { container.environment.clock.nowMilliseconds() }

    private func isComplete(_ hash: String) -> Bool {
        guard let learned = assetTransfers.complete[hash] else { return false }
        let age = nowMilliseconds.subtractingReportingOverflow(learned)
        return !age.overflow && age.partialValue >= 0 && age.partialValue < AssetTransfers.completeFor
    }

    // MARK: Upload

    /// Marks an outbox record rejected (it stays queued with `reason`, and leaves the outbox until changed again),
    /// unless a save changed it since `version` was read.
    private func rejectOutgoing(_ id: UUID, version: Int64, reason: String) throws {
        try db.run("UPDATE replica_sync_record SET state = 'rejected', reason = ? WHERE id = ? AND local_version = ? AND pending = 1",
                   [.text(reason), id.sqliteValue, .integer(version)])
    }

    /// The outbox records as they go to the cloud: external-storage values as asset references (a BLOB becomes its
    /// reference) — or, for encrypted attributes, as their bytes (sealed with the record) — and the assets the zone
    /// may lack queued for upload ahead of them (``nextAssetUploadOperation()``). A record whose value cannot be
    /// sent (a malformed reference, an encrypted value whose file cannot be read) is marked rejected with the reason
    /// and left out. O(records).
    func prepareOutgoingAssets(_ outbox: [(record: CloudRecord, version: Int64)]) throws -> [(record: CloudRecord, version: Int64)] {
        var result: [(record: CloudRecord, version: Int64)] = []
        result.reserveCapacity(outbox.count)
        var queue: [AssetTransfers.Upload] = []
        var queued: [String: Int] = [:]
        for (original, version) in outbox {
            guard let entityIndex = store.entityIndex[original.recordType] else {
                result.append((original, version))
                continue
            }
            let (assetNames, inlineNames) = externalFields(ofEntityAt: entityIndex)
            guard !assetNames.isEmpty || !inlineNames.isEmpty else {
                result.append((original, version))
                continue
            }
            var record = original
            var problem: String?
            func failure(_ name: String, _ what: ExternalStorageError.Problem) -> String {
                ExternalStorageError(store: storeName, entity: record.recordType, recordID: record.recordID, attribute: name, problem: what).description
            }
            // Encrypted attributes: the bytes, sealed with the record (no sealed assets yet).
            for name in inlineNames.sorted() {
                guard case let .text(text)? = record.fields[name]?.value else { continue }
                guard CloudAssetReference(fieldValue: text) != nil, let files = store.assets else {
                    problem = failure(name, .malformedReference)
                    break
                }
                do throws(ExternalStorageError.Problem) {
                    record.fields[name]!.value = .blob(try files.read(text))
                } catch {
                    problem = failure(name, error)
                    break
                }
            }
            var mine: [(AssetTransfers.Upload, String)] = []
            if problem == nil {
                fields: for name in assetNames.sorted() {
                    guard let value = record.fields[name]?.value else { continue }
                    let asset: CloudAssetReference
                    let source: AssetTransfers.Source
                    switch value {
                    case let .text(text):
                        guard let reference = CloudAssetReference(fieldValue: text) else {
                            problem = failure(name, .malformedReference)
                            break fields
                        }
                        asset = reference
                        source = .file
                    case let .blob(data):
                        asset = CloudAssetReference(of: data)
                        source = .bytes(data)
                        record.fields[name]!.value = .text(asset.fieldValue)
                    default:
                        continue
                    }
                    // A reference a store without files holds came from the cloud (a tombstone's preserved value): the
                    // zone has it.
                    if case .file = source, store.assets == nil { continue }
                    if isComplete(asset.hash) { continue }
                    mine.append((AssetTransfers.Upload(asset: asset, source: source, records: [(record.recordID, version, record.recordType, name)]), name))
                }
            }
            if let problem {
                try rejectOutgoing(record.recordID, version: version, reason: problem)
                continue
            }
            for (upload, _) in mine {
                if let index = queued[upload.asset.hash] {
                    queue[index].records += upload.records
                } else {
                    queued[upload.asset.hash] = queue.count
                    queue.append(upload)
                }
            }
            result.append((record, version))
        }
        // An upload under way keeps what it learned of the zone and of its file.
        var previous: [String: AssetTransfers.Upload] = [:]
        for upload in assetTransfers.uploads where previous[upload.asset.hash] == nil { previous[upload.asset.hash] = upload }
        assetTransfers.uploads = queue.map { upload in
            var upload = upload
            if let earlier = previous[upload.asset.hash] {
                upload.missing = earlier.missing
                upload.checked = earlier.checked
            }
            return upload
        }
        return result
    }

    /// The next request of the asset uploads owed before the next batch of records (prepare, then the missing
    /// chunks, one at a time: one chunk in memory), or `nil` when none is owed.
    func nextAssetUploadOperation() throws -> CloudOperation? {
        while let upload = assetTransfers.uploads.first {
            if isComplete(upload.asset.hash) {
                assetTransfers.uploads.removeFirst()
                continue
            }
            guard let index = upload.missing?.first else { return .prepareAssetUpload(upload.asset, zone: zone) }
            let bytes: Data
            switch upload.source {
            case .file:
                do throws(ExternalStorageError.Problem) {
                    guard let files = store.assets else { throw .missingFile }
                    // The file is checked before its first chunk goes (once per upload): a damaged or missing file never
                    // reaches the cloud, and its records are refused with the reason. O(size), one chunk in memory.
                    if !upload.checked {
                        guard files.verifiesFile(upload.asset) else { throw files.hasFile(upload.asset) ? .hashMismatch : .missingFile }
                        assetTransfers.uploads[0].checked = true
                    }
                    bytes = try files.readChunk(upload.asset, index: index)
                } catch {
                    // The file went away (or broke) since it was checked: its records are refused with the reason.
                    for record in upload.records {
                        try rejectOutgoing(record.id, version: record.version, reason: ExternalStorageError(
                            store: storeName, entity: record.entity, recordID: record.id, attribute: record.field, problem: error).description)
                    }
                    assetTransfers.uploads.removeFirst()
                    continue
                }
            case let .bytes(data):
                let range = upload.asset.chunkRange(index)
                bytes = data.subdata(in: Int(range.lowerBound)..<Int(range.upperBound))
            }
            return .uploadAssetChunk(upload.asset, index: index, bytes: bytes, zone: zone)
        }
        return nil
    }

    /// Takes in what the zone holds of an asset being uploaded.
    private func receiveAssetUpload(_ state: CloudAssetUploadState) {
        if state.isComplete { assetTransfers.complete[state.asset.hash] = nowMilliseconds }
        guard let index = assetTransfers.uploads.firstIndex(where: { $0.asset == state.asset }) else { return }
        if state.isComplete {
            assetTransfers.uploads.remove(at: index)
        } else {
            assetTransfers.uploads[index].missing = state.missingChunks
        }
    }

    // MARK: Download

    private static let anyWaitingSQL = StatementKey("SELECT EXISTS (SELECT 1 FROM replica_sync_asset_wait)")

    /// The assets a waiting record needs (its stored list).
    private static func neededAssets(_ value: SQLiteValue) -> [CloudAssetReference] {
        guard case let .text(list) = value else { return [] }
        return list.split(separator: "\n").compactMap { CloudAssetReference(fieldValue: String($0)) }
    }

    /// How many chunks of `asset` are staged (they are staged in order).
    private func stagedChunks(_ asset: CloudAssetReference) throws -> Int {
        if case let .integer(next)? = try db.scalar("SELECT coalesce(max(idx) + 1, 0) FROM replica_sync_asset_chunk WHERE hash = ?", [.text(asset.hash)]) {
            return Int(next)
        }
        return 0
    }

    /// Chunk `index` of `asset` as staged.
    private func stagedChunk(_ asset: CloudAssetReference, _ index: Int) throws -> Data {
        guard case let .blob(data)? = try db.scalar("SELECT data FROM replica_sync_asset_chunk WHERE hash = ? AND idx = ?",
                                                    [.text(asset.hash), .integer(Int64(index))]) else {
            if asset.chunkRange(index).isEmpty { return Data() }
            throw ExternalStorageError.Problem.missingFile
        }
        return data
    }

    /// Whether this device has `asset`'s bytes: its file (a store file), or every chunk staged and checked (an
    /// in-memory store keeps them staged until the record is merged).
    private func hasAsset(_ asset: CloudAssetReference) throws -> Bool {
        if let files = store.assets { return files.hasFile(asset) }
        if asset.size == 0 { return true }
        return try stagedChunks(asset) >= asset.chunkCount
    }

    /// The next download request of an asset a waiting record needs, or `nil`. Waiting records whose assets are all
    /// here are merged first (after a download completed, or a restart).
    func nextAssetDownloadOperation() throws -> CloudOperation? {
        guard try db.scalar(Self.anyWaitingSQL) == .integer(1) else { return nil }
        try mergeWaitingRecordsIfReady()
        var seen = Set<String>()
        for row in try db.rows("SELECT assets FROM replica_sync_asset_wait ORDER BY id, record_type", cache: false) {
            for asset in Self.neededAssets(row[0]) where seen.insert(asset.hash).inserted && !assetTransfers.unavailable.contains(asset.hash) {
                guard try !hasAsset(asset) else { continue }
                let next = try stagedChunks(asset)
                if next >= asset.chunkCount {
                    // Every chunk arrived before a restart: finish it now.
                    try finishDownload(asset)
                    return try nextAssetDownloadOperation()
                }
                return .downloadAssetChunk(asset, index: next, zone: zone)
            }
        }
        return nil
    }

    /// Stages a downloaded chunk; the last one finishes the download.
    private func receiveAssetChunk(_ bytes: Data, asset: CloudAssetReference, index: Int) throws {
        let range = asset.chunkRange(index)
        guard Int64(bytes.count) == range.upperBound - range.lowerBound else {
            try downloadFailed(asset, .invalidAsset(reason: "chunk \(index) of \(asset) arrived with \(bytes.count) bytes"))
            return
        }
        try db.transaction(.immediate) {
            try db.run("INSERT INTO replica_sync_asset_chunk (hash, idx, data) VALUES (?, ?, ?) ON CONFLICT (hash, idx) DO UPDATE SET data = excluded.data",
                       [.text(asset.hash), .integer(Int64(index)), .blob(bytes)])
        }
        if index + 1 == asset.chunkCount { try finishDownload(asset) }
    }

    /// Checks a downloaded asset's hash and, for a store file, writes its file (durably, before anything references
    /// it; the waiting record that names it keeps it from the collector) and drops the staged chunks; then merges
    /// the records waiting for it. Bytes that do not hash to the name are dropped and reported (the record keeps
    /// waiting; the cloud is asked again in the next sync cycle).
    private func finishDownload(_ asset: CloudAssetReference) throws {
        do {
            if let files = store.assets {
                try db.transaction(.immediate) {
                    try files.write(asset) { try stagedChunk(asset, $0) }
                    try db.run("DELETE FROM replica_sync_asset_chunk WHERE hash = ?", [.text(asset.hash)])
                }
            } else {
                var hasher = SHA256Hasher()
                for index in 0..<asset.chunkCount { hasher.update(try stagedChunk(asset, index)) }
                guard hasher.finalizeHex() == asset.hash else { throw ExternalStorageError.Problem.hashMismatch }
            }
        } catch let problem as ExternalStorageError.Problem {
            switch problem {
            case .hashMismatch, .sizeMismatch, .missingFile:
                try downloadFailed(asset, .assetHashMismatch(hash: asset.hash))
                return
            default:
                throw ReplicaError.externalStorage(ExternalStorageError(store: storeName, entity: "(downloaded asset)", recordID: nil,
                                                                        attribute: asset.description, problem: problem))
            }
        }
        try mergeWaitingRecordsIfReady()
    }

    /// A download that cannot complete now: staged chunks dropped, the waiting records' reason set, the error in the
    /// status; asked again in the next sync cycle.
    private func downloadFailed(_ asset: CloudAssetReference, _ error: CloudError) throws {
        assetTransfers.unavailable.insert(asset.hash)
        lastError = error
        try db.transaction(.immediate) {
            try db.run("DELETE FROM replica_sync_asset_chunk WHERE hash = ?", [.text(asset.hash)])
            try db.run("UPDATE replica_sync_asset_wait SET reason = ? WHERE instr(assets, ?) > 0", [.text(error.description), .text(asset.hash)])
        }
    }

    /// Merges, in one import transaction, the waiting records whose assets are all here.
    private func mergeWaitingRecordsIfReady() throws {
        var ready = false
        for row in try db.rows("SELECT assets FROM replica_sync_asset_wait ORDER BY id, record_type", cache: false) {
            if try Self.neededAssets(row[0]).allSatisfy(hasAsset) {
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
            guard try Self.neededAssets(row[3]).allSatisfy(hasAsset), case let .text(json) = row[2],
                  var record = SyncLedger.decode(CloudRecord.self, json) else { continue }
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
    /// are history; a file missing there leaves the reference in it).
    func resolvingAssets(_ remote: CloudRecord, arrived: inout Set<String>) throws -> CloudRecord? {
        guard remote.isAlive, let entityIndex = store.entityIndex[remote.recordType] else { return remote }
        let names = store.entities[entityIndex].attributes.filter(\.isExternalData).map(\.name).sorted()
        guard names.contains(where: { if case .text? = remote.fields[$0]?.value { true } else { false } }) else { return remote }
        var record = remote
        var missing: [CloudAssetReference] = []
        var local: SyncLedger.RecordState?? = nil
        let statements = store.statements[entityIndex]
        for name in names {
            guard let field = record.fields[name], case let .text(text) = field.value, let asset = CloudAssetReference(fieldValue: text) else { continue }
            if let files = store.assets, files.hasFile(asset) { continue }
            if local == nil { local = .some(try SyncLedger.load(remote.recordID, store: store, db, entity: remote.recordType)) }
            if let state = local!, state.isAlive, let stamp = state.stamps[name], stamp >= field.stamp,
               let row = try db.rows("SELECT \(quoted(name)) FROM \(statements.table) WHERE \"id\" = ?", [remote.recordID.sqliteValue]).first {
                record.fields[name]!.value = row[0]
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
        guard missing.isEmpty else {
            try waitForAssets(remote)
            return nil
        }
        return record
    }

    /// Keeps `remote` until its assets are here, joined field by field with a waiting version of it (so no version
    /// replaces another). A local record with changes to upload takes its change tag, as for a held version: its
    /// upload replaces the cloud's version instead of conflicting with it while the asset downloads.
    private func waitForAssets(_ remote: CloudRecord) throws {
        var record = remote
        if case let .text(json)? = try db.scalar("SELECT record FROM replica_sync_asset_wait WHERE id = ? AND record_type = ?",
                                                 [remote.recordID.sqliteValue, .text(remote.recordType)]),
           let existing = SyncLedger.decode(CloudRecord.self, json) {
            record = SyncLedger.mergeOpaque(existing, remote)
        }
        let needed = assetReferences(in: record).map(\.fieldValue).joined(separator: "\n")
        try db.run("""
            INSERT INTO replica_sync_asset_wait (id, record_type, record, change_tag, assets) VALUES (?, ?, ?, ?, ?)
            ON CONFLICT (id, record_type) DO UPDATE SET record = excluded.record, change_tag = excluded.change_tag, assets = excluded.assets
            """, [remote.recordID.sqliteValue, .text(remote.recordType), .text(try SyncLedger.encode(record)),
                  record.changeTag.map(SQLiteValue.text) ?? .null, .text(needed)])
        if let tag = remote.changeTag { try SyncLedger.adoptChangeTag(tag, of: remote.recordID, db) }
    }

    /// Drops the staged chunks of assets that arrived in an in-memory store (their bytes are in the rows now) and of
    /// assets no waiting record needs any more.
    func dropStagedChunks(_ arrived: Set<String>) throws {
        for hash in arrived.sorted() {
            let stillNeeded = try db.scalar("SELECT EXISTS (SELECT 1 FROM replica_sync_asset_wait WHERE instr(assets, ?) > 0)", [.text(hash)]) == .integer(1)
            if !stillNeeded { try db.run("DELETE FROM replica_sync_asset_chunk WHERE hash = ?", [.text(hash)]) }
        }
    }

    // MARK: Responses

    /// Applies the answer to an asset request; `false` when `operation` is not one.
    func handleAssetResult(_ outcome: CloudOperationResult, for operation: CloudOperation) throws -> Bool {
        switch (operation, outcome) {
        case let (.prepareAssetUpload, .assetUpload(state)), let (.uploadAssetChunk, .assetUpload(state)):
            receiveAssetUpload(state)
        case let (.downloadAssetChunk(asset, index, _), .assetChunk(bytes)):
            try receiveAssetChunk(bytes, asset: asset, index: index)
        default:
            return false
        }
        return true
    }

    /// Handles the errors of asset requests that concern the asset rather than the zone or the connection; `false`
    /// for the others (the usual handling applies: zone missing, transient errors backing off).
    func failAsset(_ error: CloudError, request: SyncRequest) throws -> Bool {
        switch request.operation {
        case let .prepareAssetUpload(asset, _), let .uploadAssetChunk(asset, _, _, _):
            switch error {
            case .assetTooLarge, .invalidAsset:
                // The cloud will not take it: the records that reference it are refused with the reason (kept).
                lastError = error
                if let index = assetTransfers.uploads.firstIndex(where: { $0.asset == asset }) {
                    for record in assetTransfers.uploads[index].records {
                        try rejectOutgoing(record.id, version: record.version, reason: "\(record.entity).\(record.field): \(error)")
                    }
                    assetTransfers.uploads.remove(at: index)
                }
                return true
            case .assetHashMismatch:
                // The bytes were checked before they went: damaged on the way. The upload starts over after a backoff.
                if let index = assetTransfers.uploads.firstIndex(where: { $0.asset == asset }) { assetTransfers.uploads[index].missing = nil }
                return false
            default:
                return false
            }
        case let .downloadAssetChunk(asset, _, _):
            switch error {
            case .assetNotFound, .invalidAsset, .assetHashMismatch:
                try downloadFailed(asset, error)
                return true
            default:
                return false
            }
        default:
            return false
        }
    }

    /// A fetch of the whole zone ended (or the zone was created): downloads the cloud could not serve are asked again.
    func assetCycleEnded(zoneCreated: Bool) {
        assetTransfers.unavailable.removeAll()
        if zoneCreated {
            assetTransfers.complete.removeAll()
            for index in assetTransfers.uploads.indices { assetTransfers.uploads[index].missing = nil }
        }
    }
}
