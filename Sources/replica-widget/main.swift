// replica-widget: a second OS process for the app-group tests. It plays a widget that shares the app's store file.
//
//   replica-widget write DIR TEXT...        insert one Note per TEXT, save, print the new history token value
//   replica-widget history DIR AFTER        print each transaction after token value AFTER as one JSON line
//   replica-widget identity DIR             print the store's replica identity
//   replica-widget sync DIR CLOUD TEXT...     a separate device: insert one Note per TEXT into its synced store in DIR,
//                                           sync through the SQLiteCloudDatabase file CLOUD, print every note's text
//                                           (sorted) as one JSON array
//   replica-widget lease-hold DIR CLOUD MS    open the app-group *synced* store, insert a note, take the upload lease
//                                           (duration MS) by performing one sync request against CLOUD, print
//                                           "ready", then block on stdin (the test kills it while it holds the lease)
//   replica-widget runtime DIR CLOUD EXPECT TEXT...
//                                           open the app-group *synced* store with a sync runtime (CloudSync: 50 ms
//                                           debounce, 500 ms timer, 10 s lease) against CLOUD, insert one note per
//                                           TEXT, wait (at most 600 s) until the store holds EXPECT notes, then print
//                                           {"texts": [sorted], "requests": [{"name", "start", "end"}]} (wall-clock
//                                           milliseconds of every request this process performed) and stop
//   replica-widget open-hold DIR TEXT...     open the store, print "ready", wait for a line on stdin, then insert one
//                                           Note per TEXT, save and exit (the test migrates beside it, or kills it)
//   replica-widget hold DIR COUNT           insert COUNT notes inside one open transaction, print "ready", then block
//                                           on stdin (the test kills the process with SIGKILL mid-transaction)
//
// DIR is the app-group directory root; the store is the "shared" configuration of group "group.replica.tests".
import Foundation
import Replica

struct Note: PersistentModel, Codable {
    var id = UUID.unassigned
    var text: String = ""
    static let entity = ModelEntity<Note>([.attribute("text", \.text, default: "")])
}

func container(_ root: String, holdBeforeCommit: Bool = false) throws -> ModelContainer {
    var environment = ReplicaEnvironment.live
    if holdBeforeCommit {
        environment.faultHook = { point in
            guard case .beforeCommit = point else { return }
            print("ready")
            fflush(nil)
            _ = readLine()
        }
    }
    environment.processIdentity = ProcessIdentity(bundleIdentifier: "com.example.trips.widget", processName: "widget",
                                                  processID: ProcessInfo.processInfo.processIdentifier)
    let groups = URL(fileURLWithPath: root, isDirectory: true)
    environment.appGroupDirectory = { groups.appendingPathComponent($0, isDirectory: true) }
    environment.defaultStoreDirectory = groups
    return try ModelContainer(for: Schema([Note.self]),
                              configurations: [ModelConfiguration("shared", groupContainer: .identifier("group.replica.tests"))],
                              environment: environment)
}

func syncedDevice(_ root: String) throws -> ModelContainer {
    var environment = ReplicaEnvironment.live
    environment.defaultStoreDirectory = URL(fileURLWithPath: root, isDirectory: true)
    return try ModelContainer(for: Schema([Note.self]),
                              configurations: [ModelConfiguration("notes", cloudKitDatabase: .private("iCloud.replica.tests"))],
                              environment: environment)
}

let arguments = CommandLine.arguments
if arguments.count >= 5, arguments[1] == "lease-hold" {
    do {
        var environment = ReplicaEnvironment.live
        let groups = URL(fileURLWithPath: arguments[2], isDirectory: true)
        environment.appGroupDirectory = { groups.appendingPathComponent($0, isDirectory: true) }
        let device = try ModelContainer(for: Schema([Note.self]), configurations: [
            ModelConfiguration("shared-synced", groupContainer: .identifier("group.replica.tests"), cloudKitDatabase: .private("iCloud.replica.tests")),
        ], environment: environment)
        let context = ModelContext(device)
        context.insert(Note(text: "written by the widget"))
        try context.save()
        var options = SyncEngine.Options()
        options.leaseDurationMilliseconds = Int64(arguments[4])!
        let engine = try SyncEngine(container: device, storeName: "shared-synced", options: options)
        let cloud = try SQLiteCloudDatabase(url: URL(fileURLWithPath: arguments[3]))
        guard let request = try engine.nextRequest() else { throw ReplicaError.loadIssueModelContainer(configuration: "shared-synced", reason: "no lease") }
        try engine.handle(request.id, await cloud.perform(request.operation))
        print("ready")
        fflush(nil)
        _ = readLine()
    } catch {
        FileHandle.standardError.write(Data("replica-widget: \(error)\n".utf8))
        exit(1)
    }
    exit(0)
}
/// A cloud that logs when each request of this process ran (wall-clock milliseconds).
final class LoggingCloud: CloudDatabase, @unchecked Sendable {
    let base: SQLiteCloudDatabase
    private let lock = NSLock()
    private var entries: [[String: Any]] = []
    init(_ base: SQLiteCloudDatabase) { self.base = base }

    var log: [[String: Any]] { lock.withLock { entries } }
    private func logged<T>(_ name: String, _ body: () throws(CloudError) -> T) throws(CloudError) -> T {
        let start = Int64(Date().timeIntervalSince1970 * 1000)
        defer {
            let end = Int64(Date().timeIntervalSince1970 * 1000)
            lock.withLock { entries.append(["name": name, "start": start, "end": end]) }
        }
        return try body()
    }
    func createZone(_ zone: String) async throws(CloudError) { try logged("createZone") { () throws(CloudError) in try base.createZone(zone) } }
    func deleteZone(_ zone: String) async throws(CloudError) { try logged("deleteZone") { () throws(CloudError) in try base.deleteZone(zone) } }
    func modifyRecords(_ records: [CloudRecord], in zone: String) async throws(CloudError) -> [RecordSaveResult] {
        try logged("modifyRecords") { () throws(CloudError) in try base.modifyRecords(records, in: zone) }
    }
    func fetchZoneChanges(_ zone: String, since token: ServerChangeToken?, limit: Int) async throws(CloudError) -> ZoneChangeBatch {
        try logged("fetchZoneChanges") { () throws(CloudError) in try base.fetchZoneChanges(zone, since: token, limit: limit) }
    }
    func zoneMetadata(_ zone: String) async throws(CloudError) -> [String: Data] {
        try logged("fetchZoneMetadata") { () throws(CloudError) in try base.zoneMetadata(zone) }
    }
    func setZoneMetadata(_ zone: String, key: String, value: Data, ifCurrent expected: Data?) async throws(CloudError) -> Data {
        try logged("setZoneMetadata") { () throws(CloudError) in try base.setZoneMetadata(zone, key: key, value: value, ifCurrent: expected) }
    }
    func changeCounter() -> Int64? { base.changeCounter() }
}

if arguments.count >= 5, arguments[1] == "runtime" {
    do {
        var environment = ReplicaEnvironment.live
        let groups = URL(fileURLWithPath: arguments[2], isDirectory: true)
        environment.appGroupDirectory = { groups.appendingPathComponent($0, isDirectory: true) }
        environment.processIdentity = ProcessIdentity(bundleIdentifier: "com.example.trips.widget", processName: "widget",
                                                      processID: ProcessInfo.processInfo.processIdentifier)
        let device = try ModelContainer(for: Schema([Note.self]), configurations: [
            ModelConfiguration("shared-synced", groupContainer: .identifier("group.replica.tests"), cloudKitDatabase: .private("iCloud.replica.tests")),
        ], environment: environment)
        let cloud = LoggingCloud(try SQLiteCloudDatabase(url: URL(fileURLWithPath: arguments[3])))
        let expected = Int(arguments[4])!
        var options = CloudSync.Options()
        options.debounceMilliseconds = 50
        options.timerMilliseconds = 500
        options.cloudPollingMilliseconds = 200
        options.engine.leaseDurationMilliseconds = 10_000
        let sync = try device.startSync(store: "shared-synced", cloud: cloud, options: options)
        let context = ModelContext(device)
        context.author = "widget"
        for text in arguments.dropFirst(5) { context.insert(Note(text: text)) }
        try context.save()
        var texts: [String] = []
        // At most 600 s from launch: the test's earlier steps may take minutes on a loaded CI machine, and a widget that
        // gave up before the test's last write reads as a lease or import failure.
        for _ in 0..<12_000 {
            texts = try ModelContext(device).fetch(Note.self).map(\.text).sorted()
            if texts.count >= expected { break }
            try await Task.sleep(nanoseconds: 50_000_000)
        }
        await sync.stop()
        let output: [String: Any] = ["texts": texts, "requests": cloud.log]
        print(String(decoding: try JSONSerialization.data(withJSONObject: output, options: [.sortedKeys]), as: UTF8.self))
    } catch {
        FileHandle.standardError.write(Data("replica-widget: \(error)\n".utf8))
        exit(1)
    }
    exit(0)
}
if arguments.count >= 4, arguments[1] == "sync" {
    do {
        let device = try syncedDevice(arguments[2])
        let cloud = try SQLiteCloudDatabase(url: URL(fileURLWithPath: arguments[3]))
        let context = ModelContext(device)
        for text in arguments.dropFirst(4) { context.insert(Note(text: text)) }
        try context.save()
        let engine = try SyncEngine(container: device, storeName: "notes")
        let status = try await SyncDriver.syncUntilIdle(engine, with: cloud)
        guard status.isUpToDate else { throw ReplicaError.loadIssueModelContainer(configuration: "notes", reason: "sync did not finish") }
        let texts = try ModelContext(device).fetch(Note.self).map(\.text).sorted()
        print(String(decoding: try JSONSerialization.data(withJSONObject: texts), as: UTF8.self))
    } catch {
        FileHandle.standardError.write(Data("replica-widget: \(error)\n".utf8))
        exit(1)
    }
    exit(0)
}
guard arguments.count >= 3 else {
    FileHandle.standardError.write(Data("usage: replica-widget write|history|identity|open-hold|hold DIR ...\n".utf8))
    exit(2)
}
do {
    let container = try container(arguments[2], holdBeforeCommit: arguments[1] == "hold")
    let context = ModelContext(container)
    context.author = "widget"
    switch arguments[1] {
    case "write":
        for text in arguments.dropFirst(3) { context.insert(Note(text: text)) }
        try context.save()
        print(try context.currentHistoryToken(of: "shared").value)
    case "history":
        let after = Int64(arguments[3])!
        let store = container.storeIdentity(of: "shared")!
        for transaction in try context.fetchHistory(HistoryDescriptor(after: HistoryToken(storeIdentity: store, value: after))) {
            let notes = try transaction.changes.compactMap { change -> String? in
                guard case let .insert(id) = change else { return nil }
                return try context.model(Note.self, id: id.id)?.text
            }
            let line: [String: Any] = ["token": transaction.token.value, "author": transaction.author ?? NSNull(),
                                       "bundle": transaction.bundleIdentifier, "inserted": notes]
            let data = try JSONSerialization.data(withJSONObject: line, options: [.sortedKeys])
            print(String(decoding: data, as: UTF8.self))
        }
    case "identity":
        print(container.storeIdentity(of: "shared")!.uuidString)
    case "open-hold":
        print("ready")
        fflush(nil)
        _ = readLine()
        for text in arguments.dropFirst(3) { context.insert(Note(text: text)) }
        try context.save()
    case "hold":
        let count = Int(arguments[3])!
        for i in 0..<count { context.insert(Note(text: "partial \(i)")) }
        try context.save()
    default:
        exit(2)
    }
} catch {
    FileHandle.standardError.write(Data("replica-widget: \(error)\n".utf8))
    exit(1)
}
