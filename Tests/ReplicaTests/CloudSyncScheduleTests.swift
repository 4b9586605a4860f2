import Foundation
import Synchronization
import Testing
@testable import Replica

/// One simulated app: a store file, its container and the sync runtime the app holds (restarts reopen both).
private final class RuntimeApp {
    let directory: URL
    let seed: UInt64
    var clock: ManualClock
    var container: ModelContainer
    var sync: CloudSync
    let cloud: OutageCloud
    static let options: CloudSync.Options = {
        var options = CloudSync.Options()
        options.debounceMilliseconds = 300
        options.timerMilliseconds = 5_000
        options.cloudPollingMilliseconds = 1_000
        options.engine.baseBackoffMilliseconds = 200
        options.engine.maxBackoffMilliseconds = 4_000
        return options
    }()

    init(seed: UInt64, start: Int64, cloud: OutageCloud) throws {
        directory = temporaryTestDirectory("runtime-schedule")
        self.seed = seed
        self.cloud = cloud
        (container, clock) = try Self.open(directory, seed: seed, at: start)
        sync = try container.startSync(store: "notes", cloud: cloud, options: Self.options)
    }

    private static func open(_ directory: URL, seed: UInt64, at time: Int64) throws -> (ModelContainer, ManualClock) {
        let environment = ReplicaEnvironment.seeded(seed: seed, directory: directory, startMilliseconds: time)
        let container = try ModelContainer(for: Schema([SyncNote.self]), configurations: [
            ModelConfiguration("notes", cloudKitDatabase: .private("iCloud.test")),
        ], environment: environment)
        return (container, environment.clock as! ManualClock)
    }

    /// The app's process ends (its runtime stopped or, with `abruptly`, just released mid-whatever) and starts again.
    func restart(abruptly: Bool, generation: UInt64) async throws {
        let time = clock.nowMilliseconds()
        if !abruptly { await sync.stop() }
        (container, clock) = try Self.open(directory, seed: seed &+ generation &* 1_000, at: time)
        sync = try container.startSync(store: "notes", cloud: cloud, options: Self.options)
    }

    func notes() throws -> [UUID: String] {
        var result: [UUID: String] = [:]
        for note in try ModelContext(container).fetch(SyncNote.self) { result[note.id] = note.title }
        return result
    }
}

/// The sync runtime driven the way an app uses it, over seeded schedules: several apps save while their runtimes sync
/// by themselves (debounce, timer, cloud polling) as their clocks move, with network outages and restarts (orderly and
/// abrupt) in between. Each note is edited only by the app that made it, so the reference is that app's last write;
/// after the network heals every app holds exactly the reference, and every runtime is up to date.
@Suite("Sync runtime schedules: saves racing scheduled syncs, outages and restarts", .serialized)
struct CloudSyncScheduleTests {
    static let seeds: [UInt64] = Array(1...16)

    @Test("every app converges to the owners' last writes", arguments: seeds)
    func convergesUnderSchedules(seed: UInt64) async throws {
        let random = SeededRandomSource(seed: seed)
        func draw(_ n: Int) -> Int { Int(random.next() % UInt64(n)) }
        let cloud = OutageCloud(reportsChangeCounter: true)
        let start: Int64 = 1_767_225_600_000
        var apps: [RuntimeApp] = []
        for index in 0..<3 { apps.append(try RuntimeApp(seed: seed &* 10 &+ UInt64(index), start: start + Int64(draw(2_000)), cloud: cloud)) }
        var reference: [UUID: String] = [:]
        var owned: [[UUID]] = [[], [], []]
        var serial = 0
        var generation: UInt64 = 1

        for _ in 0..<120 {
            let index = draw(apps.count)
            let app = apps[index]
            switch draw(10) {
            case 0...3:  // a save: insert, or retitle / delete one of this app's notes
                serial += 1
                let context = ModelContext(app.container)
                if owned[index].isEmpty || draw(3) == 0 {
                    let note = context.insert(SyncNote(title: "n\(serial)"))
                    try context.save()
                    owned[index].append(note.id)
                    reference[note.id] = note.title
                } else {
                    let id = owned[index][draw(owned[index].count)]
                    guard var note = try context.model(SyncNote.self, id: id) else { break }
                    if draw(4) == 0 {
                        context.delete(note)
                        owned[index].removeAll { $0 == id }
                        reference[id] = nil
                    } else {
                        note.title = "n\(serial)"
                        context.update(note)
                        reference[id] = note.title
                    }
                    try context.save()
                }
            case 4...6:  // time passes for everyone: debounced, timed and polled syncs run
                let elapsed = Int64(50 + draw(3_000))
                for app in apps { app.clock.advance(by: elapsed) }
            case 7:
                cloud.offline.withLock { $0.toggle() }
            case 8:
                generation += 1
                try await app.restart(abruptly: draw(2) == 0, generation: generation)
            default:
                try await app.sync.syncNow(timeoutMilliseconds: Int64(draw(2_000)))
            }
            // Let the runtimes' tasks run (their clocks do not move meanwhile).
            for _ in 0..<50 { await Task.yield() }
        }

        #expect(cloud.inner.operationCount > 20, "the runtimes synced by themselves during the run")
        // Heal: the network comes back and every app syncs until nothing is left.
        cloud.offline.withLock { $0 = false }
        for _ in 0..<3 {
            for app in apps {
                app.clock.advance(by: 10_000)
                try await app.sync.syncNow()
            }
        }
        for (index, app) in apps.enumerated() {
            let status = try await app.sync.status()
            #expect(status.isUpToDate, "app \(index), seed \(seed): \(status)")
            #expect(try app.notes() == reference, "app \(index), seed \(seed)")
        }
        for app in apps { await app.sync.stop() }
    }
}
