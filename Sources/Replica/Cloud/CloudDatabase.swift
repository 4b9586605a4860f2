import Foundation

/// A cloud database modelled on CloudKit's private database: named zones of records, saves guarded by change tags
/// (the if-server-record-unchanged policy), and a per-zone change stream read with server change tokens.
///
/// The sync engine never calls a cloud database itself (it is sans-IO): it emits ``CloudOperation`` values that a
/// driver (``SyncDriver``) or the simulator performs with ``CloudDatabase/perform(_:)``.
///
/// Implementations: ``InMemoryCloudDatabase`` (deterministic, with fault injection, for tests and the simulator) and
/// ``SQLiteCloudDatabase`` (one SQLite file that several processes can share: the embedded default).
/// Their synchronous methods satisfy these `async` requirements.
///
/// Source: <https://developer.apple.com/documentation/cloudkit/ckdatabase>
public protocol CloudDatabase: Sendable {
    /// Creates `zone` if it does not exist. Idempotent.
    func createZone(_ zone: String) async throws(CloudError)

    /// Deletes `zone` with every record and all metadata in it (CloudKit's zone deletion), for reason
    /// ``ZoneDeletionReason/deleted``. Its change tokens never work again; creating it again starts a new epoch.
    /// Until then, operations on it fail with ``CloudError/zoneDeleted(reason:)`` where the database remembers the
    /// reason (all three built-in ones do), else with ``CloudError/zoneNotFound``.
    /// - Throws: `zoneNotFound` (or `zoneDeleted`) when the zone does not exist, or a whole-request error.
    func deleteZone(_ zone: String) async throws(CloudError)

    /// Deletes `zone` as ``deleteZone(_:)`` does, remembering `reason` so that devices learn why
    /// (``CloudError/zoneDeleted(reason:)``) until the zone is created again. The default implementation calls
    /// ``deleteZone(_:)`` (the reason is not kept).
    /// - Throws: as ``deleteZone(_:)``.
    func deleteZone(_ zone: String, reason: ZoneDeletionReason) async throws(CloudError)

    /// Saves records with the if-server-record-unchanged policy: a record whose ``CloudRecord/changeTag`` differs
    /// from the server's current one is not saved and comes back as ``RecordSaveResult/conflict(serverRecord:)``.
    /// - Returns: one result per record, in input order.
    /// - Throws: `zoneNotFound`, or a whole-request error (rate limit, quota, zone busy, network).
    func modifyRecords(_ records: [CloudRecord], in zone: String) async throws(CloudError) -> [RecordSaveResult]

    /// The records changed in `zone` after `token` (`nil`: from the beginning), at most `limit` of them, each at its
    /// newest version, in change order.
    /// - Throws: `changeTokenExpired` when the token is older than the server keeps (or from before a zone reset),
    ///   `zoneNotFound`, or a whole-request error.
    func fetchZoneChanges(_ zone: String, since token: ServerChangeToken?, limit: Int) async throws(CloudError) -> ZoneChangeBatch

    /// Zone-level metadata (e.g. the union schema, the encryption salt and key check), by key.
    func zoneMetadata(_ zone: String) async throws(CloudError) -> [String: Data]

    /// Sets zone metadata `key` to `value` if it is still `expected` (compare-and-swap). Returns the value now stored
    /// (empty when `key` has no value).
    func setZoneMetadata(_ zone: String, key: String, value: Data, ifCurrent expected: Data?) async throws(CloudError) -> Data

    /// The names of zones as the database announces changes to them (a push hint: the sync runtime, ``CloudSync``,
    /// fetches when its zone is named). `nil` (the default) when the database cannot announce changes; the runtime
    /// then relies on ``changeCounter()`` and its timer. The PostgreSQL cloud returns its LISTEN/NOTIFY sequence.
    func changeNotifications() -> AsyncStream<String>?

    /// A number that changes whenever the database may have changed, cheap enough to read every few seconds, or
    /// `nil` (the default) when there is no such number. The sync runtime polls it on its timer and fetches when it
    /// moved. ``SQLiteCloudDatabase``: `PRAGMA data_version` (other connections' commits) plus this instance's own
    /// writes; ``InMemoryCloudDatabase``: its count of writes.
    func changeCounter() -> Int64?

    /// What the zone holds of `asset`, for an upload that may resume: the chunks it has (all of them, and
    /// ``CloudAssetUploadState/isComplete``, when the zone holds the asset already — deduplication: nothing is to be
    /// sent). Using a complete asset this way keeps it from being collected as unreferenced for a while
    /// (`replica-cloud prune`), so the record that references it can follow.
    /// - Parameters:
    ///   - asset: the asset's hash and size.
    ///   - zone: the zone.
    /// - Returns: the chunks held. O(chunks).
    /// - Throws: ``CloudError/assetTooLarge(size:limit:)`` when the asset exceeds the cloud's limit per asset,
    ///   ``CloudError/assetHashMismatch(hash:)`` for an empty asset whose hash is not that of no bytes, `zoneNotFound`
    ///   (or `zoneDeleted`), or a whole-request error. The default implementation (a cloud that keeps no assets)
    ///   throws ``CloudError/invalidAsset(reason:)``.
    func prepareAssetUpload(_ asset: CloudAssetReference, in zone: String) async throws(CloudError) -> CloudAssetUploadState

    /// Stores chunk `index` of `asset` (``CloudAssetReference/chunkRange(_:)`` bytes; ``CloudAssetReference/chunkSize``
    /// except for the last). Idempotent: a chunk sent again replaces the same bytes, and a complete asset ignores it.
    /// When the zone then holds every chunk, it checks that they hash to the asset's name and marks the asset
    /// complete; if they do not, it drops them all.
    /// - Parameters:
    ///   - asset: the asset's hash and size.
    ///   - index: the chunk's index (0-based).
    ///   - bytes: the chunk's bytes.
    ///   - zone: the zone.
    /// - Returns: what the zone holds of the asset now.
    /// - Throws: ``CloudError/invalidAsset(reason:)`` for an index outside the asset or a chunk of the wrong length,
    ///   ``CloudError/assetTooLarge(size:limit:)``, ``CloudError/assetHashMismatch(hash:)`` when the completed
    ///   chunks do not hash to the name, `zoneNotFound` (or `zoneDeleted`), or a whole-request error.
    func uploadAssetChunk(_ asset: CloudAssetReference, index: Int, bytes: Data, in zone: String) async throws(CloudError) -> CloudAssetUploadState

    /// Chunk `index` of the complete asset `asset`.
    /// - Parameters:
    ///   - asset: the asset's hash and size.
    ///   - index: the chunk's index (0-based).
    ///   - zone: the zone.
    /// - Returns: the chunk's bytes (the downloader checks the whole asset's hash once it has every chunk).
    /// - Throws: ``CloudError/assetNotFound(hash:)`` when the zone holds no complete asset of that hash and size,
    ///   ``CloudError/invalidAsset(reason:)`` for an index outside the asset, `zoneNotFound` (or `zoneDeleted`), or
    ///   a whole-request error.
    func downloadAssetChunk(_ asset: CloudAssetReference, index: Int, in zone: String) async throws(CloudError) -> Data
}

extension CloudDatabase {
    public func prepareAssetUpload(_ asset: CloudAssetReference, in zone: String) async throws(CloudError) -> CloudAssetUploadState {
        throw .invalidAsset(reason: "this cloud database (\(type(of: self))) keeps no assets")
    }

    public func uploadAssetChunk(_ asset: CloudAssetReference, index: Int, bytes: Data, in zone: String) async throws(CloudError) -> CloudAssetUploadState {
        throw .invalidAsset(reason: "this cloud database (\(type(of: self))) keeps no assets")
    }

    public func downloadAssetChunk(_ asset: CloudAssetReference, index: Int, in zone: String) async throws(CloudError) -> Data {
        throw .invalidAsset(reason: "this cloud database (\(type(of: self))) keeps no assets")
    }
}

extension CloudDatabase {
    public func deleteZone(_ zone: String, reason: ZoneDeletionReason) async throws(CloudError) { try await deleteZone(zone) }
    public func changeNotifications() -> AsyncStream<String>? { nil }
    public func changeCounter() -> Int64? { nil }
}

/// One request the sync engine asks its driver to perform.
public enum CloudOperation: Hashable, Sendable {
    case createZone(String)
    case deleteZone(String)
    /// Deletes the zone for `reason` (``CloudDatabase/deleteZone(_:reason:)``): the engine's own zone reset for new
    /// encryption keys (``ZoneDeletionReason/encryptedDataReset``).
    case resetZone(String, reason: ZoneDeletionReason)
    case modifyRecords([CloudRecord], zone: String)
    case fetchZoneChanges(zone: String, since: ServerChangeToken?, limit: Int)
    case fetchZoneMetadata(zone: String)
    case setZoneMetadata(zone: String, key: String, value: Data, ifCurrent: Data?)
    /// ``CloudDatabase/prepareAssetUpload(_:in:)``.
    case prepareAssetUpload(CloudAssetReference, zone: String)
    /// ``CloudDatabase/uploadAssetChunk(_:index:bytes:in:)``.
    case uploadAssetChunk(CloudAssetReference, index: Int, bytes: Data, zone: String)
    /// ``CloudDatabase/downloadAssetChunk(_:index:in:)``.
    case downloadAssetChunk(CloudAssetReference, index: Int, zone: String)

    /// A short name for traces and logs (never record contents).
    public var name: String {
        switch self {
        case .createZone: return "createZone"
        case .deleteZone: return "deleteZone"
        case .resetZone: return "resetZone"
        case .modifyRecords: return "modifyRecords"
        case .fetchZoneChanges: return "fetchZoneChanges"
        case .fetchZoneMetadata: return "fetchZoneMetadata"
        case .setZoneMetadata: return "setZoneMetadata"
        case .prepareAssetUpload: return "prepareAssetUpload"
        case .uploadAssetChunk: return "uploadAssetChunk"
        case .downloadAssetChunk: return "downloadAssetChunk"
        }
    }
}

/// The successful outcome of a ``CloudOperation``.
public enum CloudOperationResult: Hashable, Sendable {
    case zoneCreated
    case zoneDeleted
    case modified([RecordSaveResult])
    case changes(ZoneChangeBatch)
    case metadata([String: Data])
    case metadataValue(Data)
    /// What the zone holds of an asset (prepare or chunk upload).
    case assetUpload(CloudAssetUploadState)
    /// A downloaded chunk.
    case assetChunk(Data)
}

extension CloudDatabase {
    /// Performs `operation` and returns its outcome (never throws: errors are the `.failure` case).
    public func perform(_ operation: CloudOperation) async -> Result<CloudOperationResult, CloudError> {
        do {
            switch operation {
            case let .createZone(zone):
                try await createZone(zone)
                return .success(.zoneCreated)
            case let .deleteZone(zone):
                try await deleteZone(zone)
                return .success(.zoneDeleted)
            case let .resetZone(zone, reason):
                try await deleteZone(zone, reason: reason)
                return .success(.zoneDeleted)
            case let .modifyRecords(records, zone):
                return .success(.modified(try await modifyRecords(records, in: zone)))
            case let .fetchZoneChanges(zone, token, limit):
                return .success(.changes(try await fetchZoneChanges(zone, since: token, limit: limit)))
            case let .fetchZoneMetadata(zone):
                return .success(.metadata(try await zoneMetadata(zone)))
            case let .setZoneMetadata(zone, key, value, expected):
                return .success(.metadataValue(try await setZoneMetadata(zone, key: key, value: value, ifCurrent: expected)))
            case let .prepareAssetUpload(asset, zone):
                return .success(.assetUpload(try await prepareAssetUpload(asset, in: zone)))
            case let .uploadAssetChunk(asset, index, bytes, zone):
                return .success(.assetUpload(try await uploadAssetChunk(asset, index: index, bytes: bytes, in: zone)))
            case let .downloadAssetChunk(asset, index, zone):
                return .success(.assetChunk(try await downloadAssetChunk(asset, index: index, in: zone)))
            }
        } catch {
            return .failure(error)
        }
    }
}
