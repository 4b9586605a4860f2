import Foundation

// Translates Foundation `#Predicate` expression trees to SQL.
//
// Every `PredicateExpressions` node type Replica understands conforms to `SQLTranslatable` (unconditionally; its
// children are translated by dynamic dispatch, so an untranslatable child is reported precisely). Values are always
// bound as parameters, never interpolated. Semantics follow Swift's, not SQL's: `==` is null-safe (`IS`), booleans
// are never NULL (`COALESCE`), every string contains "", a force unwrap of nil fails the query, and so on.
// What cannot be translated throws `Untranslatable`; the fetch then evaluates the whole predicate in memory over
// the rows the translatable conjuncts select.

/// Part of a predicate or sort could not be translated to SQL; it is evaluated in memory instead. Internal.
struct Untranslatable: Error {
    let reason: String
    init(_ reason: String) { self.reason = reason }
}

/// SQL text with its parameters, in order of appearance. Internal.
struct SQLExpr {
    var text: String
    var args: [SQLiteValue]
    /// May evaluate to NULL (a Swift `nil`).
    var nullable: Bool
    /// May raise an error (a force unwrap): keep it behind short-circuits.
    var mayFail: Bool = false
    /// NULL whenever the record or composite value it reads through is NULL (a plain member access).
    var propagatesNull: Bool = false

    init(_ text: String, _ args: [SQLiteValue] = [], nullable: Bool, mayFail: Bool = false, propagatesNull: Bool = false) {
        self.text = text
        self.args = args
        self.nullable = nullable
        self.mayFail = mayFail
        self.propagatesNull = propagatesNull
    }

    static func parameter(_ value: SQLiteValue) -> SQLExpr { SQLExpr("?", [value], nullable: value.isNull) }
    static let `true` = SQLExpr("1", nullable: false)
    static let `false` = SQLExpr("0", nullable: false)
    static let null = SQLExpr("NULL", nullable: true)
}

/// A record in a query: a row in scope (`alias."col"`), or a record known by an ID expression (a reference), whose
/// columns are read with a subquery. Internal.
struct RecordRef {
    enum Access {
        case row(alias: String)
        case id(SQLExpr)
    }
    let entity: EntityQueryInfo
    let access: Access
    /// Relationship names from the fetched model to this record (for in-memory resolution), when known.
    let path: [String]?
    /// For the root of a hierarchy fetch: key paths of the base type, by attribute name.
    var inherited: [AnyKeyPath: String]? = nil

    var idExpr: SQLExpr {
        switch access {
        case let .row(alias): return SQLExpr("\(alias).\"id\"", nullable: false)
        case let .id(expression): return expression
        }
    }
}

/// The records of a to-many relationship of one record. Internal.
struct CollectionRef {
    let element: EntityQueryInfo
    let alias: String
    /// The FROM clause (with the element alias; a link-table join for many-to-many).
    let from: String
    var conditions: [SQLExpr]
    let path: [String]?
    /// `\[Reference<Element>].count` and `.isEmpty`.
    let countKeyPath: AnyKeyPath
    let isEmptyKeyPath: AnyKeyPath

    func subquery(select: String, extra: SQLExpr? = nil) -> SQLExpr {
        let all = conditions + (extra.map { [$0] } ?? [])
        let clause = all.isEmpty ? "" : " WHERE " + all.map { "(\($0.text))" }.joined(separator: " AND ")
        return SQLExpr("(SELECT \(select) FROM \(from)\(clause))", all.flatMap(\.args), nullable: false,
                       mayFail: all.contains { $0.mayFail })
    }
}

/// A composite attribute value (JSON text) and the path into it reached so far. Internal.
struct CompositeRef {
    let json: SQLExpr
    let path: [String]
    let info: CompositeTypeInfo?
}

/// What a translated sub-expression is. Internal.
enum Operand {
    case sql(SQLExpr)
    /// A Swift value known when translating (bound as a parameter when used).
    case constant(Any)
    case record(RecordRef)
    case collection(CollectionRef)
    case composite(CompositeRef)
    /// A `persistentModelID`: the entity name and the ID expression.
    case identifier(entity: String, id: SQLExpr)
    case range(lower: SQLExpr, upper: SQLExpr, closed: Bool)
    /// Untranslatable; only produced while collecting relationship paths.
    case opaque
}

/// Where the translator reads tables from (the store's tables, or overlays with pending changes). Internal.
protocol QuerySources: AnyObject {
    /// A FROM-able SQL source for the entity's records.
    func table(_ entity: String) throws -> String
    /// A FROM-able SQL source for a link table's links.
    func links(_ table: LinkTable) throws -> String
}

/// Gives access to an entity's query description from its model type. Internal.
func queryInfo(_ type: any PersistentModel.Type) -> EntityQueryInfo {
    func open<M: PersistentModel>(_: M.Type) -> EntityQueryInfo { M.entity.query }
    return open(type)
}

private func arrayKeyPaths(_ type: any PersistentModel.Type) -> (count: AnyKeyPath, isEmpty: AnyKeyPath) {
    func open<M: PersistentModel>(_: M.Type) -> (AnyKeyPath, AnyKeyPath) {
        (\[Reference<M>].count, \[Reference<M>].isEmpty)
    }
    return open(type)
}

/// A node the translator understands. Internal.
protocol SQLTranslatable {
    func translate(_ translator: PredicateTranslator) throws -> Operand
}

/// Marks `Optional` for code that holds a value as `Any`. Internal.
protocol AnyOptional {
    var isNil: Bool { get }
    var wrappedValue: Any? { get }
}

extension Optional: AnyOptional {
    var isNil: Bool { self == nil }
    var wrappedValue: Any? {
        switch self {
        case let .some(value): return value
        case .none: return nil
        }
    }
}

/// A value that stands for a record ID (a `Reference`). Internal.
protocol ReferenceIdentifying {
    var referencedID: UUID { get }
    var referencedIdentifier: PersistentIdentifier { get }
    /// Whether reading `keyPath` from this reference works without a resolved target.
    func canRead(_ keyPath: AnyKeyPath) -> Bool
}

extension Reference: ReferenceIdentifying {
    var referencedID: UUID { id }
    var referencedIdentifier: PersistentIdentifier { persistentModelID }
    func canRead(_ keyPath: AnyKeyPath) -> Bool {
        resolved != nil || keyPath == \Reference<Target>.id || keyPath == \Reference<Target>.persistentModelID
            || keyPath == \Reference<Target>.resolved
    }
}

/// Whether a key path reads through a relationship (its root is a model or a reference, or a list of references).
private func readsThroughRelationship(_ keyPath: AnyKeyPath) -> Bool {
    let root = type(of: keyPath).rootType
    return root is any ReferenceIdentifying.Type || root is any PersistentModel.Type
        || ("\(root)".hasPrefix("Array<Reference<"))
}

/// A constant range whose bounds have stored forms. Internal.
protocol ConstantRange {
    var storedBounds: (lower: SQLiteValue, upper: SQLiteValue, closed: Bool)? { get }
}

extension ClosedRange: ConstantRange {
    var storedBounds: (lower: SQLiteValue, upper: SQLiteValue, closed: Bool)? {
        guard let lower = lowerBound as? any AttributeValue, let upper = upperBound as? any AttributeValue else { return nil }
        return (lower.sqliteValue, upper.sqliteValue, true)
    }
}

extension Range: ConstantRange {
    var storedBounds: (lower: SQLiteValue, upper: SQLiteValue, closed: Bool)? {
        guard let lower = lowerBound as? any AttributeValue, let upper = upperBound as? any AttributeValue else { return nil }
        return (lower.sqliteValue, upper.sqliteValue, false)
    }
}

/// Translates predicate expressions against a set of sources. One per query. Internal.
final class PredicateTranslator {
    let sources: QuerySources
    /// Relationships the translated expressions traverse from the root, for in-memory resolution.
    private(set) var relationships = PrefetchTree()
    /// When set, untranslatable nodes become `.opaque` instead of failing (used to collect relationship paths).
    var lenient = false
    /// Set while collecting when a member of a relationship target is read through an untranslatable expression:
    /// that relationship cannot be known, so it cannot be resolved for the in-memory evaluation.
    private(set) var lostRelationship = false
    private var bindings: [PredicateExpressions.VariableID: Operand] = [:]
    private var aliasCount = 0

    init(sources: QuerySources) {
        self.sources = sources
    }

    func newAlias(_ prefix: String = "t") -> String {
        aliasCount += 1
        return "\(prefix)\(aliasCount)"
    }

    /// Binds a predicate variable for the duration of `body`.
    func with<T>(_ variable: PredicateExpressions.VariableID, bound operand: Operand, _ body: () throws -> T) rethrows -> T {
        let previous = bindings[variable]
        bindings[variable] = operand
        defer { bindings[variable] = previous }
        return try body()
    }

    func lookup(_ variable: PredicateExpressions.VariableID) throws -> Operand {
        guard let operand = bindings[variable] else { throw Untranslatable("a variable from outside the predicate") }
        return operand
    }

    /// Translates one expression node.
    func translate(_ expression: Any) throws -> Operand {
        do {
            guard let node = expression as? SQLTranslatable else {
                throw Untranslatable("\(Self.shortName(of: type(of: expression))) has no SQL form")
            }
            return try node.translate(self)
        } catch where lenient {
            // Collect what the children traverse, then give up on this node.
            for child in Mirror(reflecting: expression).children where child.value is any PredicateExpression {
                _ = try? translate(child.value)
            }
            return .opaque
        }
    }

    /// The expression as a SQL condition that is never NULL.
    func condition(_ expression: Any) throws -> SQLExpr {
        try condition(of: translate(expression))
    }

    func condition(of operand: Operand) throws -> SQLExpr {
        if case let .constant(value) = operand {
            guard let flag = value as? Bool else { throw Untranslatable("a non-boolean constant used as a condition") }
            return flag ? .true : .false
        }
        let expression = try scalar(operand)
        if !expression.nullable { return expression }
        return SQLExpr("COALESCE(\(expression.text), 0)", expression.args, nullable: false, mayFail: expression.mayFail)
    }

    /// The operand as one SQL value.
    func scalar(_ operand: Operand) throws -> SQLExpr {
        switch operand {
        case let .sql(expression): return expression
        case let .constant(value): return .parameter(try Self.storedValue(of: value))
        case let .record(record): return record.idExpr
        case let .composite(composite):
            guard composite.path.isEmpty else { throw Untranslatable("a nested composite value compared as a whole") }
            return composite.json
        case .identifier: throw Untranslatable("a persistentModelID used other than in == or !=")
        case .collection: throw Untranslatable("a to-many relationship used as a value")
        case .range: throw Untranslatable("a range used as a value")
        case .opaque: throw Untranslatable("untranslatable")
        }
    }

    /// The stored (bindable) form of a Swift value.
    static func storedValue(of value: Any) throws -> SQLiteValue {
        if let optional = value as? any AnyOptional {
            guard let wrapped = optional.wrappedValue else { return .null }
            return try storedValue(of: wrapped)
        }
        if let attribute = value as? any AttributeValue { return attribute.sqliteValue }
        if let reference = value as? any ReferenceIdentifying { return reference.referencedID.sqliteValue }
        throw Untranslatable("a value of type \(shortName(of: type(of: value))) has no stored form")
    }

    static func shortName(of type: Any.Type) -> String {
        let name = "\(type)"
        return name.replacingOccurrences(of: "PredicateExpressions.", with: "")
    }

    // MARK: Members

    /// The member `keyPath` reaches from `root`.
    func member(of root: Operand, keyPath: AnyKeyPath) throws -> Operand {
        switch root {
        case .opaque:
            if readsThroughRelationship(keyPath) { lostRelationship = true }
            return .opaque
        case let .constant(value):
            // A captured reference: reading its target's members needs it resolved (Swift would trap).
            var unwrapped: Any = value
            if let optional = value as? any AnyOptional, let wrapped = optional.wrappedValue { unwrapped = wrapped }
            if let reference = unwrapped as? any ReferenceIdentifying, !reference.canRead(keyPath) {
                throw FetchError.unresolvableReference(reference.referencedIdentifier, relationship: "\(keyPath.readableDescription)")
            }
            guard let result = value[keyPath: keyPath] else { throw Untranslatable("\(keyPath.readableDescription) does not apply to its value") }
            return .constant(result)
        case let .record(record):
            return try member(of: record, keyPath: keyPath)
        case let .collection(collection):
            if keyPath == collection.countKeyPath { return .sql(collection.subquery(select: "count(*)")) }
            if keyPath == collection.isEmptyKeyPath {
                let exists = collection.subquery(select: "1")
                return .sql(SQLExpr("NOT EXISTS \(exists.text)", exists.args, nullable: false, mayFail: exists.mayFail))
            }
            throw Untranslatable("\(keyPath.readableDescription) of a to-many relationship")
        case let .composite(composite):
            guard let info = composite.info, let (key, leaf) = info.members[keyPath] else {
                throw Untranslatable("\(keyPath.readableDescription) is not a queryable member of \(composite.info?.typeName ?? "a composite attribute")")
            }
            let path = composite.path + [key]
            switch leaf {
            case let .composite(nested): return .composite(CompositeRef(json: composite.json, path: path, info: nested))
            case .unsupported: throw Untranslatable("\(keyPath.readableDescription) has a JSON form that differs from its column form")
            default: return .sql(Self.jsonExtract(composite.json, path: path, leaf: leaf))
            }
        case let .sql(expression):
            if keyPath == \String.count {
                return .sql(SQLExpr("length(\(expression.text))", expression.args, nullable: expression.nullable,
                                    mayFail: expression.mayFail, propagatesNull: true))
            }
            if keyPath == \String.isEmpty {
                return .sql(SQLExpr("(\(expression.text) = '')", expression.args, nullable: expression.nullable,
                                    mayFail: expression.mayFail, propagatesNull: true))
            }
            if readsThroughRelationship(keyPath) { lostRelationship = true }
            throw Untranslatable("\(keyPath.readableDescription) of a computed value")
        case .identifier, .range:
            throw Untranslatable("\(keyPath.readableDescription) of an identifier or range")
        }
    }

    static func jsonExtract(_ json: SQLExpr, path: [String], leaf: CompositeLeaf) -> SQLExpr {
        let jsonPath = "$" + path.map { key in
            key.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" }) && !key.isEmpty
                ? ".\(key)" : ".\"\(key.replacingOccurrences(of: "\"", with: "\\\""))\""
        }.joined()
        var text = "json_extract(\(json.text), ?)"
        var args = json.args + [.text(jsonPath)]
        switch leaf {
        case .date:
            // JSONEncoder writes dates as seconds since 2001; columns hold seconds since 1970.
            text = "(\(text) + 978307200.0)"
        case .double:
            // Non-finite doubles are written as strings (ReplicaJSON): read them back as IEEE values; NaN as NULL,
            // so that comparisons with it are false, as in Swift.
            text = "(CASE WHEN json_type(\(json.text), ?) = 'text' THEN (CASE json_extract(\(json.text), ?) "
                + "WHEN '+Infinity' THEN 9e999 WHEN '-Infinity' THEN -9e999 ELSE NULL END) ELSE \(text) END)"
            args = json.args + [.text(jsonPath)] + json.args + [.text(jsonPath)] + json.args + [.text(jsonPath)]
        default:
            break
        }
        return SQLExpr(text, args, nullable: true, mayFail: json.mayFail, propagatesNull: true)
    }

    private func column(_ name: String, of record: RecordRef, nullable: Bool) throws -> SQLExpr {
        switch record.access {
        case let .row(alias):
            return SQLExpr("\(alias).\(quoted(name))", nullable: nullable, propagatesNull: true)
        case let .id(id):
            let source = try sources.table(record.entity.name)
            return SQLExpr("(SELECT \(quoted(name)) FROM \(source) WHERE \"id\" = \(id.text))", id.args,
                           nullable: true, mayFail: id.mayFail, propagatesNull: true)
        }
    }

    private func member(of record: RecordRef, keyPath: AnyKeyPath) throws -> Operand {
        var found: QueryMember?
        if let inherited = record.inherited, let name = inherited[keyPath] {
            found = name == "id" ? .id : record.entity.memberByName(name)
            if found == nil {
                throw FetchError.invalidHierarchy("\(record.entity.name) has no member '\(name)'")
            }
        }
        if found == nil { found = record.entity.member(keyPath) }
        if found == nil, EntityQueryInfo.isIdentifierKeyPath(keyPath) { found = .id }
        if found == nil, EntityQueryInfo.isPersistentIdentifierKeyPath(keyPath) { found = .persistentModelID }
        guard let member = found else {
            throw FetchError.unsupportedKeyPath(entity: record.entity.name, keyPath: "\(keyPath.readableDescription)")
        }
        switch member {
        case .id:
            return .sql(record.idExpr)
        case .persistentModelID:
            return .identifier(entity: record.entity.name, id: record.idExpr)
        case let .attribute(attribute, composite):
            let value = try column(attribute.name, of: record, nullable: attribute.isOptional)
            if let composite { return .composite(CompositeRef(json: value, path: [], info: composite)) }
            if attribute.type == .composite { return .composite(CompositeRef(json: value, path: [], info: nil)) }
            return .sql(value)
        case let .compositePath(attribute, path, leaf):
            let json = try column(attribute.name, of: record, nullable: attribute.isOptional)
            switch leaf {
            case let .composite(nested): return .composite(CompositeRef(json: json, path: path, info: nested))
            case .unsupported: throw Untranslatable("\(keyPath.readableDescription) has a JSON form that differs from its column form")
            default: return .sql(Self.jsonExtract(json, path: path, leaf: leaf))
            }
        case let .toOne(relationship, target):
            let path = record.path.map { $0 + [relationship.name] }
            if let path { relationships.insert(path[...]) }
            let id = try column(relationship.name, of: record, nullable: true)
            return .record(RecordRef(entity: queryInfo(target), access: .id(id), path: path))
        case let .toMany(relationship, target):
            let path = record.path.map { $0 + [relationship.name] }
            if let path { relationships.insert(path[...]) }
            return .collection(try collection(relationship, target: target, of: record, path: path))
        }
    }

    private func collection(_ relationship: Schema.Relationship, target: any PersistentModel.Type,
                            of record: RecordRef, path: [String]?) throws -> CollectionRef {
        let element = queryInfo(target)
        let alias = newAlias()
        let owner = record.idExpr
        let keyPaths = arrayKeyPaths(target)
        let from: String
        let correlation: SQLExpr
        if let link = LinkTable.of(relationship, in: record.entity.name, destination: element.schemaEntity) {
            let (this, other) = link.columns(entity: record.entity.name, relationship: relationship.name)
            let join = newAlias("j")
            from = "\(try sources.links(link)) AS \(join) JOIN \(try sources.table(element.name)) AS \(alias) "
                + "ON \(alias).\"id\" = \(join).\(quoted(other))"
            correlation = SQLExpr("\(join).\(quoted(this)) = \(owner.text)", owner.args, nullable: false, mayFail: owner.mayFail)
        } else {
            guard let inverse = relationship.inverse else {
                throw Untranslatable("to-many relationship '\(relationship.name)' has no inverse")
            }
            from = "\(try sources.table(element.name)) AS \(alias)"
            correlation = SQLExpr("\(alias).\(quoted(inverse)) = \(owner.text)", owner.args, nullable: false, mayFail: owner.mayFail)
        }
        return CollectionRef(element: element, alias: alias, from: from, conditions: [correlation], path: path,
                             countKeyPath: keyPaths.count, isEmptyKeyPath: keyPaths.isEmpty)
    }

    // MARK: Operators

    /// `lhs == rhs` (or `!=`) with Swift's semantics: nil equals nil.
    func equality(_ lhs: Operand, _ rhs: Operand, negated: Bool) throws -> Operand {
        if case .opaque = lhs { return .opaque }
        if case .opaque = rhs { return .opaque }
        // persistentModelID compares the entity too.
        if case let .identifier(entity, id) = lhs { return try identifierEquality(entity, id, rhs, negated: negated) }
        if case let .identifier(entity, id) = rhs { return try identifierEquality(entity, id, lhs, negated: negated) }
        let left = try scalar(lhs)
        let right = try scalar(rhs)
        let op: String
        if left.nullable || right.nullable {
            op = negated ? "IS NOT" : "IS"
        } else {
            op = negated ? "<>" : "="
        }
        return .sql(SQLExpr("(\(left.text) \(op) \(right.text))", left.args + right.args, nullable: false,
                            mayFail: left.mayFail || right.mayFail))
    }

    private func identifierEquality(_ entity: String, _ id: SQLExpr, _ other: Operand, negated: Bool) throws -> Operand {
        guard case let .constant(value) = other else { throw Untranslatable("persistentModelID compared with a non-constant") }
        let identifier: PersistentIdentifier?
        if let optional = value as? any AnyOptional {
            identifier = optional.wrappedValue as? PersistentIdentifier
            if identifier == nil, !optional.isNil { throw Untranslatable("persistentModelID compared with another type") }
        } else if let value = value as? PersistentIdentifier {
            identifier = value
        } else {
            throw Untranslatable("persistentModelID compared with another type")
        }
        guard let identifier, identifier.entityName == entity else {
            // A model's identifier is never nil, and never equal to another entity's identifier.
            return .constant(negated)
        }
        return .sql(SQLExpr("(\(id.text) \(negated ? "<>" : "=") ?)", id.args + [identifier.id.sqliteValue],
                            nullable: false, mayFail: id.mayFail))
    }

    /// A binary operator over two scalars.
    func binary(_ lhs: Operand, _ op: String, _ rhs: Operand) throws -> SQLExpr {
        let left = try scalar(lhs)
        let right = try scalar(rhs)
        return SQLExpr("(\(left.text) \(op) \(right.text))", left.args + right.args,
                       nullable: left.nullable || right.nullable, mayFail: left.mayFail || right.mayFail)
    }

    /// `a && b`, `a || b`, keeping Swift's short-circuit when `b` may fail.
    func logical(_ lhs: Any, _ rhs: Any, and: Bool) throws -> Operand {
        let left = try translate(lhs)
        let right = try translate(rhs)
        if case .opaque = left { return .opaque }
        if case .opaque = right { return .opaque }
        let l = try condition(of: left)
        let r = try condition(of: right)
        let text: String
        if r.mayFail {
            text = and ? "(CASE WHEN \(l.text) THEN \(r.text) ELSE 0 END)" : "(CASE WHEN \(l.text) THEN 1 ELSE \(r.text) END)"
        } else {
            text = "(\(l.text) \(and ? "AND" : "OR") \(r.text))"
        }
        return .sql(SQLExpr(text, l.args + r.args, nullable: false, mayFail: l.mayFail || r.mayFail))
    }

    /// `element` in the sequence `sequence`.
    func membership(_ sequence: Operand, _ element: Operand) throws -> Operand {
        if case .opaque = sequence { return .opaque }
        if case .opaque = element { return .opaque }
        switch sequence {
        case let .constant(value):
            guard let values = Self.elements(of: value) else { throw Untranslatable("membership in a non-sequence value") }
            let item = try scalar(element)
            var stored: [SQLiteValue] = []
            var containsNil = false
            for value in values {
                let storedValue = try Self.storedValue(of: value)
                if storedValue.isNull { containsNil = true } else { stored.append(storedValue) }
            }
            var parts: [SQLExpr] = []
            if !stored.isEmpty { parts.append(try Self.inList(item, stored)) }
            if containsNil { parts.append(SQLExpr("(\(item.text) IS NULL)", item.args, nullable: false, mayFail: item.mayFail)) }
            if parts.isEmpty { return .constant(false) }
            let text = parts.map(\.text).joined(separator: " OR ")
            let result = SQLExpr("(\(text))", parts.flatMap(\.args), nullable: item.nullable && !containsNil, mayFail: item.mayFail)
            return .sql(result)
        case let .collection(collection):
            let id = try scalar(element)
            let exists = collection.subquery(select: "1", extra: SQLExpr("\(collection.alias).\"id\" = \(id.text)", id.args,
                                                                        nullable: false, mayFail: id.mayFail))
            return .sql(SQLExpr("EXISTS \(exists.text)", exists.args, nullable: false, mayFail: exists.mayFail))
        default:
            throw Untranslatable("membership in a computed sequence")
        }
    }

    /// `item IN (...)`: placeholders for short lists, one JSON parameter for long ones.
    static func inList(_ item: SQLExpr, _ values: [SQLiteValue]) throws -> SQLExpr {
        if values.count <= 200 {
            let placeholders = Array(repeating: "?", count: values.count).joined(separator: ", ")
            return SQLExpr("\(item.text) IN (\(placeholders))", item.args + values, nullable: item.nullable, mayFail: item.mayFail)
        }
        var json = "["
        var select = "value"
        for (index, value) in values.enumerated() {
            if index > 0 { json += "," }
            switch value {
            case let .integer(v): json += String(v)
            case let .real(v):
                guard v.isFinite else { throw Untranslatable("a non-finite number in a long list") }
                json += "\(v)"
            case let .text(v): json += Self.jsonString(v)
            case let .blob(v):
                json += "\"" + v.map { String(format: "%02X", $0) }.joined() + "\""
                select = "replica_unhex(value)"
            case .null: break
            }
        }
        json += "]"
        let kinds = Set(values.map { value -> Int in
            switch value {
            case .integer, .real: return 0
            case .text: return 1
            case .blob: return 2
            case .null: return 3
            }
        })
        guard kinds.count == 1 else { throw Untranslatable("a long list of mixed types") }
        return SQLExpr("\(item.text) IN (SELECT \(select) FROM json_each(?))", item.args + [.text(json)],
                       nullable: item.nullable, mayFail: item.mayFail)
    }

    static func jsonString(_ text: String) -> String {
        var result = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": result += "\\\""
            case "\\": result += "\\\\"
            case "\n": result += "\\n"
            case "\r": result += "\\r"
            case "\t": result += "\\t"
            default:
                if scalar.value < 0x20 {
                    result += String(format: "\\u%04x", scalar.value)
                } else {
                    result.unicodeScalars.append(scalar)
                }
            }
        }
        return result + "\""
    }

    static func elements(of value: Any) -> [Any]? {
        guard let sequence = value as? any Sequence else { return nil }
        func open<S: Sequence>(_ s: S) -> [Any] { s.map { $0 as Any } }
        return open(sequence)
    }
}
