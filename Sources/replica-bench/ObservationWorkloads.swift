import Foundation
@_spi(Simulation) import Replica
#if canImport(Glibc)
import Glibc
#endif

// B15 — observation.
//
// B15: a store of 100k rows in five entities (20k each; B's rows reference A's) and 1,000 live queries over them:
// 200 per entity (`group == k`), except that 100 of B's reach A through the relationship (`parent?.group == k`).
// The timed part is 1,000 saves, each updating one row of one entity (round robin), on a container with those
// queries subscribed ("Replica" column) and on one with none ("Raw C" column: the same saves on a copy of the same
// store, no observer). The queries are synchronous observers (the SPI the simulator uses): they subscribe to the
// container's change hub as asynchronous ones do, but fetch only when asked, so the timed region holds exactly
// what a save costs its caller — the history read-back and the hand-out to the subscribers of the entity it
// touched — and none of the consumers' re-fetches, which run in their own tasks. After the timed saves (untimed),
// one save per entity is followed by a refresh of every query: the re-runs per save and what they cost are in the
// note.
//
// B15L: latency of another OS process's commit. A child (`replica-bench --child B15L DIR N MS`) commits N
// transactions to an app-group store, one every MS milliseconds; this process iterates the container's change
// stream (file events: inotify, fallback polling set to a minute so that it cannot be what delivers) and takes, per
// transaction, the time from its history timestamp (taken inside the child's write transaction) to its arrival.
// Reported: the median latency (the "Replica s" column, in seconds) and the observing process's CPU time over the
// whole run (no busy polling: it stays near zero between commits).

struct ObsA: PersistentModel {
    var id = UUID.unassigned
    var group: Int = 0
    var value: Int = 0
    var name: String = ""
    static let entity = ModelEntity<ObsA>([
        .attribute("group", \.group, default: 0), .attribute("value", \.value, default: 0), .attribute("name", \.name, default: ""),
    ])
    init(id: UUID = .unassigned, group: Int, value: Int, name: String) { (self.id, self.group, self.value, self.name) = (id, group, value, name) }
    init(row: ModelRow) throws { id = row.id; group = try row.decode(at: 0); value = try row.decode(at: 1); name = try row.decode(at: 2) }
}

struct ObsB: PersistentModel {
    var id = UUID.unassigned
    var group: Int = 0
    var value: Int = 0
    var name: String = ""
    var parent: Reference<ObsA>?
    static let entity = ModelEntity<ObsB>([
        .attribute("group", \.group, default: 0), .attribute("value", \.value, default: 0), .attribute("name", \.name, default: ""),
        .toOne("parent", \.parent),
    ])
    init(id: UUID = .unassigned, group: Int, value: Int, name: String, parent: Reference<ObsA>?) {
        (self.id, self.group, self.value, self.name, self.parent) = (id, group, value, name, parent)
    }
    init(row: ModelRow) throws {
        id = row.id; group = try row.decode(at: 0); value = try row.decode(at: 1); name = try row.decode(at: 2)
        parent = try row.reference(at: 3)
    }
}

struct ObsC: PersistentModel {
    var id = UUID.unassigned
    var group: Int = 0
    var value: Int = 0
    var name: String = ""
    static let entity = ModelEntity<ObsC>([
        .attribute("group", \.group, default: 0), .attribute("value", \.value, default: 0), .attribute("name", \.name, default: ""),
    ])
    init(id: UUID = .unassigned, group: Int, value: Int, name: String) { (self.id, self.group, self.value, self.name) = (id, group, value, name) }
    init(row: ModelRow) throws { id = row.id; group = try row.decode(at: 0); value = try row.decode(at: 1); name = try row.decode(at: 2) }
}

struct ObsD: PersistentModel {
    var id = UUID.unassigned
    var group: Int = 0
    var value: Int = 0
    var name: String = ""
    static let entity = ModelEntity<ObsD>([
        .attribute("group", \.group, default: 0), .attribute("value", \.value, default: 0), .attribute("name", \.name, default: ""),
    ])
    init(id: UUID = .unassigned, group: Int, value: Int, name: String) { (self.id, self.group, self.value, self.name) = (id, group, value, name) }
    init(row: ModelRow) throws { id = row.id; group = try row.decode(at: 0); value = try row.decode(at: 1); name = try row.decode(at: 2) }
}

struct ObsE: PersistentModel {
    var id = UUID.unassigned
    var group: Int = 0
    var value: Int = 0
    var name: String = ""
    static let entity = ModelEntity<ObsE>([
        .attribute("group", \.group, default: 0), .attribute("value", \.value, default: 0), .attribute("name", \.name, default: ""),
    ])
    init(id: UUID = .unassigned, group: Int, value: Int, name: String) { (self.id, self.group, self.value, self.name) = (id, group, value, name) }
    init(row: ModelRow) throws { id = row.id; group = try row.decode(at: 0); value = try row.decode(at: 1); name = try row.decode(at: 2) }
}

private let observedModels: [any PersistentModel.Type] = [ObsA.self, ObsB.self, ObsC.self, ObsD.self, ObsE.self]
private let observedGroups = 200

/// One subscribed live query, type-erased.
private struct AnyObserver {
    let entity: String
    let refresh: () throws -> Void
    let fetches: () -> Int
}

/// The B15 store (made once per size) and, per side, a container on a copy of it with or without the queries.
private final class ObservationFixture {
    let container: ModelContainer
    let context: ModelContext
    let observerContext: ModelContext
    var observers: [AnyObserver] = []
    /// The IDs of each entity's rows, by entity index.
    let ids: [[UUID]]
    var saves = 0

    /// The change-stream consumer of the variant with a stream subscriber (the sync runtime's view of saves).
    var streamConsumer: Task<Void, Never>?

    init(directory: URL, ids: [[UUID]], observed: Bool, streamed: Bool) throws {
        container = try makeStore(directory, observedModels, tracksHistory: true)
        context = ModelContext(container)
        observerContext = ModelContext(container)
        self.ids = ids
        if streamed {
            let iterator = container.changes.makeAsyncIterator()
            streamConsumer = Task {
                var iterator = iterator
                while let _ = try? await iterator.next() {}
            }
        }
        guard observed else { return }
        func add<Value: Sendable>(_ entity: String, _ query: LiveQuery<Value>) throws {
            let observer = try SynchronousLiveQuery(query, context: observerContext)
            observers.append(AnyObserver(entity: entity, refresh: { try observer.refresh() }, fetches: { observer.fetches }))
        }
        for k in 0..<observedGroups {
            try add("ObsA", container.observe(FetchDescriptor<ObsA>(predicate: #Predicate { $0.group == k })))
            if k % 2 == 0 {
                try add("ObsB", container.observe(FetchDescriptor<ObsB>(predicate: #Predicate { $0.group == k })))
            } else {
                try add("ObsB", container.observe(FetchDescriptor<ObsB>(predicate: #Predicate { $0.parent?.group == k })))
            }
            try add("ObsC", container.observe(FetchDescriptor<ObsC>(predicate: #Predicate { $0.group == k })))
            try add("ObsD", container.observe(FetchDescriptor<ObsD>(predicate: #Predicate { $0.group == k })))
            try add("ObsE", container.observe(FetchDescriptor<ObsE>(predicate: #Predicate { $0.group == k })))
        }
    }

    /// Updates one row of entity `index` (its `value`) and saves.
    func save(entity index: Int) throws {
        saves += 1
        let id = ids[index][(saves * 7919) % ids[index].count]
        switch index {
        case 0: var m = try context.model(ObsA.self, id: id)!; m.value = saves; context.update(m)
        case 1: var m = try context.model(ObsB.self, id: id)!; m.value = saves; context.update(m)
        case 2: var m = try context.model(ObsC.self, id: id)!; m.value = saves; context.update(m)
        case 3: var m = try context.model(ObsD.self, id: id)!; m.value = saves; context.update(m)
        default: var m = try context.model(ObsE.self, id: id)!; m.value = saves; context.update(m)
        }
        try context.save()
    }

    func totalFetches() -> Int { observers.reduce(0) { $0 + $1.fetches() } }
}

nonisolated(unsafe) private var observationSource: (directory: URL, ids: [[UUID]], rows: Int)?
nonisolated(unsafe) private var observationFixtures: [String: ObservationFixture] = [:]

/// The fixture of one side, made once: the store of `rows` rows copied, and for the observed side the 1,000 queries
/// subscribed (each fetched once).
private func observationFixture(rows: Int, observed: Bool, streamed: Bool) throws -> ObservationFixture {
    let key = "\(observed)-\(streamed)"
    if let fixture = observationFixtures[key], observationSource?.rows == rows { return fixture }
    if observationSource?.rows != rows {
        let directory = trialDirectory("B15-data")
        let container = try makeStore(directory, observedModels, tracksHistory: true)
        let context = ModelContext(container)
        let perEntity = rows / observedModels.count
        var ids: [[UUID]] = []
        var parents: [ObsA] = []
        ids.append((0..<perEntity).map { i in
            let a = context.insert(ObsA(group: i % observedGroups, value: i, name: "a\(i)"))
            parents.append(a)
            return a.id
        })
        ids.append((0..<perEntity).map { i in
            context.insert(ObsB(group: i % observedGroups, value: i, name: "b\(i)", parent: Reference(parents[(i * 31) % perEntity]))).id
        })
        ids.append((0..<perEntity).map { context.insert(ObsC(group: $0 % observedGroups, value: $0, name: "c\($0)")).id })
        ids.append((0..<perEntity).map { context.insert(ObsD(group: $0 % observedGroups, value: $0, name: "d\($0)")).id })
        ids.append((0..<perEntity).map { context.insert(ObsE(group: $0 % observedGroups, value: $0, name: "e\($0)")).id })
        try context.save()
        observationSource = (directory, ids, rows)
        observationFixtures = [:]
    }
    let source = observationSource!
    let directory = trialDirectory("B15-\(key)")
    try FileManager.default.removeItem(at: directory)
    try FileManager.default.copyItem(at: source.directory, to: directory)
    let fixture = try ObservationFixture(directory: directory, ids: source.ids, observed: observed, streamed: streamed)
    observationFixtures[key] = fixture
    return fixture
}

/// One side of B15: `saves` one-row saves, round robin over the entities, with or without the 1,000 queries (and,
/// with `streamed`, a change-stream subscriber that reads every transaction back from history).
func observationSaveTrial(rows: Int, saves: Int, observed: Bool, streamed: Bool = false) throws -> Trial {
    let fixture = try observationFixture(rows: rows, observed: observed, streamed: streamed)
    // Warm the writer's statements and bring the queries up to date before timing.
    for index in observedModels.indices { try fixture.save(entity: index) }
    for observer in fixture.observers { try observer.refresh() }
    var note: String?
    return Trial(run: {
        for n in 0..<saves { try fixture.save(entity: n % observedModels.count) }
    }, check: {
        guard observed else { return }
        // Untimed: catch the queries up, then one save per entity followed by a refresh of every query.
        for observer in fixture.observers { try observer.refresh() }
        var reruns: [String] = []
        for (index, model) in observedModels.enumerated() {
            try fixture.save(entity: index)
            let before = fixture.totalFetches()
            let sample = measure { for observer in fixture.observers { try? observer.refresh() } }
            let count = fixture.totalFetches() - before
            let expected = index == 0 ? 300 : 200
            try require(count == expected, "B15: a save of \(model.entityName) re-ran \(count) queries, not \(expected)")
            reruns.append("\(model.entityName.dropFirst(3)) \(count) (\(format(sample.cpu * 1000 / Double(max(1, count)), 2)) ms each)")
        }
        note = "re-runs per save of 1,000 queries, with the CPU time of each (a scan of 20k rows; A's include B's 100 "
            + "queries through the relationship): \(reruns.joined(separator: ", "))"
    }, note: { note })
}

// MARK: B15L

/// The note model both processes of B15L use.
struct ObservedNote: PersistentModel, Codable {
    var id = UUID.unassigned
    var text: String = ""
    static let entity = ModelEntity<ObservedNote>([.attribute("text", \.text, default: "")])
}

private func appGroupContainer(_ root: URL, bundle: String) throws -> ModelContainer {
    var environment = ReplicaEnvironment.live
    environment.appGroupDirectory = { root.appendingPathComponent($0, isDirectory: true) }
    environment.defaultStoreDirectory = root
    environment.processIdentity = ProcessIdentity(bundleIdentifier: bundle, processName: bundle, processID: getpid())
    environment.otherProcessCommits = .fileEvents(fallbackPollingMilliseconds: 60_000)
    return try ModelContainer(for: Schema([ObservedNote.self]), configurations: [
        ModelConfiguration("shared", groupContainer: .identifier("group.replica.bench")),
    ], environment: environment)
}

/// The B15L child: `count` commits, one every `interval` milliseconds.
func observationWriterChild(root: URL, count: Int, interval: Int) -> Never {
    do {
        let container = try appGroupContainer(root, bundle: "bench.writer")
        let context = ModelContext(container)
        for index in 0..<count {
            context.insert(ObservedNote(text: "note \(index)"))
            try context.save()
            usleep(useconds_t(interval * 1000))
        }
        exit(0)
    } catch {
        FileHandle.standardError.write(Data("replica-bench B15L child: \(error)\n".utf8))
        exit(1)
    }
}

/// The real-time clock in milliseconds, with sub-millisecond digits.
private func realtimeMilliseconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Double(ts.tv_sec) * 1000 + Double(ts.tv_nsec) / 1_000_000
}

private final class LatencyBox: @unchecked Sendable {
    var latencies: [Double] = []
    var error: Error?
}

/// One run of B15L: `count` commits of a child process, observed through the change stream.
func otherProcessLatencyTrial(count: Int, interval: Int) throws -> Trial {
    let root = trialDirectory("B15L")
    let container = try appGroupContainer(root, bundle: "bench.observer")
    var note: String?
    var median = 0.0
    return Trial(run: {}, check: {
        try require(median >= 0, "B15L: a commit arrived before it was made (clocks?)")
    }, measured: {
        let iterator = try container.changes(in: ["shared"]).makeAsyncIterator()
        let box = LatencyBox()
        let done = DispatchSemaphore(value: 0)
        let cpuBefore = processCPUSeconds()
        let wallBefore = Date()
        Task {
            var iterator = iterator
            do {
                while box.latencies.count < count, let event = try await iterator.next() {
                    guard case let .committed(change) = event, change.origin == .otherProcess else { continue }
                    // The history timestamp is whole milliseconds (rounded down): the latency is over-, never under-stated.
                    box.latencies.append(realtimeMilliseconds() - change.timestamp.timeIntervalSince1970 * 1000)
                }
            } catch {
                box.error = error
            }
            done.signal()
        }
        // Half a second with nothing written: what watching costs while idle (no busy polling: about nothing).
        let idleBefore = processCPUSeconds()
        usleep(500_000)
        let idle = processCPUSeconds() - idleBefore
        let process = Process()
        process.executableURL = URL(fileURLWithPath: benchExecutable)
        process.arguments = ["--child", "B15L", root.path, String(count), String(interval)]
        try process.run()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { throw CheckFailed("B15L: the writer child failed") }
        guard done.wait(timeout: .now() + 30) == .success else { throw CheckFailed("B15L: \(box.latencies.count) of \(count) commits arrived") }
        if let error = box.error { throw error }
        let cpu = processCPUSeconds() - cpuBefore
        let wall = Date().timeIntervalSince(wallBefore)
        let sorted = box.latencies.sorted()
        median = sorted[sorted.count / 2] / 1000
        note = "latency median \(format(median * 1000, 1)) ms, p90 \(format(sorted[sorted.count * 9 / 10], 1)) ms, max \(format(sorted.last!, 1)) ms "
            + "(\(count) commits, one per \(interval) ms); observer CPU \(format(idle * 1000, 1)) ms while idle for 0.5 s, "
            + "\(format(cpu * 1000, 0)) ms over the whole \(format(wall, 1)) s"
        return Measurement(sample: Sample(cpu: median, wall: median), peakMB: nil, items: count)
    }, note: { note })
}
