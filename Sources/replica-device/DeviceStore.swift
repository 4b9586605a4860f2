import Foundation
import Replica
import ReplicaPostgres
import ReplicaTesting

/// A folder of notes. Deleting it leaves its notes in no folder.
struct Folder: PersistentModel, Codable {
    var id = UUID.unassigned
    var name: String = ""
    var notes: [Reference<Note>] = []
    static let entity = ModelEntity<Folder>([
        .attribute("name", \.name, default: ""),
        .toMany("notes", \.notes, inverse: "folder", deleteRule: .nullify),
    ])
}

/// A note: its body is sealed before it reaches the cloud, its slug is unique.
struct Note: PersistentModel, Codable {
    var id = UUID.unassigned
    var title: String = ""
    var body: String?
    var rating: Int = 0
    var slug: String = ""
    var folder: Reference<Folder>?
    static let entity = ModelEntity<Note>([
        .attribute("title", \.title, default: ""),
        .attribute("body", \.body, options: .allowsCloudEncryption),
        .attribute("rating", \.rating, default: 0),
        .attribute("slug", \.slug, default: "", options: .unique),
        .toOne("folder", \.folder, inverse: "notes"),
    ])
}

/// The raw field key every device of one soak shares (the same user on every device).
let defaultFieldKey: [UInt8] = (0..<32).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }

/// One device: its store in a directory of its own, the engine syncing it, and the cloud it syncs with.
final class DeviceStore {
    let name: String
    let container: ModelContainer
    let engine: SyncEngine
    let context: ModelContext
    let cloud: PostgresCloudDatabase

    init(name: String, directory: URL, cloudURL: String, owner: String?, key: [UInt8], canaries: Set<Canary> = []) throws {
        self.name = name
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        var environment = ReplicaEnvironment.live
        environment.defaultStoreDirectory = directory
        // A planted bug (tests of the soak's check): the run must catch it.
        environment.canaries = canaries
        container = try ModelContainer(for: Schema([Folder.self, Note.self]), configurations: [
            ModelConfiguration("notes", cloudKitDatabase: .private("iCloud.replica.soak")),
        ], environment: environment)
        var options = SyncEngine.Options()
        // Short waits: a soak heals in seconds, not minutes. A process killed holding the lease frees it within 2 s.
        options.baseBackoffMilliseconds = 50
        options.maxBackoffMilliseconds = 1_000
        options.leaseDurationMilliseconds = 2_000
        options.uploadBatchSize = 50
        options.fetchLimit = 100
        engine = try SyncEngine(container: container, storeName: "notes", options: options, encryption: .rawKey(key))
        context = ModelContext(container)
        cloud = try PostgresCloudDatabase(connectionString: cloudURL, owner: owner, maximumConnections: 2)
    }

    /// The store as the checker reads it: live rows and the ledger.
    func dump() throws -> SoakDeviceDump {
        var notes: [String: [String: SoakValue]] = [:]
        for note in try context.fetch(Note.self) {
            notes[note.id.uuidString] = ["title": .text(note.title), "body": note.body.map { .text($0) } ?? .null,
                                         "rating": .integer(Int64(note.rating)), "slug": .text(note.slug),
                                         "folder": note.folder.map { .text($0.id.uuidString) } ?? .null]
        }
        var folders: [String: [String: SoakValue]] = [:]
        for folder in try context.fetch(Folder.self) { folders[folder.id.uuidString] = ["name": .text(folder.name)] }
        var states: [String: SoakLedgerState] = [:]
        for state in try engine.replicationStates() {
            states[state.id.id.uuidString] = SoakLedgerState(entity: state.id.entityName, causalLength: state.causalLength,
                                                               pending: state.isPending,
                                                               stamps: state.stamps.mapValues(\.description))
        }
        // A fresh engine has not read the zone yet (it needs a fetch by definition): the dump judges the ledger only.
        let status = try engine.status()
        let settled = status.pendingRecords == 0 && status.rejectedRecords == 0 && status.waitingForParent == 0
            && status.undecryptableRecords == 0 && status.blockedBy == nil && status.encryptionError == nil
        return SoakDeviceDump(device: name, rows: ["Note": notes, "Folder": folders], states: states, upToDate: settled)
    }
}

/// Performs every request on `base` and counts the records it saved.
final class CountingCloud: CloudDatabase, @unchecked Sendable {
    let base: PostgresCloudDatabase
    private(set) var saved = 0
    private(set) var requests = 0

    init(_ base: PostgresCloudDatabase) { self.base = base }

    func createZone(_ zone: String) async throws(CloudError) {
        requests += 1
        try await base.createZone(zone)
    }

    func deleteZone(_ zone: String) async throws(CloudError) {
        requests += 1
        try await base.deleteZone(zone)
    }

    func deleteZone(_ zone: String, reason: ZoneDeletionReason) async throws(CloudError) {
        requests += 1
        try await base.deleteZone(zone, reason: reason)
    }

    func modifyRecords(_ records: [CloudRecord], in zone: String) async throws(CloudError) -> [RecordSaveResult] {
        requests += 1
        let results = try await base.modifyRecords(records, in: zone)
        saved += results.filter { if case .saved = $0 { true } else { false } }.count
        return results
    }

    func fetchZoneChanges(_ zone: String, since token: ServerChangeToken?, limit: Int) async throws(CloudError) -> ZoneChangeBatch {
        requests += 1
        return try await base.fetchZoneChanges(zone, since: token, limit: limit)
    }

    func zoneMetadata(_ zone: String) async throws(CloudError) -> [String: Data] {
        requests += 1
        return try await base.zoneMetadata(zone)
    }

    func setZoneMetadata(_ zone: String, key: String, value: Data, ifCurrent expected: Data?) async throws(CloudError) -> Data {
        requests += 1
        return try await base.setZoneMetadata(zone, key: key, value: value, ifCurrent: expected)
    }
}
