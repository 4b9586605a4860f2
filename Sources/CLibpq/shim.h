#ifndef REPLICA_CLIBPQ_SHIM_H
#define REPLICA_CLIBPQ_SHIM_H
#include <libpq-fe.h>
#include <poll.h>
#include <string.h>

/// A notice receiver that prints nothing (libpq's default one prints notices to stderr, and library code never
/// prints). It notes in `*(int *)arg` when the server said FATAL or PANIC: the last words of a session the server
/// ends while the client is idle (an administrator's `pg_terminate_backend`, a shutdown), which libpq reports as a
/// notice. The connection is then done, even before its socket shows the end.
static inline void replica_pq_notice_receiver(void *arg, const PGresult *result) {
    const char *severity = PQresultErrorField(result, PG_DIAG_SEVERITY_NONLOCALIZED);
    if (arg != NULL && severity != NULL && (strcmp(severity, "FATAL") == 0 || strcmp(severity, "PANIC") == 0)) {
        *(int *)arg = 1;
    }
}

/// Installs `replica_pq_notice_receiver` on `conn`, noting FATAL notices in `*ended` (a C function pointer Swift
/// would otherwise have to form itself).
static inline void replica_pq_watch_notices(PGconn *conn, int *ended) {
    PQsetNoticeReceiver(conn, replica_pq_notice_receiver, ended);
}

/// Whether `fd` has input waiting (or is closed or failed), without waiting: `poll` with a zero timeout.
static inline int replica_pq_socket_readable(int fd) {
    struct pollfd pfd;
    pfd.fd = fd;
    pfd.events = POLLIN;
    pfd.revents = 0;
    return poll(&pfd, 1, 0) > 0;
}
#endif
