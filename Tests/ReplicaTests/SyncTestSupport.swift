import Foundation
import Synchronization
import Testing
@testable import Replica

/// A synced model used by the sync tests.
struct SyncNote: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var title: String = ""
    var body: String?
    var rating: Int = 0
    static let entity = ModelEntity<SyncNote>([
        .attribute("title", \.title, default: "", options: .preserveValueOnDeletion),
        .attribute("body", \.body),
        .attribute("rating", \.rating, default: 0),
    ])
}

/// Version 2 of SyncNote: one more attribute.
struct SyncNoteV2: PersistentModel, Codable, Equatable {
    static var entityName: String { "SyncNote" }
    var id = UUID.unassigned
    var title: String = ""
    var body: String?
    var rating: Int = 0
    var mood: String = "calm"
    static let entity = ModelEntity<SyncNoteV2>([
        .attribute("title", \.title, default: "", options: .preserveValueOnDeletion),
        .attribute("body", \.body),
        .attribute("rating", \.rating, default: 0),
        .attribute("mood", \.mood, default: "calm"),
    ])
}

/// One simulated device: a container with one synced store "notes", its engine, a context and a manual clock.
final class Device {
    let container: ModelContainer
    let engine: SyncEngine
    let context: ModelContext
    let clock: ManualClock
    let name: String

    init(_ name: String, seed: UInt64, models: [any PersistentModel.Type] = [SyncNote.self], version: Schema.Version = Schema.Version(1, 0, 0),
         directory: URL? = nil, inMemory: Bool = false, canaries: Set<Canary> = [], options: SyncEngine.Options = SyncEngine.Options()) throws {
        let directory = directory ?? FileManager.default.temporaryDirectory.appendingPathComponent("replica-sync-\(UUID().uuidString)")
        var environment = ReplicaEnvironment.seeded(seed: seed, directory: directory)
        environment.canaries = canaries
        self.name = name
        self.clock = environment.clock as! ManualClock
        self.container = try ModelContainer(for: Schema(models, version: version), configurations: [
            ModelConfiguration("notes", isStoredInMemoryOnly: inMemory, cloudKitDatabase: .private("iCloud.test")),
        ], environment: environment)
        self.engine = try SyncEngine(container: container, storeName: "notes", options: options)
        self.context = ModelContext(container)
    }

    /// Runs the engine against `cloud` until it has nothing to do (backoffs are skipped by moving the clock).
    @discardableResult
    func sync(_ cloud: InMemoryCloudDatabase, maxSteps: Int = 1_000) throws -> SyncStatus {
        engine.setNeedsFetch()
        for _ in 0..<maxSteps {
            if let request = try engine.nextRequest() {
                try engine.handle(request.id, cloud.performNow(request.operation))
            } else if let wake = engine.wakeTime {
                clock.set(milliseconds: wake)
            } else {
                return try engine.status()
            }
        }
        Issue.record("\(name) did not settle")
        return try engine.status()
    }

    /// Performs the engine's requests until it wants to upload; returns that upload request, not yet performed.
    func nextUpload(_ cloud: InMemoryCloudDatabase) throws -> SyncRequest? {
        for _ in 0..<50 {
            guard let request = try engine.nextRequest() else { return nil }
            if case .modifyRecords = request.operation { return request }
            try engine.handle(request.id, cloud.performNow(request.operation))
        }
        return nil
    }

    /// Delivers `records` as the answer to the engine's next zone fetch (as if the cloud returned exactly them).
    /// Returns `false` when the engine would not fetch (e.g. blocked).
    @discardableResult
    func deliver(_ records: [CloudRecord], cloud: InMemoryCloudDatabase) throws -> Bool {
        engine.setNeedsFetch()
        for _ in 0..<50 {
            guard let request = try engine.nextRequest() else {
                guard let wake = engine.wakeTime else { return false }
                clock.set(milliseconds: wake)
                continue
            }
            if case .fetchZoneChanges = request.operation {
                try engine.handle(request.id, .success(.changes(ZoneChangeBatch(
                    records: records, token: ServerChangeToken(epoch: 1, sequence: 0), moreComing: false))))
                return true
            }
            try engine.handle(request.id, cloud.performNow(request.operation))
        }
        return false
    }

    /// Every live record of the store as (id, title, body, rating), sorted by ID.
    func notes() throws -> [SyncNote] { try ModelContext(container).fetch(SyncNote.self) }
}

/// Syncs every device of `devices` with `cloud`, in turn, `rounds` times.
func settle(_ devices: [Device], _ cloud: InMemoryCloudDatabase, rounds: Int = 3) throws {
    for _ in 0..<rounds { for device in devices { try device.sync(cloud) } }
}

/// Runs `engine` against `cloud` until it has no request left (at most 300 requests; no clock is moved, so a wait
/// ends the run). Records an issue if the engine does not settle.
func sync(_ engine: SyncEngine, _ cloud: InMemoryCloudDatabase) throws {
    engine.setNeedsFetch()
    for _ in 0..<300 {
        guard let request = try engine.nextRequest() else { return }
        try engine.handle(request.id, cloud.performNow(request.operation))
    }
    Issue.record("the engine did not settle")
}

/// The persistent identifier of the SyncNote with `id`.
func noteID(_ id: UUID) -> PersistentIdentifier { PersistentIdentifier(entityName: "SyncNote", id: id) }

/// An in-memory cloud whose network a test takes down and brings back (`offline`), for the sync runtime's tests.
/// - `announcesChanges`: it hands out a change-notification stream the test feeds through `continuation`, as the
///   PostgreSQL cloud does; otherwise it announces nothing.
/// - `reportsChangeCounter`: it reports the in-memory cloud's change counter, so a runtime with cloud polling notices
///   other devices' writes.
/// - `zoneDeletionNeedsNetwork`: `deleteZone` fails while offline too (off: the test deletes zones as an operator
///   would, beside the outage).
final class OutageCloud: CloudDatabase {
    let inner = InMemoryCloudDatabase()
    let offline = Mutex(false)
    let stream: AsyncStream<String>
    let continuation: AsyncStream<String>.Continuation
    private let announcesChanges: Bool
    private let reportsChangeCounter: Bool
    private let zoneDeletionNeedsNetwork: Bool

    init(announcesChanges: Bool = false, reportsChangeCounter: Bool = false, zoneDeletionNeedsNetwork: Bool = true) {
        (stream, continuation) = AsyncStream.makeStream(of: String.self)
        self.announcesChanges = announcesChanges
        self.reportsChangeCounter = reportsChangeCounter
        self.zoneDeletionNeedsNetwork = zoneDeletionNeedsNetwork
    }

    private func check() throws(CloudError) { if offline.withLock({ $0 }) { throw .networkUnavailable } }
    func changeNotifications() -> AsyncStream<String>? { announcesChanges ? stream : nil }
    func changeCounter() -> Int64? { reportsChangeCounter ? inner.changeCounter() : nil }
    func createZone(_ zone: String) async throws(CloudError) { try check(); try inner.createZone(zone) }
    func deleteZone(_ zone: String) async throws(CloudError) {
        if zoneDeletionNeedsNetwork { try check() }
        try inner.deleteZone(zone)
    }
    func modifyRecords(_ records: [CloudRecord], in zone: String) async throws(CloudError) -> [RecordSaveResult] {
        try check()
        return try inner.modifyRecords(records, in: zone)
    }
    func fetchZoneChanges(_ zone: String, since token: ServerChangeToken?, limit: Int) async throws(CloudError) -> ZoneChangeBatch {
        try check()
        return try inner.fetchZoneChanges(zone, since: token, limit: limit)
    }
    func zoneMetadata(_ zone: String) async throws(CloudError) -> [String: Data] { try check(); return try inner.zoneMetadata(zone) }
    func setZoneMetadata(_ zone: String, key: String, value: Data, ifCurrent expected: Data?) async throws(CloudError) -> Data {
        try check()
        return try inner.setZoneMetadata(zone, key: key, value: value, ifCurrent: expected)
    }
}
