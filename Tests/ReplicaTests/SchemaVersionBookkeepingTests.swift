// The store's recorded schema version (`replica_metadata['schema_version']`) as a migration plan reads it: a store
// created from a versioned schema records its version without a plan (a widget's container); a damaged value is a
// load issue that shows it; a store without a version (or with a stale one) whose tables are past the plan's first
// schema runs no stage it is past — it is at the schema whose layout it has, or, matching none, a load issue.
import Foundation
import Testing
@testable import Replica

/// Version 2 of the note with a `words` attribute only (no `pinned`): a layout no schema of ``NotesPlan`` has.
private struct NoteWithWordsOnly: PersistentModel, Codable, Equatable {
    static var entityName: String { "Note" }
    var id = UUID.unassigned
    var title: String = ""
    var words: Int = 0
    static let entity = ModelEntity<NoteWithWordsOnly>([
        .attribute("title", \.title, default: ""),
        .attribute("words", \.words, default: 0),
    ])
}

@Suite("Schema-version bookkeeping")
struct SchemaVersionBookkeepingTests {
    let directory = TestDirectory()

    private func recordedVersion() throws -> SQLiteValue? {
        try rawConnection(directory.storeURL(), readOnly: true).scalar("SELECT value FROM replica_metadata WHERE key = 'schema_version'")
    }

    private func columns() throws -> [String] {
        try rawConnection(directory.storeURL(), readOnly: true).rows("SELECT name FROM pragma_table_info('Note') ORDER BY cid").compactMap { row in
            if case let .text(name) = row[0] { return name } else { return nil }
        }
    }

    /// A store at version 3's layout, made by a container without the plan from `schema`, holding two notes whose
    /// word counts (7 and 9) are not their headings' (the V1 → V2 stage, run again, would set them to 2 and 1).
    private func makeV3Store(_ schema: Schema) throws {
        let container = try ModelContainer(for: schema, migrationPlan: nil, configurations: [], environment: directory.environment(seed: 1))
        let context = ModelContext(container)
        context.insert(NotesV3.Note(heading: "two words", words: 7, pinned: true))
        context.insert(NotesV3.Note(heading: "one", words: 9))
        try context.save()
    }

    private static let v3Notes = ["one|9|false", "two words|7|true"]

    private func v3Contents(seed: UInt64) throws -> [String] {
        let container = try ModelContainer(for: NotesV3.schema, migrationPlan: NotesPlan.self, environment: directory.environment(seed: seed))
        return try ModelContext(container).fetch(NotesV3.Note.self).map { "\($0.heading)|\($0.words)|\($0.pinned)" }.sorted()
    }

    @Test("a store created from a versioned schema without a plan (a widget's container) records its version; the plan then runs no stage on it")
    func versionedSchemaRecordsItsVersion() throws {
        try makeV3Store(NotesV3.schema)
        #expect(try recordedVersion() == .text("3.0.0"))
        #expect(try v3Contents(seed: 2) == Self.v3Notes)
        #expect(try columns() == ["id", "heading", "words", "pinned"])
        // Schema(versionedSchema:) is the same schema.
        #expect(Schema(versionedSchema: NotesV3.self) == NotesV3.schema)
    }

    @Test("a store at version 3's layout without a recorded version, or with one set back to 1.0.0, opens at 3.0.0 and runs no stage",
          arguments: ["DELETE FROM replica_metadata WHERE key = 'schema_version'",
                      "UPDATE replica_metadata SET value = '1.0.0' WHERE key = 'schema_version'",
                      "DROP TABLE replica_metadata"])
    func laterLayoutWithoutVersionRunsNoStage(damage: String) throws {
        try makeV3Store(NotesV3.schema)
        try rawConnection(directory.storeURL()).execute(damage)
        #expect(try v3Contents(seed: 2) == Self.v3Notes)
        #expect(try columns() == ["id", "heading", "words", "pinned"])
        #expect(try recordedVersion() == .text("3.0.0"))
    }

    @Test("a store at version 2's layout without a recorded version runs only the stage from 2.0.0 (not the custom one from 1.0.0)")
    func version2LayoutRunsOnlyTheLaterStage() throws {
        do {
            let container = try ModelContainer(for: Schema([NotesV2.Note.self]), migrationPlan: nil, configurations: [],
                                               environment: directory.environment(seed: 1))
            let context = ModelContext(container)
            context.insert(NotesV2.Note(title: "  padded  ", words: 5))
            try context.save()
        }
        #expect(try recordedVersion() == nil)
        // Run again, the V1 → V2 stage would trim the title and count 1 word.
        #expect(try v3Contents(seed: 2) == ["  padded  |5|false"])
    }

    @Test("a store without a recorded version whose tables are past the first schema but match no schema of the plan is a load issue that changes nothing")
    func unmatchedLaterLayoutIsRefused() throws {
        do {
            let container = try ModelContainer(for: NoteWithWordsOnly.self, environment: directory.environment(seed: 1))
            let context = ModelContext(container)
            context.insert(NoteWithWordsOnly(title: "a", words: 4))
            try context.save()
        }
        let error = #expect(throws: ReplicaError.self) { _ = try v3Contents(seed: 2) }
        guard case let .loadIssueModelContainer(configuration, reason)? = error else {
            Issue.record("expected a load issue, got \(String(describing: error))")
            return
        }
        #expect(configuration == "default")
        #expect(reason.hasPrefix("it records no schema version (taken to be at 1.0.0), but its tables are past that schema (column Note.words of 2.0.0) and have the layout of no later schema of the migration plan (2.0.0, 3.0.0)"))
        #expect(try columns() == ["id", "title", "words"])
        #expect(try recordedVersion() == nil)
    }

    @Test("a recorded version that is not text, is empty, or is not a version is a load issue that shows it, with or without a plan, and no stage runs",
          arguments: [("3", "the integer 3"), ("''", "empty text"), ("'abc'", "the text 'abc'"), ("'3.0.0 '", "the text '3.0.0 '"),
                      ("NULL", "NULL"), ("'-1.0.0'", "the text '-1.0.0'"), ("x'03'", "a 1-byte blob")])
    func damagedValueIsALoadIssue(sql: String, shown: String) throws {
        try makeV3Store(NotesV3.schema)
        try rawConnection(directory.storeURL()).run("UPDATE replica_metadata SET value = \(sql) WHERE key = 'schema_version'")
        let expected = ReplicaError.loadIssueModelContainer(
            configuration: "default",
            reason: "its schema-version bookkeeping value (replica_metadata 'schema_version') is damaged: it holds \(shown), not a version such as 1.0.0; it cannot tell which migration stages ran — restore the store file from a backup, or set the value to the version its tables are at")
        let withPlan = #expect(throws: ReplicaError.self) { _ = try v3Contents(seed: 2) }
        #expect(withPlan == expected)
        let withoutPlan = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: NotesV3.schema, migrationPlan: nil, configurations: [], environment: directory.environment(seed: 3))
        }
        #expect(withoutPlan == expected)
        #expect(try columns() == ["id", "heading", "words", "pinned"])
        #expect("\(expected)".contains("cannot load store 'default'"))
        #expect(!"\(expected)".contains("SQLite error"))
    }

    @Test("a versioned schema whose version has a build number in it (2026120701.0.0) creates a store that opens again at that version (breaker: the second launch called the value damaged)")
    func buildNumberVersionRoundTrips() throws {
        var schema = NotesV1.schema
        schema.version = Schema.Version(2026120701, 0, 0)
        for seed: UInt64 in [1, 2] {
            let context = ModelContext(try ModelContainer(for: schema, migrationPlan: nil, configurations: [], environment: directory.environment(seed: seed)))
            context.insert(NotesV1.Note(title: "launch \(seed)"))
            try context.save()
        }
        #expect(try recordedVersion() == .text("2026120701.0.0"))
        let context = ModelContext(try ModelContainer(for: schema, migrationPlan: nil, configurations: [], environment: directory.environment(seed: 3)))
        #expect(try context.fetch(NotesV1.Note.self).map(\.title).sorted() == ["launch 1", "launch 2"])
    }

    @Test("a versioned schema with a negative version part is refused when its store would be created, naming the version (breaker: accepted, then the store never opened again)")
    func negativeVersionIsRefusedUpFront() throws {
        var schema = NotesV1.schema
        schema.version = Schema.Version(-1, 0, 0)
        let error = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: schema, migrationPlan: nil, configurations: [], environment: directory.environment(seed: 1))
        }
        #expect(error == .loadIssueModelContainer(configuration: "default",
                                                  reason: "schema version -1.0.0 cannot be recorded in a store: each part of a version is a number from 0 to 999999999999999999"))
    }

    @Test("a long damaged recorded version is shown by its start and size, not whole (breaker: a 1 MB value was copied into the error)")
    func longDamagedValueIsShownShort() throws {
        try makeV3Store(NotesV3.schema)
        try rawConnection(directory.storeURL()).run("UPDATE replica_metadata SET value = ? WHERE key = 'schema_version'", [.text(String(repeating: "9", count: 100_000))])
        let error = #expect(throws: ReplicaError.self) { _ = try v3Contents(seed: 2) }
        let text = "\(error.map { "\($0)" } ?? "")"
        #expect(text.contains("(100000 bytes)"))
        #expect(text.count < 700, "\(text.count) characters")
        #expect(try columns() == ["id", "heading", "words", "pinned"])
    }

    @Test("the current models opened unversioned on a store at a later version are told to use their versioned schema, not only to update the app (trial: 'an older build' misled)")
    func unversionedCurrentModelsGetTheRightAdvice() throws {
        try makeV3Store(NotesV3.schema)
        let error = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: Schema([NotesV3.Note.self]), migrationPlan: nil, configurations: [], environment: directory.environment(seed: 2))
        }
        let text = error.map { "\($0)" } ?? ""
        #expect(text.contains("at schema version 3.0.0, newer than this app's schema version 1.0.0"))
        #expect(text.contains("open the store with its versioned schema (Schema(versionedSchema:)"), "\(text)")
        #expect(try columns() == ["id", "heading", "words", "pinned"])
    }

    @Test("a damaged replica identity is a load issue that shows it and changes nothing, never replaced or a raw SQLite error (breaker: UNIQUE constraint failed)",
          arguments: [("'short'", "the text 'short'"), ("7", "the integer 7"), ("x'0102'", "a 2-byte blob")])
    func damagedIdentityIsALoadIssue(sql: String, shown: String) throws {
        try makeV3Store(NotesV3.schema)
        try rawConnection(directory.storeURL()).run("UPDATE replica_metadata SET value = \(sql) WHERE key = 'identity'")
        let error = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: NotesV3.schema, migrationPlan: nil, configurations: [], environment: directory.environment(seed: 2))
        }
        #expect(error == .loadIssueModelContainer(configuration: "default",
            reason: "its replica identity (replica_metadata 'identity') is damaged: it holds \(shown), not a 16-byte identifier; restore the store file from a backup, or delete that row to give the store a new identity (its writes are then stamped as a new replica's); nothing was changed"))
        #expect(try rawConnection(directory.storeURL(), readOnly: true).scalar("SELECT count(*) FROM Note") == .integer(2))
        // Deleting the row, as the message says, gives the store a new identity; its records stay.
        try rawConnection(directory.storeURL()).run("DELETE FROM replica_metadata WHERE key = 'identity'")
        let container = try ModelContainer(for: NotesV3.schema, migrationPlan: nil, configurations: [], environment: directory.environment(seed: 3))
        #expect(try ModelContext(container).fetch(NotesV3.Note.self).count == 2)
    }
}
