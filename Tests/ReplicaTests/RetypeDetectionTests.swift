// A store opened with an attribute declared with another type than the one its values were stored as is a load issue,
// for every pair of attribute types — including pairs SQLite stores in the same column type (Bool and Int, Date and
// Double, Data and UUID, String, URL and composite values).
import Foundation
import Testing
@testable import Replica

/// Version 1 of a task: `done` is a Bool, `due` a Date.
private struct TaskV1: PersistentModel, Codable, Equatable {
    static var entityName: String { "Task" }
    var id = UUID.unassigned
    var done: Bool = false
    var due: Date = Date(timeIntervalSince1970: 0)
    static let entity = ModelEntity<TaskV1>([
        .attribute("done", \.done, default: false),
        .attribute("due", \.due, default: Date(timeIntervalSince1970: 0)),
    ])
}

/// Version 2 retypes `done` to an Int (a count of completions).
private struct TaskDoneAsInt: PersistentModel, Codable, Equatable {
    static var entityName: String { "Task" }
    var id = UUID.unassigned
    var done: Int = 0
    var due: Date = Date(timeIntervalSince1970: 0)
    static let entity = ModelEntity<TaskDoneAsInt>([
        .attribute("done", \.done, default: 0),
        .attribute("due", \.due, default: Date(timeIntervalSince1970: 0)),
    ])
}

/// Version 2 retypes `due` to a Double.
private struct TaskDueAsDouble: PersistentModel, Codable, Equatable {
    static var entityName: String { "Task" }
    var id = UUID.unassigned
    var done: Bool = false
    var due: Double = 0
    static let entity = ModelEntity<TaskDueAsDouble>([
        .attribute("done", \.done, default: false),
        .attribute("due", \.due, default: 0),
    ])
}

/// A one-attribute schema: entity `Item` with `value` of `type`.
private func itemSchema(_ type: Schema.AttributeType, optional: Bool = true) -> Schema {
    Schema(entities: [Schema.Entity(name: "Item", attributes: [
        Schema.Attribute(name: "value", type: type, isOptional: optional, defaultValue: optional ? nil : defaultValue(type)),
    ])])
}

/// A stored default of each type (synced entities need one for a non-optional attribute).
private func defaultValue(_ type: Schema.AttributeType) -> SQLiteValue {
    switch type {
    case .string, .url: .text(type == .url ? "https://example.com" : "")
    case .composite: .text("{}")
    case .integer, .bool: .integer(0)
    case .double, .date: .real(0)
    case .data: .blob(Data())
    case .uuid: .blob(Data(repeating: 0, count: 16))
    }
}

@Suite("Retyped attributes detected on open")
struct RetypeDetectionTests {
    /// Opens `schema` in a fresh store of `directory` (a file), local or synced.
    private static func open(_ schema: Schema, _ directory: TestDirectory, synced: Bool, seed: UInt64) throws -> ModelContainer {
        let configuration = ModelConfiguration(cloudKitDatabase: synced ? .private("iCloud.example.items") : .none)
        return try ModelContainer(for: schema, configurations: [configuration], environment: directory.environment(seed: seed))
    }

    /// The load issue's reason, or `nil` when the container opened.
    private static func loadIssue(_ body: () throws -> ModelContainer) -> String? {
        do {
            _ = try body()
            return nil
        } catch let ReplicaError.loadIssueModelContainer(_, reason) {
            return reason
        } catch {
            return "unexpected error: \(error)"
        }
    }

    @Test("every pair of attribute types: a retype is a load issue naming the attribute, both types and the migration API (local) or the additive-only rule (synced)",
          arguments: [false, true])
    func everyPair(synced: Bool) throws {
        for stored in Schema.AttributeType.allCases {
            for declared in Schema.AttributeType.allCases {
                let directory = TestDirectory()
                _ = try Self.open(itemSchema(stored), directory, synced: synced, seed: 1)
                let reason = Self.loadIssue { try Self.open(itemSchema(declared, optional: false), directory, synced: synced, seed: 2) }
                guard stored != declared else {
                    #expect(reason == nil, "\(stored) → \(declared) (optionality only) must open")
                    continue
                }
                guard let reason else {
                    Issue.record("\(stored) → \(declared) opened")
                    continue
                }
                #expect(reason.hasPrefix("Item.value is stored as \(stored.rawValue) but declared \(declared.rawValue) (\(declared.sqliteDeclaredType))"),
                        "\(stored) → \(declared): \(reason)")
                if synced {
                    #expect(reason.contains("additive-only"), "\(reason)")
                } else {
                    #expect(reason.contains("ModelContainer(for:migrationPlan:configurations:)"), "\(reason)")
                }
                // Refused before anything changed: the original declaration still opens.
                #expect(Self.loadIssue { try Self.open(itemSchema(stored), directory, synced: synced, seed: 3) } == nil)
            }
        }
    }

    @Test("Bool → Int and Date → Double with saved records are load issues, and the records stay as they were")
    func sameColumnTypeRetypes() throws {
        let directory = TestDirectory()
        let saved: TaskV1
        do {
            let container = try ModelContainer(for: TaskV1.self, environment: directory.environment(seed: 1))
            let context = ModelContext(container)
            saved = context.insert(TaskV1(done: true, due: Date(timeIntervalSince1970: 86_400)))
            try context.save()
        }
        let asInt = Self.loadIssue { try ModelContainer(for: TaskDoneAsInt.self, environment: directory.environment(seed: 2)) }
        #expect(asInt?.hasPrefix("Task.done is stored as bool but declared integer (INTEGER); changing an attribute's type needs a migration") == true,
                "\(asInt ?? "opened")")
        let asDouble = Self.loadIssue { try ModelContainer(for: TaskDueAsDouble.self, environment: directory.environment(seed: 3)) }
        #expect(asDouble?.hasPrefix("Task.due is stored as date but declared double (REAL)") == true, "\(asDouble ?? "opened")")
        let container = try ModelContainer(for: TaskV1.self, environment: directory.environment(seed: 4))
        #expect(try ModelContext(container).model(TaskV1.self, id: saved.id) == saved)
    }

    @Test("an attribute no longer declared keeps its recorded type: declaring it again with another type is a retype")
    func removedThenRedeclared() throws {
        let directory = TestDirectory()
        let both = Schema(entities: [Schema.Entity(name: "Item", attributes: [
            Schema.Attribute(name: "value", type: .bool, isOptional: true),
            Schema.Attribute(name: "other", type: .string, isOptional: true),
        ])])
        let without = Schema(entities: [Schema.Entity(name: "Item", attributes: [Schema.Attribute(name: "other", type: .string, isOptional: true)])])
        let retyped = Schema(entities: [Schema.Entity(name: "Item", attributes: [
            Schema.Attribute(name: "other", type: .string, isOptional: true),
            Schema.Attribute(name: "value", type: .integer, isOptional: true),
        ])])
        _ = try Self.open(both, directory, synced: false, seed: 1)
        _ = try Self.open(without, directory, synced: false, seed: 2)
        let reason = Self.loadIssue { try Self.open(retyped, directory, synced: false, seed: 3) }
        #expect(reason?.hasPrefix("Item.value is stored as bool but declared integer") == true, "\(reason ?? "opened")")
    }

    @Test("a store written before types were recorded takes the current declaration on its first open, then detects retypes")
    func storeWithoutRecordedTypes() throws {
        let directory = TestDirectory()
        _ = try Self.open(itemSchema(.bool), directory, synced: false, seed: 1)
        do {
            let db = try rawConnection(directory.storeURL())
            try db.execute("DELETE FROM replica_metadata WHERE key = 'attribute_types'")
        }
        // Across column types the column still tells.
        let acrossColumns = Self.loadIssue { try Self.open(itemSchema(.string), directory, synced: false, seed: 2) }
        #expect(acrossColumns?.hasPrefix("Item.value is stored as a column of type 'INTEGER' but declared string (TEXT)") == true,
                "\(acrossColumns ?? "opened")")
        // Within one column type nothing is known before the first open records the declaration…
        _ = try Self.open(itemSchema(.bool), directory, synced: false, seed: 3)
        let recorded = try rawConnection(directory.storeURL(), readOnly: true)
            .scalar("SELECT value FROM replica_metadata WHERE key = 'attribute_types'")
        #expect(recorded == .text(#"{"Item.value":"bool"}"#))
        // …after which it is.
        let reason = Self.loadIssue { try Self.open(itemSchema(.integer), directory, synced: false, seed: 4) }
        #expect(reason?.hasPrefix("Item.value is stored as bool but declared integer") == true, "\(reason ?? "opened")")
    }

    @Test("control: without the recorded types, the column type alone lets Bool → Int and Date → Double open (what the recorded types fix)")
    func columnTypeAloneMissesSameStorageRetypes() throws {
        for (stored, declared) in [(Schema.AttributeType.bool, Schema.AttributeType.integer), (.date, .double), (.uuid, .data), (.url, .string)] {
            let directory = TestDirectory()
            _ = try Self.open(itemSchema(stored), directory, synced: false, seed: 1)
            try rawConnection(directory.storeURL()).execute("DELETE FROM replica_metadata WHERE key = 'attribute_types'")
            #expect(Self.loadIssue { try Self.open(itemSchema(declared), directory, synced: false, seed: 2) } == nil, "\(stored) → \(declared)")
        }
    }

    @Test("a read-only store with a retyped attribute is a load issue too")
    func readOnlyStore() throws {
        let directory = TestDirectory()
        _ = try Self.open(itemSchema(.date), directory, synced: false, seed: 1)
        let reason = Self.loadIssue {
            try ModelContainer(for: itemSchema(.double), configurations: [ModelConfiguration(allowsSave: false)],
                               environment: directory.environment(seed: 2))
        }
        #expect(reason?.hasPrefix("Item.value is stored as date but declared double") == true, "\(reason ?? "opened")")
    }
}
