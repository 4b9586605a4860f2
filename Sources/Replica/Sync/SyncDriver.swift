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
        var pass = SyncPass(maxRequests: maxRequests, deadline: deadline, sleepsThroughBackoff: true, isAutomatic: false)
        let end = try await drive(engine, with: database, pass: &pass)
        let status = try engine.status()
        if case .idle = end, engine.completedSync(status) { try engine.recordSync(at: environment.now()) }
        return status
    }

    /// Runs `pass` (see ``SyncPass``) against `database`: the request loop behind
    /// ``syncUntilIdle(_:with:maxRequests:timeoutMilliseconds:isolation:)`` and the sync runtime (``CloudSync``).
    /// Performs requests until the engine is idle, the deadline passes, the request bound is reached or
    /// `shouldContinue` returns `false`; through backoffs it sleeps (``SyncPass/sleepsThroughBackoff``) or returns.
    /// `observe` sees each request and its result after the engine handled it.
    @discardableResult
    static func drive(
        _ engine: SyncEngine, with database: any CloudDatabase, pass: inout SyncPass,
        isolation: isolated (any Actor)? = #isolation, shouldContinue: (SyncPass) -> Bool = { _ in true },
        observe: (SyncRequest, Result<CloudOperationResult, CloudError>) throws -> Void = { _, _ in },
        willSleep: () -> Void = {}
    ) async throws -> SyncPass.End {
        let environment = engine.container.environment
        while true {
            switch try pass.next(engine, shouldContinue: shouldContinue(pass), cancelled: Task.isCancelled) {
            case let .perform(request):
                let result = await database.perform(request.operation)
                try engine.handle(request.id, result)
                try observe(request, result)
            case let .sleep(milliseconds):
                willSleep()
                try await environment.sleep(milliseconds)
            case let .end(end):
                return end
            }
        }
    }
}
