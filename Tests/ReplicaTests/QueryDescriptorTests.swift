import CSQLite
import Foundation
import Testing
@testable import Replica

/// Records the SQL statements a connection runs (`sqlite3_trace_v2`), to count queries.
final class StatementLog {
    private(set) var statements: [String] = []
    private let db: OpaquePointer

    init(_ context: ModelContext, store: Int = 0) throws {
        db = try context.connection(for: store).handle
        sqlite3_trace_v2(db, UInt32(SQLITE_TRACE_STMT), { _, log, statement, _ in
            guard let log, let statement else { return 0 }
            let text = sqlite3_sql(OpaquePointer(statement)).map { String(cString: $0) } ?? ""
            Unmanaged<StatementLog>.fromOpaque(log).takeUnretainedValue().statements.append(text)
            return 0
        }, Unmanaged.passUnretained(self).toOpaque())
    }

    func stop() { sqlite3_trace_v2(db, 0, nil, nil) }

    /// Statements that read models or relationships (not temp-table bookkeeping).
    var queries: [String] { statements.filter { $0.hasPrefix("SELECT") } }

    func reset() { statements = [] }
}

/// Issue 3, part 2: sort keys, paging, propertiesToFetch, prefetching and pending changes.
@Suite("Fetch descriptors")
struct QueryDescriptorTests {
    @Test("several sort keys with order; optionals sorted as Foundation sorts them; paging")
    func sortingAndPaging() throws {
        for seed in UInt64(1)...8 {
            let context = ModelContext(try makeQueryContainer(seed: seed))
            let data = QueryDataset.random(seed: seed, tripCount: 40)
            try data.insert(into: context)
            let swift = data.resolved
            var g = SeededGenerator(seed: seed + 99)
            let sorts: [[SortDescriptor<QTrip>]] = [
                [SortDescriptor(\.name), SortDescriptor(\.rating, order: .reverse)],
                [SortDescriptor(\.startDate)],
                [SortDescriptor(\.startDate, order: .reverse), SortDescriptor(\.budget)],
                [SortDescriptor(\.destination, order: .reverse), SortDescriptor(\.nights), SortDescriptor(\.endDate, order: .reverse)],
                [SortDescriptor(\.spent, order: .reverse), SortDescriptor(\.endDate)],
                [SortDescriptor(\.id, order: .reverse)],
            ]
            for sortBy in sorts {
                var descriptor = FetchDescriptor<QTrip>(predicate: #Predicate { $0.rating >= 0 }, sortBy: sortBy)
                try expectSameAsSwift(context, swift.trips, descriptor)
                descriptor.fetchLimit = g.int(0...10)
                descriptor.fetchOffset = g.chance(0.5) ? nil : g.int(0...30)
                try expectSameAsSwift(context, swift.trips, descriptor)
                #expect(try context.fetchIdentifiers(descriptor).map(\.id) == expectedIDs(swift.trips, descriptor))
                descriptor.fetchLimit = nil
                try expectSameAsSwift(context, swift.trips, descriptor)
            }
            // Sorting through a to-one relationship, or with a string comparator, happens in memory, with the same order.
            let byTrip = FetchDescriptor<QItem>(sortBy: [SortDescriptor(\.trip?.name), SortDescriptor(\.title, order: .reverse)])
            let plan = try expectSameAsSwift(context, swift.items, byTrip, inSQL: false)
            #expect(plan.sortsInMemory && !plan.filtersInMemory)
            var lexical = FetchDescriptor<QTrip>(sortBy: [SortDescriptor(\.name, comparator: .lexical)])
            lexical.fetchLimit = 5
            #expect(try context.queryPlan(for: lexical).sortsInMemory)
            try expectSameAsSwift(context, swift.trips, lexical, inSQL: false)
        }
    }

    @Test("propertiesToFetch reads only the requested columns")
    func propertiesToFetch() throws {
        let context = ModelContext(try makeQueryContainer())
        let data = QueryDataset.random(seed: 3)
        try data.insert(into: context)
        var descriptor = FetchDescriptor<QTrip>(sortBy: [SortDescriptor(\.name)])
        descriptor.propertiesToFetch = [\.name, \.startDate, \.items]
        let plan = try context.queryPlan(for: descriptor)
        #expect(plan.sql.contains("\"name\"") && plan.sql.contains("\"startDate\""))
        #expect(!plan.sql.contains("\"destination\"") && !plan.sql.contains("\"budget\"") && !plan.sql.contains("\"lodging\""))
        let full = try context.fetch(FetchDescriptor<QTrip>(sortBy: [SortDescriptor(\.name)]))
        let partial = try context.fetch(descriptor)  // read last: its values are the base of change tracking
        #expect(partial.map(\.id) == full.map(\.id))
        #expect(partial.map(\.name) == full.map(\.name))
        #expect(partial.map(\.startDate) == full.map(\.startDate))
        #expect(partial.map(\.items) == full.map(\.items))
        #expect(partial.allSatisfy { $0.destination == nil && $0.budget == 0 && $0.lodging == nil })
        // Many-to-many members are read anyway (they are saved from the model).
        #expect(partial.map(\.tags) == full.map(\.tags))
        // Updating a partial model writes only what the app changed.
        var renamed = try #require(partial.first)
        renamed.name = "Renamed"
        context.update(renamed)
        try context.save()
        var expected = try #require(full.first)
        expected.name = "Renamed"
        let stored = try #require(try context.model(QTrip.self, id: renamed.id))
        #expect(stored.name == "Renamed" && stored.destination == expected.destination && stored.budget == expected.budget)
        #expect(stored.lodging == expected.lodging && stored.tags == expected.tags && stored.items == expected.items)
    }

    @Test("prefetching resolves relationships with one query per relationship, not one per model")
    func prefetching() throws {
        var counts: [Int] = []
        for tripCount in [5, 40] {
            let context = ModelContext(try makeQueryContainer())
            let data = QueryDataset.random(seed: 11, tripCount: tripCount)
            try data.insert(into: context)
            var descriptor = FetchDescriptor<QTrip>(sortBy: [SortDescriptor(\.name)])
            descriptor.relationshipKeyPathsForPrefetching = [\.lodging, \.items, \.tags]
            let log = try StatementLog(context)
            let trips = try context.fetch(descriptor)
            log.stop()
            counts.append(log.queries.count)
            let swift = data.resolved
            for trip in trips {
                let expected = swift.trips.first { $0.id == trip.id }!
                #expect(trip.lodging?.resolved?.city == expected.lodging?.resolved?.city)
                #expect(trip.lodging.map { $0.city } == expected.lodging.map { $0.city })
                #expect(trip.items.map(\.title) == expected.items.map(\.title))
                #expect(trip.tags.map(\.label) == expected.tags.map(\.label))
                #expect(trip.items.allSatisfy { $0.resolved?.trip?.id == trip.id })
            }
            // Without prefetching, references stay unresolved.
            #expect(try context.fetch(FetchDescriptor<QTrip>()).allSatisfy { $0.lodging?.resolved == nil && $0.items.allSatisfy { $0.resolved == nil } })
        }
        // The number of queries does not grow with the number of models.
        #expect(counts[0] == counts[1], "\(counts)")
        #expect(counts[1] <= 10, "\(counts)")
    }

    @Test("includePendingChanges: unsaved inserts, updates and deletes take part in the SQL")
    func pendingChanges() throws {
        for seed in UInt64(1)...6 {
            let context = ModelContext(try makeQueryContainer(seed: seed))
            var data = QueryDataset.random(seed: seed, tripCount: 20)
            try data.insert(into: context)
            var g = SeededGenerator(seed: seed + 7)
            // Unsaved changes of every kind, to trips, items and many-to-many links.
            var renamed = data.trips[0]
            renamed.name = "Pending"
            renamed.rating = 5
            renamed.tags = data.tags.prefix(2).map { Reference($0.id) }
            context.update(renamed)
            data.trips[0] = renamed
            let removed = data.trips[1]
            context.delete(removed)
            data.trips.remove(at: 1)
            let added = context.insert(QTrip(id: g.uuid(), name: "Pending new", rating: 4, isFavorite: true))
            data.trips.append(added)
            let item = context.insert(QItem(id: g.uuid(), title: "Pending item", priority: 9, trip: Reference(added.id)))
            data.items.append(item)
            if let tag = data.tags.last {
                var tag = tag
                tag.trips = [Reference(added.id)]
                context.update(tag)
                if let index = data.tags.firstIndex(where: { $0.id == tag.id }) { data.tags[index] = tag }
                for index in data.trips.indices {
                    data.trips[index].tags.removeAll { $0.id == tag.id }
                    if data.trips[index].id == added.id { data.trips[index].tags.append(Reference(tag.id)) }
                }
            }
            data.normalize()
            let swift = data.resolved
            let word = g.pick(queryWords)
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.name.starts(with: "Pending") }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(sortBy: [SortDescriptor(\.rating, order: .reverse), SortDescriptor(\.name)]))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.items.contains { $0.priority == 9 } }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.tags.count > 1 || $0.name == word }))
            try expectSameAsSwift(context, swift.tags, FetchDescriptor(predicate: #Predicate { $0.trips.contains { $0.name == "Pending new" } }))
            let fetchedTrips = try context.fetch(FetchDescriptor<QTrip>())
            #expect(fetchedTrips.map(\.tags) == swift.trips.sorted { idPrecedes($0.id, $1.id) }.map(\.tags))
            #expect(try context.model(QTrip.self, id: removed.id) == nil)
            #expect(try context.model(QTrip.self, id: added.id)?.items.map(\.id) == [item.id])
            // Without pending changes: the stored state.
            var stored = FetchDescriptor<QTrip>(predicate: #Predicate { $0.name.starts(with: "Pending") })
            stored.includePendingChanges = false
            #expect(try context.fetch(stored).isEmpty)
            #expect(try context.fetchCount(FetchDescriptor<QTrip>()) == swift.trips.count)
            try context.save()
            #expect(try context.fetch(stored).map(\.id).sorted(by: idPrecedes) == [renamed.id, added.id].sorted(by: idPrecedes))
        }
    }
}

@Suite("Fetch descriptors on read-only stores")
struct QueryReadOnlyTests {
    @Test("SQL functions and pending-change overlays work on a read-only store")
    func readOnly() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-query-ro-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let url = directory.appendingPathComponent("q.store")
        let writer = try ModelContainer(for: Schema(queryModelTypes), configurations: [ModelConfiguration("q", url: url)],
                                        environment: .seeded(seed: 1, directory: directory))
        let data = QueryDataset.random(seed: 2)
        try data.insert(into: ModelContext(writer))
        let reader = try ModelContainer(for: Schema(queryModelTypes), configurations: [ModelConfiguration("q", url: url, allowsSave: false)],
                                        environment: .seeded(seed: 2, directory: directory))
        let context = ModelContext(reader)
        context.insert(QTrip(name: "Café pending"))
        let swift = data.resolved
        let found = try context.fetch(FetchDescriptor<QTrip>(predicate: #Predicate { $0.name.localizedStandardContains("cafe") }))
        #expect(found.count == swift.trips.filter { ReplicaText.foldedContains($0.name, "cafe") }.count + 1)
        try expectSameAsSwift(context, swift.items, FetchDescriptor(predicate: #Predicate { $0.trip?.name?.localizedStandardContains("PARIS") == true }))
    }
}
