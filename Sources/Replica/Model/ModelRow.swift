import Foundation

/// One stored record as a model initializer reads it: the record ID and field values by position or name.
///
/// Positions follow the entity's ``Schema/Entity/fieldNames`` (attributes in declaration order, then to-one
/// relationships). Reading by position is the fast path: while a fetch streams, the row reads each value straight
/// from the SQLite statement (no intermediate arrays); reading by name costs one dictionary lookup more.
///
/// A row is valid only during the ``PersistentModel/init(row:)`` call it is passed to; reading it later traps.
/// To-many relationships are not read from the row: the context assigns their members through the entity's key
/// paths after `init(row:)` returns (``references(_:to:)`` returns an empty list).
public struct ModelRow {
    /// The record ID.
    public let id: UUID
    let layout: RowLayout
    /// The values, for rows made from snapshots; empty for rows that read from a statement.
    let values: [SQLiteValue]
    /// The statement row this row reads (checked against the layout's current row).
    let generation: Int

    /// A row over in-memory values (pending changes, snapshots).
    init(id: UUID, values: [SQLiteValue], layout: RowLayout) {
        self.id = id
        self.values = values
        self.layout = layout
        self.generation = 0
    }

    /// A row over the statement the layout streams, at its current row.
    init(id: UUID, streaming layout: RowLayout) {
        self.id = id
        self.values = []
        self.layout = layout
        self.generation = layout.generation
    }

    /// The stored value at field `index`. Fields not fetched (``FetchDescriptor/propertiesToFetch``) read as their
    /// declared default, or `NULL`.
    public subscript(index: Int) -> SQLiteValue {
        guard let statement = layout.statement else { return values[index] }
        precondition(generation == layout.generation, "Replica: a ModelRow was used after init(row:) returned")
        let column = layout.columns[index]
        return column >= 0 ? statement.value(column) : layout.defaults[index]
    }

    /// The stored value of field `name`, or `nil` when the entity has no such field.
    public subscript(name: String) -> SQLiteValue? { layout.fieldIndexByName[name].map { self[$0] } }

    /// Decodes the field at `index` as `Value`.
    /// - Throws: ``ValueConversionError`` naming the attribute when the stored value does not fit.
    public func decode<Value: AttributeValue>(_ type: Value.Type = Value.self, at index: Int) throws -> Value {
        do {
            return try Value(sqliteValue: self[index])
        } catch {
            var error = error
            error.attribute = "\(layout.entityName).\(layout.fieldName(index))"
            throw error
        }
    }

    /// Decodes field `name` as `Value`.
    /// - Throws: ``ValueConversionError`` when the entity has no such field or the stored value does not fit.
    public func decode<Value: AttributeValue>(_ type: Value.Type = Value.self, named name: String) throws -> Value {
        guard let index = layout.fieldIndexByName[name] else {
            throw ValueConversionError(expected: "\(Value.self)", found: .null, attribute: "\(layout.entityName).\(name) (no such field)")
        }
        return try decode(Value.self, at: index)
    }

    /// The to-one reference stored at field `index` (`nil` when the field is `NULL`), read without intermediate
    /// allocations.
    /// - Throws: ``ValueConversionError`` when the stored value is not a 16-byte ID.
    public func reference<Target: PersistentModel>(_ type: Target.Type = Target.self, at index: Int) throws -> Reference<Target>? {
        if let statement = layout.statement {
            precondition(generation == layout.generation, "Replica: a ModelRow was used after init(row:) returned")
            let column = layout.columns[index]
            if column < 0 || statement.isNull(column) { return nil }
            if let id = statement.uuid(column) { return Reference(id) }
        } else {
            if values[index].isNull { return nil }
            if case let .blob(bytes) = values[index], let id = UUID(bytes: bytes) { return Reference(id) }
        }
        throw ValueConversionError(expected: "Reference<\(Target.self)>", found: self[index],
                                   attribute: "\(layout.entityName).\(layout.fieldName(index))")
    }

    /// The members of to-many relationship `name`: always empty here, because the context assigns to-many members
    /// through the entity's key path after ``PersistentModel/init(row:)`` returns.
    public func references<Target: PersistentModel>(_ name: String, to: Target.Type = Target.self) -> [Reference<Target>] {
        []
    }
}

/// What the rows of one query share: the entity's field names, where each field is in the result, and the
/// statement being stepped. One per query; rows hold a reference to it. Internal.
final class RowLayout {
    let entityName: String
    let fieldIndexByName: [String: Int]
    let toManyNames: [String]
    /// The statement the rows read, or `nil` for rows over values.
    let statement: Statement?
    /// Result column of each field, or -1 when the field is not fetched.
    let columns: [Int32]
    /// The value of each field that is not fetched: its declared default, or `NULL`.
    let defaults: [SQLiteValue]
    /// Advanced for every statement row, so that rows cannot be read after their turn.
    var generation = 0

    init(entity: Schema.Entity, fieldIndexByName: [String: Int], statement: Statement?, columns: [Int32], defaults: [SQLiteValue]) {
        self.entityName = entity.name
        self.fieldIndexByName = fieldIndexByName
        self.toManyNames = entity.relationships.filter(\.isToMany).map(\.name)
        self.statement = statement
        self.columns = columns
        self.defaults = defaults
    }

    /// A layout for rows over complete value arrays.
    convenience init(entity: Schema.Entity, fieldIndexByName: [String: Int]) {
        self.init(entity: entity, fieldIndexByName: fieldIndexByName, statement: nil, columns: [], defaults: [])
    }

    func fieldName(_ index: Int) -> String {
        fieldIndexByName.first { $0.value == index }?.key ?? "field #\(index)"
    }
}

// MARK: - Decodable support

/// Decodes a `Decodable` model from a ``ModelRow``: property names are attribute names, `id` is the record ID.
/// This is the convenience path; it uses the compiler-synthesised `init(from:)`, never `Mirror`.
struct ModelRowDecoder: Decoder {
    let row: ModelRow
    var codingPath: [any CodingKey] { [] }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        KeyedDecodingContainer(RowKeyedContainer<Key>(row: row))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        throw DecodingError.typeMismatch([Any].self, .init(codingPath: [], debugDescription: "a model row is keyed"))
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer {
        throw DecodingError.typeMismatch(Any.self, .init(codingPath: [], debugDescription: "a model row is keyed"))
    }
}

private struct RowKeyedContainer<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let row: ModelRow
    var codingPath: [any CodingKey] { [] }
    var allKeys: [Key] {
        (["id"] + row.layout.fieldIndexByName.keys.sorted() + row.layout.toManyNames).compactMap(Key.init(stringValue:))
    }

    func contains(_ key: Key) -> Bool {
        key.stringValue == "id" || row.layout.fieldIndexByName[key.stringValue] != nil || row.layout.toManyNames.contains(key.stringValue)
    }

    func decodeNil(forKey key: Key) throws -> Bool {
        guard let index = row.layout.fieldIndexByName[key.stringValue] else {
            return key.stringValue != "id" && !row.layout.toManyNames.contains(key.stringValue)
        }
        return row[index].isNull
    }

    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        if key.stringValue == "id", let id = row.id as? T { return id }
        if let index = row.layout.fieldIndexByName[key.stringValue] {
            // Common concrete types first: a metatype comparison is much cheaper than a conformance cast.
            do {
                if T.self == String.self { return try row.decode(String.self, at: index) as! T }
                if T.self == Int.self { return try row.decode(Int.self, at: index) as! T }
                if T.self == Double.self { return try row.decode(Double.self, at: index) as! T }
                if T.self == Bool.self { return try row.decode(Bool.self, at: index) as! T }
                if T.self == Date.self { return try row.decode(Date.self, at: index) as! T }
                if let attributeType = T.self as? any AttributeValue.Type {
                    return try decodeAttribute(attributeType, at: index) as! T
                }
            } catch var error as ValueConversionError {
                error.attribute = "\(row.layout.entityName).\(key.stringValue)"
                throw error
            }
            return try T(from: FieldDecoder(value: row[index], codingPath: [key]))
        }
        if row.layout.toManyNames.contains(key.stringValue) {
            return try T(from: ReferenceListDecoder(ids: [], codingPath: [key]))
        }
        throw DecodingError.keyNotFound(key, .init(codingPath: [], debugDescription: "\(row.layout.entityName) has no stored field '\(key.stringValue)'"))
    }

    private func decodeAttribute<A: AttributeValue>(_ type: A.Type, at index: Int) throws -> A {
        try row.decode(A.self, at: index)
    }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        throw DecodingError.typeMismatch([String: Any].self, .init(codingPath: [key], debugDescription: "nested containers are stored as composite attributes"))
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        guard row.layout.toManyNames.contains(key.stringValue) else {
            throw DecodingError.keyNotFound(key, .init(codingPath: [], debugDescription: "no to-many relationship '\(key.stringValue)'"))
        }
        return ReferenceListContainer(ids: [], codingPath: [key])
    }

    func superDecoder() throws -> any Decoder { ModelRowDecoder(row: row) }
    func superDecoder(forKey key: Key) throws -> any Decoder { ModelRowDecoder(row: row) }
}

/// Decodes one stored value (used for `Reference` and other single-value wrappers of an attribute value).
private struct FieldDecoder: Decoder, SingleValueDecodingContainer {
    let value: SQLiteValue
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        throw DecodingError.typeMismatch([String: Any].self, .init(codingPath: codingPath, debugDescription: "a stored field is a single value"))
    }
    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        throw DecodingError.typeMismatch([Any].self, .init(codingPath: codingPath, debugDescription: "a stored field is a single value"))
    }
    func singleValueContainer() throws -> any SingleValueDecodingContainer { self }

    func decodeNil() -> Bool { value.isNull }
    func decode<T: Decodable>(_ type: T.Type) throws -> T {
        if let attributeType = T.self as? any AttributeValue.Type {
            return try attributeType.init(sqliteValue: value) as! T
        }
        return try T(from: self)
    }
}

/// Decodes a to-many relationship's member IDs as an array (of `Reference`s).
private struct ReferenceListDecoder: Decoder {
    let ids: [UUID]
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }
    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        throw DecodingError.typeMismatch([String: Any].self, .init(codingPath: codingPath, debugDescription: "a to-many relationship is a list"))
    }
    func unkeyedContainer() throws -> any UnkeyedDecodingContainer { ReferenceListContainer(ids: ids, codingPath: codingPath) }
    func singleValueContainer() throws -> any SingleValueDecodingContainer {
        throw DecodingError.typeMismatch(Any.self, .init(codingPath: codingPath, debugDescription: "a to-many relationship is a list"))
    }
}

private struct ReferenceListContainer: UnkeyedDecodingContainer {
    let ids: [UUID]
    let codingPath: [any CodingKey]
    var currentIndex = 0
    var count: Int? { ids.count }
    var isAtEnd: Bool { currentIndex >= ids.count }

    init(ids: [UUID], codingPath: [any CodingKey]) {
        self.ids = ids
        self.codingPath = codingPath
    }

    mutating func decodeNil() throws -> Bool { false }
    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T {
        let id = ids[currentIndex]
        currentIndex += 1
        return try T(from: FieldDecoder(value: id.sqliteValue, codingPath: codingPath))
    }
    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws -> KeyedDecodingContainer<NestedKey> {
        throw DecodingError.typeMismatch([String: Any].self, .init(codingPath: codingPath, debugDescription: "references are single values"))
    }
    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
        throw DecodingError.typeMismatch([Any].self, .init(codingPath: codingPath, debugDescription: "references are single values"))
    }
    mutating func superDecoder() throws -> any Decoder { FieldDecoder(value: .null, codingPath: codingPath) }
}
