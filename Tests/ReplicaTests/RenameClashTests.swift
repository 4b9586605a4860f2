// Renames through original names onto a name the store has already (the old schema had both): the rename replaces
// a column holding only NULL or its default (a table without records), and is otherwise a load issue naming both
// names that changes nothing — never a silent skip that hides the renamed data. A swap of two attributes is made
// once, by the migration stage that declares it.
import Foundation
import Testing
@testable import Replica

/// Version 1: a note with a title and a heading, and a memo.
private enum ClashV1: VersionedSchema {
    static let versionIdentifier = Schema.Version(1, 0, 0)
    static var models: [any PersistentModel.Type] { [Note.self, Memo.self] }

    struct Note: PersistentModel, Codable, Equatable {
        static var entityName: String { "Note" }
        var id = UUID.unassigned
        var title: String = ""
        var heading: String = ""
        static let entity = ModelEntity<Note>([.attribute("title", \.title, default: ""), .attribute("heading", \.heading, default: "")])
    }

    struct Memo: PersistentModel, Codable, Equatable {
        static var entityName: String { "Memo" }
        var id = UUID.unassigned
        var title: String = ""
        static let entity = ModelEntity<Memo>([.attribute("title", \.title, default: "")])
    }
}

/// Version 2: the heading is renamed from the title (the old heading is dropped).
private enum ClashV2: VersionedSchema {
    static let versionIdentifier = Schema.Version(2, 0, 0)
    static var models: [any PersistentModel.Type] { [Note.self, ClashV1.Memo.self] }

    struct Note: PersistentModel, Codable, Equatable {
        static var entityName: String { "Note" }
        var id = UUID.unassigned
        var heading: String = ""
        static let entity = ModelEntity<Note>([.attribute("heading", \.heading, default: "", originalName: "title")])
    }
}

private enum ClashPlan: SchemaMigrationPlan {
    static var schemas: [any VersionedSchema.Type] { [ClashV1.self, ClashV2.self] }
    static var stages: [MigrationStage] { [.lightweight(fromVersion: ClashV1.self, toVersion: ClashV2.self)] }
}

/// Version 2 of the entities: `Memo` is renamed from `Note` (the old memos are dropped).
private enum EntityClashV2: VersionedSchema {
    static let versionIdentifier = Schema.Version(2, 0, 0)
    static var models: [any PersistentModel.Type] { [Memo.self] }

    struct Memo: PersistentModel, Codable, Equatable {
        static var entityName: String { "Memo" }
        var id = UUID.unassigned
        var title: String = ""
        var heading: String = ""
        static let entity = ModelEntity<Memo>([.attribute("title", \.title, default: ""), .attribute("heading", \.heading, default: "")],
                                              originalName: "Note")
    }
}

private enum EntityClashPlan: SchemaMigrationPlan {
    static var schemas: [any VersionedSchema.Type] { [ClashV1.self, EntityClashV2.self] }
    static var stages: [MigrationStage] { [.lightweight(fromVersion: ClashV1.self, toVersion: EntityClashV2.self)] }
}

/// A person's names, version 1.
private enum SwapV1: VersionedSchema {
    static let versionIdentifier = Schema.Version(1, 0, 0)
    static var models: [any PersistentModel.Type] { [Person.self] }

    struct Person: PersistentModel, Codable, Equatable {
        static var entityName: String { "Person" }
        var id = UUID.unassigned
        var first: String = ""
        var last: String = ""
        static let entity = ModelEntity<Person>([.attribute("first", \.first, default: ""), .attribute("last", \.last, default: "")])
    }
}

/// Version 2: first and last were stored the wrong way round; they swap through their original names.
private enum SwapV2: VersionedSchema {
    static let versionIdentifier = Schema.Version(2, 0, 0)
    static var models: [any PersistentModel.Type] { [Person.self] }

    struct Person: PersistentModel, Codable, Equatable {
        static var entityName: String { "Person" }
        var id = UUID.unassigned
        var first: String = ""
        var last: String = ""
        static let entity = ModelEntity<Person>([
            .attribute("first", \.first, default: "", originalName: "last"),
            .attribute("last", \.last, default: "", originalName: "first"),
        ])
    }
}

/// Version 3 keeps version 2's declarations and adds an attribute.
private enum SwapV3: VersionedSchema {
    static let versionIdentifier = Schema.Version(3, 0, 0)
    static var models: [any PersistentModel.Type] { [Person.self] }

    struct Person: PersistentModel, Codable, Equatable {
        static var entityName: String { "Person" }
        var id = UUID.unassigned
        var first: String = ""
        var last: String = ""
        var age: Int = 0
        static let entity = ModelEntity<Person>([
            .attribute("first", \.first, default: "", originalName: "last"),
            .attribute("last", \.last, default: "", originalName: "first"),
            .attribute("age", \.age, default: 0),
        ])
    }
}

private enum SwapPlanToV2: SchemaMigrationPlan {
    static var schemas: [any VersionedSchema.Type] { [SwapV1.self, SwapV2.self] }
    static var stages: [MigrationStage] { [.lightweight(fromVersion: SwapV1.self, toVersion: SwapV2.self)] }
}

private enum SwapPlan: SchemaMigrationPlan {
    static var schemas: [any VersionedSchema.Type] { [SwapV1.self, SwapV2.self, SwapV3.self] }
    static var stages: [MigrationStage] {
        [.lightweight(fromVersion: SwapV1.self, toVersion: SwapV2.self), .lightweight(fromVersion: SwapV2.self, toVersion: SwapV3.self)]
    }
}

@Suite("Renames onto existing names")
struct RenameClashTests {
    let directory = TestDirectory()

    private func columns(_ table: String) throws -> [String] {
        try rawConnection(directory.storeURL(), readOnly: true).rows("SELECT name FROM pragma_table_info(?) ORDER BY cid", [.text(table)]).compactMap { row in
            if case let .text(name) = row[0] { return name } else { return nil }
        }
    }

    private func rows(_ sql: String) throws -> [SQLiteValue] {
        try rawConnection(directory.storeURL(), readOnly: true).rows(sql).map(\.[0])
    }

    private func makeV1Store(heading: String, memo: String?) throws {
        let container = try ModelContainer(for: ClashV1.schema, migrationPlan: nil, configurations: [], environment: directory.environment(seed: 1))
        let context = ModelContext(container)
        context.insert(ClashV1.Note(title: "the title", heading: heading))
        if let memo { context.insert(ClashV1.Memo(title: memo)) }
        try context.save()
    }

    @Test("an attribute renamed onto a column holding values is a load issue naming both names, with or without a plan, and changes nothing")
    func attributeOntoValuesIsRefused() throws {
        try makeV1Store(heading: "the old heading", memo: nil)
        let reason = "Note.heading renames title (its original name), but the store has a column heading too, holding values in 1 of its rows; the rename would hide title's values or destroy heading's, so nothing was changed — move or clear heading's values in a migration stage's willMigrate first, or give the attribute another name"
        let withPlan = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: ClashV2.schema, migrationPlan: ClashPlan.self, environment: directory.environment(seed: 2))
        }
        #expect(withPlan == .loadIssueModelContainer(configuration: "default", reason: reason))
        let withoutPlan = #expect(throws: ReplicaError.self) {
            // An unversioned schema: a versioned one (ClashV2.schema) without its plan refuses a store recorded at 1.0.0.
            _ = try ModelContainer(for: Schema(ClashV2.models), migrationPlan: nil, configurations: [], environment: directory.environment(seed: 3))
        }
        #expect(withoutPlan == .loadIssueModelContainer(configuration: "default", reason: reason))
        #expect(try columns("Note") == ["id", "title", "heading"])
        #expect(try rows("SELECT title || '|' || heading FROM Note") == [.text("the title|the old heading")])
        #expect(try rows("SELECT value FROM replica_metadata WHERE key = 'schema_version'") == [.text("1.0.0")])
    }

    @Test("an attribute renamed onto a column holding only its default replaces it and keeps the renamed values")
    func attributeOntoDefaultsReplacesIt() throws {
        try makeV1Store(heading: "", memo: nil)
        let container = try ModelContainer(for: ClashV2.schema, migrationPlan: ClashPlan.self, environment: directory.environment(seed: 2))
        #expect(try ModelContext(container).fetch(ClashV2.Note.self).map(\.heading) == ["the title"])
        #expect(try columns("Note") == ["id", "heading"])
    }

    @Test("an entity renamed onto a table holding records is a load issue naming both; onto an empty table it replaces it and keeps the records")
    func entityOntoTable() throws {
        try makeV1Store(heading: "h", memo: "memo text")
        let refused = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: EntityClashV2.schema, migrationPlan: EntityClashPlan.self, environment: directory.environment(seed: 2))
        }
        #expect(refused == .loadIssueModelContainer(
            configuration: "default",
            reason: "entity Memo renames Note (its original name), but the store has a table Memo too, holding 1 records or links; the rename would hide Note's records or destroy Memo's, so nothing was changed — move or delete Memo's records in a migration stage's willMigrate first, or give the entity another name"))
        #expect(try rows("SELECT title FROM Memo") == [.text("memo text")])
        #expect(try rows("SELECT title FROM Note") == [.text("the title")])

        try rawConnection(directory.storeURL()).execute("DELETE FROM Memo")
        let container = try ModelContainer(for: EntityClashV2.schema, migrationPlan: EntityClashPlan.self, environment: directory.environment(seed: 3))
        #expect(try ModelContext(container).fetch(EntityClashV2.Memo.self).map { "\($0.title)|\($0.heading)" } == ["the title|h"])
        #expect(try tableNames(in: directory.storeURL()).contains("Note") == false)
    }

    @Test("two attributes swapping names through their original names swap once, in the stage that declares it; later opens and stages keep them")
    func swapOfTwoAttributes() throws {
        do {
            let container = try ModelContainer(for: SwapV1.schema, migrationPlan: nil, configurations: [], environment: directory.environment(seed: 1))
            let context = ModelContext(container)
            context.insert(SwapV1.Person(first: "Lovelace", last: "Ada"))
            try context.save()
        }
        func names(_ container: ModelContainer) throws -> [String] {
            try ModelContext(container).fetch(SwapV2.Person.self).map { "\($0.first) \($0.last)" }
        }
        #expect(try names(ModelContainer(for: SwapV2.schema, migrationPlan: SwapPlanToV2.self, environment: directory.environment(seed: 2))) == ["Ada Lovelace"])
        #expect(try names(ModelContainer(for: SwapV2.schema, migrationPlan: SwapPlanToV2.self, environment: directory.environment(seed: 3))) == ["Ada Lovelace"])
        #expect(try names(ModelContainer(for: SwapV2.schema, migrationPlan: nil, configurations: [], environment: directory.environment(seed: 4))) == ["Ada Lovelace"])
        let v3 = try ModelContainer(for: SwapV3.schema, migrationPlan: SwapPlan.self, environment: directory.environment(seed: 5))
        #expect(try ModelContext(v3).fetch(SwapV3.Person.self).map { "\($0.first) \($0.last)" } == ["Ada Lovelace"])
        #expect(Set(try columns("Person")) == ["id", "first", "last", "age"])
    }

    @Test("a legacy store migrating from version 1 through both stages of the plan is swapped once")
    func swapAcrossTwoStages() throws {
        do {
            let container = try ModelContainer(for: Schema([SwapV1.Person.self]), migrationPlan: nil, configurations: [], environment: directory.environment(seed: 1))
            let context = ModelContext(container)
            context.insert(SwapV1.Person(first: "Hopper", last: "Grace"))
            try context.save()
        }
        let v3 = try ModelContainer(for: SwapV3.schema, migrationPlan: SwapPlan.self, environment: directory.environment(seed: 2))
        #expect(try ModelContext(v3).fetch(SwapV3.Person.self).map { "\($0.first) \($0.last)" } == ["Grace Hopper"])
    }
}
