import Foundation
import Testing
@testable import Replica

/// Issue 3, part 5: a base entity with subentities; fetching the base returns subentity records too; type checks
/// in predicates; batch delete with or without subentities.
@Suite("Inheritance")
struct QueryInheritanceTests {
    func makeContext(seed: UInt64, count: Int = 40) throws -> (ModelContext, [any QMedia]) {
        let context = ModelContext(try makeQueryContainer(mediaModelTypes, seed: seed))
        let media = randomMedia(seed: seed, count: count)
        for value in media { context.insert(value) }
        try context.save()
        return (context, media)
    }

    /// What plain Swift selects: member filter, predicate, sort (ties by ID), paging.
    func expected(_ all: [any QMedia], _ descriptor: HierarchyFetchDescriptor<any QMedia>) throws -> [UUID] {
        var selected = try all.filter { value in
            guard descriptor.includeSubentities || value is QMediaItem else { return false }
            return try descriptor.predicate?.evaluate(value) ?? true
        }
        selected.sort { a, b in
            switch descriptor.sortBy.compare(a, b) {
            case .orderedAscending: return true
            case .orderedDescending: return false
            case .orderedSame: return idPrecedes(a.id, b.id)
            }
        }
        let start = min(descriptor.fetchOffset ?? 0, selected.count)
        let end = descriptor.fetchLimit.map { min(selected.count, start + $0) } ?? selected.count
        return selected[start..<end].map(\.id)
    }

    func check(_ context: ModelContext, _ all: [any QMedia], _ descriptor: HierarchyFetchDescriptor<any QMedia>, inSQL: Bool = true,
               sourceLocation: SourceLocation = #_sourceLocation) throws {
        let plan = try context.queryPlan(for: descriptor)
        let fetched = try context.fetch(descriptor)
        let expected = try expected(all, descriptor)
        #expect(fetched.map(\.id) == expected, "\(plan)", sourceLocation: sourceLocation)
        // Each value keeps its concrete type and stored values.
        for value in fetched {
            let original = all.first { $0.id == value.id }
            #expect(original.map { type(of: $0) == type(of: value) } == true, sourceLocation: sourceLocation)
            if let book = value as? QBook, let stored = original as? QBook {
                #expect(book.pages == stored.pages && book.author == stored.author, sourceLocation: sourceLocation)
            }
        }
        #expect(try context.fetchCount(descriptor) == expected.count, sourceLocation: sourceLocation)
        #expect(try context.fetchIdentifiers(descriptor).map(\.id) == expected, sourceLocation: sourceLocation)
        if inSQL { #expect(!plan.filtersInMemory && !plan.sortsInMemory, "\(plan)", sourceLocation: sourceLocation) }
    }

    @Test("fetching the base returns the records of every subentity, each as its own type")
    func fetchBase() throws {
        let (context, media) = try makeContext(seed: 1)
        let all = try context.fetch(HierarchyFetchDescriptor(mediaHierarchy, sortBy: [SortDescriptor(\.year)]))
        #expect(all.count == media.count)
        #expect(Set(all.map { "\(type(of: $0))" }) == ["QMediaItem", "QBook", "QMovie"])
        let plan = try context.queryPlan(for: HierarchyFetchDescriptor(mediaHierarchy))
        #expect(plan.sql.contains("UNION ALL"))
        // The base entity alone, and one subentity through its own descriptor.
        let baseOnly = try context.fetch(HierarchyFetchDescriptor(mediaHierarchy, includeSubentities: false))
        #expect(baseOnly.allSatisfy { $0 is QMediaItem } && baseOnly.count == media.filter { $0 is QMediaItem }.count)
        #expect(try context.fetch(QBook.self).count == media.filter { $0 is QBook }.count)
    }

    @Test("type checks and casts in predicates run in SQL, as plain Swift evaluates them")
    func typeChecks() throws {
        for seed in UInt64(1)...10 {
            let (context, media) = try makeContext(seed: seed)
            var g = SeededGenerator(seed: seed)
            let year = g.int(1990...2025), pages = g.int(50...900), word = g.pick(queryWords), rating = Double(g.int(0...10)) / 2
            let predicates: [Predicate<any QMedia>] = [
                #Predicate { $0 is QBook },
                #Predicate { !($0 is QMovie) && $0.year > year },
                #Predicate { (($0 as? QBook)?.pages ?? 0) > pages },
                #Predicate { ($0 as? QMovie)?.minutes == nil },
                #Predicate { $0.title.localizedStandardContains(word) || $0 is QMediaItem },
                #Predicate { ($0.rating ?? 0) >= rating },
                #Predicate { ($0 as? QBook)?.author == word || (($0 as? QMovie)?.minutes ?? 0) > 120 },
                #Predicate { $0.id == $0.id && $0.title != word },
            ]
            let sorts: [[SortDescriptor<any QMedia>]] = [
                [], [SortDescriptor(\.title)], [SortDescriptor(\.year, order: .reverse), SortDescriptor(\.rating)],
                [SortDescriptor(\.rating, order: .reverse)],
            ]
            for predicate in predicates {
                var descriptor = HierarchyFetchDescriptor(mediaHierarchy, predicate: predicate, sortBy: g.pick(sorts))
                try check(context, media, descriptor)
                descriptor.fetchLimit = g.int(0...8)
                descriptor.fetchOffset = g.int(0...5)
                try check(context, media, descriptor)
                descriptor.includeSubentities = false
                try check(context, media, descriptor)
            }
            // An in-memory part within a hierarchy fetch gives the same results.
            var regex = HierarchyFetchDescriptor(mediaHierarchy, predicate: #Predicate { $0.title.contains(/[ae]/) && $0.year > year },
                                                 sortBy: [SortDescriptor(\.title)])
            regex.fetchLimit = 5
            try check(context, media, regex, inSQL: false)
            #expect(try context.queryPlan(for: regex).filtersInMemory)
        }
    }

    @Test("batch delete with or without subentities")
    func batchDelete() throws {
        for includeSubentities in [true, false] {
            let (context, media) = try makeContext(seed: 4)
            let year = 2008
            let count = try context.delete(mediaHierarchy, where: #Predicate { $0.year < year }, includeSubentities: includeSubentities)
            let doomed = media.filter { $0.year < year && (includeSubentities || $0 is QMediaItem) }
            #expect(count == doomed.count)
            try context.save()
            let left = try context.fetch(HierarchyFetchDescriptor(mediaHierarchy))
            #expect(Set(left.map(\.id)) == Set(media.map(\.id)).subtracting(doomed.map(\.id)))
            #expect(try context.fetchCount(HierarchyFetchDescriptor(mediaHierarchy, predicate: #Predicate { $0.year < year })) ==
                    (includeSubentities ? 0 : media.filter { $0.year < year && !($0 is QMediaItem) }.count))
        }
    }

    @Test("an inconsistent hierarchy is a typed error")
    func invalidHierarchy() throws {
        let context = ModelContext(try makeQueryContainer(mediaModelTypes))
        let missing = EntityHierarchy<any QMedia>(base: QMediaItem.self, subentities: [QBook.self, QMovie.self],
                                                  inherited: [.attribute("pages", \.year)])
        #expect(throws: FetchError.self) { try context.fetch(HierarchyFetchDescriptor(missing)) }
        let notInContainer = EntityHierarchy<any QMedia>(base: QMediaItem.self, subentities: [QBook.self], inherited: [])
        let other = ModelContext(try makeQueryContainer([QMediaItem.self]))
        #expect(throws: FetchError.self) { try other.fetch(HierarchyFetchDescriptor(notInContainer)) }
        _ = context
    }
}
