import Foundation

/// The bounds the sync engine holds remote records and its own bookkeeping to (`Specs/replication-protocol.md`, R2,
/// R5 and P4). Public so that simulators and tests can build records at and beyond each edge.
public enum ReplicationBounds {
    /// The largest causal length accepted from the cloud or read from the ledger: 2⁶², far beyond any real number of
    /// deletes and re-inserts, and far enough below `Int64.max` that local increments never overflow.
    public static let maxCausalLength: Int64 = 1 << 62

    /// The largest local version (the outbox's change counter) read from the ledger, as ``maxCausalLength``.
    public static let maxLocalVersion: Int64 = 1 << 62

    /// How close to the top of the clock's encodable range (``HLC/maxPhysical``) a remote stamp may come: one day of
    /// milliseconds. A stamp within it is refused for good, as "at the edge of the clock's range": a device that
    /// merged it would be left with no room for later stamps of its own.
    public static let edgeMarginMilliseconds: Int64 = 86_400_000

    /// The largest physical time (ms) of a remote stamp that is accepted at all: ``HLC/maxPhysical`` minus
    /// ``edgeMarginMilliseconds``.
    public static let maxRemotePhysical: Int64 = HLC.maxPhysical - edgeMarginMilliseconds

    /// The default of ``SyncEngine/Options/maxClockDriftMilliseconds``: 24 hours. Device clocks set by NTP or the
    /// cellular network agree within seconds; a clock set by hand can be off by hours. A bound of a day keeps every
    /// such device syncing without delay while a stamp of a broken clock (days, years or a century ahead) cannot
    /// drag every later stamp of every device that merges it along (Kulkarni et al., "Logical Physical Clocks", 2014,
    /// bound the drift in the same way: a message too far ahead of the local physical clock is not accepted).
    public static let defaultMaxClockDriftMilliseconds: Int64 = 86_400_000
}

/// Why a record received from the cloud is not merged: it is kept aside with this reason (see
/// ``LedgerState/rejected(reason:)`` and ``LedgerState/aheadOfClock(reason:retryAt:)``). Reasons name fields and
/// bounds, never values.
public enum RecordRejection: Hashable, Sendable, CustomStringConvertible {
    /// Where a stamp sits in a record.
    public enum StampSite: Hashable, Sendable, CustomStringConvertible {
        /// The creation stamp (``CloudRecord/created``).
        case creation
        /// The stamp of the named field.
        case field(String)

        public var description: String {
            switch self {
            case .creation: return "the creation stamp"
            case let .field(name): return "field '\(name)'"
            }
        }
    }

    /// The causal length lies outside `1 ... ReplicationBounds.maxCausalLength`.
    case causalLengthOutOfRange(Int64)
    /// The record ID is the nil UUID (``FoundationEssentials/UUID/unassigned``), which marks a model not inserted yet: a row
    /// with it could never be updated or deleted by the app.
    case nilRecordID
    /// A stamp's incarnation is negative or beyond the record's causal length.
    case incarnationBeyondCausalLength(StampSite)
    /// A stamp's clock does not fit the fixed-width text form (48-bit milliseconds, 16-bit counter).
    case clockBeyondEncoding(StampSite)
    /// A stamp's clock lies within ``ReplicationBounds/edgeMarginMilliseconds`` of the top of the encodable range.
    case clockAtEdge(StampSite)
    /// The record ID belongs to a local record of another entity (named).
    case idOfAnotherEntity(String)
    /// A known floating-point field holds NaN.
    case notANumber(field: String)
    /// A known field holds a value (described by its storage class and size, never its content) that is not of the
    /// attribute's type.
    case wrongType(field: String, value: String, type: String, optional: Bool)
    /// A to-one reference holds something other than a record ID (described as in `wrongType`).
    case notARecordID(reference: String, value: String)
    /// The cloud could not read its own stored copy of the record (the reason it gave).
    case unreadable(String)
    /// A many-to-many link field (`replica_links_<relationship>`, R17) that does not hold a link set.
    case malformedLinkSet(field: String)
    /// A stamp is further ahead of this device's wall clock than ``SyncEngine/Options/maxClockDriftMilliseconds``
    /// (`limit`): not merged yet, kept until the clock has caught up (not a rejection for good).
    case clockAhead(StampSite, aheadBy: Int64, limit: Int64)

    /// `true` for a refusal that time resolves (``clockAhead(_:aheadBy:limit:)``): the record is retried later.
    public var isTemporary: Bool {
        if case .clockAhead = self { return true }
        return false
    }

    public var description: String {
        switch self {
        case let .causalLengthOutOfRange(length): return "causal length \(length) is out of range"
        case .nilRecordID: return "the record ID is the nil UUID, which no inserted record has"
        case let .incarnationBeyondCausalLength(site): return "\(site) has an incarnation beyond the record's causal length"
        case let .clockBeyondEncoding(site): return "\(site) has a clock outside 48-bit milliseconds and a 16-bit counter"
        case let .clockAtEdge(site):
            return "\(site) has a clock at the edge of its range (within \(ReplicationBounds.edgeMarginMilliseconds) ms of the largest)"
        case let .idOfAnotherEntity(owner): return "the record ID belongs to a local \(owner)"
        case let .notANumber(field): return "field '\(field)' holds NaN"
        case let .wrongType(field, value, type, optional):
            return "field '\(field)' holds \(value), which is not a\(optional ? "n optional" : "") \(type)"
        case let .notARecordID(reference, value): return "reference '\(reference)' holds \(value), not a record ID"
        case let .unreadable(reason): return reason
        case let .malformedLinkSet(field): return "field '\(field)' does not hold a set of many-to-many links"
        case let .clockAhead(site, ahead, limit):
            return "\(site) is stamped \(ahead) ms ahead of this device's clock (more than \(limit) ms): kept until the clock catches up"
        }
    }
}
