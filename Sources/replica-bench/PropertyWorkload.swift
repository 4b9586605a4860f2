import Foundation
import Replica
import ReplicaTesting

// B12 — the property engine driving the replication property: 3 devices (in-memory synced stores, each with its
// sync engine and a context) and one in-memory cloud, 50 random steps per case (writes, deliveries in random order,
// duplicated and lost responses, clock skew, change notifications, token expiry), then heal, quiesce and check
// convergence and liveness. The same step mix as `ReplicationPropertyTests`, through the public API only.

struct PropNote: PersistentModel, Codable, Equatable {
    static var entityName: String { "Note" }
    var id = UUID.unassigned
    var title: String = ""
    var body: String?
    var rating: Int = 0
    static let entity = ModelEntity<PropNote>([
        .attribute("title", \.title, default: "", options: .preserveValueOnDeletion),
        .attribute("body", \.body),
        .attribute("rating", \.rating, default: 0),
    ])
}

enum PropStep {
    case insert(device: Int, title: Int)
    case update(device: Int, note: Int, field: Int, value: Int)
    case delete(device: Int, note: Int)
    case deliver(device: Int)
    case duplicate(device: Int)
    case lose(device: Int)
    case skew(device: Int, minutes: Int)
    case notify(device: Int)
    case expireTokens
}

let propStep: Generator<PropStep> = Gen.frequency([
    (4, Gen.zip(Gen.int(in: 0...2), Gen.int(in: 0...3)).map { PropStep.insert(device: $0, title: $1) }),
    (5, Gen.zip(Gen.int(in: 0...2), Gen.int(in: 0...7), Gen.int(in: 0...2), Gen.int(in: 0...3))
        .map { PropStep.update(device: $0, note: $1, field: $2, value: $3) }),
    (2, Gen.zip(Gen.int(in: 0...2), Gen.int(in: 0...7)).map { PropStep.delete(device: $0, note: $1) }),
    (8, Gen.int(in: 0...2).map { PropStep.deliver(device: $0) }),
    (1, Gen.int(in: 0...2).map { PropStep.duplicate(device: $0) }),
    (1, Gen.int(in: 0...2).map { PropStep.lose(device: $0) }),
    (1, Gen.zip(Gen.int(in: 0...2), Gen.int(in: 1...60)).map { PropStep.skew(device: $0, minutes: $1) }),
    (2, Gen.int(in: 0...2).map { PropStep.notify(device: $0) }),
    (1, Gen.constant(PropStep.expireTokens)),
])

final class PropDevice {
    let container: ModelContainer
    let engine: SyncEngine
    let context: ModelContext
    let clock: ManualClock

    init(seed: UInt64) throws {
        let environment = ReplicaEnvironment.seeded(seed: seed, directory: benchRoot)
        clock = environment.clock as! ManualClock
        container = try ModelContainer(for: Schema([PropNote.self]), configurations: [
            ModelConfiguration("notes", isStoredInMemoryOnly: true, cloudKitDatabase: .private("iCloud.bench")),
        ], environment: environment)
        engine = try SyncEngine(container: container, storeName: "notes")
        context = ModelContext(container)
    }

    func sync(_ cloud: InMemoryCloudDatabase) throws {
        engine.setNeedsFetch()
        for _ in 0..<1_000 {
            if let request = try engine.nextRequest() {
                try engine.handle(request.id, cloud.performNow(request.operation))
            } else if let wake = engine.wakeTime {
                clock.set(milliseconds: wake)
            } else {
                return
            }
        }
        throw CheckFailed("a device did not settle")
    }
}

func replicationCase(_ steps: [PropStep]) throws {
    let cloud = InMemoryCloudDatabase()
    let devices = try (0..<3).map { try PropDevice(seed: UInt64(300 + $0)) }
    var ids: [UUID] = []
    var last: [(UInt64, Result<CloudOperationResult, CloudError>)?] = [nil, nil, nil]
    for (i, step) in steps.enumerated() {
        switch step {
        case let .insert(d, title):
            devices[d].clock.advance(by: 3)
            ids.append(devices[d].context.insert(PropNote(title: "t\(title)-\(i)")).id)
            try devices[d].context.save()
        case let .update(d, n, field, value):
            guard !ids.isEmpty, var note = try devices[d].context.model(PropNote.self, id: ids[n % ids.count]) else { continue }
            devices[d].clock.advance(by: Int64(1 + value))
            switch field {
            case 0: note.title = "u\(value)-\(i)"
            case 1: note.body = value == 0 ? nil : "b\(value)-\(i)"
            default: note.rating = value
            }
            devices[d].context.update(note)
            try devices[d].context.save()
        case let .delete(d, n):
            guard !ids.isEmpty, let note = try devices[d].context.model(PropNote.self, id: ids[n % ids.count]) else { continue }
            devices[d].context.delete(note)
            try devices[d].context.save()
        case let .deliver(d):
            let engine = devices[d].engine
            if let request = try engine.nextRequest() {
                let response = cloud.performNow(request.operation)
                try engine.handle(request.id, response)
                last[d] = (request.id, response)
            } else if let wake = engine.wakeTime {
                devices[d].clock.set(milliseconds: wake)
            }
        case let .duplicate(d):
            if let (id, response) = last[d] { try devices[d].engine.handle(id, response) }
        case let .lose(d):
            if let request = try devices[d].engine.nextRequest() {
                _ = cloud.performNow(request.operation)
                try devices[d].engine.abandon(request.id)
            }
        case let .skew(d, minutes):
            devices[d].clock.advance(by: -Int64(minutes) * 60_000)
        case let .notify(d):
            devices[d].engine.setNeedsFetch()
        case .expireTokens:
            cloud.expireChangeTokens(in: "notes")
        }
    }
    for _ in 0..<3 { for device in devices { try device.sync(cloud) } }
    // Each device's state, read from its store through the device's own context (a fetch reads the rows SQLite
    // holds; this context has no unsaved changes), rather than through a new context and connection per device.
    let states = try devices.map { try $0.context.fetch(PropNote.self) }
    try Property.require(states[0] == states[1] && states[1] == states[2], "devices did not converge", kind: "convergence")
    for device in devices {
        try Property.require(try device.engine.status().isUpToDate, "a device is not up to date", kind: "liveness")
    }
}

/// Runs `cases` cases of 50 steps; fails the trial if the property fails.
func propertyTrial(_ cases: Int) -> Trial {
    Trial(run: {
        let result = checkProperty("replica-bench replication", configuration: PropertyConfiguration(
            cases: cases, seed: 12, scale: 1, persistence: .disabled), Gen.array(of: propStep, minLength: 50, maxLength: 50)) {
            try replicationCase($0)
        }
        try require(result.passed, "B12: the property failed: \(result.report)")
    })
}
