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
// - Attributes also marked `.allowsCloudEncryption` travel as sealed assets (`AssetSealing`): the field holds a
//   `SealedAssetReference` (hash and size of the sealed bytes), the cloud never the plaintext or its hash. A
//   downloaded sealed asset is opened into the store's file (named by the plaintext's hash, which only devices learn)
//   before its record merges; one that does not open marks its record undecryptable (kept, reported).

/// What a sync engine knows of its asset transfers. Internal; confined to its engine.
final class AssetTransfers {
    /// Where the bytes of an asset to upload are.
    enum Source {
        /// The store's file of the asset.
        case file
        /// Bytes a row holds (an in-memory store, or a value written inline before synced stores kept files).
        case bytes(Data)
        /// The sealed form of a plaintext asset, made message by message as the chunks go.
        case sealed(Sealing)
    }

    /// A plaintext asset and how it is sealed for one record's field (``AssetSealing``).
    final class Sealing {
        let plain: CloudAssetReference
        let plainSource: Source
        let keyVersion: UInt32
        let associatedData: [UInt8]
        /// The stream, positioned at the next message to seal; rebuilt when a chunk before it is asked for.
        var stream: AssetSealStream?

        init(plain: CloudAssetReference, plainSource: Source, keyVersion: UInt32, associatedData: [UInt8]) {
            self.plain = plain
            self.plainSource = plainSource
            self.keyVersion = keyVersion
            self.associatedData = associatedData
        }
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
    /// The sealed references computed this session, by record, field, stamp, plaintext hash and key version (sealing
    /// is deterministic, so a reference stays right; recomputing one reads and seals the whole plaintext).
    var sealedReferences: [String: SealedAssetReference] = [:]

    /// The assets each outbox record of the batches built this session references and this engine can upload (a
    /// file, a row's bytes, or a sealing of them), by record: a save the cloud refuses for lack of one of them
    /// (``CloudError/assetNotFound(hash:)``) uploads it again instead of refusing the record.
    var uploadable: [UUID: Set<String>] = [:]
    /// How often the cloud refused a record for lack of each asset this session, after which the engine uploaded it
    /// again (bounded by ``refusalsBeforeRejecting``: a cloud that keeps refusing gets the record rejected, kept).
    var refusals: [String: Int] = [:]

    static let completeFor: Int64 = 10 * 60_000
    static let refusalsBeforeRejecting = 3
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

    /// The asset references in the external-storage fields of `record` (known entities only), in field-name order,
    /// as their field texts (plain or sealed references).
    func assetReferenceTexts(in record: CloudRecord) -> [String] {
        guard let index = store.entityIndex[record.recordType] else { return [] }
        return store.entities[index].attributes.filter(\.isExternalData).map(\.name).sorted().compactMap { name in
            guard case let .text(text)? = record.fields[name]?.value,
                  CloudAssetReference(fieldValue: text) != nil || SealedAssetReference(fieldValue: text) != nil else { return nil }
            return text
        }
    }

    // MARK: Sealed assets

    /// The plaintext bytes `range` of an asset to upload.
    private func plainBytes(_ asset: CloudAssetReference, _ source: AssetTransfers.Source, _ range: Range<Int64>) throws(ExternalStorageError.Problem) -> Data {
        switch source {
        case .file:
            guard let files = store.assets else { throw .missingFile }
            return try files.read(asset, range: range)
        case let .bytes(data):
            return data.subdata(in: Int(range.lowerBound)..<Int(range.upperBound))
        case .sealed:
            throw .malformedReference
        }
    }

    /// The sealed reference of `plain` for field `name` of `record` (the field's stamp bound in): from this session's
    /// cache, or computed by sealing the whole plaintext once (read in chunks; the plaintext's hash is checked on the
    /// way, so a damaged file is found here). O(size), one chunk in memory.
    private func sealedReference(_ plain: CloudAssetReference, source: AssetTransfers.Source, record: CloudRecord, field name: String,
                                 cipher: FieldCipher, keyVersion: UInt32) throws -> (SealedAssetReference, AssetTransfers.Sealing) {
        let stamp = record.fields[name]!.stamp
        let associatedData = AssetSealing.associatedData(zone: zone, recordType: record.recordType, recordID: record.recordID, field: name,
                                                         stamp: stamp, keyVersion: keyVersion)
        let sealing = AssetTransfers.Sealing(plain: plain, plainSource: source, keyVersion: keyVersion, associatedData: associatedData)
        let key = "\(record.recordID.uuidString)|\(name)|\(stamp)|\(plain.hash)|\(keyVersion)"
        if let cached = assetTransfers.sealedReferences[key] { return (cached, sealing) }
        let messages = AssetSealing.messageCount(plainSize: plain.size)
        let stream = try makeSealStream(sealing, cipher: cipher)
        var sealedHash = SHA256Hasher(), plainHash = SHA256Hasher()
        var size: Int64 = 0
        for index in 0..<messages {
            let bytes = try plainBytes(plain, source, AssetSealing.plainRange(index, plainSize: plain.size))
            plainHash.update(bytes)
            let chunk = stream.seal(bytes)
            sealedHash.update(chunk)
            size += Int64(chunk.count)
        }
        guard plainHash.finalizeHex() == plain.hash else { throw ExternalStorageError.Problem.hashMismatch }
        let reference = SealedAssetReference(keyVersion: keyVersion, sealed: CloudAssetReference(hash: sealedHash.finalizeHex(), size: size)!)
        assetTransfers.sealedReferences[key] = reference
        return (reference, sealing)
    }

    /// A new seal stream for `sealing`, at message 0.
    private func makeSealStream(_ sealing: AssetTransfers.Sealing, cipher: FieldCipher) throws -> AssetSealStream {
        try cipher.withAssetKeys(version: sealing.keyVersion) { streamKey, headerKey in
            AssetSealStream(streamKey: streamKey,
                            header: AssetSealing.header(headerKey: headerKey, associatedData: sealing.associatedData, plainHash: sealing.plain.hash),
                            associatedData: sealing.associatedData, messages: AssetSealing.messageCount(plainSize: sealing.plain.size))
        }
    }

    /// Chunk `index` of a sealed asset being uploaded (the stream moves forward, or starts over for an earlier chunk).
    private func sealedChunk(_ sealing: AssetTransfers.Sealing, index: Int) throws -> Data {
        guard let cipher = encryption?.keyring.cipher else { throw FieldEncryptionError.noKey(zone: zone) }
        if sealing.stream == nil || sealing.stream!.next > index { sealing.stream = try makeSealStream(sealing, cipher: cipher) }
        let stream = sealing.stream!
        while true {
            let message = stream.next
            let chunk = stream.seal(try plainBytes(sealing.plain, sealing.plainSource, AssetSealing.plainRange(message, plainSize: sealing.plain.size)))
            if message == index { return chunk }
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
            var mine: [(AssetTransfers.Upload, String)] = []
            var uploadable: Set<String> = []
            // Encrypted attributes: sealed assets, whose reference names only the sealed bytes.
            sealed: for name in inlineNames.sorted() {
                guard let value = record.fields[name]?.value else { continue }
                let plain: CloudAssetReference
                let source: AssetTransfers.Source
                switch value {
                case let .text(text):
                    // (A sealed reference kept from the cloud — a tombstone's preserved value — goes back as it is.)
                    if SealedAssetReference(fieldValue: text) != nil { continue }
                    guard let reference = CloudAssetReference(fieldValue: text), store.assets != nil else {
                        problem = failure(name, .malformedReference)
                        break sealed
                    }
                    plain = reference
                    source = .file
                case let .blob(data):
                    plain = CloudAssetReference(of: data)
                    source = .bytes(data)
                default:
                    continue
                }
                guard let cipher = encryption?.keyring.cipher, let keyVersion = cipher.currentKeyVersion else {
                    throw FieldEncryptionError.noKey(zone: zone)
                }
                do {
                    let (reference, sealing) = try sealedReference(plain, source: source, record: record, field: name, cipher: cipher, keyVersion: keyVersion)
                    uploadable.insert(reference.sealed.hash)
                    record.fields[name]!.value = .text(reference.fieldValue)
                    record.fields[name]!.isEncrypted = true
                    if !isComplete(reference.sealed.hash) {
                        var upload = AssetTransfers.Upload(asset: reference.sealed, source: .sealed(sealing),
                                                           records: [(record.recordID, version, record.recordType, name)])
                        upload.checked = true  // the plaintext was hashed while sealing
                        mine.append((upload, name))
                    }
                } catch let error as ExternalStorageError.Problem {
                    problem = failure(name, error)
                    break sealed
                }
            }
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
                    uploadable.insert(asset.hash)
                    if isComplete(asset.hash) { continue }
                    mine.append((AssetTransfers.Upload(asset: asset, source: source, records: [(record.recordID, version, record.recordType, name)]), name))
                }
            }
            if let problem {
                try rejectOutgoing(record.recordID, version: version, reason: problem)
                continue
            }
            assetTransfers.uploadable[record.recordID] = uploadable.isEmpty ? nil : uploadable
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
            case let .sealed(sealing):
                do {
                    bytes = try sealedChunk(sealing, index: index)
                } catch let error as ExternalStorageError.Problem {
                    for record in upload.records {
                        try rejectOutgoing(record.id, version: record.version, reason: ExternalStorageError(
                            store: storeName, entity: record.entity, recordID: record.id, attribute: record.field, problem: error).description)
                    }
                    assetTransfers.uploads.removeFirst()
                    continue
                }
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

    static let anyWaitingSQL = StatementKey("SELECT EXISTS (SELECT 1 FROM replica_sync_asset_wait)")

    /// An asset a waiting record needs: what to download, and — for a sealed asset — its sealed reference.
    struct NeededAsset {
        var download: CloudAssetReference
        var sealed: SealedAssetReference?
    }

    /// The assets a waiting record needs (its stored list of field texts).
    static func neededAssets(_ value: SQLiteValue) -> [NeededAsset] {
        guard case let .text(list) = value else { return [] }
        return list.split(separator: "\n").compactMap { part in
            let text = String(part)
            if let sealed = SealedAssetReference(fieldValue: text) { return NeededAsset(download: sealed.sealed, sealed: sealed) }
            return CloudAssetReference(fieldValue: text).map { NeededAsset(download: $0, sealed: nil) }
        }
    }

    /// The plaintext asset a downloaded sealed asset was opened into, while a waiting record needs it.
    func openedAsset(_ sealedHash: String) throws -> CloudAssetReference? {
        guard case let .text(text)? = try db.scalar("SELECT plain_ref FROM replica_sync_sealed_asset WHERE sealed_hash = ?", [.text(sealedHash)]) else {
            return nil
        }
        return CloudAssetReference(fieldValue: text)
    }

    /// Whether a needed asset is here: its bytes (``hasAsset(_:)``), or for a sealed one, the plaintext it was opened
    /// into.
    func isHere(_ needed: NeededAsset) throws -> Bool {
        guard needed.sealed != nil else { return try hasAsset(needed.download) }
        guard let plain = try openedAsset(needed.download.hash) else { return false }
        return try hasAsset(plain)
    }

    /// How many chunks of `asset` are staged (they are staged in order).
    private func stagedChunks(_ asset: CloudAssetReference) throws -> Int {
        if case let .integer(next)? = try db.scalar("SELECT coalesce(max(idx) + 1, 0) FROM replica_sync_asset_chunk WHERE hash = ?", [.text(asset.hash)]) {
            return Int(next)
        }
        return 0
    }

    /// Chunk `index` of `asset` as staged.
    func stagedChunk(_ asset: CloudAssetReference, _ index: Int) throws -> Data {
        guard case let .blob(data)? = try db.scalar("SELECT data FROM replica_sync_asset_chunk WHERE hash = ? AND idx = ?",
                                                    [.text(asset.hash), .integer(Int64(index))]) else {
            if asset.chunkRange(index).isEmpty { return Data() }
            throw ExternalStorageError.Problem.missingFile
        }
        return data
    }

    /// Whether this device has `asset`'s bytes: its file (a store file), or every chunk staged and checked (an
    /// in-memory store keeps them staged until the record is merged).
    func hasAsset(_ asset: CloudAssetReference) throws -> Bool {
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
            for needed in Self.neededAssets(row[0])
            where seen.insert(needed.download.hash).inserted && !assetTransfers.unavailable.contains(needed.download.hash) {
                guard try !isHere(needed) else { continue }
                let asset = needed.download
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
        if try finishSealedDownload(asset) { return }
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

    /// Opens a downloaded sealed asset, when `asset` is one a waiting record needs: message by message with the
    /// associated data of that record's field and write (``AssetSealing``), into the store's file named by the
    /// plaintext's hash (a store file) or into staged plaintext chunks (an in-memory store), remembered in
    /// `replica_sync_sealed_asset` until the record merges. One transaction; the sealed chunks are dropped. A sealed
    /// asset that does not open — tampered, moved to another record or field, replayed under another write, or sealed
    /// with a key this device lacks — marks the records waiting for it undecryptable (kept, reported, their local
    /// values untouched), as an unopenable field does (E5). Returns `false` when `asset` is not sealed.
    private func finishSealedDownload(_ asset: CloudAssetReference) throws -> Bool {
        // The waiting versions whose fields reference it, sealed.
        var owners: [(record: CloudRecord, field: String, sealed: SealedAssetReference)] = []
        for row in try db.rows("SELECT record FROM replica_sync_asset_wait WHERE instr(assets, ?) > 0 ORDER BY id, record_type", [.text(asset.hash)], cache: false) {
            guard case let .text(json) = row[0], let record = ReplicaJSON.decode(CloudRecord.self, json) else { continue }
            for (name, field) in record.fields.sorted(by: { $0.key < $1.key }) {
                if case let .text(text) = field.value, let sealed = SealedAssetReference(fieldValue: text), sealed.sealed == asset {
                    owners.append((record, name, sealed))
                }
            }
        }
        guard !owners.isEmpty else { return false }
        // Owners whose associated data differ cannot all open it (a moved reference): each group is tried on its own.
        var groups: [(associatedData: [UInt8], keyVersion: UInt32, owners: [(record: CloudRecord, field: String, sealed: SealedAssetReference)])] = []
        for owner in owners {
            let associatedData = AssetSealing.associatedData(zone: zone, recordType: owner.record.recordType, recordID: owner.record.recordID,
                                                             field: owner.field, stamp: owner.record.fields[owner.field]!.stamp,
                                                             keyVersion: owner.sealed.keyVersion)
            if let index = groups.firstIndex(where: { $0.associatedData == associatedData }) {
                groups[index].owners.append(owner)
            } else {
                groups.append((associatedData, owner.sealed.keyVersion, [owner]))
            }
        }
        var failed: [(CloudRecord, FieldEncryptionError)] = []
        var opened = false
        for group in groups {
            var failure: FieldEncryptionError.DecryptionFailure?
            if !opened {
                failure = try openSealedAsset(asset, associatedData: group.associatedData, keyVersion: group.keyVersion)
                opened = failure == nil
            } else {
                failure = .authenticationFailed  // only one write's associated data opens a sealed asset
            }
            guard let failure else { continue }
            if failure == .unknownKeyVersion { encryption?.metadataFresh = false }
            for owner in group.owners {
                failed.append((owner.record, .undecryptable(entity: owner.record.recordType, field: owner.field, recordID: owner.record.recordID,
                                                            keyVersion: owner.sealed.keyVersion, failure: failure)))
            }
        }
        try db.transaction(.immediate) {
            try db.run("DELETE FROM replica_sync_asset_chunk WHERE hash = ?", [.text(asset.hash)])
            for (record, _) in failed {
                try dropWaitingVersion(of: record)
            }
            if !failed.isEmpty { try markUndecryptable(failed) }
        }
        try mergeWaitingRecordsIfReady()
        return true
    }

    /// Opens the staged sealed asset `asset` with `associatedData` into the store's file (or staged plaintext chunks,
    /// in memory) and remembers what it opened into; `nil` when it opened, else why not. One transaction.
    private func openSealedAsset(_ asset: CloudAssetReference, associatedData: [UInt8], keyVersion: UInt32) throws -> FieldEncryptionError.DecryptionFailure? {
        guard let cipher = encryption?.keyring.cipher, cipher.keyVersions.contains(keyVersion) else { return .unknownKeyVersion }
        struct NotOpened: Error {}
        let produce = { (sink: (Data) throws -> Void) throws in
            try cipher.withAssetKeys(version: keyVersion) { streamKey, _ in
                guard let stream = AssetOpenStream(streamKey: streamKey, first: try self.stagedChunk(asset, 0), associatedData: associatedData,
                                                   messages: asset.chunkCount) else { throw NotOpened() }
                for index in 0..<asset.chunkCount {
                    guard let plain = stream.open(try self.stagedChunk(asset, index)) else { throw NotOpened() }
                    try sink(plain)
                }
            }
        }
        do {
            try db.transaction(.immediate) {
                let plain: CloudAssetReference
                if let files = store.assets {
                    plain = try files.writeNew(produce)
                } else {
                    var bytes = Data()
                    try produce { bytes.append($0) }
                    plain = CloudAssetReference(of: bytes)
                    for index in 0..<plain.chunkCount {
                        let range = plain.chunkRange(index)
                        try db.run("INSERT INTO replica_sync_asset_chunk (hash, idx, data) VALUES (?, ?, ?) ON CONFLICT (hash, idx) DO UPDATE SET data = excluded.data",
                                   [.text(plain.hash), .integer(Int64(index)), .blob(bytes.subdata(in: Int(range.lowerBound)..<Int(range.upperBound)))])
                    }
                }
                try db.run("INSERT INTO replica_sync_sealed_asset (sealed_hash, plain_ref) VALUES (?, ?) ON CONFLICT (sealed_hash) DO UPDATE SET plain_ref = excluded.plain_ref",
                           [.text(asset.hash), .text(plain.fieldValue)])
            }
        } catch is NotOpened {
            return .authenticationFailed
        }
        return nil
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

    /// The cloud refused to save outbox record `id` because its zone does not hold asset `hash` complete (R19: the
    /// zone was reset since the engine learned it held the asset — e.g. a save that raced the reset — or the asset was
    /// pruned). Returns `true` when the engine uploads the asset again and sends the record after it (the record stays
    /// pending); `false` when it cannot — the asset is not one it has the bytes of (a field another app version
    /// declares), or the cloud refused it ``AssetTransfers/refusalsBeforeRejecting`` times this session — and the record
    /// is to be rejected with the reason (kept, as for other refusals).
    func assetRefused(_ id: UUID, hash: String) -> Bool {
        let uploadable = assetTransfers.uploadable[id]?.contains(hash) ?? false
        assetTransfers.uploadable[id] = nil
        guard uploadable, !container.environment.canaries.contains(.missingAssetRefusalRejects) else { return false }
        let refused = assetTransfers.refusals[hash, default: 0] + 1
        guard refused <= AssetTransfers.refusalsBeforeRejecting else { return false }
        assetTransfers.refusals[hash] = refused
        assetTransfers.complete[hash] = nil
        for index in assetTransfers.uploads.indices where assetTransfers.uploads[index].asset.hash == hash {
            assetTransfers.uploads[index].missing = nil
        }
        return true
    }

    /// A fetch of the whole zone ended (or the zone was created, or may have been: an expired change token): downloads
    /// the cloud could not serve are asked again; after a zone creation, what the engine learned the zone held is
    /// forgotten (prepared again before any record that references it goes up).
    func assetCycleEnded(zoneCreated: Bool) {
        assetTransfers.unavailable.removeAll()
        if zoneCreated {
            assetTransfers.complete.removeAll()
            for index in assetTransfers.uploads.indices { assetTransfers.uploads[index].missing = nil }
        }
    }
}
