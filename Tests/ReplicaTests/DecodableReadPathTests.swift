// The Decodable read path (`init(row:)`'s default for Decodable models): fields are found by name whatever order
// the model's `init(from:)` asks for them in, optionals read NULL as nil through one lookup, fields a fetch leaves
// out read as their defaults, and a stored value that does not fit names its attribute.
import Foundation
import Testing
@testable import Replica

/// Properties declared in another order than the entity's attributes, optionals of each common type, and a
/// hand-written `init(from:)` that asks for keys out of order and checks `contains`/`decodeNil` first.
struct ShuffledDecodable: CodablePersistentModel, Equatable {
    var id = UUID.unassigned
    var tag: String = ""
    var count: Int = 0
    var title: String = ""
    var ratio: Double?
    var done: Bool?
    var when: Date?
    var note: String?
    var other: UUID?

    static let entity = ModelEntity<ShuffledDecodable>([
        .attribute("title", \.title, default: ""),
        .attribute("note", \.note),
        .attribute("count", \.count, default: 0),
        .attribute("ratio", \.ratio),
        .attribute("done", \.done),
        .attribute("when", \.when),
        .attribute("tag", \.tag, default: "none"),
        .attribute("other", \.other),
    ])
}

struct ReverseReadDecodable: CodablePersistentModel, Equatable {
    var id = UUID.unassigned
    var first: String = ""
    var second: Int = 0
    var third: String?

    static let entity = ModelEntity<ReverseReadDecodable>([
        .attribute("first", \.first, default: ""),
        .attribute("second", \.second, default: 0),
        .attribute("third", \.third),
    ])

    private enum CodingKeys: String, CodingKey { case id, first, second, third }

    init(first: String, second: Int, third: String?) {
        self.first = first
        self.second = second
        self.third = third
    }

    init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        third = try container.decodeNil(forKey: .third) ? nil : container.decode(String.self, forKey: .third)
        second = try container.decode(Int.self, forKey: .second)
        first = try container.decode(String.self, forKey: .first)
        id = try container.decode(UUID.self, forKey: .id)
    }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(first, forKey: .first)
        try container.encode(second, forKey: .second)
        try container.encodeIfPresent(third, forKey: .third)
    }
}

@Suite("Decodable read path")
struct DecodableReadPathTests {
    private func context(_ models: [any PersistentModel.Type]) throws -> ModelContext {
        ModelContext(try inMemoryContainer(seed: 26, synced: false, models: models))
    }

    @Test("fields are found whatever order the properties are declared in; NULL optionals read as nil")
    func shuffledDeclaration() throws {
        let context = try context([ShuffledDecodable.self])
        let full = ShuffledDecodable(tag: "t", count: 3, title: "full", ratio: 0.5, done: true,
                                     when: Date(timeIntervalSince1970: 1_000), note: "n", other: UUID(uuidString: "01900000-0000-7000-8000-000000000001"))
        let empty = ShuffledDecodable(tag: "", count: 0, title: "empty")
        let inserted = [context.insert(full), context.insert(empty)]
        try context.save()
        let fetched = try context.fetch(FetchDescriptor<ShuffledDecodable>(sortBy: [SortDescriptor(\.title)]))
        #expect(fetched == [inserted[1], inserted[0]])
        // Fields a fetch leaves out read as their declared defaults (or nil).
        var partial = FetchDescriptor<ShuffledDecodable>(sortBy: [SortDescriptor(\.title)])
        partial.propertiesToFetch = [\.title, \.ratio]
        let thin = try context.fetch(partial)
        #expect(thin.map(\.title) == ["empty", "full"])
        #expect(thin.map(\.ratio) == [nil, 0.5])
        #expect(thin.map(\.tag) == ["none", "none"])
        #expect(thin.map(\.note) == [nil, nil])
    }

    @Test("a hand-written init(from:) asking for keys in reverse, with decodeNil, reads every field")
    func reverseOrder() throws {
        let context = try context([ReverseReadDecodable.self])
        let a = context.insert(ReverseReadDecodable(first: "a", second: 1, third: nil))
        let b = context.insert(ReverseReadDecodable(first: "b", second: 2, third: "three"))
        try context.save()
        let fetched = try context.fetch(FetchDescriptor<ReverseReadDecodable>(sortBy: [SortDescriptor(\.first)]))
        #expect(fetched == [a, b])
    }

    @Test("a stored value that does not fit names its attribute")
    func mismatchNamesTheAttribute() throws {
        let context = try context([ShuffledDecodable.self])
        let model = context.insert(ShuffledDecodable(tag: "t", count: 1, title: "x"))
        try context.save()
        let db = try context.container.stores[0].openConnection()
        defer { context.container.stores[0].reuse(db) }
        try db.run(#"UPDATE "ShuffledDecodable" SET "count" = 'not a number' WHERE "id" = ?"#, [model.id.sqliteValue])
        #expect {
            _ = try ModelContext(context.container).fetch(FetchDescriptor<ShuffledDecodable>())
        } throws: { error in
            "\(error)".contains("ShuffledDecodable.count")
        }
    }
}
