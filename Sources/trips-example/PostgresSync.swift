// The example's PostgreSQL mode: the same synced trips, through a PostgreSQL server (`PostgresCloudDatabase`) instead
// of a cloud database file — two device directories on this machine, or one device per machine.
import Foundation
import Replica
import ReplicaPostgres

/// One device's container of trips in `directory`.
func tripsDevice(in directory: URL) throws -> ModelContainer {
    var environment = ReplicaEnvironment.live
    environment.defaultStoreDirectory = directory
    return try ModelContainer(for: Trip.self, BucketListItem.self, configurations: ModelConfiguration(
        "trips", cloudKitDatabase: .private("iCloud.com.example.trips")), environment: environment)
}

/// Two devices in directories of their own under `directory` sync one trip through the PostgreSQL server `url`.
func postgresSyncExample(url: String, owner: String?, in directory: URL) async throws -> [String] {
    let cloud = try PostgresCloudDatabase(connectionString: url, owner: owner)
    let phone = try tripsDevice(in: directory.appendingPathComponent("phone")),
        laptop = try tripsDevice(in: directory.appendingPathComponent("laptop"))

    let context = ModelContext(phone)
    let trip = context.insert(Trip(name: "Kyoto", destination: "Japan"))
    context.insert(BucketListItem(title: "Fushimi Inari at dawn", trip: Reference(trip)))
    try context.save()

    let phoneStatus = try await SyncDriver.syncUntilIdle(SyncEngine(container: phone, storeName: "trips"), with: cloud)
    let laptopStatus = try await SyncDriver.syncUntilIdle(SyncEngine(container: laptop, storeName: "trips"), with: cloud)
    let trips = try ModelContext(laptop).fetch(Trip.self)
    let seen = trips.first { $0.id == trip.id }.map { "the phone's trip \($0.name) (\($0.items.count) item)" } ?? "not the phone's trip"
    return ["phone synced through \(cloud): up to date = \(phoneStatus.isUpToDate)",
            "laptop synced: up to date = \(laptopStatus.isUpToDate), sees \(seen); \(trips.count) trip(s) in all"]
}

/// One device — run it on each machine, each with a store directory of its own: adds a trip named after the device,
/// syncs through the PostgreSQL server `url`, and lists every trip it holds then (its own and the other machines').
func postgresDeviceExample(url: String, owner: String?, device name: String, store: URL) async throws -> [String] {
    let cloud = try PostgresCloudDatabase(connectionString: url, owner: owner)
    let device = try tripsDevice(in: store)
    let context = ModelContext(device)
    let own = try context.fetch(Trip.self).filter { $0.destination == name }.count
    let trip = context.insert(Trip(name: "\(name) trip \(own + 1)", destination: name))
    context.insert(BucketListItem(title: "Written on \(name)", trip: Reference(trip)))
    try context.save()
    let status = try await SyncDriver.syncUntilIdle(SyncEngine(container: device, storeName: "trips"), with: cloud)
    let names = try ModelContext(device).fetch(Trip.self).map(\.name).sorted()
    return ["\(name) added '\(trip.name)' and synced through \(cloud): up to date = \(status.isUpToDate)",
            "\(name) holds \(names.count) trip(s): \(names.joined(separator: ", "))"]
}
