import Foundation

// Public control over a synced store's replication state (issue #21.6): the server change token, a full
// non-destructive refetch, and the pieces the sync runtime (`CloudSync`) reads between requests.

extension SyncEngine {
    private static let storedTokenSQL = StatementKey("SELECT value FROM replica_metadata WHERE key = 'server_change_token'")

    /// The server change token the store holds: the zone's changes up to it are merged. `nil` before the first
    /// complete fetch, after ``requestFullRefetch()``, and when the stored token cannot be read (the next fetch
    /// then reads the zone from the start, as after an expired token).
    /// - Throws: ``SQLiteError`` when the store cannot be read.
    public func serverChangeToken() throws -> ServerChangeToken? {
        guard case let .text(json)? = try db.scalar(Self.storedTokenSQL) else { return nil }
        return ReplicaJSON.decode(ServerChangeToken.self, json)
    }

    /// Forgets the server change token so that the next fetch reads the whole zone again and compares it with the
    /// store: a full, idempotent resync (as after ``CloudError/changeTokenExpired``). Non-destructive: merging a
    /// record already applied changes nothing, nothing local is deleted for being absent, and records the zone turns
    /// out to lack are uploaded again when the read completes.
    ///
    /// Call it between requests (not while ``isAwaitingResponse``): a fetch answered afterwards would store its token
    /// again. ``CloudSync/requestFullRefetch()`` takes care of that.
    /// - Throws: ``SQLiteError`` when the store cannot be written.
    public func requestFullRefetch() throws {
        precondition(!isAwaitingResponse, "Replica: requestFullRefetch() called while a request of the engine is outstanding")
        try db.transaction(.immediate) {
            try db.run("DELETE FROM replica_metadata WHERE key = 'server_change_token'")
        }
        setNeedsFetch()
    }

    /// When a sync of the store last ended with the engine idle and nothing failing (no cloud error, no block, no key
    /// problem), by the environment's clock: recorded in the store by ``CloudSync`` and
    /// ``SyncDriver/syncUntilIdle(_:with:maxRequests:timeoutMilliseconds:isolation:)``, so it survives a restart of
    /// the process and is shared by the processes of an app group. `nil` before the first.
    /// - Throws: ``SQLiteError`` when the store cannot be read; ``ReplicaError/corruptBookkeeping(_:)`` (column
    ///   `replica_metadata.last_sync`) when the stored value is not a time.
    public func lastSyncDate() throws -> Date? {
        switch try db.scalar("SELECT value FROM replica_metadata WHERE key = 'last_sync'") {
        case nil: return nil
        case let .integer(milliseconds)?: return Date(timeIntervalSince1970: Double(milliseconds) / 1000)
        default: throw ReplicaError.corruptBookkeeping(BookkeepingCorruption(store: storeName, recordID: nil, column: "replica_metadata.last_sync"))
        }
    }

    /// Records `date` as the store's last sync (``lastSyncDate()``), at millisecond precision; returns it as read back.
    @discardableResult
    func recordSync(at date: Date) throws -> Date {
        let milliseconds = Int64((date.timeIntervalSince1970 * 1000).rounded())
        try db.run("INSERT INTO replica_metadata (key, value) VALUES ('last_sync', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                   [.integer(milliseconds)])
        return Date(timeIntervalSince1970: Double(milliseconds) / 1000)
    }

    /// Whether `status`, at the end of a run that left the engine idle, counts as a completed sync.
    func completedSync(_ status: SyncStatus) -> Bool {
        status.lastError == nil && status.blockedBy == nil && blockingEncryptionError == nil && status.zoneDeletion == nil
    }

    /// The sequence number of the newest conflict log entry (0 without any): entries after it are new.
    func conflictLogPosition() throws -> Int64 {
        if case let .integer(seq)? = try db.scalar("SELECT coalesce(max(seq), 0) FROM replica_sync_conflict") { return seq }
        return 0
    }

    /// The conflict log entries recorded after position `seq` (oldest first), and the new position.
    func conflictLogEntries(after seq: Int64) throws -> (entries: [ConflictLogEntry], position: Int64) {
        let position = try conflictLogPosition()
        guard position > seq, case let .integer(count)? = try db.scalar(
            "SELECT count(*) FROM replica_sync_conflict WHERE seq > ?", [.integer(seq)]), count > 0 else { return ([], position) }
        return (try conflictLog(limit: Int(count)).reversed(), position)
    }

    /// The key versions the store's cipher holds (empty without field encryption).
    var encryptionKeyVersions: [UInt32] { encryption?.keyring.cipher.keyVersions ?? [] }

    /// The encryption error that stops the engine until its key provider is replaced, if any.
    var blockingEncryptionError: FieldEncryptionError? { encryption?.blockingError }
}
