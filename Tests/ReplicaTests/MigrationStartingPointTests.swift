// Where a migration plan starts on a store (issue 23's re-breaker R2, R3, R9): a versioned schema opened without its
// plan never moves a store recorded at an earlier version; a valid recorded version whose tables the store still has
// is where the plan starts, whatever a container without the plan added beside them; a store without a recorded
// version whose tables several schemas of the plan share, with a custom stage between them, is a load issue naming
// them; a migration that finds another one running says to wait for it.
import Foundation
import Testing
@testable import Replica

/// Version 1 of a price, in dollars.
enum PricesV1: VersionedSchema {
    static let versionIdentifier = Schema.Version(1, 0, 0)
    static var models: [any PersistentModel.Type] { [Price.self] }

    struct Price: PersistentModel, Codable, Equatable {
        static var entityName: String { "Price" }
        var id = UUID.unassigned
        var amount: Int = 0
        static let entity = ModelEntity<Price>([.attribute("amount", \.amount, default: 0)])
    }
}

/// Version 2 of a price, in cents: the same tables and columns as version 1.
enum PricesV2: VersionedSchema {
    static let versionIdentifier = Schema.Version(2, 0, 0)
    static var models: [any PersistentModel.Type] { [Price.self] }

    struct Price: PersistentModel, Codable, Equatable {
        static var entityName: String { "Price" }
        var id = UUID.unassigned
        var amount: Int = 0
        static let entity = ModelEntity<Price>([.attribute("amount", \.amount, default: 0)])
    }
}

/// v1 → v2: a values-only custom stage (dollars to cents).
enum PricesPlan: SchemaMigrationPlan {
    static var schemas: [any VersionedSchema.Type] { [PricesV1.self, PricesV2.self] }
    static var stages: [MigrationStage] {
        [.custom(fromVersion: PricesV1.self, toVersion: PricesV2.self, willMigrate: nil, didMigrate: { context in
            for var price in try context.fetch(PricesV2.Price.self) {
                price.amount *= 100
                context.update(price)
            }
            try context.save()
        })]
    }
}

@Suite("Migration plan starting point")
struct MigrationStartingPointTests {
    let directory = TestDirectory()
    static let titles = ["  buy milk ", "call the plumber today", "one"]

    /// A version 1 store holding ``titles``, recorded at 1.0.0.
    private func makeV1Store() throws {
        let context = ModelContext(try ModelContainer(for: NotesV1.schema, migrationPlan: nil, configurations: [],
                                                      environment: directory.environment(seed: 1)))
        for title in Self.titles { context.insert(NotesV1.Note(title: title)) }
        try context.save()
    }

    private func recordedVersion() throws -> SQLiteValue? {
        try rawConnection(directory.storeURL(), readOnly: true).scalar("SELECT value FROM replica_metadata WHERE key = 'schema_version'")
    }

    private func columns(_ table: String) throws -> [String] {
        try rawConnection(directory.storeURL(), readOnly: true).rows("SELECT name FROM pragma_table_info(?) ORDER BY cid", [.text(table)]).compactMap {
            if case let .text(name) = $0[0] { name } else { nil }
        }
    }

    private func v3Contents(_ environment: ReplicaEnvironment) throws -> [String] {
        let container = try ModelContainer(for: NotesV3.schema, migrationPlan: NotesPlan.self, environment: environment)
        return try ModelContext(container).fetch(NotesV3.Note.self).map { "\($0.heading)|\($0.words)|\($0.pinned)" }.sorted()
    }

    /// What the plan makes of ``titles``: trimmed by the custom stage, their words counted.
    static let migrated = ["buy milk|2|false", "call the plumber today|4|false", "one|1|false"]

    @Test("a versioned schema opened without its plan on a store recorded at an earlier version is refused, naming both versions, and changes nothing")
    func versionedSchemaWithoutPlanRefusesAnOlderStore() throws {
        try makeV1Store()
        for allowsSave in [true, false] {
            let error = #expect(throws: ReplicaError.self) {
                _ = try ModelContainer(for: NotesV2.schema, migrationPlan: nil, configurations: [ModelConfiguration(allowsSave: allowsSave)],
                                       environment: directory.environment(seed: 2))
            }
            #expect(error == .loadIssueModelContainer(configuration: "default", reason: "the store is at schema version 1.0.0, this schema is 2.0.0: open it with the migration plan (ModelContainer(for:migrationPlan:configurations:)), which runs the stages from 1.0.0 first; nothing was changed"))
        }
        #expect(try columns("Note") == ["id", "title"])
        #expect(try recordedVersion() == .text("1.0.0"))
        // The plan then runs every stage.
        #expect(try v3Contents(directory.environment(seed: 3)) == Self.migrated)
    }

    @Test("a store recorded at 1.0.0 that a container without the plan gave version 2's columns starts the plan at 1.0.0: the custom stage runs once",
          arguments: ["open", "sql"])
    func recordedVersionWinsOverAdditiveColumns(how: String) throws {
        try makeV1Store()
        if how == "open" {
            // An unversioned schema of version 2's models (a widget's container) adds its columns and keeps 1.0.0.
            let context = ModelContext(try ModelContainer(for: Schema([NotesV2.Note.self]), migrationPlan: nil, configurations: [],
                                                          environment: directory.environment(seed: 2)))
            #expect(try context.fetch(NotesV2.Note.self).count == 3)
        } else {
            let db = try rawConnection(directory.storeURL())
            try db.execute("ALTER TABLE Note ADD COLUMN words INTEGER DEFAULT 0")
            try db.execute("ALTER TABLE Note ADD COLUMN pinned INTEGER DEFAULT 0")
        }
        #expect(try columns("Note") == ["id", "title", "words", "pinned"])
        #expect(try recordedVersion() == .text("1.0.0"))
        #expect(try v3Contents(directory.environment(seed: 3)) == Self.migrated)
        #expect(try recordedVersion() == .text("3.0.0"))
        // Reopened, nothing runs again.
        #expect(try v3Contents(directory.environment(seed: 4)) == Self.migrated)
    }

    @Test("a container without the plan whose unversioned schema renames a column of a store recorded at 1.0.0 is refused and changes nothing; the plan then runs every stage once",
          arguments: [true, false])
    func unversionedRenameOfRecordedStoreIsRefused(allowsSave: Bool) throws {
        try makeV1Store()
        // Version 3's models renamed title → heading: a widget's container of the updated app, before the app ran.
        let error = #expect(throws: ReplicaError.self) {
            let container = try ModelContainer(for: Schema([NotesV3.Note.self]), migrationPlan: nil,
                                               configurations: [ModelConfiguration(allowsSave: allowsSave)],
                                               environment: directory.environment(seed: 2))
            _ = try ModelContext(container).fetch(NotesV3.Note.self)
        }
        if allowsSave {
            #expect(error == .loadIssueModelContainer(configuration: "default", reason: "the store is at schema version 1.0.0, recorded by a migration plan, and this schema renames its tables or columns through original names: renaming them is that plan's stages' work — open it with the migration plan (ModelContainer(for:migrationPlan:configurations:)) first; nothing was changed"))
        } else {
            #expect(error != nil)
        }
        #expect(try columns("Note") == ["id", "title"])
        #expect(try recordedVersion() == .text("1.0.0"))
        #expect(try v3Contents(directory.environment(seed: 3)) == Self.migrated)
        // Once the plan ran, a container of version 3's schema without the plan opens the store.
        let context = ModelContext(try ModelContainer(for: NotesV3.schema, migrationPlan: nil, configurations: [],
                                                      environment: directory.environment(seed: 4)))
        #expect(try context.fetch(NotesV3.Note.self).count == 3)
    }

    @Test("the canary layout-outranks-recorded-version skips the custom stage on such a store (the behaviour before the fix)")
    func canarySkipsTheStage() throws {
        try makeV1Store()
        let db = try rawConnection(directory.storeURL())
        try db.execute("ALTER TABLE Note ADD COLUMN words INTEGER DEFAULT 0")
        try db.execute("ALTER TABLE Note ADD COLUMN pinned INTEGER DEFAULT 0")
        var environment = directory.environment(seed: 3)
        environment.canaries = [.layoutOutranksRecordedVersion]
        #expect(try v3Contents(environment) == ["  buy milk |0|false", "call the plumber today|0|false", "one|0|false"])
    }

    /// A store of prices at version 2's tables (which are version 1's) holding 500 (cents), with no recorded version:
    /// created by an unversioned schema of the latest models, or by the plan with its version row lost.
    private func makeUnversionedPriceStore(_ how: String) throws {
        let environment = directory.environment(seed: 1)
        let container = how == "unversioned"
            ? try ModelContainer(for: Schema([PricesV2.Price.self]), migrationPlan: nil, configurations: [], environment: environment)
            : try ModelContainer(for: PricesV2.schema, migrationPlan: PricesPlan.self, environment: environment)
        let context = ModelContext(container)
        context.insert(PricesV2.Price(amount: 500))
        try context.save()
        try rawConnection(directory.storeURL()).run("DELETE FROM replica_metadata WHERE key = 'schema_version'")
    }

    private func amounts() throws -> [SQLiteValue] {
        try rawConnection(directory.storeURL(), readOnly: true).rows("SELECT amount FROM Price").map(\.[0])
    }

    @Test("a store without a recorded version whose tables two schemas share, with a custom stage between them, is a load issue naming both; nothing runs",
          arguments: ["unversioned", "lost"])
    func ambiguousLayoutIsRefused(how: String) throws {
        try makeUnversionedPriceStore(how)
        let error = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: PricesV2.schema, migrationPlan: PricesPlan.self, environment: directory.environment(seed: 2))
        }
        guard case let .loadIssueModelContainer(configuration, reason)? = error else {
            Issue.record("expected a load issue, got \(String(describing: error))")
            return
        }
        #expect(configuration == "default")
        #expect(reason.hasPrefix("it records no schema version, and its tables have the layout of several schemas of the migration plan (1.0.0, 2.0.0), with a custom stage between them"))
        #expect(try amounts() == [.integer(500)])
        #expect(try recordedVersion() == nil)
        // Told the version, the plan runs nothing.
        try rawConnection(directory.storeURL()).run("INSERT INTO replica_metadata (key, value) VALUES ('schema_version', '2.0.0')")
        let container = try ModelContainer(for: PricesV2.schema, migrationPlan: PricesPlan.self, environment: directory.environment(seed: 3))
        #expect(try ModelContext(container).fetch(PricesV2.Price.self).map(\.amount) == [500])
    }

    @Test("an empty store without a recorded version whose tables two schemas share, across a custom stage, is at the later one: it opens, records it, and its saves are never transformed",
          arguments: ["unversioned", "lost"])
    func emptyAmbiguousStoreIsAtTheLatestSchema(how: String) throws {
        // A widget's container of the updated app (an unversioned schema of the latest models) created the store and
        // saved nothing yet; or the plan's own store lost its version row.
        let environment = directory.environment(seed: 1)
        _ = how == "unversioned"
            ? try ModelContainer(for: Schema([PricesV2.Price.self]), migrationPlan: nil, configurations: [], environment: environment)
            : try ModelContainer(for: PricesV2.schema, migrationPlan: PricesPlan.self, environment: environment)
        if how == "lost" { try rawConnection(directory.storeURL()).run("DELETE FROM replica_metadata WHERE key = 'schema_version'") }
        #expect(try recordedVersion() == nil)
        do {
            let context = ModelContext(try ModelContainer(for: PricesV2.schema, migrationPlan: PricesPlan.self,
                                                          environment: directory.environment(seed: 2)))
            context.insert(PricesV2.Price(amount: 500))
            try context.save()
        }
        #expect(try recordedVersion() == .text("2.0.0"))
        let container = try ModelContainer(for: PricesV2.schema, migrationPlan: PricesPlan.self, environment: directory.environment(seed: 3))
        #expect(try ModelContext(container).fetch(PricesV2.Price.self).map(\.amount) == [500])
    }

    @Test("a genuine version 1 store of prices recorded at 1.0.0 runs the values-only stage once")
    func recordedValuesOnlyStoreMigratesOnce() throws {
        do {
            let context = ModelContext(try ModelContainer(for: PricesV1.schema, migrationPlan: nil, configurations: [],
                                                          environment: directory.environment(seed: 1)))
            context.insert(PricesV1.Price(amount: 5))
            try context.save()
        }
        for seed: UInt64 in [2, 3] {
            let container = try ModelContainer(for: PricesV2.schema, migrationPlan: PricesPlan.self, environment: directory.environment(seed: seed))
            #expect(try ModelContext(container).fetch(PricesV2.Price.self).map(\.amount) == [500])
        }
    }

    @Test("a migration that finds another one running (the store's lock held exclusively) says to open again when it finished; one beside an open container keeps its advice")
    func concurrentMigrationSaysWait() throws {
        try makeV1Store()
        func inUseReason() -> String? {
            do {
                _ = try ModelContainer(for: NotesV3.schema, migrationPlan: NotesPlan.self, environment: directory.environment(seed: 5))
                Issue.record("the store opened")
            } catch let ReplicaError.storeInUse(configuration, reason) {
                #expect(configuration == "default")
                return reason
            } catch {
                Issue.record("unexpected error: \(error)")
            }
            return nil
        }
        do {
            let migrating = try StoreFileLock.take(.exclusive, of: directory.storeURL())
            #expect(inUseReason() == "another process or container is migrating it right now; open it again when that migration has finished")
            withExtendedLifetime(migrating) {}
        }
        do {
            let open = try ModelContainer(for: NotesV1.schema, migrationPlan: nil, configurations: [], environment: directory.environment(seed: 6))
            #expect(inUseReason()?.hasPrefix("another process or container has it open; migrating it from schema version 1.0.0 to 3.0.0 needs it to itself — close the store there (or update that app)") == true)
            withExtendedLifetime(open) {}
        }
        #expect(try recordedVersion() == .text("1.0.0"))
        #expect(try v3Contents(directory.environment(seed: 7)) == Self.migrated)
    }
}
