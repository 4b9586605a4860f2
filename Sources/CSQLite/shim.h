#ifndef REPLICA_CSQLITE_SHIM_H
#define REPLICA_CSQLITE_SHIM_H
#include <sqlite3.h>

/// SQLITE_TRANSIENT is a macro that casts -1 to a function pointer, which Swift cannot import.
/// Binding with it makes SQLite copy the bytes before the call returns.
static inline int replica_sqlite3_bind_text_transient(sqlite3_stmt *stmt, int index, const char *text, int length) {
    return sqlite3_bind_text(stmt, index, text, length, SQLITE_TRANSIENT);
}

static inline int replica_sqlite3_bind_blob_transient(sqlite3_stmt *stmt, int index, const void *bytes, int length) {
    return sqlite3_bind_blob(stmt, index, bytes, length, SQLITE_TRANSIENT);
}

/// Turns off SQLite's memory statistics (`SQLITE_CONFIG_MEMSTATUS`), which Replica never reads: with them on, every
/// allocation and free takes a global mutex. Only has an effect before SQLite initializes (otherwise SQLITE_MISUSE).
static inline int replica_sqlite3_disable_memstatus(void) {
    return sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
}
#endif
