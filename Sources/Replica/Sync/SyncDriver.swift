import Foundation
import Synchronization

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
    ///     then shows the transient problem in ``SyncStatus/lastError``. A request still in flight at the deadline
    ///     (a stalled connection, a cloud file locked by another process) is not waited for: its answer is dropped,
    ///     the engine counts it as lost (``SyncEngine/abandon(_:)``) and the call returns.
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

    /// Runs `pass` (see `SyncPass`) against `database`: the request loop behind
    /// ``syncUntilIdle(_:with:maxRequests:timeoutMilliseconds:isolation:)`` and the sync runtime (``CloudSync``).
    /// Performs requests until the engine is idle, the deadline passes, the request bound is reached or
    /// `shouldContinue` returns `false`; through backoffs it sleeps (`SyncPass/sleepsThroughBackoff`) or returns.
    /// `observe` sees each request and its result after the engine handled it.
    @discardableResult
    static func drive(
        _ engine: SyncEngine, with database: any CloudDatabase, pass: inout SyncPass,
        isolation: isolated (any Actor)? = #isolation, shouldContinue: (SyncPass) -> Bool = { _ in true },
        observe: (SyncRequest, Result<CloudOperationResult, CloudError>) throws -> Void = { _, _ in },
        willSleep: () -> Void = {},
        sleep: ((Int64) async throws -> Void)? = nil
    ) async throws -> SyncPass.End {
        let environment = engine.container.environment
        while true {
            switch try pass.next(engine, shouldContinue: shouldContinue(pass), cancelled: Task.isCancelled) {
            case let .perform(request):
                let result: Result<CloudOperationResult, CloudError>
                switch await perform(request.operation, on: database, until: pass.requestDeadline(engine), environment: environment) {
                case let .answered(answer):
                    result = answer
                case .deadlinePassed:
                    // The bound passed with the request in flight: its answer is dropped and the engine counts it as
                    // lost (the pass decides: the simulator calls the same code when its request outlives the bound).
                    let end = try pass.deadlinePassed(engine: engine, request: request.id)
                    try observe(request, .failure(.networkUnavailable))
                    return end
                }
                try engine.handle(request.id, result)
                try observe(request, result)
            case let .sleep(milliseconds):
                willSleep()
                if let sleep { try await sleep(milliseconds) } else { try await environment.sleep(milliseconds) }
            case let .end(end):
                return end
            }
        }
    }

    /// How a request ended for its caller.
    enum RequestOutcome: Sendable {
        /// The cloud answered.
        case answered(Result<CloudOperationResult, CloudError>)
        /// The deadline came first.
        case deadlinePassed
    }

    /// Performs `operation` on `database`, waiting at most until `deadline` (environment milliseconds; `nil`: as long
    /// as it takes). When the deadline comes first, the request is cancelled and its answer, should one still come,
    /// dropped: a cloud that never answers does not hold up a bounded call. Cancelling the caller's task does not
    /// cancel the request: its answer is waited for (within the deadline) and handled, as ``CloudSync/stop()`` and a
    /// cancelled ``CloudSync/syncNow(timeoutMilliseconds:)`` promise — a cloud that fails a cancelled request (as one
    /// over `URLSession` does) would otherwise be read as the network being down, and the engine would back off.
    static func perform(_ operation: CloudOperation, on database: any CloudDatabase, until deadline: Int64?,
                        environment: ReplicaEnvironment) async -> RequestOutcome {
        // In a task of its own, so that the caller's cancellation does not reach the request.
        guard let deadline else { return .answered(await Task { await database.perform(operation) }.value) }
        if environment.clock.nowMilliseconds() >= deadline { return .deadlinePassed }
        let race = FirstAnswer<RequestOutcome>()
        let work = Task { race.answer(.answered(await database.perform(operation))) }
        let timer = Task {
            try? await environment.sleepUntil(deadline)
            if !Task.isCancelled { race.answer(.deadlinePassed) }
        }
        let outcome = await race.value()
        timer.cancel()
        if case .answered = outcome {} else { work.cancel() }
        return outcome
    }
}

/// The first of several answers, for one waiter: later answers are dropped.
final class FirstAnswer<Value: Sendable>: Sendable {
    private enum State {
        case waiting(CheckedContinuation<Value, Never>?)
        case answered(Value)
        case delivered
    }

    private let state = Mutex<State>(.waiting(nil))

    /// Gives `value` to the waiter unless an answer came first.
    func answer(_ value: Value) {
        let waiter = state.withLock { state -> CheckedContinuation<Value, Never>? in
            guard case let .waiting(waiter) = state else { return nil }
            if let waiter {
                state = .delivered
                return waiter
            }
            state = .answered(value)
            return nil
        }
        waiter?.resume(returning: value)
    }

    /// The first answer (waits for it; call once).
    func value() async -> Value {
        await withCheckedContinuation { continuation in
            let ready = state.withLock { state -> Value? in
                switch state {
                case let .answered(value):
                    state = .delivered
                    return value
                case .waiting:
                    state = .waiting(continuation)
                    return nil
                case .delivered:
                    preconditionFailure("FirstAnswer.value() called twice")
                }
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }
}
