import Foundation

/// A Swift type that can be stored in an attribute. Replica provides conformances for `String`, `Int`, `Double`,
/// `Bool`, `Date`, `Data`, `UUID`, `URL`, `Optional` of those, and any `Codable` struct that adopts
/// ``CompositeAttribute``.
///
/// Conversions are direct (no reflection): one `switch` per value.
public protocol AttributeValue: Sendable {
    /// The schema type of the attribute.
    static var attributeType: Schema.AttributeType { get }
    /// Whether `nil` is a valid value (true only for `Optional`).
    static var isOptionalAttribute: Bool { get }
    /// The stored form of the value.
    var sqliteValue: SQLiteValue { get }
    /// Reads a value back from its stored form.
    /// - Throws: ``ValueConversionError`` when the stored value has the wrong storage class.
    init(sqliteValue: SQLiteValue) throws(ValueConversionError)
    /// Reads the value of field `index` of `row`: the fast path of ``ModelRow/decode(_:at:)``. The built-in types
    /// read straight from the SQLite statement; the default goes through ``init(sqliteValue:)``.
    /// - Throws: ``ValueConversionError`` when the stored value has the wrong storage class.
    static func decode(from row: ModelRow, at index: Int) throws(ValueConversionError) -> Self
}

extension AttributeValue {
    public static var isOptionalAttribute: Bool { false }

    public static func decode(from row: ModelRow, at index: Int) throws(ValueConversionError) -> Self {
        try Self(sqliteValue: row[index])
    }
}

/// A stored value could not be read as the type the model declares. Names the expected type and the storage class
/// found, never the value.
public struct ValueConversionError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The Swift type that was expected.
    public let expected: String
    /// The storage class found (e.g. `TEXT(5 bytes)`, `NULL`).
    public let found: String
    /// The attribute, when known.
    public var attribute: String?
    /// Why the stored value has that class, when Replica can tell (e.g. a reference to an external-storage file read
    /// by a schema that does not mark the attribute `.externalStorage`).
    public var cause: String?

    public init(expected: String, found: SQLiteValue, attribute: String? = nil) {
        self.expected = expected
        self.found = found.description
        self.attribute = attribute
    }

    public var description: String {
        "cannot read \(attribute.map { "attribute '\($0)' as " } ?? "")\(expected) from a stored \(found)" + (cause.map { ": \($0)" } ?? "")
    }
}

extension String: AttributeValue {
    public static var attributeType: Schema.AttributeType { .string }
    @inlinable public var sqliteValue: SQLiteValue { .text(self) }
    public init(sqliteValue: SQLiteValue) throws(ValueConversionError) {
        guard case let .text(v) = sqliteValue else { throw ValueConversionError(expected: "String", found: sqliteValue) }
        self = v
    }
}

extension Int: AttributeValue {
    public static var attributeType: Schema.AttributeType { .integer }
    @inlinable public var sqliteValue: SQLiteValue { .integer(Int64(self)) }
    public init(sqliteValue: SQLiteValue) throws(ValueConversionError) {
        switch sqliteValue {
        case let .integer(v): self = Int(v)
        case let .real(v) where v.rounded() == v && abs(v) < 9.2e18: self = Int(v)
        default: throw ValueConversionError(expected: "Int", found: sqliteValue)
        }
    }
}

extension Double: AttributeValue {
    public static var attributeType: Schema.AttributeType { .double }
    @inlinable public var sqliteValue: SQLiteValue { .real(self) }
    public init(sqliteValue: SQLiteValue) throws(ValueConversionError) {
        switch sqliteValue {
        case let .real(v): self = v
        case let .integer(v): self = Double(v)
        default: throw ValueConversionError(expected: "Double", found: sqliteValue)
        }
    }
}

extension Bool: AttributeValue {
    public static var attributeType: Schema.AttributeType { .bool }
    @inlinable public var sqliteValue: SQLiteValue { .integer(self ? 1 : 0) }
    public init(sqliteValue: SQLiteValue) throws(ValueConversionError) {
        guard case let .integer(v) = sqliteValue else { throw ValueConversionError(expected: "Bool", found: sqliteValue) }
        self = v != 0
    }
}

extension Date: AttributeValue {
    public static var attributeType: Schema.AttributeType { .date }
    /// Seconds since 1970-01-01T00:00:00Z, so SQLite's date functions read it with the `unixepoch` modifier.
    @inlinable public var sqliteValue: SQLiteValue { .real(timeIntervalSince1970) }
    public init(sqliteValue: SQLiteValue) throws(ValueConversionError) {
        switch sqliteValue {
        case let .real(v): self = Date(timeIntervalSince1970: v)
        case let .integer(v): self = Date(timeIntervalSince1970: Double(v))
        default: throw ValueConversionError(expected: "Date", found: sqliteValue)
        }
    }
}

extension Data: AttributeValue {
    public static var attributeType: Schema.AttributeType { .data }
    @inlinable public var sqliteValue: SQLiteValue { .blob(self) }
    public init(sqliteValue: SQLiteValue) throws(ValueConversionError) {
        guard case let .blob(v) = sqliteValue else {
            var error = ValueConversionError(expected: "Data", found: sqliteValue)
            if case let .text(text) = sqliteValue, AssetReference.parse(text) != nil {
                error.cause = "the column holds a reference to an external-storage file (the schema that wrote it marks the attribute .externalStorage): declare the attribute .externalStorage too, as the app's schema does"
            }
            throw error
        }
        self = v
    }
}

extension UUID: AttributeValue {
    public static var attributeType: Schema.AttributeType { .uuid }
    /// The 16 bytes of the UUID, in network order.
    public var sqliteValue: SQLiteValue { .blob(bytes) }
    public init(sqliteValue: SQLiteValue) throws(ValueConversionError) {
        guard case let .blob(v) = sqliteValue, let uuid = UUID(bytes: v) else {
            throw ValueConversionError(expected: "UUID", found: sqliteValue)
        }
        self = uuid
    }

    /// The 16 bytes of the UUID.
    var bytes: Data {
        withUnsafeBytes(of: uuid) { Data($0) }
    }

    /// The UUID's bytes as two big-endian halves: comparing them compares the bytes in order.
    @inline(__always)
    var orderedHalves: (UInt64, UInt64) {
        withUnsafeBytes(of: uuid) { raw in
            (UInt64(bigEndian: raw.loadUnaligned(fromByteOffset: 0, as: UInt64.self)),
             UInt64(bigEndian: raw.loadUnaligned(fromByteOffset: 8, as: UInt64.self)))
        }
    }

    /// Whether this UUID's bytes precede `other`'s in lexicographic order (`bytes.lexicographicallyPrecedes`,
    /// without allocating): the order of time-ordered IDs.
    @inline(__always)
    func bytesPrecede(_ other: UUID) -> Bool {
        let (a0, a1) = orderedHalves, (b0, b1) = other.orderedHalves
        return a0 != b0 ? a0 < b0 : a1 < b1
    }

    /// A UUID from exactly 16 bytes.
    init?(bytes: Data) {
        guard bytes.count == 16 else { return nil }
        var raw: uuid_t = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        withUnsafeMutableBytes(of: &raw) { $0.copyBytes(from: bytes) }
        self.init(uuid: raw)
    }
}

extension URL: AttributeValue {
    public static var attributeType: Schema.AttributeType { .url }
    public var sqliteValue: SQLiteValue { .text(absoluteString) }
    public init(sqliteValue: SQLiteValue) throws(ValueConversionError) {
        guard case let .text(v) = sqliteValue, let url = URL(string: v) else {
            throw ValueConversionError(expected: "URL", found: sqliteValue)
        }
        self = url
    }
}

extension Optional: AttributeValue where Wrapped: AttributeValue {
    public static var attributeType: Schema.AttributeType { Wrapped.attributeType }
    public static var isOptionalAttribute: Bool { true }
    @inlinable public var sqliteValue: SQLiteValue {
        switch self {
        case .none: return .null
        case let .some(v): return v.sqliteValue
        }
    }
    public init(sqliteValue: SQLiteValue) throws(ValueConversionError) {
        if case .null = sqliteValue { self = .none } else { self = .some(try Wrapped(sqliteValue: sqliteValue)) }
    }
}

/// Marks `Optional` attribute types so that code holding only a metatype can find the wrapped type. Internal.
protocol OptionalAttributeMarker {
    static var wrappedAttributeType: any AttributeValue.Type { get }
}

extension Optional: OptionalAttributeMarker where Wrapped: AttributeValue {
    static var wrappedAttributeType: any AttributeValue.Type { Wrapped.self }
}

/// A `Codable` struct stored inline in one attribute (SwiftData's composite attributes), as JSON text with sorted
/// keys. Its members are queryable from predicates through SQLite's JSON functions.
///
/// Adopt it with an empty extension (`extension Address: CompositeAttribute {}`); list ``queryableMembers`` to let
/// predicates and sort descriptors reach into it in SQL (`#Predicate<Person> { $0.homeAddress.city == "Paris" }`
/// becomes `json_extract("homeAddress", '$.city') = ?`). Members that are not listed are still usable in predicates;
/// they are evaluated in memory after the SQL part.
public protocol CompositeAttribute: AttributeValue, Codable, Equatable {
    /// The members reachable from predicates and sort descriptors in SQL, each with its JSON key (its coding key).
    /// Default: none.
    static var queryableMembers: [CompositeMember<Self>] { get }
}

extension CompositeAttribute {
    public static var queryableMembers: [CompositeMember<Self>] { [] }
}

/// One member of a ``CompositeAttribute`` that predicates and sort descriptors can reach in SQL.
///
/// Strings, integers, doubles, booleans and dates (JSON numbers of seconds since 2001, as `JSONEncoder` writes them),
/// their optionals, and nested composite attributes are supported; members of other types are evaluated in memory.
public struct CompositeMember<Root>: @unchecked Sendable {
    // @unchecked: key paths are immutable.
    /// The JSON key: the member's coding key.
    public let key: String
    let keyPath: AnyKeyPath
    let valueType: any AttributeValue.Type

    /// A member with JSON key `key`, read through `keyPath`.
    public static func member<Value: AttributeValue>(_ key: String, _ keyPath: KeyPath<Root, Value>) -> CompositeMember {
        CompositeMember(key: key, keyPath: keyPath, valueType: Value.self)
    }
}

extension CompositeAttribute {
    public static var attributeType: Schema.AttributeType { .composite }
    public var sqliteValue: SQLiteValue {
        // Encoding a Codable struct of plain values into JSON does not fail (non-finite doubles included, see
        // ReplicaJSON); a custom encode(to:) that throws is a programmer error in the composite type.
        guard let data = try? ReplicaJSON.encoder().encode(self) else {
            preconditionFailure("Replica: composite attribute \(Self.self) failed to encode as JSON")
        }
        return .text(String(decoding: data, as: UTF8.self))
    }
    public init(sqliteValue: SQLiteValue) throws(ValueConversionError) {
        guard case let .text(json) = sqliteValue,
              let value = try? ReplicaJSON.decoder().decode(Self.self, from: Data(json.utf8)) else {
            throw ValueConversionError(expected: "\(Self.self)", found: sqliteValue)
        }
        self = value
    }
}
