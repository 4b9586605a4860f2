import Foundation
import Synchronization
import Testing
@testable import Replica

/// A container with one synced in-memory store "notes" on a seeded environment (manual clock), and its runtime.
final class RuntimeDevice: Sendable {
    let container: ModelContainer
    let clock: ManualClock

    init(seed: UInt64) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-runtime-\(UUID().uuidString)")
        let environment = ReplicaEnvironment.seeded(seed: seed, directory: directory)
        clock = environment.clock as! ManualClock
        container = try ModelContainer(for: Schema([SyncNote.self]), configurations: [
            ModelConfiguration("notes", isStoredInMemoryOnly: true, cloudKitDatabase: .private("iCloud.test")),
        ], environment: environment)
    }

    func save(_ titles: String...) throws -> [UUID] {
        let context = ModelContext(container)
        var notes: [SyncNote] = []
        for title in titles {
            notes.append(context.insert(SyncNote(title: title)))
        }
        try context.save()
        return notes.map(\.id)
    }

    func titles() throws -> [String] { try ModelContext(container).fetch(SyncNote.self).map(\.title).sorted() }
}

/// Collects a runtime's events as they arrive.
final class EventLog: Sendable {
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

    func count(where predicate: (CloudSyncEvent) -> Bool) -> Int { all.filter(predicate).count }

    /// Waits (yielding, no clock moves) until an event matches; `false` if none came.
    func waitFor(_ predicate: @escaping (CloudSyncEvent) -> Bool) async -> Bool {
        await eventually { self.all.contains(where: predicate) }
    }

    deinit { task.withLock { $0?.cancel() } }
}

/// Yields until `condition` holds (other tasks run meanwhile; the manual clock does not move).
func eventually(_ condition: () async -> Bool) async -> Bool {
    for _ in 0..<200_000 {
        if await condition() { return true }
        await Task.yield()
    }
    return await condition()
}

func isSent(_ event: CloudSyncEvent) -> Bool { if case .sentChanges = event { true } else { false } }
func isIdle(_ event: CloudSyncEvent) -> Bool { event == .stateChanged(.idle) }

/// A cloud whose saves wait until the test opens the gate (a request in flight), or refuse every record.
private final class GatedCloud: CloudDatabase {
    let inner = InMemoryCloudDatabase()
    private let gate = Mutex<(open: Bool, waiters: [CheckedContinuation<Void, Never>], arrived: Int)>((false, [], 0))
    let refusesRecords: Bool
    init(refusesRecords: Bool = false) { self.refusesRecords = refusesRecords }

    var arrivedSaves: Int { gate.withLock { $0.arrived } }
    func open() {
        let waiters = gate.withLock { gate -> [CheckedContinuation<Void, Never>] in
            gate.open = true
            defer { gate.waiters = [] }
            return gate.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    func createZone(_ zone: String) async throws(CloudError) { try inner.createZone(zone) }
    func deleteZone(_ zone: String) async throws(CloudError) { try inner.deleteZone(zone) }
    func modifyRecords(_ records: [CloudRecord], in zone: String) async throws(CloudError) -> [RecordSaveResult] {
        if refusesRecords {
            return records.map { .failed(recordID: $0.recordID, error: .invalidRecord(reason: "refused by test")) }
        }
        await withCheckedContinuation { continuation in
            let go = gate.withLock { gate -> Bool in
                gate.arrived += 1
                if gate.open { return true }
                gate.waiters.append(continuation)
                return false
            }
            if go { continuation.resume() }
        }
        return try inner.modifyRecords(records, in: zone)
    }
    func fetchZoneChanges(_ zone: String, since token: ServerChangeToken?, limit: Int) async throws(CloudError) -> ZoneChangeBatch {
        try inner.fetchZoneChanges(zone, since: token, limit: limit)
    }
    func zoneMetadata(_ zone: String) async throws(CloudError) -> [String: Data] { try inner.zoneMetadata(zone) }
    func setZoneMetadata(_ zone: String, key: String, value: Data, ifCurrent expected: Data?) async throws(CloudError) -> Data {
        try inner.setZoneMetadata(zone, key: key, value: value, ifCurrent: expected)
    }
}

/// Holds a runtime in a custom actor, as an app's sync service would.
private actor SyncService {
    let sync: CloudSync
    init(_ sync: CloudSync) { self.sync = sync }
    func flush() async throws -> SyncStatus { try await sync.syncNow(timeoutMilliseconds: 10_000) }
}

/// Holds a runtime on the main actor, as a view model would.
@MainActor
private final class SyncViewModel {
    let sync: CloudSync
    var state: CloudSyncState = .idle
    init(_ sync: CloudSync) { self.sync = sync }
    func refresh() async throws -> Bool {
        let status = try await sync.syncNow(timeoutMilliseconds: 10_000)
        state = await sync.state
        return status.isUpToDate
    }
}

@Suite("Cloud sync runtime")
struct CloudSyncTests {
    @Test("the runtime syncs at start and reports syncing, then idle, with the records it sent")
    func syncsAtStart() async throws {
        let device = try RuntimeDevice(seed: 1)
        let cloud = InMemoryCloudDatabase()
        let ids = try device.save("before start")
        let sync = try device.container.startSync(store: "notes", cloud: cloud)
        let log = EventLog(sync)
        #expect(await log.waitFor(isSent))
        #expect(await log.waitFor(isIdle))
        #expect(cloud.records(in: "notes").map(\.recordID) == ids)
        #expect(log.all.contains(.sentChanges(ids.map { PersistentIdentifier(entityName: "SyncNote", id: $0) })))
        #expect(await sync.lastSyncDate == device.container.environment.now())
        #expect(try await sync.serverChangeToken() != nil)
        await sync.stop()
    }

    @Test("a burst of saves is one upload, sent one debounce interval after the last save")
    func burstIsOneDebouncedUpload() async throws {
        let device = try RuntimeDevice(seed: 2)
        let cloud = InMemoryCloudDatabase()
        var options = CloudSync.Options()
        options.debounceMilliseconds = 500
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: options)
        let log = EventLog(sync)
        #expect(await log.waitFor(isIdle))
        var ids: [UUID] = []
        for index in 0..<3 {
            ids += try device.save("burst \(index)")
            device.clock.advance(by: 100)
        }
        #expect(await eventually { await sync.localDeadlineForTesting == device.clock.nowMilliseconds() - 100 + 500 })
        device.clock.advance(by: 399)
        #expect(await eventually { device.clock.waiterCount > 0 })
        #expect(cloud.records(in: "notes").isEmpty)
        device.clock.advance(by: 1)
        #expect(await log.waitFor(isSent))
        #expect(await eventually { await sync.state == .idle })
        #expect(log.count(where: isSent) == 1)
        #expect(Set(cloud.records(in: "notes").map(\.recordID)) == Set(ids))
        await sync.stop()
    }

    @Test("with the network down, syncNow returns within its bound, the runtime waits for the network and resumes when a request succeeds")
    func networkDown() async throws {
        let device = try RuntimeDevice(seed: 3)
        let cloud = OutageCloud(announcesChanges: true, zoneDeletionNeedsNetwork: false)
        var options = CloudSync.Options()
        options.timerMilliseconds = nil
        options.cloudPollingMilliseconds = nil
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: options)
        let log = EventLog(sync)
        #expect(await log.waitFor(isIdle))
        cloud.offline.withLock { $0 = true }
        _ = try device.save("offline")
        let start = device.clock.nowMilliseconds()
        let status = try await sync.syncNow(timeoutMilliseconds: 20_000)
        #expect(device.clock.nowMilliseconds() - start <= 20_000)
        #expect(status.pendingRecords == 1)
        #expect(status.lastError == .networkUnavailable)
        #expect(await sync.state == .waitingForNetwork)
        #expect(await log.waitFor { $0 == .requestFailed(operation: "fetchZoneChanges", error: .networkUnavailable) })
        #expect(await log.waitFor { $0 == .stateChanged(.waitingForNetwork) })
        // The state says so from the first failure on, not only once the bounded syncNow gave up (new-user trial F11).
        let failures = log.all.enumerated().filter { if case .requestFailed = $0.element { true } else { false } }.map(\.offset)
        let waiting = log.all.firstIndex(of: .stateChanged(.waitingForNetwork))
        #expect(failures.count >= 2, "\(log.all)")
        if failures.count >= 2, let waiting { #expect(waiting < failures[1], "\(log.all)") }
        // The network comes back: the runtime's retry (at the engine's backoff) uploads without being asked.
        cloud.offline.withLock { $0 = false }
        #expect(await eventually { device.clock.waiterCount > 0 })
        device.clock.advance(by: options.engine.maxBackoffMilliseconds)
        #expect(await eventually { cloud.inner.records(in: "notes").count == 1 })
        #expect(await eventually { await sync.state == .idle })
        await sync.stop()
    }

    @Test("syncNow after an outage tries at once instead of waiting out the backoff it left; a server's retry-after is kept")
    func syncNowSkipsOwnBackoff() async throws {
        let device = try RuntimeDevice(seed: 31)
        let cloud = OutageCloud(announcesChanges: true, zoneDeletionNeedsNetwork: false)
        var options = CloudSync.Options()
        options.timerMilliseconds = nil
        options.cloudPollingMilliseconds = nil
        options.engine.baseBackoffMilliseconds = 10_000
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: options)
        let log = EventLog(sync)
        #expect(await log.waitFor(isIdle))
        // The network goes down: a bounded syncNow fails and leaves the engine backing off (at least 10 s).
        cloud.offline.withLock { $0 = true }
        _ = try device.save("offline")
        let failed = try await sync.syncNow(timeoutMilliseconds: 1_000)
        #expect(failed.pendingRecords == 1 && failed.lastError == .networkUnavailable)
        // The network is back. With the clock standing still, syncNow has 1 ms: it can only succeed if it does not
        // wait out the 10 s backoff first.
        cloud.offline.withLock { $0 = false }
        let start = device.clock.nowMilliseconds()
        let status = try await sync.syncNow(timeoutMilliseconds: 1)
        #expect(status.pendingRecords == 0, "\(status)")
        #expect(status.lastError == nil)
        #expect(device.clock.nowMilliseconds() == start)
        #expect(cloud.inner.records(in: "notes").count == 1)
        #expect(await log.waitFor(isSent))
        await sync.stop()

        // A server that asks for a delay (rate limit) gets it, explicit sync or not.
        let limited = try RuntimeDevice(seed: 32)
        let inner = InMemoryCloudDatabase()
        let limitedSync = try limited.container.startSync(store: "notes", cloud: inner, options: options)
        _ = try await limitedSync.syncNow(timeoutMilliseconds: 1_000)
        _ = try limited.save("limited")
        inner.injectFailure(.rateLimited(retryAfterMilliseconds: 60_000))
        let first = try await limitedSync.syncNow(timeoutMilliseconds: 1_000)
        #expect(first.pendingRecords == 1 && first.lastError == .rateLimited(retryAfterMilliseconds: 60_000))
        let again = try await limitedSync.syncNow(timeoutMilliseconds: 1)
        #expect(again.pendingRecords == 1, "the server's 60 s retry-after was not honoured: \(again)")
        #expect(inner.records(in: "notes").isEmpty)
        await limitedSync.stop()
    }

    @Test("another device's upload is noticed by polling the cloud's change counter and fetched")
    func pollingNoticesCloudChanges() async throws {
        let cloud = InMemoryCloudDatabase()
        let a = try RuntimeDevice(seed: 4)
        let b = try RuntimeDevice(seed: 5)
        var options = CloudSync.Options()
        options.timerMilliseconds = nil
        options.cloudPollingMilliseconds = 1_000
        let syncA = try a.container.startSync(store: "notes", cloud: cloud, options: options)
        let syncB = try b.container.startSync(store: "notes", cloud: cloud, options: options)
        let logB = EventLog(syncB)
        #expect(await eventually { await syncA.lastSyncDate != nil })
        #expect(await eventually { await syncB.lastSyncDate != nil })
        let ids = try a.save("from A")
        try await syncA.syncNow()
        #expect(await eventually { b.clock.waiterCount > 0 })
        b.clock.advance(by: 1_000)
        #expect(await logB.waitFor { event in
            if case let .fetchedChanges(changes) = event { changes.inserted.map(\.id) == ids } else { false }
        })
        #expect(try b.titles() == ["from A"])
        await syncA.stop()
        await syncB.stop()
    }

    @Test("a cloud announcement of the zone starts a fetch without any clock moving")
    func announcementStartsFetch() async throws {
        let cloud = OutageCloud(announcesChanges: true, zoneDeletionNeedsNetwork: false)
        let device = try RuntimeDevice(seed: 6)
        let other = try RuntimeDevice(seed: 7)
        var options = CloudSync.Options()
        options.timerMilliseconds = nil
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: options)
        let log = EventLog(sync)
        #expect(await log.waitFor(isIdle))
        let otherEngine = try SyncEngine(container: other.container, storeName: "notes")
        _ = try other.save("announced")
        try await SyncDriver.syncUntilIdle(otherEngine, with: cloud, timeoutMilliseconds: 10_000)
        cloud.continuation.yield("some other zone")
        cloud.continuation.yield("notes")
        #expect(await log.waitFor { if case .fetchedChanges = $0 { true } else { false } })
        #expect(try device.titles() == ["announced"])
        await sync.stop()
    }

    @Test("the timer syncs periodically")
    func timerSyncs() async throws {
        let cloud = InMemoryCloudDatabase()
        let device = try RuntimeDevice(seed: 8)
        let other = try RuntimeDevice(seed: 9)
        var options = CloudSync.Options()
        options.timerMilliseconds = 60_000
        options.cloudPollingMilliseconds = nil
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: options)
        let log = EventLog(sync)
        #expect(await log.waitFor(isIdle))
        let otherEngine = try SyncEngine(container: other.container, storeName: "notes")
        _ = try other.save("periodic")
        try await SyncDriver.syncUntilIdle(otherEngine, with: cloud, timeoutMilliseconds: 10_000)
        #expect(await eventually { device.clock.waiterCount > 0 })
        device.clock.advance(by: 59_999)
        #expect(await eventually { device.clock.waiterCount > 0 })
        #expect(try device.titles().isEmpty)
        device.clock.advance(by: 1)
        #expect(await eventually { (try? device.titles()) == ["periodic"] })
        await sync.stop()
    }

    @Test("while paused nothing is uploaded; resuming uploads what was saved meanwhile")
    func pauseAndResume() async throws {
        let cloud = InMemoryCloudDatabase()
        let device = try RuntimeDevice(seed: 10)
        let sync = try device.container.startSync(store: "notes", cloud: cloud)
        let log = EventLog(sync)
        #expect(await log.waitFor(isIdle))
        await sync.pause()
        #expect(await sync.state == .paused)
        _ = try device.save("while paused")
        device.clock.advance(by: 10_000)
        #expect(await eventually { device.clock.waiterCount == 0 && log.all.last == .stateChanged(.paused) })
        #expect(cloud.records(in: "notes").isEmpty)
        await sync.resume()
        #expect(await eventually { cloud.records(in: "notes").count == 1 })
        await sync.stop()
    }

    @Test("stop waits for the request in flight, applies its answer, gives up the lease and ends the events")
    func stopMidRequestLosesNothing() async throws {
        let cloud = GatedCloud()
        let device = try RuntimeDevice(seed: 11)
        _ = try device.save("in flight")
        let sync = try device.container.startSync(store: "notes", cloud: cloud)
        let log = EventLog(sync)
        #expect(await eventually { cloud.arrivedSaves == 1 })
        let stopping = Task { await sync.stop() }
        cloud.open()
        await stopping.value
        #expect(try await sync.status().pendingRecords == 0)
        #expect(cloud.inner.records(in: "notes").count == 1)
        #expect(await sync.state == .stopped)
        #expect(log.all.last == .stateChanged(.stopped))
        // The lease is free at once: another engine of the store uploads without waiting for it to expire.
        let engine = try SyncEngine(container: device.container, storeName: "notes")
        #expect(try engine.nextRequest() != nil)
    }

    @Test("a released runtime goes away with its tasks; saves it never uploaded stay queued for the next one")
    func releasedRuntimeLeaksNothing() async throws {
        let cloud = InMemoryCloudDatabase()
        let device = try RuntimeDevice(seed: 12)
        weak var released: CloudSync?
        do {
            let sync = try device.container.startSync(store: "notes", cloud: cloud)
            released = sync
            #expect(await eventually { await sync.lastSyncDate != nil })
        }
        #expect(await eventually { released == nil })
        #expect(await eventually { device.container.changeHub.subscriptionCount == 0 })
        _ = try device.save("after release")
        let next = try device.container.startSync(store: "notes", cloud: cloud)
        #expect(await eventually { cloud.records(in: "notes").count == 1 })
        await next.stop()
    }

    @Test("records the cloud refuses are reported with their reason")
    func refusedRecordsReported() async throws {
        let cloud = GatedCloud(refusesRecords: true)
        let device = try RuntimeDevice(seed: 13)
        let ids = try device.save("refused")
        let sync = try device.container.startSync(store: "notes", cloud: cloud)
        let log = EventLog(sync)
        let expected = CloudSyncEvent.failedRecords([CloudSyncRecordFailure(
            id: PersistentIdentifier(entityName: "SyncNote", id: ids[0]), error: .invalidRecord(reason: "refused by test"))])
        #expect(await log.waitFor { $0 == expected })
        #expect(try await sync.status().rejectedRecords == 1)
        await sync.stop()
    }

    @Test("a deleted zone and an expired change token are reported; the data is uploaded again")
    func zoneDeletedAndTokenExpired() async throws {
        let cloud = InMemoryCloudDatabase()
        let device = try RuntimeDevice(seed: 14)
        _ = try device.save("kept")
        let sync = try device.container.startSync(store: "notes", cloud: cloud)
        let log = EventLog(sync)
        #expect(await log.waitFor(isIdle))
        cloud.expireChangeTokens(in: "notes")
        try await sync.syncNow()
        #expect(await log.waitFor { $0 == .changeTokenExpired(zone: "notes") })
        cloud.resetZone("notes")
        let status = try await sync.syncNow()
        #expect(await log.waitFor { $0 == .zoneDeleted(zone: "notes", reason: nil) })
        #expect(status.isUpToDate)
        #expect(cloud.records(in: "notes").count == 1)
        #expect(try device.titles() == ["kept"])
        await sync.stop()
    }

    @Test("a full refetch re-reads the zone without touching local data")
    func fullRefetch() async throws {
        let cloud = InMemoryCloudDatabase()
        let device = try RuntimeDevice(seed: 15)
        _ = try device.save("one", "two")
        let sync = try device.container.startSync(store: "notes", cloud: cloud)
        #expect(await eventually { await sync.lastSyncDate != nil })
        await sync.pause()
        try await sync.requestFullRefetch()
        #expect(try await sync.serverChangeToken() == nil)
        let status = try await sync.syncNow()
        #expect(status.isUpToDate)
        #expect(try await sync.serverChangeToken() != nil)
        #expect(try device.titles() == ["one", "two"])
        #expect(cloud.records(in: "notes").count == 2)
        await sync.stop()
    }

    @Test("a runtime is held and called from a custom actor, a main-actor object and a task")
    func usableFromIsolatedContexts() async throws {
        let cloud = InMemoryCloudDatabase()
        let first = try RuntimeDevice(seed: 16)
        let service = SyncService(try first.container.startSync(store: "notes", cloud: cloud))
        _ = try first.save("from an actor")
        #expect(try await service.flush().isUpToDate)
        let second = try RuntimeDevice(seed: 17)
        let model = await SyncViewModel(try second.container.startSync(store: "notes", cloud: cloud))
        #expect(try await model.refresh())
        #expect(await model.state == .idle)
        let third = try RuntimeDevice(seed: 18)
        let sync = try third.container.startSync(store: "notes", cloud: cloud)
        let fromTask = Task.detached { try await sync.syncNow().isUpToDate }
        #expect(try await fromTask.value)
        #expect(try second.titles() == ["from an actor"])
        await service.sync.stop()
        await model.sync.stop()
        await sync.stop()
    }
}

/// Counts a runtime's timed waits (``ReplicaEnvironment/sleepUntil`` calls), or records the order calls returned in.
private final class WaitCounter: Sendable {
    let count = Mutex(0)
    let names = Mutex<[String]>([])
}

/// Scheduling defects of the runtime that the simulator's runtime scenario (`Simulations/runtime-scheduled-sync.json`,
/// P7) found — or, for the last, a reading of the scheduling code while it was moved into `CloudSyncSchedule`. Each
/// test failed before its fix.
@Suite("Cloud sync runtime: scheduling defects the runtime scenario found")
struct CloudSyncScheduleFindingsTests {
    private static func quietOptions() -> CloudSync.Options {
        var options = CloudSync.Options()
        options.timerMilliseconds = nil
        options.cloudPollingMilliseconds = nil
        return options
    }

    @Test("a syncNow that ends at its bound with records left hands them to the automatic schedule at once (seed 4: idle with records pending, nothing scheduled)")
    func syncNowAtItsBoundLeavesWorkScheduled() async throws {
        let device = try RuntimeDevice(seed: 41)
        let cloud = InMemoryCloudDatabase()
        var options = Self.quietOptions()
        options.debounceMilliseconds = 3_600_000
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: options)
        let log = EventLog(sync)
        #expect(await log.waitFor(isIdle))
        _ = try device.save("left at the bound")
        #expect(await eventually { await sync.localDeadlineForTesting != nil })
        // The bound is over before the pass starts: it performs nothing, and the save's debounced pass (an hour away)
        // was taken over by it.
        let status = try await sync.syncNow(timeoutMilliseconds: 0)
        #expect(status.pendingRecords == 1)
        // No clock moves: the automatic pass that goes on with the work starts by itself.
        #expect(await eventually { cloud.records(in: "notes").count == 1 })
        #expect(await eventually { await sync.state == .idle })
        await sync.stop()
    }

    @Test("stop() during a syncNow ends its pass after the request in flight, and a syncNow still waiting performs nothing (seeds 23, 25)")
    func stopEndsExplicitPasses() async throws {
        let cloud = GatedCloud()
        let device = try RuntimeDevice(seed: 42)
        var options = Self.quietOptions()
        options.engine.uploadBatchSize = 1
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: options)
        let log = EventLog(sync)
        #expect(await log.waitFor(isIdle))
        await sync.pause()  // saves start no automatic pass; syncNow still runs
        _ = try device.save("one", "two")
        let first = Task { try await sync.syncNow(timeoutMilliseconds: 60_000) }
        #expect(await eventually { cloud.arrivedSaves == 1 })
        let second = Task { try await sync.syncNow(timeoutMilliseconds: 60_000) }
        for _ in 0..<2_000 { await Task.yield() }
        let stopping = Task { await sync.stop() }
        for _ in 0..<2_000 { await Task.yield() }
        cloud.open()
        _ = try await first.value
        _ = try await second.value
        await stopping.value
        #expect(cloud.arrivedSaves == 1, "an upload went out after stop() was called")
        #expect(cloud.inner.records(in: "notes").count == 1)
        #expect(try await sync.status().pendingRecords == 1)
        #expect(await sync.state == .stopped)
    }

    @Test("syncNow returns at its bound while its own request hangs (a stalled connection, a locked cloud file): the request counts as lost and the next pass sends the record again (trial: 20 s for a bound of 1 s)")
    func syncNowReturnsAtItsBoundWhileItsRequestHangs() async throws {
        let cloud = GatedCloud()
        let device = try RuntimeDevice(seed: 47)
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: Self.quietOptions())
        let log = EventLog(sync)
        #expect(await log.waitFor(isIdle))
        await sync.pause()  // only the syncNow sends
        _ = try device.save("stuck")
        let returned = Mutex(false)
        let explicit = Task {
            defer { returned.withLock { $0 = true } }
            return try await sync.syncNow(timeoutMilliseconds: 1_000)
        }
        #expect(await eventually { cloud.arrivedSaves == 1 })
        device.clock.advance(by: 1_000)
        let inTime = await eventually { returned.withLock { $0 } }
        #expect(inTime, "syncNow did not return at its bound while its upload hung")
        cloud.open()  // lets the hung upload finish (before the fix, only this ended the call)
        let status = try await explicit.value
        if inTime {
            #expect(status.pendingRecords == 1)
            #expect(status.lastError == .networkUnavailable)
        }
        // The upload reached the cloud after all; sending it again finds it there and settles.
        let after = try await sync.syncNow(timeoutMilliseconds: 10_000)
        #expect(after.pendingRecords == 0, "\(after)")
        #expect(cloud.inner.records(in: "notes").count == 1)
        await sync.stop()
    }

    @Test("a syncNow of a task cancelled before it starts leaves the runtime scheduling: the save it interrupted uploads automatically and the state settles (trial: stuck in syncing, the save never uploaded)")
    func cancelledSyncNowLeavesTheScheduleWorking() async throws {
        let cloud = InMemoryCloudDatabase()
        let device = try RuntimeDevice(seed: 48)
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: Self.quietOptions())
        let log = EventLog(sync)
        #expect(await log.waitFor(isIdle))
        _ = try device.save("saved before the cancelled call")
        #expect(await eventually { await sync.localDeadlineForTesting != nil })
        let cancelled = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return try await sync.syncNow(timeoutMilliseconds: 10_000)
        }
        await #expect(throws: CancellationError.self) { try await cancelled.value }
        device.clock.advance(by: 10_000)
        #expect(await eventually { cloud.records(in: "notes").count == 1 }, "the save was not uploaded after the cancelled syncNow")
        let settled = await eventually { await sync.state == .idle }
        let state = await sync.state
        #expect(settled, "state \(state)")
        await sync.stop()
    }

    @Test("a runtime started paused sends nothing until resumed, so a subscriber sees the first pass's events (trial: the launch's import was reported before anyone could subscribe)")
    func startsPausedShowsTheFirstPass() async throws {
        let cloud = InMemoryCloudDatabase()
        let other = try RuntimeDevice(seed: 50)
        _ = try other.save("from the other device")
        let otherSync = try other.container.startSync(store: "notes", cloud: cloud, options: Self.quietOptions())
        #expect(await eventually { cloud.records(in: "notes").count == 1 })
        await otherSync.stop()
        let device = try RuntimeDevice(seed: 51)
        var options = Self.quietOptions()
        options.startsPaused = true
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: options)
        #expect(await sync.state == .paused)
        for _ in 0..<2_000 { await Task.yield() }
        #expect(try device.titles().isEmpty, "a paused runtime synced")
        let log = EventLog(sync)
        await sync.resume()
        #expect(await log.waitFor { if case let .fetchedChanges(changes) = $0 { changes.inserted.count == 1 } else { false } })
        #expect(try device.titles() == ["from the other device"])
        await sync.stop()
    }

    @Test("a pass that ends with nothing left gives up the upload lease: the other process's runtime syncs at once (app-group runtimes waited for each other's lease at every timer)")
    func idlePassGivesUpTheLease() async throws {
        let directory = temporaryTestDirectory("runtime-lease")
        let cloud = InMemoryCloudDatabase()
        let options = Self.quietOptions()
        func open(_ seed: UInt64) throws -> ModelContainer {
            let environment = ReplicaEnvironment.seeded(seed: seed, directory: directory)
            return try ModelContainer(for: Schema([SyncNote.self]), configurations: [
                ModelConfiguration("notes", cloudKitDatabase: .private("iCloud.test")),
            ], environment: environment)
        }
        let app = try open(51)
        let appSync = try app.startSync(store: "notes", cloud: cloud, options: options)
        #expect(await eventually { await appSync.lastSyncDate != nil })
        await appSync.pause()
        let ext = try open(52)
        let context = ModelContext(ext)
        context.insert(SyncNote(title: "from the extension"))
        try context.save()
        let extSync = try ext.startSync(store: "notes", cloud: cloud, options: options)
        // Within 5 s (the clock moves only by the containers' 100 ms polls of other processes' commits) only a free
        // lease lets the upload go: a lease held by the paused app would last 30 s.
        let status = try await extSync.syncNow(timeoutMilliseconds: 5_000)
        #expect(status.pendingRecords == 0, "\(status)")
        #expect(cloud.records(in: "notes").count == 1)
        await extSync.stop()
        await appSync.stop()
    }

    @Test("a syncNow that waits for an automatic pass returns within its bound and the request in flight then, not after the whole pass (seeds 7, 13)")
    func syncNowWaitsForAnAutomaticPassOnlyAsLongAsItsRequest() async throws {
        let device = try RuntimeDevice(seed: 45)
        _ = try device.save("1", "2", "3", "4", "5")
        // Each upload takes a second of the device's clock; the first waits until the test opens the gate.
        let cloud = SlowCloud(clock: device.clock, uploadMilliseconds: 1_000)
        var options = Self.quietOptions()
        options.engine.uploadBatchSize = 1
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: options)
        #expect(await eventually { cloud.arrivedUploads == 1 })
        let start = device.clock.nowMilliseconds()
        let explicit = Task { try await sync.syncNow(timeoutMilliseconds: 1_500) }
        for _ in 0..<2_000 { await Task.yield() }
        cloud.open()
        _ = try await explicit.value
        let returned = device.clock.nowMilliseconds()
        // The bound, plus the upload in flight when it passed: at most 2.5 s, not the 5 s of the automatic pass.
        #expect(returned - start <= 2_500, "syncNow returned after \(returned - start) ms")
        // The rest goes by the automatic schedule. The explicit pass's upload ends past its bound, so its answer races
        // the bound's timer: when the timer wins, the request counts as lost and the engine backs off before sending
        // again — a wait on the device's clock, which only uploads move here, so the test moves it (the flake of 2 in
        // 12 runs: the wait never ended).
        #expect(await eventually {
            if cloud.inner.records(in: "notes").count == 5 { return true }
            device.clock.advance(by: 10)
            return false
        })
        await sync.stop()
    }

    @Test("a syncNow that waits for another syncNow's pass returns at its own bound (seed 8: it waited through the other's backoff)")
    func syncNowWaitsForAnotherOnlyUntilItsBound() async throws {
        let device = try RuntimeDevice(seed: 46)
        let cloud = GatedCloud()
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: Self.quietOptions())
        let log = EventLog(sync)
        #expect(await log.waitFor(isIdle))
        _ = try device.save("held up")
        let order = WaitCounter()
        // The first call's upload hangs; the second may wait for it only until its own bound, a second.
        let long = Task {
            _ = try await sync.syncNow(timeoutMilliseconds: 60_000)
            order.names.withLock { $0.append("long") }
        }
        #expect(await eventually { cloud.arrivedSaves == 1 })
        let short = Task {
            _ = try await sync.syncNow(timeoutMilliseconds: 1_000)
            order.names.withLock { $0.append("short") }
        }
        for _ in 0..<2_000 { await Task.yield() }
        device.clock.advance(by: 2_000)
        #expect(await eventually { order.names.withLock { $0 } == ["short"] })
        cloud.open()
        try await short.value
        try await long.value
        #expect(order.names.withLock { $0 } == ["short", "long"])
        await sync.stop()
    }

    @Test("a syncNow cancelled while it waits for another call's pass returns at once with CancellationError, not at its bound, and the engine goes on to the next call (found by runtime-cancelled-sync)")
    func cancelledSyncNowStopsWaitingForTheEngine() async throws {
        let device = try RuntimeDevice(seed: 47)
        let cloud = GatedCloud()
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: Self.quietOptions())
        let log = EventLog(sync)
        #expect(await log.waitFor(isIdle))
        _ = try device.save("held up")
        let order = WaitCounter()
        // The first call's upload hangs, so the second waits for the engine — with a bound of a minute.
        let holder = Task {
            _ = try await sync.syncNow(timeoutMilliseconds: 60_000)
            order.names.withLock { $0.append("holder") }
        }
        #expect(await eventually { cloud.arrivedSaves == 1 })
        let waiting = Task {
            do {
                _ = try await sync.syncNow(timeoutMilliseconds: 60_000)
                order.names.withLock { $0.append("waiting returned") }
            } catch is CancellationError {
                order.names.withLock { $0.append("waiting cancelled") }
            }
        }
        for _ in 0..<2_000 { await Task.yield() }
        waiting.cancel()
        // No clock moves and the first call's request still hangs: only cancellation can end the wait.
        #expect(await eventually { order.names.withLock { $0 } == ["waiting cancelled"] }, "the cancelled call went on waiting")
        cloud.open()
        try await holder.value
        try await waiting.value
        #expect(order.names.withLock { $0 } == ["waiting cancelled", "holder"])
        // The engine was not left held: a third call gets it and finishes the work.
        let status = try await sync.syncNow(timeoutMilliseconds: 10_000)
        #expect(status.pendingRecords == 0)
        await sync.stop()
    }

    @Test("a clock set back during a bounded sync stretches the bound by at most the request in flight, not by the jump (seeds 10, 17)")
    func backwardClockJumpKeepsTheBound() async throws {
        let device = try Device("A", seed: 43)
        let cloud = ClockJumpingCloud(clock: device.clock, jump: -600_000)
        let start = device.clock.nowMilliseconds()
        let status = try await SyncDriver.syncUntilIdle(device.engine, with: cloud, timeoutMilliseconds: 30_000)
        // Virtual time that passed: what the clock moved, plus the 10 minutes it was set back.
        let elapsed = device.clock.nowMilliseconds() - start + 600_000
        #expect(elapsed <= 31_000, "the sync went on for \(elapsed) ms")
        #expect(status.lastError == .networkUnavailable)
    }

    @Test("while a syncNow holds the engine, the scheduler waits for it instead of looking again and again at a deadline that passed (found reading the code)")
    func schedulerDoesNotSpinWhileASyncNowRuns() async throws {
        let directory = temporaryTestDirectory("runtime-spin")
        var environment = ReplicaEnvironment.seeded(seed: 44, directory: directory)
        let clock = try #require(environment.clock as? ManualClock)
        let waits = WaitCounter()
        environment.sleepUntil = { deadline in
            waits.count.withLock { $0 += 1 }
            try await clock.sleep(until: deadline)
        }
        let container = try ModelContainer(for: Schema([SyncNote.self]), configurations: [
            ModelConfiguration("notes", isStoredInMemoryOnly: true, cloudKitDatabase: .private("iCloud.test")),
        ], environment: environment)
        let cloud = GatedCloud()
        var options = Self.quietOptions()
        options.debounceMilliseconds = 100
        let sync = try container.startSync(store: "notes", cloud: cloud, options: options)
        let log = EventLog(sync)
        #expect(await log.waitFor(isIdle))
        let context = ModelContext(container)
        context.insert(SyncNote(title: "sent by syncNow"))
        try context.save()
        let explicit = Task { try await sync.syncNow(timeoutMilliseconds: 60_000) }
        #expect(await eventually { cloud.arrivedSaves == 1 })
        // A save while the syncNow's upload is in flight: its debounced pass becomes due while the syncNow holds the
        // engine.
        context.insert(SyncNote(title: "saved meanwhile"))
        try context.save()
        #expect(await eventually { await sync.localDeadlineForTesting != nil })
        clock.advance(by: 200)
        for _ in 0..<500 { await Task.yield() }
        let before = waits.count.withLock { $0 }
        for _ in 0..<5_000 { await Task.yield() }
        let after = waits.count.withLock { $0 }
        #expect(after - before <= 2, "the scheduler waited \(after - before) times while nothing happened")
        cloud.open()
        _ = try await explicit.value
        #expect(await eventually { cloud.inner.records(in: "notes").count == 2 })
        await sync.stop()
    }
}

/// A cloud that is offline and, at its first request, sets the device's clock `jump` milliseconds (a clock set back).
private final class ClockJumpingCloud: CloudDatabase {
    let clock: ManualClock
    let jump: Int64
    private let jumped = Mutex(false)
    init(clock: ManualClock, jump: Int64) {
        self.clock = clock
        self.jump = jump
    }

    private func fail() throws(CloudError) -> Never {
        if jumped.withLock({ done in defer { done = true }; return !done }) { clock.advance(by: jump) }
        throw .networkUnavailable
    }
    func createZone(_ zone: String) async throws(CloudError) { try fail() }
    func deleteZone(_ zone: String) async throws(CloudError) { try fail() }
    func modifyRecords(_ records: [CloudRecord], in zone: String) async throws(CloudError) -> [RecordSaveResult] { try fail() }
    func fetchZoneChanges(_ zone: String, since token: ServerChangeToken?, limit: Int) async throws(CloudError) -> ZoneChangeBatch { try fail() }
    func zoneMetadata(_ zone: String) async throws(CloudError) -> [String: Data] { try fail() }
    func setZoneMetadata(_ zone: String, key: String, value: Data, ifCurrent expected: Data?) async throws(CloudError) -> Data { try fail() }
}

/// A cloud whose uploads each take `uploadMilliseconds` of the device's clock; the first waits until the test opens the
/// gate.
private final class SlowCloud: CloudDatabase {
    let inner = InMemoryCloudDatabase()
    let clock: ManualClock
    let uploadMilliseconds: Int64
    private let gate = Mutex<(open: Bool, waiters: [CheckedContinuation<Void, Never>], arrived: Int)>((false, [], 0))
    init(clock: ManualClock, uploadMilliseconds: Int64) {
        self.clock = clock
        self.uploadMilliseconds = uploadMilliseconds
    }

    var arrivedUploads: Int { gate.withLock { $0.arrived } }
    func open() {
        let waiters = gate.withLock { gate -> [CheckedContinuation<Void, Never>] in
            gate.open = true
            defer { gate.waiters = [] }
            return gate.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    func createZone(_ zone: String) async throws(CloudError) { try inner.createZone(zone) }
    func deleteZone(_ zone: String) async throws(CloudError) { try inner.deleteZone(zone) }
    func modifyRecords(_ records: [CloudRecord], in zone: String) async throws(CloudError) -> [RecordSaveResult] {
        await withCheckedContinuation { continuation in
            let go = gate.withLock { gate -> Bool in
                gate.arrived += 1
                if gate.open { return true }
                gate.waiters.append(continuation)
                return false
            }
            if go { continuation.resume() }
        }
        clock.advance(by: uploadMilliseconds)
        return try inner.modifyRecords(records, in: zone)
    }
    func fetchZoneChanges(_ zone: String, since token: ServerChangeToken?, limit: Int) async throws(CloudError) -> ZoneChangeBatch {
        try inner.fetchZoneChanges(zone, since: token, limit: limit)
    }
    func zoneMetadata(_ zone: String) async throws(CloudError) -> [String: Data] { try inner.zoneMetadata(zone) }
    func setZoneMetadata(_ zone: String, key: String, value: Data, ifCurrent expected: Data?) async throws(CloudError) -> Data {
        try inner.setZoneMetadata(zone, key: key, value: value, ifCurrent: expected)
    }
}
