import CSQLite
import Foundation

/// A prepared SQLite statement. Internal: confined to the connection (and so the executor) that prepared it.
///
/// Parameter and column indices are 0-based here (SQLite's bind indices are 1-based; the conversion is internal).
/// Source: <https://www.sqlite.org/c3ref/stmt.html>
final class Statement {
    let handle: OpaquePointer
    let sql: String
    private unowned let connection: Connection
    /// The connection's count of allocated statements (kept by reference: a statement may outlive its connection).
    private let liveCount: LiveStatementCount

    init(connection: Connection, sql: String) throws {
        var statement: OpaquePointer?
        // `withCString` hands over a native string's own NUL-terminated bytes (passing the string itself copies them).
        let code = sql.withCString { text in
            sqlite3_prepare_v3(connection.handle, text, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        }
        guard code == SQLITE_OK, let statement else {
            throw SQLiteError(code: code, connection: connection.handle, sql: sql)
        }
        self.handle = statement
        self.sql = sql
        self.connection = connection
        self.liveCount = connection.liveStatements
        liveCount.increment()
    }

    deinit {
        sqlite3_finalize(handle)
        scratch?.deallocate()
        idBuffer?.deallocate()
        // Last (a releasing store): once `Connection.resetForReuse` sees the count drop, the finalize is done, so the
        // connection's next owner never runs beside it.
        liveCount.decrement()
    }

    // MARK: Binding

    /// Binds `value` to the parameter at 0-based `index`.
    @inline(__always)
    func bind(_ value: SQLiteValue, at index: Int32) throws {
        let code: Int32
        switch value {
        case .null: code = sqlite3_bind_null(handle, index + 1)
        case let .integer(v): code = sqlite3_bind_int64(handle, index + 1, v)
        case let .real(v): code = sqlite3_bind_double(handle, index + 1, v)
        case let .text(v): code = bindText(v, at: index)
        case let .blob(v): code = bindBlob(v, at: index)
        }
        try check(code, parameter: index)
    }

    @inline(__always)
    func bind(_ value: Int64, at index: Int32) throws {
        let code = sqlite3_bind_int64(handle, index + 1, value)
        if code != SQLITE_OK { throw SQLiteError(code: code, connection: connection.handle, sql: sql) }
    }

    @inline(__always)
    func bind(_ value: String, at index: Int32) throws {
        try check(bindText(value, at: index), parameter: index)
    }

    @inline(__always)
    func bind(_ value: Data, at index: Int32) throws {
        try check(bindBlob(value, at: index), parameter: index)
    }

    /// Binds `id`'s 16 bytes (a blob) to the parameter at 0-based `index`, from a buffer this statement owns: no
    /// allocation per call. The bytes stay valid until the next such bind or the statement's end, so a statement
    /// binds at most one parameter this way per run.
    @inline(__always)
    func bind(_ id: UUID, at index: Int32) throws {
        let buffer = idBuffer ?? {
            let buffer = UnsafeMutableRawPointer.allocate(byteCount: 16, alignment: 8)
            idBuffer = buffer
            return buffer
        }()
        withUnsafeBytes(of: id.uuid) { buffer.copyMemory(from: $0.baseAddress!, byteCount: 16) }
        try check(sqlite3_bind_blob(handle, index + 1, buffer, 16, nil))
    }

    /// The bytes of the last ID bound with `bind(_ id: UUID, at:)` (freed after the statement is finalized).
    private var idBuffer: UnsafeMutableRawPointer?

    @inline(__always)
    private func bindText(_ value: String, at index: Int32) -> Int32 {
        var value = value
        return value.withUTF8 { bindText(UnsafeRawBufferPointer($0), at: index, copying: true) }
    }

    @inline(__always)
    private func bindBlob(_ value: Data, at index: Int32) -> Int32 {
        value.withUnsafeBytes { bindBlob($0, at: index, copying: true) }
    }

    /// Binds `bytes` (UTF-8) as text to the parameter at 0-based `index`; `copying`: SQLite copies them
    /// (`SQLITE_TRANSIENT`), else they must stay valid until the statement is reset (`SQLITE_STATIC`). Returns SQLite's
    /// result code. The length is passed as 64 bits (`sqlite3_bind_text64`): text longer than `int` holds, or than the
    /// connection's `SQLITE_LIMIT_LENGTH`, is refused with `SQLITE_TOOBIG` before SQLite reads it — never truncated,
    /// never a trap. Source: <https://www.sqlite.org/c3ref/bind_blob.html>
    @inline(__always)
    func bindText(_ bytes: UnsafeRawBufferPointer, at index: Int32, copying: Bool) -> Int32 {
        // An empty string still binds TEXT (not NULL): SQLite needs a non-nil pointer for that.
        let base = (bytes.baseAddress ?? UnsafeRawPointer(("" as StaticString).utf8Start)).assumingMemoryBound(to: CChar.self)
        return replica_sqlite3_bind_text64(handle, index + 1, base, Self.byteCount(bytes.count), copying ? 1 : 0)
    }

    /// Binds `bytes` as a blob to the parameter at 0-based `index` (as ``bindText(_:at:copying:)``, with
    /// `sqlite3_bind_blob64`). A zero-length blob is still a blob, not NULL.
    @inline(__always)
    func bindBlob(_ bytes: UnsafeRawBufferPointer, at index: Int32, copying: Bool) -> Int32 {
        guard let base = bytes.baseAddress, !bytes.isEmpty else { return sqlite3_bind_zeroblob(handle, index + 1, 0) }
        return replica_sqlite3_bind_blob64(handle, index + 1, base, Self.byteCount(bytes.count), copying ? 1 : 0)
    }

    /// A byte count as the 64-bit length SQLite's `*64` binding functions take (a buffer's count is never negative).
    @inline(__always)
    static func byteCount(_ count: Int) -> sqlite3_uint64 { sqlite3_uint64(UInt(bitPattern: max(0, count))) }

    /// Binds the bytes of `text`, a literal (whose storage lives as long as the program), without a copy.
    @inline(__always)
    func bindStatic(_ text: StaticString, at index: Int32) throws {
        try check(bindText(UnsafeRawBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount), at: index, copying: false),
                  parameter: index)
    }

    /// Binds `text` (NULL when `nil`) to the parameter at 0-based `index` without a copy and runs `body`, which must
    /// step the statement: the binding is only valid inside it (the caller resets the statement afterwards).
    @inline(__always)
    func withStaticText<R>(_ text: String?, at index: Int32, _ body: () throws -> R) throws -> R {
        guard var text else {
            try check(sqlite3_bind_null(handle, index + 1))
            return try body()
        }
        return try text.withUTF8 { bytes in
            try check(bindText(UnsafeRawBufferPointer(bytes), at: index, copying: false), parameter: index)
            return try body()
        }
    }

    /// Binds `bytes` as a blob to the parameter at 0-based `index` without a copy and runs `body` (see
    /// ``withStaticText(_:at:_:)``).
    @inline(__always)
    func withStaticBlob<R>(_ bytes: Data, at index: Int32, _ body: () throws -> R) throws -> R {
        try bytes.withUnsafeBytes { buffer in
            try check(bindBlob(buffer, at: index, copying: false), parameter: index)
            return try body()
        }
    }

    /// Binds `count` bytes of text, written by `writing` into a stack buffer, to the parameter at 0-based `index`
    /// without a copy, and runs `body` (see ``withStaticText(_:at:_:)``): text of a fixed length bound without
    /// allocating a `String`. `writing` must initialize all `count` bytes (UTF-8).
    @inline(__always)
    func withStaticText<R>(count: Int, writing: (UnsafeMutableBufferPointer<UInt8>) -> Void, at index: Int32,
                           _ body: () throws -> R) throws -> R {
        try withUnsafeTemporaryAllocation(of: UInt8.self, capacity: count) { buffer in
            writing(buffer)
            try check(bindText(UnsafeRawBufferPointer(buffer), at: index, copying: false), parameter: index)
            return try body()
        }
    }

    /// Binds each value in order, starting at parameter 0 (see ``bindCopying(_:id:)``).
    func bind(_ values: [SQLiteValue]) throws {
        try bindCopying(values, id: nil)
    }

    /// Binds `id`'s 16 bytes to parameter 0 and `values` to the parameters after it, then runs `body` (which
    /// steps): the fast path of row writes.
    func withBound<R>(id: UUID, _ values: [SQLiteValue], _ body: () throws -> R) throws -> R {
        try bindCopying(values, id: id)
        return try body()
    }

    /// Binds `values` (after `id`'s 16 bytes, when given) starting at parameter 0. Text and blob bytes are copied
    /// once into a buffer this statement owns and bound from there (`SQLITE_STATIC`), so binding allocates nothing
    /// (SQLite's own copy, `SQLITE_TRANSIENT`, costs a malloc and a free per value); the buffer stays valid until the
    /// next bind of this statement or its end. Rows larger than ``scratchLimit`` are bound with SQLite's copies
    /// instead, so that no statement keeps a large buffer.
    private func bindCopying(_ values: [SQLiteValue], id: UUID?) throws {
        var total = id == nil ? 0 : 16
        for value in values {
            switch value {
            case let .text(v): total += v.utf8.count
            case let .blob(v): total += v.count
            default: break
            }
        }
        let first: Int32 = id == nil ? 0 : 1
        if total > Self.scratchLimit {
            if let id { try bind(id.sqliteValue, at: 0) }
            for (index, value) in values.enumerated() { try bind(value, at: Int32(index) + first) }
            return
        }
        if scratch == nil || total > scratchCapacity {
            scratch?.deallocate()
            scratchCapacity = max(total, 2 * scratchCapacity, 256)
            scratch = UnsafeMutableRawPointer.allocate(byteCount: scratchCapacity, alignment: 16)
        }
        let buffer = scratch!
        var offset = 0
        if let id {
            withUnsafeBytes(of: id.uuid) { buffer.copyMemory(from: $0.baseAddress!, byteCount: 16) }
            try check(sqlite3_bind_blob(handle, 1, buffer, 16, nil))
            offset = 16
        }
        for (index, value) in values.enumerated() {
            let parameter = Int32(index) + first + 1
            switch value {
            case .null: try check(sqlite3_bind_null(handle, parameter))
            case let .integer(v): try check(sqlite3_bind_int64(handle, parameter, v))
            case let .real(v): try check(sqlite3_bind_double(handle, parameter, v))
            case var .text(v):
                let count = v.withUTF8 { bytes -> Int in
                    if let base = bytes.baseAddress { (buffer + offset).copyMemory(from: base, byteCount: bytes.count) }
                    return bytes.count
                }
                try check(bindText(UnsafeRawBufferPointer(start: buffer + offset, count: count), at: parameter - 1, copying: false),
                          parameter: parameter - 1)
                offset += count
            case let .blob(v):
                if !v.isEmpty { v.withUnsafeBytes { (buffer + offset).copyMemory(from: $0.baseAddress!, byteCount: $0.count) } }
                try check(bindBlob(UnsafeRawBufferPointer(start: buffer + offset, count: v.count), at: parameter - 1, copying: false),
                          parameter: parameter - 1)
                offset += v.count
            }
        }
    }

    /// Rows whose text and blobs exceed this many bytes are bound with SQLite's own copies.
    static let scratchLimit = 64 * 1024

    /// Bytes bound by ``bindCopying(_:id:)`` (owned by this statement; freed after the statement is finalized).
    private var scratch: UnsafeMutableRawPointer?
    private var scratchCapacity = 0

    @inline(__always)
    private func check(_ code: Int32) throws {
        if code != SQLITE_OK { throw SQLiteError(code: code, connection: connection.handle, sql: sql) }
    }

    /// ``check(_:)`` for the binding of the parameter at 0-based `index`: the error names the parameter (1-based, as
    /// SQL counts them) — never its value — so a value too big to bind (`SQLITE_TOOBIG`) can be traced to its column.
    @inline(__always)
    func check(_ code: Int32, parameter index: Int32) throws {
        guard code != SQLITE_OK else { return }
        let error = SQLiteError(code: code, connection: connection.handle, sql: sql)
        // A binding that fails leaves no message of its own (`sqlite3_errmsg` may describe an earlier failure):
        // SQLite's text for the code, and the parameter.
        throw SQLiteError(extendedResultCode: error.resultCode == (code & 0xFF) ? error.extendedResultCode : code,
                          message: "\(String(cString: sqlite3_errstr(code))) (parameter \(index + 1))", sql: sql)
    }

    // MARK: Stepping

    /// Advances to the next row. Returns `true` when a row is available, `false` when the statement is done.
    @inline(__always)
    func step() throws -> Bool {
        let code = sqlite3_step(handle)
        if code == SQLITE_ROW { return true }
        if code == SQLITE_DONE { return false }
        throw SQLiteError(code: code, connection: connection.handle, sql: sql)
    }

    /// Resets the statement so it can run again, and clears its bindings (unless the caller already did).
    @inline(__always)
    func reset(clearingBindings: Bool = true) {
        sqlite3_reset(handle)
        if clearingBindings { sqlite3_clear_bindings(handle) }
    }

    /// Runs the statement to completion with `values` bound, then resets it.
    func run(_ values: [SQLiteValue] = []) throws {
        defer { reset() }
        try bind(values)
        while try step() {}
    }

    // MARK: Columns

    var columnCount: Int32 { sqlite3_column_count(handle) }

    func columnName(_ index: Int32) -> String { String(cString: sqlite3_column_name(handle, index)) }

    @inline(__always)
    func isNull(_ index: Int32) -> Bool { sqlite3_column_type(handle, index) == SQLITE_NULL }

    @inline(__always)
    func int64(_ index: Int32) -> Int64 { sqlite3_column_int64(handle, index) }

    @inline(__always)
    func double(_ index: Int32) -> Double { sqlite3_column_double(handle, index) }

    @inline(__always)
    func string(_ index: Int32) -> String {
        guard let pointer = sqlite3_column_text(handle, index) else { return "" }
        let count = Int(sqlite3_column_bytes(handle, index))
        return String(decoding: UnsafeBufferPointer(start: pointer, count: count), as: UTF8.self)
    }

    @inline(__always)
    func data(_ index: Int32) -> Data {
        let count = Int(sqlite3_column_bytes(handle, index))
        guard count > 0, let pointer = sqlite3_column_blob(handle, index) else { return Data() }
        return Data(bytes: pointer, count: count)
    }

    /// The bytes of the blob column at `index`, in place: valid only until the statement is stepped, reset or
    /// finalized (copy what must outlive that).
    @inline(__always)
    func blob(_ index: Int32) -> UnsafeRawBufferPointer {
        guard let pointer = sqlite3_column_blob(handle, index) else { return UnsafeRawBufferPointer(start: nil, count: 0) }
        return UnsafeRawBufferPointer(start: pointer, count: Int(sqlite3_column_bytes(handle, index)))
    }

    /// The column at `index` as a UUID, when it is a 16-byte blob (read in place, without a `Data`); `nil` for any
    /// other value (text of 16 bytes included).
    @inline(__always)
    func uuid(_ index: Int32) -> UUID? {
        guard sqlite3_column_type(handle, index) == SQLITE_BLOB, sqlite3_column_bytes(handle, index) == 16,
              let pointer = sqlite3_column_blob(handle, index) else { return nil }
        var uuid = UUID.unassigned.uuid
        withUnsafeMutableBytes(of: &uuid) { $0.copyMemory(from: UnsafeRawBufferPointer(start: pointer, count: 16)) }
        return UUID(uuid: uuid)
    }

    /// The column at `index` as a dynamic value, in the storage class SQLite reports for it.
    @inline(__always)
    func value(_ index: Int32) -> SQLiteValue {
        switch sqlite3_column_type(handle, index) {
        case SQLITE_INTEGER: return .integer(int64(index))
        case SQLITE_FLOAT: return .real(double(index))
        case SQLITE_TEXT: return .text(string(index))
        case SQLITE_BLOB: return .blob(data(index))
        default: return .null
        }
    }
}
