// Simulated apps that sync through the sync runtime (scenarios with "runtime"): each synced store of each process has a
// `CloudSyncSchedule` — the decision code of the library's `CloudSync` actor — driven here in virtual time, instead of
// the simulator's own request loop (`pump`). Local saves, push notifications (the cloud's announcements) and the timer
// reach the schedule as they reach `CloudSync`; its passes (`SyncPass`, the state machine behind `SyncDriver`) send
// the engine's requests through the simulated network and cloud; the workload calls `syncNow(timeoutMilliseconds:)`,
// stops a runtime (and starts a new one later), pauses and resumes it. What `CloudSync` does with actor and tasks —
// one pass at a time (its run), callers waiting for the run in order, waits until a clock time — is modelled here
// event by event:
//
// - a pass holds the run from its start to its end; `syncNow` and `stop` calls that arrive meanwhile wait in order;
// - between passes the runtime asks its schedule whether a pass is due and when to look again, and sleeps until then
//   (a wake-up event at the device-clock time, re-armed if a backward clock jump makes it early);
// - an explicit pass that sleeps through the engine's backoff sleeps for the duration it asked for (a relative sleep,
//   as `ReplicaEnvironment.sleep` is: a clock jump does not move its end);
// - an explicit pass whose request is still in flight at its deadline (on the device's clock) gives it up there, as
//   `SyncDriver` does when its timer wins the race with the request: a wake-up event at the deadline calls
//   `SyncPass.deadlinePassed` (the engine abandons the request; the pass ends stopped), and the answer, should it
//   still come, is ignored as a timed-out request's is.
//
// Invariants of the runtime (checked as the run goes): `sync-now-bound` (a bounded syncNow returns within its bound
// in true time — whatever its pass was doing: a request in flight at the bound is not waited for; no request is sent
// for it, or while it waits, after its bound — and, unless the server's retry-after or another process's lease is
// waited out, its first request goes out at once), `runtime-state` (the state reported is
// never idle or syncing while the engine backs off, never idle after a pass that left sendable records, and a runtime
// sends nothing once stop() was called but the request it had in flight), and, at quiesce, `liveness` (with no syncNow
// after heal, every runtime reaches idle with nothing left to send).

import Foundation
@_spi(Simulation) import Replica

extension Scenario {
    /// The sync runtime's options and the workload's calls on it, in a scenario whose simulated apps sync through the
    /// runtime (``Scenario/runtime``).
    public struct Runtime: Codable, Hashable, Sendable {
        /// `CloudSync/Options/debounceMilliseconds`.
        public var debounceMs = 300
        /// `CloudSync/Options/timerMilliseconds` (the liveness check after heal waits for one timer period, so
        /// the timer is on).
        public var timerMs = 60_000
        /// Per chaos step: the app calls `syncNow(timeoutMilliseconds:)` on one process's runtime, with a bound drawn
        /// from 0 … `maxSyncNowMs`.
        public var syncNow = 0.0
        /// The longest bound of a workload's `syncNow`, in milliseconds.
        public var maxSyncNowMs = 10_000
        /// Per chaos step: the app stops one process's runtime (`stop()`, perhaps mid-pass) and starts a new one up to
        /// `timing.restartMs` later.
        public var stop = 0.0
        /// Per chaos step: the app pauses one process's runtime for up to `timing.outageMs`, then resumes it.
        public var pause = 0.0
        /// Per chaos step: the app cancels the task awaiting one process's `syncNow` (the one whose pass runs, or else
        /// the oldest still waiting for the engine), as a view that goes away cancels its task.
        public var cancel = 0.0

        public init() {}

        /// The runtime options a simulated app gives `CloudSync` (polling off: the cloud's announcements are the
        /// simulator's push notifications).
        var options: CloudSync.Options {
            var options = CloudSync.Options()
            options.debounceMilliseconds = Int64(debounceMs)
            options.timerMilliseconds = Int64(timerMs)
            options.cloudPollingMilliseconds = nil
            return options
        }

        /// Per-step rates, in the order of the chaos actions after the faults'.
        var stepRates: [Double] { [syncNow, stop, pause, cancel] }

        static var rateFields: [(String, WritableKeyPath<Runtime, Double>)] {
            [("syncNow", \.syncNow), ("stop", \.stop), ("pause", \.pause), ("cancel", \.cancel)]
        }
        static var intFields: [(String, WritableKeyPath<Runtime, Int>, ClosedRange<Int>)] { [
            ("debounceMs", \.debounceMs, 0...600_000), ("timerMs", \.timerMs, 1_000...3_600_000), ("maxSyncNowMs", \.maxSyncNowMs, 0...600_000),
        ] }
    }
}

extension Scenario.Runtime {
    /// Rates added after traces with runtimes were saved: encoded only when not 0, so those traces keep their
    /// scenario hash, and read as 0 when absent.
    static var optionalRates: Set<String> { ["cancel"] }

    /// Decodes the canonical form: the rates added later default to 0.
    public init(from decoder: any Decoder) throws {
        self.init()
        let container = try decoder.container(keyedBy: ScenarioJSONKey.self)
        for (key, field, _) in Self.intFields { self[keyPath: field] = try container.decode(Int.self, forKey: ScenarioJSONKey(key)) }
        for (key, field) in Self.rateFields {
            if Self.optionalRates.contains(key) {
                if let value = try container.decodeIfPresent(Double.self, forKey: ScenarioJSONKey(key)) { self[keyPath: field] = value }
            } else {
                self[keyPath: field] = try container.decode(Double.self, forKey: ScenarioJSONKey(key))
            }
        }
    }

    /// Encodes every field, except the later rates while they are 0.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: ScenarioJSONKey.self)
        for (key, field, _) in Self.intFields { try container.encode(self[keyPath: field], forKey: ScenarioJSONKey(key)) }
        for (key, field) in Self.rateFields where !Self.optionalRates.contains(key) || self[keyPath: field] != 0 {
            try container.encode(self[keyPath: field], forKey: ScenarioJSONKey(key))
        }
    }
}

extension ScenarioReader {
    func runtime(_ value: Any, _ path: String) throws(ScenarioError) -> Scenario.Runtime {
        let ints = Scenario.Runtime.intFields, rates = Scenario.Runtime.rateFields
        let object = try self.object(value, path, allowed: ints.map(\.0) + rates.map(\.0))
        var runtime = Scenario.Runtime()
        for (key, field, _) in ints { if let raw = object[key] { runtime[keyPath: field] = try integer(raw, join(path, key)) } }
        for (key, field) in rates { if let raw = object[key] { runtime[keyPath: field] = try number(raw, join(path, key)) } }
        return runtime
    }
}

extension ScenarioChecker {
    /// The runtime's numbers are in range, and its per-step rates leave room for the workload with the faults'.
    func runtime(_ scenario: Scenario) throws(ScenarioError) {
        guard let runtime = scenario.runtime else { return }
        for (key, field, limits) in Scenario.Runtime.intFields { try range(runtime[keyPath: field], "runtime.\(key)", limits) }
        for (key, field) in Scenario.Runtime.rateFields { try range(runtime[keyPath: field], "runtime.\(key)", Scenario.Limits.rate) }
        let limit = Scenario.Limits.ratesSum
        if (scenario.faults.stepRates + runtime.stepRates).reduce(0, +) > limit {
            throw fail("runtime", "the per-step fault rates and the runtime's (syncNow, stop, pause, cancel) add up to more than \(limit)")
        }
        if scenario.workload.reopen > 0 || scenario.devices.contains(where: { $0.upgrade != nil }) {
            throw fail("runtime", "simulated runtimes are not combined with reopened containers or app updates during the run")
        }
    }
}

/// A `syncNow(timeoutMilliseconds:)` call of the workload.
struct SyncNowCall {
    let serial: Int
    /// Virtual time of the call.
    let calledAt: Int64
    let timeout: Int64
    /// The bound on the device's clock (what the runtime works with).
    let deadline: Int64
    /// Allowance for backward clock jumps of the device while the call was pending: the runtime keeps the time that was
    /// left when it last looked at the clock, so the time a request in flight took before the jump is added (at most
    /// one time-out per jump).
    var slack: Int64 = 0
    /// The bound in true (virtual) time (what the invariant holds it to).
    var trueDeadline: Int64 { calledAt + timeout + slack }
    /// The app cancelled the task awaiting the call while its pass runs (the pass ends stopped as soon as it would go
    /// on: after the answer to a request in flight; at once while it sleeps through a backoff), or before it got the
    /// free engine (it returns without a pass).
    var cancelled = false
}

/// A call waiting for a runtime's run (the actor's `acquireRun`), in order.
enum RunWaiter {
    case syncNow(SyncNowCall)
    case stop
}

/// The sync runtime of one synced store of one simulated app process (see the file comment).
final class SimRuntime {
    var schedule: CloudSyncSchedule
    /// The pass under way (it holds the run).
    var pass: SyncPass?
    /// The call the pass under way serves (`nil`: an automatic pass).
    var passCall: SyncNowCall?
    /// The explicit pass sleeps through the engine's backoff until this virtual time.
    var resumeAt: Int64?
    /// Calls waiting for the run, in order.
    var waiters: [RunWaiter] = []
    /// Virtual time of the wake-up event armed last (older ones are moot).
    var wakeAt: Int64?
    /// Virtual time `stop()` was called.
    var stopCalledAt: Int64?
    /// How long after stopping the app starts a new runtime (drawn with the stop).
    var restartDelay: Int64 = 1
    /// Stopped for good (the lease given up; a new runtime replaces it).
    var isGone = false

    init(options: CloudSync.Options, canaries: Set<Canary>) {
        schedule = CloudSyncSchedule(options: options, canaries: canaries)
    }

    /// A syncNow call waits for the engine.
    var hasWaitingCall: Bool { waiters.contains { if case .syncNow = $0 { true } else { false } } }

    /// Nothing but the timer will make this runtime do anything.
    var isQuiet: Bool { isGone || (pass == nil && waiters.isEmpty && !schedule.hasPendingWork) }
}

extension CloudSyncState {
    var name: String {
        switch self {
        case .idle: return "idle"
        case .syncing: return "syncing"
        case .waitingForNetwork: return "waiting-for-network"
        case .waitingToRetry: return "waiting-to-retry"
        case .paused: return "paused"
        case .blocked: return "blocked"
        case .stopped: return "stopped"
        }
    }
}

extension SimulationRun {
    /// Whether simulated apps sync through their runtimes now (runtime scenarios, until the check phase, whose
    /// re-reads use the simulator's loop).
    var runtimesDrive: Bool { scenario.runtime != nil && phase != .check }

    /// A new runtime for a new engine (at start, restart, or when the app starts sync again after stopping it).
    func makeRuntime() -> SimRuntime? {
        guard let runtime = scenario.runtime else { return nil }
        return SimRuntime(options: runtime.options, canaries: options.canaries)
    }

    func deviceNow(_ engine: SimEngine) -> Int64 { engine.process.device.clock.nowMilliseconds() }

    // MARK: Triggers

    /// A local save on `engine`'s store (by its process or, for an app-group store, the other one): the container's
    /// change stream tells the runtime.
    func noteLocalSave(_ engine: SimEngine) {
        guard let runtime = engine.runtime, !runtime.isGone else { return }
        let time = deviceNow(engine)
        runtime.schedule.noteLocalChange(savedAt: time, now: time)
    }

    /// The cloud announced a change of the zone (a push): the runtime's announcement stream.
    func noteCloudAnnouncement(_ engine: SimEngine) {
        guard let runtime = engine.runtime, !runtime.isGone else { return }
        runtime.schedule.noteCloudChange()
    }

    // MARK: The runtime's turn

    /// Runs whatever `engine`'s runtime does next at the current time: gives up the waits of syncNow calls whose bound
    /// passed, goes on with its pass (unless a request is in flight), hands the engine to the next waiting call,
    /// starts a pass that is due; then arms its next wake-up.
    func runtimeTurn(_ engine: SimEngine) throws {
        guard let runtime = engine.runtime, !runtime.isGone, isCurrent(engine), !engine.isBroken else { return }
        defer { rearm(engine, runtime) }
        try expireWaitingCalls(engine, runtime)
        if engine.engine.isAwaitingResponse {
            guard try abandonAtDeadline(engine, runtime) else { return }
        }
        while true {
            if var pass = runtime.pass {
                if let resume = runtime.resumeAt {
                    if now < resume { return }
                    runtime.resumeAt = nil
                }
                let step: SyncPass.Step
                do {
                    step = try pass.next(engine.engine, shouldContinue: runtime.schedule.shouldContinue(pass, explicitCallWaiting: runtime.hasWaitingCall),
                                         cancelled: runtime.passCall?.cancelled == true)
                } catch is CancellationError {
                    // The caller's task was cancelled: the pass ends as one stopped with work left (`CloudSync.pass`),
                    // and the call throws CancellationError.
                    try endPass(engine, runtime, pass, .stopped, cancelled: true)
                    continue
                } catch {
                    runtime.pass = nil
                    try engineFailed(engine, "nextRequest", error)
                    announce(engine, runtime.schedule.passFailed())
                    if let call = runtime.passCall { try syncNowReturned(engine, call, "threw") }
                    runtime.passCall = nil
                    continue
                }
                runtime.pass = pass
                if let call = runtime.passCall, call.cancelled {
                    // A cancelled call's pass ends at its next step (`SyncPass.next` throws CancellationError).
                    let goesOn: String? = switch step {
                    case .perform: "sends a request"
                    case .sleep: "sleeps through a backoff"
                    case .end: nil
                    }
                    if let goesOn {
                        throw InvariantViolation(.runtimeState, "\(engine.process.label) syncNow #\(call.serial) was cancelled, but its pass on store "
                            + "'\(engine.store)' goes on: it \(goesOn)")
                    }
                }
                switch step {
                case let .perform(request):
                    try checkRuntimeSend(engine, runtime, request)
                    try send(request, from: engine)
                    return
                case let .sleep(milliseconds):
                    runtime.resumeAt = now + milliseconds
                    if let call = runtime.passCall, now + milliseconds > call.trueDeadline {
                        throw InvariantViolation(.syncNowBound, "\(engine.process.label) syncNow #\(call.serial) (bound \(call.timeout) ms, called at "
                            + "\(call.calledAt)) sleeps until \(now + milliseconds), past its bound \(call.trueDeadline)")
                    }
                    announce(engine, runtime.schedule.notePassSleeps(engine: engine.engine))
                    try checkRuntimeState(engine, runtime, "while its pass sleeps through the engine's wait")
                    trace.event(now, "pass-sleep") { line in
                        line.add("process", engine.process.label)
                        line.add("store", engine.store)
                        line.add("ms", milliseconds)
                    }
                    return
                case let .end(end):
                    try endPass(engine, runtime, pass, end)
                    continue
                }
            }
            // The engine is free: the next call waiting for it, or a pass that is due.
            if !runtime.waiters.isEmpty {
                switch runtime.waiters.removeFirst() {
                case let .syncNow(call):
                    // (stop() was called while it waited: it performs nothing.)
                    guard runtime.schedule.mayBeginExplicitPass else {
                        try syncNowReturned(engine, call, "stopped")
                        continue
                    }
                    // (Cancelled before its pass began: it performs nothing, and leaves the engine's backoff alone.)
                    guard !call.cancelled else {
                        try syncNowReturned(engine, call, "cancelled")
                        continue
                    }
                    try beginPass(engine, runtime, call: call)
                    continue
                case .stop:
                    finishStop(engine, runtime)
                    return
                }
            }
            if runtime.schedule.isStopped { return }
            if runtime.schedule.passIsDue(now: deviceNow(engine), changeCounter: { nil }) {
                try beginPass(engine, runtime, call: nil)
                continue
            }
            return
        }
    }

    /// syncNow calls still waiting for the engine when their bound (on the device's clock) passes return the status as
    /// it is (`CloudSync/syncNow(timeoutMilliseconds:)`).
    private func expireWaitingCalls(_ engine: SimEngine, _ runtime: SimRuntime) throws {
        guard runtime.hasWaitingCall else { return }
        let time = deviceNow(engine)
        var expired: [SyncNowCall] = []
        runtime.waiters.removeAll { waiter in
            guard case let .syncNow(call) = waiter, time >= call.deadline else { return false }
            expired.append(call)
            return true
        }
        for call in expired { try syncNowReturned(engine, call, "bound passed while waiting") }
    }

    /// The pass's deadline (on the device's clock) passed with its request in flight: the pass decides as `SyncDriver`
    /// does when its timer fires (`SyncPass.deadlinePassed`: the engine abandons the request, the pass ends stopped);
    /// the answer, should it still come, is ignored as a timed-out request's is. Returns whether the pass ended so.
    private func abandonAtDeadline(_ engine: SimEngine, _ runtime: SimRuntime) throws -> Bool {
        guard let pass = runtime.pass, let request = engine.outstanding, let deadline = pass.requestDeadline(engine.engine),
              deviceNow(engine) >= deadline else { return false }
        trace.event(now, "abandon-at-bound") { line in
            line.add("process", engine.process.label)
            line.add("store", engine.store)
            line.add("req", request)
        }
        engine.outstanding = nil
        stats.syncResponses += 1
        let end: SyncPass.End
        do {
            end = try pass.deadlinePassed(engine: engine.engine, request: request)
        } catch {
            runtime.pass = nil
            try engineFailed(engine, "abandon", error)
            announce(engine, runtime.schedule.passFailed())
            if let call = runtime.passCall { try syncNowReturned(engine, call, "threw") }
            runtime.passCall = nil
            return true
        }
        runtimeSawResult(engine, .failure(.networkUnavailable))
        try endPass(engine, runtime, pass, end)
        return true
    }

    /// Arms the runtime's next wake-up: the end of its pass's sleep, the bound of a call waiting for the engine, or —
    /// with the engine free — when its schedule wants to look again.
    private func rearm(_ engine: SimEngine, _ runtime: SimRuntime) {
        guard !runtime.isGone, isCurrent(engine) else { return }
        var times: [Int64] = []
        if let resume = runtime.resumeAt { times.append(resume) }
        let time = deviceNow(engine)
        // (The pass's bound while its request is in flight: SyncDriver races the request against it.)
        if let pass = runtime.pass, engine.engine.isAwaitingResponse, let deadline = pass.requestDeadline(engine.engine) {
            times.append(now + max(1, deadline - time))
        }
        for case let .syncNow(call) in runtime.waiters { times.append(now + max(1, call.deadline - time)) }
        if runtime.pass == nil, let wake = runtime.schedule.nextWake(passUnderWay: false) { times.append(now + max(1, wake - time)) }
        guard let at = times.min(), runtime.wakeAt != at else { return }
        runtime.wakeAt = at
        queue.push(at, .runtimeWake(engine.serial, at: at))
    }

    private func beginPass(_ engine: SimEngine, _ runtime: SimRuntime, call: SyncNowCall?) throws {
        let (pass, change) = runtime.schedule.beginPass(explicit: call != nil, deadline: call?.deadline, engine: engine.engine, now: deviceNow(engine))
        runtime.pass = pass
        runtime.passCall = call
        trace.event(now, "pass-start") { line in
            line.add("process", engine.process.label)
            line.add("store", engine.store)
            line.add("kind", call.map { "sync-now #\($0.serial)" } ?? "automatic")
        }
        announce(engine, change)
        // An explicit sync tries at once (P7): before its bound, unless the engine waits for a delay the server asked
        // for or another process's lease (or has nothing it may send), its first step is a request.
        if let call, deviceNow(engine) < call.deadline, engine.engine.isBackingOffOnItsOwn {
            throw InvariantViolation(.syncNowBound, "\(engine.process.label) syncNow #\(call.serial) (bound \(call.timeout) ms) did not try at once: "
                + "the engine still backs off on its own after \(try engine.engine.status().lastError.map { "\($0)" } ?? "a failure")")
        }
    }

    private func endPass(_ engine: SimEngine, _ runtime: SimRuntime, _ pass: SyncPass, _ end: SyncPass.End, cancelled: Bool = false) throws {
        runtime.pass = nil
        let call = runtime.passCall
        runtime.passCall = nil
        let outcome: CloudSyncSchedule.PassOutcome
        do {
            outcome = try runtime.schedule.endPass(pass, end, engine: engine.engine, now: deviceNow(engine), changeCounter: { nil })
        } catch {
            try engineFailed(engine, "ending a pass", error)
            announce(engine, runtime.schedule.passFailed())
            if let call { try syncNowReturned(engine, call, "threw") }
            return
        }
        trace.event(now, "pass-end") { line in
            line.add("process", engine.process.label)
            line.add("store", engine.store)
            switch end {
            case .idle: line.add("end", "idle")
            case .waiting: line.add("end", "waiting")
            case .stopped: line.add("end", cancelled ? "cancelled" : "stopped")
            }
            line.add("requests", pass.performed)
            line.add("pending", outcome.status.pendingRecords)
        }
        announce(engine, outcome.state)
        try checkRuntimeState(engine, runtime, "after a pass")
        if runtime.schedule.state == .idle, outcome.status.pendingRecords > 0, try !mayStayBehind(engine, outcome.status) {
            throw InvariantViolation(.runtimeState, "\(engine.process.label) store '\(engine.store)' reports idle after a pass, but "
                + "\(outcome.status.pendingRecords) records wait to be sent")
        }
        if let call {
            try syncNowReturned(engine, call, cancelled ? "cancelled" : outcome.status.isUpToDate ? "up to date" : "\(outcome.status.pendingRecords) pending")
        }
    }

    /// A syncNow call returns now: by its bound in true time (plus the allowance for backward clock jumps), whatever
    /// its pass was doing — a request still in flight at the bound is not waited for (`sync-now-bound`).
    private func syncNowReturned(_ engine: SimEngine, _ call: SyncNowCall, _ result: String) throws {
        trace.event(now, "sync-now-returned") { line in
            line.add("process", engine.process.label)
            line.add("store", engine.store)
            line.add("call", call.serial)
            line.add("after_ms", now - call.calledAt)
            line.add("result", result)
        }
        if now > call.trueDeadline {
            throw InvariantViolation(.syncNowBound, "\(engine.process.label) syncNow #\(call.serial) (bound \(call.timeout) ms, called at "
                + "\(call.calledAt)) returned at \(now), \(now - call.trueDeadline) ms past its bound (\(result))")
        }
    }

    /// A state change the schedule decided: traced (`CloudSync` reports it as an event).
    func announce(_ engine: SimEngine, _ change: CloudSyncState?) {
        guard let change else { return }
        trace.event(now, "runtime-state") { line in
            line.add("process", engine.process.label)
            line.add("store", engine.store)
            line.add("state", change.name)
        }
    }

    /// The engine handled the answer to a request of the pass (or gave it up): the runtime sees the result.
    func runtimeSawResult(_ engine: SimEngine, _ result: Result<CloudOperationResult, CloudError>) {
        guard runtimesDrive, let runtime = engine.runtime, runtime.pass != nil else { return }
        announce(engine, runtime.schedule.noteResult(result, engine: engine.engine))
    }

    /// The stop the run was handed to: the lease is given up, the state is stopped, and the app starts a new runtime
    /// later.
    private func finishStop(_ engine: SimEngine, _ runtime: SimRuntime) {
        engine.engine.releaseLease()
        announce(engine, runtime.schedule.finishStop())
        runtime.isGone = true
        queue.push(now + max(1, runtime.restartDelay), .runtimeStart(engine.serial))
    }

    // MARK: Invariants as the run goes

    /// Before a runtime sends `request`: no call waits past its bound, and nothing is sent once stop() was called.
    private func checkRuntimeSend(_ engine: SimEngine, _ runtime: SimRuntime, _ request: SyncRequest) throws {
        if let stopped = runtime.stopCalledAt {
            throw InvariantViolation(.runtimeState, "\(engine.process.label) store '\(engine.store)' sends \(request.operation.name) "
                + "\(now - stopped) ms after stop() was called (only the request in flight may finish)")
        }
        var calls = runtime.passCall.map { [$0] } ?? []
        for case let .syncNow(call) in runtime.waiters { calls.append(call) }
        for call in calls where now > call.trueDeadline {
            let whose = call.serial == runtime.passCall?.serial ? "for it" : "while it waits for a pass under way"
            throw InvariantViolation(.syncNowBound, "\(engine.process.label) syncNow #\(call.serial) (bound \(call.timeout) ms, called at \(call.calledAt)) "
                + "has not returned at \(now), \(now - call.trueDeadline) ms past its bound: the runtime sends \(request.operation.name) \(whose)")
        }
    }

    /// The state a runtime reports is true: never idle or syncing while its engine backs off with nothing in flight.
    private func checkRuntimeState(_ engine: SimEngine, _ runtime: SimRuntime, _ when: String) throws {
        let state = runtime.schedule.state
        guard state == .idle || state == .syncing, !engine.engine.isAwaitingResponse, let wake = engine.engine.wakeTime else { return }
        throw InvariantViolation(.runtimeState, "\(engine.process.label) store '\(engine.store)' reports \(state.name) \(when), but its engine "
            + "backs off for \(wake - deviceNow(engine)) ms more (\(try engine.engine.status().lastError.map { "\($0)" } ?? "lease"))")
    }

    /// A backward clock jump of `device`: each pending syncNow call there may take up to one request's time-out longer
    /// (see ``SyncNowCall/slack``).
    func noteBackwardClockJump(_ device: SimDevice) {
        let allowance = Int64(scenario.timing.timeoutMs)
        for process in device.processes {
            for engine in orderedEngines(process) {
                guard let runtime = engine.runtime else { continue }
                runtime.passCall?.slack += allowance
                runtime.waiters = runtime.waiters.map { waiter in
                    guard case var .syncNow(call) = waiter else { return waiter }
                    call.slack += allowance
                    return .syncNow(call)
                }
            }
        }
    }

    // MARK: Workload calls on the runtime

    /// The runtime of a synced store of a process, drawn (nil when the process is down or has none).
    private func drawRuntime() throws -> (SimProcess, SimEngine)? {
        let device = devices[try dice.below(devices.count)]
        let process = device.processes[try dice.below(device.processes.count)]
        let synced = orderedEngines(process)
        guard !synced.isEmpty else { return nil }
        let engine = synced[try dice.below(synced.count)]
        return (process, engine)
    }

    /// The app calls `syncNow(timeoutMilliseconds:)` (bound drawn).
    func syncNowStep() throws {
        let drawn = try drawRuntime()
        let timeout = Int64(try dice.upTo(scenario.runtime?.maxSyncNowMs ?? 0))
        guard let (process, engine) = drawn, let runtime = engine.runtime else {
            note("sync-now: no runtime")
            return
        }
        nextCallSerial += 1
        let call = SyncNowCall(serial: nextCallSerial, calledAt: now, timeout: timeout, deadline: deviceNow(engine) &+ timeout)
        note("sync-now #\(call.serial) on \(process.label) (\(engine.store)), bound \(timeout) ms")
        trace.event(now, "step") { line in
            line.add("n", step)
            line.add("action", "sync-now")
            line.add("process", process.label)
            line.add("store", engine.store)
            line.add("call", call.serial)
            line.add("timeout_ms", timeout)
        }
        guard !runtime.isGone, !runtime.schedule.isStopped else { return try syncNowReturned(engine, call, "stopped") }
        runtime.waiters.append(.syncNow(call))
        enqueuePump(engine)
    }

    /// The app stops a runtime (it starts a new one later).
    func stopRuntimeStep() throws {
        let drawn = try drawRuntime()
        let delay = Int64(1 + (try dice.upTo(scenario.timing.restartMs)))
        guard let (process, engine) = drawn, let runtime = engine.runtime else {
            note("stop: no runtime")
            return
        }
        note("stop runtime of \(process.label) (\(engine.store)), a new one after \(delay) ms")
        trace.event(now, "step") { line in
            line.add("n", step)
            line.add("action", "stop-runtime")
            line.add("process", process.label)
            line.add("store", engine.store)
            line.add("restart_after_ms", delay)
        }
        guard !runtime.isGone, runtime.schedule.beginStop() else { return }
        runtime.stopCalledAt = now
        runtime.restartDelay = delay
        runtime.waiters.append(.stop)
        // A pass sleeping through the engine's wait wakes at once and ends (`CloudSync.stop()` signals it).
        if runtime.pass != nil, runtime.resumeAt != nil { runtime.resumeAt = now }
        enqueuePump(engine)
    }

    /// The app pauses a runtime and resumes it later.
    func pauseRuntimeStep() throws {
        let drawn = try drawRuntime()
        let duration = Int64(1 + (try dice.upTo(scenario.timing.outageMs)))
        guard let (process, engine) = drawn, let runtime = engine.runtime else {
            note("pause: no runtime")
            return
        }
        note("pause runtime of \(process.label) (\(engine.store)) for \(duration) ms")
        trace.event(now, "step") { line in
            line.add("n", step)
            line.add("action", "pause-runtime")
            line.add("process", process.label)
            line.add("store", engine.store)
            line.add("duration_ms", duration)
        }
        guard !runtime.isGone else { return }
        announce(engine, runtime.schedule.pause())
        queue.push(now + duration, .runtimeResume(engine.serial))
        enqueuePump(engine)
    }

    /// The app calls `syncNow` on a runtime (drawn) and cancels the task awaiting it a drawn while later (up to
    /// `cancelWithinMs`, mostly far less), as a view that goes away cancels its task: the cancellation may find the
    /// call waiting for the engine, its pass with a request in flight or sleeping through a backoff, or the call
    /// returned already.
    func cancelSyncNowStep() throws {
        let drawn = try drawRuntime()
        let timeout = Int64(try dice.upTo(scenario.runtime?.maxSyncNowMs ?? 0))
        // Skewed towards short delays (most calls end within a few round trips), with a tail through backoffs.
        let delay = Int64(try dice.upTo(try dice.upTo(Self.cancelWithinMs)))
        guard let (process, engine) = drawn, let runtime = engine.runtime else {
            note("cancelled sync-now: no runtime")
            return
        }
        nextCallSerial += 1
        let call = SyncNowCall(serial: nextCallSerial, calledAt: now, timeout: timeout, deadline: deviceNow(engine) &+ timeout)
        note("sync-now #\(call.serial) on \(process.label) (\(engine.store)), bound \(timeout) ms, cancelled after \(delay) ms")
        trace.event(now, "step") { line in
            line.add("n", step)
            line.add("action", "cancelled-sync-now")
            line.add("process", process.label)
            line.add("store", engine.store)
            line.add("call", call.serial)
            line.add("timeout_ms", timeout)
            line.add("cancel_after_ms", delay)
        }
        guard !runtime.isGone, !runtime.schedule.isStopped else { return try syncNowReturned(engine, call, "stopped") }
        runtime.waiters.append(.syncNow(call))
        queue.push(now + delay, .runtimeCancel(engine.serial, call: call.serial))
        enqueuePump(engine)
    }

    /// The longest a cancelled `syncNow` runs before its task is cancelled, in milliseconds: past a few request
    /// round trips and the engine's first backoffs.
    static let cancelWithinMs = 5_000

    /// The task awaiting call `serial` of the runtime is cancelled: the pass it runs ends as soon as it would go on
    /// (at once while it sleeps through a backoff; after the answer to a request in flight), or the call, still
    /// waiting for the engine, stops waiting and returns at once. Moot once the call returned.
    private func cancelSyncNow(_ engine: SimEngine, _ runtime: SimRuntime, serial: Int) throws {
        if runtime.passCall?.serial == serial {
            runtime.passCall?.cancelled = true
            if runtime.resumeAt != nil { runtime.resumeAt = now }
            trace.event(now, "sync-now-cancelled") { line in
                line.add("process", engine.process.label)
                line.add("store", engine.store)
                line.add("call", serial)
            }
            enqueuePump(engine)
        } else if let index = runtime.waiters.firstIndex(where: { if case let .syncNow(call) = $0 { call.serial == serial } else { false } }),
                  case var .syncNow(call) = runtime.waiters[index] {
            if runtime.pass != nil {
                // `CloudSync.acquireRun` stops waiting for the pass under way as soon as the task is cancelled.
                runtime.waiters.remove(at: index)
                try syncNowReturned(engine, call, "cancelled while waiting")
            } else {
                // The engine is free: the call gets it at its turn and returns without a pass.
                call.cancelled = true
                runtime.waiters[index] = .syncNow(call)
            }
            enqueuePump(engine)
        }
    }

    // MARK: Events

    func handleRuntimeEvent(_ event: SimEvent) throws {
        switch event {
        case let .runtimeWake(serial, at):
            guard let engine = engines[serial], let runtime = engine.runtime, runtime.wakeAt == at else { return }
            runtime.wakeAt = nil
            enqueuePump(engine)
        case let .runtimeResume(serial):
            guard let engine = engines[serial], isCurrent(engine), let runtime = engine.runtime, !runtime.isGone else { return }
            announce(engine, runtime.schedule.resume())
            enqueuePump(engine)
        case let .runtimeStart(serial):
            guard let engine = engines[serial], isCurrent(engine), engine.runtime?.isGone == true else { return }
            try replaceRuntime(of: engine)
        case let .runtimeCancel(serial, call):
            guard let engine = engines[serial], isCurrent(engine), let runtime = engine.runtime, !runtime.isGone else { return }
            try cancelSyncNow(engine, runtime, serial: call)
        default:
            break
        }
    }

    /// The app starts sync again after stopping it: a new engine of the store (the stopped runtime's went with it) and
    /// a new runtime.
    func replaceRuntime(of old: SimEngine) throws {
        let process = old.process
        guard let context = process.context, let container = process.container,
              let store = process.stores.first(where: { $0.name == old.store }) else { return }
        let simEngine = try makeEngine(process, store, container: container, context: context)
        engines[old.serial] = nil
        engines[simEngine.serial] = simEngine
        process.engines[store.name] = simEngine
        trace.event(now, "runtime-start") { line in
            line.add("process", process.label)
            line.add("store", store.name)
        }
        enqueuePump(simEngine)
    }

    func isMootRuntimeEvent(_ event: SimEvent) -> Bool {
        switch event {
        case let .runtimeWake(serial, at):
            guard let engine = engines[serial], isCurrent(engine) else { return true }
            return engine.runtime?.wakeAt != at
        case let .runtimeResume(serial):
            guard let engine = engines[serial], isCurrent(engine) else { return true }
            return engine.runtime.map { $0.isGone || !$0.schedule.isPaused } ?? true
        case let .runtimeStart(serial):
            guard let engine = engines[serial], isCurrent(engine) else { return true }
            return engine.runtime?.isGone != true
        case let .runtimeCancel(serial, call):
            guard let engine = engines[serial], isCurrent(engine), let runtime = engine.runtime, !runtime.isGone else { return true }
            if runtime.passCall?.serial == call { return false }
            return !runtime.waiters.contains { if case let .syncNow(waiting) = $0 { waiting.serial == call } else { false } }
        default:
            return false
        }
    }

    // MARK: Heal and quiesce

    /// At heal the apps start sync again where they stopped it and resume paused runtimes (the faults are over; no
    /// syncNow is called from here on).
    func healRuntimes() throws {
        for engine in currentEngines {
            guard let runtime = engine.runtime else { continue }
            if runtime.isGone {
                try replaceRuntime(of: engine)
            } else if runtime.schedule.isStopped {
                runtime.restartDelay = 1
            } else if runtime.schedule.isPaused {
                announce(engine, runtime.schedule.resume())
                enqueuePump(engine)
            }
        }
        try runPumps()
    }

    /// Quiesce through the runtimes alone: run until only their timers are left, let one timer period pass (every
    /// runtime reads the zone and uploads), and repeat until a period uploads nothing; then every runtime must be idle
    /// with nothing left to send (liveness without any syncNow).
    func settleRuntimes(deadline: Int64) throws {
        let period = Int64(scenario.runtime?.timerMs ?? 60_000)
        for _ in 0..<25 {
            try runUntilQuiet(deadline: deadline)
            let saves = stats.cloudSaves
            try runThrough(now + period + 1, deadline: deadline)
            try runUntilQuiet(deadline: deadline)
            guard stats.cloudSaves == saves else { continue }
            for engine in currentEngines where !engine.isBroken {
                guard let runtime = engine.runtime else { continue }
                let status = try engine.engine.status()
                let exempt = try mayStayBehind(engine, status)
                if runtime.isGone || runtime.pass != nil || !runtime.waiters.isEmpty || (runtime.schedule.state != .idle && !exempt)
                    || (!status.isUpToDate && !exempt) {
                    throw InvariantViolation(.liveness, "\(engine.process.label) store '\(engine.store)': the runtime is "
                        + "\(runtime.isGone ? "gone" : runtime.schedule.state.name)\(runtime.pass != nil ? " in a pass" : "") after heal without "
                        + "syncNow (pending \(status.pendingRecords), needs fetch \(status.needsFetch), last error "
                        + "\(status.lastError.map { "\($0)" } ?? "none"))")
                }
            }
            try checkObservers()
            return
        }
        throw InvariantViolation(.liveness, "the runtimes kept uploading through 25 timer periods after heal")
    }

    /// Whether nothing but runtime timers is left: every event queued is a runtime's wake-up, and every runtime is
    /// quiet.
    private var isQuiet: Bool {
        guard currentEngines.allSatisfy({ $0.runtime?.isQuiet ?? true }) else { return false }
        // (Events that can no longer do anything — a time-out of a request that was answered — do not count.)
        return queue.count == queue.runtimeWakes || queue.ordered.allSatisfy { entry in
            if case .runtimeWake = entry.event { return true }
            return isMoot(entry.event)
        }
    }

    private func runUntilQuiet(deadline: Int64) throws {
        var processed = 0
        let records = zones.reduce(0) { $0 + (mirror[$1]?.count ?? 0) }
        let eventLimit = 3_000 + 100 * records
        while let next = queue.nextTime {
            if let (_, event) = queue.peek, isMoot(event) {
                _ = queue.pop()
                continue
            }
            if isQuiet { return }
            if next > deadline {
                throw InvariantViolation(.liveness, "not converged \(Int64(scenario.timing.livenessBoundMs) / 1000) s (virtual) after heal: "
                    + "\(queue.count) events still pending (\(unquietDescription()))")
            }
            let (time, event) = queue.pop()!
            setNow(max(now, time))
            try handle(event)
            try runPumps()
            processed += 1
            if processed > eventLimit {
                throw InvariantViolation(.liveness, "\(eventLimit) events (\(stats.syncRequests) requests so far) without settling after heal: "
                    + "the runtimes go round in circles")
            }
        }
    }

    /// What keeps the world from being quiet: events other than runtime wake-ups, and runtimes with work.
    private func unquietDescription() -> String {
        var parts: [String] = []
        for (time, event) in queue.ordered.prefix(50) {
            switch event {
            case .runtimeWake: continue
            default: parts.append("\(isMoot(event) ? "moot " : "")\(event)".prefix(60).description + " at \(time)")
            }
        }
        for engine in currentEngines {
            guard let runtime = engine.runtime, !runtime.isQuiet else { continue }
            parts.append("\(engine.process.label)/\(engine.store): \(runtime.pass != nil ? "in a pass" : "")"
                + "\(runtime.waiters.isEmpty ? "" : " \(runtime.waiters.count) waiting") \(runtime.schedule.pendingWorkDescription)")
        }
        return parts.prefix(6).joined(separator: "; ")
    }

    /// Runs every event up to `target` (timers included).
    private func runThrough(_ target: Int64, deadline: Int64) throws {
        guard target <= deadline else {
            throw InvariantViolation(.liveness, "not converged \(Int64(scenario.timing.livenessBoundMs) / 1000) s (virtual) after heal")
        }
        try advance(to: target)
    }
}
