import Foundation
import Testing
@testable import Replica

/// Issue 3, part 3: fetchCount, fetchIdentifiers, enumerate(batchSize:) and batch delete.
@Suite("Batch operations")
struct QueryBatchTests {
    @Test("fetchCount and fetchIdentifiers run in SQL without reading models")
    func countAndIdentifiers() throws {
        for seed in UInt64(1)...5 {
            let context = ModelContext(try makeQueryContainer(seed: seed))
            let data = QueryDataset.random(seed: seed, tripCount: 40)
            try data.insert(into: context)
            let swift = data.resolved
            var g = SeededGenerator(seed: seed)
            let n = g.int(0...4), word = g.pick(queryWords)
            var descriptor = FetchDescriptor<QTrip>(predicate: #Predicate { $0.rating > n || $0.items.contains { $0.title == word } },
                                                    sortBy: [SortDescriptor(\.endDate, order: .reverse)])
            descriptor.fetchOffset = g.int(0...5)
            descriptor.fetchLimit = g.chance(0.5) ? nil : g.int(0...20)
            let expected = try expectedIDs(swift.trips, descriptor)
            let log = try StatementLog(context)
            #expect(try context.fetchCount(descriptor) == expected.count)
            #expect(try context.fetchIdentifiers(descriptor) == expected.map { PersistentIdentifier(entityName: "QTrip", id: $0) })
            log.stop()
            #expect(log.queries.count == 2, "\(log.queries)")
            #expect(log.queries[0].hasPrefix("SELECT count(*)"))
            #expect(log.queries[1].hasPrefix("SELECT t0.\"id\" FROM"))
        }
    }

    @Test("enumerate visits what fetch returns, in order, streaming batch by batch")
    func enumerate() throws {
        let context = ModelContext(try makeQueryContainer())
        let data = QueryDataset.random(seed: 21, tripCount: 60)
        try data.insert(into: context)
        let swift = data.resolved
        let descriptors: [FetchDescriptor<QTrip>] = [
            FetchDescriptor(),
            FetchDescriptor(predicate: #Predicate { $0.isFavorite || $0.tags.count > 1 }, sortBy: [SortDescriptor(\.name), SortDescriptor(\.rating)]),
            { var d = FetchDescriptor<QTrip>(sortBy: [SortDescriptor(\.budget, order: .reverse)]); d.fetchOffset = 7; d.fetchLimit = 30; return d }(),
            // With an in-memory part and paging.
            { var d = FetchDescriptor<QTrip>(predicate: #Predicate { $0.name.contains(/[ao]/) }); d.fetchOffset = 3; d.fetchLimit = 9; return d }(),
        ]
        for descriptor in descriptors {
            let expected = try expectedIDs(swift.trips, descriptor)
            for batchSize in [1, 7, 5000] {
                var visited: [QTrip] = []
                try context.enumerate(descriptor, batchSize: batchSize) { visited.append($0) }
                #expect(visited.map(\.id) == expected)
                #expect(visited.map(\.items) == (try context.fetch(descriptor)).map(\.items))
            }
        }

        // Streaming: one main statement; the block runs between batches, before later batches are read.
        let log = try StatementLog(context)
        var calls = 0
        var queriesSeenAtCall: [Int] = []
        try context.enumerate(FetchDescriptor<QTrip>(), batchSize: 10) { _ in
            calls += 1
            queriesSeenAtCall.append(log.queries.count)
        }
        log.stop()
        let main = log.queries.filter { $0.hasPrefix("SELECT t0.\"id\", t0.\"name\"") }
        #expect(main.count == 1)
        #expect(calls == 60)
        // Each batch of 10 loads its to-many members (items, tags): 2 queries per batch, 6 batches.
        #expect(log.queries.count == 1 + 2 * 6, "\(log.queries)")
        #expect(queriesSeenAtCall.first == 3)
        #expect(queriesSeenAtCall.last == 13)

        // The block may fetch and register changes; errors stop the enumeration.
        var seen = 0
        struct Stop: Error {}
        #expect(throws: Stop.self) {
            try context.enumerate(FetchDescriptor<QTrip>(), batchSize: 4) { trip in
                seen += 1
                var copy = trip
                copy.rating = 99
                context.update(copy)
                _ = try context.fetch(FetchDescriptor<QTrip>(predicate: #Predicate { $0.rating == 99 }))
                if seen == 9 { throw Stop() }
            }
        }
        #expect(seen == 9)
        #expect(try context.fetchCount(FetchDescriptor<QTrip>(predicate: #Predicate { $0.rating == 99 })) == 9)
        #expect(throws: FetchError.self) { try context.enumerate(FetchDescriptor<QTrip>(), batchSize: 0) { _ in } }
    }

    @Test("enumerate over a larger table, batch by batch")
    func enumerateLarge() throws {
        let context = ModelContext(try makeQueryContainer([QItem.self, QTrip.self, QTag.self, QLodging.self]))
        var g = SeededGenerator(seed: 5)
        for index in 0..<20_000 { context.insert(QItem(id: g.uuid(), title: "item \(index)", priority: index % 10)) }
        try context.save()
        var count = 0
        var prioritySum = 0
        try context.enumerate(FetchDescriptor<QItem>(predicate: #Predicate { $0.priority >= 5 }), batchSize: 1000) { item in
            count += 1
            prioritySum += item.priority
        }
        #expect(count == 10_000)
        #expect(prioritySum == 10_000 * 7)
    }

    @Test("fetched and enumerated models are the bases of field-level change tracking")
    func changeTrackingBases() throws {
        let container = try makeQueryContainer()
        let setup = ModelContext(container)
        let trip = setup.insert(QTrip(name: "a", destination: "d", rating: 1))
        try setup.save()
        let mine = ModelContext(container), other = ModelContext(container)
        func otherWriter(_ change: (inout QTrip) -> Void) throws {
            var theirs = try #require(try other.model(QTrip.self, id: trip.id))
            change(&theirs)
            other.update(theirs)
            try other.save()
        }

        // A copy from a SQL fetch: only the field the app changed is written.
        var fetched = try #require(try mine.fetch(FetchDescriptor<QTrip>(predicate: #Predicate { $0.rating == 1 })).first)
        try otherWriter { $0.destination = "by other" }
        fetched.name = "by me"
        mine.update(fetched)
        try mine.save()
        var stored = try #require(try ModelContext(container).model(QTrip.self, id: trip.id))
        #expect(stored.name == "by me" && stored.destination == "by other")

        // A copy from enumerate, updated inside the block.
        try mine.enumerate(FetchDescriptor<QTrip>(), batchSize: 1) { copy in
            var copy = copy
            copy.rating = 5
            mine.update(copy)
        }
        try otherWriter { $0.name = "renamed by other" }
        try mine.save()
        stored = try #require(try ModelContext(container).model(QTrip.self, id: trip.id))
        #expect(stored.rating == 5 && stored.name == "renamed by other" && stored.destination == "by other")
    }

    @Test("delete(model:where:) applies delete rules at save, in one transaction")
    func batchDelete() throws {
        for seed in UInt64(1)...5 {
            let context = ModelContext(try makeQueryContainer(seed: seed))
            var data = QueryDataset.random(seed: seed, tripCount: 30)
            try data.insert(into: context)
            var g = SeededGenerator(seed: seed)
            let n = g.int(-1...2)
            // A pending insert that matches is dropped too.
            let pending = context.insert(QTrip(id: g.uuid(), name: "pending", rating: -5))
            let deleted = try context.delete(model: QTrip.self, where: #Predicate { $0.rating < n })
            let doomed = Set(data.trips.filter { $0.rating < n }.map(\.id))
            #expect(deleted == doomed.count + 1)
            #expect(try context.model(QTrip.self, id: pending.id) == nil)
            try context.save()
            // Expected: the trips gone, their items gone (cascade), their tag links gone (nullify).
            data.trips.removeAll { doomed.contains($0.id) }
            data.items.removeAll { $0.trip.map { doomed.contains($0.id) } ?? false }
            data.normalize()
            #expect(try context.fetch(QTrip.self).map(\.id) == data.trips.map(\.id).sorted(by: idPrecedes))
            #expect(try context.fetch(QItem.self).map(\.id) == data.items.map(\.id).sorted(by: idPrecedes))
            #expect(try context.fetch(QTag.self).map(\.trips) == data.tags.sorted { idPrecedes($0.id, $1.id) }.map(\.trips))
            #expect(try context.fetch(QLodging.self).map(\.trips) == data.lodgings.sorted { idPrecedes($0.id, $1.id) }.map(\.trips))

            // Deny: lodgings with trips cannot go, and the failed save writes nothing...
            let before = try context.fetchCount(FetchDescriptor<QLodging>())
            try context.delete(model: QLodging.self)
            #expect(throws: ReplicaError.self) { try context.save() }
            #expect(try context.fetchCount(FetchDescriptor<QLodging>(predicate: nil)) == 0)  // pending deletes are visible...
            var stored = FetchDescriptor<QLodging>()
            stored.includePendingChanges = false
            #expect(try context.fetchCount(stored) == before)  // ...but nothing was written.
            // ...unless the trips that hold them go in the same save.
            try context.delete(model: QTrip.self, where: #Predicate { $0.lodging != nil })
            try context.save()
            #expect(try context.fetchCount(stored) == 0)
            #expect(try context.fetch(QTrip.self).allSatisfy { $0.lodging == nil })
            #expect(try context.fetchCount(FetchDescriptor<QItem>(predicate: #Predicate { $0.trip != nil })) ==
                    data.items.filter { item in data.trips.contains { $0.id == item.trip?.id && $0.lodging == nil } }.count)
        }
    }
}
