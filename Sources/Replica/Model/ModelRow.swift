import CSQLite
import Foundation

/// One stored record as a model initializer reads it: the record ID and field values by position or name.
///
/// Positions follow the entity's ``Schema/Entity/fieldNames`` (attributes in declaration order, then to-one
/// relationships). Reading by position is the fast path: while a fetch streams, the row reads each value straight
/// from the SQLite statement (no intermediate arrays; strings are the only allocations); reading by name costs one
/// dictionary lookup more.
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

    /// A row over values with the given field names, and to-many members when known (for code that decodes models
    /// from stored values rather than from a query).
    init(id: UUID, values: [SQLiteValue], entityName: String, fieldIndexByName: [String: Int], toMany: [String: [UUID]] = [:]) {
        self.init(id: id, values: values,
                  layout: RowLayout(entityName: entityName, fieldIndexByName: fieldIndexByName, toManyNames: toMany.keys.sorted(),
                                    statement: nil, columns: [], defaults: [], toMany: toMany))
    }

    /// The row the `Decodable` path of `layout` reads now (see ``RowLayout/decodingID``).
    init(decodingIn layout: RowLayout) {
        self.id = layout.decodingID
        self.values = layout.decodingValues
        self.layout = layout
        self.generation = layout.decodingGeneration
    }

    /// A row over the statement the layout streams, at its current row.
    init(id: UUID, streaming layout: RowLayout) {
        self.id = id
        self.values = []
        self.layout = layout
        self.generation = layout.generation
    }

    /// Where field `index` is: in the statement (its `sqlite3_value`), or not there (a row over values, or a field
    /// that was not fetched).
    @inline(__always)
    func statementValue(_ index: Int) -> OpaquePointer? {
        guard let handle = layout.handle else { return nil }
        precondition(generation == layout.generation, "Replica: a ModelRow was used after init(row:) returned")
        let column = layout.columns[index]
        return column >= 0 ? sqlite3_column_value(handle, column) : nil
    }

    /// The stored value at field `index`. Fields not fetched (``FetchDescriptor/propertiesToFetch``) read as their
    /// declared default, or `NULL`.
    public subscript(index: Int) -> SQLiteValue {
        if layout.handle == nil { return values[index] }
        guard let value = statementValue(index) else { return layout.defaults[index] }
        return SQLiteValue(value)
    }

    /// Whether field `index` holds `NULL` (read without converting the value).
    @inline(__always)
    func isNull(at index: Int) -> Bool {
        if layout.handle == nil { return values[index].isNull }
        guard let value = statementValue(index) else { return layout.defaults[index].isNull }
        return sqlite3_value_type(value) == SQLITE_NULL
    }

    /// The stored value of field `name`, or `nil` when the entity has no such field.
    public subscript(name: String) -> SQLiteValue? { layout.fieldIndexByName[name].map { self[$0] } }

    /// Decodes the field at `index` as `Value`.
    /// - Throws: ``ValueConversionError`` naming the attribute when the stored value does not fit.
    /// - Complexity: O(1); reads straight from the statement for the built-in attribute types.
    public func decode<Value: AttributeValue>(_ type: Value.Type = Value.self, at index: Int) throws -> Value {
        do {
            return try Value.decode(from: self, at: index)
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
        if let value = statementValue(index) {
            if sqlite3_value_type(value) == SQLITE_NULL { return nil }
            if let id = UUID(statementValue: value) { return Reference(id) }
        } else {
            let stored = self[index]
            if stored.isNull { return nil }
            if case let .blob(bytes) = stored, let id = UUID(bytes: bytes) { return Reference(id) }
        }
        throw ValueConversionError(expected: "Reference<\(Target.self)>", found: self[index],
                                   attribute: "\(layout.entityName).\(layout.fieldName(index))")
    }

    /// The members of to-many relationship `name` when the row carries them (rows made from values); empty for rows
    /// a fetch streams, because the context assigns to-many members through the entity's key path after
    /// ``PersistentModel/init(row:)`` returns.
    public func references<Target: PersistentModel>(_ name: String, to: Target.Type = Target.self) -> [Reference<Target>] {
        (layout.toMany[name] ?? []).map(Reference.init)
    }
}

/// What the rows of one query share: the entity's field names, where each field is in the result, and the
/// statement being stepped. One per query; rows hold a reference to it. Internal.
final class RowLayout {
    let entityName: String
    let fieldIndexByName: [String: Int]
    let toManyNames: [String]
    /// The statement the rows read (kept alive here), or `nil` for rows over values.
    let statement: Statement?
    /// Its handle, read without reference counting on the hot path.
    let handle: OpaquePointer?
    /// Result column of each field, or -1 when the field is not fetched.
    let columns: UnsafeMutableBufferPointer<Int32>
    /// The value of each field that is not fetched: its declared default, or `NULL`.
    let defaults: [SQLiteValue]
    /// To-many members carried by rows over values, by relationship name.
    let toMany: [String: [UUID]]
    /// Advanced for every statement row, so that rows cannot be read after their turn.
    @exclusivity(unchecked) var generation = 0
    /// Field names by index (``fieldIndexByName`` inverted), for the `Decodable` path's lookups in field order.
    let fieldNames: [String]
    /// The field the `Decodable` path found last in the current row (-1 before the first): a synthesized
    /// `init(from:)` asks for its properties in declaration order, which is the entity's field order, so the next
    /// field is tried first, by comparing its name, before the dictionary is asked.
    @exclusivity(unchecked) var lastDecodedField = -1
    /// The row the `Decodable` path reads now (set by ``ModelRowDecoder`` for each row): the keyed container it
    /// hands out reads it from here, so one container serves every row of the query.
    @exclusivity(unchecked) var decodingID = UUID.unassigned
    @exclusivity(unchecked) var decodingValues: [SQLiteValue] = []
    @exclusivity(unchecked) var decodingGeneration = 0
    /// The keyed container of the `Decodable` path (a `KeyedDecodingContainer`, which holds only its box) and its
    /// key type: made for the first row, handed out again for the others (making one costs a generic metadata lookup
    /// and an allocation per row).
    @exclusivity(unchecked) var decodingContainer: AnyObject?
    @exclusivity(unchecked) var decodingKeyType: ObjectIdentifier?
    /// Set only for the sample row of the declaration check: records what the model's `Decodable` path reads.
    var probe: DeclarationProbe?

    init(entityName: String, fieldIndexByName: [String: Int], toManyNames: [String], statement: Statement?, columns: [Int32],
         defaults: [SQLiteValue], toMany: [String: [UUID]] = [:]) {
        self.entityName = entityName
        self.fieldIndexByName = fieldIndexByName
        self.toManyNames = toManyNames
        self.statement = statement
        self.handle = statement?.handle
        self.columns = .allocate(capacity: columns.count)
        _ = self.columns.initialize(from: columns)
        self.defaults = defaults
        self.toMany = toMany
        var names = [String](repeating: "", count: (fieldIndexByName.values.max() ?? -1) + 1)
        for (name, index) in fieldIndexByName where index >= 0 { names[index] = name }
        self.fieldNames = names
    }

    convenience init(entity: Schema.Entity, fieldIndexByName: [String: Int], statement: Statement?, columns: [Int32], defaults: [SQLiteValue]) {
        self.init(entityName: entity.name, fieldIndexByName: fieldIndexByName,
                  toManyNames: entity.relationships.filter(\.isToMany).map(\.name), statement: statement, columns: columns,
                  defaults: defaults)
    }

    /// A layout for rows over complete value arrays.
    convenience init(entity: Schema.Entity, fieldIndexByName: [String: Int]) {
        self.init(entity: entity, fieldIndexByName: fieldIndexByName, statement: nil, columns: [], defaults: [])
    }

    deinit { columns.deallocate() }

    func fieldName(_ index: Int) -> String {
        fieldIndexByName.first { $0.value == index }?.key ?? "field #\(index)"
    }
}

// MARK: - Reading values straight from a statement

extension SQLiteValue {
    /// The dynamic value of an `sqlite3_value`, in the storage class SQLite reports for it.
    init(_ value: OpaquePointer) {
        switch sqlite3_value_type(value) {
        case SQLITE_INTEGER: self = .integer(sqlite3_value_int64(value))
        case SQLITE_FLOAT: self = .real(sqlite3_value_double(value))
        case SQLITE_TEXT: self = .text(String(statementValue: value))
        case SQLITE_BLOB:
            let pointer = sqlite3_value_blob(value)
            let count = Int(sqlite3_value_bytes(value))
            self = .blob(count > 0 && pointer != nil ? Data(bytes: pointer!, count: count) : Data())
        default: self = .null
        }
    }
}

extension String {
    /// The text of an `sqlite3_value` whose type is TEXT.
    @inline(__always)
    init(statementValue value: OpaquePointer) {
        guard let text = sqlite3_value_text(value) else { self = ""; return }
        self = String(decoding: UnsafeBufferPointer(start: text, count: Int(sqlite3_value_bytes(value))), as: UTF8.self)
    }
}

extension UUID {
    /// The ID in a 16-byte blob `sqlite3_value`, read without allocating.
    @inline(__always)
    init?(statementValue value: OpaquePointer) {
        guard sqlite3_value_type(value) == SQLITE_BLOB, let pointer = sqlite3_value_blob(value),
              sqlite3_value_bytes(value) == 16 else { return nil }
        var raw: uuid_t = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        withUnsafeMutableBytes(of: &raw) { $0.copyMemory(from: UnsafeRawBufferPointer(start: pointer, count: 16)) }
        self.init(uuid: raw)
    }
}

// Fast paths of `AttributeValue.decode(from:at:)`: one `sqlite3_column_value` per field, no intermediate
// `SQLiteValue`. A value of another storage class takes the general path, which reports it.

extension String {
    public static func decode(from row: ModelRow, at index: Int) throws(ValueConversionError) -> String {
        if let value = row.statementValue(index), sqlite3_value_type(value) == SQLITE_TEXT { return String(statementValue: value) }
        return try String(sqliteValue: row[index])
    }
}

extension Int {
    public static func decode(from row: ModelRow, at index: Int) throws(ValueConversionError) -> Int {
        if let value = row.statementValue(index), sqlite3_value_type(value) == SQLITE_INTEGER { return Int(sqlite3_value_int64(value)) }
        return try Int(sqliteValue: row[index])
    }
}

extension Double {
    public static func decode(from row: ModelRow, at index: Int) throws(ValueConversionError) -> Double {
        if let value = row.statementValue(index), sqlite3_value_type(value) == SQLITE_FLOAT { return sqlite3_value_double(value) }
        return try Double(sqliteValue: row[index])
    }
}

extension Bool {
    public static func decode(from row: ModelRow, at index: Int) throws(ValueConversionError) -> Bool {
        if let value = row.statementValue(index), sqlite3_value_type(value) == SQLITE_INTEGER { return sqlite3_value_int64(value) != 0 }
        return try Bool(sqliteValue: row[index])
    }
}

extension Date {
    public static func decode(from row: ModelRow, at index: Int) throws(ValueConversionError) -> Date {
        if let value = row.statementValue(index), sqlite3_value_type(value) == SQLITE_FLOAT {
            return Date(timeIntervalSince1970: sqlite3_value_double(value))
        }
        return try Date(sqliteValue: row[index])
    }
}

extension UUID {
    public static func decode(from row: ModelRow, at index: Int) throws(ValueConversionError) -> UUID {
        if let value = row.statementValue(index), let id = UUID(statementValue: value) { return id }
        return try UUID(sqliteValue: row[index])
    }
}

extension Optional where Wrapped: AttributeValue {
    public static func decode(from row: ModelRow, at index: Int) throws(ValueConversionError) -> Wrapped? {
        if let value = row.statementValue(index) {
            if sqlite3_value_type(value) == SQLITE_NULL { return nil }
            return try Wrapped.decode(from: row, at: index)
        }
        return try Wrapped?(sqliteValue: row[index])
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
        let layout = row.layout
        layout.lastDecodedField = -1
        layout.decodingID = row.id
        layout.decodingValues = row.values
        layout.decodingGeneration = row.generation
        if let probe = layout.probe {
            return KeyedDecodingContainer(ProbeKeyedContainer(base: RowKeyedContainer<Key>(layout: layout), probe: probe))
        }
        if let cached = layout.decodingContainer, layout.decodingKeyType == ObjectIdentifier(Key.self) {
            return unsafeBitCast(cached, to: KeyedDecodingContainer<Key>.self)
        }
        let container = KeyedDecodingContainer(RowKeyedContainer<Key>(layout: layout))
        layout.decodingContainer = unsafeBitCast(container, to: AnyObject.self)
        layout.decodingKeyType = ObjectIdentifier(Key.self)
        return container
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        throw DecodingError.typeMismatch([Any].self, .init(codingPath: [], debugDescription: "a model row is keyed"))
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer {
        throw DecodingError.typeMismatch(Any.self, .init(codingPath: [], debugDescription: "a model row is keyed"))
    }
}

struct RowKeyedContainer<Key: CodingKey>: KeyedDecodingContainerProtocol {
    /// The layout whose current row (``RowLayout/decodingID``…) this container reads. Not retained: the layout
    /// keeps the container (see ``RowLayout/decodingContainer``), and a container is valid only during the
    /// `init(row:)` call its row is passed to, as the row is (unowned references cost two atomic operations per
    /// access, more than the rest of a field's decoding).
    unowned(unsafe) let layout: RowLayout
    /// The row being decoded.
    var row: ModelRow { ModelRow(decodingIn: layout) }

    init(layout: RowLayout) {
        self.layout = layout
    }
    var codingPath: [any CodingKey] { [] }
    var allKeys: [Key] {
        (["id"] + layout.fieldIndexByName.keys.sorted() + layout.toManyNames).compactMap(Key.init(stringValue:))
    }

    func contains(_ key: Key) -> Bool {
        key.stringValue == "id" || layout.fieldIndexByName[key.stringValue] != nil || layout.toManyNames.contains(key.stringValue)
    }

    /// The field index of the property named `name`, or `nil` when the entity stores no such field: the field after
    /// the last one found is tried first (see ``RowLayout/lastDecodedField``), then the dictionary.
    @inline(__always)
    private func fieldIndex(_ name: String) -> Int? {
        let layout = self.layout
        let guess = layout.lastDecodedField &+ 1
        if guess < layout.fieldNames.count, layout.fieldNames[guess] == name {
            layout.lastDecodedField = guess
            return guess
        }
        guard let index = layout.fieldIndexByName[name] else { return nil }
        layout.lastDecodedField = index
        return index
    }

    func decodeNil(forKey key: Key) throws -> Bool {
        let name = key.stringValue
        guard let index = fieldIndex(name) else {
            return name != "id" && !layout.toManyNames.contains(name)
        }
        return row.isNull(at: index)
    }

    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        let name = key.stringValue
        // (The record ID in a function of its own: its cast would make every call look up `T?`'s metadata.)
        if name == "id" { return try decodeNamedID(T.self, forKey: key) }
        if let index = fieldIndex(name) { return try decodeField(T.self, at: index, key: key) }
        return try decodeOther(T.self, forKey: key)
    }

    /// The value of key `id`: the record ID (as a `UUID`, or anything it casts to), else a field or relationship of
    /// that name.
    @inline(never)
    private func decodeNamedID<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        if T.self == UUID.self { return unsafeBitCast(layout.decodingID, to: T.self) }
        if let id = layout.decodingID as? T { return id }
        if let index = fieldIndex(key.stringValue) { return try decodeField(T.self, at: index, key: key) }
        return try decodeOther(T.self, forKey: key)
    }

    /// A key that names no field: a to-many relationship, or an error.
    @inline(never)
    private func decodeOther<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        let name = key.stringValue
        if layout.toManyNames.contains(name) {
            return try T(from: ReferenceListDecoder(ids: layout.toMany[name] ?? [], codingPath: [key]))
        }
        throw DecodingError.keyNotFound(key, .init(codingPath: [], debugDescription: "\(layout.entityName) has no stored field '\(name)'"))
    }

    /// An optional property: `nil` for a field that holds `NULL` or a key the row does not have (as the default
    /// implementation — `contains`, `decodeNil`, `decode` — answers, with one lookup instead of three).
    func decodeIfPresent<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T? {
        let name = key.stringValue
        if name != "id", let index = fieldIndex(name) {
            if row.isNull(at: index) { return nil }
            return try decodeField(T.self, at: index, key: key)
        }
        guard contains(key), try !decodeNil(forKey: key) else { return nil }
        return try decode(T.self, forKey: key)
    }

    // The concrete requirements the synthesized `init(from:)` calls, spelled out so that each is specialized (a
    // generic witness would compare metatypes and cast at run time).
    func decode(_ type: String.Type, forKey key: Key) throws -> String { try decode(type, key) }
    func decode(_ type: Int.Type, forKey key: Key) throws -> Int { try decode(type, key) }
    func decode(_ type: Double.Type, forKey key: Key) throws -> Double { try decode(type, key) }
    func decode(_ type: Bool.Type, forKey key: Key) throws -> Bool { try decode(type, key) }
    func decodeIfPresent(_ type: String.Type, forKey key: Key) throws -> String? { try decodeIfPresent(type, key) }
    func decodeIfPresent(_ type: Int.Type, forKey key: Key) throws -> Int? { try decodeIfPresent(type, key) }
    func decodeIfPresent(_ type: Double.Type, forKey key: Key) throws -> Double? { try decodeIfPresent(type, key) }
    func decodeIfPresent(_ type: Bool.Type, forKey key: Key) throws -> Bool? { try decodeIfPresent(type, key) }

    @inline(__always)
    private func decode<A: AttributeValue & Decodable>(_ type: A.Type, _ key: Key) throws -> A {
        if key.stringValue != "id", let index = fieldIndex(key.stringValue) {
            do {
                return try row.decode(A.self, at: index)
            } catch var error as ValueConversionError {
                error.attribute = "\(layout.entityName).\(key.stringValue)"
                throw error
            }
        }
        return try decode(A.self, forKey: key) as A
    }

    @inline(__always)
    private func decodeIfPresent<A: AttributeValue & Decodable>(_ type: A.Type, _ key: Key) throws -> A? {
        if key.stringValue != "id", let index = fieldIndex(key.stringValue) {
            if row.isNull(at: index) { return nil }
            do {
                return try row.decode(A.self, at: index)
            } catch var error as ValueConversionError {
                error.attribute = "\(layout.entityName).\(key.stringValue)"
                throw error
            }
        }
        return try decodeIfPresent(A.self, forKey: key) as A?
    }

    /// Field `index` as `T`: the common attribute types read straight from the row, other attribute types through
    /// their ``AttributeValue`` conformance, anything else (a `Reference`, a wrapper) from the stored value.
    @inline(__always)
    private func decodeField<T: Decodable>(_ type: T.Type, at index: Int, key: Key) throws -> T {
        do {
            // Common concrete types first: a metatype comparison is much cheaper than a conformance cast.
            if T.self == String.self { return unsafeBitCast(try row.decode(String.self, at: index), to: T.self) }
            if T.self == Int.self { return unsafeBitCast(try row.decode(Int.self, at: index), to: T.self) }
            if T.self == Double.self { return unsafeBitCast(try row.decode(Double.self, at: index), to: T.self) }
            if T.self == Bool.self { return unsafeBitCast(try row.decode(Bool.self, at: index), to: T.self) }
            if T.self == Date.self { return unsafeBitCast(try row.decode(Date.self, at: index), to: T.self) }
            if T.self == UUID.self { return unsafeBitCast(try row.decode(UUID.self, at: index), to: T.self) }
            if let attributeType = T.self as? any AttributeValue.Type {
                return try decodeAttribute(attributeType, at: index) as! T
            }
        } catch var error as ValueConversionError {
            error.attribute = "\(layout.entityName).\(key.stringValue)"
            throw error
        }
        return try T(from: FieldDecoder(value: row[index], codingPath: [key]))
    }

    private func decodeAttribute<A: AttributeValue>(_ type: A.Type, at index: Int) throws -> A {
        try row.decode(A.self, at: index)
    }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        throw DecodingError.typeMismatch([String: Any].self, .init(codingPath: [key], debugDescription: "nested containers are stored as composite attributes"))
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        guard layout.toManyNames.contains(key.stringValue) else {
            throw DecodingError.keyNotFound(key, .init(codingPath: [], debugDescription: "no to-many relationship '\(key.stringValue)'"))
        }
        return ReferenceListContainer(ids: layout.toMany[key.stringValue] ?? [], codingPath: [key])
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
