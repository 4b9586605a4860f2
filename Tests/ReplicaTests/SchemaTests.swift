// Schema: version, entities, attribute types and options, relationships, validation.
import Foundation
import Testing
@testable import Replica

@Suite("Schema")
struct SchemaTests {
    @Test func versionDefaultsAndOrders() {
        let schema = Schema([Trip.self, Item.self])
        #expect(schema.version == Schema.Version(1, 0, 0))
        #expect(Schema([Trip.self], version: Schema.Version(2, 1, 3)).version.description == "2.1.3")
        #expect(Schema.Version(1, 2, 3) < Schema.Version(1, 3, 0))
        #expect(Schema.Version(1, 9, 9) < Schema.Version(2, 0, 0))
        #expect(!(Schema.Version(1, 0, 1) < Schema.Version(1, 0, 0)))
    }

    @Test func entitiesKeepDeclarationOrderAndAreFoundByName() throws {
        let schema = Schema([Trip.self, Item.self, Note.self])
        #expect(schema.entityNames == ["Trip", "Item", "Note"])
        #expect(schema.entity(named: "Item")?.name == "Item")
        #expect(schema.entity(named: "Missing") == nil)
        try schema.validate()
    }

    @Test func everyAttributeTypeMapsToItsSchemaTypeAndStorage() throws {
        let entity = Everything.schemaEntity
        let expected: [(String, String, Schema.AttributeType, String)] = [
            ("string", "optionalString", .string, "TEXT"), ("int", "optionalInt", .integer, "INTEGER"),
            ("double", "optionalDouble", .double, "REAL"), ("bool", "optionalBool", .bool, "INTEGER"),
            ("date", "optionalDate", .date, "REAL"), ("data", "optionalData", .data, "BLOB"),
            ("uuid", "optionalUUID", .uuid, "BLOB"), ("url", "optionalURL", .url, "TEXT"),
            ("address", "optionalAddress", .composite, "TEXT"),
        ]
        for (name, optionalName, type, declared) in expected {
            let required = try #require(entity.attribute(named: name))
            #expect(required.type == type, "\(name)")
            #expect(required.type.sqliteDeclaredType == declared, "\(name)")
            #expect(!required.isOptional, "\(name)")
            let optional = try #require(entity.attribute(named: optionalName))
            #expect(optional.type == type, "\(optionalName)")
            #expect(optional.isOptional, "\(optionalName)")
            #expect(optional.defaultValue == nil)
        }
        #expect(Set(entity.attributes.map(\.type)) == Set(Schema.AttributeType.allCases))
    }

    @Test func defaultValuesAreStoredInTheirStorageForm() throws {
        let entity = Everything.schemaEntity
        #expect(entity.attribute(named: "string")?.defaultValue == .text(""))
        #expect(entity.attribute(named: "int")?.defaultValue == .integer(0))
        #expect(entity.attribute(named: "double")?.defaultValue == .real(0))
        #expect(entity.attribute(named: "bool")?.defaultValue == .integer(0))
        #expect(entity.attribute(named: "date")?.defaultValue == nil)

        struct Defaults: PersistentModel, Codable {
            var id = UUID.unassigned
            var when = Date(timeIntervalSince1970: 0)
            var home = URL(string: "https://example.com/a")!
            var tag = UUID.unassigned
            var place = Address(street: "Main", city: "X")
            var flag = true
            static let entity = ModelEntity<Defaults>([
                .attribute("when", \.when, default: Date(timeIntervalSince1970: 1.5)),
                .attribute("home", \.home, default: URL(string: "https://example.com/a")!),
                .attribute("tag", \.tag, default: UUID(uuidString: "00000000-0000-0000-0000-000000000001")!),
                .attribute("place", \.place, default: Address(street: "Main", city: "X")),
                .attribute("flag", \.flag, default: true),
            ])
        }
        let defaults = Defaults.schemaEntity
        #expect(defaults.attribute(named: "when")?.defaultValue == .real(1.5))
        #expect(defaults.attribute(named: "home")?.defaultValue == .text("https://example.com/a"))
        #expect(defaults.attribute(named: "tag")?.defaultValue == .blob(Data([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1])))
        #expect(defaults.attribute(named: "place")?.defaultValue == .text(#"{"city":"X","street":"Main"}"#))
        #expect(defaults.attribute(named: "flag")?.defaultValue == .integer(1))
        try Schema([Defaults.self]).validate()
    }

    @Test func attributeOptionsReachTheSchema() throws {
        struct Secretive: PersistentModel, Codable {
            var id = UUID.unassigned
            var handle = ""
            var diary = ""
            var photo = Data()
            var title = ""
            static let entity = ModelEntity<Secretive>([
                .attribute("handle", \.handle, default: "", options: .unique),
                .attribute("diary", \.diary, default: "", options: [.allowsCloudEncryption, .preserveValueOnDeletion]),
                .attribute("photo", \.photo, default: Data(), options: .externalStorage),
                .attribute("title", \.title, default: ""),
            ])
        }
        let entity = Secretive.schemaEntity
        #expect(entity.attribute(named: "handle")?.options == .unique)
        #expect(entity.attribute(named: "diary")?.options == [.allowsCloudEncryption, .preserveValueOnDeletion])
        #expect(entity.attribute(named: "photo")?.options == .externalStorage)
        #expect(entity.attribute(named: "title")?.options == [])
        // A single-attribute unique option is also a uniqueness constraint.
        #expect(entity.uniquenessConstraints == [["handle"]])
        // Options are distinct bits.
        let all: [Schema.Attribute.Options] = [.unique, .preserveValueOnDeletion, .allowsCloudEncryption, .externalStorage]
        #expect(Set(all.map(\.rawValue)).count == 4)
        #expect(all.allSatisfy { $0.rawValue.nonzeroBitCount == 1 })
    }

    @Test func compoundUniquenessConstraintsAreKeptBesideSingleOnes() {
        #expect(Membership.schemaEntity.uniquenessConstraints == [["group", "member"]])
        #expect(User.schemaEntity.uniquenessConstraints == [["email"], ["nickname"]])
        // Declaring the single constraint explicitly too does not duplicate it.
        let entity = Schema.Entity(name: "E", attributes: [Schema.Attribute(name: "a", type: .string, isOptional: false, options: .unique)],
                                   uniquenessConstraints: [["a"]])
        #expect(entity.uniquenessConstraints == [["a"]])
    }

    @Test func relationshipsDescribeKindInverseRuleAndOptionality() throws {
        let trip = try #require(Trip.schemaEntity.relationship(named: "items"))
        #expect(trip == Schema.Relationship(name: "items", destination: "Item", inverse: "trip", isToMany: true, deleteRule: .cascade))
        let item = try #require(Item.schemaEntity.relationship(named: "trip"))
        #expect(item == Schema.Relationship(name: "trip", destination: "Trip", inverse: "items", isToMany: false,
                                            deleteRule: .nullify, isOptional: true))
        let owner = try #require(Account.schemaEntity.relationship(named: "owner"))
        #expect(!owner.isOptional && !owner.isToMany)
        #expect(Shelf.schemaEntity.relationship(named: "books")?.deleteRule == .deny)
        #expect(Team.schemaEntity.relationship(named: "players")?.deleteRule == .nullify)
        #expect(Album.schemaEntity.relationship(named: "photos")?.deleteRule == .noAction)
        #expect(Schema.DeleteRule.allCases == [.nullify, .cascade, .deny, .noAction])

        // Stored fields: attributes, then to-one references; to-many relationships are not stored.
        #expect(Document.schemaEntity.fieldNames == ["title", "folder"])
        #expect(Document.schemaEntity.toOneRelationships.map(\.name) == ["folder"])
        #expect(Trip.schemaEntity.fieldNames == ["name", "destination", "rating"])
        for schema in [Schema([Trip.self, Item.self]), Schema([Folder.self, Document.self, Page.self]),
                       Schema([Shelf.self, Book.self]), Schema([Person.self, Account.self])] {
            try schema.validate()
        }
    }

    @Test func schemaIsCodableAndHashable() throws {
        let schema = Schema([Everything.self, Trip.self, Item.self, Membership.self], version: Schema.Version(3, 2, 1))
        let data = try JSONEncoder().encode(schema)
        let decoded = try JSONDecoder().decode(Schema.self, from: data)
        #expect(decoded == schema)
        #expect(decoded.hashValue == schema.hashValue)
        #expect(decoded != Schema([Everything.self, Trip.self, Item.self, Membership.self]))
    }

    @Test func validationReportsEveryViolationAtOnce() {
        let string = { (name: String) in Schema.Attribute(name: name, type: .string, isOptional: false) }
        let schema = Schema(entities: [
            // Fine, but named twice.
            Schema.Entity(name: "Twice", attributes: [string("a")]),
            Schema.Entity(name: "Twice", attributes: [string("a")]),
            // A name starting with a digit, a member named `id`, a duplicated member, a reserved prefix.
            Schema.Entity(name: "9Lives", attributes: [string("id"), string("b"), string("b"), string("replica_x")]),
            // A default of the wrong type, a uniqueness constraint over an unknown attribute.
            Schema.Entity(name: "Defaults", attributes: [
                Schema.Attribute(name: "count", type: .integer, isOptional: false, defaultValue: .text("zero")),
                Schema.Attribute(name: "token", type: .uuid, isOptional: false, defaultValue: .blob(Data([1, 2]))),
                Schema.Attribute(name: "none", type: .string, isOptional: false, defaultValue: .null),
            ], uniquenessConstraints: [["nope"], []]),
            // A relationship to nowhere, an inverse that does not exist, an inverse that points elsewhere.
            Schema.Entity(name: "Links", attributes: [], relationships: [
                Schema.Relationship(name: "ghost", destination: "Ghost", isToMany: false),
                Schema.Relationship(name: "missingInverse", destination: "Twice", inverse: "back", isToMany: false),
                Schema.Relationship(name: "wrongInverse", destination: "Other", inverse: "toTwice", isToMany: false),
            ]),
            Schema.Entity(name: "Other", attributes: [], relationships: [
                Schema.Relationship(name: "toTwice", destination: "Twice", isToMany: false),
            ]),
        ])
        let error = #expect(throws: SchemaValidationError.self) { try schema.validate() }
        let expected: [SchemaViolation] = [
            .duplicateEntity("Twice"),
            .invalidName("9Lives"),
            .duplicateMember(entity: "9Lives", member: "id"),
            .duplicateMember(entity: "9Lives", member: "b"),
            .invalidName("replica_x"),
            .defaultValueTypeMismatch(entity: "Defaults", attribute: "count"),
            .defaultValueTypeMismatch(entity: "Defaults", attribute: "token"),
            .defaultValueTypeMismatch(entity: "Defaults", attribute: "none"),
            .unknownUniquenessAttribute(entity: "Defaults", attribute: "nope"),
            .unknownUniquenessAttribute(entity: "Defaults", attribute: ""),
            .unknownDestination(entity: "Links", relationship: "ghost", destination: "Ghost"),
            .inverseMismatch(entity: "Links", relationship: "missingInverse", inverse: "back"),
            .inverseMismatch(entity: "Links", relationship: "wrongInverse", inverse: "toTwice"),
        ]
        #expect(Set(error?.violations ?? []) == Set(expected))
        #expect(error?.violations.count == expected.count)
        // The description lists every violation.
        for violation in expected {
            #expect(error?.description.contains(violation.description) == true, "\(violation)")
        }
    }

    @Test func namesAreValidated() {
        #expect(SchemaValidator.isValidName("Trip"))
        #expect(SchemaValidator.isValidName("_private9"))
        #expect(!SchemaValidator.isValidName(""))
        #expect(!SchemaValidator.isValidName("1st"))
        #expect(!SchemaValidator.isValidName("with space"))
        #expect(!SchemaValidator.isValidName("quote\"d"))
        #expect(!SchemaValidator.isValidName("Replica_meta"))
        #expect(!SchemaValidator.isValidName("é"))
        #expect(SchemaValidator.isValidName(String(repeating: "a", count: 64)))
        #expect(!SchemaValidator.isValidName(String(repeating: "a", count: 65)))
    }

    @Test func syncedRulesReportEveryViolation() {
        let entities = [
            Schema.Entity(name: "A", attributes: [
                Schema.Attribute(name: "required", type: .string, isOptional: false),
                Schema.Attribute(name: "defaulted", type: .string, isOptional: false, defaultValue: .text("")),
                Schema.Attribute(name: "optional", type: .string, isOptional: true),
            ], relationships: [
                Schema.Relationship(name: "parent", destination: "A", isToMany: false, isOptional: false),
                Schema.Relationship(name: "children", destination: "A", isToMany: true, deleteRule: .deny),
            ]),
        ]
        #expect(SchemaValidator.syncedViolations(of: entities) == [
            .syncedAttributeNeedsDefault(entity: "A", attribute: "required"),
            .syncedRelationshipNotOptional(entity: "A", relationship: "parent"),
            .syncedDenyRule(entity: "A", relationship: "children"),
        ])
        #expect(SchemaValidator.syncedViolations(of: [Trip.schemaEntity, Item.schemaEntity]).isEmpty)
    }
}
