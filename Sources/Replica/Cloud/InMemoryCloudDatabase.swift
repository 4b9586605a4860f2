import Foundation
import Synchronization

/// A deterministic cloud database held in memory, for tests and the simulator.
///
/// Besides the ``CloudDatabase`` operations (synchronous here) it can inject faults: queued errors for the next
/// operations, expiring every change token, and resetting (deleting) a zone.
public final class InMemoryCloudDatabase: CloudDatabase {
    /// Which operations an injected fault applies to.
    public enum OperationKind: Sendable, Hashable {
        /// Record saves, zone deletion and metadata writes.
        case modify
        /// Fetches of changes and metadata.
        case fetch
        /// Asset uploads and downloads (``CloudDatabase/prepareAssetUpload(_:in:)`` and the chunk operations).
        case asset
        /// Any operation.
        case any
    }

    /// One asset of a zone: its chunks as received, complete once they hashed to its name.
    struct StoredAsset {
        var size: Int64
        var chunks: [Int: Data] = [:]
        var complete = false
    }

    struct StoredRecord {
        var record: CloudRecord
        var sequence: Int64
    }

    struct Zone {
        /// The zone incarnation: part of every change tag.
        var epoch: Int64
        /// The epoch tokens are issued with: the zone's epoch until ``expireChangeTokens(in:)`` moves it to a fresh
        /// one, so every token issued before (of any page) is expired and every token issued after is valid.
        var tokenEpoch: Int64
        var sequence: Int64 = 0
        var records: [UUID: StoredRecord] = [:]
        /// Record IDs by sequence (each record appears once, at its newest sequence).
        var bySequence: [Int64: UUID] = [:]
        var metadata: [String: Data] = [:]
        /// Assets by hash.
        var assets: [String: StoredAsset] = [:]
    }

    struct State {
        var zones: [String: Zone] = [:]
        /// Epochs survive a zone's deletion, so a re-created zone never accepts an old token.
        var epochs: [String: Int64] = [:]
        /// Why each deleted zone (not created again since) was deleted, where it was said.
        var deletions: [String: ZoneDeletionReason] = [:]
        var injected: [(kind: OperationKind, error: CloudError)] = []
        var operationCount = 0
    }

    private let state = Mutex(State())
    /// The largest asset this cloud accepts, in bytes.
    public let maximumAssetSize: Int64

    /// An empty cloud.
    /// - Parameter maximumAssetSize: the largest asset it accepts, in bytes (default
    ///   ``CloudAssetReference/defaultMaximumSize``, 256 MiB).
    public init(maximumAssetSize: Int64 = CloudAssetReference.defaultMaximumSize) {
        self.maximumAssetSize = maximumAssetSize
    }

    // MARK: Fault injection

    /// Makes the next operation of `kind` fail with `error` (queued: several calls fail several operations in order).
    public func injectFailure(_ error: CloudError, for kind: OperationKind = .any) {
        state.withLock { $0.injected.append((kind, error)) }
    }

    /// Expires every change token of `zone` issued so far (as when the server trims its change history).
    ///
    /// The zone moves to a new epoch: older tokens fail with `changeTokenExpired`, while every token issued from now
    /// on stays valid — including the page tokens of the full re-read that follows, whose sequences lie below
    /// the current one (a sequence floor would expire those too, and the re-read would never finish).
    public func expireChangeTokens(in zone: String) {
        state.withLock { state in
            guard var z = state.zones[zone] else { return }
            // A fresh epoch from the zone's counter (which outlives resets), so no token ever matches it by chance.
            // (A floor on sequence numbers would also expire the page tokens of the re-read that follows.)
            let epoch = (state.epochs[zone] ?? z.tokenEpoch) + 1
            state.epochs[zone] = epoch
            z.tokenEpoch = epoch
            state.zones[zone] = z
        }
    }

    /// Deletes `zone` with every record in it (a "zone reset"). Later operations on it fail with `zoneNotFound`
    /// — or, when `reason` is given, ``CloudError/zoneDeleted(reason:)`` — until it is created again; tokens from
    /// before never work again.
    /// - Parameter reason: why the zone is gone, as devices will be told; `nil` (the default): not said.
    public func resetZone(_ zone: String, reason: ZoneDeletionReason? = nil) {
        state.withLock { state in
            state.zones[zone] = nil
            state.deletions[zone] = reason
        }
    }

    /// The error for an operation on `zone`, which does not exist.
    private static func missing(_ zone: String, _ state: State) -> CloudError {
        state.deletions[zone].map { .zoneDeleted(reason: $0) } ?? .zoneNotFound
    }

    /// Every record of `zone`, in ID order (for tests and invariants).
    public func records(in zone: String) -> [CloudRecord] {
        state.withLock { state in
            (state.zones[zone]?.records.values.map(\.record) ?? []).sorted { $0.recordID.bytesPrecede($1.recordID) }
        }
    }

    /// Every byte this database holds for `zone` (records as stored and metadata), for leak scans.
    public func storedBytes(of zone: String) -> Data {
        let encoder = ReplicaJSON.encoder()
        var bytes = Data()
        for record in records(in: zone) { bytes.append((try? encoder.encode(record)) ?? Data()) }
        let metadata = state.withLock { $0.zones[zone]?.metadata ?? [:] }
        for key in metadata.keys.sorted() { bytes.append(Data(key.utf8)); bytes.append(metadata[key]!) }
        let assets = state.withLock { $0.zones[zone]?.assets ?? [:] }
        for hash in assets.keys.sorted() {
            bytes.append(Data(hash.utf8))
            let chunks = assets[hash]!.chunks
            for index in chunks.keys.sorted() { bytes.append(chunks[index]!) }
        }
        return bytes
    }

    /// The assets of `zone` (complete or not), by hash order, for tests and invariants.
    public func assets(in zone: String) -> [CloudAssetUploadState] {
        state.withLock { state in
            guard let assets = state.zones[zone]?.assets else { return [] }
            return assets.keys.sorted().compactMap { hash in
                let stored = assets[hash]!
                return CloudAssetReference(hash: hash, size: stored.size).map {
                    CloudAssetUploadState(asset: $0, receivedChunks: stored.chunks.keys.sorted(), isComplete: stored.complete)
                }
            }
        }
    }

    /// Replaces the bytes of chunk `index` of a stored asset of `zone` (tests of tampering in the cloud). Returns
    /// `false` when there is no such chunk.
    @discardableResult
    public func tamperWithAsset(_ hash: String, chunk index: Int, in zone: String, _ change: (inout Data) -> Void) -> Bool {
        state.withLock { state in
            guard var bytes = state.zones[zone]?.assets[hash]?.chunks[index] else { return false }
            change(&bytes)
            state.zones[zone]!.assets[hash]!.chunks[index] = bytes
            return true
        }
    }

    /// Removes an asset of `zone` (tests of an asset the cloud lost or collected).
    public func removeAsset(_ hash: String, in zone: String) {
        state.withLock { $0.zones[zone]?.assets[hash] = nil }
    }

    /// A number that changes with every zone's epoch and sequence (each save moves its zone's sequence), for the
    /// sync runtime's cheap polling (``CloudDatabase/changeCounter()``). O(zones).
    public func changeCounter() -> Int64? {
        state.withLock { state in
            state.zones.keys.sorted().reduce(Int64(state.zones.count)) { value, name in
                let zone = state.zones[name]!
                return (value &* 1_000_003) &+ zone.epoch &* 31 &+ zone.sequence
            }
        }
    }

    /// Number of operations performed (including failed ones).
    public var operationCount: Int { state.withLock { $0.operationCount } }

    private static func takeInjected(_ state: inout State, _ kind: OperationKind) -> CloudError? {
        state.operationCount += 1
        guard let index = state.injected.firstIndex(where: { $0.kind == kind || $0.kind == .any }) else { return nil }
        return state.injected.remove(at: index).error
    }

    /// Performs `operation` synchronously (the simulator and tests deliver requests this way).
    public func performNow(_ operation: CloudOperation) -> Result<CloudOperationResult, CloudError> {
        do {
            switch operation {
            case let .createZone(zone):
                try createZone(zone)
                return .success(.zoneCreated)
            case let .deleteZone(zone):
                try deleteZone(zone)
                return .success(.zoneDeleted)
            case let .resetZone(zone, reason):
                try deleteZone(zone, reason: reason)
                return .success(.zoneDeleted)
            case let .modifyRecords(records, zone):
                return .success(.modified(try modifyRecords(records, in: zone)))
            case let .fetchZoneChanges(zone, token, limit):
                return .success(.changes(try fetchZoneChanges(zone, since: token, limit: limit)))
            case let .fetchZoneMetadata(zone):
                return .success(.metadata(try zoneMetadata(zone)))
            case let .setZoneMetadata(zone, key, value, expected):
                return .success(.metadataValue(try setZoneMetadata(zone, key: key, value: value, ifCurrent: expected)))
            case let .prepareAssetUpload(asset, zone):
                return .success(.assetUpload(try prepareAssetUpload(asset, in: zone)))
            case let .uploadAssetChunk(asset, index, bytes, zone):
                return .success(.assetUpload(try uploadAssetChunk(asset, index: index, bytes: bytes, in: zone)))
            case let .downloadAssetChunk(asset, index, zone):
                return .success(.assetChunk(try downloadAssetChunk(asset, index: index, in: zone)))
            }
        } catch {
            return .failure(error)
        }
    }

    // MARK: CloudDatabase

    public func createZone(_ zone: String) throws(CloudError) {
        try state.withLock { (state) throws(CloudError) in
            if let error = Self.takeInjected(&state, .any) { throw error }
            if state.zones[zone] == nil {
                let epoch = (state.epochs[zone] ?? 0) + 1
                state.epochs[zone] = epoch
                state.zones[zone] = Zone(epoch: epoch, tokenEpoch: epoch)
                state.deletions[zone] = nil
            }
        }
    }

    public func deleteZone(_ zone: String) throws(CloudError) {
        try deleteZone(zone, reason: .deleted)
    }

    public func deleteZone(_ zone: String, reason: ZoneDeletionReason) throws(CloudError) {
        try state.withLock { (state) throws(CloudError) in
            if let error = Self.takeInjected(&state, .modify) { throw error }
            guard state.zones[zone] != nil else { throw Self.missing(zone, state) }
            state.zones[zone] = nil
            state.deletions[zone] = reason
        }
    }

    public func modifyRecords(_ records: [CloudRecord], in zone: String) throws(CloudError) -> [RecordSaveResult] {
        try state.withLock { (state) throws(CloudError) -> [RecordSaveResult] in
            if let error = Self.takeInjected(&state, .modify) { throw error }
            guard var z = state.zones[zone] else { throw Self.missing(zone, state) }
            var results: [RecordSaveResult] = []
            for record in records {
                // As ``SQLiteCloudDatabase``: a record whose stamps the text form cannot hold is refused, not stored.
                if let failure = record.unencodableFailure {
                    results.append(failure)
                    continue
                }
                if let existing = z.records[record.recordID], existing.record.changeTag != record.changeTag {
                    results.append(.conflict(serverRecord: existing.record))
                    continue
                }
                // A live record references only assets the zone holds complete (R19).
                if let missing = record.assetReferences.first(where: { asset in
                    !CloudAssetRules.isEmpty(asset) && !(z.assets[asset.hash].map { $0.complete && $0.size == asset.size } ?? false)
                }) {
                    results.append(.failed(recordID: record.recordID, error: .assetNotFound(hash: missing.hash)))
                    continue
                }
                z.sequence += 1
                var stored = record
                stored.changeTag = "\(z.epoch).\(z.sequence)"
                if let old = z.records[record.recordID] { z.bySequence[old.sequence] = nil }
                z.records[record.recordID] = StoredRecord(record: stored, sequence: z.sequence)
                z.bySequence[z.sequence] = record.recordID
                results.append(.saved(recordID: record.recordID, changeTag: stored.changeTag!))
            }
            state.zones[zone] = z
            return results
        }
    }

    public func fetchZoneChanges(_ zone: String, since token: ServerChangeToken?, limit: Int) throws(CloudError) -> ZoneChangeBatch {
        try state.withLock { (state) throws(CloudError) -> ZoneChangeBatch in
            if let error = Self.takeInjected(&state, .fetch) { throw error }
            guard let z = state.zones[zone] else { throw Self.missing(zone, state) }
            let after = token?.sequence ?? 0
            if let token, token.epoch != z.tokenEpoch || token.sequence > z.sequence {
                throw CloudError.changeTokenExpired  // from before an expiry or reset, or from the future
            }
            let sequences = z.bySequence.keys.filter { $0 > after }.sorted()
            let page = sequences.prefix(max(1, limit))
            let records = page.compactMap { z.bySequence[$0].flatMap { z.records[$0]?.record } }
            let more = sequences.count > page.count
            let last = more ? page.last! : z.sequence
            return ZoneChangeBatch(records: records, token: ServerChangeToken(epoch: z.tokenEpoch, sequence: last), moreComing: more)
        }
    }

    public func zoneMetadata(_ zone: String) throws(CloudError) -> [String: Data] {
        try state.withLock { (state) throws(CloudError) -> [String: Data] in
            if let error = Self.takeInjected(&state, .fetch) { throw error }
            guard let z = state.zones[zone] else { throw Self.missing(zone, state) }
            return z.metadata
        }
    }

    public func setZoneMetadata(_ zone: String, key: String, value: Data, ifCurrent expected: Data?) throws(CloudError) -> Data {
        try state.withLock { (state) throws(CloudError) -> Data in
            if let error = Self.takeInjected(&state, .modify) { throw error }
            guard var z = state.zones[zone] else { throw Self.missing(zone, state) }
            if z.metadata[key] == expected { z.metadata[key] = value }
            state.zones[zone] = z
            return z.metadata[key] ?? Data()
        }
    }

    // MARK: Assets

    private static func uploadState(_ asset: CloudAssetReference, _ stored: StoredAsset) -> CloudAssetUploadState {
        CloudAssetUploadState(asset: asset, receivedChunks: stored.complete ? Array(0..<asset.chunkCount) : stored.chunks.keys.sorted(),
                              isComplete: stored.complete)
    }

    /// The asset's entry in `zone`, made (empty) when missing or when an unfinished one of another size is there;
    /// an empty asset is complete at once.
    private static func entry(_ asset: CloudAssetReference, _ zone: inout Zone) throws(CloudError) -> StoredAsset {
        if let stored = zone.assets[asset.hash] {
            if stored.size == asset.size { return stored }
            // Bytes of two sizes cannot have one hash: a finished asset keeps its size; an unfinished one restarts.
            if stored.complete { throw .assetHashMismatch(hash: asset.hash) }
        }
        var stored = StoredAsset(size: asset.size)
        if asset.size == 0 {
            guard asset.hash == CloudAssetRules.emptyHash else { throw .assetHashMismatch(hash: asset.hash) }
            stored.complete = true
        }
        zone.assets[asset.hash] = stored
        return stored
    }

    public func prepareAssetUpload(_ asset: CloudAssetReference, in zone: String) throws(CloudError) -> CloudAssetUploadState {
        try state.withLock { (state) throws(CloudError) -> CloudAssetUploadState in
            if let error = Self.takeInjected(&state, .asset) { throw error }
            guard var z = state.zones[zone] else { throw Self.missing(zone, state) }
            try CloudAssetRules.check(asset, limit: maximumAssetSize)
            let stored = try Self.entry(asset, &z)
            state.zones[zone] = z
            return Self.uploadState(asset, stored)
        }
    }

    public func uploadAssetChunk(_ asset: CloudAssetReference, index: Int, bytes: Data, in zone: String) throws(CloudError) -> CloudAssetUploadState {
        try state.withLock { (state) throws(CloudError) -> CloudAssetUploadState in
            if let error = Self.takeInjected(&state, .asset) { throw error }
            guard var z = state.zones[zone] else { throw Self.missing(zone, state) }
            try CloudAssetRules.check(asset, limit: maximumAssetSize)
            try CloudAssetRules.check(asset, index: index, length: bytes.count)
            var stored = try Self.entry(asset, &z)
            if !stored.complete {
                stored.chunks[index] = bytes
                if stored.chunks.count == asset.chunkCount {
                    var hasher = SHA256Hasher()
                    for i in 0..<asset.chunkCount { hasher.update(stored.chunks[i]!) }
                    guard hasher.finalizeHex() == asset.hash else {
                        z.assets[asset.hash] = nil
                        state.zones[zone] = z
                        throw .assetHashMismatch(hash: asset.hash)
                    }
                    stored.complete = true
                }
                z.assets[asset.hash] = stored
                state.zones[zone] = z
            }
            return Self.uploadState(asset, stored)
        }
    }

    public func downloadAssetChunk(_ asset: CloudAssetReference, index: Int, in zone: String) throws(CloudError) -> Data {
        try state.withLock { (state) throws(CloudError) -> Data in
            if let error = Self.takeInjected(&state, .asset) { throw error }
            guard let z = state.zones[zone] else { throw Self.missing(zone, state) }
            guard let stored = z.assets[asset.hash], stored.complete, stored.size == asset.size else {
                throw .assetNotFound(hash: asset.hash)
            }
            try CloudAssetRules.checkIndex(asset, index)
            return stored.chunks[index] ?? Data()
        }
    }
}
