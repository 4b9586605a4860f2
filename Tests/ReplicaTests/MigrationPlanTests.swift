// Versioned schemas and migration plans (SwiftData's VersionedSchema, SchemaMigrationPlan, MigrationStage): lightweight
// and custom stages, the recorded schema version, stores at unknown or newer versions, an interruption at every step
// of a migration (the store is before or after a stage, never between), and a synced store whose custom stage's
// changes replicate.
import Foundation
import Testing
@testable import Replica

/// Version 1: a note with a title.
enum NotesV1: VersionedSchema {
    static let versionIdentifier = Schema.Version(1, 0, 0)
    static var models: [any PersistentModel.Type] { [Note.self] }

    struct Note: PersistentModel, Codable, Equatable {
        static var entityName: String { "Note" }
        var id = UUID.unassigned
        var title: String = ""
        static let entity = ModelEntity<Note>([.attribute("title", \.title, default: "")])
    }
}

/// Version 2: the note gains a word count (filled by a custom stage) and a pinned flag (a plain addition).
enum NotesV2: VersionedSchema {
    static let versionIdentifier = Schema.Version(2, 0, 0)
    static var models: [any PersistentModel.Type] { [Note.self] }

    struct Note: PersistentModel, Codable, Equatable {
        static var entityName: String { "Note" }
        var id = UUID.unassigned
        var title: String = ""
        var words: Int = 0
        var pinned: Bool = false
        static let entity = ModelEntity<Note>([
            .attribute("title", \.title, default: ""),
            .attribute("words", \.words, default: 0),
            .attribute("pinned", \.pinned, default: false),
        ])
    }
}

/// Version 3: `title` is renamed `heading` (lightweight, through its original name).
enum NotesV3: VersionedSchema {
    static let versionIdentifier = Schema.Version(3, 0, 0)
    static var models: [any PersistentModel.Type] { [Note.self] }

    struct Note: PersistentModel, Codable, Equatable {
        static var entityName: String { "Note" }
        var id = UUID.unassigned
        var heading: String = ""
        var words: Int = 0
        var pinned: Bool = false
        static let entity = ModelEntity<Note>([
            .attribute("heading", \.heading, default: "", originalName: "title"),
            .attribute("words", \.words, default: 0),
            .attribute("pinned", \.pinned, default: false),
        ])
    }
}

/// The word count the custom stage computes.
private func wordCount(_ text: String) -> Int { text.split(separator: " ").count }

/// v1 → v2: custom (trim titles on the old schema, count words on the new one); v2 → v3: lightweight.
enum NotesPlan: SchemaMigrationPlan {
    static var schemas: [any VersionedSchema.Type] { [NotesV1.self, NotesV2.self, NotesV3.self] }
    static var stages: [MigrationStage] {
        [
            .custom(fromVersion: NotesV1.self, toVersion: NotesV2.self, willMigrate: { context in
                for var note in try context.fetch(NotesV1.Note.self) {
                    note.title = note.title.trimmingCharacters(in: .whitespaces)
                    context.update(note)
                }
                try context.save()
            }, didMigrate: { context in
                for var note in try context.fetch(NotesV2.Note.self) {
                    note.words = wordCount(note.title)
                    context.update(note)
                }
                try context.save()
            }),
            .lightweight(fromVersion: NotesV2.self, toVersion: NotesV3.self),
        ]
    }
}

/// The plan up to version 2 only.
enum NotesPlanToV2: SchemaMigrationPlan {
    static var schemas: [any VersionedSchema.Type] { [NotesV1.self, NotesV2.self] }
    static var stages: [MigrationStage] { [NotesPlan.stages[0]] }
}

/// A plan whose stages do not chain.
enum BrokenPlan: SchemaMigrationPlan {
    static var schemas: [any VersionedSchema.Type] { [NotesV1.self, NotesV2.self, NotesV3.self] }
    static var stages: [MigrationStage] {
        [.lightweight(fromVersion: NotesV1.self, toVersion: NotesV3.self), .lightweight(fromVersion: NotesV2.self, toVersion: NotesV3.self)]
    }
}

/// Stands for a crash at one step of a migration.
struct MigrationInterrupted: Error, Equatable {}

@Suite("Migration plans")
struct MigrationPlanTests {
    let directory = TestDirectory()
    static let titles = ["  buy milk ", "call the plumber today", "one"]

    /// A version 1 store holding ``titles``, created without a plan from version 1's versioned schema (it records
    /// 1.0.0) or, `legacy`, from a plain schema of its models, as an app did before it adopted versioned schemas (it
    /// records no version).
    private func makeV1Store(legacy: Bool = false) throws {
        let schema = legacy ? Schema([NotesV1.Note.self]) : NotesV1.schema
        let container = try ModelContainer(for: schema, migrationPlan: nil, configurations: [], environment: directory.environment(seed: 1))
        let context = ModelContext(container)
        for title in Self.titles { context.insert(NotesV1.Note(title: title)) }
        try context.save()
    }

    private func recordedVersion() throws -> SQLiteValue? {
        try rawConnection(directory.storeURL(), readOnly: true).scalar("SELECT value FROM replica_metadata WHERE key = 'schema_version'")
    }

    /// The headings, word counts and pinned flags of the version 3 notes, sorted by heading.
    private static func v3Contents(_ container: ModelContainer) throws -> [String] {
        try ModelContext(container).fetch(NotesV3.Note.self).map { "\($0.heading)|\($0.words)|\($0.pinned)" }.sorted()
    }

    static let expectedV3 = ["buy milk|2|false", "call the plumber today|4|false", "one|1|false"]

    @Test("a version 1 store migrates through a custom and a lightweight stage; the version is recorded; reopening runs nothing again")
    func migratesThroughStages() throws {
        try makeV1Store(legacy: true)
        #expect(try recordedVersion() == nil)
        let container = try ModelContainer(for: NotesV3.schema, migrationPlan: NotesPlan.self, environment: directory.environment(seed: 2))
        #expect(try Self.v3Contents(container) == Self.expectedV3)
        #expect(try recordedVersion() == .text("3.0.0"))
        let columns = try rawConnection(directory.storeURL(), readOnly: true).rows("SELECT name FROM pragma_table_info('Note') ORDER BY cid").map(\.[0])
        #expect(columns == [.text("id"), .text("heading"), .text("words"), .text("pinned")])
        // Reopened: at 3.0.0 already, no stage runs (a changed word count would be kept).
        do {
            let context = ModelContext(container)
            var note = try #require(context.fetch(NotesV3.Note.self).first { $0.heading == "one" })
            note.words = 99
            context.update(note)
            try context.save()
        }
        let again = try ModelContainer(for: NotesV3.schema, migrationPlan: NotesPlan.self, environment: directory.environment(seed: 3))
        #expect(try Self.v3Contents(again).contains("one|99|false"))
        #expect(!FileManager.default.fileExists(atPath: directory.storeURL().path + ".migrating"))
    }

    @Test("a store whose configuration name leaves no room for the migration's working copy is a load issue that changes nothing; a 231-byte name migrates",
          arguments: [231, 232, 241])
    func longConfigurationNames(length: Int) throws {
        // `<name>.store.migrating-journal` (24 bytes past the name) must fit the 255-byte file-name limit.
        let name = String(repeating: "n", count: length)
        do {
            let context = ModelContext(try ModelContainer(for: NotesV1.schema, migrationPlan: nil, configurations: [ModelConfiguration(name)],
                                                          environment: directory.environment(seed: 1)))
            for title in Self.titles { context.insert(NotesV1.Note(title: title)) }
            try context.save()
        }
        let open = { try ModelContainer(for: NotesV3.schema, migrationPlan: NotesPlan.self, configurations: [ModelConfiguration(name)],
                                        environment: directory.environment(seed: 2)) }
        if length <= 231 {
            #expect(try Self.v3Contents(open()) == Self.expectedV3)
            return
        }
        let error = #expect(throws: ReplicaError.self) { try open() }
        guard case let .loadIssueModelContainer(configuration, reason) = error else {
            Issue.record("expected a load issue, got \(String(describing: error))")
            return
        }
        #expect(configuration == name)
        #expect(reason.contains("at most 231 bytes") && reason.contains("nothing was changed"))
        #expect(!reason.contains(name))
        // The store is as it was: version 1.0.0, its notes, and no working copy beside it.
        let stored = try rawConnection(directory.storeURL(name), readOnly: true)
        #expect(try stored.scalar("SELECT value FROM replica_metadata WHERE key = 'schema_version'") == .text("1.0.0"))
        #expect(try stored.scalar("SELECT count(*) FROM Note") == .integer(3))
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: directory.url.path).filter { $0.contains("migrating") }
        #expect(leftovers.isEmpty)
    }

    @Test("a new store is created at the plan's last schema and records its version")
    func newStore() throws {
        let container = try ModelContainer(for: NotesV3.schema, migrationPlan: NotesPlan.self, environment: directory.environment(seed: 1))
        #expect(try Self.v3Contents(container).isEmpty)
        #expect(try recordedVersion() == .text("3.0.0"))
    }

    @Test("a store at a newer version, or at a version the plan does not list, is a load issue; a broken plan is one before any store is touched")
    func unknownAndNewerVersions() throws {
        try makeV1Store()
        _ = try ModelContainer(for: NotesV3.schema, migrationPlan: NotesPlan.self, environment: directory.environment(seed: 2))
        let newer = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: NotesV2.schema, migrationPlan: NotesPlanToV2.self, environment: directory.environment(seed: 3))
        }
        #expect(newer == .loadIssueModelContainer(configuration: "default",
                                                  reason: "the store is at schema version 3.0.0, newer than this app's latest schema version 2.0.0"))
        try rawConnection(directory.storeURL()).run("UPDATE replica_metadata SET value = '1.5.0' WHERE key = 'schema_version'")
        let unknown = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: NotesV3.schema, migrationPlan: NotesPlan.self, environment: directory.environment(seed: 4))
        }
        #expect(unknown == .loadIssueModelContainer(configuration: "default",
                                                    reason: "the store is at schema version 1.5.0, which the migration plan does not list (it lists 1.0.0, 2.0.0, 3.0.0)"))
        let broken = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: NotesV3.schema, migrationPlan: BrokenPlan.self, environment: directory.environment(seed: 5))
        }
        #expect(broken == .loadIssueModelContainer(configuration: "default",
                                                   reason: "migration stage 1 leads from 1.0.0 to 3.0.0; expected 1.0.0 to 2.0.0"))
        #expect(try recordedVersion() == .text("1.5.0"))
    }

    @Test("an older build opening without a plan a store that a plan migrated past its version is refused, naming both versions, and changes nothing")
    func olderBuildRefusedByMigratedStore() throws {
        try makeV1Store()
        do { _ = try ModelContainer(for: NotesV3.schema, migrationPlan: NotesPlan.self, environment: directory.environment(seed: 2)) }
        let columnsBefore = try rawConnection(directory.storeURL(), readOnly: true).rows("SELECT name FROM pragma_table_info('Note') ORDER BY cid").map(\.[0])
        for allowsSave in [true, false] {
            do {
                _ = try ModelContainer(for: NotesV1.schema, migrationPlan: nil, configurations: [ModelConfiguration(allowsSave: allowsSave)],
                                       environment: directory.environment(seed: 3))
                Issue.record("the older build opened the migrated store")
            } catch let ReplicaError.loadIssueModelContainer(configuration, reason) {
                #expect(configuration == "default")
                #expect(reason.contains("at schema version 3.0.0, newer than this app's schema version 1.0.0"))
            }
        }
        let columnsAfter = try rawConnection(directory.storeURL(), readOnly: true).rows("SELECT name FROM pragma_table_info('Note') ORDER BY cid").map(\.[0])
        #expect(columnsAfter == columnsBefore)
        // The current build still opens it, with or without its plan.
        #expect(try Self.v3Contents(try ModelContainer(for: NotesV3.schema, migrationPlan: nil, configurations: [], environment: directory.environment(seed: 4))) == Self.expectedV3)
    }

    @Test("an error thrown by a stage's code leaves the store at the version before the stage, with its data; the next open resumes")
    func failingStageLeavesStoreBefore() throws {
        try makeV1Store()
        enum FailOnce: SchemaMigrationPlan {
            static var schemas: [any VersionedSchema.Type] { NotesPlan.schemas }
            static var stages: [MigrationStage] {
                [NotesPlan.stages[0], .custom(fromVersion: NotesV2.self, toVersion: NotesV3.self, willMigrate: nil, didMigrate: { context in
                    for var note in try context.fetch(NotesV3.Note.self) {
                        note.pinned = true
                        context.update(note)
                    }
                    try context.save()
                    throw MigrationInterrupted()
                })]
            }
        }
        #expect(throws: MigrationInterrupted()) {
            _ = try ModelContainer(for: NotesV3.schema, migrationPlan: FailOnce.self, environment: directory.environment(seed: 2))
        }
        // The first stage completed; the second's saved changes were discarded with its copy.
        #expect(try recordedVersion() == .text("2.0.0"))
        do {
            // Closed before the next migration, which needs the store to itself.
            let v2 = try ModelContainer(for: NotesV2.schema, migrationPlan: NotesPlanToV2.self, environment: directory.environment(seed: 3))
            #expect(try ModelContext(v2).fetch(NotesV2.Note.self).map { "\($0.title)|\($0.words)|\($0.pinned)" }.sorted()
                    == ["buy milk|2|false", "call the plumber today|4|false", "one|1|false"])
        }
        let v3 = try ModelContainer(for: NotesV3.schema, migrationPlan: NotesPlan.self, environment: directory.environment(seed: 4))
        #expect(try Self.v3Contents(v3) == Self.expectedV3)
    }

    @Test("interrupted at every step of every stage (as by a crash), the store is at the version before or after that stage with matching data, and the next open finishes",
          arguments: [0, 1], MigrationStep.allCases)
    func interruptedAtEveryStep(stage: Int, step: MigrationStep) throws {
        try makeV1Store()
        let plan = try CheckedMigrationPlan(NotesPlan.self)
        #expect(throws: MigrationInterrupted()) {
            _ = try ModelContainer(plan: plan, configurations: [], environment: directory.environment(seed: 2)) { _, index, at in
                if index == stage && at == step { throw MigrationInterrupted() }
            }
        }
        let expected = step == .replaced ? stage + 2 : stage + 1
        #expect(try recordedVersion() == .text("\(expected).0.0"))
        let db = try rawConnection(directory.storeURL(), readOnly: true)
        let columns = Set(try db.rows("SELECT name FROM pragma_table_info('Note')").compactMap { row -> String? in
            if case let .text(name) = row[0] { return name } else { return nil }
        })
        switch expected {
        case 1:
            #expect(columns == ["id", "title"])
            #expect(try db.rows("SELECT title FROM Note ORDER BY title").map(\.[0]) == Self.titles.sorted().map { .text($0) })
        case 2:
            #expect(columns == ["id", "title", "words", "pinned"])
            #expect(try db.rows("SELECT title || '|' || words FROM Note ORDER BY title").map(\.[0])
                    == [.text("buy milk|2"), .text("call the plumber today|4"), .text("one|1")])
        default:
            #expect(columns == ["id", "heading", "words", "pinned"])
        }
        let finished = try ModelContainer(for: NotesV3.schema, migrationPlan: NotesPlan.self, environment: directory.environment(seed: 3))
        #expect(try Self.v3Contents(finished) == Self.expectedV3)
        #expect(try recordedVersion() == .text("3.0.0"))
    }

    @Test("a custom stage's changes in a synced store are new changes with new stamps that replicate to other devices")
    func syncedCustomStageReplicates() throws {
        enum SyncedV1: VersionedSchema {
            static let versionIdentifier = Schema.Version(1, 0, 0)
            static var models: [any PersistentModel.Type] { [NotesV1.Note.self] }
        }
        enum SyncedV2: VersionedSchema {
            static let versionIdentifier = Schema.Version(2, 0, 0)
            static var models: [any PersistentModel.Type] { [NotesV2.Note.self] }
        }
        enum SyncedPlan: SchemaMigrationPlan {
            static var schemas: [any VersionedSchema.Type] { [SyncedV1.self, SyncedV2.self] }
            static var stages: [MigrationStage] {
                [.custom(fromVersion: SyncedV1.self, toVersion: SyncedV2.self, willMigrate: nil, didMigrate: { context in
                    for var note in try context.fetch(NotesV2.Note.self) {
                        note.words = wordCount(note.title)
                        context.update(note)
                    }
                    try context.save()
                })]
            }
        }
        let cloud = InMemoryCloudDatabase()
        let folder = directory.url.appendingPathComponent("a")
        do {
            let a = try Device("A", seed: 1, models: [NotesV1.Note.self], directory: folder)
            a.context.insert(NotesV1.Note(title: "hello synced world"))
            try a.context.save()
            try a.sync(cloud)
        }
        let other = try Device("B", seed: 2, models: [NotesV2.Note.self], version: Schema.Version(2, 0, 0))
        try other.sync(cloud)
        #expect(try ModelContext(other.container).fetch(NotesV2.Note.self).map(\.words) == [0])

        let configuration = ModelConfiguration("notes", cloudKitDatabase: .private("iCloud.test"))
        _ = try ModelContainer(for: SyncedV2.schema, migrationPlan: SyncedPlan.self, configurations: [configuration],
                               environment: .seeded(seed: 3, directory: folder))
        let migrated = try Device("A after migration", seed: 4, models: [NotesV2.Note.self], version: Schema.Version(2, 0, 0), directory: folder)
        #expect(try ModelContext(migrated.container).fetch(NotesV2.Note.self).map(\.words) == [3])
        try migrated.sync(cloud)
        #expect(cloud.records(in: "notes").first?.fields["words"]?.value == .integer(3))
        try other.sync(cloud)
        #expect(try ModelContext(other.container).fetch(NotesV2.Note.self).map(\.words) == [3])
    }

    @Test("a custom stage that changes an attribute the old schema has, in place, in a synced store is refused and changes nothing (breaker: every device's stage multiplied values other devices had multiplied already)",
          arguments: ["willMigrate", "didMigrate"])
    func syncedInPlaceChangeIsRefused(phase: String) throws {
        enum SyncedV1: VersionedSchema {
            static let versionIdentifier = Schema.Version(1, 0, 0)
            static var models: [any PersistentModel.Type] { [NotesV1.Note.self] }
        }
        enum SyncedV2: VersionedSchema {
            static let versionIdentifier = Schema.Version(2, 0, 0)
            static var models: [any PersistentModel.Type] { [NotesV2.Note.self] }
        }
        enum ShoutInWillMigrate: SchemaMigrationPlan {
            static var schemas: [any VersionedSchema.Type] { [SyncedV1.self, SyncedV2.self] }
            static var stages: [MigrationStage] {
                [.custom(fromVersion: SyncedV1.self, toVersion: SyncedV2.self, willMigrate: { context in
                    for var note in try context.fetch(NotesV1.Note.self) {
                        note.title = note.title.uppercased()
                        context.update(note)
                    }
                    try context.save()
                }, didMigrate: nil)]
            }
        }
        enum ShoutInDidMigrate: SchemaMigrationPlan {
            static var schemas: [any VersionedSchema.Type] { [SyncedV1.self, SyncedV2.self] }
            static var stages: [MigrationStage] {
                [.custom(fromVersion: SyncedV1.self, toVersion: SyncedV2.self, willMigrate: nil, didMigrate: { context in
                    for var note in try context.fetch(NotesV2.Note.self) {
                        note.title = note.title.uppercased()
                        note.words = wordCount(note.title)
                        context.update(note)
                    }
                    try context.save()
                })]
            }
        }
        let configuration = ModelConfiguration("notes", cloudKitDatabase: .private("iCloud.test"))
        do {
            let context = ModelContext(try ModelContainer(for: SyncedV1.schema, migrationPlan: nil, configurations: [configuration],
                                                          environment: directory.environment(seed: 1)))
            context.insert(NotesV1.Note(title: "quiet words"))
            try context.save()
        }
        let plan: any SchemaMigrationPlan.Type = phase == "willMigrate" ? ShoutInWillMigrate.self : ShoutInDidMigrate.self
        let error = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: SyncedV2.schema, migrationPlan: plan, configurations: [configuration], environment: directory.environment(seed: 2))
        }
        guard case let .loadIssueModelContainer(name, reason)? = error else {
            Issue.record("expected a load issue, got \(String(describing: error))")
            return
        }
        #expect(name == "notes")
        #expect(reason.hasPrefix("migration stage 1.0.0 → 2.0.0: the stage's code changed Note.title of records in the synced store 'notes', an attribute 1.0.0 has too"), "\(reason)")
        let reopened = ModelContext(try ModelContainer(for: SyncedV1.schema, migrationPlan: nil, configurations: [configuration],
                                                       environment: directory.environment(seed: 3)))
        #expect(try reopened.fetch(NotesV1.Note.self).map(\.title) == ["quiet words"])
    }
}
