import Foundation
import Synchronization
import Testing
@testable import Replica

/// The model the `replica-widget` helper executable declares.
private struct SharedNote: PersistentModel, Codable {
    static var entityName: String { "Note" }
    var id = UUID.unassigned
    var text: String = ""
    static let entity = ModelEntity<SharedNote>([.attribute("text", \.text, default: "")])
}

/// The `replica-widget` helper, built beside the test bundle.
private func helperExecutable() -> URL {
    var directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    for _ in 0..<3 where !FileManager.default.fileExists(atPath: directory.appendingPathComponent("replica-widget").path) {
        directory = directory.deletingLastPathComponent()
    }
    return directory.appendingPathComponent("replica-widget")
}

private func wallMilliseconds() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

/// A cloud that logs when each request of this process ran (wall-clock milliseconds).
private final class TimedCloud: CloudDatabase {
    let base: SQLiteCloudDatabase
    let intervals = Mutex<[(name: String, start: Int64, end: Int64)]>([])
    init(_ base: SQLiteCloudDatabase) { self.base = base }

    private func timed<T>(_ name: String, _ body: () throws(CloudError) -> T) throws(CloudError) -> T {
        let start = wallMilliseconds()
        defer { intervals.withLock { $0.append((name, start, wallMilliseconds())) } }
        return try body()
    }
    func createZone(_ zone: String) async throws(CloudError) { try timed("createZone") { () throws(CloudError) in try base.createZone(zone) } }
    func deleteZone(_ zone: String) async throws(CloudError) { try timed("deleteZone") { () throws(CloudError) in try base.deleteZone(zone) } }
    func modifyRecords(_ records: [CloudRecord], in zone: String) async throws(CloudError) -> [RecordSaveResult] {
        try timed("modifyRecords") { () throws(CloudError) in try base.modifyRecords(records, in: zone) }
    }
    func fetchZoneChanges(_ zone: String, since token: ServerChangeToken?, limit: Int) async throws(CloudError) -> ZoneChangeBatch {
        try timed("fetchZoneChanges") { () throws(CloudError) in try base.fetchZoneChanges(zone, since: token, limit: limit) }
    }
    func zoneMetadata(_ zone: String) async throws(CloudError) -> [String: Data] {
        try timed("fetchZoneMetadata") { () throws(CloudError) in try base.zoneMetadata(zone) }
    }
    func setZoneMetadata(_ zone: String, key: String, value: Data, ifCurrent expected: Data?) async throws(CloudError) -> Data {
        try timed("setZoneMetadata") { () throws(CloudError) in try base.setZoneMetadata(zone, key: key, value: value, ifCurrent: expected) }
    }
    func changeCounter() -> Int64? { base.changeCounter() }
}

/// Waits (real time, at most `seconds`) until `condition` holds.
private func waitUntil(seconds: Double = 90, _ condition: () async throws -> Bool) async throws -> Bool {
    let end = Date().addingTimeInterval(seconds)
    while Date() < end {
        if try await condition() { return true }
        try await Task.sleep(nanoseconds: 50_000_000)
    }
    return try await condition()
}

/// Two real OS processes on one app-group store, each with its own sync runtime, and a third device syncing through
/// the same SQLite cloud file (P6 of `Specs/replication-protocol.md`).
@Suite("App-group runtimes in two OS processes", .serialized)
struct AppGroupRuntimeProcessTests {
    @Test("each process runs a CloudSync: one uploads at a time (the lease), both see each other's and imported changes")
    func twoRuntimesOneStore() async throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("replica-appgroup-runtime-\(UUID().uuidString)", isDirectory: true)
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        let cloudFile = root.appendingPathComponent("cloud.sqlite")

        // The app: this process, on the real clock (the helper's clock), with a runtime that syncs every 500 ms and so
        // renews its 10 s lease (once half of it has gone) while it runs.
        var environment = ReplicaEnvironment.live
        environment.appGroupDirectory = { root.appendingPathComponent($0, isDirectory: true) }
        environment.processIdentity = ProcessIdentity(bundleIdentifier: "com.example.trips", processName: "app",
                                                      processID: ProcessInfo.processInfo.processIdentifier)
        let app = try ModelContainer(for: Schema([SharedNote.self]), configurations: [
            ModelConfiguration("shared-synced", groupContainer: .identifier("group.replica.tests"), cloudKitDatabase: .private("iCloud.replica.tests")),
        ], environment: environment)
        let appContext = ModelContext(app)
        appContext.insert(SharedNote(text: "from the app"))
        try appContext.save()
        var options = CloudSync.Options()
        options.debounceMilliseconds = 50
        options.timerMilliseconds = 500
        options.cloudPollingMilliseconds = 200
        options.engine.leaseDurationMilliseconds = 10_000
        let appCloud = TimedCloud(try SQLiteCloudDatabase(url: cloudFile))
        let appSync = try app.startSync(store: "shared-synced", cloud: appCloud, options: options)
        // Its first sync, asked for. syncNow returns at its bound, also with its work unfinished (a loaded machine — the
        // whole suite runs beside this test on two cores — can hold a request up for minutes): asked again until it is
        // up to date, for at most 5 minutes; a failure shows the status.
        var first = try await appSync.syncNow(timeoutMilliseconds: 30_000)
        let synced = try await waitUntil(seconds: 300) {
            if first.isUpToDate { return true }
            first = try await appSync.syncNow(timeoutMilliseconds: 30_000)
            return first.isUpToDate
        }
        #expect(synced, "\(first)")
        #expect(await appSync.lastSyncDate != nil)

        // The widget: a second OS process with its own runtime on the same store file, waiting to see four notes.
        let widget = Process()
        widget.executableURL = helperExecutable()
        widget.arguments = ["runtime", root.path, cloudFile.path, "4", "from the widget"]
        let output = Pipe()
        widget.standardOutput = output
        try widget.run()

        // Another device, with a store of its own, syncs through the same cloud file.
        var deviceEnvironment = ReplicaEnvironment.live
        deviceEnvironment.defaultStoreDirectory = root.appendingPathComponent("device", isDirectory: true)
        let device = try ModelContainer(for: Schema([SharedNote.self]), configurations: [
            ModelConfiguration("shared-synced", cloudKitDatabase: .private("iCloud.replica.tests")),
        ], environment: deviceEnvironment)
        let deviceEngine = try SyncEngine(container: device, storeName: "shared-synced")
        let deviceCloud = try SQLiteCloudDatabase(url: cloudFile)
        let deviceContext = ModelContext(device)
        deviceContext.insert(SharedNote(text: "from a device"))
        try deviceContext.save()
        #expect(try await SyncDriver.syncUntilIdle(deviceEngine, with: deviceCloud).isUpToDate)

        // The app sees the widget's note (the shared file) and the device's (imported), and uploads the widget's.
        func appTexts() throws -> [String] { try ModelContext(app).fetch(SharedNote.self).map(\.text).sorted() }
        #expect(try await waitUntil { try appTexts() == ["from a device", "from the app", "from the widget"] })
        #expect(try await waitUntil { try deviceCloud.records(in: "shared-synced").count == 3 })

        // The app stops (giving up the lease); the device writes once more; the widget takes over and imports it.
        let appStopped = wallMilliseconds()
        await appSync.stop()
        // stop() waits for a request in flight (its answer is applied): nothing of the app's ends after it returned.
        let appStopReturned = wallMilliseconds()
        deviceContext.insert(SharedNote(text: "late, from a device"))
        try deviceContext.save()
        #expect(try await SyncDriver.syncUntilIdle(deviceEngine, with: deviceCloud).isUpToDate)
        #expect(try await waitUntil(seconds: 600) { !widget.isRunning })
        let data = output.fileHandleForReading.readDataToEndOfFile()
        #expect(widget.terminationStatus == 0)
        let report = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        #expect(report["texts"] as? [String] == ["from a device", "from the app", "from the widget", "late, from a device"])
        let widgetRequests = try #require(report["requests"] as? [[String: Any]])
        let widgetIntervals = widgetRequests.compactMap { entry -> (start: Int64, end: Int64)? in
            guard let start = (entry["start"] as? NSNumber)?.int64Value, let end = (entry["end"] as? NSNumber)?.int64Value else { return nil }
            return (start, end)
        }
        let appIntervals = appCloud.intervals.withLock { $0 }
        // One process talks to the cloud at a time: no request of one overlaps a request of the other (a holder that
        // stalls past its lease may be replaced, never joined), and the widget took over once the app let it go.
        #expect(!appIntervals.isEmpty && appIntervals.allSatisfy { $0.end <= appStopReturned + 1 })
        #expect(widgetIntervals.contains { $0.start >= appStopped })
        let overlapping = widgetIntervals.filter { widget in appIntervals.contains { $0.start < widget.end && widget.start < $0.end } }
        #expect(overlapping.isEmpty, "widget requests overlapping the app's: \(overlapping)")
        // Everything is in the cloud once, and the app (its store is the widget's) sees the late note too.
        #expect(try deviceCloud.records(in: "shared-synced").count == 4)
        #expect(try appTexts().count == 4)
        #expect(try ModelContext(device).fetch(SharedNote.self).count == 4)
    }
}
