import Foundation

/// A model type: a value type (usually a `Codable` struct) whose instances are records of one entity.
///
/// Replica has no `@Model` macro; a model declares its entity once, with key paths, so storage, predicates and sync
/// can read and write its properties without reflection:
///
/// ```swift
/// struct Trip: PersistentModel, Codable {
///     var id = UUID.unassigned
///     var name: String = ""
///     var destination: String?
///     var items: [Reference<BucketListItem>] = []
///
///     static let entity = ModelEntity<Trip>([
///         .attribute("name", \.name, default: "", options: .preserveValueOnDeletion),
///         .attribute("destination", \.destination),
///         .toMany("items", \.items, inverse: "trip", deleteRule: .cascade),
///     ])
/// }
/// ```
///
/// Property names must equal attribute names when the default (`Decodable`) row decoding is used.
/// A type can instead implement ``init(row:)`` by hand for the fastest reads. Writes read the entity's key paths;
/// a model that adopts ``CodablePersistentModel`` is written through its `Encodable` conformance instead.
public protocol PersistentModel: Sendable, Identifiable where ID == UUID {
    /// The entity (record type) name: the SQLite table and the cloud record type. Defaults to the type's name.
    static var entityName: String { get }
    /// The entity description: name, attributes and relationships bound to key paths.
    static var entity: ModelEntity<Self> { get }
    /// The record ID. ``UUID/unassigned`` (the nil UUID) until the model is inserted; ``ModelContext/insert(_:)``
    /// assigns a time-ordered ID from the environment.
    var id: UUID { get set }
    /// Creates a model from a stored row. The default implementation (for `Decodable` models) decodes through
    /// `init(from:)`; a hand-written one reads fields by position or name from `row`.
    /// - Throws: ``ValueConversionError`` when a stored value does not fit the property's type.
    init(row: ModelRow) throws
}

extension PersistentModel {
    public static var entityName: String { String(describing: Self.self) }

    /// The type-erased schema entity of this model type.
    public static var schemaEntity: Schema.Entity { entity.schemaEntity }

    /// The model's identifier: its entity name and record ID.
    public var persistentModelID: PersistentIdentifier {
        PersistentIdentifier(entityName: Self.entity.name, id: id)
    }
}

extension PersistentModel where Self: Decodable {
    public init(row: ModelRow) throws {
        try self.init(from: ModelRowDecoder(row: row))
    }
}

extension UUID {
    /// The nil UUID (all zero bits, RFC 9562 §5.9): the ID of a model that has not been inserted yet.
    public static let unassigned = UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
}

/// Identifies one record: the entity (record type) and the record ID.
public struct PersistentIdentifier: Hashable, Comparable, Sendable, Codable, CustomStringConvertible {
    /// The entity name.
    public let entityName: String
    /// The globally unique record ID.
    public let id: UUID

    public init(entityName: String, id: UUID) {
        self.entityName = entityName
        self.id = id
    }

    /// Orders by entity name, then by ID bytes (time order for IDs made by ``ReplicaEnvironment/makeIdentifier()``).
    public static func < (lhs: PersistentIdentifier, rhs: PersistentIdentifier) -> Bool {
        if lhs.entityName != rhs.entityName { return lhs.entityName < rhs.entityName }
        return lhs.id.bytesPrecede(rhs.id)
    }

    public var description: String { "\(entityName)/\(id.uuidString.lowercased())" }

    /// Hashes the record ID only: IDs are globally unique, so the entity name adds no information, and hashing 16
    /// bytes instead of both keeps the context's per-record dictionaries cheap. (Equality still compares both.)
    public func hash(into hasher: inout Hasher) {
        hasher.combine(id)
    }
}

/// A reference from one model to a record of `Target`: how relationships are held in value-type models.
/// Encodes as the target's record ID.
public struct Reference<Target: PersistentModel>: Hashable, Sendable, Codable, CustomStringConvertible {
    /// The referenced record's ID.
    public var id: UUID

    public init(_ id: UUID) { self.id = id }

    /// A reference to `model`, which must already have an ID (be inserted).
    public init(_ model: Target) {
        precondition(model.id != .unassigned, "Replica: cannot reference a \(Target.self) that has not been inserted")
        self.id = model.id
    }

    /// The referenced record's identifier.
    public var persistentModelID: PersistentIdentifier {
        PersistentIdentifier(entityName: Target.entity.name, id: id)
    }

    public init(from decoder: any Decoder) throws {
        self.id = try decoder.singleValueContainer().decode(UUID.self)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(id)
    }

    public var description: String { persistentModelID.description }
}

/// The dynamic form of one record that storage, history and sync share: its entity, ID and field values in the
/// entity's ``Schema/Entity/fieldNames`` order (attributes, then to-one references as 16-byte ID blobs).
public struct Snapshot: Hashable, Sendable {
    public var entityName: String
    public var id: UUID
    public var values: [SQLiteValue]

    public init(entityName: String, id: UUID, values: [SQLiteValue]) {
        self.entityName = entityName
        self.id = id
        self.values = values
    }

    public var persistentModelID: PersistentIdentifier { PersistentIdentifier(entityName: entityName, id: id) }
}
