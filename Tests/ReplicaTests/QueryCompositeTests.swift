import Foundation
import Testing
@testable import Replica

/// Issue 3, part 6: composite attributes queryable by key path (`person.homeAddress.city == "Paris"`).
@Suite("Composite attributes")
struct QueryCompositeTests {
    @Test("predicates on composite members run in SQL (json_extract), as plain Swift evaluates them")
    func compositePredicates() throws {
        for seed in UInt64(1)...10 {
            let context = ModelContext(try makeQueryContainer(seed: seed))
            let data = QueryDataset.random(seed: seed, tripCount: 40)
            try data.insert(into: context)
            let people = data.people
            var g = SeededGenerator(seed: seed &* 77)
            let word = g.pick(queryWords), n = g.int(-1...6), lat = Double(g.int(-90...90)) / 2, day = queryDate(g.int(-400...0))
            let zip = String(g.int(1000...1010)), address = g.pick(people).homeAddress
            let descriptors: [FetchDescriptor<QPerson>] = [
                FetchDescriptor(predicate: #Predicate { $0.homeAddress.city == word }),
                FetchDescriptor(predicate: #Predicate { $0.homeAddress.city.localizedStandardContains(word) }),
                FetchDescriptor(predicate: #Predicate { $0.homeAddress.geo.lat > lat }),
                FetchDescriptor(predicate: #Predicate { $0.homeAddress.since < day }),
                FetchDescriptor(predicate: #Predicate { $0.homeAddress.zip == nil || $0.homeAddress.zip == zip }),
                FetchDescriptor(predicate: #Predicate { $0.homeAddress.floor >= n }),
                FetchDescriptor(predicate: #Predicate { $0.workAddress?.city == word }),
                FetchDescriptor(predicate: #Predicate { ($0.workAddress?.floor ?? -9) > n }),
                FetchDescriptor(predicate: #Predicate { $0.workAddress == nil }),
                FetchDescriptor(predicate: #Predicate { $0.workAddress?.geo.lon != nil && $0.workAddress!.geo.lon < lat }),
                FetchDescriptor(predicate: #Predicate { $0.homeAddress == address }),
                FetchDescriptor(predicate: #Predicate { $0.homeAddress.city == ($0.workAddress?.city ?? "") }),
                FetchDescriptor(sortBy: [SortDescriptor(\.homeAddress.city), SortDescriptor(\.homeAddress.geo.lat, order: .reverse)]),
                FetchDescriptor(predicate: #Predicate { $0.homeAddress.floor > 0 }, sortBy: [SortDescriptor(\.homeAddress.since)]),
            ]
            for descriptor in descriptors { try expectSameAsSwift(context, people, descriptor) }
            // A member that is not listed as queryable is evaluated in memory, with the same results.
            let plan = try expectSameAsSwift(context, people, FetchDescriptor(predicate: #Predicate {
                $0.homeAddress.note == word && $0.homeAddress.floor >= n
            }), inSQL: false)
            #expect(plan.filtersInMemory && plan.sql.contains("json_extract"))
        }
    }

    @Test("non-finite doubles inside composites compare as in Swift")
    func nonFiniteMembers() throws {
        let context = ModelContext(try makeQueryContainer())
        var g = SeededGenerator(seed: 8)
        var people: [QPerson] = []
        for lat in [Double.infinity, -Double.infinity, .nan, 3, -3, 0] {
            var address = QueryDataset.randomAddress(&g)
            address.geo.lat = lat
            people.append(context.insert(QPerson(id: g.uuid(), name: "\(lat)", homeAddress: address)))
        }
        try context.save()
        for bound in [-5.0, 0, 5] {
            try expectSameAsSwift(context, people, FetchDescriptor(predicate: #Predicate { $0.homeAddress.geo.lat > bound }))
            try expectSameAsSwift(context, people, FetchDescriptor(predicate: #Predicate { $0.homeAddress.geo.lat <= bound }))
            try expectSameAsSwift(context, people, FetchDescriptor(predicate: #Predicate { $0.homeAddress.geo.lat != bound }))
        }
    }

    @Test("composite values round-trip")
    func roundTrip() throws {
        let context = ModelContext(try makeQueryContainer())
        var g = SeededGenerator(seed: 3)
        let person = context.insert(QPerson(name: "Ada", homeAddress: QueryDataset.randomAddress(&g), workAddress: nil))
        try context.save()
        let fetched = try #require(try context.model(QPerson.self, id: person.id))
        #expect(fetched.homeAddress == person.homeAddress && fetched.workAddress == nil)
    }
}
