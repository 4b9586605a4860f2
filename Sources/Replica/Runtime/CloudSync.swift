import Foundation
import Synchronization

/// The sync runtime of one synced store: an actor that owns the store's ``SyncEngine`` and its ``CloudDatabase`` and
/// syncs by itself, like CloudKit's `CKSyncEngine`. Safe to hold and call from `@MainActor` objects, from any actor
/// and from tasks. Start it with ``ModelContainer/startSync(store:cloud:zone:encryption:options:)``; keep one per
/// synced store for the life of the process.
///
/// **When it syncs.** A pass (performing the engine's requests until it is idle or backs off) runs
/// - at start,
/// - after local saves — of any context of the container, and commits of other processes to an app-group store
///   (the container's change stream, ``ModelContainer/changes``), debounced: a pass starts
///   ``Options/debounceMilliseconds`` after the last save of a burst (but at most 10 debounce intervals after its
///   first save), so a burst of saves is one upload;
/// - when the cloud announces a change of the zone (``CloudDatabase/changeNotifications()``: PostgreSQL's
///   LISTEN/NOTIFY), or when its ``CloudDatabase/changeCounter()`` moved (polled every
///   ``Options/cloudPollingMilliseconds``: the SQLite-file cloud's zone table);
/// - every ``Options/timerMilliseconds`` (a full fetch and upload);
/// - on ``syncNow(timeoutMilliseconds:)``.
///
/// It honours the engine's backoff and the upload lease: after a transient failure (network, quota, rate limit, busy
/// zone) it stays quiet until the engine's retry time, and resumes normal scheduling as soon as a request succeeds. A
/// pass that ends with nothing left to upload gives the lease up, so the runtime of another process of an app group
/// never waits for it; one that stops with work left (a ``syncNow(timeoutMilliseconds:)`` at its bound) leaves that
/// work to the next automatic pass, at once or when the engine's wait ends.
///
/// **Time.** Every wait goes through ``ReplicaEnvironment/sleepUntil`` and every time is read from
/// ``ReplicaEnvironment/clock``: with a seeded environment nothing happens until the test moves the
/// ``ManualClock``, and an idle runtime costs no CPU (no polling but the optional cloud counter). Every scheduling
/// decision is made by one `CloudSyncSchedule` (without I/O or waiting), which the simulator drives in virtual time
/// too, so `replica-sim` searches the same decision code an app runs.
///
/// **Ending.** ``stop()`` ends it (waiting for a request in flight, which is handled) and gives up the upload lease;
/// releasing the last reference ends it too: its tasks hold it weakly and are cancelled when it goes. Nothing is
/// lost either way: the outbox lives in the store, written with each save.
///
/// **Events.** ``events`` reports what happened (``CloudSyncEvent``): changes fetched and sent, records refused,
/// zone and key problems, conflicts resolved, and state changes — never values or secrets.
public actor CloudSync {
    /// Scheduling knobs.
    public struct Options: Sendable, Hashable {
        /// The engine's knobs (batch sizes, backoff, lease).
        public var engine = SyncEngine.Options()
        /// How long after a local save the pass starts, in milliseconds (each further save of a burst moves it,
        /// up to 10 intervals after the first). Default 300 ms.
        public var debounceMilliseconds: Int64 = 300
        /// The interval of periodic full syncs, in milliseconds; `nil` turns the timer off. Default 5 minutes.
        public var timerMilliseconds: Int64? = 300_000
        /// How often the cloud's ``CloudDatabase/changeCounter()`` is read, in milliseconds, for a cloud that has
        /// one; `nil` turns polling off. Default 2 s.
        public var cloudPollingMilliseconds: Int64? = 2_000
        /// A safety bound on the requests of one pass.
        public var maxRequestsPerPass = 10_000
        /// Starts the runtime paused (state ``CloudSyncState/paused``): nothing syncs until ``CloudSync/resume()`` (or a
        /// ``CloudSync/syncNow(timeoutMilliseconds:)``). ``CloudSync/events`` reports what happens from the moment of
        /// subscribing, and an unpaused runtime's first pass starts at once: to see that pass's events (the launch's
        /// import), start paused, subscribe, then resume. Default `false`.
        public var startsPaused = false
        /// Events buffered per ``CloudSync/events`` subscriber before the oldest are dropped.
        public var eventBufferLimit = 1_000
        /// What the store does when the cloud reports its zone deleted (the engine's
        /// ``SyncEngine/Options/zoneDeletionPolicy``): keep and upload again (the default), erase, or ask — then
        /// answer with ``CloudSync/resolveZoneDeletion(_:)`` after ``CloudSyncEvent/zoneDeleted(zone:reason:)``.
        public var zoneDeletionPolicy: ZoneDeletionPolicy {
            get { engine.zoneDeletionPolicy }
            set { engine.zoneDeletionPolicy = newValue }
        }
        public init() {}
    }

    /// The store's configuration name.
    public nonisolated let storeName: String
    /// The cloud zone the store syncs with.
    public nonisolated let zone: String
    /// The scheduling options.
    public nonisolated let options: Options
    private nonisolated let container: ModelContainer
    private nonisolated let cloud: any CloudDatabase
    private nonisolated let broadcaster: CloudSyncEventBroadcaster
    private nonisolated let wakeup = CloudSyncWakeup()
    /// Wakes a pass that sleeps through the engine's wait, when ``stop()`` is called.
    private nonisolated let passWakeup = CloudSyncWakeup()
    private nonisolated let tasks = CloudSyncTasks()
    private let engine: SyncEngine
    /// Every scheduling and state decision (see `CloudSyncSchedule`).
    private var schedule: CloudSyncSchedule

    /// The current state (as last reported by ``CloudSyncEvent/stateChanged(_:)``).
    public var state: CloudSyncState { schedule.state }
    /// When the last pass ended with the store up to date with the cloud (the engine idle, no error), from the
    /// environment's clock, at millisecond precision. Kept in the store (``SyncEngine/lastSyncDate()``): a runtime
    /// started after a restart — or in another process of an app group — starts with the last one recorded; `nil`
    /// before the store's first.
    public private(set) var lastSyncDate: Date?
    /// `true` while automatic syncing is paused.
    public var isPaused: Bool { schedule.isPaused }
    private var stopped: Bool { schedule.isStopped }
    private var running = false
    /// Calls waiting for the engine, in order; each is resumed with `true` when it gets it, `false` when its bound
    /// passed first.
    private var runWaiters: [(id: Int, continuation: CheckedContinuation<Bool, Never>)] = []
    private var nextWaiterID = 0
    /// ``syncNow(timeoutMilliseconds:)`` calls waiting for the engine (an automatic pass makes way for them).
    private var explicitCallsWaiting = 0
    private var conflictPosition: Int64 = 0
    private var keyVersions: [UInt32] = []
    private var reportedKeyProblem: FieldEncryptionError?

    private var now: Int64 { container.environment.clock.nowMilliseconds() }

    /// Creates the runtime of synced store `storeName` and starts it (use
    /// ``ModelContainer/startSync(store:cloud:zone:encryption:options:)``).
    /// - Throws: as ``SyncEngine/init(container:storeName:zone:options:encryption:)``; ``ReplicaError`` when the
    ///   container's change stream cannot be read.
    public init(container: ModelContainer, storeName: String, cloud: any CloudDatabase, zone: String? = nil,
                encryption: FieldEncryption? = nil, options: Options = Options()) throws {
        let engine = try SyncEngine(container: container, storeName: storeName, zone: zone, options: options.engine, encryption: encryption)
        engine.recordsImports = true
        self.engine = engine
        self.storeName = storeName
        self.zone = engine.zone
        self.options = options
        self.schedule = CloudSyncSchedule(options: options, canaries: container.environment.canaries)
        self.container = container
        self.cloud = cloud
        self.broadcaster = CloudSyncEventBroadcaster(bufferLimit: max(1, options.eventBufferLimit))
        self.conflictPosition = try engine.conflictLogPosition()
        self.keyVersions = engine.encryptionKeyVersions
        self.lastSyncDate = try engine.lastSyncDate()
        // The subscription starts now, so that no save after this initializer returns is missed.
        let iterator = try container.changes(in: [storeName]).makeAsyncIterator()
        let wakeup = self.wakeup
        let environment = container.environment
        tasks.add(Task { [weak self] in
            while !Task.isCancelled {
                guard let next = await self?.runDueWork() else { return }
                await wakeup.wait(until: next, environment: environment)
            }
        })
        tasks.add(Task { [weak self] in
            var localChanges = iterator
            do {
                while let event = try await localChanges.next() {
                    var savedAt: Int64?
                    if case let .committed(change) = event {
                        if change.origin == .syncImport || change.isSyncImport { continue }
                        savedAt = Int64((change.timestamp.timeIntervalSince1970 * 1000).rounded())
                    }
                    guard let self else { return }
                    await self.noteLocalChange(savedAt: savedAt)
                }
            } catch {
                await self?.noteObservationFailure()
            }
        })
        let zoneName = self.zone
        if let notifications = cloud.changeNotifications() {
            tasks.add(Task { [weak self] in
                for await changed in notifications where changed == zoneName {
                    guard let self else { return }
                    await self.noteCloudChange()
                }
            })
        }
    }

    deinit {
        tasks.cancelAll()
        broadcaster.finish()
    }

    // MARK: Public API

    /// The runtime's events from now on (each access is a new subscription; it ends when the runtime stops or goes):
    /// events of a pass under way before the subscription are not replayed — see ``Options/startsPaused`` to see the
    /// first pass's.
    /// Buffers ``Options/eventBufferLimit`` events for a slow consumer, then drops the oldest.
    public nonisolated var events: AsyncStream<CloudSyncEvent> { broadcaster.subscribe() }

    /// Syncs now: fetches the zone's changes and uploads the outbox, within `timeout` milliseconds of the
    /// environment's clock. Its first request goes out at once, even while the runtime is backing off after a
    /// transient failure (the network just came back) — only a delay the server asked for
    /// (``CloudError/retryAfterMilliseconds``) or another process's upload lease is waited out. Returns when the work
    /// is done, the time is up, or the only remaining problem is transient and its retry lies past the bound (the
    /// status then shows it in ``SyncStatus/lastError``) — never hangs. Runs while paused too (pausing stops only
    /// automatic syncing); after ``stop()`` it performs nothing.
    /// Waits for a pass under way to end first: an automatic pass makes way after its request in flight; another
    /// syncNow's pass is waited for until the bound at most (the call then returns the status as it is).
    /// Cancelling the calling task ends the call with `CancellationError`: at once while it waits for another pass;
    /// before its pass began, without sending anything (the engine's backoff stays); while its own pass runs, as soon
    /// as the pass would go on (at once during a backoff; after the answer to the request in flight, which is applied —
    /// the request itself is not cancelled). The work left goes to automatic scheduling.
    /// - Parameter timeout: the bound in milliseconds (default 30 s).
    /// - Returns: the engine's status at the end.
    /// - Throws: as ``SyncDriver/syncUntilIdle(_:with:maxRequests:timeoutMilliseconds:isolation:)``.
    @discardableResult
    public func syncNow(timeoutMilliseconds timeout: Int64 = 30_000) async throws -> SyncStatus {
        let deadline = now &+ max(0, timeout)
        guard !stopped else { return try engine.status() }
        explicitCallsWaiting += 1
        let gotEngine = await acquireRun(until: deadline, cancellable: true)
        explicitCallsWaiting -= 1
        guard gotEngine else {
            // The caller's task was cancelled while another call held the engine: it stops waiting at once.
            try Task.checkCancellation()
            // The bound passed while another call held the engine: the status as it is.
            return try engine.status()
        }
        defer { releaseRun() }
        // stop() was called while this call waited for a pass under way: it performs nothing.
        guard schedule.mayBeginExplicitPass else { return try engine.status() }
        // Cancelled before its pass began (before the call, or as it got the engine): it performs nothing — beginning
        // the pass would end the engine's backoff for a call that then sends nothing, and the automatic schedule
        // would send at once in the middle of that backoff.
        try Task.checkCancellation()
        let status = try await pass(explicitDeadline: deadline)
        // The scheduler looks again: a retry time may have been set, or the work it was waiting for is done.
        wakeup.signal()
        return status
    }

    /// The engine's view of the store (pending, rejected and held records, errors).
    /// - Throws: ``SQLiteError`` when the store cannot be read.
    public func status() throws -> SyncStatus { try engine.status() }

    /// The server change token the store holds (see ``SyncEngine/serverChangeToken()``).
    /// - Throws: ``SQLiteError`` when the store cannot be read.
    public func serverChangeToken() throws -> ServerChangeToken? { try engine.serverChangeToken() }

    /// The newest conflict log entries (see ``SyncEngine/conflictLog(limit:)``).
    /// - Throws: ``SQLiteError`` when the store cannot be read.
    public func conflictLog(limit: Int = 100) throws -> [ConflictLogEntry] { try engine.conflictLog(limit: limit) }

    /// Reads the whole zone again at the next pass (which starts at once unless paused) and compares it with the
    /// store — non-destructive, see ``SyncEngine/requestFullRefetch()``. Waits for a request under way.
    /// - Throws: ``SQLiteError`` when the store cannot be written.
    public func requestFullRefetch() async throws {
        await acquireRun()
        defer { releaseRun() }
        try engine.requestFullRefetch()
        schedule.requestPass()
        wakeup.signal()
    }

    /// Pauses automatic syncing: a pass under way stops after its current request; nothing is scheduled until
    /// ``resume()``. Local saves are still recorded (the outbox is durable) and upload after resuming.
    public func pause() {
        announce(schedule.pause())
        wakeup.signal()
    }

    /// Resumes automatic syncing with a pass at once.
    public func resume() {
        announce(schedule.resume())
        wakeup.signal()
    }

    /// Replaces the store's key provider — e.g. after ``CloudSyncEvent/encryptionKeyNeeded(_:)`` with
    /// ``FieldEncryptionError/wrongKey(zone:)``, with the right passphrase — or turns field encryption on (see
    /// ``SyncEngine/setEncryptionKeyProvider(_:)``), then syncs at once (unless paused). Waits for a request under way.
    /// - Parameter provider: the key provider.
    /// - Throws: ``FieldEncryptionError/outOfGuardedMemory``.
    public func setEncryptionKeyProvider(_ provider: any FieldKeyProvider) async throws {
        try await changingKeys { try $0.setEncryptionKeyProvider(provider) }
    }

    /// Rotates the zone's field key at the next pass, which starts at once unless paused (see
    /// ``SyncEngine/rotateEncryptionKey()``); ``CloudSyncEvent/encryptionKeyChanged(zone:)`` follows.
    /// - Throws: ``FieldEncryptionError/noKey(zone:)`` when the store has no field encryption.
    public func rotateEncryptionKey() async throws {
        try await changingKeys { try $0.rotateEncryptionKey() }
    }

    /// Resets the zone's encryption after a lost key (see ``SyncEngine/resetEncryption(keyProvider:)``): the zone is
    /// deleted (reason ``ZoneDeletionReason/encryptedDataReset``) and created again with keys from `keyProvider`, and
    /// every local record is uploaded under them. Local data is never deleted. Starts at once unless paused.
    /// - Parameter keyProvider: the new key's provider.
    /// - Throws: ``FieldEncryptionError/outOfGuardedMemory``.
    public func resetEncryption(keyProvider: any FieldKeyProvider) async throws {
        try await changingKeys { try $0.resetEncryption(keyProvider: keyProvider) }
    }

    /// Runs `change` on the engine between requests, then asks for a pass with a fetch.
    private func changingKeys(_ change: (SyncEngine) throws -> Void) async throws {
        await acquireRun()
        defer { releaseRun() }
        guard !stopped else { return }
        try change(engine)
        schedule.requestPass()
        wakeup.signal()
    }

    /// Answers the zone deletion the store waits on (policy ``ZoneDeletionPolicy/ask``; see
    /// ``SyncEngine/resolveZoneDeletion(_:)``), then syncs at once (unless paused). Waits for a request under way.
    /// - Parameter response: keep the local data and upload it again, or erase it.
    /// - Returns: `false` when no deletion was waiting for an answer.
    /// - Throws: ``SQLiteError`` when the store cannot be written.
    @discardableResult
    public func resolveZoneDeletion(_ response: ZoneDeletionResponse) async throws -> Bool {
        await acquireRun()
        defer { releaseRun() }
        guard try engine.resolveZoneDeletion(response) else { return false }
        // What an erase deleted is reported as fetched changes (sync-authored deletions).
        try report(nil, nil)
        schedule.requestPass()
        wakeup.signal()
        return true
    }

    /// The zone deletion waiting for an answer (``ZoneDeletionPolicy/ask``), or `nil`.
    public var pendingZoneDeletion: ZoneDeletion? { engine.pendingZoneDeletion }

    /// Stops the runtime for good: waits for a request in flight (its response is applied; no pass goes on after it,
    /// a ``syncNow(timeoutMilliseconds:)`` sleeping through a backoff ends at once, and one still waiting performs
    /// nothing), gives up the upload lease (another process's runtime takes it at once) and ends ``events``. Saves
    /// made afterwards stay in the outbox for the next runtime.
    public func stop() async {
        guard schedule.beginStop() else { return }
        tasks.cancelAll()
        wakeup.signal()
        // A syncNow's pass sleeping through a backoff wakes and ends (it has no request in flight to wait for).
        passWakeup.signal()
        await acquireRun()
        engine.releaseLease()
        announce(schedule.finishStop())
        broadcaster.finish()
        releaseRun()
    }

    // MARK: Triggers

    /// A local save (or another process's commit) at `savedAt` (its clock, milliseconds; never later than now here).
    private func noteLocalChange(savedAt: Int64?) {
        schedule.noteLocalChange(savedAt: savedAt, now: now)
        wakeup.signal()
    }

    private func noteCloudChange() {
        schedule.noteCloudChange()
        wakeup.signal()
    }

    private func noteObservationFailure() {
        // The store's history could not be read: saves are still uploaded by the timer and by syncNow.
        broadcaster.emit(.stateChanged(.blocked))
    }

    // MARK: Scheduling

    /// Runs the pass that is due, if any, and returns when to look again (`nil`: only when signalled). `nil` result
    /// of the optional: the runtime stopped.
    private func runDueWork() async -> Int64?? {
        if stopped { return nil }
        let cloud = self.cloud
        if schedule.passIsDue(now: now, changeCounter: { cloud.changeCounter() }) && !running {
            await acquireRun()
            if !stopped && !isPaused {
                do {
                    _ = try await pass(explicitDeadline: nil)
                } catch is CancellationError {
                } catch {
                    announce(schedule.passFailed())
                }
            }
            releaseRun(signals: false)
        }
        if stopped { return nil }
        // While another call holds the engine, wait for its end (it signals) rather than for a deadline that may have
        // passed meanwhile: looking again at once, again and again, would spin until it ends.
        return .some(schedule.nextWake(passUnderWay: running))
    }

    /// `CloudSyncSchedule/localDeadline`, for tests that wait until the runtime noticed a save.
    var localDeadlineForTesting: Int64? { schedule.localDeadline }

    /// Waits until the caller holds the engine; with a `deadline` (environment milliseconds) gives up when the clock
    /// reaches it first, and when `cancellable`, as soon as the caller's task is cancelled. Returns whether the caller
    /// holds it.
    @discardableResult
    private func acquireRun(until deadline: Int64? = nil, cancellable: Bool = false) async -> Bool {
        while running {
            if let deadline, now >= deadline { return false }
            if cancellable && Task.isCancelled { return false }
            nextWaiterID += 1
            let id = nextWaiterID
            let environment = container.environment
            let timer = deadline.map { deadline in
                Task { [weak self] in
                    try? await environment.sleepUntil(deadline)
                    if !Task.isCancelled { await self?.stopWaiting(id) }
                }
            }
            // A cancellation handler that runs before the waiter is queued still finds it: its task reaches the actor
            // only once this one suspends.
            let got = await withTaskCancellationHandler {
                await withCheckedContinuation { runWaiters.append((id, $0)) }
            } onCancel: { [weak self] in
                guard cancellable, let sync = self else { return }
                Task { await sync.stopWaiting(id) }
            }
            timer?.cancel()
            if !got { return false }
        }
        running = true
        return true
    }

    /// A waiting call's bound passed before it got the engine.
    private func stopWaiting(_ id: Int) {
        guard let index = runWaiters.firstIndex(where: { $0.id == id }) else { return }
        runWaiters.remove(at: index).continuation.resume(returning: false)
    }

    /// Ends the caller's hold of the engine: the next waiting call gets it, and the scheduler looks again (unless the
    /// scheduler itself is the caller).
    private func releaseRun(signals: Bool = true) {
        running = false
        if !runWaiters.isEmpty { runWaiters.removeFirst().continuation.resume(returning: true) }
        if signals { wakeup.signal() }
    }

    /// One pass (the caller holds the run): automatic (`explicitDeadline` `nil`: until the engine is idle or backs off)
    /// or explicit (``syncNow(timeoutMilliseconds:)``: through backoffs until the deadline).
    private func pass(explicitDeadline deadline: Int64?) async throws -> SyncStatus {
        let explicit = deadline != nil
        var (pass, change) = schedule.beginPass(explicit: explicit, deadline: deadline, engine: engine, now: now)
        announce(change)
        let end: SyncPass.End
        do {
            end = try await SyncDriver.drive(
                engine, with: cloud, pass: &pass,
                shouldContinue: { pass in self.schedule.shouldContinue(pass, explicitCallWaiting: self.explicitCallsWaiting > 0) },
                observe: { request, result in try self.report(request, result) },
                willSleep: { self.announce(self.schedule.notePassSleeps(engine: self.engine)) },
                sleep: { [passWakeup, environment = container.environment] in try await passWakeup.sleep($0, environment: environment) })
        } catch is CancellationError {
            // The caller went away (a cancelled task awaiting syncNow, or stop()): the pass ends as one stopped with
            // work left, so automatic scheduling goes on with that work and the state is settled again.
            let cloud = self.cloud
            if let outcome = try? schedule.endPass(pass, .stopped, engine: engine, now: now, changeCounter: { cloud.changeCounter() }) {
                announce(outcome.state)
            } else {
                announce(schedule.passFailed())
            }
            throw CancellationError()
        } catch {
            announce(schedule.passFailed())
            throw error
        }
        let cloud = self.cloud
        let outcome = try schedule.endPass(pass, end, engine: engine, now: now, changeCounter: { cloud.changeCounter() })
        if let synced = outcome.synced { lastSyncDate = synced }
        announce(outcome.state)
        return outcome.status
    }

    /// Reports a state change the schedule decided.
    private func announce(_ change: CloudSyncState?) {
        if let change { broadcaster.emit(.stateChanged(change)) }
    }

    // MARK: Events

    /// Turns one handled request into events (`nil`: the engine changed the store outside a request, e.g. an erase
    /// answering a zone deletion).
    private func report(_ request: SyncRequest?, _ result: Result<CloudOperationResult, CloudError>?) throws {
        // The deletion first: an erase it led to is among the imports below.
        if case let .failure(error)? = result, error.isZoneMissing {
            broadcaster.emit(.zoneDeleted(zone: zone, reason: error.zoneDeletionReason))
        }
        let imports = engine.importLog
        engine.importLog.removeAll()
        for changes in imports {
            let fetched = CloudSyncChanges(
                inserted: changes.inserted.map(\.persistentModelID),
                updated: changes.updated.map(\.0.persistentModelID),
                deleted: changes.deleted.map(\.id))
            if !fetched.isEmpty { broadcaster.emit(.fetchedChanges(fetched)) }
        }
        if let request, let result {
            switch result {
            case let .success(.modified(results)), let .failure(.partialFailure(results)):
                reportSaves(results, of: request)
            case let .failure(error):
                broadcaster.emit(.requestFailed(operation: request.operation.name, error: error))
                if error == .changeTokenExpired { broadcaster.emit(.changeTokenExpired(zone: zone)) }
                // The wait starts now, not when the pass ends (a bounded syncNow may retry several times first).
                announce(schedule.noteResult(result, engine: engine))
            case .success:
                break
            }
        }
        let (entries, position) = try engine.conflictLogEntries(after: conflictPosition)
        conflictPosition = position
        if !entries.isEmpty { broadcaster.emit(.conflictsResolved(entries)) }
        let versions = engine.encryptionKeyVersions
        if versions != keyVersions {
            if !keyVersions.isEmpty || !versions.isEmpty { broadcaster.emit(.encryptionKeyChanged(zone: zone)) }
            keyVersions = versions
        }
        let problem = engine.blockingEncryptionError
        if problem != reportedKeyProblem {
            reportedKeyProblem = problem
            if let problem { broadcaster.emit(.encryptionKeyNeeded(problem)) }
        }
    }

    private func reportSaves(_ results: [RecordSaveResult], of request: SyncRequest) {
        guard case let .modifyRecords(records, _) = request.operation else { return }
        var types: [UUID: String] = [:]
        for record in records { types[record.recordID] = record.recordType }
        var saved: [PersistentIdentifier] = []
        var failed: [CloudSyncRecordFailure] = []
        for result in results {
            let id = PersistentIdentifier(entityName: types[result.recordID] ?? "", id: result.recordID)
            switch result {
            case .saved: saved.append(id)
            case let .failed(_, error) where !error.isTransient: failed.append(CloudSyncRecordFailure(id: id, error: error))
            case .failed, .conflict: break
            }
        }
        if !saved.isEmpty { broadcaster.emit(.sentChanges(saved)) }
        if !failed.isEmpty { broadcaster.emit(.failedRecords(failed)) }
    }
}

extension ModelContainer {
    /// Starts the sync runtime of synced store `store` against `cloud` (see ``CloudSync``): it syncs at once and then
    /// by itself. Keep the returned runtime for as long as the store should sync; call ``CloudSync/stop()`` or release
    /// it to end it.
    /// - Parameters:
    ///   - store: the configuration name of a synced store.
    ///   - cloud: the cloud database.
    ///   - zone: the zone name; defaults to the configuration name.
    ///   - encryption: how attributes marked for cloud encryption are sealed (required when the store has any).
    ///   - options: scheduling and engine options.
    /// - Throws: as ``CloudSync/init(container:storeName:cloud:zone:encryption:options:)``.
    public func startSync(store: String, cloud: any CloudDatabase, zone: String? = nil, encryption: FieldEncryption? = nil,
                          options: CloudSync.Options = CloudSync.Options()) throws -> CloudSync {
        try CloudSync(container: self, storeName: store, cloud: cloud, zone: zone, encryption: encryption, options: options)
    }
}

/// Wakes a runtime's scheduling task: a signal (a trigger) or the environment's clock reaching a deadline. Internal.
final class CloudSyncWakeup: Sendable {
    private struct State {
        var pending = false
        var waiter: CheckedContinuation<Void, Never>?
    }
    private let state = Mutex(State())

    func signal() {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            if let waiter = state.waiter {
                state.waiter = nil
                return waiter
            }
            state.pending = true
            return nil
        }
        waiter?.resume()
    }

    /// Sleeps `milliseconds` through ``ReplicaEnvironment/sleep`` (a relative sleep), or until a signal.
    /// - Throws: `CancellationError` when the task is cancelled.
    func sleep(_ milliseconds: Int64, environment: ReplicaEnvironment) async throws {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.waitForSignal() }
            group.addTask { try? await environment.sleep(milliseconds) }
            _ = await group.next()
            group.cancelAll()
        }
        try Task.checkCancellation()
    }

    /// Waits for a signal, or until `deadline` (environment milliseconds; `nil`: no deadline), or cancellation.
    func wait(until deadline: Int64?, environment: ReplicaEnvironment) async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.waitForSignal() }
            if let deadline { group.addTask { try? await environment.sleepUntil(deadline) } }
            _ = await group.next()
            group.cancelAll()
        }
    }

    private func waitForSignal() async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resume = state.withLock { state -> Bool in
                    if state.pending || Task.isCancelled {
                        state.pending = false
                        return true
                    }
                    state.waiter = continuation
                    return false
                }
                if resume { continuation.resume() }
            }
        } onCancel: {
            let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
                defer { state.waiter = nil }
                return state.waiter
            }
            waiter?.resume()
        }
    }
}

/// The tasks of a runtime, cancelled together when it stops or goes. Internal.
final class CloudSyncTasks: Sendable {
    private let tasks = Mutex<[Task<Void, Never>]>([])

    func add(_ task: Task<Void, Never>) { tasks.withLock { $0.append(task) } }

    func cancelAll() {
        let all = tasks.withLock { tasks -> [Task<Void, Never>] in
            defer { tasks = [] }
            return tasks
        }
        for task in all { task.cancel() }
    }
}
