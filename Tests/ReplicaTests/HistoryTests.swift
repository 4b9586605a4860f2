import Foundation
import Testing
@testable import Replica

private struct HTrip: PersistentModel, Codable {
    static var entityName: String { "Trip" }
    var id = UUID.unassigned
    var name: String = ""
    var notes: String?
    var items: [Reference<HItem>] = []
    static let entity = ModelEntity<HTrip>([
        .attribute("name", \.name, default: "", options: .preserveValueOnDeletion),
        .attribute("notes", \.notes),
        .toMany("items", \.items, inverse: "trip", deleteRule: .cascade),
    ])
}

private struct HItem: PersistentModel, Codable {
    static var entityName: String { "Item" }
    var id = UUID.unassigned
    var title: String = ""
    var trip: Reference<HTrip>?
    static let entity = ModelEntity<HItem>([
        .attribute("title", \.title, default: ""),
        .toOne("trip", \.trip, inverse: "items"),
    ])
}

private struct HDraft: PersistentModel, Codable {
    static var entityName: String { "Draft" }
    var id = UUID.unassigned
    var text: String = ""
    static let entity = ModelEntity<HDraft>([.attribute("text", \.text, default: "")])
}

private func makeDirectory() -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("replica-history-\(UUID().uuidString)", isDirectory: true)
    try! FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}

private func makeContainer(_ directory: URL, seed: UInt64 = 1, process: ProcessIdentity? = nil) throws -> (ModelContainer, ManualClock) {
    var environment = ReplicaEnvironment.seeded(seed: seed, directory: directory)
    if let process { environment.processIdentity = process }
    let container = try ModelContainer(
        for: Schema([HTrip.self, HItem.self, HDraft.self]),
        configurations: [
            ModelConfiguration("trips", schema: Schema([HTrip.self, HItem.self])),
            ModelConfiguration("drafts", schema: Schema([HDraft.self])),
        ],
        environment: environment)
    return (container, environment.clock as! ManualClock)
}

@Suite("History tracking")
struct HistoryTests {
    @Test("each save writes one transaction with token, author, timestamp, process identity and its changes")
    func recordsTransactions() throws {
        let (container, clock) = try makeContainer(makeDirectory())
        let context = ModelContext(container)
        context.author = "app"
        let trip = context.insert(HTrip(name: "Iceland"))
        let item = context.insert(HItem(title: "Lights", trip: Reference(trip)))
        try context.save()
        clock.advance(by: 1_500)
        var changed = trip
        changed.notes = "bring wool"
        context.update(changed)
        context.update(item)  // unchanged: must not appear
        try context.save()
        clock.advance(by: 1_000)
        context.delete(trip)  // cascades to the item
        try context.save()

        let history = try context.fetchHistory(HistoryDescriptor(storeNames: ["trips"]))
        #expect(history.count == 3)
        #expect(history.map(\.token.value) == [1, 2, 3])
        #expect(history.allSatisfy { $0.author == "app" && $0.bundleIdentifier == "com.example.replica" && $0.processID == 1 })
        #expect(history.allSatisfy { $0.token.storeIdentity == container.storeIdentity(of: "trips") })
        #expect(history[1].timestamp.timeIntervalSince(history[0].timestamp) == 1.5)
        #expect(history[0].changes == [.insert(trip.persistentModelID), .insert(item.persistentModelID)])
        #expect(history[1].changes == [.update(trip.persistentModelID, updatedAttributes: ["notes"])])
        let deletes = history[2].changes
        #expect(Set(deletes.map(\.changedPersistentIdentifier)) == [trip.persistentModelID, item.persistentModelID])
        guard case let .delete(_, tombstone)? = deletes.first(where: { $0.changedPersistentIdentifier == trip.persistentModelID }) else {
            Issue.record("no delete change for the trip"); return
        }
        #expect(try tombstone.value("name", as: String.self) == "Iceland")
        #expect(tombstone["notes"] == nil)  // not marked preserveValueOnDeletion
    }

    @Test("a save that changes nothing writes no transaction; a failed save writes none either")
    func noEmptyTransactions() throws {
        let (container, _) = try makeContainer(makeDirectory())
        let context = ModelContext(container)
        let trip = context.insert(HTrip(name: "A"))
        try context.save()
        context.update(trip)
        try context.save()
        context.insert(HTrip(id: trip.id, name: "B"))
        #expect(throws: ReplicaError.self) { try context.save() }
        #expect(try context.fetchHistory().count == 1)
    }

    @Test("filters: after a token, by author, by excluded author, by time range, by entity; sort and limit")
    func filters() throws {
        let (container, clock) = try makeContainer(makeDirectory())
        let context = ModelContext(container)
        for (i, author) in ["app", "widget", "app", "sync"].enumerated() {
            context.author = author
            if i == 2 { context.insert(HDraft(text: "d")) } else { context.insert(HTrip(name: "t\(i)")) }
            try context.save()
            clock.advance(by: 1_000)
        }
        let trips = try #require(container.storeIdentity(of: "trips"))
        let all = try context.fetchHistory()
        #expect(all.count == 4)
        let afterFirst = try context.fetchHistory(HistoryDescriptor(after: HistoryToken(storeIdentity: trips, value: 1)))
        #expect(afterFirst.map(\.author) == ["widget", "sync"])
        #expect(try context.fetchHistory(HistoryDescriptor(authors: ["app"])).count == 2)
        #expect(try context.fetchHistory(HistoryDescriptor(excludedAuthors: ["sync", "app"])).map(\.author) == ["widget"])
        let start = all[1].timestamp
        let ranged = try context.fetchHistory(HistoryDescriptor(from: start, to: start.addingTimeInterval(2)))
        #expect(ranged.map(\.author) == ["widget", "app"])
        #expect(try context.fetchHistory(HistoryDescriptor(entityNames: ["Draft"])).map(\.storeName) == ["drafts"])
        let newest = try context.fetchHistory(HistoryDescriptor(sortBy: .timestamp, reverse: true, fetchLimit: 2))
        #expect(newest.map(\.author) == ["sync", "app"])
    }

    @Test("fetching after a token costs the transactions after it, whatever came before")
    func afterTokenReadsOnlyTheTail() throws {
        let (container, _) = try makeContainer(makeDirectory())
        let context = ModelContext(container)
        for i in 0..<200 {
            context.insert(HTrip(name: "t\(i)"))
            try context.save()
        }
        let token = try context.currentHistoryToken(of: "trips")
        #expect(token.value == 200)
        // The query plan must use the primary key range, not a scan.
        let db = try context.connection(for: 0)
        let plan = try db.rows("EXPLAIN QUERY PLAN SELECT token FROM replica_history_transaction t WHERE token > ? ORDER BY token ASC", [.integer(198)])
        let detail = plan.map { row in if case let .text(s) = row[3] { s } else { "" } }.joined(separator: " | ")
        #expect(detail.contains("USING INTEGER PRIMARY KEY"))
        let tail = try context.fetchHistory(HistoryDescriptor(after: HistoryToken(storeIdentity: token.storeIdentity, value: 198)))
        #expect(tail.map(\.token.value) == [199, 200])
    }

    @Test("the after-token queries fetchHistory runs are range searches of the token key, never scans")
    func afterTokenQueryPlans() throws {
        let (container, _) = try makeContainer(makeDirectory())
        let context = ModelContext(container)
        for i in 0..<50 {
            context.author = i % 2 == 0 ? "app" : "widget"
            context.insert(HTrip(name: "t\(i)"))
            try context.save()
        }
        let db = try context.connection(for: 0)
        try db.execute("ANALYZE")
        let token = try context.currentHistoryToken(of: "trips")
        let after = HistoryToken(storeIdentity: token.storeIdentity, value: 40)
        func plan(_ sql: String, _ values: [SQLiteValue]) throws -> String {
            try db.rows("EXPLAIN QUERY PLAN " + sql, values).map { row in if case let .text(s) = row[3] { s } else { "" } }
                .joined(separator: " | ")
        }
        let descriptors = [
            HistoryDescriptor(after: after),
            HistoryDescriptor(after: after, reverse: true, fetchLimit: 3),
            HistoryDescriptor(after: after, authors: ["app"]),
            HistoryDescriptor(after: after, excludedAuthors: ["widget"]),
            HistoryDescriptor(after: after, from: Date(timeIntervalSince1970: 0), to: Date(timeIntervalSince1970: 4e9)),
            HistoryDescriptor(after: after, entityNames: ["Trip"]),
            HistoryDescriptor(after: after, sortBy: .timestamp),
            HistoryDescriptor(after: after, sortBy: .timestamp, reverse: true, fetchLimit: 2),
        ]
        for descriptor in descriptors {
            let (sql, values) = HistoryLog.headerQuery(descriptor)
            let detail = try plan(sql, values)
            #expect(detail.hasPrefix("SEARCH t USING INTEGER PRIMARY KEY (rowid>?)"), "\(descriptor): \(detail)")
            #expect(!detail.contains("SCAN"), "\(descriptor): \(detail)")
            // The plan is the one fetchHistory runs: same results as a filter over everything.
            let tail = try context.fetchHistory(descriptor)
            #expect(tail.allSatisfy { $0.token.value > 40 })
        }
        let changes = try plan(HistoryLog.changesInRangeSQL, [.integer(41), .integer(50)])
        #expect(changes.hasPrefix("SEARCH replica_history_change USING PRIMARY KEY (token>? AND token<?)"), "\(changes)")
        #expect(!changes.contains("SCAN") && !changes.contains("TEMP B-TREE"), "\(changes)")
        #expect(try context.fetchHistory(HistoryDescriptor(after: after, sortBy: .timestamp)).map(\.token.value) == Array(41...50))
    }

    @Test("pruning: a token older than pruned history is expired; tokens stay monotonic after pruning")
    func pruning() throws {
        let (container, clock) = try makeContainer(makeDirectory())
        let context = ModelContext(container)
        for i in 0..<5 {
            context.insert(HTrip(name: "t\(i)"))
            try context.save()
            clock.advance(by: 1_000)
        }
        let store = try #require(container.storeIdentity(of: "trips"))
        #expect(try context.deleteHistory(through: HistoryToken(storeIdentity: store, value: 3)) == 3)
        #expect(throws: ReplicaError.historyTokenExpired(HistoryToken(storeIdentity: store, value: 2))) {
            try context.fetchHistory(HistoryDescriptor(after: HistoryToken(storeIdentity: store, value: 2)))
        }
        #expect(try context.fetchHistory(HistoryDescriptor(after: HistoryToken(storeIdentity: store, value: 3))).map(\.token.value) == [4, 5])
        // Prune everything by date; the next save still gets a new, higher token.
        #expect(try context.deleteHistory(before: Date(timeIntervalSince1970: Double(clock.nowMilliseconds()) / 1000)) == 2)
        context.insert(HTrip(name: "after"))
        try context.save()
        #expect(try context.fetchHistory(HistoryDescriptor(storeNames: ["trips"])).map(\.token.value) == [6])
    }

    @Test("a token from another store is rejected with a typed error")
    func foreignToken() throws {
        let (container, _) = try makeContainer(makeDirectory())
        let (other, _) = try makeContainer(makeDirectory(), seed: 2)
        let context = ModelContext(container)
        let foreign = HistoryToken(storeIdentity: try #require(other.storeIdentity(of: "trips")), value: 1)
        #expect(throws: ReplicaError.historyTokenFromAnotherStore(foreign)) {
            try context.fetchHistory(HistoryDescriptor(after: foreign))
        }
        #expect(throws: ReplicaError.historyTokenFromAnotherStore(foreign)) { try context.deleteHistory(through: foreign) }
    }

    @Test("save notifications carry inserted, updated and deleted identifiers")
    func saveNotification() throws {
        let (container, _) = try makeContainer(makeDirectory())
        let context = ModelContext(container)
        let trip = context.insert(HTrip(name: "A"))
        let gone = context.insert(HTrip(name: "B"))
        try context.save()

        final class Box: @unchecked Sendable { var userInfo: [AnyHashable: Any]? }
        let box = Box()
        let observer = NotificationCenter.default.addObserver(forName: ModelContext.didSave, object: context, queue: nil) {
            box.userInfo = $0.userInfo
        }
        defer { NotificationCenter.default.removeObserver(observer) }
        var renamed = trip
        renamed.name = "A2"
        context.update(renamed)
        context.delete(gone)
        let added = context.insert(HDraft(text: "x"))
        try context.save()
        let info = try #require(box.userInfo)
        #expect(info[ModelContext.NotificationKey.insertedIdentifiers.rawValue] as? [PersistentIdentifier] == [added.persistentModelID])
        #expect(info[ModelContext.NotificationKey.updatedIdentifiers.rawValue] as? [PersistentIdentifier] == [trip.persistentModelID])
        #expect(info[ModelContext.NotificationKey.deletedIdentifiers.rawValue] as? [PersistentIdentifier] == [gone.persistentModelID])
    }

    @Test("a fault before commit rolls back data and history together")
    func faultBeforeCommit() throws {
        let directory = makeDirectory()
        var environment = ReplicaEnvironment.seeded(seed: 3, directory: directory)
        struct Crash: Error {}
        environment.faultHook = { if case .beforeCommit = $0 { throw Crash() } }
        let container = try ModelContainer(for: Schema([HTrip.self, HItem.self]), environment: environment)
        let context = ModelContext(container)
        context.insert(HTrip(name: "lost"))
        #expect(throws: Crash.self) { try context.save() }
        #expect(context.hasChanges)
        let reader = ModelContext(container)
        #expect(try reader.fetch(HTrip.self).isEmpty)
        #expect(try reader.fetchHistory().isEmpty)
    }

    @Test("one save mixing inserts, updates, plain deletes and deletes with preserved values records every change once, tombstones on the right records")
    func mixedSaveHistory() throws {
        let environment = ReplicaEnvironment.seeded(seed: 7, directory: temporaryTestDirectory())
        let container = try ModelContainer(for: Schema([Trip.self, Item.self]), configurations: [
            ModelConfiguration("main", isStoredInMemoryOnly: true)], environment: environment)
        let context = ModelContext(container)
        var trips: [Trip] = [], items: [Item] = []
        for i in 0..<6 { trips.append(context.insert(Trip(name: "t\(i)"))) }
        for i in 0..<6 { items.append(context.insert(Item(title: "i\(i)"))) }
        try context.save()
        let before = try #require(try context.fetchHistory().last).token
        // Interleave: delete item, delete trip (preserved name), update trip, delete item, insert, delete trip...
        context.delete(items[0]); context.delete(trips[0])
        var t = trips[1]; t.rating = 5; context.update(t)
        context.delete(items[1]); context.insert(Item(title: "new")); context.delete(trips[2])
        var u = items[2]; u.title = "changed"; context.update(u)
        context.delete(trips[3]); context.delete(items[3])
        try context.save()
        let transactions = try context.fetchHistory(HistoryDescriptor(after: before))
        #expect(transactions.count == 1)
        let changes = try #require(transactions.first).changes
        var deletes: [UUID: HistoryTombstone] = [:], inserts = 0, updates = 0
        for change in changes {
            switch change {
            case let .delete(id, tombstone): deletes[id.id] = tombstone
            case .insert: inserts += 1
            case .update: updates += 1
            }
        }
        #expect(inserts == 1 && updates == 2 && deletes.count == 6, "\(changes)")
        for trip in [trips[0], trips[2], trips[3]] { #expect(deletes[trip.id]?["name"] == .text(trip.name)) }
        for item in [items[0], items[1], items[3]] { #expect(deletes[item.id]?.values.isEmpty == true) }
    }

    @Test("after-token reads match a brute-force filter for every combination of token, dates, author, entity, sort and limit")
    func historyBruteForce() throws {
        let environment = ReplicaEnvironment.seeded(seed: 5, directory: FileManager.default.temporaryDirectory
            .appendingPathComponent("replica-history-\(UUID().uuidString)"))
        let clock = environment.clock as! ManualClock
        let container = try ModelContainer(for: Schema([Trip.self, Item.self]), configurations: [
            ModelConfiguration("main", isStoredInMemoryOnly: true)], environment: environment)
        let context = ModelContext(container)
        var rng = SeededGenerator(seed: 9)
        var trips: [Trip] = []
        for i in 0..<80 {
            // The clock jumps back now and then: timestamps are not in token order.
            clock.advance(by: Int64(rng.next() % 50) - (i % 7 == 0 ? 120 : 0))
            context.author = ["a", "b", nil][Int(rng.next() % 3)]
            switch rng.next() % 3 {
            case 0: trips.append(context.insert(Trip(name: "t\(i)")))
            case 1 where !trips.isEmpty: context.insert(Item(title: "i\(i)", trip: Reference(trips[Int(rng.next() % UInt64(trips.count))].id)))
            default:
                if !trips.isEmpty {
                    var trip = trips[Int(rng.next() % UInt64(trips.count))]
                    trip.rating = i
                    context.update(trip)
                } else {
                    trips.append(context.insert(Trip(name: "t\(i)")))
                }
            }
            try context.save()
        }
        let all = try context.fetchHistory()
        #expect(all.count == 80)
        let times = all.map(\.timestamp).sorted()
        let dates: [Date?] = [nil, times[10], times[40], times[40].addingTimeInterval(0.0005), times[79]]
        var checked = 0
        for tokenIndex in [nil, 0, 20, 50, 79] as [Int?] {
            for from in dates { for to in dates { for authors in [nil, ["a"], ["b", "c"]] as [[String]?] {
                for entities in [nil, ["Item"], ["Trip"]] as [[String]?] {
                    for sort in [HistoryDescriptor.SortKey.token, .timestamp] { for reverse in [false, true] {
                        for limit in [nil, 0, 3] as [Int?] {
                            let token = tokenIndex.map { all[$0].token }
                            let descriptor = HistoryDescriptor(after: token, authors: authors, from: from, to: to, entityNames: entities,
                                                               sortBy: sort, reverse: reverse, fetchLimit: limit)
                            var expected = all.filter { t in
                                (tokenIndex.map { t.token > all[$0].token } ?? true)
                                    && (authors.map { t.author.map($0.contains) ?? false } ?? true)
                                    && (from.map { t.timestamp >= $0 } ?? true) && (to.map { t.timestamp < $0 } ?? true)
                                    && (entities.map { names in t.changes.contains { names.contains($0.changedPersistentIdentifier.entityName) } } ?? true)
                            }
                            if sort == .timestamp {
                                expected.sort { ($0.timestamp, $0.token.value) < ($1.timestamp, $1.token.value) }
                            }
                            if reverse { expected.reverse() }
                            if let limit { expected = Array(expected.prefix(limit)) }
                            let actual = try context.fetchHistory(descriptor)
                            #expect(actual.map(\.token) == expected.map(\.token), "\(descriptor)")
                            if let entities {
                                #expect(actual.allSatisfy { $0.changes.allSatisfy { entities.contains($0.changedPersistentIdentifier.entityName) } })
                            }
                            checked += 1
                        }
                    } }
                }
            } } }
        }
        #expect(checked > 1000)
    }
}

@Suite("History tracking switch")
struct HistoryTrackingSwitchTests {
    @Test("a local store with tracksHistory off saves without history; the other stores keep theirs")
    func untrackedStoreWritesNoHistory() throws {
        var trips = ModelConfiguration("trips", schema: Schema([HTrip.self, HItem.self]))
        trips.tracksHistory = false
        let container = try ModelContainer(
            for: Schema([HTrip.self, HItem.self, HDraft.self]),
            configurations: [trips, ModelConfiguration("drafts", schema: Schema([HDraft.self]))],
            environment: .seeded(seed: 1, directory: makeDirectory()))
        let context = ModelContext(container)
        let trip = context.insert(HTrip(name: "Iceland"))
        context.insert(HDraft(text: "socks"))
        try context.save()
        context.delete(trip)
        try context.save()

        let transactions = try context.fetchHistory()
        #expect(transactions.map(\.storeName) == ["drafts"])
        #expect(try context.currentHistoryToken(of: "trips").value == 0)
        #expect(try ModelContext(container).fetch(HTrip.self).isEmpty)
    }

    @Test("synced and app-group stores refuse to run without history")
    func syncedAndAppGroupStoresNeedHistory() throws {
        var synced = ModelConfiguration("trips", cloudKitDatabase: .private("iCloud.test"))
        synced.tracksHistory = false
        #expect(throws: ReplicaError.self) {
            try ModelContainer(for: HDraft.self, configurations: synced, environment: .seeded(seed: 1, directory: makeDirectory()))
        }
        var shared = ModelConfiguration("trips", groupContainer: .identifier("group.test"))
        shared.tracksHistory = false
        do {
            _ = try ModelContainer(for: HDraft.self, configurations: shared, environment: .seeded(seed: 1, directory: makeDirectory()))
            Issue.record("an app-group store without history was opened")
        } catch let ReplicaError.loadIssueModelContainer(configuration, reason) {
            #expect(configuration == "trips")
            #expect(reason.contains("history"))
        }
    }
}

@Suite("History observation")
struct HistoryObservationTests {
    @Test("the observer announces transactions of other processes, not its own, in token order")
    func observesOtherProcesses() async throws {
        let directory = makeDirectory()
        let (app, _) = try makeContainer(directory, seed: 10)
        let (widget, _) = try makeContainer(directory, seed: 11,
                                            process: ProcessIdentity(bundleIdentifier: "com.example.widget", processName: "widget", processID: 2))
        #expect(app.storeIdentity(of: "trips") == widget.storeIdentity(of: "trips"))
        let start = try ModelContext(app).currentHistoryToken(of: "trips")
        var iterator = app.historyTransactions(ofStore: "trips", after: start).makeAsyncIterator()

        let appContext = ModelContext(app)
        appContext.insert(HTrip(name: "mine"))
        try appContext.save()
        let widgetContext = ModelContext(widget)
        widgetContext.author = "widget"
        let theirs = widgetContext.insert(HTrip(name: "theirs"))
        try widgetContext.save()

        let announced = try #require(try await iterator.next())
        #expect(announced.author == "widget")
        #expect(announced.bundleIdentifier == "com.example.widget")
        #expect(announced.changes == [.insert(theirs.persistentModelID)])
    }
}

@Suite("History tokens")
struct HistoryTokenTests {
    /// A token from the future of a store — saved by the app before the store file was restored from an older backup —
    /// must not push the expiry watermark past the history that exists.
    @Test("pruning through a token newer than the store's history never expires the transactions that follow")
    func pruneThroughAFutureToken() throws {
        let directory = TestDirectory()
        let container = try ModelContainer(for: Ledger.self, environment: directory.environment())
        let context = ModelContext(container)
        context.insert(Ledger(memo: "one"))
        try context.save()
        let current = try context.currentHistoryToken(of: "default")
        let fromTheFuture = HistoryToken(storeIdentity: current.storeIdentity, value: current.value + 1_000)
        #expect(try context.deleteHistory(through: fromTheFuture) == 1)

        let before = try context.currentHistoryToken(of: "default")
        context.insert(Ledger(memo: "two"))
        try context.save()
        let after = try context.fetchHistory(HistoryDescriptor(after: before))
        #expect(after.count == 1)
        #expect(after.first?.changes.count == 1)
    }
}
