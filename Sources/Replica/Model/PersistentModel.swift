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
/// Property names must equal attribute names when the default (`Decodable`) row decoding is used. A container opened
/// with `Schema([Trip.self, …])` checks each entity description against its type and throws
/// ``ReplicaError/invalidModelDeclaration(_:)`` for a mismatch (a property with no attribute, an attribute no property
/// reads, another type, a default the property cannot read, a relationship declared as an attribute or the reverse,
/// an optional attribute on a required property, a field bound to the wrong key path). ``ModelEntity/init(defaults:_:uniquenessConstraints:originalName:)``
/// takes attribute defaults from the type's initial values.
/// A type can instead implement ``init(row:)`` by hand for the fastest reads. Writes read the entity's key paths;
/// a model that adopts ``CodablePersistentModel`` is written through its `Encodable` conformance instead.
public protocol PersistentModel: Sendable, Identifiable where ID == UUID {
    /// The entity (record type) name: the SQLite table and the cloud record type. Defaults to the type's name.
    static var entityName: String { get }
    /// The entity description: name, attributes and relationships bound to key paths.
    static var entity: ModelEntity<Self> { get }
    /// The record ID. ``FoundationEssentials/UUID/unassigned`` (the nil UUID) until the model is inserted; ``ModelContext/insert(_:)``
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
        // As two words: `UUID`'s own hash feeds its 16 bytes through `combine(bytes:)`, several times slower.
        let (high, low) = withUnsafeBytes(of: id.uuid) { ($0.loadUnaligned(as: UInt64.self), $0.loadUnaligned(fromByteOffset: 8, as: UInt64.self)) }
        hasher.combine(high)
        hasher.combine(low)
    }
}

/// A reference from one model to a record of `Target`: how relationships are held in value-type models.
/// Encodes as the target's record ID; two references are equal when they name the same record.
///
/// **Reaching through a reference.** `Reference` has dynamic member lookup over `Target`'s properties, so predicates
/// can follow relationships as they do in SwiftData: `#Predicate<BucketListItem> { $0.trip?.name == "Iceland" }`,
/// `#Predicate<Trip> { $0.items.contains { $0.isDone } }`. Replica translates such predicates to SQL (joins and
/// subqueries) and never needs the target in memory for that.
///
/// **Reading through a reference in Swift** (`item.trip?.name`) needs the target's value, found in this order:
/// 1. the copy the reference carries (``resolved``): `init(_ model:)` carries the given model; a fetch carries the
///    targets of ``FetchDescriptor/relationshipKeyPathsForPrefetching`` (one query per relationship for the whole
///    result: the fast path) and of the relationships an in-memory predicate or sort needs;
/// 2. otherwise the target is **loaded on demand** through the context that fetched the model, while that context is
///    alive: one query the first time, then cached for that context (until its next ``ModelContext/save()``). The
///    load reads the store's saved state (not the context's unsaved changes) through a connection of its own, behind
///    a lock, so a model may be read on any task or actor — models stay `Sendable` values;
/// 3. otherwise there is no value: the reference was made from an ID, decoded, or its context is gone — or the
///    target was deleted.
///
/// Member reads therefore return optionals and never trap: `item.trip?.name` is `String?`, `nil` when the target
/// cannot be had (an optional property stays singly optional: `item.trip?.destination` is `String?`). Chains go on
/// with `?.` (`item.trip?.name?.count`, also in predicates). ``loadTarget()`` says why a target is missing (it
/// throws ``ReplicaError/noContextForReference(_:)`` or a storage error, and returns `nil` only for a target that
/// does not exist); ``load(in:)`` loads through a context of the caller's choosing, unsaved changes included.
@dynamicMemberLookup
public struct Reference<Target: PersistentModel>: Hashable, Sendable, Codable, CustomStringConvertible {
    /// The referenced record's ID.
    public var id: UUID
    /// The carried target or the loader of the context that fetched the reference. Not part of equality, hashing or
    /// coding.
    private var state: ReferenceState<Target>?

    /// A reference to the record `id` (unresolved, with no context to load the target from).
    public init(_ id: UUID) {
        self.id = id
        self.state = nil
    }

    /// A reference to `id` whose target loads on demand through `loader` (what fetches hand out).
    init(_ id: UUID, loader: (any ReferenceLoading)?) {
        self.id = id
        self.state = loader.map(ReferenceState.loadable)
    }

    /// A reference to `model`, which must already have an ID (be inserted). The reference is resolved with `model`
    /// as it is now (a copy: later changes to `model` are not seen through the reference).
    public init(_ model: Target) {
        precondition(model.id != .unassigned, "Replica: cannot reference a \(Target.self) that has not been inserted")
        self.id = model.id
        self.state = .resolved(ResolvedTarget(model))
    }

    /// The referenced model carried by this reference (loaded by prefetching, or given to `init(_ model:)`), or
    /// `nil` when it carries none. Never reads the store (see ``loadTarget()``).
    public var resolved: Target? {
        if case let .resolved(box)? = state { return box.value }
        return nil
    }

    /// The referenced model: the carried one (``resolved``), else loaded through the context that fetched this
    /// reference (one query by ID the first time, then cached for that context until its next save).
    /// - Returns: the target, or `nil` when no record `id` exists (it was deleted, or never saved).
    /// - Throws: ``ReplicaError/noContextForReference(_:)`` when the reference carries no target and no live context
    ///   to load it from (made from an ID, decoded, or its context is gone); ``SQLiteError`` or
    ///   ``ReplicaError/valueConversion(_:)`` when reading the store fails.
    public func loadTarget() throws -> Target? {
        switch state {
        case let .resolved(box)?: return box.value
        case let .loadable(loader)?: return try loader.target(Target.self, id: id)
        case nil: throw ReplicaError.noContextForReference(persistentModelID)
        }
    }

    /// A copy of this reference resolved with `model` (whose ID must equal ``id``).
    func resolving(_ model: Target) -> Reference {
        var copy = self
        copy.state = .resolved(ResolvedTarget(model))
        return copy
    }

    /// Lets an unresolved reference load its target through `loader` (a resolved one keeps its target).
    mutating func attach(_ loader: any ReferenceLoading) {
        if state == nil { state = .loadable(loader) }
    }

    /// A property of the referenced model (see the type's documentation for where the target comes from).
    ///
    /// In predicates this is how relationships are followed (`$0.trip?.name`); Replica translates it to SQL.
    /// In Swift it reads the carried target, else loads it through the fetching context; `nil` when there is no
    /// target to read (``loadTarget()`` says why). Never traps.
    /// Complexity: O(1) for a carried or cached target; one query by ID for the first load.
    public subscript<Value>(dynamicMember keyPath: KeyPath<Target, Value>) -> Value? {
        guard let model = (try? loadTarget()) ?? nil else { return nil }
        return model[keyPath: keyPath]
    }

    /// An optional property of the referenced model, flattened: `nil` when the target has no value or there is no
    /// target (see ``subscript(dynamicMember:)-(KeyPath<Target,Value>)``).
    public subscript<Value>(dynamicMember keyPath: KeyPath<Target, Value?>) -> Value? {
        guard let model = (try? loadTarget()) ?? nil else { return nil }
        return model[keyPath: keyPath]
    }

    /// The referenced record's identifier.
    public var persistentModelID: PersistentIdentifier {
        PersistentIdentifier(entityName: Target.entity.name, id: id)
    }

    public static func == (lhs: Reference, rhs: Reference) -> Bool { lhs.id == rhs.id }

    public func hash(into hasher: inout Hasher) { hasher.combine(id) }

    public init(from decoder: any Decoder) throws {
        self.id = try decoder.singleValueContainer().decode(UUID.self)
        self.state = nil
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(id)
    }

    public var description: String { persistentModelID.description }
}

/// What a ``Reference`` carries besides its ID: its target, or the loader of the context that fetched it.
private enum ReferenceState<Target: PersistentModel>: Sendable {
    case resolved(ResolvedTarget<Target>)
    case loadable(any ReferenceLoading)
}

/// The immutable resolved target of a ``Reference`` (a class so that a model may hold references to its own type).
final class ResolvedTarget<Target: PersistentModel>: Sendable {
    let value: Target
    init(_ value: Target) { self.value = value }
}

/// The dynamic form of one record that storage, history and sync share: its entity, ID and field values in the
/// entity's ``Schema/Entity/fieldNames`` order (attributes, then to-one references as 16-byte ID blobs).
public struct Snapshot: Hashable, Sendable {
    public var entityName: String
    public var id: UUID
    public var values: [SQLiteValue]
    /// Members of the entity's to-many relationships, in the order the entity declares its to-many relationships,
    /// or empty when not carried (snapshots read back from storage, history or sync).
    ///
    /// Saving writes the members of many-to-many relationships (stored in a link table) from here; one-to-many
    /// members are derived from the inverse to-one references and are not written from here.
    public var toManyMembers: [[UUID]]

    public init(entityName: String, id: UUID, values: [SQLiteValue], toManyMembers: [[UUID]] = []) {
        self.entityName = entityName
        self.id = id
        self.values = values
        self.toManyMembers = toManyMembers
    }

    public var persistentModelID: PersistentIdentifier { PersistentIdentifier(entityName: entityName, id: id) }
}
