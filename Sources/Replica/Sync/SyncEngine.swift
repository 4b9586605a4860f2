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
    /// `true` while the engine still has to read the zone's changes.
    public var needsFetch: Bool
    /// The last error of the last failed operation, cleared by the next success.
    public var lastError: CloudError?
    /// Records whose incoming version could not be decrypted (kept, untouched; see ``SyncEngine/undecryptableRecords()``).
    public var undecryptableRecords = 0
    /// The encryption error that stops the engine (e.g. a wrong key), else the last record that failed to decrypt.
    public var encryptionError: FieldEncryptionError?

    /// Nothing to send, nothing to read, nothing failing.
    public var isUpToDate: Bool {
        pendingRecords == 0 && rejectedRecords == 0 && undecryptableRecords == 0 && !needsFetch && lastError == nil && encryptionError == nil
    }
}

/// The sans-IO sync engine of one synced store: it decides what to ask the cloud (``nextRequest()``) and applies
/// the answers (``handle(_:_:)``), but never performs I/O itself. A driver (``SyncDriver``) or the simulator
/// delivers requests and responses, including duplicated, late or lost ones.
///
/// - Outgoing: the outbox is the set of records whose local changes the cloud lacks (kept in the store, written in the
///   same transaction as each save). Records go out whole — every field with its stamp — with the change tag last
///   seen, under the if-server-record-unchanged policy. A conflict merges the server's record and sends again.
/// - Incoming: zone changes since the server change token are merged (see `Specs/replication-protocol.md`) and the
///   new token is stored in the same SQLite transaction, with a history transaction authored
///   ``HistoryTransaction/syncAuthor``.
/// - Errors: transient ones (rate limit, quota, zone busy, network) back off — the engine asks to be woken at
///   ``wakeTime``; an expired change token restarts the fetch from scratch (idempotent); a missing zone is created
///   again and everything is uploaded again.
///
/// An engine is confined to one task (it owns a SQLite connection), like a ``ModelContext``.
public final class SyncEngine {
    /// Tuning knobs.
    public struct Options: Sendable, Hashable {
        /// Records per modify request.
        public var uploadBatchSize = 200
        /// Records per fetch request.
        public var fetchLimit = 500
        /// First retry delay after a transient error without a server-given delay, in milliseconds (doubles per
        /// consecutive failure, plus up to 25% random jitter from the environment).
        public var baseBackoffMilliseconds: Int64 = 500
        /// Upper bound of the retry delay, in milliseconds.
        public var maxBackoffMilliseconds: Int64 = 300_000
        public init() {}
    }

    /// The store's configuration name.
    public let storeName: String
    /// The cloud zone the store syncs with.
    public let zone: String
    public let options: Options
    let container: ModelContainer
    let store: Store
    let db: Connection
    /// Cloud field encryption (`Crypto/SyncEngine+Encryption.swift`); `nil` without.
    var encryption: FieldEncryptionController?

    private var zoneReady = false
    private var needsFetch = true
    private var inFlight: (request: SyncRequest, versions: [UUID: Int64])?
    private var nextID: UInt64 = 1
    private var backoffUntil: Int64 = 0
    private var consecutiveFailures = 0
    private var lastError: CloudError?

    /// Creates the engine of synced store `storeName`.
    /// - Parameters:
    ///   - zone: the zone name; defaults to the configuration name.
    ///   - encryption: how attributes marked ``Schema/Attribute/Options/allowsCloudEncryption`` are sealed (required
    ///     when the store has any; see ``FieldEncryption``).
    /// - Throws: ``ReplicaError/loadIssueModelContainer(configuration:reason:)`` when there is no such synced store;
    ///   ``FieldEncryptionError/encryptionNotConfigured(entity:field:)`` when the store has encrypted attributes and
    ///   `encryption` is `nil`.
    public init(container: ModelContainer, storeName: String, zone: String? = nil, options: Options = Options(),
                encryption: FieldEncryption? = nil) throws {
        guard let store = container.stores.first(where: { $0.configuration.name == storeName }), store.configuration.isSynced else {
            throw ReplicaError.loadIssueModelContainer(configuration: storeName, reason: "not a synced store of this container")
        }
        self.container = container
        self.store = store
        self.storeName = storeName
        self.zone = zone ?? storeName
        self.options = options
        self.db = try store.openConnection()
        self.encryption = try FieldEncryptionController.make(encryption, store: store, zone: self.zone, db: db, random: container.environment.random)
    }

    private var now: Int64 { container.environment.clock.nowMilliseconds() }

    // MARK: Driving

    /// The next request to perform, or `nil` when there is nothing to do now (idle, waiting for a response, or
    /// backing off until ``wakeTime``). At most one request is outstanding at a time.
    /// - Throws: ``SQLiteError`` when the store cannot be read.
    public func nextRequest() throws -> SyncRequest? {
        guard inFlight == nil, now >= backoffUntil else { return nil }
        var versions: [UUID: Int64] = [:]
        let operation: CloudOperation
        if !zoneReady {
            operation = .createZone(zone)
        } else if let gate = try encryptionGate(needsFetch: needsFetch) {
            guard case let .request(encryptionOperation) = gate else { return nil }
            operation = encryptionOperation
        } else if needsFetch {
            operation = .fetchZoneChanges(zone: zone, since: try loadToken(), limit: options.fetchLimit)
        } else {
            let outbox = try SyncLedger.outbox(limit: options.uploadBatchSize, store: store, db: db)
            guard !outbox.isEmpty else { return nil }
            for entry in outbox { versions[entry.record.recordID] = entry.version }
            operation = .modifyRecords(try sealOutgoing(outbox.map(\.record)), zone: zone)
        }
        let request = SyncRequest(id: nextID, operation: operation)
        nextID += 1
        inFlight = (request, versions)
        return request
    }

    /// Applies the response to request `id`. A response to a request that is not outstanding (a duplicate, or one
    /// that was abandoned) is ignored, so delivering a response twice changes nothing.
    /// - Throws: ``SQLiteError`` when the store cannot be written (the response then counts as not applied).
    public func handle(_ id: UInt64, _ result: Result<CloudOperationResult, CloudError>) throws {
        guard let (request, versions) = inFlight, request.id == id else { return }
        inFlight = nil
        switch result {
        case let .success(outcome):
            try apply(try prepareIncoming(outcome, for: request.operation), versions: versions)
            try didApplyIncoming()
        case let .failure(.partialFailure(results)):
            try apply(try prepareIncoming(.modified(results), for: request.operation), versions: versions)
            try didApplyIncoming()
        case let .failure(error):
            try fail(error, request: request)
        }
    }

    /// Gives up on request `id` (its answer was lost): it counts as a transient network failure.
    public func abandon(_ id: UInt64) throws {
        try handle(id, .failure(.networkUnavailable))
    }

    /// Asks the engine to read the zone's changes at the next opportunity (e.g. on a push notification).
    public func setNeedsFetch() { needsFetch = true }

    /// When a backoff ends, in environment milliseconds; `nil` when not backing off.
    public var wakeTime: Int64? { backoffUntil > now ? backoffUntil : nil }

    /// `true` while a request is outstanding.
    public var isAwaitingResponse: Bool { inFlight != nil }

    /// The engine's view of the store.
    public func status() throws -> SyncStatus {
        let pending = try db.scalar("SELECT count(*) FROM replica_sync_record WHERE pending = 1 AND state NOT IN ('rejected', 'undecryptable')")
        let rejected = try db.scalar("SELECT count(*) FROM replica_sync_record WHERE state = 'rejected'")
        func count(_ value: SQLiteValue?) -> Int { if case let .integer(n)? = value { Int(n) } else { 0 } }
        var status = SyncStatus(pendingRecords: count(pending), rejectedRecords: count(rejected), needsFetch: needsFetch, lastError: lastError)
        try reportEncryption(into: &status)
        return status
    }

    // MARK: Applying

    private func apply(_ outcome: CloudOperationResult, versions: [UUID: Int64]) throws {
        switch outcome {
        case .zoneCreated:
            zoneReady = true
        case let .changes(batch):
            try importBatch(batch)
            needsFetch = batch.moreComing
        case let .modified(results):
            try applySaveResults(results, versions: versions)
            return
        case .metadata, .metadataValue, .zoneDeleted:
            break
        }
        consecutiveFailures = 0
        lastError = nil
    }

    /// Merges fetched records and stores the new token, in one transaction.
    private func importBatch(_ batch: ZoneChangeBatch) throws {
        try db.transaction(.immediate) {
            var hlc = try SyncLedger.loadHLC(db, replica: store.identity)
            var changes = StoreChanges()
            for record in batch.records {
                let outcome = try SyncLedger.merge(record, store: store, db: db, hlc: &hlc, wall: now)
                changes.add(outcome)
            }
            try saveToken(batch.token)
            try SyncLedger.saveHLC(hlc, db)
            _ = try HistoryLog.record(changes, author: HistoryTransaction.syncAuthor, environment: container.environment, db: db)
        }
    }

    private func applySaveResults(_ results: [RecordSaveResult], versions: [UUID: Int64]) throws {
        var transient: CloudError?
        try db.transaction(.immediate) {
            var hlc = try SyncLedger.loadHLC(db, replica: store.identity)
            var changes = StoreChanges()
            for result in results {
                switch result {
                case let .saved(id, changeTag):
                    guard var state = try SyncLedger.load(id, db) else { continue }
                    state.changeTag = changeTag
                    if versions[id] == state.localVersion { state.pending = false }
                    try SyncLedger.store(state, db)
                case let .conflict(serverRecord):
                    changes.add(try SyncLedger.merge(serverRecord, store: store, db: db, hlc: &hlc, wall: now))
                case let .failed(id, error):
                    if error.isTransient {
                        transient = error
                    } else {
                        try db.run("UPDATE replica_sync_record SET state = 'rejected', reason = ? WHERE id = ?",
                                   [.text(error.description), id.sqliteValue])
                    }
                }
            }
            try SyncLedger.saveHLC(hlc, db)
            _ = try HistoryLog.record(changes, author: HistoryTransaction.syncAuthor, environment: container.environment, db: db)
        }
        if let transient {
            scheduleRetry(after: transient)
        } else {
            consecutiveFailures = 0
            lastError = nil
        }
    }

    private func fail(_ error: CloudError, request: SyncRequest) throws {
        lastError = error
        switch error {
        case .changeTokenExpired:
            // Full, idempotent resync: merging records already applied changes nothing.
            try db.run("DELETE FROM replica_metadata WHERE key = 'server_change_token'")
            needsFetch = true
        case .zoneNotFound:
            // The zone is gone (reset, or never created): create it and upload everything again, tombstones included.
            zoneReady = false
            needsFetch = true
            try db.transaction(.immediate) {
                try db.run("DELETE FROM replica_metadata WHERE key = 'server_change_token'")
                try encryptionZoneWasReset()
                try db.run("UPDATE replica_sync_record SET pending = 1, change_tag = NULL, local_version = local_version + 1, state = CASE WHEN state = 'rejected' THEN state ELSE 'pending' END")
            }
        case .invalidRecord:
            if case let .modifyRecords(records, _) = request.operation {
                for record in records {
                    try db.run("UPDATE replica_sync_record SET state = 'rejected', reason = ? WHERE id = ?",
                               [.text(error.description), record.recordID.sqliteValue])
                }
            }
        default:
            scheduleRetry(after: error)
        }
    }

    private func scheduleRetry(after error: CloudError) {
        lastError = error
        consecutiveFailures += 1
        let delay: Int64
        if let retryAfter = error.retryAfterMilliseconds {
            delay = retryAfter
        } else {
            let exponent = min(consecutiveFailures - 1, 20)
            let base = min(options.maxBackoffMilliseconds, options.baseBackoffMilliseconds << exponent)
            delay = base + Int64(container.environment.random.next() % UInt64(max(1, base / 4) + 1))
        }
        backoffUntil = now + delay
    }

    // MARK: Token

    private func loadToken() throws -> ServerChangeToken? {
        guard case let .text(json)? = try db.scalar("SELECT value FROM replica_metadata WHERE key = 'server_change_token'") else { return nil }
        return SyncLedger.decode(ServerChangeToken.self, json)
    }

    private func saveToken(_ token: ServerChangeToken) throws {
        try db.run("INSERT INTO replica_metadata (key, value) VALUES ('server_change_token', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                   [.text(SyncLedger.encode(token))])
    }
}

extension StoreChanges {
    mutating func add(_ outcome: SyncLedger.MergeOutcome) {
        switch outcome.change {
        case let .inserted(snapshot)?: inserted.append(snapshot)
        case let .updated(snapshot, fields)?: updated.append((snapshot, fields))
        case let .deleted(record)?: deleted.append(record)
        case nil: break
        }
    }
}
