import CLibpq
import Foundation

/// One bound parameter of a statement, sent in PostgreSQL's binary format (network byte order, no escaping).
///
/// Values are never spliced into SQL text: a statement names `$1`, `$2`, … and the values travel beside it.
/// Source: <https://www.postgresql.org/docs/current/protocol-message-formats.html> (Bind) and the `*send`
/// functions of each type.
enum PGParameter {
    case null(PGType)
    case int8(Int64)
    case int4(Int32)
    case float8(Double)
    case text(String)
    case bytea(Data)
    /// `text[]`, elements may be NULL.
    case textArray([String?])
    case uuidArray([UUID])
    case boolArray([Bool])
    case byteaArray([Data])
    /// A value already in its binary form (e.g. a `bytea[]` whose elements were written in place).
    case encoded(PGType, [UInt8])

    /// `.text(value)`, or a NULL text when `value` is nil.
    static func text(_ value: String?) -> PGParameter { value.map { .text($0) } ?? .null(.text) }

    var type: PGType {
        switch self {
        case let .null(type): return type
        case .int8: return .int8
        case .int4: return .int4
        case .float8: return .float8
        case .text: return .text
        case .bytea: return .bytea
        case .textArray: return .textArray
        case .uuidArray: return .uuidArray
        case .boolArray: return .boolArray
        case .byteaArray: return .byteaArray
        case let .encoded(type, _): return type
        }
    }

    /// The size of the binary form in bytes (0 for NULL). O(elements) for arrays.
    var encodedSize: Int {
        switch self {
        case .null: return 0
        case .int8, .float8: return 8
        case .int4: return 4
        case let .text(value): return value.utf8.count
        case let .bytea(value): return value.count
        case let .textArray(values): return 20 + values.reduce(0) { $0 + 4 + ($1?.utf8.count ?? 0) }
        case let .uuidArray(values): return 20 + 20 * values.count
        case let .boolArray(values): return 20 + 5 * values.count
        case let .byteaArray(values): return 20 + values.reduce(0) { $0 + 4 + $1.count }
        case let .encoded(_, bytes): return bytes.count
        }
    }

    /// Appends the binary form to `buffer`; returns `false` for NULL (nothing appended).
    func encode(into buffer: inout [UInt8]) -> Bool {
        switch self {
        case .null: return false
        case let .int8(value): buffer.appendBigEndian(UInt64(bitPattern: value))
        case let .int4(value): buffer.appendBigEndian(UInt32(bitPattern: value))
        case let .float8(value): buffer.appendBigEndian(value.bitPattern)
        case let .text(value): buffer.append(contentsOf: value.utf8)
        case let .bytea(value): buffer.append(contentsOf: value)
        case let .textArray(values):
            Self.arrayHeader(count: values.count, hasNull: values.contains { $0 == nil }, element: .text, into: &buffer)
            for value in values {
                if let value {
                    buffer.appendBigEndian(UInt32(value.utf8.count))
                    buffer.append(contentsOf: value.utf8)
                } else {
                    buffer.appendBigEndian(UInt32(bitPattern: -1))
                }
            }
        case let .uuidArray(values):
            Self.arrayHeader(count: values.count, hasNull: false, element: .uuid, into: &buffer)
            for value in values {
                buffer.appendBigEndian(UInt32(16))
                Swift.withUnsafeBytes(of: value.uuid) { buffer.append(contentsOf: $0) }
            }
        case let .boolArray(values):
            Self.arrayHeader(count: values.count, hasNull: false, element: .bool, into: &buffer)
            for value in values {
                buffer.appendBigEndian(UInt32(1))
                buffer.append(value ? 1 : 0)
            }
        case let .byteaArray(values):
            Self.arrayHeader(count: values.count, hasNull: false, element: .bytea, into: &buffer)
            for value in values {
                buffer.appendBigEndian(UInt32(value.count))
                buffer.append(contentsOf: value)
            }
        case let .encoded(_, bytes):
            buffer.append(contentsOf: bytes)
        }
        return true
    }

    /// The start of a one-dimensional array of `count` elements (`array_send`): dimensions, NULL flag, element type,
    /// then (length, lower bound 1) — an empty array has no dimensions. Each element follows as its length (-1 for
    /// NULL) and bytes.
    static func arrayHeader(count: Int, hasNull: Bool, element: PGType, into buffer: inout [UInt8]) {
        buffer.appendBigEndian(UInt32(count == 0 ? 0 : 1))
        buffer.appendBigEndian(UInt32(hasNull ? 1 : 0))
        buffer.appendBigEndian(element.rawValue)
        if count > 0 {
            buffer.appendBigEndian(UInt32(count))
            buffer.appendBigEndian(UInt32(1))
        }
    }
}

/// The type OIDs Replica binds and reads (`pg_type.oid`, fixed for built-in types).
enum PGType: UInt32 {
    case bool = 16, bytea = 17, int8 = 20, int4 = 23, text = 25, float8 = 701, uuid = 2950
    case boolArray = 1000, byteaArray = 1001, textArray = 1009, uuidArray = 2951
}

extension [UInt8] {
    mutating func appendBigEndian<T: FixedWidthInteger>(_ value: T) {
        Swift.withUnsafeBytes(of: value.bigEndian) { append(contentsOf: $0) }
    }
}

extension UUID {
    /// The 16 bytes of the UUID, in order (the binary form of `uuid`).
    var bytes: [UInt8] {
        withUnsafeBytes(of: uuid) { Array($0) }
    }

    /// A UUID from its 16 bytes; `nil` for any other length.
    init?(bytes: UnsafeRawBufferPointer) {
        guard bytes.count == 16 else { return nil }
        var value: uuid_t = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        withUnsafeMutableBytes(of: &value) { $0.copyMemory(from: bytes) }
        self.init(uuid: value)
    }
}

/// The rows of a statement's result, read in binary format. Owns the `PGresult` and frees it.
///
/// The accessors return `nil` for NULL and for a value whose binary form does not have the expected size: callers
/// turn that into a typed error naming the column (a server of another schema version, or a bug), never a default.
final class PGRows {
    private let result: OpaquePointer

    init(_ result: OpaquePointer) { self.result = result }
    deinit { PQclear(result) }

    var count: Int { Int(PQntuples(result)) }
    var columns: Int { Int(PQnfields(result)) }

    func isNull(_ row: Int, _ column: Int) -> Bool { PQgetisnull(result, Int32(row), Int32(column)) != 0 }

    /// The value's bytes in place (valid while this object lives); `nil` for NULL.
    func bytes(_ row: Int, _ column: Int) -> UnsafeRawBufferPointer? {
        guard row < count, column < columns, !isNull(row, column), let value = PQgetvalue(result, Int32(row), Int32(column))
        else { return nil }
        return UnsafeRawBufferPointer(start: value, count: Int(PQgetlength(result, Int32(row), Int32(column))))
    }

    func int64(_ row: Int, _ column: Int) -> Int64? {
        guard let bytes = bytes(row, column), bytes.count == 8 else { return nil }
        return Int64(bigEndian: bytes.loadUnaligned(as: Int64.self))
    }

    func int32(_ row: Int, _ column: Int) -> Int32? {
        guard let bytes = bytes(row, column), bytes.count == 4 else { return nil }
        return Int32(bigEndian: bytes.loadUnaligned(as: Int32.self))
    }

    func double(_ row: Int, _ column: Int) -> Double? {
        guard let bytes = bytes(row, column), bytes.count == 8 else { return nil }
        return Double(bitPattern: UInt64(bigEndian: bytes.loadUnaligned(as: UInt64.self)))
    }

    func bool(_ row: Int, _ column: Int) -> Bool? {
        guard let bytes = bytes(row, column), bytes.count == 1 else { return nil }
        return bytes[0] != 0
    }

    func string(_ row: Int, _ column: Int) -> String? {
        bytes(row, column).map { String(decoding: $0, as: UTF8.self) }
    }

    func data(_ row: Int, _ column: Int) -> Data? {
        bytes(row, column).map { Data($0) }
    }

    func uuid(_ row: Int, _ column: Int) -> UUID? {
        bytes(row, column).flatMap { UUID(bytes: $0) }
    }
}
