import CSQLite
import Foundation

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
    /// The store's configuration name.
    public let storeName: String
    /// The cloud zone the store syncs with.
    public let zone: String
    public let options: Options
    let container: ModelContainer
    let store: Store
    /// The store's position in the container.
    let storeIndex: Int
    let db: Connection
    /// The context whose connection `db` is, when the engine shares it (see
    /// ``init(container:storeName:zone:options:encryption:sharingConnectionOf:)``); kept alive with the engine.
    private let connectionOwner: ModelContext?
    /// Cloud field encryption (`Crypto/SyncEngine+Encryption.swift`); `nil` without.
    var encryption: FieldEncryptionController?

    var zoneReady = false
    var schemaChecked = false
    var proposedSchema: (value: Data, expected: Data?)?
    /// A zone deletion waiting for the app's answer (``ZoneDeletionPolicy/ask``; `SyncEngine+ZoneDeletion.swift`).
    var pendingDeletion: ZoneDeletion?
    /// The last zone deletion was this engine's own (a key reset): the zone found missing next is no news.
    var deletedZoneItself = false
    private var blocked: ReplicaError?
    /// Identifies this engine instance as the holder of the store's upload lease.
    private let instanceID: UUID
    /// `instanceID` as the lease stores it (parsing the holder back on every request cost more than the query).
    private let instanceText: String
    var needsFetch = true
    private var inFlight: (request: SyncRequest, versions: [UUID: Int64], uploaded: [UUID: HLC])?
    private var nextID: UInt64 = 1
    /// The end of the current wait (backoff or another engine's lease), in environment milliseconds.
    private var backoffUntil: Int64 = .min
    /// When the current wait began. A clock that goes back before it re-anchors the wait (see ``backoffDeadline()``).
    private var backoffStart: Int64 = .min
    /// The `sync_lease` value last parsed by `acquireLease()`, and the lease it holds (`nil`: none readable).
    private var leaseCache: (text: String, lease: Lease?)?
    /// The current wait is for another engine's upload lease (rather than a backoff).
    private var waitingForLease = false
    /// The current wait is the delay a server asked for (``CloudError/retryAfterMilliseconds``), not one of ours.
    private var waitIsServerDirected = false
    private var consecutiveFailures = 0
    var lastError: CloudError?
    /// The last fetch was refused for good (invalidRecord): the zone cannot be read for now.
    private var fetchFailing = false
    /// While the zone cannot be read: upload (if anything is pending) before the next fetch attempt.
    private var uploadBeforeFetch = false
    /// Whether ``verifyBookkeeping()`` ran (it does before the first request).
    var bookkeepingVerified = false
    /// Set by the sync runtime (``CloudSync``), which drains ``importLog`` after each response: what each import
    /// transaction changed. Off otherwise (nothing accumulates).
    var recordsImports = false
    var importLog: [StoreChanges] = []
    /// Asset uploads owed and what the engine learned of the zone's assets (`SyncEngine+Assets.swift`).
    let assetTransfers = AssetTransfers()

    /// Creates the engine of synced store `storeName`.
    /// - Parameters:
    ///   - zone: the zone name; defaults to the configuration name.
    ///   - encryption: how attributes marked ``Schema/Attribute/Options/allowsCloudEncryption`` are sealed (required
    ///     when the store has any; see ``FieldEncryption``).
    ///
    /// Create one engine per synced store and keep it for the life of the process: the engine holds the store's upload
    /// lease (see ``Options/leaseDurationMilliseconds``), so a second engine on the same store — in this process or
    /// another — waits until the first releases it (``releaseLease()``, also on deinit) or the lease expires.
    /// - Throws: ``ReplicaError/unknownStore(_:)`` or ``ReplicaError/storeNotSynced(_:)``; ``SQLiteError``;
    ///   ``FieldEncryptionError/encryptionNotConfigured(entity:field:)`` when the store has encrypted attributes and
    ///   `encryption` is `nil`.
    public convenience init(container: ModelContainer, storeName: String, zone: String? = nil, options: Options = Options(),
                            encryption: FieldEncryption? = nil) throws {
        try self.init(container: container, storeName: storeName, zone: zone, options: options, encryption: encryption, connectionOwner: nil)
    }

    /// For simulators and other single-threaded drivers: creates the engine of synced store `storeName` on the
    /// SQLite connection that `context` uses for that store, instead of a connection of its own.
    ///
    /// Every commit on one connection empties the page cache of every other connection to the same database, and
    /// each connection prepares every statement it runs once more; an engine and a context that take turns on one
    /// thread save both by sharing one. The engine keeps `context` alive, and leaves the connection to it when it
    /// goes away. Use the engine and the context from the same thread only, and never while the other is inside a
    /// call (a save and a merge on one connection would run in one transaction).
    /// - Parameters: as ``init(container:storeName:zone:options:encryption:)``; `context` must be a context of
    ///   `container` (a programmer error otherwise, which traps).
    /// - Throws: as ``init(container:storeName:zone:options:encryption:)``.
    @_spi(Simulation) public convenience init(container: ModelContainer, storeName: String, zone: String? = nil,
                                              options: Options = Options(), encryption: FieldEncryption? = nil,
                                              sharingConnectionOf context: ModelContext) throws {
        precondition(context.container === container, "Replica: the context given to SyncEngine belongs to another container")
        try self.init(container: container, storeName: storeName, zone: zone, options: options, encryption: encryption,
                      connectionOwner: context)
    }

    private init(container: ModelContainer, storeName: String, zone: String?, options: Options, encryption: FieldEncryption?,
                 connectionOwner: ModelContext?) throws {
        guard let storeIndex = container.stores.firstIndex(where: { $0.configuration.name == storeName }) else {
            throw ReplicaError.unknownStore(storeName)
        }
        let store = container.stores[storeIndex]
        guard store.configuration.isSynced else { throw ReplicaError.storeNotSynced(storeName) }
        self.container = container
        self.store = store
        self.storeIndex = storeIndex
        self.storeName = storeName
        self.zone = zone ?? storeName
        self.options = options
        self.connectionOwner = connectionOwner
        self.db = try connectionOwner?.connection(for: storeIndex) ?? store.openConnection()
        self.instanceID = container.environment.makeIdentifier()
        self.instanceText = instanceID.uuidString
        self.encryption = try FieldEncryptionController.make(encryption, store: store, zone: self.zone, db: db, random: container.environment.random)
    }

    deinit {
        if !crashed { releaseLease() }
        // A shared connection stays with its context (which goes back to the store when the context goes).
        if connectionOwner == nil { store.reuse(db) }
    }

    /// Set by ``simulateCrash()``: the engine's end releases nothing but its connection.
    private var crashed = false

    /// For simulators: this engine's process crashed. The engine must not be used again; when it goes away it leaves
    /// the upload lease in place (a crashed process cannot give it up, it expires) and only gives its connection back
    /// to the store, as the process's end would close it (an in-memory store's next engine or context reuses it), or
    /// leaves it to the context it shares it with.
    @_spi(Simulation) public func simulateCrash() {
        crashed = true
    }

    private var now: Int64 { container.environment.clock.nowMilliseconds() }

    // MARK: Driving

    /// The next request to perform, or `nil` when there is nothing to do now (idle, waiting for a response, or
    /// backing off until ``wakeTime``). At most one request is outstanding at a time.
    /// - Throws: ``SQLiteError`` when the store cannot be read.
    public func nextRequest() throws -> SyncRequest? {
        if let blocked { throw blocked }
        guard inFlight == nil, now >= backoffDeadline() else { return nil }
        // A zone deletion the app has not answered yet (here, after a restart or in another process): nothing syncs.
        if !zoneReady, try loadPendingZoneDeletion() { return nil }
        guard try acquireLease() else { return nil }
        if !bookkeepingVerified { try verifyBookkeeping() }
        var versions: [UUID: Int64] = [:]
        var uploaded: [UUID: HLC] = [:]
        let operation: CloudOperation
        if !zoneReady {
            operation = .createZone(zone)
        } else if !schemaChecked {
            if let proposed = proposedSchema {
                operation = .setZoneMetadata(zone: zone, key: Self.schemaKey, value: proposed.value, ifCurrent: proposed.expected)
            } else {
                operation = .fetchZoneMetadata(zone: zone)
            }
        } else if let gate = try encryptionGate(needsFetch: needsFetch) {
            guard case let .request(encryptionOperation) = gate else { return nil }
            operation = encryptionOperation
        } else if needsFetch, !(fetchFailing && uploadBeforeFetch), let fetch = try fetchOperation() {
            operation = fetch
        } else if let download = try nextAssetDownloadOperation() {
            // Records waiting for an asset get it before anything is uploaded.
            operation = download
        } else if let upload = try nextAssetUploadOperation() {
            // The assets of the batch of records read last go first.
            operation = upload
        } else {
            // Uploads normally wait until the zone is read. When the zone cannot be read (the cloud answers the fetch
            // with invalidRecord), they go out between the retries anyway: saves are guarded by change tags and
            // conflicts merge, so this device's changes never wait on a record it cannot receive.
            if let problem = try sharedFieldsNeedingEncryption() {
                blocked = problem
                throw problem
            }
            let outbox = try SyncLedger.outbox(limit: max(1, options.uploadBatchSize), store: store, db: db)
            uploadBeforeFetch = false
            if outbox.isEmpty {
                // Records whose bookkeeping could not be read (marked by this read, a save or another process) are
                // repaired by a full read of the zone (R14): checked when there is nothing else to do.
                if !needsFetch { try repairCorruptRecordsIfNeeded() }
                guard needsFetch, let fetch = try fetchOperation() else { return nil }
                operation = fetch
            } else {
                // External-storage values go as asset references; the assets the zone may lack go first.
                let outgoing = try prepareOutgoingAssets(outbox)
                if let upload = try nextAssetUploadOperation() {
                    operation = upload
                } else if outgoing.isEmpty {
                    // Every record of the batch was refused (its value cannot be uploaded): read the outbox again.
                    return try nextRequest()
                } else {
                    for entry in outgoing {
                        versions[entry.record.recordID] = entry.version
                        uploaded[entry.record.recordID] = ConflictRecording.newestOwnStamp(entry.record, replica: store.identity)
                    }
                    operation = .modifyRecords(try sealOutgoing(outgoing.map(\.record)), zone: zone)
                }
            }
        }
        let request = SyncRequest(id: nextID, operation: operation)
        nextID += 1
        inFlight = (request, versions, uploaded)
        return request
    }

    /// When records are marked corrupt (``LedgerState/corrupt(_:)``) and no full read of the zone is under way, starts
    /// one: their cloud copies, merged, repair them; the ones the zone lacks are released when it completes.
    private func repairCorruptRecordsIfNeeded() throws {
        guard try db.scalar(SyncLedger.anyCorruptSQL) == .integer(1) else { return }
        if try db.scalar(Self.resyncActiveSQL) == nil {
            try db.run("DELETE FROM replica_metadata WHERE key = 'server_change_token'")
        }
        needsFetch = true
    }

    /// The zone fetch to perform now (a full resync starts when there is no token).
    private func fetchOperation() throws -> CloudOperation? {
        let token = try loadToken()
        if token == nil { try beginFullResync() }
        return .fetchZoneChanges(zone: zone, since: token, limit: max(1, options.fetchLimit))
    }

    /// Applies the response to request `id`. A response to a request that is not outstanding (a duplicate, or one
    /// that was abandoned) is ignored, so delivering a response twice changes nothing.
    /// - Throws: ``SQLiteError`` when the store cannot be written (the response then counts as not applied).
    public func handle(_ id: UInt64, _ result: Result<CloudOperationResult, CloudError>) throws {
        guard let (request, versions, uploaded) = inFlight, request.id == id else { return }
        inFlight = nil
        switch result {
        case let .success(outcome):
            if try handleAssetResult(outcome, for: request.operation) {
                consecutiveFailures = 0
                lastError = nil
                return
            }
            try apply(try prepareIncoming(outcome, for: request.operation), versions: versions, uploaded: uploaded)
            try didApplyIncoming()
        case let .failure(.partialFailure(results)):
            try apply(try prepareIncoming(.modified(results), for: request.operation), versions: versions, uploaded: uploaded)
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
    public var wakeTime: Int64? {
        let deadline = backoffDeadline()
        return deadline > now ? deadline : nil
    }

    /// Starts a wait of `duration` milliseconds from now (saturating).
    private func wait(milliseconds duration: Int64, forLease: Bool = false, serverDirected: Bool = false) {
        waitingForLease = forLease
        waitIsServerDirected = serverDirected
        let start = now
        let (until, overflow) = start.addingReportingOverflow(max(0, duration))
        backoffStart = start
        backoffUntil = overflow ? .max : until
    }

    /// The end of the current wait. Deadlines are wall-clock instants, so when the clock has gone back since the wait
    /// began (an NTP correction, a user changing the time) the wait is re-anchored at the current time with the
    /// duration that was asked for: a backward jump never stretches a wait, whatever its size.
    private func backoffDeadline() -> Int64 {
        let current = now
        if current >= backoffUntil {
            // The wait is over for good: a later backward jump does not bring it back (the old deadline would lie
            // ahead again, by the size of the jump).
            backoffUntil = .min
            backoffStart = .min
            waitingForLease = false
            waitIsServerDirected = false
        } else if current < backoffStart {
            if waitingForLease {
                // The lease is judged again at once (``acquireLease()`` clamps one that now ends too far ahead).
                wait(milliseconds: 0)
            } else {
                let (duration, overflow) = backoffUntil.subtractingReportingOverflow(backoffStart)
                wait(milliseconds: overflow ? .max : duration, serverDirected: waitIsServerDirected)
            }
        }
        return backoffUntil
    }

    /// Ends a backoff the engine chose itself after a transient failure (exponential, with jitter), so that a sync
    /// the app asks for explicitly tries at once — as `CKSyncEngine`'s `sendChanges`/`fetchChanges` do — rather than
    /// waiting out a delay left by an outage that is over. A delay the server asked for (rate limit, busy zone:
    /// ``CloudError/retryAfterMilliseconds``) and another engine's upload lease are kept. The count of consecutive
    /// failures is kept too: if the request fails again, the next backoff is longer still.
    func endOwnBackoff() {
        guard !waitingForLease, !waitIsServerDirected, backoffDeadline() > now else { return }
        backoffUntil = .min
        backoffStart = .min
    }

    /// `true` while a request is outstanding.
    public var isAwaitingResponse: Bool { inFlight != nil }

    /// Whether the engine waits for another engine's upload lease (rather than a backoff).
    var isWaitingForLease: Bool { waitingForLease && backoffDeadline() > now }

    /// Forgets a wait for another engine's upload lease, so that the next request reads the lease again: the sync
    /// runtime looks again long before the expiry it saw, as the other engine gives the lease up when its pass ends
    /// with nothing left (`CloudSyncSchedule`). A lease still held starts the wait again.
    func endLeaseWait() {
        guard isWaitingForLease else { return }
        backoffUntil = .min
        backoffStart = .min
        waitingForLease = false
    }

    /// For simulators: whether the engine waits out a backoff it chose itself after a transient failure — the wait an
    /// explicit sync ends (``endOwnBackoff()``) — rather than a delay the server asked for or another engine's lease.
    @_spi(Simulation) public var isBackingOffOnItsOwn: Bool {
        !waitingForLease && !waitIsServerDirected && backoffDeadline() > now
    }

    /// The engine's view of the store.
    public func status() throws -> SyncStatus {
        let row = try db.rows("""
            SELECT count(*) FILTER (WHERE pending = 1 AND state NOT IN ('rejected', 'undecryptable'))
                       + (SELECT count(*) FROM replica_sync_unknown_record WHERE pending = 1),
                   count(*) FILTER (WHERE state = 'rejected') + (SELECT count(*) FROM replica_sync_rejected),
                   count(*) FILTER (WHERE (waiting_for IS NOT NULL OR \(LinkReplication.waitsForLinkSQL)) AND causal_length % 2 = 1),
                   count(*) FILTER (WHERE state = 'undecryptable'),
                   (SELECT count(*) FROM replica_sync_held),
                   (SELECT count(*) FROM replica_sync_asset_wait),
                   count(*) FILTER (WHERE state = 'corrupt' OR typeof(entity) != 'text' OR entity = ''
                                    OR (typeof(causal_length) != 'integer' OR causal_length NOT BETWEEN 1 AND \(ReplicationBounds.maxCausalLength))
                                       AND NOT (causal_length = 0 AND state = 'undecryptable'))
            FROM replica_sync_record
            """).first ?? []
        func count(_ index: Int) -> Int { if index < row.count, case let .integer(n) = row[index] { Int(n) } else { 0 } }
        var status = SyncStatus(pendingRecords: count(0), rejectedRecords: count(1), waitingForParent: count(2),
                                undecryptableRecords: count(3), waitingForAsset: count(5), heldRecords: count(4), corruptRecords: count(6),
                                blockedBy: blocked, needsFetch: needsFetch, lastError: lastError)
        status.zoneDeletion = pendingDeletion
        reportEncryption(into: &status)
        return status
    }

    // MARK: Schema gate

    static let schemaKey = "schema"

    /// Compares this device's schema with the zone's union schema: refuse on a contradiction, propose the new union
    /// when this device adds something, accept otherwise.
    private func checkSchema(_ stored: Data?) throws {
        let local = ZoneSchema(version: container.schema.version, entities: store.entities)
        let zoneSchema = stored.flatMap(ZoneSchema.decode)
        if let stored, zoneSchema == nil {
            // A union this build cannot decode. Written by a newer version (its version still reads, and is higher):
            // this device is the older one, which keeps syncing (R13) and must not replace what it cannot read.
            // Anything else is damage, repaired below with this device's schema.
            struct Versioned: Decodable { var version: Schema.Version }
            if let newer = try? ReplicaJSON.decoder().decode(Versioned.self, from: stored), newer.version > local.version {
                schemaChecked = true
                return
            }
        }
        let (differences, union) = ZoneSchema.check(local: local, zone: zoneSchema,
                                                    comparesOptions: !container.environment.canaries.contains(.gateIgnoresOptions))
        if !differences.isEmpty {
            blocked = .incompatibleSchema(differences)
            return
        }
        if union == zoneSchema {
            schemaChecked = true
            return
        }
        proposedSchema = (try ZoneSchema.encode(union), stored)
    }

    // MARK: Upload lease

    struct Lease: Codable {
        var holder: UUID
        var expires: Int64

        /// What `ReplicaJSON.string(self)` writes (JSONEncoder, sorted keys), written directly: this runs before
        /// requests, and JSONEncoder costs more than the statement that stores it.
        var json: String { "{\"expires\":\(expires),\"holder\":\"\(holder.uuidString)\"}" }
    }

    /// Takes or renews the store's lease (so that of the processes sharing an app-group store, exactly one talks to
    /// the cloud at a time). When another live holder has it, waits until it expires.
    private func acquireLease() throws -> Bool {
        func current() throws -> Lease? {
            // The lease rarely changes between requests: the same text holds the same lease as when it was last parsed.
            // (Compared byte for byte: String equality would also match canonically equivalent text.)
            // The value read is the one parsed (another process may write the lease between two reads).
            let statement = try db.cachedStatement(Self.leaseSQL)
            let value: SQLiteValue
            do {
                defer { statement.reset() }
                guard try statement.step() else { return nil }
                // The same text as last time, compared in place: no String is made per request.
                if sqlite3_column_type(statement.handle, 0) == SQLITE_TEXT, var cached = leaseCache {
                    let count = Int(sqlite3_column_bytes(statement.handle, 0))
                    if let bytes = sqlite3_column_text(statement.handle, 0),
                       cached.text.withUTF8({ $0.count == count && (count == 0 || memcmp($0.baseAddress!, bytes, count) == 0) }) {
                        return cached.lease
                    }
                }
                value = statement.value(0)
            }
            guard case let .text(text) = value else { return try parse(value) }
            let lease = try parse(value)
            leaseCache = (text, lease)
            return lease
        }
        func parse(_ value: SQLiteValue) throws -> Lease? {
            // Read by SQLite's JSON functions: this runs before every request, and JSONDecoder cost more than the rest.
            guard let row = try db.rows("""
                SELECT json_extract(?1, '$.holder'), json_extract(?1, '$.expires') WHERE json_valid(?1)
                """, [value]).first, case let .text(holder) = row[0], let id = holder == instanceText ? instanceID : UUID(uuidString: holder),
                case let .integer(expires) = row[1] else { return nil }
            return Lease(holder: id, expires: expires)
        }
        let duration = max(0, options.leaseDurationMilliseconds)
        /// Milliseconds until `lease` expires (saturating).
        func remaining(_ lease: Lease) -> Int64 {
            let (value, overflow) = lease.expires.subtractingReportingOverflow(now)
            return overflow ? (lease.expires > 0 ? .max : .min) : value
        }
        // A lease never lasts longer than one duration from now: one that ends further ahead was taken before the
        // clock went back (or by a clock far ahead), so it is renewed — or, held by another engine, clamped.
        if let lease = try current(), lease.holder == instanceID, remaining(lease) > duration / 2, remaining(lease) <= duration {
            return true
        }
        return try db.transaction(.immediate) {
            if var lease = try current(), lease.holder != instanceID, remaining(lease) > 0 {
                if remaining(lease) > duration {
                    lease.expires = Self.saturatingSum(now, duration)
                    try db.run("UPDATE replica_metadata SET value = ? WHERE key = 'sync_lease'", [.text(lease.json)])
                }
                wait(milliseconds: remaining(lease), forLease: true)
                return false
            }
            let lease = Lease(holder: instanceID, expires: Self.saturatingSum(now, duration))
            try db.run("INSERT INTO replica_metadata (key, value) VALUES ('sync_lease', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                       [.text(lease.json)])
            return true
        }
    }

    /// Gives up the upload lease if this engine holds it, so another process need not wait for it to expire: an engine
    /// of another process that asks for the lease from now on takes it at once. One that already found it held and is
    /// waiting keeps waiting until the expiry it saw (its wait is not shortened) and takes it then.
    public func releaseLease() {
        try? db.run("DELETE FROM replica_metadata WHERE key = 'sync_lease' AND json_extract(value, '$.holder') = ?",
                    [.text(instanceText)])
    }

    // MARK: Applying

    private func apply(_ outcome: CloudOperationResult, versions: [UUID: Int64], uploaded: [UUID: HLC]) throws {
        switch outcome {
        case .zoneCreated:
            zoneReady = true
            deletedZoneItself = false
            assetCycleEnded(zoneCreated: true)
        case let .changes(batch):
            try importBatch(batch)
            needsFetch = batch.moreComing
            fetchFailing = false
            if !batch.moreComing { assetCycleEnded(zoneCreated: false) }
        case let .modified(results):
            try applySaveResults(results, versions: versions, uploaded: uploaded)
            return
        case let .metadata(metadata):
            try checkSchema(metadata[Self.schemaKey])
        case let .metadataValue(value):
            if value == proposedSchema?.value { schemaChecked = true }
            proposedSchema = nil
        case .zoneDeleted:
            deletedZoneItself = true
        case .assetUpload, .assetChunk:
            break
        }
        consecutiveFailures = 0
        lastError = nil
    }

    /// Merges fetched records and stores the new token, in one transaction.
    private func importBatch(_ batch: ZoneChangeBatch) throws {
        if container.environment.canaries.contains(.tokenBeforeApply) {
            try db.transaction(.immediate) { try saveToken(batch.token) }
            try container.environment.faultHook?(.beforeImport(store: storeName))
            try importing {
                try SyncLedger.keepUnreadable(batch.unreadable, db)
                try mergeRecords(batch.records)
            }
            return
        }
        try container.environment.faultHook?(.beforeImport(store: storeName))
        try importing {
            try SyncLedger.keepUnreadable(batch.unreadable, db)
            try mergeRecords(batch.records)
            try saveToken(batch.token)
            try noteSeenDuringResync(batch)
        }
    }

    /// What the merges of the current import transaction changed, and the history token they recorded.
    var importedChanges: (token: Int64?, changes: StoreChanges)?

    /// Runs `body` (which merges) in one write transaction, then announces what it imported: to the container's
    /// change stream (the hub reads the history transaction back, on this connection) and as ``ModelContext/didSave``
    /// with this engine as the object. A transaction that rolls back announces nothing.
    func importing(_ body: () throws -> Void) throws {
        importedChanges = nil
        do {
            try db.transaction(.immediate, body)
        } catch {
            if let token = importedChanges?.token { container.changeHub.abandon(store: storeIndex, token: token) }
            importedChanges = nil
            throw error
        }
        guard let imported = importedChanges else { return }
        importedChanges = nil
        if let token = imported.token {
            container.changeHub.didCommit(store: storeIndex, token: token, reading: db, changes: imported.changes,
                                          author: HistoryTransaction.syncAuthor)
        }
        ModelContext.postDidSave([imported.changes], object: self)
        if recordsImports { importLog.append(imported.changes) }
    }

    // MARK: Full resync

    /// A fetch from no token reads the whole zone. Records this device has that the zone turns out not to have (the
    /// zone was reset and re-created by another device, or lost them) are uploaded again when the read completes.
    /// The generation and the records seen are stored in the store, so a crash mid-resync resumes correctly.
    private func beginFullResync() throws {
        try db.transaction(.immediate) {
            let active = try db.scalar(Self.resyncActiveSQL)
            guard active == nil else { return }
            try db.run("""
                INSERT INTO replica_metadata (key, value) VALUES ('resync_generation', 1)
                ON CONFLICT (key) DO UPDATE SET value = value + 1
                """)
            try db.run("INSERT INTO replica_metadata (key, value) VALUES ('resync_active', 1)")
        }
    }

    /// Metadata reads run per request or per fetched batch, as statement keys.
    private static let leaseSQL = StatementKey("SELECT value FROM replica_metadata WHERE key = 'sync_lease'")
    private static let resyncActiveSQL = StatementKey("SELECT value FROM replica_metadata WHERE key = 'resync_active'")
    private static let resyncGenerationSQL = StatementKey("SELECT value FROM replica_metadata WHERE key = 'resync_generation'")
    private static let anyUnknownSQL = StatementKey("SELECT EXISTS (SELECT 1 FROM replica_sync_unknown_record)")
    private static let tokenSQL = StatementKey("SELECT value FROM replica_metadata WHERE key = 'server_change_token'")

    private static let markSeenSQL = StatementKey("UPDATE replica_sync_record SET seen = ? WHERE id = ?")
    private static let markRejectedSeenSQL = StatementKey("UPDATE replica_sync_rejected SET seen = ? WHERE id = ? AND record_type = ?")
    private static let markUnknownSeenSQL = StatementKey("UPDATE replica_sync_unknown_record SET seen = ? WHERE id = ?")
    private static let saveTokenSQL = StatementKey("""
        INSERT INTO replica_metadata (key, value) VALUES ('server_change_token', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value
        """)

    private func noteSeenDuringResync(_ batch: ZoneChangeBatch) throws {
        guard try db.scalar(Self.resyncActiveSQL) != nil else { return }
        guard case let .integer(generation)? = try db.scalar(Self.resyncGenerationSQL) else {
            // The generation of the full read under way cannot be read: which records it saw cannot be told, so it
            // starts over (the next fetch reads from no token; `beginFullResync` stores a readable generation).
            try db.run("DELETE FROM replica_metadata WHERE key IN ('resync_active', 'server_change_token', 'resync_generation')")
            needsFetch = true
            return
        }
        // Most stores keep no rejected versions and no records of unknown types: their updates would match nothing.
        let anyRejected = try db.scalar(SyncLedger.anyRejectedSQL) != .integer(0)
        let anyUnknown = try db.scalar(Self.anyUnknownSQL) != .integer(0)
        // One statement per record and table (prepared once: their SQL is not hashed per record).
        let markRecord = try db.cachedStatement(Self.markSeenSQL)
        for record in batch.records {
            defer { markRecord.reset() }
            try markRecord.bind(generation, at: 0)
            try markRecord.bind(record.recordID, at: 1)
            while try markRecord.step() {}
            if anyRejected {
                try db.run(Self.markRejectedSeenSQL, [.integer(generation), record.recordID.sqliteValue, .text(record.recordType)])
            }
            if anyUnknown {
                try db.run(Self.markUnknownSeenSQL, [.integer(generation), record.recordID.sqliteValue])
            }
        }
        // Records the cloud holds but cannot read are in the zone too: neither lost nor gone.
        for entry in batch.unreadable {
            let id = entry.recordID?.sqliteValue ?? .blob(Data())
            try db.run("UPDATE replica_sync_record SET seen = ? WHERE id = ?", [.integer(generation), id])
            try db.run("UPDATE replica_sync_rejected SET seen = ? WHERE id = ?", [.integer(generation), id])
        }
        guard !batch.moreComing else { return }
        try db.run("UPDATE replica_sync_unknown_record SET pending = 1 WHERE seen <> ?", [.integer(generation)])
        // Versions kept aside that the zone no longer holds are gone from the cloud: nothing is failing any more.
        try db.run("DELETE FROM replica_sync_rejected WHERE seen <> ?", [.integer(generation)])
        try db.run("""
            UPDATE replica_sync_record SET pending = 1, change_tag = NULL, local_version = local_version + 1,
                state = CASE WHEN state IN ('rejected', 'undecryptable') THEN state ELSE 'pending' END,
                reason = CASE WHEN state = 'corrupt' THEN NULL ELSE reason END
            WHERE seen <> ?
            """, [.integer(generation)])
        // Records still marked corrupt were in the zone, but in a form that could not be applied: released with their
        // rebuilt bookkeeping (their upload replaces that version, whose change tag they took).
        try SyncLedger.releaseCorrupt(db)
        try db.run("DELETE FROM replica_metadata WHERE key = 'resync_active'")
    }

    /// Merges remote records (inside the caller's transaction), then resolves references (delete rules of deleted
    /// parents, waiting children), stamps the local changes that caused, and records one history transaction
    /// authored by sync.
    func mergeRecords(_ records: [CloudRecord]) throws {
        // Held versions whose time has come are merged first (R2; they may be held again).
        let retried = try SyncLedger.takeDueHeldRecords(wall: now, db)
        // Records of types this schema declares that were kept as unknown (by an older version, R9) are merged too.
        let adopted = container.environment.canaries.contains(.unknownTypesNeverAdopted) ? (records: [CloudRecord](), requeue: [CloudRecord]())
            : try SyncLedger.takeAdoptableUnknownRecords(store: store, db)
        // Versions that waited for their assets, now here (R19).
        let waited = try takeReadyWaitingRecords()
        let all = retried.isEmpty && adopted.records.isEmpty && waited.records.isEmpty ? records
            : retried + adopted.records + waited.records + records
        // A version referencing an asset this device lacks waits for it instead of merging (R19).
        var arrived = Set<String>()
        let resolved = try all.compactMap { try resolvingAssets($0, arrived: &arrived) }
        try mergeResolved(resolved, retried: retried, adopted: adopted)
        if !waited.requeue.isEmpty { try requeueAfterWaiting(waited.requeue) }
        if !arrived.isEmpty || !waited.records.isEmpty { try dropStagedChunks(arrived) }
    }

    /// The merge of ``mergeRecords(_:)`` once the versions that wait for assets are set aside.
    private func mergeResolved(_ records: [CloudRecord], retried: [CloudRecord], adopted: (records: [CloudRecord], requeue: [CloudRecord])) throws {
        guard !records.isEmpty else {
            if !retried.isEmpty || !adopted.requeue.isEmpty { try SyncLedger.requeueRetried(retried + adopted.requeue, db) }
            return
        }
        var hlc = try SyncLedger.loadHLC(db, replica: store.identity)
        var changes = StoreChanges()
        var tombstoned: [PersistentIdentifier] = []
        var absorbing: [PersistentIdentifier] = []
        let batch = try SyncLedger.MergeBatch(db)
        batch.skipsHeldVersions = try db.scalar(Self.resyncActiveSQL) == nil
        batch.fieldsAreOpened = encryption != nil
        for record in records {
            let outcome = try SyncLedger.merge(record, store: store, db: db, hlc: &hlc, wall: now,
                                               maxDrift: container.environment.canaries.contains(.unboundedRemoteClock) ? .max : options.maxClockDriftMilliseconds,
                                               canaries: container.environment.canaries,
                                               batch: batch)
            changes.add(outcome)
            if let id = outcome.tombstoned { tombstoned.append(id) }
            absorbing += outcome.absorbing
        }
        try SyncLedger.saveHLC(hlc, db)
        if !container.environment.canaries.contains(.dedupSkipped) {
            let touched = changes.inserted + changes.updated.map(\.0)
            tombstoned += try SyncLedger.deduplicate(touched, store: store, db: db, changes: &changes)
            try SyncLedger.absorbEndedRedirects(absorbing, arrived: changes.inserted, store: store, db: db, changes: &changes)
        }
        let consequences = try SyncLedger.resolveReferences(after: &changes, tombstoned: tombstoned, store: store, db: db, batch: batch)
        if !container.environment.canaries.contains(.conflictLogMissesDeletes) {
            try ConflictRecording.logCascades(consequences.deleted, applied: hlc, store: store, db: db)
        }
        // Many-to-many links: the merged link sets into the link tables; owners of links to records that died
        // remove them, and winners of duplicates take their losers' links, as local changes (R17). (Those owners are
        // stamped only where their sets change; the rows that change are in `changes`.)
        var stamped = consequences
        let linkTables = LinkReplication.tables(of: store)
        if !linkTables.isEmpty {
            let followers = try LinkReplication.materializeAfterMerge(
                merged: records, tombstoned: tombstoned + consequences.deleted.map(\.id), changes: &changes,
                tables: linkTables, store: store, db: db)
            stamped.updated += followers.updated
        }
        try SyncLedger.recordLocalChanges(stamped, store: store, db: db, environment: container.environment)
        if !retried.isEmpty || !adopted.requeue.isEmpty { try SyncLedger.requeueRetried(retried + adopted.requeue, db) }
        changes.inserted += consequences.inserted
        changes.updated += consequences.updated
        changes.deleted += consequences.deleted
        if container.environment.canaries.contains(.importSkipsHistory) {
            importedChanges = (nil, changes)
            return
        }
        let token = try HistoryLog.record(changes, author: HistoryTransaction.syncAuthor, environment: container.environment, db: db)
        if let token { container.changeHub.willCommit(store: storeIndex, token: token, origin: .syncImport) }
        if changes.isEmpty { return }
        importedChanges = (token, changes)
    }

    private func applySaveResults(_ results: [RecordSaveResult], versions: [UUID: Int64], uploaded: [UUID: HLC]) throws {
        var transient: CloudError?
        try importing {
            var conflicts: [CloudRecord] = []
            // Whether `replica_sync_rejected` holds entries, read at the first saved record: nothing below adds one
            // before the conflicts merge, and this write transaction keeps other connections from adding any.
            var mayHoldRejected: Bool?
            for result in results {
                switch result {
                case let .saved(id, changeTag):
                    guard try SyncLedger.acknowledgeSave(
                        id, changeTag: changeTag, version: versions[id],
                        clearingPending: container.environment.canaries.contains(.staleAckClearsPending), db)
                    else {
                        _ = try SyncLedger.unknownRecordSaved(id, changeTag: changeTag, db)
                        continue
                    }
                    // The cloud now holds this replica's writes to the record up to the newest one uploaded (R16).
                    if let mark = uploaded[id] { try ConflictRecording.noteUploaded(id, through: mark, db) }
                    // The cloud's version is now this one: a version of it that could not be applied is superseded.
                    if mayHoldRejected == nil { mayHoldRejected = try db.scalar(SyncLedger.anyRejectedSQL) != .integer(0) }
                    if mayHoldRejected == true { try db.run(SyncLedger.deleteRejectedOfLedgerRecordSQL, [id.sqliteValue]) }
                    if container.environment.canaries.contains(.tombstonesDroppedEarly), let state = try SyncLedger.load(id, store: store, db),
                       !state.isAlive && !state.pending {
                        try db.run("DELETE FROM replica_sync_record WHERE id = ?", [id.sqliteValue])
                    }
                case let .conflict(serverRecord):
                    if container.environment.canaries.contains(.conflictClobbers), var state = try SyncLedger.load(serverRecord.recordID, store: store, db) {
                        state.changeTag = serverRecord.changeTag
                        try SyncLedger.store(state, db)
                        continue
                    }
                    conflicts.append(serverRecord)
                case let .failed(id, error):
                    if case let .assetNotFound(hash) = error, assetRefused(id, hash: hash) {
                        // Its asset goes up again, then the record (still pending) follows.
                        continue
                    }
                    if error.isTransient {
                        transient = error
                    } else {
                        try db.run("UPDATE replica_sync_record SET state = 'rejected', reason = ? WHERE id = ?",
                                   [.text(error.description), id.sqliteValue])
                        // A record of an unknown type is kept as it is, but not offered again.
                        try db.run("UPDATE replica_sync_unknown_record SET pending = 0 WHERE id = ?", [id.sqliteValue])
                    }
                }
            }
            try mergeRecords(conflicts)
        }
        if let transient {
            scheduleRetry(after: transient)
        } else {
            consecutiveFailures = 0
            lastError = nil
        }
    }

    /// The zone is gone and the store keeps its data: the zone is created again and everything uploaded again,
    /// tombstones included. Its metadata went with it, so the union schema is checked (and written) again before
    /// anything else.
    func reuploadAfterZoneLoss() throws {
        zoneReady = false
        assetCycleEnded(zoneCreated: true)
        schemaChecked = false
        proposedSchema = nil
        needsFetch = true
        try db.transaction(.immediate) {
            try db.run("DELETE FROM replica_metadata WHERE key = 'server_change_token'")
            try db.run("DELETE FROM replica_metadata WHERE key = 'resync_active'")
            try encryptionZoneWasReset()
            try db.run("""
                UPDATE replica_sync_record SET pending = 1, change_tag = NULL, local_version = local_version + 1,
                    state = CASE WHEN state = 'rejected' THEN state ELSE 'pending' END,
                    reason = CASE WHEN state = 'corrupt' THEN NULL ELSE reason END
                """)
            try db.run("UPDATE replica_sync_unknown_record SET pending = 1")
        }
    }

    private func fail(_ error: CloudError, request: SyncRequest) throws {
        if try failAsset(error, request: request) { return }
        lastError = error
        switch error {
        case .changeTokenExpired:
            // Full, idempotent resync: merging records already applied changes nothing. The zone may have been reset
            // and re-created by another device, so its union schema is checked (and completed) again too. A full read
            // that was under way starts over as a new generation: records it marked seen may be missing from a
            // re-created zone, and only a complete read decides what goes back to the outbox.
            try db.transaction(.immediate) {
                try db.run("DELETE FROM replica_metadata WHERE key = 'server_change_token'")
                try db.run("DELETE FROM replica_metadata WHERE key = 'resync_active'")
            }
            needsFetch = true
            schemaChecked = false
            proposedSchema = nil
            // A re-created zone holds none of the assets this engine learned it held: each goes up again before the
            // records the full read sends back (they would otherwise reference assets no device can download).
            assetCycleEnded(zoneCreated: true)
        case .zoneNotFound:
            // The zone is gone (reset, or never created): create it and upload everything again, tombstones included.
            try zoneWasLost(reason: nil)
        case let .zoneDeleted(reason):
            // Deleted for a reason the cloud names: the policy decides (before anything changes locally) whether the
            // store keeps its data and uploads it again or erases it (`SyncEngine+ZoneDeletion.swift`).
            try zoneWasLost(reason: reason)
        case .invalidRecord:
            if case let .modifyRecords(records, _) = request.operation {
                for record in records {
                    try db.run("UPDATE replica_sync_record SET state = 'rejected', reason = ? WHERE id = ?",
                               [.text(error.description), record.recordID.sqliteValue])
                    try db.run("UPDATE replica_sync_unknown_record SET pending = 0 WHERE id = ?", [record.recordID.sqliteValue])
                }
            } else {
                // The cloud cannot serve the zone (e.g. a stored record it cannot read): asking again at once would
                // fail the same way, forever. Back off (the error stays in the status), uploading meanwhile.
                if case .fetchZoneChanges = request.operation {
                    fetchFailing = true
                    uploadBeforeFetch = true
                }
                scheduleRetry(after: error)
            }
        default:
            scheduleRetry(after: error)
        }
    }

    /// `a + b`, or `Int64.max`/`Int64.min` where it would overflow.
    static func saturatingSum(_ a: Int64, _ b: Int64) -> Int64 {
        let (sum, overflow) = a.addingReportingOverflow(b)
        return overflow ? (b > 0 ? .max : .min) : sum
    }

    private func scheduleRetry(after error: CloudError) {
        lastError = error
        consecutiveFailures += 1
        let delay: Int64
        if let retryAfter = error.retryAfterMilliseconds {
            // The server's delay, within [0, maxBackoff] like every retry delay: an absurd or malformed answer neither
            // traps nor stops syncing for good.
            delay = min(max(0, retryAfter), options.maxBackoffMilliseconds)
        } else {
            let exponent = min(consecutiveFailures - 1, 20)
            // (Saturating: whatever the options, the delay never overflows.)
            let doubled = options.baseBackoffMilliseconds.multipliedReportingOverflow(by: Int64(1) << exponent)
            let base = max(0, min(options.maxBackoffMilliseconds, doubled.overflow ? .max : doubled.partialValue))
            delay = Self.saturatingSum(base, Int64(container.environment.random.next() % UInt64(max(1, base / 4) + 1)))
        }
        wait(milliseconds: delay, serverDirected: error.retryAfterMilliseconds != nil)
    }

    // MARK: Token

    private func loadToken() throws -> ServerChangeToken? {
        guard case let .text(json)? = try db.scalar(Self.tokenSQL) else { return nil }
        // The stored text decides the token: the same text as last time decodes to the same token (read before every
        // fetch, and JSONDecoder cost more than the query).
        if let decoded = decodedToken, decoded.json == json { return decoded.token }
        let token = ReplicaJSON.decode(ServerChangeToken.self, json)
        decodedToken = (json, token)
        return token
    }

    /// The token `loadToken()` decoded last, with its stored text.
    private var decodedToken: (json: String, token: ServerChangeToken?)?

    private func saveToken(_ token: ServerChangeToken) throws {
        let json = token.ledgerJSON
        try db.run(Self.saveTokenSQL, [.text(json)])
        // Keyed by the text: if the transaction rolls back, the stored text differs and is decoded again.
        decodedToken = (json, token)
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
