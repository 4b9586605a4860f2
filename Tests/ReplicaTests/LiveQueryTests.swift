import Foundation
import ReplicaTesting
import Testing
@_spi(Simulation) @testable import Replica

/// The models of `query`'s next `count` values (the first included), iterated within a time-out; `between` runs
/// after each value but the last (to make the next change).
func liveValues<Value: Sendable>(_ query: LiveQuery<Value>, count: Int, seconds: Double = 20,
                                 between: @escaping @Sendable (Int) async throws -> Void = { _ in }) async throws -> [Value] {
    try await withTimeout(seconds) {
        var values: [Value] = []
        for try await value in query {
            values.append(value)
            if values.count == count { break }
            try await between(values.count)
        }
        return values
    }
}

extension ModelContainer {
    /// Inserts, updates or deletes through a new context and saves.
    func write(_ body: (ModelContext) throws -> Void) throws {
        let context = ModelContext(self)
        try body(context)
        try context.save()
    }
}

@Suite("Live queries")
struct LiveQueryTests {
    static let byTitle = FetchDescriptor<OTask>(sortBy: [SortDescriptor(\.title)])

    @Test("the current value first, then a new value after each commit that changes it")
    func currentValueThenChanges() async throws {
        let container = try observationContainer()
        try container.write { $0.insert(OTask(title: "a")) }
        let values = try await liveValues(container.observe(Self.byTitle), count: 3) { step in
            try container.write { context in
                if step == 1 { context.insert(OTask(title: "b")) }
                if step == 2 {
                    var first = try #require(try context.fetch(Self.byTitle).first)
                    first.done = true
                    context.update(first)
                }
            }
        }
        #expect(values.map { $0.map(\.title) } == [["a"], ["a", "b"], ["a", "b"]])
        #expect(values.map { $0.map(\.done) } == [[false], [false, false], [true, false]])
    }

    @Test("a change of an entity the predicate reaches through a relationship gives a new value")
    func predicateThroughRelationship() async throws {
        let container = try observationContainer()
        let list = try container.writeReturning { $0.insert(OList(name: "Work")) }
        try container.write { $0.insert(OTask(title: "report", list: Reference(list))) }
        let query = container.observe(FetchDescriptor<OTask>(predicate: #Predicate { $0.list?.name == "Home" }))
        let values = try await liveValues(query, count: 2) { _ in
            try container.write { context in
                var renamed = try #require(try context.model(OList.self, id: list.id))
                renamed.name = "Home"
                context.update(renamed)
            }
        }
        #expect(values.map { $0.map(\.title) } == [[], ["report"]])
    }

    @Test("a change of a prefetched target gives a new value, though the models' own fields are the same")
    func prefetchedTargets() async throws {
        let container = try observationContainer()
        let list = try container.writeReturning { $0.insert(OList(name: "Work")) }
        try container.write { $0.insert(OTask(title: "report", list: Reference(list))) }
        var descriptor = FetchDescriptor<OTask>()
        descriptor.relationshipKeyPathsForPrefetching = [\.list]
        let values = try await liveValues(container.observe(descriptor), count: 2) { _ in
            try container.write { context in
                var renamed = try #require(try context.model(OList.self, id: list.id))
                renamed.name = "Office"
                context.update(renamed)
            }
        }
        #expect(values.map { $0.map { $0.list?.resolved?.name } } == [["Work"], ["Office"]])
    }

    @Test("only commits that can change the result fetch again, and an equal result is not delivered")
    func onlyAffectingCommitsFetch() throws {
        let container = try observationContainer()
        let observerContext = ModelContext(container)
        let open = try SynchronousLiveQuery(container.observe(FetchDescriptor<OTask>(predicate: #Predicate { $0.done == false })),
                                            context: observerContext)
        #expect(open.fetches == 1 && open.emissions == 1)
        // Another store, another entity: no fetch.
        try container.write { $0.insert(OTag(label: "x")) }
        try container.write { $0.insert(OList(name: "unrelated")) }
        #expect(try open.refresh() == false)
        #expect(open.fetches == 1)
        // The entity, but no change to the result: a fetch, no value.
        try container.write { $0.insert(OTask(title: "finished", done: true)) }
        #expect(try open.refresh() == false)
        #expect(open.fetches == 2 && open.emissions == 1)
        // A change of the result.
        try container.write { $0.insert(OTask(title: "open")) }
        #expect(try open.refresh() == true)
        #expect(open.value.map(\.title) == ["open"])
        #expect(open.emissions == 2)
    }

    @Test("a burst of commits while the consumer is busy costs one fetch")
    func burstsCoalesce() async throws {
        let container = try observationContainer()
        let observerContext = ModelContext(container)
        let all = try SynchronousLiveQuery(container.observe(Self.byTitle), context: observerContext)
        for index in 0..<20 { try container.write { $0.insert(OTask(title: "t\(index)")) } }
        #expect(try all.refresh() == true)
        #expect(all.fetches == 2)
        #expect(all.value.count == 20)

        // The same through the asynchronous sequence: the consumer asks once after the burst.
        let values = try await liveValues(container.observe(Self.byTitle), count: 2) { _ in
            for index in 20..<40 { try container.write { $0.insert(OTask(title: "t\(index)")) } }
        }
        #expect(values.map(\.count) == [20, 40])
    }

    @Test("rollbacks and failed saves give no value and no fetch")
    func rollbacksAndFailedSaves() throws {
        let container = try observationContainer()
        let task = try container.writeReturning { $0.insert(OTask(title: "a")) }
        let observer = try SynchronousLiveQuery(container.observe(Self.byTitle), context: ModelContext(container))
        let context = ModelContext(container)
        context.insert(OTask(title: "never saved"))
        context.rollback()
        context.insert(OTask(id: task.id, title: "duplicate"))
        #expect(throws: ReplicaError.self) { try context.save() }
        #expect(try observer.refresh() == false)
        #expect(observer.fetches == 1)
    }

    @Test("a live count and a live model by identifier")
    func countAndModel() async throws {
        let container = try observationContainer()
        let task = try container.writeReturning { $0.insert(OTask(title: "a", priority: 1)) }
        let counts = try await liveValues(container.observeCount(FetchDescriptor<OTask>(predicate: #Predicate { $0.priority > 0 })),
                                          count: 3) { step in
            try container.write { context in
                context.insert(OTask(title: "none", priority: 0))  // no new count: not delivered
                if step == 1 { context.insert(OTask(title: "b", priority: 2)) }
                if step == 2 { context.delete(task) }
            }
        }
        #expect(counts == [1, 2, 1])

        let other = try container.writeReturning { $0.insert(OTask(title: "watched")) }
        let models = try await liveValues(container.observe(OTask.self, id: other.id), count: 3) { step in
            try container.write { context in
                context.insert(OTask(title: "another record: no value"))
                if step == 1 {
                    var edited = other
                    edited.title = "edited"
                    context.update(edited)
                }
                if step == 2 { context.delete(other) }
            }
        }
        #expect(models.map { $0?.title } == ["watched", "edited", nil])
        let observer = try SynchronousLiveQuery(container.observe(OTask.self, id: task.id), context: ModelContext(container))
        try container.write { $0.insert(OTask(title: "unrelated")) }
        #expect(try observer.refresh() == false)
        #expect(observer.fetches == 1, "a change of another record of the entity does not fetch")
    }

    @Test("a record deleted and inserted again in one save: a live model delivers the new incarnation, a live list and count stay")
    func deleteAndReinsertInOneSave() async throws {
        let container = try observationContainer()
        let task = try container.writeReturning { $0.insert(OTask(title: "old", priority: 1)) }
        let models = try await liveValues(container.observe(OTask.self, id: task.id), count: 2) { _ in
            try container.write { context in
                context.delete(task)
                context.insert(OTask(id: task.id, title: "new", priority: 1))
            }
        }
        #expect(models.map { $0?.title } == ["old", "new"])

        let list = try SynchronousLiveQuery(container.observe(Self.byTitle), context: ModelContext(container))
        let count = try SynchronousLiveQuery(container.observeCount(FetchDescriptor<OTask>()), context: ModelContext(container))
        try container.write { context in
            let current = try #require(try context.model(OTask.self, id: task.id))
            context.delete(current)
            context.insert(OTask(id: task.id, title: "newer", priority: 1))
        }
        #expect(try list.refresh() == true)
        #expect(list.value.map(\.title) == ["newer"])
        #expect(try count.refresh() == false, "the count is the same: no value")
        #expect(count.value == 1)
    }

    @Test("a batch delete and a cascade each give one new value of a live list and count; a live model of a cascaded child ends as nil")
    func batchDeleteAndCascade() async throws {
        let container = try observationContainer()
        let list = try container.writeReturning { $0.insert(OList(name: "Work")) }
        try container.write { $0.insert(OTask(title: "report", list: Reference(list))) }
        try container.write { context in
            for title in ["a", "b", "c"] { context.insert(OTask(title: title)) }
        }
        let titles = try await liveValues(container.observe(Self.byTitle), count: 3) { step in
            try container.write { context in
                if step == 1 { _ = try context.delete(model: OTask.self, where: #Predicate { $0.title == "a" || $0.title == "b" }) }
                if step == 2 { context.delete(try #require(try context.model(OList.self, id: list.id))) }
            }
        }
        #expect(titles.map { $0.map(\.title) } == [["a", "b", "c", "report"], ["c", "report"], ["c"]])
        // The cascade as seen by a live model of the child and a live count.
        let container2 = try observationContainer()
        let list2 = try container2.writeReturning { $0.insert(OList(name: "Home")) }
        let child2 = try container2.writeReturning { $0.insert(OTask(title: "dishes", list: Reference(list2))) }
        let models = try await liveValues(container2.observe(OTask.self, id: child2.id), count: 2) { _ in
            try container2.write { context in context.delete(try #require(try context.model(OList.self, id: list2.id))) }
        }
        #expect(models.map { $0?.title } == ["dishes", nil])
        let container3 = try observationContainer()
        let list3 = try container3.writeReturning { $0.insert(OList(name: "Garden")) }
        try container3.write { context in
            for title in ["mow", "weed", "water"] { context.insert(OTask(title: title, list: Reference(list3))) }
            context.insert(OTask(title: "kept"))
        }
        let counts = try await liveValues(container3.observeCount(FetchDescriptor<OTask>()), count: 2) { _ in
            try container3.write { context in context.delete(try #require(try context.model(OList.self, id: list3.id))) }
        }
        #expect(counts == [4, 1])
    }

    @Test("a sync import between two devices gives a new value")
    func syncImport() async throws {
        let cloud = InMemoryCloudDatabase()
        let phone = try Device("phone", seed: 1, inMemory: true)
        let laptop = try Device("laptop", seed: 2, inMemory: true)
        phone.context.insert(SyncNote(title: "from the phone"))
        try phone.context.save()
        try phone.sync(cloud)
        let observer = try SynchronousLiveQuery(laptop.container.observe(FetchDescriptor<SyncNote>()), context: ModelContext(laptop.container))
        #expect(observer.value.isEmpty)
        try laptop.sync(cloud)
        #expect(try observer.refresh() == true)
        #expect(observer.value.map(\.title) == ["from the phone"])
    }

    @Test("a live query on the main actor delivers there, and its models' references load their targets")
    @MainActor
    func mainActor() async throws {
        let container = try observationContainer()
        let list = try container.writeReturning { $0.insert(OList(name: "Errands")) }
        try container.write { $0.insert(OTask(title: "stamps", list: Reference(list))) }
        var titles: [String?] = []
        for try await tasks in container.observe(Self.byTitle) {
            MainActor.assertIsolated()
            titles = tasks.map { $0.list?.name }
            break
        }
        #expect(titles == ["Errands"])
    }

    @Test("cancellation ends the sequence and frees the subscription and the connections")
    func cancellation() async throws {
        let container = try observationContainer(file: true)
        let location = Connection.Location.file(try #require(container.url(of: "lists")))
        let consumer = Task {
            var values = 0
            for try await _ in container.observe(Self.byTitle) { values += 1 }
            return values
        }
        while container.changeHub.subscriptionCount == 0 { await Task.yield() }
        try await Task.sleep(nanoseconds: 20_000_000)
        consumer.cancel()
        #expect(try await consumer.value == 1)
        #expect(container.changeHub.subscriptionCount == 0)
        #expect(Connection.openCount(at: location) == 0)
    }

    @Test("a query that cannot run ends the sequence with its error")
    func fetchError() async throws {
        let container = try observationContainer()
        var descriptor = FetchDescriptor<OTask>(predicate: #Predicate { $0.title.contains(/x/) })
        descriptor.allowsInMemoryEvaluation = false
        await #expect(throws: FetchError.self) { _ = try await liveValues(container.observe(descriptor), count: 1) }
        #expect(container.changeHub.subscriptionCount == 0)
    }

    @Test("a commit of another OS process to an app-group store gives a new value")
    func otherProcess() async throws {
        let root = observationDirectory()
        var environment = ReplicaEnvironment.live
        environment.appGroupDirectory = { root.appendingPathComponent($0, isDirectory: true) }
        environment.processIdentity = ProcessIdentity(bundleIdentifier: "com.example.trips", processName: "app",
                                                      processID: ProcessInfo.processInfo.processIdentifier)
        let app = try ModelContainer(for: Schema([LiveNote.self]), configurations: [
            ModelConfiguration("shared", groupContainer: .identifier("group.replica.tests")),
        ], environment: environment)
        let values = try await liveValues(app.observe(FetchDescriptor<LiveNote>()), count: 2) { _ in
            _ = try ChangeStreamProcessTests.widget(["write", root.path, "from the widget"])
        }
        #expect(values.map { $0.map(\.text) } == [[], ["from the widget"]])
    }
}

/// The model the `replica-widget` helper executable writes.
struct LiveNote: PersistentModel, Codable {
    static var entityName: String { "Note" }
    var id = UUID.unassigned
    var text: String = ""
    static let entity = ModelEntity<LiveNote>([.attribute("text", \.text, default: "")])
}

extension ModelContainer {
    /// Inserts through a new context, saves, and returns what `body` returned.
    func writeReturning<T>(_ body: (ModelContext) throws -> T) throws -> T {
        let context = ModelContext(self)
        let value = try body(context)
        try context.save()
        return value
    }
}

/// For random sequences of writes, every live query agrees with a fresh fetch after each commit, and delivers one
/// value per change of the fresh result — no more (no duplicates), no fewer (no missed change).
@Suite("Live query properties")
struct LiveQueryPropertyTests {
    enum Step: CustomStringConvertible {
        case insertTask(writer: Int, title: Int, priority: Int, list: Int)
        case insertList(writer: Int, name: Int)
        case editTask(writer: Int, task: Int, field: Int, value: Int)
        case renameList(writer: Int, list: Int, name: Int)
        case deleteTask(writer: Int, task: Int)
        case deleteList(writer: Int, list: Int)
        case batchDelete(writer: Int, priority: Int)
        case rollback(writer: Int, task: Int)
        case failedSave(writer: Int, task: Int)
        case insertTag(writer: Int, label: Int)
        case burst(writer: Int, count: Int)

        var description: String {
            switch self {
            case let .insertTask(w, t, p, l): return "insertTask(w\(w), t\(t), p\(p), list \(l))"
            case let .insertList(w, n): return "insertList(w\(w), \(n))"
            case let .editTask(w, t, f, v): return "editTask(w\(w), task \(t), field \(f), \(v))"
            case let .renameList(w, l, n): return "renameList(w\(w), list \(l), \(n))"
            case let .deleteTask(w, t): return "deleteTask(w\(w), task \(t))"
            case let .deleteList(w, l): return "deleteList(w\(w), list \(l))"
            case let .batchDelete(w, p): return "batchDelete(w\(w), priority \(p))"
            case let .rollback(w, t): return "rollback(w\(w), task \(t))"
            case let .failedSave(w, t): return "failedSave(w\(w), task \(t))"
            case let .insertTag(w, l): return "insertTag(w\(w), \(l))"
            case let .burst(w, c): return "burst(w\(w), \(c) saves)"
            }
        }
    }

    static let writer = Gen.int(in: 0...1)
    static let step: Generator<Step> = Gen.frequency([
        (5, Gen.zip(writer, Gen.int(in: 0...3), Gen.int(in: 0...3), Gen.int(in: 0...3))
            .map { Step.insertTask(writer: $0, title: $1, priority: $2, list: $3) }),
        (2, Gen.zip(writer, Gen.int(in: 0...2)).map { Step.insertList(writer: $0, name: $1) }),
        (5, Gen.zip(writer, Gen.int(in: 0...9), Gen.int(in: 0...3), Gen.int(in: 0...3))
            .map { Step.editTask(writer: $0, task: $1, field: $2, value: $3) }),
        (2, Gen.zip(writer, Gen.int(in: 0...4), Gen.int(in: 0...2)).map { Step.renameList(writer: $0, list: $1, name: $2) }),
        (2, Gen.zip(writer, Gen.int(in: 0...9)).map { Step.deleteTask(writer: $0, task: $1) }),
        (1, Gen.zip(writer, Gen.int(in: 0...4)).map { Step.deleteList(writer: $0, list: $1) }),
        (1, Gen.zip(writer, Gen.int(in: 0...3)).map { Step.batchDelete(writer: $0, priority: $1) }),
        (1, Gen.zip(writer, Gen.int(in: 0...9)).map { Step.rollback(writer: $0, task: $1) }),
        (1, Gen.zip(writer, Gen.int(in: 0...9)).map { Step.failedSave(writer: $0, task: $1) }),
        (1, Gen.zip(writer, Gen.int(in: 0...3)).map { Step.insertTag(writer: $0, label: $1) }),
        (1, Gen.zip(writer, Gen.int(in: 2...4)).map { Step.burst(writer: $0, count: $1) }),
    ])
    static let steps = Gen.array(of: step, maxLength: 40, averageLength: 20)
    static let names = ["A", "B", "C"]

    /// One live query under test, with its fresh-fetch oracle.
    struct Checked {
        let name: String
        let refresh: () throws -> Void
        /// Whether the observer's value equals a fresh fetch; and whether the fresh value changed since the last check.
        let check: () throws -> (agrees: Bool, changed: Bool)
        let emissions: () -> Int
        var changes = 0
    }

    static func checked<Value: Sendable>(_ name: String, _ query: LiveQuery<Value>, _ container: ModelContainer,
                                         observerContext: ModelContext) throws -> Checked {
        let observer = try SynchronousLiveQuery(query, context: observerContext)
        var last = observer.value
        return Checked(name: name, refresh: { try observer.refresh() }, check: {
            let fresh = try query.query.fetch(ModelContext(container))
            defer { last = fresh }
            return (query.query.same(observer.value, fresh), !query.query.same(last, fresh))
        }, emissions: { observer.emissions })
    }

    static func run(_ steps: [Step]) throws {
        let container = try observationContainer()
        let first = try container.writeReturning { $0.insert(OList(name: "A")) }
        let writers = [ModelContext(container), ModelContext(container)]
        let observerContext = ModelContext(container)
        var prefetching = FetchDescriptor<OTask>(sortBy: [SortDescriptor(\.title)])
        prefetching.relationshipKeyPathsForPrefetching = [\.list]
        var observers = [
            try checked("all tasks", container.observe(FetchDescriptor<OTask>(sortBy: [SortDescriptor(\.title)])), container, observerContext: observerContext),
            try checked("open tasks", container.observe(FetchDescriptor<OTask>(predicate: #Predicate { $0.done == false },
                                                                               sortBy: [SortDescriptor(\.priority)])), container, observerContext: observerContext),
            try checked("count of priority > 1", container.observeCount(FetchDescriptor<OTask>(predicate: #Predicate { $0.priority > 1 })),
                        container, observerContext: observerContext),
            try checked("tasks of lists named A", container.observe(FetchDescriptor<OTask>(predicate: #Predicate { $0.list?.name == "A" })),
                        container, observerContext: observerContext),
            try checked("lists", container.observe(FetchDescriptor<OList>(sortBy: [SortDescriptor(\.name)])), container, observerContext: observerContext),
            try checked("tasks with their lists", container.observe(prefetching), container, observerContext: observerContext),
            try checked("the first list", container.observe(OList.self, id: first.id), container, observerContext: observerContext),
            try checked("tags", container.observeCount(FetchDescriptor<OTag>()), container, observerContext: ModelContext(container)),
        ]
        func tasks() throws -> [OTask] { try ModelContext(container).fetch(FetchDescriptor<OTask>()) }
        func lists() throws -> [OList] { try ModelContext(container).fetch(FetchDescriptor<OList>()) }

        for step in steps {
            switch step {
            case let .insertTask(w, title, priority, list):
                let all = try lists()
                writers[w].insert(OTask(title: "t\(title)", priority: priority, list: list < all.count ? Reference(all[list]) : nil))
                try writers[w].save()
            case let .insertList(w, name):
                writers[w].insert(OList(name: names[name]))
                try writers[w].save()
            case let .editTask(w, index, field, value):
                let all = try tasks()
                guard !all.isEmpty, var task = try writers[w].model(OTask.self, id: all[index % all.count].id) else { continue }
                switch field {
                case 0: task.title = "t\(value)"
                case 1: task.done = value % 2 == 1
                case 2: task.priority = value
                default:
                    let lists = try lists()
                    task.list = value < lists.count ? Reference(lists[value]) : nil
                }
                writers[w].update(task)
                try writers[w].save()
            case let .renameList(w, index, name):
                let all = try lists()
                guard !all.isEmpty, var list = try writers[w].model(OList.self, id: all[index % all.count].id) else { continue }
                list.name = names[name]
                writers[w].update(list)
                try writers[w].save()
            case let .deleteTask(w, index):
                let all = try tasks()
                guard !all.isEmpty else { continue }
                writers[w].delete(all[index % all.count])
                try writers[w].save()
            case let .deleteList(w, index):
                let all = try lists()
                guard !all.isEmpty else { continue }
                writers[w].delete(all[index % all.count])
                try writers[w].save()
            case let .batchDelete(w, priority):
                try writers[w].delete(model: OTask.self, where: #Predicate { $0.priority == priority })
                try writers[w].save()
            case let .rollback(w, index):
                writers[w].insert(OTask(title: "rolled back \(index)"))
                writers[w].rollback()
            case let .failedSave(w, index):
                let all = try lists()
                guard !all.isEmpty else { continue }
                writers[w].insert(OList(id: all[index % all.count].id, name: "duplicate"))
                try Property.require((try? writers[w].save()) == nil, "a duplicate ID was saved", kind: "setup")
                writers[w].rollback()
            case let .insertTag(w, label):
                writers[w].insert(OTag(label: "l\(label)"))
                try writers[w].save()
            case let .burst(w, count):
                // Several commits before the observers look: at most one value each.
                for index in 0..<count {
                    writers[w].insert(OTask(title: "burst\(index)", priority: index % 4))
                    try writers[w].save()
                }
            }
            for index in observers.indices {
                try observers[index].refresh()
                let (agrees, changed) = try observers[index].check()
                try Property.require(agrees, "\(observers[index].name) differs from a fresh fetch after \(step)", kind: "observers agree")
                if changed { observers[index].changes += 1 }
                try Property.require(observers[index].emissions() == 1 + observers[index].changes,
                                     "\(observers[index].name) delivered \(observers[index].emissions()) values for \(observers[index].changes) changes",
                                     kind: "one value per change")
            }
        }
    }

    @Test("every live query equals a fresh fetch after each commit and delivers one value per change of it")
    func observersAgreeWithFreshFetches() throws {
        let scale = Int(ProcessInfo.processInfo.environment["REPLICA_PROPERTY_SCALE"] ?? "") ?? 1
        let result = checkProperty("live queries agree with fresh fetches",
                                   configuration: PropertyConfiguration(cases: 60 * max(1, scale), persistence: .disabled),
                                   Self.steps) { steps in
            try Self.run(steps)
        }
        #expect(result.passed, "\(result.report)")
    }
}
