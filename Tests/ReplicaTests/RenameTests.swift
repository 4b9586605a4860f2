// Renames through original names: a local store renames the column or table and keeps the values; a synced entity
// keeps its cloud field names forever (an original name is refused with the way to rename only the Swift property),
// and two app versions — one with the property renamed — keep syncing.
import Foundation
import Testing
@testable import Replica

private struct MemoV1: PersistentModel, Codable, Equatable {
    static var entityName: String { "Memo" }
    var id = UUID.unassigned
    var title: String = ""
    var size: Int = 0
    static let entity = ModelEntity<MemoV1>([
        .attribute("title", \.title, default: ""),
        .attribute("size", \.size, default: 0, options: .unique),
    ])
}

/// `title` renamed `heading`.
private struct MemoRenamedAttribute: PersistentModel, Codable, Equatable {
    static var entityName: String { "Memo" }
    var id = UUID.unassigned
    var heading: String = ""
    var size: Int = 0
    static let entity = ModelEntity<MemoRenamedAttribute>([
        .attribute("heading", \.heading, default: "", originalName: "title"),
        .attribute("size", \.size, default: 0, options: .unique),
    ])
}

/// The entity `Memo` renamed `Jotting`.
private struct Jotting: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var title: String = ""
    var size: Int = 0
    static let entity = ModelEntity<Jotting>([
        .attribute("title", \.title, default: ""),
        .attribute("size", \.size, default: 0, options: .unique),
    ], originalName: "Memo")
}

/// Version 2 of a synced note: the Swift property is renamed `heading`; the stored and cloud name stays `title`.
private struct SyncNoteHeading: PersistentModel, Codable, Equatable {
    static var entityName: String { "SyncNote" }
    var id = UUID.unassigned
    var heading: String = ""
    var body: String?
    var rating: Int = 0
    var mood: String = "calm"
    static let entity = ModelEntity<SyncNoteHeading>([
        .attribute("title", \.heading, default: "", options: .preserveValueOnDeletion),
        .attribute("body", \.body),
        .attribute("rating", \.rating, default: 0),
        .attribute("mood", \.mood, default: "calm"),
    ])

    enum CodingKeys: String, CodingKey { case id, heading = "title", body, rating, mood }
}

/// A synced note declaring an original name (refused).
private struct SyncNoteRenamed: PersistentModel, Codable, Equatable {
    static var entityName: String { "SyncNote" }
    var id = UUID.unassigned
    var heading: String = ""
    static let entity = ModelEntity<SyncNoteRenamed>([.attribute("heading", \.heading, default: "", originalName: "title")])
}

@Suite("Renames through original names")
struct RenameTests {
    let directory = TestDirectory()

    private func makeV1Store() throws -> [MemoV1] {
        let container = try ModelContainer(for: MemoV1.self, environment: directory.environment(seed: 1))
        let context = ModelContext(container)
        let memos = [context.insert(MemoV1(title: "first", size: 1)), context.insert(MemoV1(title: "second", size: 2))]
        try context.save()
        return memos
    }

    @Test("an attribute with an original name: the local store renames its column and keeps every value (not an empty new column)")
    func attributeRename() throws {
        let memos = try makeV1Store()
        let container = try ModelContainer(for: MemoRenamedAttribute.self, environment: directory.environment(seed: 2))
        let context = ModelContext(container)
        #expect(try context.fetch(MemoRenamedAttribute.self).sorted { $0.size < $1.size }
                == memos.map { MemoRenamedAttribute(id: $0.id, heading: $0.title, size: $0.size) })
        let columns = try rawConnection(directory.storeURL(), readOnly: true).rows("SELECT name FROM pragma_table_info('Memo') ORDER BY cid").map(\.[0])
        #expect(columns == [.text("id"), .text("heading"), .text("size")])
        let types = try rawConnection(directory.storeURL(), readOnly: true).scalar("SELECT value FROM replica_metadata WHERE key = 'attribute_types'")
        #expect(types == .text(#"{"Memo.heading":"string","Memo.size":"integer"}"#))
        // Queries and saves use the new column; reopening renames nothing again.
        context.insert(MemoRenamedAttribute(heading: "third", size: 3))
        try context.save()
        let again = try ModelContainer(for: MemoRenamedAttribute.self, environment: directory.environment(seed: 3))
        #expect(try ModelContext(again).fetch(MemoRenamedAttribute.self).map(\.heading).sorted() == ["first", "second", "third"])
    }

    @Test("an entity with an original name: the local store renames its table and indexes, and keeps its records and unique constraint")
    func entityRename() throws {
        let memos = try makeV1Store()
        let container = try ModelContainer(for: Jotting.self, environment: directory.environment(seed: 2))
        let context = ModelContext(container)
        #expect(try context.fetch(Jotting.self).sorted { $0.size < $1.size } == memos.map { Jotting(id: $0.id, title: $0.title, size: $0.size) })
        #expect(try tableNames(in: directory.storeURL()).contains("Jotting"))
        #expect(try !tableNames(in: directory.storeURL()).contains("Memo"))
        let indexes = try rawConnection(directory.storeURL(), readOnly: true)
            .rows("SELECT name FROM sqlite_master WHERE type = 'index' AND name LIKE 'replica_%' AND tbl_name = 'Jotting' ORDER BY name").map(\.[0])
        #expect(indexes == [.text("replica_Jotting_unique0")])
        // The unique constraint survived the rename: an insert of a taken size is an upsert of its record (R15).
        let holder = try #require(try context.fetch(Jotting.self).first { $0.size == 1 })
        context.insert(Jotting(title: "duplicate size", size: 1))
        try context.save()
        let after = try ModelContext(container).fetch(Jotting.self)
        #expect(after.count == memos.count)
        let updated = try #require(after.first { $0.size == 1 })
        #expect(updated.id == holder.id && updated.title == "duplicate size")
    }

    @Test("a synced entity cannot declare an original name: the error says the cloud keeps the name and how to rename only the property")
    func syncedRenameRefused() throws {
        let error = #expect(throws: ReplicaError.self) {
            _ = try Device("renamed", seed: 1, models: [SyncNoteRenamed.self])
        }
        #expect(error == .invalidSchema(SchemaValidationError(violations: [
            .syncedRename(entity: "SyncNote", member: "heading", originalName: "title"),
        ])))
        #expect(SchemaViolation.syncedRename(entity: "SyncNote", member: "heading", originalName: "title").description
                == "SyncNote.heading is synced, so it cannot be renamed from 'title': the cloud keeps its name forever; keep the stored name "
                + "and rename only the Swift property (.attribute(\"title\", \\.heading))")
    }

    @Test("two app versions, one with the Swift property renamed (the cloud field keeps its name), keep syncing with each other")
    func renamedPropertyKeepsSyncing() throws {
        let cloud = InMemoryCloudDatabase()
        let old = try Device("v1", seed: 1)
        let new = try Device("v2", seed: 2, models: [SyncNoteHeading.self], version: Schema.Version(2, 0, 0))
        let written = old.context.insert(SyncNote(title: "from v1"))
        try old.context.save()
        try old.sync(cloud)
        try new.sync(cloud)
        var note = try #require(try ModelContext(new.container).model(SyncNoteHeading.self, id: written.id))
        #expect(note.heading == "from v1")
        note.heading = "edited by v2"
        new.context.update(note)
        try new.context.save()
        try new.sync(cloud)
        #expect(cloud.records(in: "notes").first?.fields["title"]?.value == .text("edited by v2"))
        #expect(cloud.records(in: "notes").first?.fields["heading"] == nil)
        try old.sync(cloud)
        #expect(try ModelContext(old.container).model(SyncNote.self, id: written.id)?.title == "edited by v2")
        #expect(try old.engine.status().blockedBy == nil)
        #expect(try new.engine.status().blockedBy == nil)
    }
}
