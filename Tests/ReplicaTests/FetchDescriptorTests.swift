// FetchDescriptor: predicate, sort, limit, offset and includePendingChanges (evaluated in memory for now).
import Foundation
import Testing
@testable import Replica

@Suite("Fetch descriptors")
struct FetchDescriptorTests {
    let directory = TestDirectory()
    let container: ModelContainer
    /// Saved trips, in creation order: (name, destination, rating).
    let trips: [Trip]

    init() throws {
        container = try ModelContainer(for: Trip.self, Item.self, environment: directory.environment())
        let context = ModelContext(container)
        let rows: [(String, String?, Int)] = [
            ("Iceland", "Reykjavík", 5), ("Japan", "Tokyo", 4), ("Chile", nil, 4), ("Norway", "Oslo", 2), ("Peru", "Lima", 3),
        ]
        trips = rows.map { context.insert(Trip(name: $0.0, destination: $0.1, rating: $0.2)) }
        try context.save()
    }

    private func names(_ descriptor: FetchDescriptor<Trip>, in context: ModelContext? = nil) throws -> [String] {
        try (context ?? ModelContext(container)).fetch(descriptor).map(\.name)
    }

    @Test func withoutOptionsEverythingInCreationOrder() throws {
        #expect(try names(FetchDescriptor<Trip>()) == ["Iceland", "Japan", "Chile", "Norway", "Peru"])
    }

    @Test func predicateFilters() throws {
        #expect(try names(FetchDescriptor(predicate: #Predicate<Trip> { $0.rating >= 4 })) == ["Iceland", "Japan", "Chile"])
        #expect(try names(FetchDescriptor(predicate: #Predicate<Trip> { $0.destination == nil })) == ["Chile"])
        #expect(try names(FetchDescriptor(predicate: #Predicate<Trip> { $0.name == "Peru" && $0.rating == 3 })) == ["Peru"])
        #expect(try names(FetchDescriptor(predicate: #Predicate<Trip> { $0.rating > 5 })).isEmpty)
    }

    @Test func sortOrdersAndTiesKeepCreationOrder() throws {
        #expect(try names(FetchDescriptor(sortBy: [SortDescriptor(\Trip.name)])) == ["Chile", "Iceland", "Japan", "Norway", "Peru"])
        #expect(try names(FetchDescriptor(sortBy: [SortDescriptor(\Trip.name, order: .reverse)]))
                == ["Peru", "Norway", "Japan", "Iceland", "Chile"])
        // Japan and Chile tie on rating: creation order decides.
        #expect(try names(FetchDescriptor(sortBy: [SortDescriptor(\Trip.rating, order: .reverse)]))
                == ["Iceland", "Japan", "Chile", "Peru", "Norway"])
        // A second key breaks the tie.
        #expect(try names(FetchDescriptor(sortBy: [SortDescriptor(\Trip.rating, order: .reverse), SortDescriptor(\Trip.name)]))
                == ["Iceland", "Chile", "Japan", "Peru", "Norway"])
    }

    @Test func limitAndOffsetPageTheSortedResult() throws {
        var descriptor = FetchDescriptor<Trip>(sortBy: [SortDescriptor(\Trip.name)])
        descriptor.fetchLimit = 2
        #expect(try names(descriptor) == ["Chile", "Iceland"])
        descriptor.fetchOffset = 2
        #expect(try names(descriptor) == ["Japan", "Norway"])
        descriptor.fetchOffset = 4
        #expect(try names(descriptor) == ["Peru"])
        descriptor.fetchOffset = 10
        #expect(try names(descriptor).isEmpty)
        descriptor.fetchLimit = 0
        descriptor.fetchOffset = 0
        #expect(try names(descriptor).isEmpty)
        descriptor.fetchLimit = nil
        descriptor.fetchOffset = 3
        #expect(try names(descriptor) == ["Norway", "Peru"])

        // Paging applies after the predicate.
        var filtered = FetchDescriptor<Trip>(predicate: #Predicate { $0.rating >= 3 }, sortBy: [SortDescriptor(\Trip.rating)])
        filtered.fetchOffset = 1
        filtered.fetchLimit = 2
        #expect(try names(filtered) == ["Japan", "Chile"])
    }

    @Test func pendingChangesAreIncludedByDefault() throws {
        let context = ModelContext(container)
        let added = context.insert(Trip(name: "Bhutan", rating: 5))
        var japan = trips[1]
        japan.rating = 1
        context.update(japan)
        context.delete(trips[0])

        let all = FetchDescriptor<Trip>()
        #expect(all.includePendingChanges)
        #expect(try names(all, in: context) == ["Japan", "Chile", "Norway", "Peru", "Bhutan"])
        #expect(try names(FetchDescriptor(predicate: #Predicate<Trip> { $0.rating >= 4 }), in: context) == ["Chile", "Bhutan"])
        #expect(try context.fetch(all).first { $0.id == added.id } == added)

        var storedOnly = FetchDescriptor<Trip>(predicate: #Predicate { $0.rating >= 4 })
        storedOnly.includePendingChanges = false
        #expect(try names(storedOnly, in: context) == ["Iceland", "Japan", "Chile"])
        // Other contexts never see another context's pending changes.
        #expect(try names(all) == ["Iceland", "Japan", "Chile", "Norway", "Peru"])

        try context.save()
        #expect(try names(storedOnly, in: context) == ["Chile", "Bhutan"])
    }

    @Test func pendingReplaceAndInsertThenDeleteAreReflected() throws {
        let context = ModelContext(container)
        let gone = context.insert(Trip(name: "Ephemeral"))
        context.delete(gone)
        context.delete(trips[2])
        var chile = trips[2]
        chile.name = "Chile again"
        context.insert(chile)
        #expect(try names(FetchDescriptor<Trip>(), in: context) == ["Iceland", "Japan", "Chile again", "Norway", "Peru"])
    }
}

@Suite("Fetch bounds")
struct FetchBoundsTests {
    static func fetchWithHugeLimit() throws {
        let environment = ReplicaEnvironment.seeded(seed: 1, directory: URL(fileURLWithPath: "/nonexistent-replica-tests"))
        let container = try ModelContainer(for: Ledger.self, configurations: ModelConfiguration("l", isStoredInMemoryOnly: true),
                                           environment: environment)
        let context = ModelContext(container)
        for memo in ["a", "b", "c"] { context.insert(Ledger(memo: memo)) }
        try context.save()
        var descriptor = FetchDescriptor<Ledger>()
        descriptor.fetchLimit = Int.max
        descriptor.fetchOffset = 1
        guard try context.fetch(descriptor).map(\.memo) == ["b", "c"] else { exit(3) }
    }

    @Test("a fetch limit of Int.max (\"no limit\") with an offset never traps")
    func hugeLimitWithOffset() async throws {
        await #expect(processExitsWith: .success) { try FetchBoundsTests.fetchWithHugeLimit() }
    }
}
