// A lightweight stage drops the attributes the new schema no longer declares from a local store (issue 23: "drop for
// local stores"), leaving no trace of their values in the file; a synced store keeps them (additive-only).
import Foundation
import Testing
@testable import Replica

enum PeopleV1: VersionedSchema {
    static let versionIdentifier = Schema.Version(1, 0, 0)
    static var models: [any PersistentModel.Type] { [Person.self] }

    struct Person: PersistentModel, Codable, Equatable {
        static var entityName: String { "Person" }
        var id = UUID.unassigned
        var name: String = ""
        var ssn: String?
        static let entity = ModelEntity<Person>([
            .attribute("name", \.name, default: ""),
            .attribute("ssn", \.ssn, options: .unique),
        ])
    }
}

/// Version 2 drops the social security number.
enum PeopleV2: VersionedSchema {
    static let versionIdentifier = Schema.Version(2, 0, 0)
    static var models: [any PersistentModel.Type] { [Person.self] }

    struct Person: PersistentModel, Codable, Equatable {
        static var entityName: String { "Person" }
        var id = UUID.unassigned
        var name: String = ""
        static let entity = ModelEntity<Person>([.attribute("name", \.name, default: "")])
    }
}

/// Version 3 declares `ssn` again, with another meaning and type.
enum PeopleV3: VersionedSchema {
    static let versionIdentifier = Schema.Version(3, 0, 0)
    static var models: [any PersistentModel.Type] { [Person.self] }

    struct Person: PersistentModel, Codable, Equatable {
        static var entityName: String { "Person" }
        var id = UUID.unassigned
        var name: String = ""
        var ssn: Int?
        static let entity = ModelEntity<Person>([
            .attribute("name", \.name, default: ""),
            .attribute("ssn", \.ssn),
        ])
    }
}

enum PeoplePlan: SchemaMigrationPlan {
    static var schemas: [any VersionedSchema.Type] { [PeopleV1.self, PeopleV2.self, PeopleV3.self] }
    static var stages: [MigrationStage] {
        [.lightweight(fromVersion: PeopleV1.self, toVersion: PeopleV2.self), .lightweight(fromVersion: PeopleV2.self, toVersion: PeopleV3.self)]
    }
}

enum PeoplePlanToV2: SchemaMigrationPlan {
    static var schemas: [any VersionedSchema.Type] { [PeopleV1.self, PeopleV2.self] }
    static var stages: [MigrationStage] { [.lightweight(fromVersion: PeopleV1.self, toVersion: PeopleV2.self)] }
}

/// Version 1 of a contact whose number is kept in the history of its deletion (preserveValueOnDeletion).
enum ContactsV1: VersionedSchema {
    static let versionIdentifier = Schema.Version(1, 0, 0)
    static var models: [any PersistentModel.Type] { [Contact.self] }

    struct Contact: PersistentModel, Codable, Equatable {
        static var entityName: String { "Contact" }
        var id = UUID.unassigned
        var name: String = ""
        var ssn: String?
        static let entity = ModelEntity<Contact>([
            .attribute("name", \.name, default: "", options: .preserveValueOnDeletion),
            .attribute("ssn", \.ssn, options: .preserveValueOnDeletion),
        ])
    }
}

/// Version 2 drops the number.
enum ContactsV2: VersionedSchema {
    static let versionIdentifier = Schema.Version(2, 0, 0)
    static var models: [any PersistentModel.Type] { [Contact.self] }

    struct Contact: PersistentModel, Codable, Equatable {
        static var entityName: String { "Contact" }
        var id = UUID.unassigned
        var name: String = ""
        static let entity = ModelEntity<Contact>([.attribute("name", \.name, default: "", options: .preserveValueOnDeletion)])
    }
}

enum ContactsPlan: SchemaMigrationPlan {
    static var schemas: [any VersionedSchema.Type] { [ContactsV1.self, ContactsV2.self] }
    static var stages: [MigrationStage] { [.lightweight(fromVersion: ContactsV1.self, toVersion: ContactsV2.self)] }
}

@Suite("Lightweight stages drop removed attributes of local stores")
struct MigrationDropTests {
    let directory = TestDirectory()
    static let secret = "123-45-6789"

    private func columns(_ url: URL) throws -> [SQLiteValue] {
        try rawConnection(url, readOnly: true).rows("SELECT name FROM pragma_table_info('Person') ORDER BY cid").map(\.[0])
    }

    private func fileHolds(_ text: String, _ url: URL) throws -> Bool {
        var found = false
        for suffix in ["", "-wal"] where FileManager.default.fileExists(atPath: url.path + suffix) {
            let bytes = try Data(contentsOf: URL(fileURLWithPath: url.path + suffix))
            if bytes.range(of: Data(text.utf8)) != nil { found = true }
        }
        return found
    }

    private func seed(_ configurations: [ModelConfiguration] = []) throws {
        let v1 = try ModelContainer(for: PeopleV1.schema, migrationPlan: nil, configurations: configurations, environment: directory.environment(seed: 1))
        let context = ModelContext(v1)
        context.insert(PeopleV1.Person(name: "Ada", ssn: Self.secret))
        context.insert(PeopleV1.Person(name: "Grace", ssn: nil))
        try context.save()
    }

    @Test("the column, its index and every trace of its values are gone; the name declared again starts empty, with any type")
    func dropAndRedeclare() throws {
        try seed()
        let url = directory.storeURL()
        #expect(try fileHolds(Self.secret, url))
        do {
            let v2 = try ModelContainer(for: PeopleV2.schema, migrationPlan: PeoplePlanToV2.self, environment: directory.environment(seed: 2))
            #expect(try ModelContext(v2).fetch(PeopleV2.Person.self).map(\.name).sorted() == ["Ada", "Grace"])
        }
        #expect(try columns(url) == [.text("id"), .text("name")])
        #expect(try !fileHolds(Self.secret, url), "the dropped values are still in the store file")
        let indexes = try rawConnection(url, readOnly: true).rows("SELECT name FROM sqlite_master WHERE type = 'index' AND sql LIKE '%ssn%'")
        #expect(indexes.isEmpty)
        // Version 3 declares ssn again as an integer: not a retype of the dropped string, and no old value comes back.
        let v3 = try ModelContainer(for: PeopleV3.schema, migrationPlan: PeoplePlan.self, environment: directory.environment(seed: 3))
        let people = try ModelContext(v3).fetch(PeopleV3.Person.self).sorted { $0.name < $1.name }
        #expect(people.map(\.name) == ["Ada", "Grace"])
        #expect(people.map(\.ssn) == [nil, nil])
    }

    @Test("a synced store keeps the column and its values (its cloud schema is additive-only)")
    func syncedStoreKeeps() throws {
        let synced = [ModelConfiguration(cloudKitDatabase: .private("iCloud.test"))]
        try seed(synced)
        let url = directory.storeURL()
        let v2 = try ModelContainer(for: PeopleV2.schema, migrationPlan: PeoplePlanToV2.self, configurations: synced,
                                    environment: directory.environment(seed: 2))
        #expect(try ModelContext(v2).fetch(PeopleV2.Person.self).count == 2)
        #expect(try columns(url).contains(.text("ssn")))
        #expect(try rawConnection(url, readOnly: true).scalar("SELECT ssn FROM Person WHERE name = 'Ada'") == .text(Self.secret))
    }

    @Test("a deleted record's tombstone in the history log loses the dropped attribute's value too; the others stay (breaker: the value survived the drop there)")
    func dropScrubsHistoryTombstones() throws {
        let url = directory.storeURL()
        do {
            let context = ModelContext(try ModelContainer(for: ContactsV1.schema, migrationPlan: nil, configurations: [],
                                                          environment: directory.environment(seed: 1)))
            let ada = context.insert(ContactsV1.Contact(name: "Ada", ssn: Self.secret))
            try context.save()
            context.delete(ada)
            try context.save()
        }
        #expect(try fileHolds(Self.secret, url))
        let container = try ModelContainer(for: ContactsV2.schema, migrationPlan: ContactsPlan.self, environment: directory.environment(seed: 2))
        #expect(try !fileHolds(Self.secret, url), "the dropped value is still in the store file")
        let tombstones = try rawConnection(url, readOnly: true).rows("SELECT tombstone FROM replica_history_change WHERE tombstone IS NOT NULL")
        #expect(tombstones.count == 1)
        guard case let .text(json)? = tombstones.first?.first else { return }
        #expect(HistoryLog.decodeTombstone(json).values == ["name": .text("Ada")])
        _ = container
    }
}
