import CSQLite
import Foundation

/// A read-only connection to one store file that runs `PRAGMA integrity_check` on it, kept for the run: a store is
/// checked at every restart of a process that opens it, and a new connection each time read and parsed the whole
/// schema again (about half of a check's cost). The check reads every page as a new connection would (SQLite
/// revalidates its page cache and schema on each read); the connection holds no transaction between checks. A file
/// replaced under the path (a migration stage renames a copy over it) is a new file: ``isCurrent`` is then false and
/// the caller opens a new checker.
final class IntegrityChecker {
    private let handle: OpaquePointer
    private var statement: OpaquePointer?
    private let path: String
    private let identity: (device: UInt64, inode: UInt64)?

    init?(path: String) {
        var handle: OpaquePointer?
        guard sqlite3_open_v2(path, &handle, SQLITE_OPEN_READONLY, nil) == SQLITE_OK, let handle else {
            sqlite3_close_v2(handle)
            return nil
        }
        self.handle = handle
        self.path = path
        self.identity = Self.identity(of: path)
    }

    deinit {
        sqlite3_finalize(statement)
        sqlite3_close_v2(handle)
    }

    /// Whether the file at the path is still the one this connection opened.
    var isCurrent: Bool {
        guard let identity, let now = Self.identity(of: path) else { return false }
        return now == identity
    }

    /// The rows of `PRAGMA integrity_check` (`["ok"]` for a sound file), or `nil` when it cannot run.
    func check() -> [String]? {
        if statement == nil {
            guard sqlite3_prepare_v2(handle, "PRAGMA integrity_check", -1, &statement, nil) == SQLITE_OK else {
                sqlite3_finalize(statement)
                statement = nil
                return nil
            }
        }
        defer { sqlite3_reset(statement) }
        var results: [String] = []
        while sqlite3_step(statement) == SQLITE_ROW {
            if let text = sqlite3_column_text(statement, 0) { results.append(String(cString: text)) }
        }
        return results
    }

    private static func identity(of path: String) -> (device: UInt64, inode: UInt64)? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return (UInt64(info.st_dev), UInt64(info.st_ino))
    }
}
