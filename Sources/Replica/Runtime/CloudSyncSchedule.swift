import Foundation

/// The decisions of the sync runtime (``CloudSync``), without I/O and without waiting: when a pass is due (debounced
/// local saves, cloud announcements, the polled change counter, the timer, the engine's retry time), what a pass does
/// first (fetch or not; an explicit sync ends the engine's own backoff), whether it goes on after each request, what it
/// leaves for later, and the state the runtime reports.
///
/// ``CloudSync`` makes every scheduling decision through one value of this type and does only the waiting and the
/// cloud I/O itself; the simulator drives the same value per simulated app process in virtual time, so the seeds
/// search the runtime's real decision code. Times are milliseconds of the environment's clock
/// (``ReplicaEnvironment/clock``), passed in by the caller: the schedule never reads a clock.
///
/// A caller holds at most one pass at a time (``CloudSync`` serialises passes and the calls that touch the engine).
@_spi(Simulation) public struct CloudSyncSchedule: Sendable {
    /// The runtime's options.
    public let options: CloudSync.Options
    /// Deliberate runtime bugs switched on for simulator canary runs (see ``Canary``).
    let canaries: Set<Canary>
    /// The state as last reported.
    public private(set) var state: CloudSyncState = .idle
    /// `true` while automatic syncing is paused.
    public private(set) var isPaused = false
    /// `true` once the runtime is stopping or stopped.
    public private(set) var isStopped = false
    private var passRequested = true
    private var fetchRequested = true
    private var firstLocalChange: Int64?
    private var lastLocalChange: Int64?
    private var nextTimer: Int64?
    private var nextPoll: Int64?
    private var cloudCounter: Int64?
    /// When the engine wants to be woken (its backoff or lease wait), after a pass that left work.
    private var retryAt: Int64?

    /// A schedule in its first state: a pass (with a fetch) is due at once — or, with ``CloudSync/Options/startsPaused``,
    /// at ``resume()``.
    /// - Parameters:
    ///   - options: the runtime's options.
    ///   - canaries: deliberate bugs for simulator canary runs (the environment's ``ReplicaEnvironment/canaries``).
    public init(options: CloudSync.Options, canaries: Set<Canary> = []) {
        self.options = options
        self.canaries = canaries
        if options.startsPaused {
            isPaused = true
            state = .paused
        }
    }

    // MARK: Triggers

    /// A local save, or another process's commit to an app-group store, at `savedAt` (`nil`: now), noted at `now`.
    /// The debounced pass is due ``CloudSync/Options/debounceMilliseconds`` after the last save of a burst, at most ten
    /// intervals after its first.
    public mutating func noteLocalChange(savedAt: Int64?, now: Int64) {
        let time = min(savedAt ?? now, now)
        if firstLocalChange == nil { firstLocalChange = time }
        lastLocalChange = time
    }

    /// The cloud announced a change of the zone: a pass with a fetch is due at once.
    public mutating func noteCloudChange() { requestPass() }

    /// A pass with a fetch is due at once (a full refetch, a key change or a zone deletion's answer asked for one).
    public mutating func requestPass() {
        passRequested = true
        fetchRequested = true
    }

    /// Pauses automatic syncing. Returns the state to report, if it changed.
    public mutating func pause() -> CloudSyncState? {
        guard !isStopped, !isPaused else { return nil }
        isPaused = true
        return setState(.paused)
    }

    /// Resumes automatic syncing with a pass (and a fetch) at once. Returns the state to report, if it changed.
    public mutating func resume() -> CloudSyncState? {
        guard !isStopped, isPaused else { return nil }
        isPaused = false
        requestPass()
        return setState(.idle)
    }

    /// Marks the runtime stopping: no automatic pass starts or goes on. Returns `false` when it was already stopped.
    public mutating func beginStop() -> Bool {
        guard !isStopped else { return false }
        isStopped = true
        return true
    }

    /// The runtime gave up its lease and ended. Returns the state to report, if it changed.
    public mutating func finishStop() -> CloudSyncState? { setState(.stopped) }

    // MARK: Scheduling

    /// Whether an automatic pass is due at `now`. Reads the cloud's change counter (`changeCounter`) when its polling
    /// interval has come round; starts the timer on first use.
    /// - Complexity: O(1), plus one `changeCounter` call at most.
    public mutating func passIsDue(now time: Int64, changeCounter: () -> Int64?) -> Bool {
        if isStopped || isPaused { return false }
        if nextTimer == nil, let interval = options.timerMilliseconds { nextTimer = time &+ max(1, interval) }
        if let interval = options.cloudPollingMilliseconds {
            if let poll = nextPoll {
                if time >= poll {
                    if let counter = changeCounter(), counter != cloudCounter {
                        if cloudCounter != nil { requestPass() }
                        cloudCounter = counter
                    }
                    nextPoll = time &+ max(1, interval)
                }
            } else if changeCounter() != nil {
                nextPoll = time &+ max(1, interval)
            }
        }
        var due = passRequested
        if let timer = nextTimer, time >= timer {
            due = true
            fetchRequested = true
        }
        if let localDeadline, time >= localDeadline { due = true }
        if let retryAt, time >= retryAt { due = true }
        return due
    }

    /// When to look again (``passIsDue(now:changeCounter:)``), in environment milliseconds; `nil`: only when a trigger
    /// arrives. While a pass (or another call holding the engine) is under way the answer is `nil` too: its end is
    /// such a trigger, and a deadline that passed meanwhile must not make the caller look again and again.
    public func nextWake(passUnderWay: Bool) -> Int64? {
        if isStopped || isPaused || passUnderWay { return nil }
        return [localDeadline, nextTimer, nextPoll, retryAt].compactMap { $0 }.min()
    }

    /// When the debounced pass for local saves is due.
    public var localDeadline: Int64? {
        guard let first = firstLocalChange, let last = lastLocalChange else { return nil }
        let debounce = max(0, options.debounceMilliseconds)
        return min(last &+ debounce, first &+ debounce &* 10)
    }

    /// Whether anything but the timer (and polling) will make a pass due: a request for one, unsynced saves, or a
    /// retry time.
    public var hasPendingWork: Bool { passRequested || firstLocalChange != nil || retryAt != nil }

    /// What ``hasPendingWork`` stands for, for messages.
    public var pendingWorkDescription: String {
        var parts: [String] = []
        if passRequested { parts.append("a pass requested") }
        if let localDeadline { parts.append("saves due at \(localDeadline)") }
        if let retryAt { parts.append("a retry at \(retryAt)") }
        return parts.joined(separator: ", ")
    }

    // MARK: Passes

    /// Starts a pass at `now`: automatic (`deadline` `nil`; returns at the engine's backoff) or explicit
    /// (``CloudSync/syncNow(timeoutMilliseconds:)``: fetches, ends the engine's own backoff, sleeps through the rest
    /// until `deadline`). Returns the pass and the state to report, if it changed.
    public mutating func beginPass(explicit: Bool, deadline: Int64?, engine: SyncEngine, now started: Int64) -> (SyncPass, CloudSyncState?) {
        if explicit {
            engine.setNeedsFetch()
            // Asked for explicitly: a backoff of ours left by an outage does not delay it (a server's retry-after does).
            if !canaries.contains(.syncNowWaitsForBackoff) { engine.endOwnBackoff() }
        }
        let fetches = explicit || fetchRequested
        if fetches { engine.setNeedsFetch() }
        passRequested = false
        fetchRequested = false
        firstLocalChange = nil
        lastLocalChange = nil
        retryAt = nil
        if let interval = options.timerMilliseconds, fetches { nextTimer = started &+ max(1, interval) }
        let change = engine.wakeTime == nil ? setState(.syncing) : nil
        let pass = SyncPass(maxRequests: max(1, options.maxRequestsPerPass), deadline: deadline, sleepsThroughBackoff: explicit,
                            isAutomatic: !explicit)
        return (pass, change)
    }

    /// Whether `pass` goes on to its next request: no pass goes on once the runtime is stopping (``CloudSync/stop()``
    /// waits only for the request in flight); an automatic pass also stops when the runtime is paused, and when an
    /// explicit sync waits for the engine (`explicitCallWaiting`): a ``CloudSync/syncNow(timeoutMilliseconds:)``
    /// waits for a pass under way only as long as its request, then does the work itself within its bound.
    public func shouldContinue(_ pass: SyncPass, explicitCallWaiting: Bool) -> Bool {
        !isStopped && (!pass.isAutomatic || (!isPaused && !explicitCallWaiting))
    }

    /// Whether an explicit sync that got the engine may start its pass: not once the runtime is stopping (a
    /// ``CloudSync/syncNow(timeoutMilliseconds:)`` that waited for a pass under way when ``CloudSync/stop()`` was
    /// called performs nothing).
    public var mayBeginExplicitPass: Bool { !isStopped }

    /// The pass sleeps through the engine's wait (an explicit pass, within its bound). Returns the state to report, if
    /// it changed: the wait shows at once — also one the engine had before the pass began (another process's lease).
    public mutating func notePassSleeps(engine: SyncEngine) -> CloudSyncState? {
        guard engine.wakeTime != nil else { return nil }
        return setState(engine.lastError == .networkUnavailable && !engine.isWaitingForLease ? .waitingForNetwork : .waitingToRetry)
    }

    /// The engine handled `result` of a request of the pass. Returns the state to report, if it changed: a transient
    /// failure that leaves the engine backing off is reported at once, not only when the pass ends.
    public mutating func noteResult(_ result: Result<CloudOperationResult, CloudError>, engine: SyncEngine) -> CloudSyncState? {
        guard case let .failure(error) = result else { return nil }
        if case .partialFailure = error { return nil }
        guard error.isTransient, engine.wakeTime != nil else { return nil }
        return setState(error == .networkUnavailable ? .waitingForNetwork : .waitingToRetry)
    }

    /// The outcome of a pass that ended.
    public struct PassOutcome: Sendable {
        /// The engine's status at the end.
        public var status: SyncStatus
        /// When the pass brought the store up to date with the cloud: the sync time recorded in the store.
        public var synced: Date?
        /// The state to report, if it changed.
        public var state: CloudSyncState?
    }

    /// Ends `pass` (it ended with `end` at `now`): notes when to retry, records a completed sync in the store and
    /// settles the state.
    /// - Parameter changeCounter: the cloud's change counter (read when polling is on).
    /// - Throws: ``SQLiteError`` when the store cannot be read or written.
    public mutating func endPass(_ pass: SyncPass, _ end: SyncPass.End, engine: SyncEngine, now: Int64,
                                 changeCounter: () -> Int64?) throws -> PassOutcome {
        let status = try engine.status()
        switch end {
        case let .waiting(until):
            // Another process's lease is looked at again well before the expiry this engine saw: that process gives
            // it up when its pass ends with nothing left.
            retryAt = engine.isWaitingForLease ? min(until, now &+ SyncPass.leaseRecheckMilliseconds(engine)) : until
        case .stopped:
            // Stopped with work left — by a syncNow's bound, the request bound, or a pause or stop: automatic
            // scheduling goes on with it (at once, or when the engine's wait ends), not only at the next trigger.
            if !isPaused && !isStopped { retryAt = engine.wakeTime ?? now }
        case .idle:
            // Nothing left to upload: the upload lease goes, so another process of an app group need not wait for it
            // to expire at its next pass (P6).
            engine.releaseLease()
        }
        if retryAt == nil, let wake = engine.wakeTime { retryAt = wake }
        var synced: Date?
        if case .idle = end, engine.completedSync(status) {
            synced = try engine.recordSync(at: engine.container.environment.now())
        }
        if let interval = options.cloudPollingMilliseconds, interval > 0 { cloudCounter = changeCounter() }
        return PassOutcome(status: status, synced: synced, state: settle(status, engine: engine, now: now))
    }

    /// A pass failed with an error the engine threw (not a cloud error): the runtime is blocked until the next trigger.
    /// Returns the state to report, if it changed.
    public mutating func passFailed() -> CloudSyncState? {
        retryAt = nil
        return setState(.blocked)
    }

    private mutating func settle(_ status: SyncStatus, engine: SyncEngine, now: Int64) -> CloudSyncState? {
        if isStopped { return setState(.stopped) }
        if isPaused { return setState(.paused) }
        if status.blockedBy != nil || engine.blockingEncryptionError != nil || status.zoneDeletion != nil { return setState(.blocked) }
        if engine.wakeTime != nil, let error = status.lastError {
            return setState(error == .networkUnavailable ? .waitingForNetwork : .waitingToRetry)
        }
        if engine.wakeTime != nil { return setState(.waitingToRetry) }
        // Another pass follows at once (this one stopped with work left): still syncing, not idle.
        if let retryAt, retryAt <= now { return setState(.syncing) }
        return setState(.idle)
    }

    private mutating func setState(_ new: CloudSyncState) -> CloudSyncState? {
        guard new != state else { return nil }
        state = new
        return new
    }
}

