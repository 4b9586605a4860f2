// trips-example: a host app that opens one container with the seed schemas split over a local-only store and a
// synced store, writes, reads back and prints what it did, store by store.
//
// The block between the README markers is quoted verbatim in README.md; a test keeps the two identical.
import Foundation
import Replica

// README:begin
struct Trip: PersistentModel, Codable {
    var id = UUID.unassigned
    var name: String = ""
    var destination: String?
    var startDate: Date?
    var items: [Reference<BucketListItem>] = []

    static let entity = ModelEntity<Trip>([
        .attribute("name", \.name, default: "", options: .preserveValueOnDeletion),
        .attribute("destination", \.destination),
        .attribute("startDate", \.startDate),
        .toMany("items", \.items, inverse: "trip", deleteRule: .cascade),
    ])
}

struct BucketListItem: PersistentModel, Codable {
    var id = UUID.unassigned
    var title: String = ""
    var isDone: Bool = false
    var trip: Reference<Trip>?

    static let entity = ModelEntity<BucketListItem>([
        .attribute("title", \.title, default: ""),
        .attribute("isDone", \.isDone, default: false),
        .toOne("trip", \.trip, inverse: "items"),
    ])
}

struct Draft: PersistentModel, Codable {
    var id = UUID.unassigned
    var text: String
    var slug: String

    static let entity = ModelEntity<Draft>([
        .attribute("text", \.text),
        .attribute("slug", \.slug, options: .unique),
    ])
}

func runExample(in directory: URL) throws -> [String] {
    var environment = ReplicaEnvironment.live
    environment.defaultStoreDirectory = directory

    let synced = ModelConfiguration("trips", schema: Schema([Trip.self, BucketListItem.self]),
                                    cloudKitDatabase: .private("iCloud.com.example.trips"))
    let local = ModelConfiguration("drafts", schema: Schema([Draft.self]))
    let container = try ModelContainer(for: Trip.self, BucketListItem.self, Draft.self,
                                       configurations: synced, local, environment: environment)

    let context = ModelContext(container)
    let trip = context.insert(Trip(name: "Iceland", destination: "Reykjavík"))
    context.insert(BucketListItem(title: "See the northern lights", trip: Reference(trip)))
    context.insert(BucketListItem(title: "Bathe in a hot spring", trip: Reference(trip)))
    context.insert(Draft(text: "Pack wool socks", slug: "socks"))
    try context.save()

    var report: [String] = []
    for trip in try context.fetch(Trip.self) {
        let items = try trip.items.compactMap { try context.model(BucketListItem.self, id: $0.id)?.title }
        report.append("store 'trips' (synced):  Trip \(trip.name) → \(trip.destination ?? "?"), items: \(items.joined(separator: "; "))")
    }
    for draft in try context.fetch(Draft.self) {
        report.append("store 'drafts' (local):  Draft '\(draft.slug)': \(draft.text)")
    }
    return report
}

/// A second device opens its own container, syncs both devices through one cloud database file, and reads the trip.
func syncExample(in directory: URL) async throws -> [String] {
    func device(_ name: String) throws -> ModelContainer {
        var environment = ReplicaEnvironment.live
        environment.defaultStoreDirectory = directory.appendingPathComponent(name)
        return try ModelContainer(for: Trip.self, BucketListItem.self, configurations: ModelConfiguration(
            "trips", cloudKitDatabase: .private("iCloud.com.example.trips")), environment: environment)
    }
    let cloud = try SQLiteCloudDatabase(url: directory.appendingPathComponent("cloud.sqlite"))
    let phone = try device("phone"), laptop = try device("laptop")

    let context = ModelContext(phone)
    let trip = context.insert(Trip(name: "Kyoto", destination: "Japan"))
    context.insert(BucketListItem(title: "Fushimi Inari at dawn", trip: Reference(trip)))
    try context.save()

    let phoneStatus = try await SyncDriver.syncUntilIdle(SyncEngine(container: phone, storeName: "trips"), with: cloud)
    let laptopStatus = try await SyncDriver.syncUntilIdle(SyncEngine(container: laptop, storeName: "trips"), with: cloud)
    let seen = try ModelContext(laptop).fetch(Trip.self).map { "\($0.name) (\($0.items.count) item)" }
    return ["phone synced: up to date = \(phoneStatus.isUpToDate)",
            "laptop synced: up to date = \(laptopStatus.isUpToDate), sees \(seen.joined(separator: ", "))"]
}
// README:end

// Modes: no arguments — the tour above, syncing through a cloud database file. `--cloud URL` (or REPLICA_CLOUD_URL
// in the environment) — two devices sync through a PostgreSQL server instead (`replica-cloud init` and `add-user`
// first); add `--device NAME --store DIR` to run one device that keeps its store in DIR (one per machine). `--owner
// NAME` when the URL's role is an app backend acting for users.
var options: [String: String] = [:]
var rest = Array(CommandLine.arguments.dropFirst())
while let name = rest.first, name.hasPrefix("--"), rest.count >= 2 {
    options[String(name.dropFirst(2))] = rest[1]
    rest.removeFirst(2)
}
guard rest.isEmpty, Set(options.keys).isSubset(of: ["cloud", "owner", "device", "store"]) else {
    print("usage: trips-example [--cloud URL [--owner NAME] [--device NAME --store DIR]]")
    exit(2)
}
let cloudURL = options["cloud"] ?? ProcessInfo.processInfo.environment["REPLICA_CLOUD_URL"].flatMap { $0.isEmpty ? nil : $0 }

let directory = FileManager.default.temporaryDirectory
    .appendingPathComponent("replica-trips-example-\(ProcessInfo.processInfo.processIdentifier)", isDirectory: true)
try? FileManager.default.removeItem(at: directory)
defer { try? FileManager.default.removeItem(at: directory) }
do {
    if let cloudURL, let device = options["device"] {
        guard let store = options["store"] else {
            print("trips-example: --device needs --store DIR (the device's store directory, kept between runs)")
            exit(2)
        }
        for line in try await postgresDeviceExample(url: cloudURL, owner: options["owner"], device: device,
                                                    store: URL(fileURLWithPath: store, isDirectory: true)) {
            print(line)
        }
    } else if let cloudURL {
        print("trips-example: two devices sync through PostgreSQL, under \(directory.path)")
        for line in try await postgresSyncExample(url: cloudURL, owner: options["owner"], in: directory) { print("  " + line) }
    } else {
        print("trips-example: one container, two stores, under \(directory.path)")
        for line in try runExample(in: directory) { print("  " + line) }
        let files = (try? FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.hasSuffix(".store") }.sorted()) ?? []
        print("store files: \(files.joined(separator: ", "))")
        print("sync between two devices through one cloud database file:")
        for line in try await syncExample(in: directory.appendingPathComponent("sync")) { print("  " + line) }
    }
} catch {
    print("trips-example failed: \(error)")
    exit(1)
}
