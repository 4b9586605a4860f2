import CSQLite

/// An error reported by SQLite.
///
/// Carries the primary and extended result codes, SQLite's message and the SQL text of the statement that failed.
/// It never carries bound parameter values, so user data (including values of encrypted attributes) cannot leak
/// through it.
///
/// Source: <https://www.sqlite.org/rescode.html>
public struct SQLiteError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The extended result code, e.g. `SQLITE_CONSTRAINT_UNIQUE` (2067).
    public let extendedResultCode: Int32
    /// SQLite's English message for the failure (`sqlite3_errmsg`).
    public let message: String
    /// The SQL text that failed, if the failure came from a statement.
    public let sql: String?

    /// The primary result code (the low 8 bits of the extended code), e.g. `SQLITE_CONSTRAINT` (19).
    public var resultCode: Int32 { extendedResultCode & 0xFF }

    /// `true` when another connection holds a conflicting lock (`SQLITE_BUSY` or `SQLITE_LOCKED`).
    public var isBusy: Bool { resultCode == SQLITE_BUSY || resultCode == SQLITE_LOCKED }

    /// `true` for constraint violations (`SQLITE_CONSTRAINT_*`).
    public var isConstraintViolation: Bool { resultCode == SQLITE_CONSTRAINT }

    /// `SQLITE_CONSTRAINT_PRIMARYKEY` (a C macro Swift cannot import).
    public static let constraintPrimaryKey: Int32 = 1555
    /// `SQLITE_CONSTRAINT_UNIQUE`.
    public static let constraintUnique: Int32 = 2067

    public init(extendedResultCode: Int32, message: String, sql: String? = nil) {
        self.extendedResultCode = extendedResultCode
        self.message = message
        self.sql = sql
    }

    init(code: Int32, connection: OpaquePointer?, sql: String? = nil) {
        let extended = connection.map { sqlite3_extended_errcode($0) } ?? code
        let message = connection.flatMap { sqlite3_errmsg($0) }.map { String(cString: $0) }
            ?? String(cString: sqlite3_errstr(code))
        // sqlite3_extended_errcode reports the most recent error; trust it only when it agrees with `code`.
        self.init(extendedResultCode: (extended & 0xFF) == (code & 0xFF) ? extended : code, message: message, sql: sql)
    }

    public var description: String {
        var text = "SQLite error \(extendedResultCode) (\(String(cString: sqlite3_errstr(extendedResultCode)))): \(message)"
        if let sql { text += " — while executing: \(sql)" }
        return text
    }
}
