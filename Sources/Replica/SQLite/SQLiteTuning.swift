import CSQLite

/// Process-wide SQLite settings a host app may opt into. Replica never changes them on its own: they apply to every
/// SQLite user of the process, not only to Replica's stores.
public enum SQLiteTuning {
    /// Turns off SQLite's memory statistics (`SQLITE_CONFIG_MEMSTATUS`) for the whole process. With them on (SQLite's
    /// default), every allocation and free of every connection takes one global mutex to update counters that
    /// `sqlite3_memory_used()`, `sqlite3_memory_highwater()` and `sqlite3_status()` read — and that
    /// `sqlite3_soft_heap_limit64()` and `sqlite3_hard_heap_limit64()` need: with the statistics off, heap limits set
    /// by anyone in the process are no longer enforced. Replica reads none of them and sets no limit, and SQLite
    /// recommends building with them off (`SQLITE_DEFAULT_MEMSTATUS=0`). Do not call this in an app that relies on a
    /// heap limit. Replica's own tools (`replica-sim`, `replica-bench`) call this first thing.
    ///
    /// Call it at process start, before any thread uses SQLite: like every `sqlite3_config` option it only takes
    /// effect before SQLite initializes, and `sqlite3_config` is not thread-safe.
    /// - Returns: `true` when the setting took effect; `false` when SQLite was already initialized in this process
    ///   (nothing changes then).
    /// - Sources: <https://www.sqlite.org/c3ref/config.html>, <https://www.sqlite.org/c3ref/hard_heap_limit64.html>, <https://www.sqlite.org/c3ref/c_config_covering_index_scan.html#sqliteconfigmemstatus>,
    ///   <https://www.sqlite.org/compile.html#default_memstatus>
    @discardableResult
    public static func disableMemoryStatistics() -> Bool {
        replica_sqlite3_disable_memstatus() == SQLITE_OK
    }
}
