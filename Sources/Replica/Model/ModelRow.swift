import Foundation

/// One stored record as a model initializer reads it: the record ID, field values by position or name, and the
/// members of to-many relationships.
///
/// Positions follow the entity's ``Schema/Entity/fieldNames`` (attributes in declaration order, then to-one
/// relationships). Reading by position is the fast path; reading by name costs one dictionary lookup.
public struct ModelRow {
    /// The record ID.
    public let id: UUID
    @usableFromInline let values: [SQLiteValue]
    let fieldIndexByName: [String: Int]
    @usableFromInline let entityName: String
    /// Members of to-many relationships, by relationship name (only those that were loaded).
    let toMany: [String: [UUID]]

    init(id: UUID, values: [SQLiteValue], entityName: String, fieldIndexByName: [String: Int], toMany: [String: [UUID]] = [:]) {
        self.id = id
        self.values = values
        self.entityName = entityName
        self.fieldIndexByName = fieldIndexByName
        self.toMany = toMany
    }

    /// The stored value at field `index`.
    @inlinable public subscript(index: Int) -> SQLiteValue { values[index] }

    /// The stored value of field `name`, or `nil` when the entity has no such field.
    public subscript(name: String) -> SQLiteValue? { fieldIndexByName[name].map { values[$0] } }

    /// Decodes the field at `index` as `Value`.
    /// - Throws: ``ValueConversionError`` naming the attribute when the stored value does not fit.
    @inlinable public func decode<Value: AttributeValue>(_ type: Value.Type = Value.self, at index: Int) throws -> Value {
        do {
            return try Value(sqliteValue: values[index])
        } catch {
            var error = error
            error.attribute = "\(entityName) field #\(index)"
            throw error
        }
    }

    /// Decodes field `name` as `Value`.
    /// - Throws: ``ValueConversionError`` when the entity has no such field or the stored value does not fit.
    public func decode<Value: AttributeValue>(_ type: Value.Type = Value.self, named name: String) throws -> Value {
        guard let index = fieldIndexByName[name] else {
            throw ValueConversionError(expected: "\(Value.self)", found: .null, attribute: "\(entityName).\(name) (no such field)")
        }
        do {
            return try Value(sqliteValue: values[index])
        } catch {
            var error = error
            error.attribute = "\(entityName).\(name)"
            throw error
        }
    }

    /// The members of to-many relationship `name` (empty when none, or not loaded).
    public func references<Target: PersistentModel>(_ name: String, to: Target.Type = Target.self) -> [Reference<Target>] {
        (toMany[name] ?? []).map(Reference.init)
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
        (["id"] + row.fieldIndexByName.keys.sorted() + row.toMany.keys.sorted()).compactMap(Key.init(stringValue:))
    }

    func contains(_ key: Key) -> Bool {
        key.stringValue == "id" || row.fieldIndexByName[key.stringValue] != nil || row.toMany[key.stringValue] != nil
    }

    func decodeNil(forKey key: Key) throws -> Bool {
        guard let index = row.fieldIndexByName[key.stringValue] else { return key.stringValue != "id" && row.toMany[key.stringValue] == nil }
        return row.values[index].isNull
    }

    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        if key.stringValue == "id", let id = row.id as? T { return id }
        if let index = row.fieldIndexByName[key.stringValue] {
            let value = row.values[index]
            if let attributeType = T.self as? any AttributeValue.Type {
                do {
                    return try attributeType.init(sqliteValue: value) as! T
                } catch {
                    var error = error
                    error.attribute = "\(row.entityName).\(key.stringValue)"
                    throw error
                }
            }
            return try T(from: FieldDecoder(value: value, codingPath: [key]))
        }
        if let members = row.toMany[key.stringValue] {
            return try T(from: ReferenceListDecoder(ids: members, codingPath: [key]))
        }
        throw DecodingError.keyNotFound(key, .init(codingPath: [], debugDescription: "\(row.entityName) has no stored field '\(key.stringValue)'"))
    }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        throw DecodingError.typeMismatch([String: Any].self, .init(codingPath: [key], debugDescription: "nested containers are stored as composite attributes"))
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        guard let members = row.toMany[key.stringValue] else {
            throw DecodingError.keyNotFound(key, .init(codingPath: [], debugDescription: "no to-many relationship '\(key.stringValue)'"))
        }
        return ReferenceListContainer(ids: members, codingPath: [key])
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
