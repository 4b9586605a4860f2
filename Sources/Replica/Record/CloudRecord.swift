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
