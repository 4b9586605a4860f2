import Foundation

/// A record a cloud database holds but cannot read back (its stored form is damaged or was written by a broken
/// client). A fetch reports it beside the readable records (``ZoneChangeBatch/unreadable``), so that one bad record
/// is a problem of that record only — kept aside as rejected by the fetching device — and never makes the whole zone
/// unreadable.
public struct UnreadableCloudRecord: Hashable, Sendable, Codable {
    /// The record's ID; `nil` when the stored ID is not one.
    public var recordID: UUID?
    /// The record type, when the stored form still names it.
    public var recordType: String?
    /// The change tag of the stored version (a local change of the record takes it, so its upload replaces the
    /// version no device can read).
    public var changeTag: String?
    /// Why it cannot be read (names the record and zone, never contents).
    public var reason: String

    public init(recordID: UUID?, recordType: String?, changeTag: String?, reason: String) {
        self.recordID = recordID
        self.recordType = recordType
        self.changeTag = changeTag
        self.reason = reason
    }
}

/// Where the server is in a zone's change stream (CloudKit's `CKServerChangeToken`). Opaque to clients except for
/// being stored and sent back.
public struct ServerChangeToken: Hashable, Sendable, Codable {
    /// The zone incarnation: bumped when the zone is reset (or, in ``InMemoryCloudDatabase``, when its change
    /// history is trimmed), which expires every older token.
    public var epoch: Int64
    /// The zone's change sequence number this token is at.
    public var sequence: Int64

    public init(epoch: Int64, sequence: Int64) {
        self.epoch = epoch
        self.sequence = sequence
    }

    /// What `ReplicaJSON.string(self)` writes (JSONEncoder, sorted keys), written directly: stored after every fetch.
    var ledgerJSON: String { "{\"epoch\":\(epoch),\"sequence\":\(sequence)}" }
}

/// One page of a zone's changes (CloudKit's `fetchRecordZoneChanges` result).
public struct ZoneChangeBatch: Hashable, Sendable, Codable {
    /// Records changed since the token, in change order (each at its newest version).
    public var records: [CloudRecord]
    /// The token to pass next time.
    public var token: ServerChangeToken
    /// `true` when more changes are waiting: fetch again with ``token``.
    public var moreComing: Bool
    /// Records of this page the cloud holds but cannot read (empty for almost every page; not encoded when empty).
    public var unreadable: [UnreadableCloudRecord]

    public init(records: [CloudRecord], token: ServerChangeToken, moreComing: Bool, unreadable: [UnreadableCloudRecord] = []) {
        self.records = records
        self.token = token
        self.moreComing = moreComing
        self.unreadable = unreadable
    }

    private enum CodingKeys: String, CodingKey { case records, token, moreComing, unreadable }

    /// Decodes a page; a missing `unreadable` key (pages written before it existed, or with none) is empty.
    /// - Throws: `DecodingError` when a required key is missing or has the wrong type.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        records = try container.decode([CloudRecord].self, forKey: .records)
        token = try container.decode(ServerChangeToken.self, forKey: .token)
        moreComing = try container.decode(Bool.self, forKey: .moreComing)
        unreadable = try container.decodeIfPresent([UnreadableCloudRecord].self, forKey: .unreadable) ?? []
    }

    /// Encodes a page; `unreadable` is left out when empty.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(records, forKey: .records)
        try container.encode(token, forKey: .token)
        try container.encode(moreComing, forKey: .moreComing)
        if !unreadable.isEmpty { try container.encode(unreadable, forKey: .unreadable) }
    }
}

/// The outcome of saving one record with the if-server-record-unchanged policy.
public enum RecordSaveResult: Hashable, Sendable, Codable {
    /// Saved; the server's record now has this change tag.
    case saved(recordID: UUID, changeTag: String)
    /// The server's record changed since the change tag the client sent (CloudKit's `serverRecordChanged`): merge
    /// the server's record and try again.
    case conflict(serverRecord: CloudRecord)
    /// This record failed for another reason.
    case failed(recordID: UUID, error: CloudError)

    public var recordID: UUID {
        switch self {
        case let .saved(id, _), let .failed(id, _): return id
        case let .conflict(record): return record.recordID
        }
    }
}

/// Errors of a cloud database, modelled on CloudKit's `CKError` codes.
public enum CloudError: Error, Hashable, Sendable, Codable, CustomStringConvertible {
    /// The change token is too old (or the zone was reset): fetch again from the start.
    case changeTokenExpired
    /// Too many requests: retry after `retryAfterMilliseconds`.
    case rateLimited(retryAfterMilliseconds: Int64)
    /// The account's storage quota is full: retry later (after the user frees space).
    case quotaExceeded
    /// The zone is busy with other writes: retry after `retryAfterMilliseconds`.
    case zoneBusy(retryAfterMilliseconds: Int64)
    /// The zone does not exist (never created, or gone for a reason the cloud does not know): create it and upload
    /// everything again. A zone the cloud knows was deleted is ``zoneDeleted(reason:)`` instead.
    case zoneNotFound
    /// The zone existed and was deleted, for `reason` (CloudKit's zone deletion reasons). The engine asks its
    /// ``ZoneDeletionPolicy`` — before anything changes locally — whether to keep the local data and upload it again
    /// (the default) or erase it. Not transient. Reported until the zone is created again.
    case zoneDeleted(reason: ZoneDeletionReason)
    /// Some records of a batch failed; the per-record results say which.
    case partialFailure([RecordSaveResult])
    /// The request did not reach the server or its answer was lost.
    case networkUnavailable
    /// The server refused a record for good (e.g. it is malformed): it stays queued, marked rejected.
    case invalidRecord(reason: String)
    /// The service cannot serve requests now for a reason of its own (CloudKit's `serviceUnavailable`; for
    /// ``SQLiteCloudDatabase``, a cloud file that cannot be read or written: unreadable, corrupt, read-only, an I/O
    /// error). Transient: the engine backs off and retries, keeping every local change queued; `reason` names the
    /// problem (never a record's values).
    case serviceUnavailable(reason: String)
    /// The server refused this account (CloudKit's `permissionFailure` and `notAuthenticated`): wrong or missing
    /// credentials, an unknown role or database, or a privilege the role lacks. Not transient — retrying cannot help
    /// until a person fixes the account or its grants — but nothing is lost: the engine keeps every change queued,
    /// reports the error in its status and retries with its exponential backoff. `reason` names the role and the
    /// server's reason, never a password or connection string. Reported by ``CloudDatabase`` implementations that
    /// talk to a server (`PostgresCloudDatabase`).
    case permissionFailure(reason: String)
    /// The asset is larger than the cloud accepts for one asset (`limit` bytes; CloudKit's `limitExceeded` for an
    /// asset). Not transient: a record whose value is too large is kept, marked rejected with this reason.
    case assetTooLarge(size: Int64, limit: Int64)
    /// The zone holds no complete asset with this hash (never uploaded, not finished, collected as unreferenced, or
    /// its zone was deleted; CloudKit's `assetNotAvailable`). A device waiting for it keeps the record that
    /// references it aside and asks again later.
    case assetNotFound(hash: String)
    /// The chunks of an upload do not hash to the asset's name (the bytes were damaged or are not the asset's;
    /// CloudKit's `assetFileModified`): the cloud dropped them. Also what a device reports for downloaded bytes that
    /// do not hash to the name.
    case assetHashMismatch(hash: String)
    /// An asset request the cloud cannot take (a chunk outside the asset, a chunk of the wrong length, a malformed
    /// hash, or a cloud that keeps no assets); `reason` says which, never bytes.
    case invalidAsset(reason: String)

    /// `true` for errors that clear by themselves: retry the same work later.
    public var isTransient: Bool {
        switch self {
        case .rateLimited, .quotaExceeded, .zoneBusy, .networkUnavailable, .serviceUnavailable: return true
        default: return false
        }
    }

    /// `true` for ``zoneNotFound`` and ``zoneDeleted(reason:)``: the zone is not there.
    public var isZoneMissing: Bool {
        switch self {
        case .zoneNotFound, .zoneDeleted: return true
        default: return false
        }
    }

    /// The reason the zone was deleted, for ``zoneDeleted(reason:)``; `nil` otherwise.
    public var zoneDeletionReason: ZoneDeletionReason? {
        if case let .zoneDeleted(reason) = self { return reason }
        return nil
    }

    /// How long the server asked the client to wait, if it said.
    public var retryAfterMilliseconds: Int64? {
        switch self {
        case let .rateLimited(ms), let .zoneBusy(ms): return ms
        default: return nil
        }
    }

    public var description: String {
        switch self {
        case .changeTokenExpired: return "change token expired"
        case let .rateLimited(ms): return "rate limited (retry after \(ms) ms)"
        case .quotaExceeded: return "quota exceeded"
        case let .zoneBusy(ms): return "zone busy (retry after \(ms) ms)"
        case .zoneNotFound: return "zone not found"
        case let .zoneDeleted(reason): return "zone deleted (\(reason))"
        case let .partialFailure(results): return "partial failure (\(results.count) results)"
        case .networkUnavailable: return "network unavailable"
        case let .invalidRecord(reason): return "invalid record: \(reason)"
        case let .serviceUnavailable(reason): return "service unavailable: \(reason)"
        case let .permissionFailure(reason): return "permission failure: \(reason)"
        case let .assetTooLarge(size, limit): return "asset too large (\(size) bytes; the limit is \(limit))"
        case let .assetNotFound(hash): return "asset \(hash.prefix(12))… not found"
        case let .assetHashMismatch(hash): return "asset \(hash.prefix(12))…: the bytes do not hash to its name"
        case let .invalidAsset(reason): return "invalid asset request: \(reason)"
        }
    }
}

extension CloudRecord {
    /// The per-record failure a cloud database answers a save of this record with when it has an
    /// ``unencodableStamp`` (``CloudError/invalidRecord(reason:)`` naming the stamp's place, never a value); `nil`
    /// when every stamp fits.
    public var unencodableFailure: RecordSaveResult? {
        unencodableStamp.map { .failed(recordID: recordID, error: .invalidRecord(reason: "\($0) has a clock outside 48-bit milliseconds and a 16-bit counter")) }
    }
}
