import Foundation

/// What a key path of a model (or of a `Reference` to it) names, for predicates and sort descriptors. Internal.
enum QueryMember {
    /// The record ID (`id`, or `Reference.id`).
    case id
    /// The record's ``PersistentIdentifier``.
    case persistentModelID
    /// A stored attribute; `composite` describes its queryable members when it is a composite attribute.
    case attribute(Schema.Attribute, composite: CompositeTypeInfo?)
    /// A member inside a composite attribute, reached by one appended key path (`\Person.homeAddress.city`).
    case compositePath(attribute: Schema.Attribute, path: [String], leaf: CompositeLeaf)
    /// A to-one relationship.
    case toOne(Schema.Relationship, target: any PersistentModel.Type)
    /// A to-many relationship.
    case toMany(Schema.Relationship, target: any PersistentModel.Type)
}

/// The type-erased query description of one entity: which key paths name which members. Built once per model type
/// (held by its ``ModelEntity``). Internal.
final class EntityQueryInfo: @unchecked Sendable {
    // @unchecked: immutable after init; key paths and metatypes are thread-safe.
    let name: String
    let modelType: any PersistentModel.Type
    let schemaEntity: Schema.Entity
    let members: [AnyKeyPath: QueryMember]
    /// Attributes and relationships by name (for the inherited key paths of hierarchy fetches).
    private let byName: [String: QueryMember]

    init(name: String, modelType: any PersistentModel.Type, schemaEntity: Schema.Entity, members: [AnyKeyPath: QueryMember]) {
        self.name = name
        self.modelType = modelType
        self.schemaEntity = schemaEntity
        self.members = members
        var byName: [String: QueryMember] = [:]
        for member in members.values {
            switch member {
            case let .attribute(attribute, _): byName[attribute.name] = member
            case let .toOne(relationship, _), let .toMany(relationship, _): byName[relationship.name] = member
            case .id, .persistentModelID, .compositePath: break
            }
        }
        self.byName = byName
    }

    /// The attribute or relationship named `name`.
    func memberByName(_ name: String) -> QueryMember? { byName[name] }

    /// The member `keyPath` names, if any. `\Model.id` is recognised by its stored-property name (a key path to a
    /// protocol requirement built in generic code is not equal to the concrete one the compiler builds).
    func member(_ keyPath: AnyKeyPath) -> QueryMember? {
        if let member = members[keyPath] { return member }
        if Self.isIdentifierKeyPath(keyPath) { return .id }
        return nil
    }

    /// Whether `keyPath` is a single-component key path to a stored `id: UUID`, or to `persistentModelID`.
    static func isIdentifierKeyPath(_ keyPath: AnyKeyPath) -> Bool {
        guard type(of: keyPath).valueType == UUID.self else { return false }
        let text = "\(keyPath)"
        guard text.hasSuffix(".id") else { return false }
        // "\Type.id": exactly one component after the root type name.
        return text.dropFirst().split(separator: ".").count == 2
    }

    static func isPersistentIdentifierKeyPath(_ keyPath: AnyKeyPath) -> Bool {
        type(of: keyPath).valueType == PersistentIdentifier.self && "\(keyPath)".hasSuffix(".persistentModelID")
    }
}

/// The kind of value a composite member holds, as SQLite's `json_extract` returns it. Internal.
indirect enum CompositeLeaf {
    case string, integer, double, bool
    /// A `Date`, stored by `JSONEncoder` as seconds since 2001; read back as seconds since 1970 like date columns.
    case date
    /// A nested composite attribute.
    case composite(CompositeTypeInfo)
    /// A type whose JSON form differs from its column form (UUID, URL, Data): evaluated in memory.
    case unsupported

    init(_ type: any AttributeValue.Type) {
        let unwrapped = (type as? any OptionalAttributeMarker.Type)?.wrappedAttributeType ?? type
        if let composite = CompositeTypeInfo.of(unwrapped) {
            self = .composite(composite)
            return
        }
        switch unwrapped.attributeType {
        case .string: self = .string
        case .integer: self = .integer
        case .double: self = .double
        case .bool: self = .bool
        case .date: self = .date
        case .data, .uuid, .url, .composite: self = .unsupported
        }
    }
}

/// The queryable members of one composite attribute type (from ``CompositeAttribute/queryableMembers``). Internal.
final class CompositeTypeInfo: @unchecked Sendable {
    // @unchecked: immutable after init.
    let typeName: String
    let members: [AnyKeyPath: (key: String, leaf: CompositeLeaf)]
    /// Declaration order of the members' key paths.
    let order: [AnyKeyPath]

    private init<T: CompositeAttribute>(_ type: T.Type, depth: Int) {
        typeName = "\(T.self)"
        var members: [AnyKeyPath: (key: String, leaf: CompositeLeaf)] = [:]
        var order: [AnyKeyPath] = []
        if depth < 8 {
            for member in T.queryableMembers {
                let unwrapped = (member.valueType as? any OptionalAttributeMarker.Type)?.wrappedAttributeType ?? member.valueType
                let leaf: CompositeLeaf
                if let nested = unwrapped as? any CompositeAttribute.Type {
                    leaf = .composite(Self.make(nested, depth: depth + 1))
                } else {
                    leaf = CompositeLeaf(member.valueType)
                }
                members[member.keyPath] = (member.key, leaf)
                order.append(member.keyPath)
            }
        }
        self.members = members
        self.order = order
    }

    private static func make<T: CompositeAttribute>(_ type: T.Type, depth: Int) -> CompositeTypeInfo {
        CompositeTypeInfo(type, depth: depth)
    }

    /// The description of `type` (or of the type an optional wraps) when it is a composite attribute.
    static func of(_ type: any AttributeValue.Type) -> CompositeTypeInfo? {
        let unwrapped = (type as? any OptionalAttributeMarker.Type)?.wrappedAttributeType ?? type
        guard let composite = unwrapped as? any CompositeAttribute.Type else { return nil }
        return make(composite, depth: 0)
    }

    /// Every member reachable by appending key paths, with its JSON path: `(\Address.geo.lat, ["geo", "lat"], .double)`.
    func flattenedMembers() -> [(AnyKeyPath, [String], CompositeLeaf)] {
        var result: [(AnyKeyPath, [String], CompositeLeaf)] = []
        for keyPath in order {
            guard let (key, leaf) = members[keyPath] else { continue }
            result.append((keyPath, [key], leaf))
            if case let .composite(nested) = leaf {
                for (inner, path, innerLeaf) in nested.flattenedMembers() {
                    if let full = keyPath.appending(path: inner) { result.append((full, [key] + path, innerLeaf)) }
                }
            }
        }
        return result
    }
}

/// Relationships to resolve, as a tree of relationship names (in first-use order). Internal.
struct PrefetchTree: Equatable {
    private(set) var children: [(name: String, tree: PrefetchTree)] = []

    var isEmpty: Bool { children.isEmpty }

    static func == (lhs: PrefetchTree, rhs: PrefetchTree) -> Bool {
        lhs.children.count == rhs.children.count
            && zip(lhs.children, rhs.children).allSatisfy { $0.name == $1.name && $0.tree == $1.tree }
    }

    /// Adds the path of relationship names (creating intermediate nodes).
    mutating func insert(_ path: ArraySlice<String>) {
        guard let first = path.first else { return }
        if let index = children.firstIndex(where: { $0.name == first }) {
            children[index].tree.insert(path.dropFirst())
        } else {
            var child = PrefetchTree()
            child.insert(path.dropFirst())
            children.append((first, child))
        }
    }

    /// Adds relationship `name` with `subtree` below it.
    mutating func graft(_ name: String, _ subtree: PrefetchTree) {
        var node = PrefetchTree()
        node.children = [(name, subtree)]
        merge(node)
    }

    mutating func merge(_ other: PrefetchTree) {
        for (name, tree) in other.children {
            if let index = children.firstIndex(where: { $0.name == name }) {
                children[index].tree.merge(tree)
            } else {
                children.append((name, tree))
            }
        }
    }
}

/// Loads models by ID for relationship resolution (implemented by the fetch engine). Internal.
protocol ModelLoading {
    /// The models of `type` with the given IDs (those that exist), with their relationships in `prefetch` resolved.
    /// One query for the models, plus one per relationship in `prefetch`.
    func loadModels<T: PersistentModel>(_ type: T.Type, ids: [UUID], prefetch: PrefetchTree) throws -> [UUID: T]
}
