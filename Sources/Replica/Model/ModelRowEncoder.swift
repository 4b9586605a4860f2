import Foundation

/// A model stored through its `Codable` conformance: the convenience path.
///
/// By default a model's field values are read with the key paths of its ``PersistentModel/entity`` (one typed getter
/// per field). A model that adopts this protocol is encoded through its `encode(to:)` instead — usually the one the
/// compiler synthesizes — and decoded through `init(from:)` (the default ``PersistentModel/init(row:)``), as with
/// GRDB's Codable records:
///
/// ```swift
/// struct Note: CodablePersistentModel {
///     var id = UUID.unassigned
///     var title: String = ""
///     var body: String?
///     static let entity = ModelEntity<Note>([
///         .attribute("title", \.title, default: ""),
///         .attribute("body", \.body),
///     ])
/// }
/// ```
///
/// Rules: a coding key is an attribute or to-one relationship name (property name = attribute name); the `id` key and
/// keys that name no stored field (to-many relationships, transient properties) are skipped; a value is an
/// ``AttributeValue`` or a single-value wrapper of one (such as ``Reference``). A field that `encode(to:)` does not
/// write is read with its key path, so a custom `encode(to:)` that leaves a field out never stores a wrong NULL.
/// No reflection (`Mirror`) is involved. The entity's key paths still describe the schema, predicates and sorts.
///
/// Cost: one keyed-container call per field plus a dynamic cast for non-primitive values — slower than the key-path
/// path (`replica-bench` B2 measures it against B1's raw baseline).
public protocol CodablePersistentModel: PersistentModel, Codable {}

/// Makes the Codable row encoder of `Model` (called once per entity, when `Model` adopts ``CodablePersistentModel``).
/// Returns a `(Model) -> [SQLiteValue]` as `Any`, because the caller only knows `Model` as a `PersistentModel`.
func makeCodableRowEncoder<Model: CodablePersistentModel>(_ type: Model.Type, layout: RowEncodingLayout, fallback: Any) -> Any {
    let fallback = fallback as! [(Model) -> SQLiteValue]
    let encode: (Model) -> [SQLiteValue] = { model in
        let state = RowEncodingState(layout: layout)
        do {
            try model.encode(to: ModelRowEncoder(state: state))
        } catch {
            preconditionFailure("Replica: \(Model.self).encode(to:) failed: \(error)")
        }
        state.fillUnwritten { fallback[$0](model) }
        return state.values
    }
    return encode
}

/// Where each coding key goes: field names in ``Schema/Entity/fieldNames`` order, and which fields are required
/// to-one references (whose unassigned ID is stored as NULL, as the key-path path does).
final class RowEncodingLayout: Sendable {
    let names: [String]
    let indexByName: [String: Int]
    let requiredReference: [Bool]

    init(entity: Schema.Entity) {
        names = entity.fieldNames
        var byName: [String: Int] = [:]
        for (index, name) in names.enumerated() { byName[name] = index }
        indexByName = byName
        requiredReference = entity.attributes.map { _ in false } + entity.toOneRelationships.map { !$0.isOptional }
    }
}

/// The values of one model being encoded.
final class RowEncodingState {
    // The state belongs to one encoding on one thread: exclusivity is checked statically, not per access.
    let layout: RowEncodingLayout
    @exclusivity(unchecked) var values: [SQLiteValue]
    /// Which fields were written (bit per field; fields past 64 in `writtenHigh`).
    @exclusivity(unchecked) private var written: UInt64 = 0
    @exclusivity(unchecked) private var writtenHigh: Set<Int> = []
    /// The field after the last one written: synthesized `encode(to:)` writes in declaration order, so the next key
    /// usually names this field and needs no dictionary lookup.
    @exclusivity(unchecked) private var cursor = 0

    init(layout: RowEncodingLayout) {
        self.layout = layout
        values = Array(repeating: .null, count: layout.names.count)
    }

    /// The field index of coding key `name`, or `nil` when it names no stored field.
    @inline(__always)
    func index(of name: String) -> Int? {
        let names = layout.names
        if cursor < names.count && names[cursor] == name {
            cursor += 1
            return cursor - 1
        }
        guard name != "id", let index = layout.indexByName[name] else { return nil }
        cursor = index + 1
        return index
    }

    @inline(__always)
    func set(_ index: Int, _ value: SQLiteValue) {
        if layout.requiredReference[index], case let .blob(bytes) = value, bytes.count == 16, bytes.allSatisfy({ $0 == 0 }) {
            values[index] = .null
        } else {
            values[index] = value
        }
        if index < 64 { written |= 1 << UInt64(index) } else { writtenHigh.insert(index) }
    }

    /// Calls `value` for every field not written and stores the result.
    func fillUnwritten(_ value: (Int) -> SQLiteValue) {
        for index in values.indices {
            let done = index < 64 ? written & (1 << UInt64(index)) != 0 : writtenHigh.contains(index)
            if !done { values[index] = value(index) }
        }
    }
}

/// The `Encoder` a ``CodablePersistentModel`` encodes itself into: one keyed container, property name = field name.
struct ModelRowEncoder: Encoder {
    let state: RowEncodingState
    var codingPath: [any CodingKey] { [] }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        KeyedEncodingContainer(RowKeyedEncodingContainer<Key>(state: state))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        preconditionFailure("Replica: a CodablePersistentModel must encode itself into a keyed container")
    }

    func singleValueContainer() -> any SingleValueEncodingContainer {
        preconditionFailure("Replica: a CodablePersistentModel must encode itself into a keyed container")
    }
}

private struct RowKeyedEncodingContainer<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let state: RowEncodingState
    var codingPath: [any CodingKey] { [] }

    mutating func encodeNil(forKey key: Key) throws {
        if let index = state.index(of: key.stringValue) { state.set(index, .null) }
    }

    mutating func encode(_ value: String, forKey key: Key) throws {
        if let index = state.index(of: key.stringValue) { state.set(index, .text(value)) }
    }

    mutating func encode(_ value: Int, forKey key: Key) throws {
        if let index = state.index(of: key.stringValue) { state.set(index, .integer(Int64(value))) }
    }

    mutating func encode(_ value: Double, forKey key: Key) throws {
        if let index = state.index(of: key.stringValue) { state.set(index, .real(value)) }
    }

    mutating func encode(_ value: Bool, forKey key: Key) throws {
        if let index = state.index(of: key.stringValue) { state.set(index, .integer(value ? 1 : 0)) }
    }

    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        guard let index = state.index(of: key.stringValue) else { return }
        state.set(index, try FieldValueEncoder.value(of: value, key: key))
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
        preconditionFailure("Replica: field '\(key.stringValue)' is not an attribute value (adopt CompositeAttribute for a struct)")
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        preconditionFailure("Replica: field '\(key.stringValue)' is not an attribute value")
    }

    mutating func superEncoder() -> any Encoder { ModelRowEncoder(state: state) }
    mutating func superEncoder(forKey key: Key) -> any Encoder { ModelRowEncoder(state: state) }
}

/// Encodes one field value: an ``AttributeValue`` directly, anything else as a single-value wrapper of one.
private final class FieldValueEncoder: Encoder, SingleValueEncodingContainer {
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }
    var captured: SQLiteValue?

    init(codingPath: [any CodingKey]) { self.codingPath = codingPath }

    static func value<T: Encodable>(of value: T, key: any CodingKey) throws -> SQLiteValue {
        // Common attribute types by type identity (cheap) before the protocol cast (a conformance lookup).
        if T.self == Date.self { return (value as! Date).sqliteValue }
        if T.self == Data.self { return (value as! Data).sqliteValue }
        if T.self == UUID.self { return (value as! UUID).sqliteValue }
        if let attribute = value as? any AttributeValue { return attribute.sqliteValue }
        let encoder = FieldValueEncoder(codingPath: [key])
        try value.encode(to: encoder)
        guard let captured = encoder.captured else {
            throw EncodingError.invalidValue(value, .init(codingPath: [key], debugDescription: "the value encoded nothing"))
        }
        return captured
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        preconditionFailure("Replica: field '\(codingPath.first?.stringValue ?? "?")' is not an attribute value (adopt CompositeAttribute for a struct)")
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        preconditionFailure("Replica: field '\(codingPath.first?.stringValue ?? "?")' is not an attribute value")
    }

    func singleValueContainer() -> any SingleValueEncodingContainer { self }

    func encodeNil() throws { captured = .null }
    func encode(_ value: String) throws { captured = .text(value) }
    func encode(_ value: Int) throws { captured = .integer(Int64(value)) }
    func encode(_ value: Double) throws { captured = .real(value) }
    func encode(_ value: Bool) throws { captured = .integer(value ? 1 : 0) }
    func encode<T: Encodable>(_ value: T) throws {
        // One level of wrapping only: a wrapper of a wrapper (or of a non-attribute type) is not a field value.
        guard let attribute = value as? any AttributeValue else {
            throw EncodingError.invalidValue(value, .init(codingPath: codingPath, debugDescription: "\(T.self) is not an attribute value"))
        }
        captured = attribute.sqliteValue
    }
}
