#ifndef REPLICA_CLIBPQ_SHIM_H
#define REPLICA_CLIBPQ_SHIM_H
#include <libpq-fe.h>
#include <poll.h>

/// A notice receiver that drops every notice and warning: libpq's default one prints them to stderr, and library
/// code never prints.
static inline void replica_pq_ignore_notice(void *arg, const PGresult *result) {
    (void)arg;
    (void)result;
}

/// Installs `replica_pq_ignore_notice` on `conn` (a C function pointer Swift would otherwise have to form itself).
static inline void replica_pq_silence_notices(PGconn *conn) {
    PQsetNoticeReceiver(conn, replica_pq_ignore_notice, NULL);
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
