import Foundation
import Synchronization
import Testing
@testable import Replica

// Cancellation, stop and pause under an adversary: the cases a fresh tester tried against the sync runtime (issue 21).
// Four failed before their fixes: pre-cancelled calls ended the engine's backoff and the schedule sent at once
// (preCancelledDuringBackoff); stop() waited for a syncNow sleeping through a backoff (stopDuringExplicitBackoffSleep);
// a call cancelled while stop() waited returned normally (cancelWhileStopWaits); a cloud that fails a cancelled request
// left the engine backing off for a network that was never down (cancelOnCancellationAwareCloud).

// MARK: Helpers (the file-private helpers of CloudSyncTests, renamed)

/// A device with one in-memory synced store; `blockingSleep` makes `environment.sleep` (the backoff sleeps of an
/// explicit pass) wait on the manual clock instead of advancing it.
private final class BrkDevice: Sendable {
    let container: ModelContainer
    let clock: ManualClock

    init(seed: UInt64, blockingSleep: Bool = false) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-brk-\(UUID().uuidString)")
        var environment = ReplicaEnvironment.seeded(seed: seed, directory: directory)
        let clock = environment.clock as! ManualClock
        self.clock = clock
        if blockingSleep {
            environment.sleep = { ms in try await clock.sleep(until: clock.nowMilliseconds() &+ ms) }
        }
        container = try ModelContainer(for: Schema([SyncNote.self]), configurations: [
            ModelConfiguration("notes", isStoredInMemoryOnly: true, cloudKitDatabase: .private("iCloud.test")),
        ], environment: environment)
    }

    func save(_ titles: String...) throws {
        let context = ModelContext(container)
        for title in titles { context.insert(SyncNote(title: title)) }
        try context.save()
    }
}

private final class BrkLog: Sendable {
    private final class Buffer: Sendable {
        let events = Mutex<[CloudSyncEvent]>([])
    }
    private let buffer = Buffer()
    private let task: Mutex<Task<Void, Never>?> = Mutex(nil)
    init(_ sync: CloudSync) {
        let stream = sync.events
        let buffer = self.buffer
        let task = Task { for await event in stream { buffer.events.withLock { $0.append(event) } } }
        self.task.withLock { $0 = task }
    }
    var all: [CloudSyncEvent] { buffer.events.withLock { $0 } }
    deinit { task.withLock { $0?.cancel() } }
}

private func brkEventually(_ tries: Int = 200_000, _ condition: () async -> Bool) async -> Bool {
    for _ in 0..<tries {
        if await condition() { return true }
        await Task.yield()
    }
    return await condition()
}

/// A cloud whose uploads wait for a gate; can go offline; counts every request; optionally answers a cancelled
/// request with `networkUnavailable` (as a URLSession-based cloud would).
private final class BrkCloud: CloudDatabase {
    let inner = InMemoryCloudDatabase()
    private let gate = Mutex<(open: Bool, waiters: [CheckedContinuation<Void, Never>], arrived: Int)>((true, [], 0))
    let offline = Mutex(false)
    let requests = Mutex(0)
    let failsWhenCancelled: Bool
    init(gated: Bool = false, failsWhenCancelled: Bool = false) {
        self.failsWhenCancelled = failsWhenCancelled
        gate.withLock { $0.open = !gated }
    }
    var arrivedSaves: Int { gate.withLock { $0.arrived } }
    func close() { gate.withLock { $0.open = false } }
    func open() {
        let waiters = gate.withLock { gate -> [CheckedContinuation<Void, Never>] in
            gate.open = true
            defer { gate.waiters = [] }
            return gate.waiters
        }
        for waiter in waiters { waiter.resume() }
    }
    private func check() throws(CloudError) {
        requests.withLock { $0 += 1 }
        if offline.withLock({ $0 }) { throw .networkUnavailable }
    }
    func createZone(_ zone: String) async throws(CloudError) { try check(); try inner.createZone(zone) }
    func deleteZone(_ zone: String) async throws(CloudError) { try check(); try inner.deleteZone(zone) }
    func modifyRecords(_ records: [CloudRecord], in zone: String) async throws(CloudError) -> [RecordSaveResult] {
        try check()
        await withCheckedContinuation { continuation in
            let go = gate.withLock { gate -> Bool in
                gate.arrived += 1
                if gate.open { return true }
                gate.waiters.append(continuation)
                return false
            }
            if go { continuation.resume() }
        }
        if failsWhenCancelled && Task.isCancelled { throw .networkUnavailable }
        return try inner.modifyRecords(records, in: zone)
    }
    func fetchZoneChanges(_ zone: String, since token: ServerChangeToken?, limit: Int) async throws(CloudError) -> ZoneChangeBatch {
        try check(); return try inner.fetchZoneChanges(zone, since: token, limit: limit)
    }
    func zoneMetadata(_ zone: String) async throws(CloudError) -> [String: Data] { try check(); return try inner.zoneMetadata(zone) }
    func setZoneMetadata(_ zone: String, key: String, value: Data, ifCurrent expected: Data?) async throws(CloudError) -> Data {
        try check(); return try inner.setZoneMetadata(zone, key: key, value: value, ifCurrent: expected)
    }
}

private func quiet() -> CloudSync.Options {
    var options = CloudSync.Options()
    options.timerMilliseconds = nil
    options.cloudPollingMilliseconds = nil
    return options
}

private enum Outcome: Equatable { case returned, cancelled, failed }

private func outcome(_ task: Task<SyncStatus, any Error>) async -> Outcome {
    do { _ = try await task.value; return .returned } catch is CancellationError { return .cancelled } catch { return .failed }
}

/// Runs stop() and reports whether it returned without any clock moving.
private func stopReturns(_ sync: CloudSync) async -> (Bool, Task<Void, Never>) {
    let done = Mutex(false)
    let stopping = Task { await sync.stop(); done.withLock { $0 = true } }
    let returned = await brkEventually { done.withLock { $0 } }
    return (returned, stopping)
}

@Suite("Cloud sync runtime: cancellation, stop and pause")
struct CloudSyncCancellationTests {
    @Test("cancel a waiter, then the holder; nothing leaks, the save uploads, the state settles")
    func cancelWaiterThenHolder() async throws {
        let device = try BrkDevice(seed: 901)
        let cloud = BrkCloud(gated: true)
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: quiet())
        #expect(await brkEventually { await brkSettled(sync) })
        try device.save("a")
        let holder = Task { try await sync.syncNow(timeoutMilliseconds: 60_000) }
        #expect(await brkEventually { cloud.arrivedSaves == 1 })
        let waiter = Task { try await sync.syncNow(timeoutMilliseconds: 60_000) }
        for _ in 0..<2_000 { await Task.yield() }
        waiter.cancel()
        #expect(await outcome(waiter) == .cancelled)
        holder.cancel()
        for _ in 0..<2_000 { await Task.yield() }
        cloud.open()
        #expect(await outcome(holder) == .cancelled)
        try device.save("b")
        #expect(await brkEventually {
            if cloud.inner.records(in: "notes").count == 2 { return true }
            device.clock.advance(by: 50); return false
        }, "saves not uploaded by the schedule")
        let okS = await brkEventually { await sync.state == .idle }
        let stS = await sync.state
        #expect(okS, "state \(stS)")
        let status = try await sync.syncNow(timeoutMilliseconds: 10_000)
        #expect(status.pendingRecords == 0)
        let (stopped, stopping) = await stopReturns(sync)
        #expect(stopped)
        await stopping.value
    }

    @Test("50 syncNow calls cancelled at random points; one syncNow then finishes; stop returns", arguments: 0..<4)
    func manyCancelled(round: Int) async throws {
        var rng = SeededGenerator(seed: 0x5eed + UInt64(round))
        let device = try BrkDevice(seed: 910 + UInt64(round))
        let cloud = BrkCloud(gated: true)
        var options = quiet()
        options.engine.uploadBatchSize = 1
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: options)
        #expect(await brkEventually { await brkSettled(sync) })
        for i in 0..<5 { try device.save("n\(i)") }
        var tasks: [Task<SyncStatus, any Error>] = []
        for i in 0..<50 {
            tasks.append(Task { try await sync.syncNow(timeoutMilliseconds: Int64(i * 1_201 % 60_001)) })
            if i == 20 { cloud.open() }
            if i == 30 { cloud.close() }
            for _ in 0..<Int.random(in: 0..<50, using: &rng) { await Task.yield() }
            if Bool.random(using: &rng) { tasks.randomElement(using: &rng)?.cancel() }
            if i % 10 == 0 { device.clock.advance(by: Int64.random(in: 0...2_000, using: &rng)) }
        }
        for task in tasks where Bool.random(using: &rng) { task.cancel() }
        for _ in 0..<Int.random(in: 0..<500, using: &rng) { await Task.yield() }
        cloud.open()
        for task in tasks { task.cancel() }
        let finished = Mutex(0)
        let all = tasks
        let waiter = Task { for task in all { _ = await outcome(task); finished.withLock { $0 += 1 } } }
        #expect(await brkEventually {
            if finished.withLock({ $0 }) == 50 { return true }
            device.clock.advance(by: 100); return false
        }, "only \(finished.withLock { $0 }) of 50 calls ended")
        await waiter.value
        let status = try await sync.syncNow(timeoutMilliseconds: 60_000)
        #expect(status.pendingRecords == 0, "\(status)")
        #expect(cloud.inner.records(in: "notes").count == 5)
        let okS = await brkEventually { await sync.state == .idle }
        let stS = await sync.state
        #expect(okS, "state \(stS)")
        let (stopped, stopping) = await stopReturns(sync)
        #expect(stopped)
        await stopping.value
    }

    @Test("stop() while a syncNow sleeps through a backoff returns at once (no request in flight)")
    func stopDuringExplicitBackoffSleep() async throws {
        let device = try BrkDevice(seed: 920, blockingSleep: true)
        let cloud = BrkCloud()
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: quiet())
        #expect(await brkEventually { await brkSettled(sync) })
        cloud.offline.withLock { $0 = true }
        try device.save("offline")
        let explicit = Task { try await sync.syncNow(timeoutMilliseconds: 60_000) }
        #expect(await brkEventually { await sync.state == .waitingForNetwork && device.clock.waiterCount > 0 })
        let before = cloud.requests.withLock { $0 }
        let (stopped, stopping) = await stopReturns(sync)
        #expect(stopped, "stop() waits for the syncNow's backoff sleep (clock not moved)")
        device.clock.advance(by: 60_000)  // unblock
        await stopping.value
        _ = await outcome(explicit)
        #expect(cloud.requests.withLock { $0 } == before, "a request went out after stop()")
    }

    @Test("cancel a syncNow during its backoff sleep; network back; the schedule uploads; state settles")
    func cancelDuringBackoffThenNetworkBack() async throws {
        let device = try BrkDevice(seed: 930, blockingSleep: true)
        let cloud = BrkCloud()
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: quiet())
        #expect(await brkEventually { await brkSettled(sync) })
        cloud.offline.withLock { $0 = true }
        try device.save("offline")
        let explicit = Task { try await sync.syncNow(timeoutMilliseconds: 60_000) }
        #expect(await brkEventually { await sync.state == .waitingForNetwork && device.clock.waiterCount > 0 })
        for _ in 0..<2_000 { await Task.yield() }
        explicit.cancel()
        #expect(await outcome(explicit) == .cancelled)
        for _ in 0..<2_000 { await Task.yield() }
        let okS = await sync.state == .waitingForNetwork
        let stS = await sync.state
        #expect(okS, "state \(stS)")
        let before = cloud.requests.withLock { $0 }
        for _ in 0..<2_000 { await Task.yield() }
        #expect(cloud.requests.withLock { $0 } == before, "a request went out in the backoff after the cancellation")
        cloud.offline.withLock { $0 = false }
        #expect(await brkEventually {
            if cloud.inner.records(in: "notes").count == 1 { return true }
            device.clock.advance(by: 100); return false
        })
        let okS2 = await brkEventually { await sync.state == .idle }
        let stS2 = await sync.state
        #expect(okS2, "state \(stS2)")
        await sync.stop()
    }

    @Test("pre-cancelled syncNow calls while the runtime backs off (network down) send nothing")
    func preCancelledDuringBackoff() async throws {
        let device = try BrkDevice(seed: 940)
        let cloud = BrkCloud()
        var options = quiet()
        options.engine.baseBackoffMilliseconds = 60_000
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: options)
        #expect(await brkEventually { await brkSettled(sync) })
        cloud.offline.withLock { $0 = true }
        try device.save("offline")
        device.clock.advance(by: 1_000)  // debounce
        #expect(await brkEventually { await sync.state == .waitingForNetwork })
        for _ in 0..<2_000 { await Task.yield() }
        let before = cloud.requests.withLock { $0 }
        var outcomes: [Outcome] = []
        for _ in 0..<20 {
            let task = Task {
                withUnsafeCurrentTask { $0?.cancel() }
                return try await sync.syncNow(timeoutMilliseconds: 10_000)
            }
            outcomes.append(await outcome(task))
            for _ in 0..<200 { await Task.yield() }
        }
        for _ in 0..<2_000 { await Task.yield() }
        let sent = cloud.requests.withLock { $0 } - before
        #expect(outcomes.allSatisfy { $0 == .cancelled }, "\(outcomes)")
        #expect(sent == 0, "20 cancelled syncNow calls made the runtime send \(sent) requests during a 60 s backoff")
        let state = await sync.state
        #expect(state == .waitingForNetwork, "state \(state)")
        await sync.stop()
    }

    @Test("cancel a syncNow mid-request while paused: no automatic pass while paused; resume uploads")
    func cancelWhilePaused() async throws {
        let device = try BrkDevice(seed: 950)
        let cloud = BrkCloud(gated: true)
        var options = quiet()
        options.engine.uploadBatchSize = 1
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: options)
        #expect(await brkEventually { await brkSettled(sync) })
        await sync.pause()
        try device.save("p1", "p2")
        let explicit = Task { try await sync.syncNow(timeoutMilliseconds: 60_000) }
        #expect(await brkEventually { cloud.arrivedSaves == 1 })
        explicit.cancel()
        for _ in 0..<1_000 { await Task.yield() }
        cloud.open()
        #expect(await outcome(explicit) == .cancelled)
        for _ in 0..<2_000 { await Task.yield() }
        device.clock.advance(by: 10_000)
        for _ in 0..<2_000 { await Task.yield() }
        #expect(cloud.arrivedSaves == 1, "an upload went out while paused")
        let okS = await sync.state == .paused
        let stS = await sync.state
        #expect(okS, "state \(stS)")
        await sync.resume()
        #expect(await brkEventually { cloud.inner.records(in: "notes").count == 2 })
        #expect(await brkEventually { await sync.state == .idle })
        await sync.stop()
    }

    @Test("cancel the holder while stop() waits; a cancelled waiter queued behind stop; nothing sent after stop")
    func cancelWhileStopWaits() async throws {
        let device = try BrkDevice(seed: 960)
        let cloud = BrkCloud(gated: true)
        var options = quiet()
        options.engine.uploadBatchSize = 1
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: options)
        #expect(await brkEventually { await brkSettled(sync) })
        try device.save("s1", "s2")
        let holder = Task { try await sync.syncNow(timeoutMilliseconds: 60_000) }
        #expect(await brkEventually { cloud.arrivedSaves == 1 })
        let stopping = Task { await sync.stop() }
        for _ in 0..<2_000 { await Task.yield() }
        let late = Task { try await sync.syncNow(timeoutMilliseconds: 60_000) }
        for _ in 0..<2_000 { await Task.yield() }
        holder.cancel()
        late.cancel()
        for _ in 0..<1_000 { await Task.yield() }
        cloud.open()
        await stopping.value
        let h = await outcome(holder)
        let l = await outcome(late)
        #expect(h == .cancelled, "holder: \(h)")
        #expect(l == .cancelled || l == .returned, "late: \(l)")
        #expect(cloud.arrivedSaves == 1)
        #expect(await sync.state == .stopped)
    }

    @Test("cancelling a syncNow mid-request on a cloud that fails cancelled requests does not leave a network backoff")
    func cancelOnCancellationAwareCloud() async throws {
        let device = try BrkDevice(seed: 970)
        let cloud = BrkCloud(gated: true, failsWhenCancelled: true)
        var options = quiet()
        options.engine.baseBackoffMilliseconds = 60_000
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: options)
        #expect(await brkEventually { await brkSettled(sync) })
        try device.save("c")
        let explicit = Task { try await sync.syncNow(timeoutMilliseconds: 60_000) }
        #expect(await brkEventually { cloud.arrivedSaves == 1 })
        explicit.cancel()
        for _ in 0..<1_000 { await Task.yield() }
        cloud.open()
        #expect(await outcome(explicit) == .cancelled)
        for _ in 0..<5_000 { await Task.yield() }
        let state = await sync.state
        let status = try await sync.status()
        #expect(cloud.inner.records(in: "notes").count == 1, "not uploaded without the clock moving; state \(state), lastError \(String(describing: status.lastError))")
        await sync.stop()
    }

    @Test("cancel a syncNow mid-request (cloud ignores cancellation): answer applied, rest by schedule, state idle", arguments: 0..<3)
    func cancelMidRequest(round: Int) async throws {
        let device = try BrkDevice(seed: 980 + UInt64(round))
        let cloud = BrkCloud(gated: true)
        var options = quiet()
        options.engine.uploadBatchSize = 1
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: options)
        let log = BrkLog(sync)
        #expect(await brkEventually { await brkSettled(sync) })
        try device.save("m1", "m2", "m3")
        let explicit = Task { try await sync.syncNow(timeoutMilliseconds: 60_000) }
        #expect(await brkEventually { cloud.arrivedSaves == 1 })
        explicit.cancel()
        cloud.open()
        #expect(await outcome(explicit) == .cancelled)
        #expect(await brkEventually { cloud.inner.records(in: "notes").count == 3 })
        let okS = await brkEventually { await sync.state == .idle }
        let stS = await sync.state
        #expect(okS, "state \(stS); \(log.all)")
        await sync.stop()
    }

    @Test("stop() from an already-cancelled task while a syncNow's request is in flight returns after it; the holder ends")
    func stopFromCancelledTask() async throws {
        let device = try BrkDevice(seed: 990)
        let cloud = BrkCloud(gated: true)
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: quiet())
        #expect(await brkEventually { await brkSettled(sync) })
        try device.save("x")
        let holder = Task { try await sync.syncNow(timeoutMilliseconds: 60_000) }
        #expect(await brkEventually { cloud.arrivedSaves == 1 })
        let done = Mutex(false)
        let stopping = Task { withUnsafeCurrentTask { $0?.cancel() }; await sync.stop(); done.withLock { $0 = true } }
        for _ in 0..<2_000 { await Task.yield() }
        #expect(!done.withLock { $0 }, "stop returned before the request in flight")
        cloud.open()
        await stopping.value
        _ = await outcome(holder)
        #expect(cloud.inner.records(in: "notes").count == 1)
        #expect(await sync.state == .stopped)
    }

    @Test("a waiter cancelled right at the handover, 100 times: the engine is never leaked", arguments: 0..<3)
    func cancelAtHandover(round: Int) async throws {
        var rng = SeededGenerator(seed: 0x5eed + UInt64(round))
        let device = try BrkDevice(seed: 1000 + UInt64(round))
        let cloud = BrkCloud(gated: true)
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: quiet())
        #expect(await brkEventually { await brkSettled(sync) })
        for i in 0..<100 {
            cloud.close()
            try device.save("h\(i)")
            let holder = Task { try await sync.syncNow(timeoutMilliseconds: 60_000) }
            #expect(await brkEventually { cloud.arrivedSaves == i + 1 })
            let waiter = Task { try await sync.syncNow(timeoutMilliseconds: 60_000) }
            for _ in 0..<Int.random(in: 0..<20, using: &rng) { await Task.yield() }
            cloud.open()
            for _ in 0..<Int.random(in: 0..<20, using: &rng) { await Task.yield() }
            waiter.cancel()
            _ = await outcome(holder)
            _ = await outcome(waiter)
            #expect(await brkEventually { await sync.state == .idle }, "round \(i)")
        }
        let status = try await sync.syncNow(timeoutMilliseconds: 10_000)
        #expect(status.pendingRecords == 0)
        #expect(cloud.inner.records(in: "notes").count == 100)
        let (stopped, stopping) = await stopReturns(sync)
        #expect(stopped)
        await stopping.value
    }
}

private func brkSettled(_ sync: CloudSync) async -> Bool {
    guard await sync.lastSyncDate != nil else { return false }
    return await sync.state == .idle
}

