// The schema of a simulation: entities with the version each element appeared in, so a device can run an older
// app version (an older schema), and the built-in seed schemas.

import Foundation
import Replica

/// A versioned schema: every entity, attribute and relationship names the schema version that added it, so the
/// simulator can open devices that run older app versions. Additive only, as synced stores require, except that an
/// attribute may be renamed in a later version (``Attribute/renamedFrom``).
public struct SimulationSchema: Codable, Hashable, Sendable {
    /// One attribute.
    public struct Attribute: Codable, Hashable, Sendable {
        public var name: String
        /// `string`, `integer`, `double`, `bool`, `date` or `data`.
        public var type: Schema.AttributeType
        public var optional: Bool
        /// The declared default in stored form (`nil`: none).
        public var defaultValue: SQLiteValue?
        /// `unique`, `preserveValueOnDeletion`, `allowsCloudEncryption`, `externalStorage`.
        public var options: [String]
        /// Options the attribute gains in a later schema version than its own, by option: an app version that turns on
        /// cloud encryption (say) for an attribute that existed before. `nil`: none (left out of the canonical JSON).
        public var optionsSince: [String: Int]?
        /// The schema version that added the attribute.
        public var since: Int
        /// The name the attribute had before schema version ``renamedSince`` (`nil`: never renamed; left out of the
        /// canonical JSON). App versions before it call the attribute by this name, later ones by ``name``. In a
        /// local-only store a later version declares ``name`` with this as its original name
        /// (`Schema.Attribute.originalName`: the store renames the column when it opens). In a synced store the
        /// cloud field keeps this name forever: the library refuses an original name on a synced attribute
        /// (`SchemaViolation.syncedRename`) and an app renames only its Swift property,
        /// so every version declares this name to the library (see ``storedName(version:locallyRenamed:)``).
        public var renamedFrom: String?
        /// The schema version whose app calls the attribute ``name`` (`nil` without ``renamedFrom``).
        public var renamedSince: Int?
        /// The schema version that removed the attribute (`nil`: never removed; left out of the canonical JSON). Only
        /// attributes of local-only stores: a migration plan's lightweight stage drops its column.
        public var droppedSince: Int? = nil

        /// Whether schema `version` declares the attribute.
        public func exists(in version: Int) -> Bool { since <= version && droppedSince.map { version < $0 } ?? true }

        public init(_ name: String, _ type: Schema.AttributeType, optional: Bool = false, default defaultValue: SQLiteValue? = nil,
                    options: [String] = [], optionsSince: [String: Int]? = nil, since: Int = 1,
                    renamedFrom: String? = nil, renamedSince: Int? = nil) {
            self.name = name
            self.type = type
            self.optional = optional
            self.defaultValue = defaultValue
            self.options = options
            self.optionsSince = optionsSince
            self.since = since
            self.renamedFrom = renamedFrom
            self.renamedSince = renamedSince
        }

        /// The name the app of schema `version` calls the attribute by.
        public func appName(version: Int) -> String {
            guard let renamedFrom, let renamedSince, version < renamedSince else { return name }
            return renamedFrom
        }

        /// The cloud field name: the first name the attribute had (what every app version's synced records carry).
        public var cloudName: String { renamedFrom ?? name }

        /// The name schema `version` declares to the library, with the original name to declare: in a store that
        /// renames locally (`locallyRenamed`, a local-only store), the app's name, with ``renamedFrom`` as original
        /// name once renamed; in a synced store, the cloud name in every version.
        public func storedName(version: Int, locallyRenamed: Bool) -> (name: String, originalName: String?) {
            guard locallyRenamed else { return (cloudName, nil) }
            let name = appName(version: version)
            return (name, name == self.name ? renamedFrom : nil)
        }

        /// The options of the attribute in schema `version`.
        func schemaOptions(version: Int) -> Schema.Attribute.Options {
            var result: Schema.Attribute.Options = []
            let later = (optionsSince ?? [:]).filter { $0.value <= version }.keys.sorted()
            for option in options + later {
                switch option {
                case "unique": result.insert(.unique)
                case "preserveValueOnDeletion": result.insert(.preserveValueOnDeletion)
                case "allowsCloudEncryption": result.insert(.allowsCloudEncryption)
                case "externalStorage": result.insert(.externalStorage)
                default: break
                }
            }
            return result
        }

        static let knownOptions = ["unique", "preserveValueOnDeletion", "allowsCloudEncryption", "externalStorage"]
    }

    /// One relationship. To-many relationships name the to-one inverse that stores the reference.
    public struct Relationship: Codable, Hashable, Sendable {
        public var name: String
        public var destination: String
        public var inverse: String?
        public var toMany: Bool
        public var deleteRule: Schema.DeleteRule
        public var since: Int

        public init(_ name: String, to destination: String, inverse: String?, toMany: Bool,
                    deleteRule: Schema.DeleteRule = .nullify, since: Int = 1) {
            self.name = name
            self.destination = destination
            self.inverse = inverse
            self.toMany = toMany
            self.deleteRule = deleteRule
            self.since = since
        }
    }

    /// One entity.
    public struct Entity: Codable, Hashable, Sendable {
        public var name: String
        public var attributes: [Attribute]
        public var relationships: [Relationship]
        public var since: Int

        public init(_ name: String, attributes: [Attribute], relationships: [Relationship] = [], since: Int = 1) {
            self.name = name
            self.attributes = attributes
            self.relationships = relationships
            self.since = since
        }
    }

    /// The newest schema version (the version of every element's `since` at most).
    public var version: Int
    public var entities: [Entity]

    public init(version: Int, entities: [Entity]) {
        self.version = version
        self.entities = entities
    }

    /// The Replica schema an app at `version` declares: every element added at or before it.
    /// - Parameter localEntities: the entities of local-only stores, whose renamed attributes
    ///   (``Attribute/renamedFrom``) are declared under the app's name of `version` with an original name; every
    ///   other entity's are declared under their cloud name (see ``Attribute/storedName(version:locallyRenamed:)``).
    public func schema(version requested: Int? = nil, localEntities: Set<String> = []) -> Schema {
        let version = requested ?? self.version
        let entities = self.entities.filter { $0.since <= version }.map { entity in
            Schema.Entity(
                name: entity.name,
                attributes: entity.attributes.filter { $0.exists(in: version) }.map {
                    let stored = $0.storedName(version: version, locallyRenamed: localEntities.contains(entity.name))
                    return Schema.Attribute(name: stored.name, type: $0.type, isOptional: $0.optional, defaultValue: $0.defaultValue,
                                            options: $0.schemaOptions(version: version), originalName: stored.originalName)
                },
                relationships: entity.relationships.filter { $0.since <= version }.map {
                    Schema.Relationship(name: $0.name, destination: $0.destination, inverse: $0.inverse, isToMany: $0.toMany,
                                        deleteRule: $0.deleteRule, isOptional: true)
                })
        }
        return Schema(entities: entities, version: Schema.Version(version, 0, 0))
    }

    /// The entity named `name`.
    public func entity(named name: String) -> Entity? { entities.first { $0.name == name } }

    /// The union of several schemas (entity names must be distinct); the version is the highest.
    static func merging(_ parts: [SimulationSchema]) -> SimulationSchema {
        SimulationSchema(version: parts.map(\.version).max() ?? 1, entities: parts.flatMap(\.entities))
    }
}

// MARK: - Seed schemas

extension SimulationSchema {
    /// The built-in seed schemas by name.
    public static let seeds: [(name: String, summary: String, schema: SimulationSchema)] = [
        ("trips", "trips with bucket-list items (cascade) and accommodations (nullify, added in v2)", trips),
        ("people", "people with addresses (cascade) and a unique email", people),
        ("notes", "notes with an encrypted body and tag and an external-storage attachment", notes),
        ("posts", "synced posts", posts),
        ("drafts", "local drafts with a unique slug (for local-only stores)", drafts),
        ("albums", "albums and photos linked many-to-many, each with a unique slug", albums),
    ]

    /// The seed schema called `name`.
    public static func seed(named name: String) -> SimulationSchema? { seeds.first { $0.name == name }?.schema }

    /// Trips (v2): `Trip` with bucket-list items (cascade) and accommodations (nullify). Version 1 lacks
    /// `Trip.budget`, `BucketListItem.priority` and the whole `Accommodation` entity.
    public static let trips = SimulationSchema(version: 2, entities: [
        Entity("Trip", attributes: [
            Attribute("name", .string, default: .text(""), options: ["preserveValueOnDeletion"]),
            Attribute("destination", .string, optional: true),
            Attribute("startDate", .date, optional: true),
            Attribute("budget", .integer, default: .integer(100), since: 2),
        ], relationships: [
            Relationship("items", to: "BucketListItem", inverse: "trip", toMany: true, deleteRule: .cascade),
            Relationship("accommodations", to: "Accommodation", inverse: "trip", toMany: true, deleteRule: .nullify, since: 2),
        ]),
        Entity("BucketListItem", attributes: [
            Attribute("title", .string, default: .text("")),
            Attribute("isDone", .bool, default: .integer(0)),
            Attribute("notes", .string, optional: true),
            Attribute("priority", .integer, default: .integer(1), since: 2),
        ], relationships: [
            Relationship("trip", to: "Trip", inverse: "items", toMany: false),
        ]),
        Entity("Accommodation", attributes: [
            Attribute("name", .string, default: .text("")),
            Attribute("nights", .integer, default: .integer(1)),
            Attribute("rating", .integer, default: .integer(3)),
        ], relationships: [
            Relationship("trip", to: "Trip", inverse: "accommodations", toMany: false),
        ], since: 2),
    ])

    /// People with addresses (cascade) and a unique, optional email.
    public static let people = SimulationSchema(version: 1, entities: [
        Entity("Person", attributes: [
            Attribute("name", .string, default: .text(""), options: ["preserveValueOnDeletion"]),
            Attribute("email", .string, optional: true, options: ["unique"]),
            Attribute("age", .integer, optional: true),
        ], relationships: [
            Relationship("addresses", to: "Address", inverse: "person", toMany: true, deleteRule: .cascade),
        ]),
        Entity("Address", attributes: [
            Attribute("street", .string, default: .text("")),
            Attribute("city", .string, default: .text("")),
        ], relationships: [
            Relationship("person", to: "Person", inverse: "addresses", toMany: false),
        ]),
    ])

    /// Notes with encrypted fields and an external-storage attachment.
    public static let notes = SimulationSchema(version: 1, entities: [
        Entity("Note", attributes: [
            Attribute("title", .string, default: .text(""), options: ["preserveValueOnDeletion"]),
            Attribute("body", .string, optional: true, options: ["allowsCloudEncryption"]),
            Attribute("secretTag", .string, optional: true, options: ["allowsCloudEncryption"]),
            Attribute("attachment", .data, optional: true, options: ["externalStorage"]),
            Attribute("pinned", .bool, default: .integer(0)),
        ]),
    ])

    /// Synced posts.
    public static let posts = SimulationSchema(version: 1, entities: [
        Entity("Post", attributes: [
            Attribute("title", .string, default: .text(""), options: ["preserveValueOnDeletion"]),
            Attribute("body", .string, default: .text("")),
            Attribute("publishedAt", .date, optional: true),
            Attribute("likes", .integer, default: .integer(0)),
        ]),
    ])

    /// Albums and photos linked many-to-many (`Album.photos` ↔ `Photo.albums`; albums own the link sets), each with an
    /// optional unique slug (so duplicates of either end are resolved).
    public static let albums = SimulationSchema(version: 1, entities: [
        Entity("Album", attributes: [
            Attribute("title", .string, default: .text(""), options: ["preserveValueOnDeletion"]),
            Attribute("slug", .string, optional: true, options: ["unique"]),
        ], relationships: [
            Relationship("photos", to: "Photo", inverse: "albums", toMany: true),
        ]),
        Entity("Photo", attributes: [
            Attribute("caption", .string, default: .text("")),
            Attribute("slug", .string, optional: true, options: ["unique"]),
            Attribute("rating", .integer, default: .integer(0)),
        ], relationships: [
            Relationship("albums", to: "Album", inverse: "photos", toMany: true),
        ]),
    ])

    /// Local drafts (unique slug).
    public static let drafts = SimulationSchema(version: 1, entities: [
        Entity("Draft", attributes: [
            Attribute("text", .string, default: .text("")),
            Attribute("slug", .string, optional: true, options: ["unique"]),
            Attribute("updatedAt", .date, optional: true),
        ]),
    ])
}
