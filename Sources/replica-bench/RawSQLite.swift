import CSQLite
import Foundation

/// The raw C baseline's connection: `sqlite3_*` calls only, with the settings Replica applies to every store
/// connection (same open flags, extended result codes, 5 s busy timeout, `journal_mode=WAL`, `synchronous=NORMAL`,
/// `foreign_keys=ON`). The baselines' hot loops call `sqlite3_bind_*`, `sqlite3_step`, `sqlite3_column_*` and
/// `sqlite3_reset` themselves; this type only opens, prepares and checks.
final class RawDB {
    let db: OpaquePointer

    init(path: String) {
        var handle: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_URI
        guard sqlite3_open_v2(path, &handle, flags, nil) == SQLITE_OK, let handle else {
            fatalError("raw: cannot open \(path)")
        }
        db = handle
        sqlite3_extended_result_codes(db, 1)
        sqlite3_busy_timeout(db, 5_000)
        exec("PRAGMA journal_mode=WAL")
        exec("PRAGMA synchronous=NORMAL")
        exec("PRAGMA foreign_keys=ON")
    }

    deinit { sqlite3_close_v2(db) }

    func exec(_ sql: String) {
        let rc = sqlite3_exec(db, sql, nil, nil, nil)
        if rc != SQLITE_OK { fail(rc, sql) }
    }

    /// Prepares `sql` once (as Replica's statement cache does: `SQLITE_PREPARE_PERSISTENT`).
    func prepare(_ sql: String) -> OpaquePointer {
        var statement: OpaquePointer?
        let rc = sqlite3_prepare_v3(db, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard rc == SQLITE_OK, let statement else { fail(rc, sql) }
        return statement
    }

    /// Steps a statement that returns no rows, then resets it.
    @inline(__always)
    func done(_ statement: OpaquePointer) {
        let rc = sqlite3_step(statement)
        if rc != SQLITE_DONE { fail(rc, "step") }
        sqlite3_reset(statement)
    }

    func fail(_ rc: Int32, _ what: String) -> Never {
        fatalError("raw: SQLite error \(rc) (\(String(cString: sqlite3_errmsg(db)))) in \(what)")
    }

    /// `SELECT count(*)` of a table (for checks).
    func count(_ table: String) -> Int {
        let s = prepare("SELECT count(*) FROM \"\(table)\"")
        defer { sqlite3_finalize(s) }
        guard sqlite3_step(s) == SQLITE_ROW else { fail(-1, "count") }
        return Int(sqlite3_column_int64(s, 0))
    }
}

/// `SQLITE_STATIC`: the caller keeps the bytes alive until the statement is stepped (no copy).
let SQLITE_STATIC: sqlite3_destructor_type? = nil

/// A non-nil pointer for empty text (a nil pointer would bind NULL).
nonisolated(unsafe) let emptyCString: UnsafePointer<CChar> = UnsafePointer(strdup("")!)

/// Binds UTF-8 text without copying (the buffer outlives the step).
@inline(__always)
func bindText(_ statement: OpaquePointer, _ index: Int32, _ buffer: UnsafeBufferPointer<UInt8>) {
    let base = buffer.baseAddress.map { UnsafeRawPointer($0).assumingMemoryBound(to: CChar.self) }
    sqlite3_bind_text(statement, index, base ?? emptyCString, Int32(buffer.count), SQLITE_STATIC)
}

/// Runs `body` with the UTF-8 bytes of `string` (no copy for native strings).
@inline(__always)
func withUTF8<R>(_ string: String, _ body: (UnsafeBufferPointer<UInt8>) -> R) -> R {
    var string = string
    return string.withUTF8(body)
}

/// Runs `body` with the 16 bytes of `id`.
@inline(__always)
func withBytes<R>(of id: UUID, _ body: (UnsafeRawBufferPointer) -> R) -> R {
    withUnsafeBytes(of: id.uuid, body)
}
