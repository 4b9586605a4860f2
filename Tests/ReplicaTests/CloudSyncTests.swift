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
