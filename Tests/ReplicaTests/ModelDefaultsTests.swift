// Defaults taken from the type: `ModelEntity(defaults: Model(), …)` makes the initial values a model type declares
// the defaults of its non-optional attributes, so they are not repeated in `.attribute(…, default:)`.
import Foundation
import Testing
@testable import Replica

private struct Bookmark: PersistentModel, Codable {
    var id = UUID.unassigned
    var title = "Untitled"
    var visits = 3
    var pinned = true
    var note: String?
    var score: Double = 0.5

    static let entity = ModelEntity<Bookmark>(defaults: Bookmark(), [
        .attribute("title", \.title),
        .attribute("visits", \.visits),
        .attribute("pinned", \.pinned),
        .attribute("note", \.note),
        .attribute("score", \.score, default: 9.5),
    ])
}

@Suite("Attribute defaults taken from the model type")
struct ModelDefaultsTests {
    @Test("non-optional attributes take the type's initial values; explicit defaults and optionals are kept")
    func defaultsFromInstance() {
        let entity = Bookmark.schemaEntity
        #expect(entity.attribute(named: "title")?.defaultValue == .text("Untitled"))
        #expect(entity.attribute(named: "visits")?.defaultValue == .integer(3))
        #expect(entity.attribute(named: "pinned")?.defaultValue == .integer(1))
        #expect(entity.attribute(named: "note")?.defaultValue == nil)
        #expect(entity.attribute(named: "score")?.defaultValue == .real(9.5))
    }

    @Test("a synced entity with defaults from its type is valid and its defaults fill fields an older writer left out")
    func syncedEntityWithTypeDefaults() throws {
        #expect(Bookmark.declarationMismatches == [])
        let container = try ModelContainer(for: Schema([Bookmark.self]),
                                           configurations: [ModelConfiguration("bookmarks", isStoredInMemoryOnly: true, cloudKitDatabase: .private("iCloud.test"))],
                                           environment: .seeded(seed: 7, directory: temporaryTestDirectory()))
        let context = ModelContext(container)
        var bookmark = Bookmark()
        bookmark.title = "Replica"
        context.insert(bookmark)
        try context.save()
        #expect(try context.fetch(FetchDescriptor<Bookmark>()).map(\.title) == ["Replica"])
    }
}
