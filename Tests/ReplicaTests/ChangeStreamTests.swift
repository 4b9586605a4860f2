import Foundation
import Synchronization
import Testing
@testable import Replica

// Models of the change-stream and live-query tests: a list holds tasks (cascade), a tag stands alone.

struct OList: PersistentModel, Codable {
    static var entityName: String { "List" }
    var id = UUID.unassigned
    var name: String = ""
    var tasks: [Reference<OTask>] = []
    static let entity = ModelEntity<OList>([
        .attribute("name", \.name, default: "", options: .preserveValueOnDeletion),
        .toMany("tasks", \.tasks, inverse: "list", deleteRule: .cascade),
    ])
}

struct OTask: PersistentModel, Codable {
    static var entityName: String { "Task" }
    var id = UUID.unassigned
    var title: String = ""
    var done: Bool = false
    var priority: Int = 0
    var list: Reference<OList>?
    static let entity = ModelEntity<OTask>([
        .attribute("title", \.title, default: ""),
        .attribute("done", \.done, default: false),
        .attribute("priority", \.priority, default: 0),
        .toOne("list", \.list, inverse: "tasks"),
    ])
}

struct OTag: PersistentModel, Codable {
    static var entityName: String { "Tag" }
    var id = UUID.unassigned
    var label: String = ""
    static let entity = ModelEntity<OTag>([.attribute("label", \.label, default: "")])
}

func observationDirectory() -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("replica-observe-\(UUID().uuidString)", isDirectory: true)
    try! FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}

/// A container with store "lists" (lists and tasks) and store "tags"; `tagsTrackHistory` false makes "tags" a
/// store without history.
func observationContainer(file: Bool = false, directory: URL? = nil, seed: UInt64 = 1, tagsTrackHistory: Bool = true,
                          process: ProcessIdentity? = nil) throws -> ModelContainer {
    var environment = ReplicaEnvironment.seeded(seed: seed, directory: directory ?? observationDirectory())
    if let process { environment.processIdentity = process }
    var tags = ModelConfiguration("tags", schema: Schema([OTag.self]), isStoredInMemoryOnly: !file)
    tags.tracksHistory = tagsTrackHistory
    return try ModelContainer(for: Schema([OList.self, OTask.self, OTag.self]), configurations: [
        ModelConfiguration("lists", schema: Schema([OList.self, OTask.self]), isStoredInMemoryOnly: !file), tags,
    ], environment: environment)
}

struct ObservationTimeout: Error, CustomStringConvertible {
    let seconds: Double
    var description: String { "nothing arrived within \(seconds) s" }
}

/// Runs `body`, cancelling it and throwing ``ObservationTimeout`` after `seconds` (real time).
func withTimeout<T: Sendable>(_ seconds: Double = 20, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(nanoseconds: UInt64(seconds * 1_000_000_000))
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let value = first else { throw ObservationTimeout(seconds: seconds) }
        return value
    }
}

/// The next `count` committed changes of `iterator` (overflows too, as events).
func nextEvents(_ iterator: ChangeStream.Iterator, count: Int, seconds: Double = 20) async throws -> [ChangeEvent] {
    try await withTimeout(seconds) {
        var iterator = iterator
        var events: [ChangeEvent] = []
        while events.count < count, let event = try await iterator.next() { events.append(event) }
        return events
    }
}

extension ChangeEvent {
    var change: StoreChange? {
        if case let .committed(change) = self { return change }
        return nil
    }
}

@Suite("Change stream")
struct ChangeStreamTests {
    @Test("a save of any context is announced with its store, token, author, origin and identifiers")
    func localSaves() async throws {
        let container = try observationContainer()
        let iterator = container.changes.makeAsyncIterator()
        let context = ModelContext(container)
        context.author = "editor"
        let list = context.insert(OList(name: "Groceries"))
        let task = context.insert(OTask(title: "milk", list: Reference(list)))
        try context.save()
        var renamed = try #require(try context.model(OTask.self, id: task.id))
        renamed.title = "oat milk"
        context.update(renamed)
        let tag = context.insert(OTag(label: "home"))
        try context.save()

        let events = try await nextEvents(iterator, count: 3)
        let changes = events.compactMap(\.change)
        #expect(changes.map(\.storeName) == ["lists", "lists", "tags"])
        #expect(changes.allSatisfy { $0.origin == .localSave && $0.author == "editor" })
        #expect(changes[0].token == HistoryToken(storeIdentity: try #require(container.storeIdentity(of: "lists")), value: 1))
        #expect(changes[0].insertedIdentifiers == [list.persistentModelID, task.persistentModelID])
        #expect(changes[1].updatedIdentifiers.map(\.id) == [task.persistentModelID])
        #expect(changes[1].updatedIdentifiers.first?.attributes == ["title"])
        #expect(changes[2].insertedIdentifiers == [tag.persistentModelID])
        #expect(changes[0].processIdentity == container.environment.processIdentity)
        // The same transactions as the history log holds.
        let history = try context.fetchHistory(HistoryDescriptor(storeNames: ["lists"]))
        #expect(changes.prefix(2).map(\.historyTransaction) == history)
    }

    @Test("a stream filtered by store announces only that store's changes")
    func filteredByStore() async throws {
        let container = try observationContainer()
        let iterator = try container.changes(in: ["tags"]).makeAsyncIterator()
        let context = ModelContext(container)
        context.insert(OList(name: "ignored"))
        try context.save()
        let tag = context.insert(OTag(label: "only this"))
        try context.save()
        let events = try await nextEvents(iterator, count: 1)
        #expect(events.compactMap(\.change).map(\.insertedIdentifiers) == [[tag.persistentModelID]])
        #expect(throws: ReplicaError.unknownStore("nope")) { try container.changes(in: ["nope"]) }
    }

    @Test("a batch delete and a cascade are announced as the deletes they commit, tombstones included")
    func batchDeleteAndCascade() async throws {
        let container = try observationContainer()
        let context = ModelContext(container)
        let list = context.insert(OList(name: "Trip"))
        let tasks = (0..<3).map { context.insert(OTask(title: "t\($0)", priority: $0, list: Reference(list))) }
        let loose = (0..<2).map { context.insert(OTask(title: "loose\($0)", priority: 9)) }
        try context.save()
        let iterator = container.changes.makeAsyncIterator()

        #expect(try context.delete(model: OTask.self, where: #Predicate { $0.priority == 9 }) == 2)
        try context.save()
        context.delete(list)
        try context.save()

        let changes = try await nextEvents(iterator, count: 2).compactMap(\.change)
        #expect(Set(changes[0].deletedIdentifiers) == Set(loose.map(\.persistentModelID)))
        #expect(Set(changes[1].deletedIdentifiers) == Set([list.persistentModelID] + tasks.map(\.persistentModelID)))
        guard case let .delete(_, tombstone)? = changes[1].changes.first(where: { $0.changedPersistentIdentifier == list.persistentModelID })
        else { Issue.record("no delete of the list"); return }
        #expect(tombstone["name"] == .text("Trip"))
    }

    @Test("a rollback and a failed save announce nothing")
    func rollbackAndFailedSave() async throws {
        let container = try observationContainer()
        let context = ModelContext(container)
        let list = context.insert(OList(name: "kept"))
        try context.save()
        let iterator = container.changes.makeAsyncIterator()

        context.insert(OTask(title: "rolled back"))
        context.rollback()
        // A save that fails validation (a duplicate ID) writes nothing.
        context.insert(OList(id: list.id, name: "duplicate"))
        #expect(throws: ReplicaError.self) { try context.save() }
        context.rollback()
        // A save the fault hook stops before its commit writes nothing either.
        var failing = container.environment
        failing.faultHook = { point in
            if case .beforeCommit = point { throw ObservationTimeout(seconds: 0) }
        }
        let failingContainer = try ModelContainer(for: Schema([OList.self, OTask.self]), configurations: [
            ModelConfiguration("lists", schema: Schema([OList.self, OTask.self]), isStoredInMemoryOnly: true),
        ], environment: failing)
        let failingIterator = failingContainer.changes.makeAsyncIterator()
        let failingContext = ModelContext(failingContainer)
        failingContext.insert(OList(name: "never"))
        #expect(throws: ObservationTimeout.self) { try failingContext.save() }

        let marker = context.insert(OTag(label: "the next event"))
        try context.save()
        let events = try await nextEvents(iterator, count: 1)
        #expect(events.compactMap(\.change).map(\.insertedIdentifiers) == [[marker.persistentModelID]])
        await #expect(throws: ObservationTimeout.self) { _ = try await nextEvents(failingIterator, count: 1, seconds: 0.5) }
    }

    @Test("a store that does not track history announces the save's identifiers, without a token")
    func storeWithoutHistory() async throws {
        let container = try observationContainer(tagsTrackHistory: false)
        let iterator = try container.changes(in: ["tags"]).makeAsyncIterator()
        let context = ModelContext(container)
        var tag = context.insert(OTag(label: "a"))
        try context.save()
        tag.label = "b"
        context.update(tag)
        try context.save()
        let changes = try await nextEvents(iterator, count: 2).compactMap(\.change)
        #expect(changes.map(\.token) == [nil, nil])
        #expect(changes[0].insertedIdentifiers == [tag.persistentModelID])
        #expect(changes[1].updatedIdentifiers.first?.attributes == ["label"])
        #expect(changes.allSatisfy { $0.origin == .localSave && $0.storeName == "tags" })
    }

    @Test("a record deleted and inserted again in one save is announced as its delete, then its insert", arguments: [true, false])
    func deleteAndReinsertInOneSave(tracksHistory: Bool) async throws {
        let container = try observationContainer(tagsTrackHistory: tracksHistory)
        let context = ModelContext(container)
        let tag = context.insert(OTag(label: "first"))
        try context.save()
        let iterator = try container.changes(in: ["tags"]).makeAsyncIterator()
        let posted = Mutex<[[PersistentIdentifier]]>([])
        let observer = NotificationCenter.default.addObserver(forName: ModelContext.didSave, object: context, queue: nil) { notification in
            let lists = [ModelContext.NotificationKey.deletedIdentifiers, .insertedIdentifiers].map {
                notification.userInfo?[$0.rawValue] as? [PersistentIdentifier] ?? []
            }
            posted.withLock { $0 += lists }
        }
        defer { NotificationCenter.default.removeObserver(observer) }

        context.delete(tag)
        context.insert(OTag(id: tag.id, label: "second"))
        try context.save()

        let change = try #require(try await nextEvents(iterator, count: 1).first?.change)
        #expect(change.deletedIdentifiers == [tag.persistentModelID])
        #expect(change.insertedIdentifiers == [tag.persistentModelID])
        #expect(change.updatedIdentifiers.isEmpty)
        guard change.changes.count == 2, case .delete = change.changes[0], case .insert = change.changes[1] else {
            Issue.record("expected the delete, then the insert: \(change.changes)")
            return
        }
        #expect(posted.withLock { $0 } == [[tag.persistentModelID], [tag.persistentModelID]])
    }

    @Test("a consumer that falls behind gets an overflow naming what to re-read; saves never wait for it")
    func overflow() async throws {
        let container = try observationContainer()
        let iterator = try container.changes(in: ["lists"], bufferLimit: 3).makeAsyncIterator()
        let context = ModelContext(container)
        for index in 0..<10 {
            context.insert(OList(name: "l\(index)"))
            try context.save()
        }
        let identity = try #require(container.storeIdentity(of: "lists"))
        let events = try await nextEvents(iterator, count: 4)
        #expect(events.prefix(3).compactMap(\.change).compactMap(\.token?.value) == [1, 2, 3])
        #expect(events.last == .overflow([DroppedChanges(storeName: "lists", after: HistoryToken(storeIdentity: identity, value: 3),
                                                         through: HistoryToken(storeIdentity: identity, value: 10), count: 7)]))
        // After the overflow, the stream goes on.
        let next = context.insert(OList(name: "after"))
        try context.save()
        #expect(try await nextEvents(iterator, count: 1).first?.change?.insertedIdentifiers == [next.persistentModelID])
        // What the overflow names is in history.
        #expect(try context.fetchHistory(HistoryDescriptor(after: HistoryToken(storeIdentity: identity, value: 3))).count == 8)
    }

    @Test("a stream can start after a token: the history after it first, then live")
    func startsAfterToken() async throws {
        let container = try observationContainer()
        let context = ModelContext(container)
        for index in 0..<3 {
            context.insert(OList(name: "l\(index)"))
            try context.save()
        }
        let identity = try #require(container.storeIdentity(of: "lists"))
        let iterator = try container.changes(in: ["lists"], after: [HistoryToken(storeIdentity: identity, value: 1)]).makeAsyncIterator()
        context.insert(OList(name: "live"))
        try context.save()
        let changes = try await nextEvents(iterator, count: 3).compactMap(\.change)
        #expect(changes.compactMap(\.token?.value) == [2, 3, 4])
        #expect(changes.allSatisfy { $0.origin == .localSave })
    }

    @Test("cancelling the consumer ends the stream and frees its subscription")
    func cancellationFreesTheSubscription() async throws {
        let container = try observationContainer(file: true)
        let location = Connection.Location.file(try #require(container.url(of: "lists")))
        let consumer = Task {
            var count = 0
            for try await _ in container.changes { count += 1 }
            return count
        }
        while container.changeHub.subscriptionCount == 0 { await Task.yield() }
        #expect(Connection.openCount(at: location) == 1, "the hub reads the lists store on a connection of its own")
        consumer.cancel()
        #expect(try await consumer.value == 0)
        #expect(container.changeHub.subscriptionCount == 0)
        #expect(Connection.openCount(at: location) == 0)
    }

    @Test("another container on the same store file is announced as another process")
    func anotherContainerOnTheSameFile() async throws {
        let directory = observationDirectory()
        let app = try observationContainer(file: true, directory: directory, seed: 1)
        let widget = try observationContainer(file: true, directory: directory, seed: 2,
                                              process: ProcessIdentity(bundleIdentifier: "com.example.widget", processName: "widget", processID: 2))
        let iterator = try app.changes(in: ["lists"]).makeAsyncIterator()
        let context = ModelContext(widget)
        context.author = "widget"
        let list = context.insert(OList(name: "from the widget"))
        try context.save()
        let change = try #require(try await nextEvents(iterator, count: 1).first?.change)
        #expect(change.origin == .otherProcess)
        #expect(change.author == "widget")
        #expect(change.processIdentity.bundleIdentifier == "com.example.widget")
        #expect(change.insertedIdentifiers == [list.persistentModelID])
    }

    @Test("a sync engine's imports are announced as sync imports")
    func syncImports() async throws {
        let cloud = InMemoryCloudDatabase()
        let phone = try Device("phone", seed: 1, inMemory: true)
        let laptop = try Device("laptop", seed: 2, inMemory: true)
        let note = phone.context.insert(SyncNote(title: "from the phone"))
        try phone.context.save()
        try phone.sync(cloud)
        let iterator = laptop.container.changes.makeAsyncIterator()
        try laptop.sync(cloud)
        let change = try #require(try await nextEvents(iterator, count: 1).first?.change)
        #expect(change.origin == .syncImport)
        #expect(change.isSyncImport)
        #expect(change.author == HistoryTransaction.syncAuthor)
        #expect(change.insertedIdentifiers == [note.persistentModelID])
        // Uploading its own save brings nothing new back: a save, then nothing from sync.
        var edited = try #require(try laptop.context.model(SyncNote.self, id: note.id))
        edited.rating = 5
        laptop.context.update(edited)
        try laptop.context.save()
        try laptop.sync(cloud)
        let next = try await nextEvents(iterator, count: 1)
        #expect(next.compactMap(\.change).map(\.origin) == [.localSave])
    }

    @Test("ModelContext.didSave is posted for sync imports, with the engine as the object")
    func didSaveForSyncImports() throws {
        let cloud = InMemoryCloudDatabase()
        let phone = try Device("phone", seed: 1, inMemory: true)
        let laptop = try Device("laptop", seed: 2, inMemory: true)
        let note = phone.context.insert(SyncNote(title: "from the phone"))
        try phone.context.save()
        try phone.sync(cloud)
        let posted = Mutex<[(ObjectIdentifier?, [PersistentIdentifier])]>([])
        let observer = NotificationCenter.default.addObserver(forName: ModelContext.didSave, object: nil, queue: nil) { notification in
            let inserted = notification.userInfo?[ModelContext.NotificationKey.insertedIdentifiers.rawValue] as? [PersistentIdentifier] ?? []
            let object = notification.object.map { ObjectIdentifier($0 as AnyObject) }
            posted.withLock { $0.append((object, inserted)) }
        }
        defer { NotificationCenter.default.removeObserver(observer) }
        try laptop.sync(cloud)
        let notifications = posted.withLock { $0 }.filter { $0.0 == ObjectIdentifier(laptop.engine) }
        #expect(notifications.count == 1)
        #expect(notifications.first?.1 == [note.persistentModelID])
    }

    @Test("historyTransactions announces the container's own sync imports as well as other processes' saves")
    func historyTransactionsIncludeOwnSyncImports() async throws {
        let cloud = InMemoryCloudDatabase()
        let phone = try Device("phone", seed: 1, inMemory: true)
        let laptop = try Device("laptop", seed: 2, inMemory: true)
        let note = phone.context.insert(SyncNote(title: "imported"))
        try phone.context.save()
        try phone.sync(cloud)
        let start = try laptop.context.currentHistoryToken(of: "notes")
        let stream = laptop.container.historyTransactions(ofStore: "notes", after: start)
        // A save of the laptop's own context is not announced; its engine's import is.
        laptop.context.insert(SyncNote(title: "local"))
        try laptop.context.save()
        try laptop.sync(cloud)
        let announced = try await withTimeout(10) {
            var iterator = stream.makeAsyncIterator()
            return try await iterator.next()
        }
        #expect(announced?.author == HistoryTransaction.syncAuthor)
        #expect(announced?.changes.map(\.changedPersistentIdentifier) == [note.persistentModelID])
    }
}

/// The model the `replica-widget` helper executable writes.
private struct ONote: PersistentModel, Codable {
    static var entityName: String { "Note" }
    var id = UUID.unassigned
    var text: String = ""
    static let entity = ModelEntity<ONote>([.attribute("text", \.text, default: "")])
}

@Suite("Change stream across OS processes", .serialized)
struct ChangeStreamProcessTests {
    /// Runs `replica-widget` (built beside the test bundle) and returns its standard output.
    static func widget(_ arguments: [String]) throws -> String {
        var directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        for _ in 0..<3 where !FileManager.default.fileExists(atPath: directory.appendingPathComponent("replica-widget").path) {
            directory = directory.deletingLastPathComponent()
        }
        let process = Process()
        process.executableURL = directory.appendingPathComponent("replica-widget")
        process.arguments = arguments
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        #expect(process.terminationStatus == 0, "replica-widget \(arguments.first ?? "") failed")
        return String(decoding: data, as: UTF8.self)
    }

    @Test("a commit of another OS process to an app-group store is announced, woken by file events", arguments: [
        OtherProcessCommits.fileEvents(fallbackPollingMilliseconds: 60_000), .polling(milliseconds: 20),
    ])
    func widgetProcessCommit(mode: OtherProcessCommits) async throws {
        let root = observationDirectory()
        var environment = ReplicaEnvironment.live
        environment.appGroupDirectory = { root.appendingPathComponent($0, isDirectory: true) }
        environment.defaultStoreDirectory = root
        environment.processIdentity = ProcessIdentity(bundleIdentifier: "com.example.trips", processName: "app",
                                                      processID: ProcessInfo.processInfo.processIdentifier)
        environment.otherProcessCommits = mode
        let app = try ModelContainer(for: Schema([ONote.self]), configurations: [
            ModelConfiguration("shared", groupContainer: .identifier("group.replica.tests")),
        ], environment: environment)
        let iterator = try app.changes(in: ["shared"]).makeAsyncIterator()

        let token = try Self.widget(["write", root.path, "from the widget"]).trimmingCharacters(in: .whitespacesAndNewlines)
        // With file events, the fallback polling (a minute) cannot be what delivers it within the time-out.
        let change = try #require(try await nextEvents(iterator, count: 1, seconds: 10).first?.change)
        #expect(change.origin == .otherProcess)
        #expect(change.author == "widget")
        #expect(change.processIdentity.bundleIdentifier == "com.example.trips.widget")
        #expect(change.token?.value == Int64(token))
        let inserted = try #require(change.insertedIdentifiers.first)
        #expect(try ModelContext(app).model(ONote.self, id: inserted.id)?.text == "from the widget")
    }
}
