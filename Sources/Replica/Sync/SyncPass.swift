import Foundation

/// One sync pass as a state machine without I/O: performs the engine's requests until it is idle, backs off (an
/// automatic pass returns then; an explicit one sleeps through the backoff), the deadline passes, the request bound is
/// reached or the caller says stop. ``SyncDriver`` and ``CloudSync`` run it against a ``CloudDatabase``; the simulator
/// runs it through its simulated network.
@_spi(Simulation) public struct SyncPass: Sendable {
    /// How a pass ended.
    public enum End: Sendable, Hashable {
        /// The engine has nothing to do.
        case idle
        /// The engine backs off (or waits for another engine's lease) until this time.
        case waiting(until: Int64)
        /// The deadline passed, the request bound was reached or the caller said stop.
        case stopped
    }

    /// What the caller does next.
    public enum Step: Sendable {
        /// Perform this request, hand its result to the engine (``SyncEngine/handle(_:_:)``), then ask again.
        case perform(SyncRequest)
        /// Wait this many milliseconds (the engine's backoff, within the deadline), then ask again.
        case sleep(milliseconds: Int64)
        /// The pass is over.
        case end(End)
    }

    /// The most requests the pass performs.
    public let maxRequests: Int
    /// The environment time the pass stops at (`nil`: none). Moved back with the clock when the clock goes back (see
    /// ``next(_:shouldContinue:cancelled:)``).
    public private(set) var deadline: Int64?
    /// When the pass last looked at the clock, plus the sleep it asked for since.
    private var observed: Int64?
    /// Whether the pass sleeps through the engine's backoff (within the deadline) instead of ending.
    public let sleepsThroughBackoff: Bool
    /// An automatic pass (scheduled by the runtime) rather than an explicit one.
    public let isAutomatic: Bool
    /// Requests performed so far.
    public private(set) var performed = 0

    /// A pass that performs at most `maxRequests` requests, until `deadline` (environment milliseconds; `nil`: none).
    public init(maxRequests: Int, deadline: Int64?, sleepsThroughBackoff: Bool, isAutomatic: Bool) {
        self.maxRequests = maxRequests
        self.deadline = deadline
        self.sleepsThroughBackoff = sleepsThroughBackoff
        self.isAutomatic = isAutomatic
    }

    /// The next step (call it first, and again after each request's result was handled or each sleep).
    /// - Parameters:
    ///   - shouldContinue: whether the caller lets the pass go on.
    ///   - cancelled: whether the caller's task is cancelled (checked when the pass would go on).
    /// - Throws: `CancellationError`; as ``SyncEngine/nextRequest()``.
    ///
    /// The deadline is a wall-clock instant, but a clock that goes back never stretches the bound by the size of the jump:
    /// when the clock reads earlier than the pass last saw it (plus the sleep it asked for since), the deadline moves
    /// back with it, keeping the time that was left then — as the engine re-anchors its waits (P4). (The time a request
    /// in flight took before the jump is not known, so the bound may stretch by that much.)
    public mutating func next(_ engine: SyncEngine, shouldContinue: Bool, cancelled: Bool = false) throws -> Step {
        // Cancellation first: a caller whose task was cancelled gets CancellationError even when the pass would have
        // stopped anyway (stop() called meanwhile).
        if cancelled && !engine.container.environment.canaries.contains(.cancelledSyncNowGoesOn) { throw CancellationError() }
        guard performed < maxRequests, shouldContinue else { return .end(.stopped) }
        // Another process's lease is read again at every step (it may have been given up since).
        engine.endLeaseWait()
        let clock = engine.container.environment.clock
        let now = clock.nowMilliseconds()
        if let seen = observed, now < seen, let old = deadline { deadline = now &+ max(0, old &- seen) }
        observed = now
        if let deadline, now >= deadline { return .end(.stopped) }
        if let request = try engine.nextRequest() {
            performed += 1
            return .perform(request)
        }
        guard let wake = engine.wakeTime else { return .end(.idle) }
        if !sleepsThroughBackoff { return .end(.waiting(until: wake)) }
        if let deadline, wake >= deadline { return .end(.stopped) }
        var duration = max(1, wake - clock.nowMilliseconds())
        if engine.isWaitingForLease { duration = min(duration, Self.leaseRecheckMilliseconds(engine)) }
        observed = clock.nowMilliseconds() &+ duration
        return .sleep(milliseconds: duration)
    }

    /// Until when the caller waits for the answer to a request of the pass (environment milliseconds; `nil`: until it
    /// comes): the pass's deadline. When the deadline comes first, the caller calls
    /// ``deadlinePassed(engine:request:)`` and drops the answer, should one still come.
    public func requestDeadline(_ engine: SyncEngine) -> Int64? {
        engine.container.environment.canaries.contains(.syncNowWaitsForRequest) ? nil : deadline
    }

    /// The pass's deadline passed with `request` (its id) in flight: the pass does not wait for the answer. The engine
    /// counts the request as lost (``SyncEngine/abandon(_:)``: a late answer of it is ignored; a save the cloud applied
    /// comes back as a change-tag conflict, which merges: P3) and the pass ends — stopped. The caller reports the
    /// request's result as `CloudError.networkUnavailable`.
    /// - Throws: as ``SyncEngine/handle(_:_:)``.
    public func deadlinePassed(engine: SyncEngine, request: UInt64) throws -> End {
        try engine.abandon(request)
        return .stopped
    }

    /// How often a runtime reads another process's upload lease again while it waits for it: a tenth of the lease
    /// duration (3 s by default).
    static func leaseRecheckMilliseconds(_ engine: SyncEngine) -> Int64 {
        max(1, engine.options.leaseDurationMilliseconds / 10)
    }
}
