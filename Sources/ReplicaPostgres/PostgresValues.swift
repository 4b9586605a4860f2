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
            Self.encodeArray(values.map { $0.map { Array($0.utf8) } }, element: .text, into: &buffer)
        case let .uuidArray(values):
            Self.encodeArray(values.map { Optional($0.bytes) }, element: .uuid, into: &buffer)
        case let .boolArray(values):
            Self.encodeArray(values.map { Optional([$0 ? 1 : 0]) }, element: .bool, into: &buffer)
        case let .byteaArray(values):
            Self.encodeArray(values.map { Optional(Array($0)) }, element: .bytea, into: &buffer)
        }
        return true
    }

    /// A one-dimensional array: dimensions, NULL flag, element type, (length, lower bound 1), then each element as
    /// its length (-1 for NULL) and bytes. An empty array has no dimensions (`array_send`).
    private static func encodeArray(_ elements: [[UInt8]?], element: PGType, into buffer: inout [UInt8]) {
        buffer.appendBigEndian(UInt32(elements.isEmpty ? 0 : 1))
        buffer.appendBigEndian(UInt32(elements.contains { $0 == nil } ? 1 : 0))
        buffer.appendBigEndian(element.rawValue)
        if !elements.isEmpty {
            buffer.appendBigEndian(UInt32(elements.count))
            buffer.appendBigEndian(UInt32(1))
        }
        for value in elements {
            if let value {
                buffer.appendBigEndian(UInt32(value.count))
                buffer.append(contentsOf: value)
            } else {
                buffer.appendBigEndian(UInt32(bitPattern: -1))
            }
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

    private func bytes(_ row: Int, _ column: Int) -> UnsafeRawBufferPointer? {
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
