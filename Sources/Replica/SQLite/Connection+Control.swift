import CSQLite
import Foundation

extension Connection {
    /// Whether the file this connection has open is no longer the one at its path (deleted, or replaced by another
    /// file): SQLite's `SQLITE_FCNTL_HAS_MOVED`. `false` when SQLite cannot tell.
    /// Source: <https://www.sqlite.org/c3ref/c_fcntl_begin_atomic_write.html>
    var fileHasMoved: Bool {
        var moved: Int32 = 0
        return sqlite3_file_control(handle, "main", SQLITE_FCNTL_HAS_MOVED, &moved) == SQLITE_OK && moved != 0
    }

    /// Tells SQLite to keep the write-ahead log and shared-memory files when this connection closes
    /// (`SQLITE_FCNTL_PERSIST_WAL`), so that closing it cannot unlink them by name. Failures are ignored.
    func persistWAL() {
        var persist: Int32 = 1
        _ = sqlite3_file_control(handle, "main", SQLITE_FCNTL_PERSIST_WAL, &persist)
    }

    /// Registers the deterministic scalar SQL function `name` of `arguments` UTF-8 arguments, implemented by `body`
    /// (a C function: it captures nothing; it reads its arguments and sets its result with SQLite's C API).
    /// Registering a name again replaces its definition.
    /// - Throws: ``SQLiteError`` when SQLite refuses the definition.
    func createFunction(name: String, arguments: Int32,
                        _ body: @escaping @convention(c) (OpaquePointer?, Int32, UnsafeMutablePointer<OpaquePointer?>?) -> Void) throws {
        let code = sqlite3_create_function_v2(handle, name, arguments, SQLITE_UTF8 | SQLITE_DETERMINISTIC, nil, body, nil, nil, nil)
        if code != SQLITE_OK { throw SQLiteError(code: code, connection: handle) }
    }

    /// `SQLITE_TRANSIENT` (a C macro Swift cannot import): SQLite copies a SQL function's result (or a
    /// bound value) before the call returns.
    nonisolated(unsafe) static let sqliteTransient = unsafeBitCast(OpaquePointer(bitPattern: -1), to: sqlite3_destructor_type.self)
}

extension SQLiteError {
    /// Whether the database or disk is full (`SQLITE_FULL`).
    var isFull: Bool { resultCode == SQLITE_FULL }

    /// SQLite's English text for ``extendedResultCode`` (`sqlite3_errstr`).
    var resultCodeText: String { String(cString: sqlite3_errstr(extendedResultCode)) }
}
