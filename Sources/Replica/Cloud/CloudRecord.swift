import Foundation

/// One field of a cloud record: its value and the stamp of the write that produced it.
public struct CloudField: Hashable, Sendable, Codable {
    /// The value. For an encrypted field, in the cloud: the sealed bytes as a BLOB (see ``FieldCipher``); on the
    /// device, after the engine opened it: the plaintext.
    public var value: SQLiteValue
    /// The field's version (incarnation, HLC): the LWW register order.
    public var stamp: FieldStamp
    /// `true` for a field that is sealed by the field cipher whenever it is in the cloud. The sync engine seals such
    /// fields just before upload and opens them just after download, keeping the flag, so local copies hold plaintext.
    public var isEncrypted: Bool

    public init(value: SQLiteValue, stamp: FieldStamp, isEncrypted: Bool = false) {
        self.value = value
        self.stamp = stamp
        self.isEncrypted = isEncrypted
    }
}

/// A record as the cloud database stores it (CloudKit's `CKRecord`): record type, ID within a zone, a change tag the
/// server assigns on each save, the record's causal length and creation stamp, and its fields with their stamps.
///
/// A deleted record is a tombstone: an even ``causalLength``, with only the fields marked
/// ``Schema/Attribute/Options/preserveValueOnDeletion``.
public struct CloudRecord: Hashable, Sendable, Codable {
    /// The record ID (the model's record ID).
    public var recordID: UUID
    /// The record type (entity name).
    public var recordType: String
    /// The server's version of this record, set by the server on every save; `nil` for a record never saved.
    ///
    /// A tag names one version of one record, as CloudKit's `recordChangeTag` does: a cloud never returns different
    /// contents under the same tag (also not after a zone is deleted and created again). The sync engine relies on
    /// it: a fetched version whose tag its ledger already holds, with nothing changed locally since, is not merged
    /// again (<https://developer.apple.com/documentation/cloudkit/ckrecord/recordchangetag>).
    public var changeTag: String?
    /// Odd while alive, even while deleted: insert 1, delete 2, re-insert 3, ...
    public var causalLength: Int64
    /// The stamp of the insert that created the current incarnation (used to pick duplicate winners).
    public var created: FieldStamp
    /// When this record is a duplicate that lost to another record with the same unique key: the winner's ID.
    public var redirect: UUID?
    /// Earlier incarnations of this record that ended as a duplicate that lost (a tombstone redirecting to a winner)
    /// and were later re-inserted, in incarnation order: a write made to such an incarnation anywhere still belongs
    /// to its winner (R15). Empty for almost every record; not encoded when empty.
    public var endedRedirects: [EndedRedirect]
    /// Fields by name. Encoded with sorted keys, so a record's bytes are deterministic.
    public var fields: [String: CloudField]

    /// A record as the engine uploads it or the cloud returns it.
    /// - Parameters:
    ///   - recordID: the record's ID (the local record's `PersistentIdentifier.id`).
    ///   - recordType: the entity name.
    ///   - changeTag: the server's version of the record this one replaces; `nil` for a first save.
    ///   - causalLength: odd while alive, even while deleted (≥ 1).
    ///   - created: the stamp of the insert that created the current incarnation.
    ///   - redirect: for a losing duplicate's tombstone, the winner's ID.
    ///   - endedRedirects: earlier incarnations that ended as losing duplicates (see ``endedRedirects``).
    ///   - fields: the stamped fields by name (a missing field is "absent", never null).
    public init(recordID: UUID, recordType: String, changeTag: String? = nil, causalLength: Int64, created: FieldStamp,
                redirect: UUID? = nil, endedRedirects: [EndedRedirect] = [], fields: [String: CloudField]) {
        self.recordID = recordID
        self.recordType = recordType
        self.changeTag = changeTag
        self.causalLength = causalLength
        self.created = created
        self.redirect = redirect
        self.endedRedirects = endedRedirects
        self.fields = fields
    }

    private enum CodingKeys: String, CodingKey {
        case recordID, recordType, changeTag, causalLength, created, redirect, endedRedirects, fields
    }

    /// Decodes a record; a missing `endedRedirects` key (records written before it existed, or with none) is empty.
    /// - Throws: `DecodingError` when a required key is missing or has the wrong type.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        recordID = try container.decode(UUID.self, forKey: .recordID)
        recordType = try container.decode(String.self, forKey: .recordType)
        changeTag = try container.decodeIfPresent(String.self, forKey: .changeTag)
        causalLength = try container.decode(Int64.self, forKey: .causalLength)
        created = try container.decode(FieldStamp.self, forKey: .created)
        redirect = try container.decodeIfPresent(UUID.self, forKey: .redirect)
        endedRedirects = try container.decodeIfPresent([EndedRedirect].self, forKey: .endedRedirects) ?? []
        fields = try container.decode([String: CloudField].self, forKey: .fields)
    }

    /// Encodes a record; `endedRedirects` is left out when empty, so records without it keep their earlier bytes.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(recordID, forKey: .recordID)
        try container.encode(recordType, forKey: .recordType)
        try container.encodeIfPresent(changeTag, forKey: .changeTag)
        try container.encode(causalLength, forKey: .causalLength)
        try container.encode(created, forKey: .created)
        try container.encodeIfPresent(redirect, forKey: .redirect)
        if !endedRedirects.isEmpty { try container.encode(endedRedirects, forKey: .endedRedirects) }
        try container.encode(fields, forKey: .fields)
    }

    /// `true` while the record is alive (odd causal length).
    public var isAlive: Bool { causalLength % 2 == 1 }

    /// The first stamp (the creation stamp, then fields in name order) that the fixed-width text form cannot hold —
    /// a negative incarnation, or a clock outside 48-bit milliseconds and a 16-bit counter — or `nil` when every stamp
    /// fits. A cloud database refuses to store such a record (``CloudError/invalidRecord(reason:)``): written, it
    /// could never be read back.
    public var unencodableStamp: RecordRejection.StampSite? {
        if !created.fitsHex { return .creation }
        guard fields.values.contains(where: { !$0.stamp.fitsHex }) else { return nil }
        return fields.keys.sorted().first { !fields[$0]!.stamp.fitsHex }.map { .field($0) }
    }

    /// The per-record failure a cloud database answers a save of this record with when it has an
    /// ``unencodableStamp`` (``CloudError/invalidRecord(reason:)`` naming the stamp's place, never a value); `nil`
    /// when every stamp fits.
    public var unencodableFailure: RecordSaveResult? {
        unencodableStamp.map { .failed(recordID: recordID, error: .invalidRecord(reason: "\($0) has a clock outside 48-bit milliseconds and a 16-bit counter")) }
    }
}

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

/// An incarnation of a record that ended as a losing duplicate of a unique key, redirected to `winner` (R15).
public struct EndedRedirect: Hashable, Sendable, Codable {
    /// The ended incarnation (an odd causal length).
    public var incarnation: Int64
    /// The record that won the duplicate.
    public var winner: UUID

    /// An ended incarnation (`incarnation`, odd) redirected to `winner`.
    public init(incarnation: Int64, winner: UUID) {
        self.incarnation = incarnation
        self.winner = winner
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
