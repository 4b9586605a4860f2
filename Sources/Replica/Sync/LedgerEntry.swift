import Foundation

/// A record's place in the sync ledger.
public enum LedgerState: Hashable, Sendable {
    /// The cloud lacks a local change; it will be uploaded.
    case pending
    /// The cloud has everything this device knows of the record.
    case synced
    /// The record references a record (its parent) this device has not received; it is kept and linked on arrival.
    case waitingForParent(UUID)
    /// The cloud refused the record for good; it stays queued with the reason.
    case rejected(reason: String)
    /// An encrypted field of the record could not be opened; local values are untouched.
    case undecryptable(reason: String)
    /// A version of the record from the cloud is stamped further ahead of this device's clock than
    /// ``SyncEngine/Options/maxClockDriftMilliseconds``: it is kept, not merged yet, and merged at the first fetch
    /// once the wall clock has reached `retryAt` (environment milliseconds). Local changes keep uploading meanwhile.
    case aheadOfClock(reason: String, retryAt: Int64)
    /// The record's sync bookkeeping could not be read (the corruption names the column). Its bookkeeping was rebuilt
    /// without losing local values or edits; it is kept out of the outbox until a fresh cloud copy of the record is
    /// merged or a full read of the zone finds none (see `Specs/replication-protocol.md`, R14).
    case corrupt(BookkeepingCorruption)
    /// A version of the record from the cloud references an asset — the value of an `.externalStorage` attribute —
    /// that this device has not downloaded yet (the first one missing is named): it is kept, not merged, and merged
    /// once every asset it needs is here; `reason` says why the last download failed, if one did (the cloud does not
    /// have it, or its bytes did not hash to its name). Counted in ``SyncStatus/waitingForAsset``.
    case waitingForAsset(CloudAssetReference, reason: String?)

    /// The state without its associated values.
    public enum Kind: Hashable, Sendable { case pending, synced, waitingForParent, rejected, undecryptable, aheadOfClock, corrupt, waitingForAsset }

    public var kind: Kind {
        switch self {
        case .pending: return .pending
        case .synced: return .synced
        case .waitingForParent: return .waitingForParent
        case .rejected: return .rejected
        case .undecryptable: return .undecryptable
        case .aheadOfClock: return .aheadOfClock
        case .corrupt: return .corrupt
        case .waitingForAsset: return .waitingForAsset
        }
    }
}

/// One record's ledger entry.
public struct LedgerEntry: Hashable, Sendable {
    public let id: PersistentIdentifier
    public let state: LedgerState
    /// Odd while alive, even while deleted.
    public let causalLength: Int64
    /// The server version last seen or saved.
    public let changeTag: String?
}

/// A merge decision in which a local write that the cloud did not hold yet lost (R16 in
/// `Specs/replication-protocol.md`): a field value overwritten by a newer remote write, a record whose unsynced edits
/// a remote delete (or the cascade of one) removed, or a duplicate of a unique key resolved into the winner.
/// Entries name fields only; they never hold a value, so nothing encrypted can appear in one.
public struct ConflictLogEntry: Hashable, Sendable {
    /// What kind of decision the local write lost.
    public enum Kind: String, Hashable, Sendable {
        /// A field's local value lost to a newer remote write of the same field (LWW).
        case overwritten = "field"
        /// The record was deleted elsewhere (a higher causal length won), removing this field's local write.
        case deleted
        /// A remote delete of a record this one references cascaded to it, removing this field's local write.
        case cascaded
        /// The record was a duplicate of a unique key and was merged into the winner (field `"*"`).
        case duplicate
    }

    /// The record whose value lost (for a duplicate: the loser).
    public let id: PersistentIdentifier
    /// The field (`"*"` for a duplicate).
    public let field: String
    /// The losing stamp: the local write (for a duplicate: the loser's creation stamp).
    public let localStamp: FieldStamp
    /// The winning stamp. For ``Kind/overwritten``: the remote write. For ``Kind/deleted``: the newest stamp the
    /// deleting version carries (a delete carries no stamp of its own; it happened after this write, on a device that
    /// had seen it). For ``Kind/cascaded``: this device's clock as it applied the delete. For a duplicate: the winner's
    /// creation stamp.
    public let winningStamp: FieldStamp
    /// For a resolved duplicate: the record it was merged into.
    public let duplicateOf: PersistentIdentifier?
    /// What the local write lost to.
    public let kind: Kind
}
