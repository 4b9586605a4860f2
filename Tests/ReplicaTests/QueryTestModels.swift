import Foundation
import Testing
@testable import Replica

// Models and data shared by the query tests (issue 3). Names start with Q to stay clear of other test files.

struct QGeo: CompositeAttribute, Hashable {
    var lat: Double
    var lon: Double
    static var queryableMembers: [CompositeMember<QGeo>] { [.member("lat", \.lat), .member("lon", \.lon)] }
}

struct QAddress: CompositeAttribute, Hashable {
    var street: String
    var city: String
    var zip: String?
    var floor: Int
    var since: Date
    var geo: QGeo
    /// Not listed as queryable: predicates on it are evaluated in memory.
    var note: String = ""

    static var queryableMembers: [CompositeMember<QAddress>] {
        [.member("street", \.street), .member("city", \.city), .member("zip", \.zip), .member("floor", \.floor),
         .member("since", \.since), .member("geo", \.geo)]
    }
}

struct QTrip: PersistentModel, Codable {
    var id = UUID.unassigned
    var name: String = ""
    var destination: String?
    var startDate: Date?
    var endDate: Date = Date(timeIntervalSince1970: 0)
    var budget: Double = 0
    var spent: Double = 0
    var rating: Int = 0
    var nights: Int?
    var isFavorite: Bool = false
    var lodging: Reference<QLodging>?
    var items: [Reference<QItem>] = []
    var tags: [Reference<QTag>] = []

    /// Not an attribute.
    var label: String { name.uppercased() }

    static let entity = ModelEntity<QTrip>([
        .attribute("name", \.name, default: ""),
        .attribute("destination", \.destination),
        .attribute("startDate", \.startDate),
        .attribute("endDate", \.endDate, default: Date(timeIntervalSince1970: 0)),
        .attribute("budget", \.budget, default: 0),
        .attribute("spent", \.spent, default: 0),
        .attribute("rating", \.rating, default: 0),
        .attribute("nights", \.nights),
        .attribute("isFavorite", \.isFavorite, default: false),
        .toOne("lodging", \.lodging, inverse: "trips"),
        .toMany("items", \.items, inverse: "trip", deleteRule: .cascade),
        .toMany("tags", \.tags, inverse: "trips"),
    ])
}

struct QItem: PersistentModel, Codable {
    var id = UUID.unassigned
    var title: String = ""
    var priority: Int = 0
    var isPacked: Bool = false
    var trip: Reference<QTrip>?

    static let entity = ModelEntity<QItem>([
        .attribute("title", \.title, default: ""),
        .attribute("priority", \.priority, default: 0),
        .attribute("isPacked", \.isPacked, default: false),
        .toOne("trip", \.trip, inverse: "items"),
    ])
}

struct QTag: PersistentModel, Codable {
    var id = UUID.unassigned
    var label: String = ""
    var weight: Int = 0
    var trips: [Reference<QTrip>] = []

    static let entity = ModelEntity<QTag>([
        .attribute("label", \.label, default: ""),
        .attribute("weight", \.weight, default: 0),
        .toMany("trips", \.trips, inverse: "tags"),
    ])
}

struct QLodging: PersistentModel, Codable {
    var id = UUID.unassigned
    var city: String = ""
    var stars: Int?
    var trips: [Reference<QTrip>] = []

    static let entity = ModelEntity<QLodging>([
        .attribute("city", \.city, default: ""),
        .attribute("stars", \.stars),
        .toMany("trips", \.trips, inverse: "lodging", deleteRule: .deny),
    ])
}

struct QPerson: PersistentModel, Codable {
    var id = UUID.unassigned
    var name: String = ""
    var homeAddress: QAddress
    var workAddress: QAddress?

    static let entity = ModelEntity<QPerson>([
        .attribute("name", \.name, default: ""),
        .attribute("homeAddress", \.homeAddress),
        .attribute("workAddress", \.workAddress),
    ])
}

let queryModelTypes: [any PersistentModel.Type] = [QTrip.self, QItem.self, QTag.self, QLodging.self, QPerson.self]

/// An in-memory container over `models`, with a seeded environment.
func makeQueryContainer(_ models: [any PersistentModel.Type] = queryModelTypes, seed: UInt64 = 1,
                        directory: URL? = nil) throws -> ModelContainer {
    let directory = directory ?? FileManager.default.temporaryDirectory.appendingPathComponent("replica-query-tests")
    return try ModelContainer(for: Schema(models), configurations: [ModelConfiguration("q", isStoredInMemoryOnly: true)],
                              environment: .seeded(seed: seed, directory: directory))
}

// MARK: - Seeded random data

/// SplitMix64: a small, fast, seeded generator (the property-testing kit lands separately).
struct SeededGenerator: RandomNumberGenerator {
    private var state: UInt64
    init(seed: UInt64) { state = seed &+ 0x9E37_79B9_7F4A_7C15 }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    mutating func uuid() -> UUID {
        let a = next(), b = next()
        var bytes = [UInt8](repeating: 0, count: 16)
        for i in 0..<8 { bytes[i] = UInt8(truncatingIfNeeded: a >> (8 * i)); bytes[i + 8] = UInt8(truncatingIfNeeded: b >> (8 * i)) }
        return UUID(uuid: (bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
                           bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]))
    }

    mutating func pick<T>(_ values: [T]) -> T { values[Int.random(in: 0..<values.count, using: &self)] }
    mutating func chance(_ p: Double) -> Bool { Double.random(in: 0..<1, using: &self) < p }
    mutating func int(_ range: ClosedRange<Int>) -> Int { Int.random(in: range, using: &self) }
}

/// Words with case and diacritic variants, empty strings and non-ASCII letters (single-scalar characters).
let queryWords = ["Paris", "paris", "PARIS", "Oslo", "oslo", "Zürich", "zurich", "Café", "cafe", "Tokyo", "Lima",
                  "", "São Paulo", "sao paulo", "Ålesund", "Köln", "Rome", "rome", "Nice", "Niça", "a", "ab", "Ab"]

/// Deterministic whole-second dates (so Swift and SQL agree to the bit).
func queryDate(_ days: Int) -> Date { Date(timeIntervalSince1970: 1_767_225_600 + Double(days) * 86_400) }

func idPrecedes(_ a: UUID, _ b: UUID) -> Bool {
    withUnsafeBytes(of: a.uuid) { x in withUnsafeBytes(of: b.uuid) { y in x.lexicographicallyPrecedes(y) } }
}

/// A random graph of trips, items, tags (many-to-many) and lodgings, plus people with composite addresses.
struct QueryDataset {
    var trips: [QTrip] = []
    var items: [QItem] = []
    var tags: [QTag] = []
    var lodgings: [QLodging] = []
    var people: [QPerson] = []

    static func random(seed: UInt64, tripCount: Int = 30) -> QueryDataset {
        var g = SeededGenerator(seed: seed)
        var data = QueryDataset()
        for _ in 0..<g.int(2...6) {
            data.lodgings.append(QLodging(id: g.uuid(), city: g.pick(queryWords), stars: g.chance(0.3) ? nil : g.int(1...5)))
        }
        for _ in 0..<g.int(3...8) { data.tags.append(QTag(id: g.uuid(), label: g.pick(queryWords), weight: g.int(-3...10))) }
        for _ in 0..<tripCount {
            var trip = QTrip(id: g.uuid())
            trip.name = g.pick(queryWords) + (g.chance(0.5) ? " \(g.pick(queryWords))" : "")
            trip.destination = g.chance(0.3) ? nil : g.pick(queryWords)
            trip.startDate = g.chance(0.25) ? nil : queryDate(g.int(-30...60))
            trip.endDate = queryDate(g.int(0...90))
            trip.budget = Double(g.int(0...40)) * 25
            trip.spent = Double(g.int(0...40)) * 25 + (g.chance(0.2) ? 0.5 : 0)
            trip.rating = g.int(-2...5)
            trip.nights = g.chance(0.3) ? nil : g.int(0...14)
            trip.isFavorite = g.chance(0.4)
            if g.chance(0.7), !data.lodgings.isEmpty { trip.lodging = Reference(g.pick(data.lodgings).id) }
            data.trips.append(trip)
        }
        for _ in 0..<(tripCount * 2) {
            var item = QItem(id: g.uuid(), title: g.pick(queryWords), priority: g.int(0...9), isPacked: g.chance(0.5))
            if g.chance(0.85) { item.trip = Reference(g.pick(data.trips).id) }
            data.items.append(item)
        }
        // Many-to-many links, written from the trip side.
        for index in data.trips.indices {
            var chosen: [UUID] = []
            for tag in data.tags where g.chance(0.3) { chosen.append(tag.id) }
            data.trips[index].tags = chosen.map { Reference($0) }
        }
        for _ in 0..<(tripCount / 2) {
            let home = randomAddress(&g)
            data.people.append(QPerson(id: g.uuid(), name: g.pick(queryWords), homeAddress: home,
                                       workAddress: g.chance(0.4) ? nil : randomAddress(&g)))
        }
        data.normalize()
        return data
    }

    static func randomAddress(_ g: inout SeededGenerator) -> QAddress {
        QAddress(street: g.pick(queryWords), city: g.pick(queryWords), zip: g.chance(0.3) ? nil : String(g.int(1000...1010)),
                 floor: g.int(-1...6), since: queryDate(g.int(-400...0)),
                 geo: QGeo(lat: Double(g.int(-90...90)) / 2, lon: Double(g.int(-180...180)) / 4), note: g.pick(queryWords))
    }

    /// Makes the derived sides consistent with the stored truth: one-to-many members from the to-one references,
    /// many-to-many members of tags from the trips' lists; members sorted by ID, as fetches return them.
    mutating func normalize() {
        func sorted<T>(_ ids: [UUID]) -> [Reference<T>] { ids.sorted(by: idPrecedes).map { Reference($0) } }
        for index in trips.indices {
            let id = trips[index].id
            trips[index].items = sorted(items.filter { $0.trip?.id == id }.map(\.id))
            trips[index].tags = sorted(trips[index].tags.map(\.id))
        }
        for index in tags.indices {
            let id = tags[index].id
            tags[index].trips = sorted(trips.filter { $0.tags.contains { $0.id == id } }.map(\.id))
        }
        for index in lodgings.indices {
            let id = lodgings[index].id
            lodgings[index].trips = sorted(trips.filter { $0.lodging?.id == id }.map(\.id))
        }
    }

    func insert(into context: ModelContext) throws {
        for lodging in lodgings { context.insert(lodging) }
        for tag in tags { context.insert(tag) }
        for trip in trips { context.insert(trip) }
        for item in items { context.insert(item) }
        for person in people { context.insert(person) }
        try context.save()
    }

    /// Copies with references resolved a few levels deep, for evaluating predicates in plain Swift.
    struct Resolved {
        var trips: [QTrip]
        var items: [QItem]
        var tags: [QTag]
        var lodgings: [QLodging]
    }

    var resolved: Resolved {
        func byID<T: PersistentModel>(_ models: [T]) -> [UUID: T] { Dictionary(uniqueKeysWithValues: models.map { ($0.id, $0) }) }
        let lodgings0 = byID(lodgings)
        var tripsL = trips
        for i in tripsL.indices { if let l = tripsL[i].lodging, let target = lodgings0[l.id] { tripsL[i].lodging = Reference(target) } }
        let tripsLByID = byID(tripsL)
        var itemsR = items
        for i in itemsR.indices { if let t = itemsR[i].trip, let target = tripsLByID[t.id] { itemsR[i].trip = Reference(target) } }
        var tagsR = tags
        for i in tagsR.indices { tagsR[i].trips = tagsR[i].trips.map { tripsLByID[$0.id].map(Reference.init) ?? $0 } }
        let itemsByID = byID(itemsR), tagsByID = byID(tagsR)
        var tripsR = tripsL
        for i in tripsR.indices {
            tripsR[i].items = tripsR[i].items.map { itemsByID[$0.id].map(Reference.init) ?? $0 }
            tripsR[i].tags = tripsR[i].tags.map { tagsByID[$0.id].map(Reference.init) ?? $0 }
        }
        let tripsRByID = byID(tripsR)
        var lodgingsR = lodgings
        for i in lodgingsR.indices { lodgingsR[i].trips = lodgingsR[i].trips.map { tripsRByID[$0.id].map(Reference.init) ?? $0 } }
        return Resolved(trips: tripsR, items: itemsR, tags: tagsR, lodgings: lodgingsR)
    }
}

/// The IDs plain Swift selects: filter with the predicate, sort with the descriptors, ties by ID, then page.
func expectedIDs<T: PersistentModel>(_ models: [T], _ descriptor: FetchDescriptor<T>) throws -> [UUID] {
    var selected = try models.filter { try descriptor.predicate?.evaluate($0) ?? true }
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

/// Fetches with `descriptor` and compares with plain Swift over `oracle`; returns the plan for further checks.
@discardableResult
func expectSameAsSwift<T: PersistentModel>(_ context: ModelContext, _ oracle: [T], _ descriptor: FetchDescriptor<T>,
                                           inSQL: Bool = true, sourceLocation: SourceLocation = #_sourceLocation) throws -> QueryPlan {
    let plan = try context.queryPlan(for: descriptor)
    let fetched = try context.fetch(descriptor).map(\.id)
    let expected = try expectedIDs(oracle, descriptor)
    #expect(fetched == expected, "\(plan)", sourceLocation: sourceLocation)
    if inSQL {
        #expect(!plan.filtersInMemory && !plan.sortsInMemory, "expected pure SQL: \(plan)", sourceLocation: sourceLocation)
    }
    #expect(try context.fetchCount(descriptor) == expected.count, sourceLocation: sourceLocation)
    return plan
}

// MARK: - An entity hierarchy

/// The base protocol of the media hierarchy.
protocol QMedia: PersistentModel {
    var title: String { get set }
    var year: Int { get set }
    var rating: Double? { get set }
}

/// Records of the base entity itself.
struct QMediaItem: QMedia, Codable {
    var id = UUID.unassigned
    var title: String = ""
    var year: Int = 0
    var rating: Double?

    static let entity = ModelEntity<QMediaItem>([
        .attribute("title", \.title, default: ""),
        .attribute("year", \.year, default: 0),
        .attribute("rating", \.rating),
    ])
}

struct QBook: QMedia, Codable {
    var id = UUID.unassigned
    var title: String = ""
    var year: Int = 0
    var rating: Double?
    var pages: Int = 0
    var author: String?

    static let entity = ModelEntity<QBook>([
        .attribute("title", \.title, default: ""),
        .attribute("year", \.year, default: 0),
        .attribute("rating", \.rating),
        .attribute("pages", \.pages, default: 0),
        .attribute("author", \.author),
    ])
}

struct QMovie: QMedia, Codable {
    var id = UUID.unassigned
    var title: String = ""
    var year: Int = 0
    var rating: Double?
    var minutes: Int = 0

    static let entity = ModelEntity<QMovie>([
        .attribute("title", \.title, default: ""),
        .attribute("year", \.year, default: 0),
        .attribute("rating", \.rating),
        .attribute("minutes", \.minutes, default: 0),
    ])
}

let mediaHierarchy = EntityHierarchy<any QMedia>(
    base: QMediaItem.self, subentities: [QBook.self, QMovie.self],
    inherited: [.id(\.id), .attribute("title", \.title), .attribute("year", \.year), .attribute("rating", \.rating)])

let mediaModelTypes: [any PersistentModel.Type] = [QMediaItem.self, QBook.self, QMovie.self]

/// Random media of all three types; returns them as the base existential.
func randomMedia(seed: UInt64, count: Int = 40) -> [any QMedia] {
    var g = SeededGenerator(seed: seed)
    var result: [any QMedia] = []
    for _ in 0..<count {
        let title = g.pick(queryWords), year = g.int(1990...2025)
        let rating: Double? = g.chance(0.3) ? nil : Double(g.int(0...10)) / 2
        switch g.int(0...2) {
        case 0: result.append(QMediaItem(id: g.uuid(), title: title, year: year, rating: rating))
        case 1: result.append(QBook(id: g.uuid(), title: title, year: year, rating: rating, pages: g.int(50...900),
                                    author: g.chance(0.3) ? nil : g.pick(queryWords)))
        default: result.append(QMovie(id: g.uuid(), title: title, year: year, rating: rating, minutes: g.int(60...200)))
        }
    }
    return result
}

// MARK: - Delete rules

/// One-to-many with the nullify rule.
struct QFolder: PersistentModel, Codable {
    var id = UUID.unassigned
    var name: String = ""
    var notes: [Reference<QNote>] = []

    static let entity = ModelEntity<QFolder>([
        .attribute("name", \.name, default: ""),
        .toMany("notes", \.notes, inverse: "folder", deleteRule: .nullify),
    ])
}

struct QNote: PersistentModel, Codable {
    var id = UUID.unassigned
    var text: String = ""
    var folder: Reference<QFolder>?

    static let entity = ModelEntity<QNote>([
        .attribute("text", \.text, default: ""),
        .toOne("folder", \.folder, inverse: "notes"),
    ])
}

/// Many-to-many with cascade on one side and deny on the other.
struct QPlaylist: PersistentModel, Codable {
    var id = UUID.unassigned
    var name: String = ""
    var songs: [Reference<QSong>] = []

    static let entity = ModelEntity<QPlaylist>([
        .attribute("name", \.name, default: ""),
        .toMany("songs", \.songs, inverse: "playlists", deleteRule: .cascade),
    ])
}

struct QSong: PersistentModel, Codable {
    var id = UUID.unassigned
    var title: String = ""
    var playlists: [Reference<QPlaylist>] = []

    static let entity = ModelEntity<QSong>([
        .attribute("title", \.title, default: ""),
        .toMany("playlists", \.playlists, inverse: "songs", deleteRule: .deny),
    ])
}

let deleteRuleModelTypes: [any PersistentModel.Type] = queryModelTypes + [QFolder.self, QNote.self, QPlaylist.self, QSong.self]
