import Foundation

/// Runs a ``SyncEngine`` against a ``CloudDatabase``: performs each request the engine emits, hands back the
/// response, and waits (through ``ReplicaEnvironment/sleep``) while the engine backs off.
public enum SyncDriver {
    /// Syncs until the engine has nothing left to do: the zone's changes are read and the outbox is empty, or only
    /// records the cloud rejected remain. Transient errors (network, quota, rate limit, zone busy, service
    /// unavailable) are retried after the engine's backoff — but never past `timeout`.
    ///
    /// The call runs on the caller's isolation (`isolation`, filled in by `#isolation`), so an engine held by a
    /// `@MainActor` object or by an `actor` can be passed without sending it to another domain. Waiting happens
    /// through ``ReplicaEnvironment/sleep`` and time is read through ``ReplicaEnvironment/clock`` only, so a
    /// simulated clock drives the bound deterministically.
    ///
    /// - Parameters:
    ///   - engine: the engine (confined to the caller's isolation).
    ///   - database: the cloud database.
    ///   - maxRequests: a safety bound on the number of requests (guards against a cloud that never settles).
    ///   - timeout: the longest time to keep working, in milliseconds of the environment's clock; `nil` waits
    ///     through every backoff (the behaviour before the bound existed). When the engine backs off and its wake
    ///     time lies at or past the deadline, the call returns at once instead of sleeping: the returned status
    ///     then shows the transient problem in ``SyncStatus/lastError``. A request already in flight is finished.
    ///   - isolation: the caller's actor; leave the default.
    /// - Returns: the engine's status at the end.
    /// - Throws: ``ReplicaError/incompatibleSchema(_:)`` when the zone's schema contradicts this device's (nothing
    ///   is sent; ``SyncEngine/status()`` reports it as `blockedBy`), ``SQLiteError`` from the local store, or
    ///   `CancellationError`.
    @discardableResult
    public static func syncUntilIdle(
        _ engine: SyncEngine, with database: any CloudDatabase, maxRequests: Int = 10_000,
        timeoutMilliseconds timeout: Int64? = nil, isolation: isolated (any Actor)? = #isolation
    ) async throws -> SyncStatus {
        let environment = engine.container.environment
        let deadline = timeout.map { environment.clock.nowMilliseconds() &+ max(0, $0) }
        engine.setNeedsFetch()
        let end = try await drive(engine, with: database, maxRequests: maxRequests, deadline: deadline, sleepsThroughBackoff: true)
        let status = try engine.status()
        if case .idle = end, engine.completedSync(status) { try engine.recordSync(at: environment.now()) }
        return status
    }

    /// How a run of ``drive(_:with:maxRequests:deadline:sleepsThroughBackoff:isolation:shouldContinue:observe:)`` ended.
    enum DriveEnd {
        /// The engine has nothing to do.
        case idle
        /// The engine backs off (or waits for another engine's lease) until this time.
        case waiting(until: Int64)
        /// The deadline passed, `maxRequests` were performed, or `shouldContinue` said stop.
        case stopped
    }

    /// The request loop behind ``syncUntilIdle(_:with:maxRequests:timeoutMilliseconds:isolation:)`` and the sync
    /// runtime (``CloudSync``): performs requests until the engine is idle, the deadline passes, `maxRequests` were
    /// performed or `shouldContinue` returns `false`; through backoffs it sleeps (`sleepsThroughBackoff`) or returns.
    /// `observe` sees each request and its result after the engine handled it.
    @discardableResult
    static func drive(
        _ engine: SyncEngine, with database: any CloudDatabase, maxRequests: Int, deadline: Int64?, sleepsThroughBackoff: Bool,
        isolation: isolated (any Actor)? = #isolation, shouldContinue: () -> Bool = { true },
        observe: (SyncRequest, Result<CloudOperationResult, CloudError>) throws -> Void = { _, _ in }
    ) async throws -> DriveEnd {
        let environment = engine.container.environment
        var performed = 0
        while performed < maxRequests, shouldContinue() {
            try Task.checkCancellation()
            if let deadline, environment.clock.nowMilliseconds() >= deadline { return .stopped }
            if let request = try engine.nextRequest() {
                performed += 1
                let result = await database.perform(request.operation)
                try engine.handle(request.id, result)
                try observe(request, result)
                continue
            }
            guard let wake = engine.wakeTime else { return .idle }
            if !sleepsThroughBackoff { return .waiting(until: wake) }
            if let deadline, wake >= deadline { return .stopped }
            try await environment.sleep(max(1, wake - environment.clock.nowMilliseconds()))
        }
        return .stopped
    }
}
