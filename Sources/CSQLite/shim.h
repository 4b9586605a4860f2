#ifndef REPLICA_CSQLITE_SHIM_H
#define REPLICA_CSQLITE_SHIM_H
#include <sqlite3.h>

/// SQLITE_TRANSIENT and SQLITE_STATIC are macros that cast -1 and 0 to function pointers, which Swift cannot import.
/// Binding with SQLITE_TRANSIENT makes SQLite copy the bytes before the call returns.
///
/// The 64-bit forms: a length above what an `int` holds is refused with SQLITE_TOOBIG (before SQLite reads the bytes)
/// instead of being truncated. `copy` nonzero binds with SQLITE_TRANSIENT (SQLite copies), zero with SQLITE_STATIC.
static inline int replica_sqlite3_bind_text64(sqlite3_stmt *stmt, int index, const char *text, sqlite3_uint64 length, int copy) {
    return sqlite3_bind_text64(stmt, index, text, length, copy ? SQLITE_TRANSIENT : SQLITE_STATIC, SQLITE_UTF8);
}

static inline int replica_sqlite3_bind_blob64(sqlite3_stmt *stmt, int index, const void *bytes, sqlite3_uint64 length, int copy) {
    return sqlite3_bind_blob64(stmt, index, bytes, length, copy ? SQLITE_TRANSIENT : SQLITE_STATIC);
}

/// Turns off SQLite's memory statistics (`SQLITE_CONFIG_MEMSTATUS`), which Replica never reads: with them on, every
/// allocation and free takes a global mutex. Only has an effect before SQLite initializes (otherwise SQLITE_MISUSE).
static inline int replica_sqlite3_disable_memstatus(void) {
    return sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
}
#endif
