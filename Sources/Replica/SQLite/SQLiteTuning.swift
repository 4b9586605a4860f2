import CSQLite

/// Process-wide SQLite settings a host app may opt into. Replica never changes them on its own: they apply to every
/// SQLite user of the process, not only to Replica's stores.
public enum SQLiteTuning {
    /// Turns off SQLite's memory statistics (`SQLITE_CONFIG_MEMSTATUS`) for the whole process. With them on (SQLite's
    /// default), every allocation and free of every connection takes one global mutex to update counters that only
    /// `sqlite3_memory_used()`, `sqlite3_memory_highwater()` and `sqlite3_status()` read; Replica reads none of them,
    /// and SQLite recommends building with them off (`SQLITE_DEFAULT_MEMSTATUS=0`). Replica's own tools
    /// (`replica-sim`, `replica-bench`) call this first thing.
    ///
    /// Call it at process start, before any thread uses SQLite: like every `sqlite3_config` option it only takes
    /// effect before SQLite initializes, and `sqlite3_config` is not thread-safe.
    /// - Returns: `true` when the setting took effect; `false` when SQLite was already initialized in this process
    ///   (nothing changes then).
    /// - Sources: <https://www.sqlite.org/c3ref/config.html>, <https://www.sqlite.org/c3ref/c_config_covering_index_scan.html#sqliteconfigmemstatus>,
    ///   <https://www.sqlite.org/compile.html#default_memstatus>
    @discardableResult
    public static func disableMemoryStatistics() -> Bool {
        replica_sqlite3_disable_memstatus() == SQLITE_OK
    }
}
