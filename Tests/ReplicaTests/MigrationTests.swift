// Additive migration of local stores: new attributes become columns, and existing records take their defaults.
import Foundation
import Testing
@testable import Replica

/// Version 1 and 2 of one entity (`Pin`): version 2 adds attributes and a relationship.
struct PinV1: PersistentModel, Codable, Equatable {
    static var entityName: String { "Pin" }
    var id = UUID.unassigned
    var title: String = ""

    static let entity = ModelEntity<PinV1>([.attribute("title", \.title)])
}

struct PinV2: PersistentModel, Codable, Equatable {
    static var entityName: String { "Pin" }
    var id = UUID.unassigned
    var title: String = ""
    var rating: Int = 0
    var label: String = ""
    var color: String?
    var pinned: Bool = false

    static let entity = ModelEntity<PinV2>([
        .attribute("title", \.title),
        .attribute("rating", \.rating, default: 3),
        .attribute("label", \.label, default: "it's new"),
        .attribute("color", \.color),
        .attribute("pinned", \.pinned, default: true),
    ])
}

@Suite("Additive migration")
struct MigrationTests {
    let directory = TestDirectory()

    @Test func newAttributesAreAddedAndExistingRecordsTakeTheirDefaults() throws {
        let old: PinV1
        do {
            let container = try ModelContainer(for: PinV1.self, environment: directory.environment(seed: 1))
            let context = ModelContext(container)
            old = context.insert(PinV1(title: "from version 1"))
            try context.save()
        }
        let container = try ModelContainer(for: PinV2.self, environment: directory.environment(seed: 2))
        let db = try rawConnection(directory.storeURL(), readOnly: true)
        let columns = try db.rows("SELECT name FROM pragma_table_info('Pin') ORDER BY cid").map(\.[0])
        #expect(columns == [.text("id"), .text("title"), .text("rating"), .text("label"), .text("color"), .text("pinned")])

        let context = ModelContext(container)
        let migrated = try context.model(PinV2.self, id: old.id)
        #expect(migrated == PinV2(id: old.id, title: "from version 1", rating: 3, label: "it's new", color: nil, pinned: true))
        let new = context.insert(PinV2(title: "from version 2", rating: 5))
        try context.save()
        #expect(try ModelContext(container).fetch(PinV2.self).map(\.rating) == [3, 5])
        #expect(try ModelContext(container).model(PinV2.self, id: new.id)?.label == "")
    }

    @Test func readOnlyStoresAreNotMigrated() throws {
        do {
            let container = try ModelContainer(for: PinV1.self, environment: directory.environment(seed: 1))
            let context = ModelContext(container)
            context.insert(PinV1(title: "v1"))
            try context.save()
        }
        let readOnly = ModelConfiguration("default", allowsSave: false)
        // Columns are missing, and cannot be added to a read-only store.
        let missingColumns = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: PinV2.self, configurations: readOnly, environment: directory.environment(seed: 2))
        }
        guard case let .loadIssueModelContainer(configuration, reason)? = missingColumns else {
            Issue.record("expected .loadIssueModelContainer, got \(String(describing: missingColumns))")
            return
        }
        #expect(configuration == "default")
        #expect(reason.contains("rating"))
        // So is a whole table.
        let missingTable = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: PinV1.self, Note.self, configurations: readOnly, environment: directory.environment(seed: 3))
        }
        #expect(missingTable?.description.contains("Note") == true)
        // The file is untouched, and opens read-only with its own version of the schema.
        let columns = try rawConnection(directory.storeURL(), readOnly: true).rows("SELECT name FROM pragma_table_info('Pin')")
        #expect(columns.count == 2)
        let container = try ModelContainer(for: PinV1.self, configurations: readOnly, environment: directory.environment(seed: 4))
        #expect(try ModelContext(container).fetch(PinV1.self).map(\.title) == ["v1"])
    }
}
