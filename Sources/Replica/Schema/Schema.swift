import Foundation

/// The description of every entity a container knows: their attributes, relationships and options, with a version.
///
/// A schema is plain data (`Codable`, `Hashable`): it is what a store records about itself, what the additive-only
/// gate of synced stores compares, and what a ``ModelConfiguration`` selects a subset of. Build it from model types
/// (`Schema([Trip.self, BucketListItem.self])`) or from entity descriptions.
public struct Schema: Sendable, Hashable, Codable {
    /// A semantic version of the schema (SwiftData's `Schema.Version`).
    public struct Version: Sendable, Hashable, Codable, Comparable, CustomStringConvertible {
        public var major: Int
        public var minor: Int
        public var patch: Int

        public init(_ major: Int, _ minor: Int, _ patch: Int) {
            self.major = major
            self.minor = minor
            self.patch = patch
        }

        public static func < (lhs: Version, rhs: Version) -> Bool {
            (lhs.major, lhs.minor, lhs.patch) < (rhs.major, rhs.minor, rhs.patch)
        }

        public var description: String { "\(major).\(minor).\(patch)" }

        /// Whether a store can record this version (`replica_metadata['schema_version']`): no part negative or longer
        /// than 18 digits.
        var isRecordable: Bool {
            [major, minor, patch].allSatisfy { (0...999_999_999_999_999_999).contains($0) }
        }

        /// Why a store cannot record this version (see ``isRecordable``).
        var unrecordableReason: String {
            "schema version \(self) cannot be recorded in a store: each part of a version is a number from 0 to 999999999999999999"
        }
    }

    /// The schema's version identifier.
    public var version: Version
    /// The entities, in declaration order.
    public private(set) var entities: [Entity]
    /// Where the entity descriptions of the model types this schema was built from disagree with the types
    /// (``ModelDeclarationMismatch``); empty for a schema of explicit entity descriptions or a decoded one. Found when
    /// the schema is built from model types, reported when a container opens. Not part of equality or coding.
    var declarationMismatches: [ModelDeclarationMismatch] = []
    /// Whether the schema is a ``VersionedSchema``'s (``init(versionedSchema:)``, ``VersionedSchema/schema``): a
    /// store a container creates from it records its version, so a migration plan opening the store later knows it is
    /// at that version already. Not part of equality or coding.
    var isVersioned = false

    private enum CodingKeys: String, CodingKey { case version, entities }

    public static func == (lhs: Schema, rhs: Schema) -> Bool {
        lhs.version == rhs.version && lhs.entities == rhs.entities
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(version)
        hasher.combine(entities)
    }

    /// A schema of explicit entity descriptions.
    public init(entities: [Entity], version: Version = Version(1, 0, 0)) {
        self.entities = entities
        self.version = version
    }

    /// The entity named `name`, if the schema has one. Complexity: O(n) in the number of entities.
    public func entity(named name: String) -> Entity? {
        entities.first { $0.name == name }
    }

    /// The names of all entities, in declaration order.
    public var entityNames: [String] { entities.map(\.name) }
}

// MARK: - Entity

extension Schema {
    /// One entity (a record type): its name, attributes, relationships and uniqueness constraints.
    public struct Entity: Sendable, Hashable, Codable {
        /// The entity name. It is also the SQLite table name and the cloud record type.
        public var name: String
        /// Stored attributes, in declaration order.
        public var attributes: [Attribute]
        /// Relationships, in declaration order.
        public var relationships: [Relationship]
        /// Compound uniqueness constraints (SwiftData's `#Unique`): each inner array is a set of attribute names whose
        /// combined values must be unique (inserts of a taken key upsert, as for ``Attribute/Options/unique``).
        /// Single-attribute `.unique` options are listed here too.
        public var uniquenessConstraints: [[String]]
        /// The name the entity had in an earlier schema version: a local store with a table of that name and none of
        /// ``name`` renames the table when it opens (`ALTER TABLE … RENAME TO`), keeping its records, and moves the
        /// links of its many-to-many relationships to the link tables of the new name. Synced entities cannot declare
        /// one (the cloud record type never changes).
        public var originalName: String?

        public init(name: String, attributes: [Attribute], relationships: [Relationship] = [], uniquenessConstraints: [[String]] = [],
                    originalName: String? = nil) {
            self.name = name
            self.originalName = originalName
            self.attributes = attributes
            self.relationships = relationships
            var constraints = uniquenessConstraints
            for attribute in attributes where attribute.options.contains(.unique) && !constraints.contains([attribute.name]) {
                constraints.append([attribute.name])
            }
            self.uniquenessConstraints = constraints
        }

        /// The attribute named `name`, if any.
        public func attribute(named name: String) -> Attribute? { attributes.first { $0.name == name } }

        /// The relationship named `name`, if any.
        public func relationship(named name: String) -> Relationship? { relationships.first { $0.name == name } }

        /// The stored fields of a record of this entity, in storage order: every attribute, then every to-one
        /// relationship (stored as the referenced record's ID). A ``Snapshot``'s values follow this order.
        public var fieldNames: [String] {
            attributes.map(\.name) + relationships.filter { !$0.isToMany }.map(\.name)
        }

        /// The to-one relationships, in declaration order.
        public var toOneRelationships: [Relationship] { relationships.filter { !$0.isToMany } }
    }
}

// MARK: - Attribute

extension Schema {
    /// The type of an attribute and how it is stored in SQLite.
    ///
    /// | type | SQLite storage |
    /// |---|---|
    /// | string | TEXT |
    /// | integer | INTEGER (64-bit) |
    /// | double | REAL |
    /// | bool | INTEGER 0 or 1 |
    /// | date | REAL, seconds since 1970-01-01T00:00:00Z |
    /// | data | BLOB |
    /// | uuid | BLOB, 16 bytes |
    /// | url | TEXT, the absolute string |
    /// | composite | TEXT, JSON with sorted keys (queryable with SQLite's JSON functions) |
    public enum AttributeType: String, Sendable, Hashable, Codable, CaseIterable {
        case string, integer, double, bool, date, data, uuid, url, composite

        /// The SQLite column type affinity used for this attribute type.
        public var sqliteDeclaredType: String {
            switch self {
            case .string, .url, .composite: return "TEXT"
            case .integer, .bool: return "INTEGER"
            case .double, .date: return "REAL"
            case .data, .uuid: return "BLOB"
            }
        }
    }

    /// A stored attribute.
    public struct Attribute: Sendable, Hashable, Codable {
        /// Options of an attribute (SwiftData's `Schema.Attribute.Option`).
        public struct Options: OptionSet, Sendable, Hashable, Codable {
            public let rawValue: Int
            public init(rawValue: Int) { self.rawValue = rawValue }

            /// No two live records of the entity may share the value, checked on save: an insert of a value an existing
            /// record holds updates that record instead (an upsert, as in SwiftData; see
            /// ``ModelContext/resolvedIdentifier(for:)``), an update to a taken value fails the save. See DESIGN.md for
            /// synced stores (duplicates made concurrently on several devices resolve after sync).
            public static let unique = Options(rawValue: 1 << 0)
            /// The value stays readable in the tombstone after deletion (history and sync).
            public static let preserveValueOnDeletion = Options(rawValue: 1 << 1)
            /// The value is sealed with XChaCha20-Poly1305 before it enters a cloud record.
            public static let allowsCloudEncryption = Options(rawValue: 1 << 2)
            /// The value is large and kept outside the row: in a store file (local or synced), each value is a file
            /// beside the store (`<store file>-assets/<sha256>`), the row holding its reference. A `Data` property is
            /// read whole when the model is fetched (leave the attribute out of ``FetchDescriptor/propertiesToFetch`` to
            /// skip it); declare the property ``ExternalData`` instead to fetch a handle and read the bytes only when
            /// needed, in chunks. In-memory stores keep the bytes in their rows, behind the same API. A synced store
            /// sends the value as an asset, outside its record (<doc:Syncing>). Only for `Data` attributes.
            public static let externalStorage = Options(rawValue: 1 << 3)
        }

        /// The attribute name: the model property name, column name and cloud field name.
        public var name: String
        /// The value type.
        public var type: AttributeType
        /// Whether the attribute may hold no value (Swift `Optional`).
        public var isOptional: Bool
        /// The declared default, stored form. Used for records that lack the field (e.g. created by an older app
        /// version). `nil` means "no default declared".
        public var defaultValue: SQLiteValue?
        /// The attribute's options.
        public var options: Options
        /// The name the attribute had in an earlier schema version (SwiftData's `@Attribute(originalName:)`): a local
        /// store whose table has a column of that name and none of ``name`` renames the column when it opens
        /// (`ALTER TABLE … RENAME COLUMN`), keeping its values. Synced entities cannot declare one: the cloud field
        /// name never changes (see ``SchemaViolation/syncedRename(entity:member:originalName:)``).
        public var originalName: String?

        public init(name: String, type: AttributeType, isOptional: Bool, defaultValue: SQLiteValue? = nil, options: Options = [],
                    originalName: String? = nil) {
            self.name = name
            self.type = type
            self.isOptional = isOptional
            self.defaultValue = defaultValue
            self.options = options
            self.originalName = originalName
        }

        /// The options that change what the cloud holds for the attribute: cloud encryption (sealed values) and
        /// external storage. They are part of the zone's union schema, and cannot change for an existing attribute
        /// (as in CloudKit's production schema); see ``SchemaDifference/attributeOptionChanged(entity:attribute:option:zone:)``.
        public static let cloudOptions: Options = [.allowsCloudEncryption, .externalStorage]

        private enum CodingKeys: String, CodingKey { case name, type, isOptional, defaultValue, options, originalName }

        /// Decodes an attribute; a description without `options` (a union schema written by a writer that did not
        /// record them) has none — no option is what such a writer uploaded (see Specs R13).
        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            name = try container.decode(String.self, forKey: .name)
            type = try container.decode(AttributeType.self, forKey: .type)
            isOptional = try container.decode(Bool.self, forKey: .isOptional)
            defaultValue = try container.decodeIfPresent(SQLiteValue.self, forKey: .defaultValue)
            options = try container.decodeIfPresent(Options.self, forKey: .options) ?? []
            originalName = try container.decodeIfPresent(String.self, forKey: .originalName)
        }
    }
}

// MARK: - Relationship

extension Schema {
    /// What happens to related records when a record is deleted (SwiftData's `Schema.Relationship.DeleteRule`).
    public enum DeleteRule: String, Sendable, Hashable, Codable, CaseIterable {
        /// The references to the deleted record are cleared.
        case nullify
        /// The related records are deleted too.
        case cascade
        /// The delete is refused while related records exist (``ModelValidationFailure/deleteDenied(entity:relationship:count:)``).
        case deny
        /// Nothing is done; references may dangle.
        case noAction
    }

    /// A relationship to records of another (or the same) entity. References are record IDs.
    public struct Relationship: Sendable, Hashable, Codable {
        /// The relationship name (a property of the model; for to-one, also the column holding the referenced ID).
        public var name: String
        /// The entity the relationship points to.
        public var destination: String
        /// The name of the inverse relationship on the destination, if any.
        public var inverse: String?
        /// `true` for to-many.
        public var isToMany: Bool
        /// The delete rule applied to the related records when a record of this entity is deleted.
        public var deleteRule: DeleteRule
        /// For to-one: whether the reference may be absent. To-many relationships may always be empty.
        public var isOptional: Bool

        public init(name: String, destination: String, inverse: String? = nil, isToMany: Bool,
                    deleteRule: DeleteRule = .nullify, isOptional: Bool = true) {
            self.name = name
            self.destination = destination
            self.inverse = inverse
            self.isToMany = isToMany
            self.deleteRule = deleteRule
            self.isOptional = isOptional
        }
    }
}
