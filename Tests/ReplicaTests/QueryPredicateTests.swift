import Foundation
import Testing
@testable import Replica

/// Issue 3, part 1: every predicate pattern runs in SQL and selects exactly what plain Swift selects
/// (`Predicate.evaluate` over the same data), over random data from several seeds.
@Suite("Predicates in SQL")
struct QueryPredicateTests {
    static let seeds: [UInt64] = Array(1...10)

    /// Runs `body` once per seed with a fresh store holding a random dataset, the same data resolved for Swift,
    /// and a generator for the predicates' constants.
    func forEachDataset(_ body: (ModelContext, QueryDataset.Resolved, inout SeededGenerator) throws -> Void) throws {
        for seed in Self.seeds {
            let context = ModelContext(try makeQueryContainer(seed: seed))
            let data = QueryDataset.random(seed: seed)
            try data.insert(into: context)
            var g = SeededGenerator(seed: seed &* 1_000_003)
            try body(context, data.resolved, &g)
        }
    }

    @Test("==, !=, <, <=, >, >=")
    func comparisons() throws {
        try forEachDataset { context, swift, g in
            let word = g.pick(queryWords), n = g.int(-2...5), amount = Double(g.int(0...40)) * 25, day = queryDate(g.int(0...90))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.name == word }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.destination != word }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.rating < n }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.budget <= amount }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.endDate > day }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.spent >= amount }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.name < word }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.isFavorite == true }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.isFavorite }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.budget == $0.spent }))
        }
    }

    @Test("&&, ||, !")
    func logic() throws {
        try forEachDataset { context, swift, g in
            let n = g.int(-2...5), amount = Double(g.int(0...40)) * 25, word = g.pick(queryWords)
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate {
                ($0.rating > n && $0.isFavorite) || !($0.budget < amount)
            }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate {
                !($0.name == word || $0.destination == word) && !$0.isFavorite
            }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { !(!$0.isFavorite) }))
        }
    }

    @Test("nil checks and ??")
    func nilChecksAndCoalescing() throws {
        try forEachDataset { context, swift, g in
            let n = g.int(-1...10), word = g.pick(queryWords)
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.destination == nil }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.startDate != nil }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.lodging == nil }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { ($0.nights ?? -1) >= n }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { ($0.destination ?? "none") == word }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { !($0.nights == nil) }))
        }
    }

    @Test("optional chaining through to-one relationships")
    func optionalChaining() throws {
        try forEachDataset { context, swift, g in
            let word = g.pick(queryWords), n = g.int(0...5)
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.lodging?.city == word }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { ($0.lodging?.stars ?? 0) >= n }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.lodging?.stars == nil }))
            try expectSameAsSwift(context, swift.items, FetchDescriptor(predicate: #Predicate { $0.trip?.name == word }))
            try expectSameAsSwift(context, swift.items, FetchDescriptor(predicate: #Predicate { ($0.trip?.rating ?? -9) > n }))
            try expectSameAsSwift(context, swift.items, FetchDescriptor(predicate: #Predicate { $0.trip?.isFavorite == true }))
            // Two hops.
            try expectSameAsSwift(context, swift.items, FetchDescriptor(predicate: #Predicate { $0.trip?.lodging?.city == word }))
            try expectSameAsSwift(context, swift.items, FetchDescriptor(predicate: #Predicate { $0.trip?.lodging?.stars != nil }))
            try expectSameAsSwift(context, swift.items, FetchDescriptor(predicate: #Predicate { $0.trip?.destination?.isEmpty == false }))
        }
    }

    @Test("string contains, starts(with:), case-insensitive contains, count")
    func strings() throws {
        try forEachDataset { context, swift, g in
            let word = g.pick(queryWords), prefix = String(g.pick(queryWords).prefix(g.int(0...3))), n = g.int(0...12)
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.name.contains(word) }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.name.starts(with: prefix) }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.name.localizedStandardContains(word) }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.name.localizedStandardContains(prefix) }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { ($0.destination ?? "").contains(prefix) }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.name.count > n }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.name.isEmpty }))
            // Both sides from the record.
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.name.contains($0.destination ?? "") }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.name.starts(with: $0.destination ?? "") }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate {
                $0.name.localizedStandardContains($0.destination ?? "")
            }))
        }
    }

    @Test("membership in a captured array")
    func membership() throws {
        try forEachDataset { context, swift, g in
            let names = (0..<g.int(0...4)).map { _ in g.pick(queryWords) }
            let destinations: [String?] = [nil, g.pick(queryWords), g.pick(queryWords)]
            let ratings = (0..<300).map { $0 % 3 == 0 ? $0 / 100 : -$0 }  // a long list: one JSON parameter
            let many = (0..<250).map { "\(g.pick(queryWords))\($0 == 0 ? "" : String($0))" }
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { names.contains($0.name) }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { destinations.contains($0.destination) }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { !destinations.contains($0.destination) }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { ratings.contains($0.rating) }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { many.contains($0.name) }))
            let ids = swift.trips.prefix(5).map(\.id) + [UUID()]
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { ids.contains($0.id) }))
        }
    }

    @Test("arithmetic")
    func arithmetic() throws {
        try forEachDataset { context, swift, g in
            let amount = Double(g.int(-10...20)) * 25, n = g.int(-6...12), divisor = g.pick([2, 3, -2]), m = g.int(-2...2)
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.budget - $0.spent > amount }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.rating * 2 + 1 >= n }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.rating % divisor == m }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.rating / divisor == m }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { -$0.rating < n }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.budget / 2.5 > amount }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { ($0.nights ?? 0) * $0.rating > n }))
        }
    }

    @Test("date ranges")
    func dateRanges() throws {
        try forEachDataset { context, swift, g in
            let a = queryDate(g.int(-30...30)), b = queryDate(g.int(30...90)), fallback = queryDate(0)
            let closed = a...b, open = a..<b
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.endDate >= a && $0.endDate < b }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { closed.contains($0.endDate) }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { open.contains($0.startDate ?? fallback) }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { (a...b).contains($0.endDate) }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { ($0.startDate ?? fallback) < $0.endDate }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.startDate.flatMap { $0 > a } ?? false }))
        }
    }

    @Test("conditional expressions")
    func conditionals() throws {
        try forEachDataset { context, swift, g in
            let word = g.pick(queryWords), amount = Double(g.int(0...40)) * 25, n = g.int(0...3)
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate {
                ($0.isFavorite ? $0.name : ($0.destination ?? "")).localizedStandardContains(word)
            }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { ($0.rating > n ? $0.budget : $0.spent) > amount }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.isFavorite ? $0.rating > n : $0.budget > amount }))
        }
    }

    @Test("to-many: contains(where:), allSatisfy, count, isEmpty, filter")
    func toMany() throws {
        try forEachDataset { context, swift, g in
            let n = g.int(0...9), k = g.int(0...4), word = g.pick(queryWords)
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.items.contains { ($0.priority ?? 0) > n && $0.isPacked == false } }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.items.allSatisfy { $0.isPacked == true } }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.items.allSatisfy { ($0.priority ?? 0) < n } }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.items.count >= k }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.items.isEmpty }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.items.filter { $0.isPacked == true }.count > 1 }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate {
                $0.items.contains { $0.title?.localizedStandardContains(word) == true } || $0.items.count == k
            }))
            // Nested: a to-many inside a to-many, through a to-one.
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate {
                $0.items.contains { $0.trip?.lodging?.city == word }
            }))
            // A to-many of a to-one target, and a to-many from the other side.
            try expectSameAsSwift(context, swift.lodgings, FetchDescriptor(predicate: #Predicate { $0.trips.count > k }))
            if let item = g.chance(0.5) ? swift.items.first : nil {
                let reference = Reference<QItem>(item.id)
                try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.items.contains(reference) }))
            }
        }
    }

    @Test("many-to-many: contains(where:), allSatisfy, count from both sides")
    func manyToMany() throws {
        try forEachDataset { context, swift, g in
            let n = g.int(-3...10), k = g.int(0...3), word = g.pick(queryWords)
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.tags.contains { ($0.weight ?? 0) > n } }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.tags.allSatisfy { $0.label?.contains(word) == true } }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.tags.count == k }))
            try expectSameAsSwift(context, swift.tags, FetchDescriptor(predicate: #Predicate { $0.trips.contains { ($0.rating ?? 0) > n } }))
            try expectSameAsSwift(context, swift.tags, FetchDescriptor(predicate: #Predicate { $0.trips.isEmpty }))
            if let tag = swift.tags.first {
                let reference = Reference<QTag>(tag.id)
                try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.tags.contains(reference) }))
            }
        }
    }

    @Test("force unwrap, flatMap and identifiers")
    func unwrapsAndIdentifiers() throws {
        try forEachDataset { context, swift, g in
            let n = g.int(0...14)
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.nights != nil && $0.nights! > n }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.nights.flatMap { $0 > n } ?? false }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.lodging != nil && ($0.lodging!.city?.count ?? 0) > 3 }))
            let trip = g.pick(swift.trips)
            let id = trip.id, pid = trip.persistentModelID, other = PersistentIdentifier(entityName: "QItem", id: trip.id)
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.id == id }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.persistentModelID == pid }))
            try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate { $0.persistentModelID != other }))
            try expectSameAsSwift(context, swift.items, FetchDescriptor(predicate: #Predicate { $0.trip?.id == id }))
            let reference: Reference<QTrip>? = g.chance(0.5) ? Reference(id) : nil
            try expectSameAsSwift(context, swift.items, FetchDescriptor(predicate: #Predicate { $0.trip == reference }))
        }
        // A force unwrap of nil fails the fetch, as it fails Predicate.evaluate.
        let context = ModelContext(try makeQueryContainer())
        context.insert(QTrip(name: "no nights"))
        try context.save()
        #expect(throws: PredicateError.forceUnwrapFailure) {
            try context.fetch(FetchDescriptor<QTrip>(predicate: #Predicate { $0.nights! > 1 }))
        }
    }

    @Test("what SQL cannot express is evaluated in memory, with the same results")
    func inMemoryFallback() throws {
        try forEachDataset { context, swift, g in
            let n = g.int(0...5), word = g.pick(queryWords)
            // An SQL part plus an in-memory part (division by a column: SQL gives NULL where Swift gives infinity).
            var plan = try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate {
                $0.rating > n && $0.budget / $0.spent > 1.5
            }), inSQL: false)
            #expect(plan.filtersInMemory)
            #expect(plan.sql.contains("WHERE"))
            // Regular expressions, through to-one and to-many relationships (resolved for the in-memory part).
            plan = try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate {
                $0.items.contains { $0.title?.contains(/a./) == true }
            }), inSQL: false)
            #expect(plan.filtersInMemory)
            plan = try expectSameAsSwift(context, swift.trips, FetchDescriptor(predicate: #Predicate {
                $0.lodging?.city?.contains(/[io]/) == true && $0.rating > 0
            }), inSQL: false)
            #expect(plan.filtersInMemory)
            try expectSameAsSwift(context, swift.items, FetchDescriptor(predicate: #Predicate {
                $0.trip?.lodging?.city?.contains(/a/) == true || $0.title == word
            }), inSQL: false)
            // With paging: limit and offset apply after the in-memory filter.
            var descriptor = FetchDescriptor<QTrip>(predicate: #Predicate { $0.name.contains(/[aeiou]{1}/) },
                                                    sortBy: [SortDescriptor(\.rating, order: .reverse)])
            descriptor.fetchLimit = 4
            descriptor.fetchOffset = 2
            try expectSameAsSwift(context, swift.trips, descriptor, inSQL: false)
            #expect(try context.fetchIdentifiers(descriptor).map(\.id) == expectedIDs(swift.trips, descriptor))
            // The caller can forbid it.
            descriptor.allowsInMemoryEvaluation = false
            #expect(throws: FetchError.self) { try context.fetch(descriptor) }
        }
    }

    @Test("relationships an in-memory evaluation cannot resolve are typed errors, not traps")
    func unresolvableRelationships() throws {
        let context = ModelContext(try makeQueryContainer())
        let data = QueryDataset.random(seed: 5)
        try data.insert(into: context)
        // A relationship chosen by a ternary has no SQL form and cannot be prefetched for Swift.
        #expect(throws: FetchError.self) {
            try context.fetch(FetchDescriptor<QTrip>(predicate: #Predicate { (($0.isFavorite ? $0.lodging : nil)?.trips?.count ?? 0) > 1 }))
        }
        // A captured reference that is not resolved.
        let unresolved = Reference<QTrip>(data.trips[0].id)
        #expect(throws: FetchError.unresolvableReference(unresolved.persistentModelID, relationship: (\Reference<QTrip>.name as AnyKeyPath).readableDescription)) {
            try context.fetch(FetchDescriptor<QItem>(predicate: #Predicate { $0.trip?.name == unresolved.name }))
        }
        // Resolved, it is a constant.
        let resolved = Reference(data.trips[0])
        let swift = data.resolved
        try expectSameAsSwift(context, swift.items, FetchDescriptor(predicate: #Predicate { $0.trip?.name == resolved.name }))
        // An in-memory sort through two to-one relationships resolves both.
        try expectSameAsSwift(context, swift.items, FetchDescriptor(sortBy: [SortDescriptor(\.trip?.lodging?.city), SortDescriptor(\.title)]),
                              inSQL: false)
    }

    @Test("a key path that is not an attribute is a typed error")
    func nonAttributeKeyPath() throws {
        let context = ModelContext(try makeQueryContainer())
        context.insert(QTrip(name: "x"))
        try context.save()
        // A computed property is named by its type and root, never by the address Swift prints for it.
        #expect(throws: FetchError.unsupportedKeyPath(entity: "QTrip", keyPath: "a computed String property of QTrip")) {
            try context.fetch(FetchDescriptor<QTrip>(predicate: #Predicate { $0.label == "X" }))
        }
        #expect(FetchError.unsupportedKeyPath(entity: "QTrip", keyPath: (\QTrip.label as AnyKeyPath).readableDescription).description
                == "a computed String property of QTrip is not an attribute or relationship of QTrip")
        #expect((\QTrip.name as AnyKeyPath).readableDescription == "\\QTrip.name")
        #expect(throws: FetchError.self) {
            try context.fetchCount(FetchDescriptor<QItem>(predicate: #Predicate { $0.trip?.label == "X" }))
        }
        var descriptor = FetchDescriptor<QTrip>()
        descriptor.propertiesToFetch = [\.label]
        #expect(throws: FetchError.self) { try context.fetch(descriptor) }
        descriptor = FetchDescriptor<QTrip>()
        descriptor.relationshipKeyPathsForPrefetching = [\.name]
        #expect(throws: FetchError.self) { try context.fetch(descriptor) }
    }
}
