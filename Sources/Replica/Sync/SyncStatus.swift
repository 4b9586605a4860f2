import Foundation

/// One request the engine wants performed, tagged so its response can be matched.
public struct SyncRequest: Hashable, Sendable {
    /// Unique per engine instance; responses carry it back.
    public let id: UInt64
    /// What to ask the cloud database.
    public let operation: CloudOperation
}

/// The state of a synced store as the engine sees it. Never reports "up to date" while something is failing.
public struct SyncStatus: Hashable, Sendable {
    /// Records whose local changes the cloud does not have yet.
    public var pendingRecords: Int
    /// Records the cloud refused for good (they stay queued, with a reason in the ledger).
    public var rejectedRecords: Int
    /// Live records that reference a record this device has not received yet.
    public var waitingForParent: Int
    /// Records whose encrypted fields could not be opened.
    public var undecryptableRecords: Int
    /// Versions received from the cloud that reference an asset (the value of an `.externalStorage` attribute) this
    /// device has not downloaded yet: kept, not merged until it is here (``LedgerState/waitingForAsset(_:reason:)``).
    public var waitingForAsset = 0
    /// Versions received from the cloud that are stamped further ahead of this device's clock than
    /// ``SyncEngine/Options/maxClockDriftMilliseconds``: kept, not merged yet (R2).
    public var heldRecords = 0
    /// Records whose sync bookkeeping could not be read (``LedgerState/corrupt(_:)``): rebuilt, kept out of the
    /// outbox until a fresh cloud copy or a full read of the zone repairs them. Also counts ledger rows not read yet
    /// whose entity or causal length is visibly unreadable (wrong storage class, out of range): they are rebuilt
    /// when first read.
    public var corruptRecords = 0
    /// Set when the engine refuses to sync (e.g. an incompatible schema).
    public var blockedBy: ReplicaError?
    /// A zone deletion waiting for the app's answer (``ZoneDeletionPolicy/ask``): nothing syncs, and nothing local
    /// changes, until ``SyncEngine/resolveZoneDeletion(_:)``.
    public var zoneDeletion: ZoneDeletion?
    /// `true` while the engine still has to read the zone's changes.
    public var needsFetch: Bool
    /// The last error of the last failed operation, cleared by the next success.
    public var lastError: CloudError?
    /// The encryption error that stops the engine (e.g. a wrong key), else the last record that failed to decrypt.
    public var encryptionError: FieldEncryptionError?

    /// Nothing to send, nothing to read, nothing failing.
    public var isUpToDate: Bool {
        pendingRecords == 0 && rejectedRecords == 0 && waitingForParent == 0 && undecryptableRecords == 0 && heldRecords == 0
            && waitingForAsset == 0
            && corruptRecords == 0 && !needsFetch
            && lastError == nil && blockedBy == nil && encryptionError == nil && zoneDeletion == nil
    }
}
