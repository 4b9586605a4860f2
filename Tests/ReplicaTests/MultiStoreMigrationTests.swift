// Migration plans in a container of two stores (two configurations): each store migrates on its own, one after the
// other; interrupted after the first store finished or anywhere in the second's stages, or failing in a stage's code
// for the second, the first stays migrated and the second is exactly before the interrupted stage; the next open
// finishes the second only.
import Foundation
import Synchronization
import Testing
@testable import Replica

/// Version 1 of a tag (the second store's entity).
struct TagV1: PersistentModel, Codable, Equatable {
    static var entityName: String { "Tag" }
    var id = UUID.unassigned
    var name: String = ""
    static let entity = ModelEntity<TagV1>([.attribute("name", \.name, default: "")])
}

/// Version 2 of a tag: its size (filled by the custom stage).
struct TagV2: PersistentModel, Codable, Equatable {
    static var entityName: String { "Tag" }
    var id = UUID.unassigned
    var name: String = ""
    var size: Int = 0
    static let entity = ModelEntity<TagV2>([.attribute("name", \.name, default: ""), .attribute("size", \.size, default: 0)])
}

enum TwoStoresV1: VersionedSchema {
    static let versionIdentifier = Schema.Version(1, 0, 0)
    static var models: [any PersistentModel.Type] { [NotesV1.Note.self, TagV1.self] }
}

enum TwoStoresV2: VersionedSchema {
    static let versionIdentifier = Schema.Version(2, 0, 0)
    static var models: [any PersistentModel.Type] { [NotesV2.Note.self, TagV2.self] }
}

enum TwoStoresV3: VersionedSchema {
    static let versionIdentifier = Schema.Version(3, 0, 0)
    static var models: [any PersistentModel.Type] { [NotesV3.Note.self, TagV2.self] }
}

/// Whether a stage's context holds `entity` (a stage's code runs once per store, on that store's entities).
private func holds(_ context: ModelContext, _ entity: String) -> Bool { context.container.schema.entity(named: entity) != nil }

/// The custom stage v1 → v2: trims note titles and tag names, then counts words and measures tags; with
/// `failingForTags`, its `didMigrate` throws after saving, in the tags store only.
private func twoStoresStages(failingForTags: Bool) -> [MigrationStage] {
    [
        .custom(fromVersion: TwoStoresV1.self, toVersion: TwoStoresV2.self, willMigrate: { context in
            if holds(context, "Note") {
                for var note in try context.fetch(NotesV1.Note.self) {
                    note.title = note.title.trimmingCharacters(in: .whitespaces)
                    context.update(note)
                }
            }
            if holds(context, "Tag") {
                for var tag in try context.fetch(TagV1.self) {
                    tag.name = tag.name.trimmingCharacters(in: .whitespaces)
                    context.update(tag)
                }
            }
            try context.save()
        }, didMigrate: { context in
            if holds(context, "Note") {
                for var note in try context.fetch(NotesV2.Note.self) {
                    note.words = note.title.split(separator: " ").count
                    context.update(note)
                }
            }
            if holds(context, "Tag") {
                for var tag in try context.fetch(TagV2.self) {
                    tag.size = tag.name.count
                    context.update(tag)
                }
            }
            try context.save()
            if failingForTags && holds(context, "Tag") { throw MigrationInterrupted() }
        }),
        .lightweight(fromVersion: TwoStoresV2.self, toVersion: TwoStoresV3.self),
    ]
}

enum TwoStoresPlan: SchemaMigrationPlan {
    static var schemas: [any VersionedSchema.Type] { [TwoStoresV1.self, TwoStoresV2.self, TwoStoresV3.self] }
    static var stages: [MigrationStage] { twoStoresStages(failingForTags: false) }
}

enum TwoStoresFailingPlan: SchemaMigrationPlan {
    static var schemas: [any VersionedSchema.Type] { TwoStoresPlan.schemas }
    static var stages: [MigrationStage] { twoStoresStages(failingForTags: true) }
}

/// Version 3 with the note entity renamed `Memo` (and its title `heading`), through original names.
enum RenamedStoresV3: VersionedSchema {
    static let versionIdentifier = Schema.Version(3, 0, 0)
    static var models: [any PersistentModel.Type] { [Memo.self, TagV2.self] }

    struct Memo: PersistentModel, Codable, Equatable {
        static var entityName: String { "Memo" }
        var id = UUID.unassigned
        var heading: String = ""
        var words: Int = 0
        var pinned: Bool = false
        static let entity = ModelEntity<Memo>([
            .attribute("heading", \.heading, default: "", originalName: "title"),
            .attribute("words", \.words, default: 0),
            .attribute("pinned", \.pinned, default: false),
        ], originalName: "Note")
    }
}

enum RenamedStoresPlan: SchemaMigrationPlan {
    static var schemas: [any VersionedSchema.Type] { [TwoStoresV1.self, TwoStoresV2.self, RenamedStoresV3.self] }
    static var stages: [MigrationStage] {
        let stages = twoStoresStages(failingForTags: false)
        return [stages[0], .lightweight(fromVersion: TwoStoresV2.self, toVersion: RenamedStoresV3.self)]
    }
}

@Suite("Migration plans, several stores")
struct MultiStoreMigrationTests {
    let directory = TestDirectory()
    static let tagNames = ["  red", "blue "]
    static let expectedTags = ["blue|4", "red|3"]

    /// The two configurations: "notes" (migrated first) and "tags".
    static let configurations = [
        ModelConfiguration("notes", schema: Schema([NotesV3.Note.self])),
        ModelConfiguration("tags", schema: Schema([TagV2.self])),
    ]

    /// Two version 1 stores: notes with ``MigrationPlanTests/titles``, tags with ``tagNames``.
    private func makeV1Stores() throws {
        let container = try ModelContainer(for: TwoStoresV1.schema, migrationPlan: nil, configurations: [
            ModelConfiguration("notes", schema: Schema([NotesV1.Note.self])), ModelConfiguration("tags", schema: Schema([TagV1.self])),
        ], environment: directory.environment(seed: 1))
        let context = ModelContext(container)
        for title in MigrationPlanTests.titles { context.insert(NotesV1.Note(title: title)) }
        for name in Self.tagNames { context.insert(TagV1(name: name)) }
        try context.save()
    }

    private func recordedVersion(_ store: String) throws -> SQLiteValue? {
        try rawConnection(directory.storeURL(store), readOnly: true).scalar("SELECT value FROM replica_metadata WHERE key = 'schema_version'")
    }

    /// Every row of every table of a store file (bookkeeping and history included), table by table.
    private func dump(_ store: String) throws -> [String] {
        let db = try rawConnection(directory.storeURL(store), readOnly: true)
        let tables = try db.rows("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").compactMap { row -> String? in
            if case let .text(name) = row[0] { return name } else { return nil }
        }
        return try tables.flatMap { table in
            try ["table \(table)"] + db.rows("SELECT * FROM \(quoted(table))").map { "\($0)" }.sorted()
        }
    }

    /// Opens the container without interruption and checks both stores' contents at version 3; returns the stores
    /// whose migration the open ran (from the hook's calls).
    private func finish(seed: UInt64) throws -> Set<String> {
        let migrating = Mutex<Set<String>>([])
        let plan = try CheckedMigrationPlan(TwoStoresPlan.self)
        let container = try ModelContainer(plan: plan, configurations: Self.configurations, environment: directory.environment(seed: seed)) { store, _, _ in
            _ = migrating.withLock { $0.insert(store) }
        }
        let context = ModelContext(container)
        #expect(try context.fetch(NotesV3.Note.self).map { "\($0.heading)|\($0.words)|\($0.pinned)" }.sorted() == MigrationPlanTests.expectedV3)
        #expect(try context.fetch(TagV2.self).map { "\($0.name)|\($0.size)" }.sorted() == Self.expectedTags)
        #expect(try recordedVersion("notes") == .text("3.0.0"))
        #expect(try recordedVersion("tags") == .text("3.0.0"))
        return migrating.withLock { $0 }
    }

    @Test("interrupted after the first store finished and before the second started: the first is migrated, the second untouched; the next open migrates the second only")
    func interruptedBetweenStores() throws {
        try makeV1Stores()
        let before = try dump("tags")
        let plan = try CheckedMigrationPlan(TwoStoresPlan.self)
        #expect(throws: MigrationInterrupted()) {
            _ = try ModelContainer(plan: plan, configurations: Self.configurations, environment: directory.environment(seed: 2)) { store, stage, step in
                if store == "notes" && stage == 1 && step == .replaced { throw MigrationInterrupted() }
            }
        }
        #expect(try recordedVersion("notes") == .text("3.0.0"))
        #expect(try dump("tags") == before)
        #expect(try finish(seed: 3) == ["tags"])
    }

    @Test("interrupted at every step of every stage of the second store: the first stays migrated, the second is at the version before or after that stage, and the next open finishes the second only",
          arguments: [0, 1], MigrationStep.allCases)
    func interruptedInSecondStore(stage: Int, step: MigrationStep) throws {
        try makeV1Stores()
        let plan = try CheckedMigrationPlan(TwoStoresPlan.self)
        // As a crash would, the interruption leaves the stage's copy of the tags store behind (kept aside before
        // the thrown error cleans it up, then put back).
        let copy = directory.storeURL("tags").path + ".migrating", kept = directory.url.appendingPathComponent("kept").path
        let suffixes = ["", "-wal", "-shm", "-journal"]
        #expect(throws: MigrationInterrupted()) {
            _ = try ModelContainer(plan: plan, configurations: Self.configurations, environment: directory.environment(seed: 2)) { store, index, at in
                guard store == "tags" && index == stage && at == step else { return }
                for suffix in suffixes where FileManager.default.fileExists(atPath: copy + suffix) {
                    try FileManager.default.copyItem(atPath: copy + suffix, toPath: kept + suffix)
                }
                throw MigrationInterrupted()
            }
        }
        for suffix in suffixes where FileManager.default.fileExists(atPath: kept + suffix) {
            try FileManager.default.moveItem(atPath: kept + suffix, toPath: copy + suffix)
        }
        #expect(FileManager.default.fileExists(atPath: copy) == (step != .replaced))
        #expect(try recordedVersion("notes") == .text("3.0.0"))
        let reached = step == .replaced ? stage + 2 : stage + 1
        // Created from version 1's versioned schema, the store records 1.0.0 from the start.
        #expect(try recordedVersion("tags") == .text("\(reached).0.0"))
        let db = try rawConnection(directory.storeURL("tags"), readOnly: true)
        let expected: [SQLiteValue] = reached == 1 ? Self.tagNames.sorted().map { .text($0) } : [.text("blue|4"), .text("red|3")]
        let stored = try db.rows(reached == 1 ? "SELECT name FROM Tag ORDER BY name" : "SELECT name || '|' || size FROM Tag ORDER BY name").map(\.[0])
        #expect(stored == expected)
        #expect(try finish(seed: 3) == (reached == 3 ? [] : ["tags"]))
        #expect(!FileManager.default.fileExists(atPath: copy))
    }

    @Test("a custom stage's code that throws for the second store leaves the first migrated and the second exactly as before; the error is the stage's")
    func failingStageInSecondStore() throws {
        try makeV1Stores()
        let before = try dump("tags")
        #expect(throws: MigrationInterrupted()) {
            _ = try ModelContainer(for: TwoStoresV3.schema, migrationPlan: TwoStoresFailingPlan.self, configurations: Self.configurations,
                                   environment: directory.environment(seed: 2))
        }
        #expect(try recordedVersion("notes") == .text("3.0.0"))
        #expect(try dump("tags") == before)
        #expect(!FileManager.default.fileExists(atPath: directory.storeURL("tags").path + ".migrating"))
        #expect(try finish(seed: 3) == ["tags"])
    }

    @Test("an entity renamed in a later version belongs to its configuration in every stage: the earlier stages migrate it in its own store, and the other store gets no table of it")
    func entityRenamedInLaterVersion() throws {
        try makeV1Stores()
        let container = try ModelContainer(for: RenamedStoresV3.schema, migrationPlan: RenamedStoresPlan.self, configurations: [
            ModelConfiguration("notes", schema: Schema([RenamedStoresV3.Memo.self])), ModelConfiguration("tags"),
        ], environment: directory.environment(seed: 2))
        let context = ModelContext(container)
        let memos = try context.fetch(RenamedStoresV3.Memo.self).map { "\($0.heading)|\($0.words)|\($0.pinned)" }.sorted()
        #expect(memos == MigrationPlanTests.expectedV3)
        let tags = try context.fetch(TagV2.self).map { "\($0.name)|\($0.size)" }.sorted()
        #expect(tags == Self.expectedTags)
        let notesTables = try tableNames(in: directory.storeURL("notes")), tagsTables = try tableNames(in: directory.storeURL("tags"))
        #expect(notesTables == ["Memo", "replica_metadata"])
        #expect(tagsTables == ["Tag", "replica_metadata"])
    }
}
