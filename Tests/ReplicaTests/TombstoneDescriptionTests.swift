import Foundation
import Testing
@testable import Replica

/// A local model whose every attribute is preserved in the tombstone, one of them encrypted.
struct Keepsake: PersistentModel, Codable {
    var id = UUID.unassigned
    var title: String = ""
    var count: Int = 0
    var done: Bool = false
    var due: Date?
    var photo: Data?
    var secret: String?

    static let entity = ModelEntity<Keepsake>([
        .attribute("title", \.title, default: "", options: .preserveValueOnDeletion),
        .attribute("count", \.count, default: 0, options: .preserveValueOnDeletion),
        .attribute("done", \.done, default: false, options: .preserveValueOnDeletion),
        .attribute("due", \.due, options: .preserveValueOnDeletion),
        .attribute("photo", \.photo, options: .preserveValueOnDeletion),
        .attribute("secret", \.secret, options: [.preserveValueOnDeletion, .allowsCloudEncryption]),
    ])
}

@Suite("Tombstone values as a person reads them")
struct TombstoneDescriptionTests {
    static let expected = #"HistoryTombstone(count: 42, done: true, due: 2026-12-01T10:00:00Z, photo: <12 bytes>, secret: <encrypted>, title: "Buy milk")"#

    /// The tombstone of a deleted keepsake, as history reports it.
    static func deletedKeepsakeTombstone(_ container: ModelContainer) throws -> HistoryTombstone {
        let context = ModelContext(container)
        let keepsake = context.insert(Keepsake(title: "Buy milk", count: 42, done: true,
                                               due: Date(timeIntervalSince1970: 1_796_119_200),
                                               photo: Data(repeating: 7, count: 12), secret: "hunter2"))
        try context.save()
        context.delete(keepsake)
        try context.save()
        let changes = try context.fetchHistory().flatMap(\.changes)
        let tombstone = changes.compactMap { change -> HistoryTombstone? in
            if case let .delete(_, tombstone) = change { return tombstone }
            return nil
        }.first
        return try #require(tombstone)
    }

    @Test("history shows tombstone values as values: text quoted, numbers, booleans, UTC dates, data sizes; encrypted attributes never")
    func historyTombstoneReadsAsValues() throws {
        let root = temporaryTestDirectory("tombstone")
        defer { try? FileManager.default.removeItem(at: root) }
        let container = try ModelContainer(for: Keepsake.self, environment: .seeded(seed: 1, directory: root))
        let tombstone = try Self.deletedKeepsakeTombstone(container)
        #expect(tombstone.description == Self.expected)
        #expect(!tombstone.description.contains("hunter2"))
        #expect(!"\(HistoryChange.delete(PersistentIdentifier(entityName: "Keepsake", id: UUID()), tombstone: tombstone))".contains("hunter2"))
        // Equality and coding ignore how a tombstone is described.
        #expect(tombstone == HistoryTombstone(values: tombstone.values))
    }

    @Test("a tombstone built without the schema shows storage classes and sizes only")
    func tombstoneWithoutSchemaStaysRedacted() {
        let tombstone = HistoryTombstone(values: ["title": .text("Buy milk"), "count": .integer(42), "photo": .blob(Data(count: 3))])
        #expect(tombstone.description == "HistoryTombstone(count: INTEGER, photo: BLOB(3 bytes), title: TEXT(8 bytes))")
    }

    @Test("the change stream describes tombstones with the store's schema")
    func changeStreamTombstoneReadsAsValues() async throws {
        let root = temporaryTestDirectory("tombstone")
        defer { try? FileManager.default.removeItem(at: root) }
        let container = try ModelContainer(for: Keepsake.self, environment: .seeded(seed: 2, directory: root))
        let start = try ModelContext(container).currentHistoryToken(of: "default")
        _ = try Self.deletedKeepsakeTombstone(container)
        // Replayed from history: the change stream after the token taken before the saves.
        var described: String?
        for try await event in try container.changes(in: ["default"], after: [start]) {
            guard case let .committed(change) = event else { continue }
            for case let .delete(_, tombstone) in change.changes { described = tombstone.description }
            if described != nil { break }
        }
        #expect(described == Self.expected)
    }
}
