#!/usr/bin/env bash
# A throwaway PostgreSQL cluster in a directory of its own: start it, crash-restart it, add a streaming standby,
# promote one, stop and remove them. Scripts/with-postgres.sh (the test suite's shared cluster) and the tests that need
# a server of their own (restarts, failover, shards, a pooler in front) use it.
#
#   postgres-cluster.sh start DIR [--durable]   initdb into DIR/data and start; print the cluster's variables
#   postgres-cluster.sh standby PRIMARY DIR     pg_basebackup -R of PRIMARY into DIR/data (asynchronous streaming
#                                               standby, hot) and start it; print its variables
#   postgres-cluster.sh restart DIR             crash and restart (pg_ctl restart -m immediate), same port
#   postgres-cluster.sh stop DIR [MODE]         stop (MODE: fast — the default — or immediate)
#   postgres-cluster.sh launch DIR              start a stopped cluster again, same port
#   postgres-cluster.sh promote DIR             promote a standby to primary (waits until it accepts writes)
#   postgres-cluster.sh remove DIR              stop (immediate) and delete DIR
#   postgres-cluster.sh pgbouncer DIR POOL DATABASE ROLE
#                                               start PgBouncer in POOL (made) in front of DATABASE of the cluster in
#                                               DIR, reaching it as ROLE over the socket: transaction mode, a pool of one
#                                               server connection, any client login (auth_type any), 127.0.0.1 at a free
#                                               port; print PORT=…
#   postgres-cluster.sh pgbouncer-stop POOL     stop that PgBouncer (SIGKILL: it is thrown away) and delete POOL
#
# DIR must not exist for start and standby (they create it). The server runs as the `postgres` OS user when this
# script runs as root (PostgreSQL refuses to run as root), as the current user otherwise. It listens on a Unix socket
# in DIR (trust: the superuser connection) and on 127.0.0.1 at a free port (scram-sha-256), accepts replication
# connections over the socket, and keeps fsync off (the data is thrown away; a crash of the server process — what
# `restart` does — loses nothing written). Without --durable, commits are also asynchronous (synchronous_commit off:
# fastest, but a crash loses the last commits); with it, a commit is acknowledged only once its WAL is written, so
# `restart` loses no acknowledged write.
#
# start and standby print, one per line:
#   URL=postgresql://postgres@/postgres?host=DIR&port=PORT   (the superuser, database postgres, over the socket)
#   PORT=PORT                                               (the TCP port on 127.0.0.1, also the socket's)
#   SOCKET=DIR
# Exit status: 0 done, 1 failed (the server's log on standard error), 2 wrong usage.
set -uo pipefail

usage() {
    sed -n '5,20p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
[ "$#" -ge 2 ] || usage
command=$1
dir=$2
shift 2

bindir=""
for candidate in "${PG_BINDIR:-}" /usr/lib/postgresql/*/bin; do
    if [ -n "$candidate" ] && [ -x "$candidate/initdb" ] && [ -x "$candidate/pg_ctl" ]; then bindir=$candidate; fi
done
if [ -z "$bindir" ]; then
    if command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
        bindir=$(dirname "$(command -v initdb)")
    else
        echo "postgres-cluster: no PostgreSQL server binaries (initdb, pg_ctl) found; install postgresql" >&2
        exit 1
    fi
fi

as_server() { "$@"; }
if [ "$(id -u)" = 0 ]; then
    if ! id postgres >/dev/null 2>&1; then
        echo "postgres-cluster: running as root, but there is no 'postgres' OS user to run the server as" >&2
        exit 1
    fi
    as_server() { runuser -u postgres -- "$@"; }
fi

# Runs CMD… with every descriptor but 0–2 closed. A server it starts must not keep open the pipes and sockets this
# script inherited: a caller that waits for their end (Foundation's Process waits for a socket it gives each child to
# close) would wait for the server's.
detached() {
    (
        for fd in /proc/$BASHPID/fd/*; do
            fd=${fd##*/}
            if [ "$fd" -gt 2 ] 2>/dev/null; then eval "exec $fd>&-"; fi
        done
        "$@"
    )
}

# Makes DIR, owned by the server's user.
make_directory() {
    if [ -e "$dir" ]; then
        echo "postgres-cluster: $dir exists already" >&2
        exit 2
    fi
    mkdir -p "$dir" || exit 1
    if [ "$(id -u)" = 0 ]; then chown postgres: "$dir"; fi
    chmod 700 "$dir"
}

print_variables() {
    local port
    port=$(cat "$dir/port")
    echo "URL=postgresql://postgres@/postgres?host=$dir&port=$port"
    echo "PORT=$port"
    echo "SOCKET=$dir"
}

# Starts the cluster in DIR/data on the port in DIR/port, or on a free one (the server's own bind decides: a port
# taken in the meantime makes it fail, and another is tried).
launch() {
    local attempts=1 port
    if [ ! -f "$dir/port" ]; then attempts=8; fi
    for _ in $(seq "$attempts"); do
        if [ -f "$dir/port" ] && [ "$attempts" = 1 ]; then
            port=$(cat "$dir/port")
        else
            port=$((20000 + RANDOM % 30000))
            if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then continue; fi
        fi
        if detached as_server "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start -o \
                "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir" >/dev/null 2>&1; then
            echo "$port" >"$dir/port"
            return 0
        fi
    done
    echo "postgres-cluster: the server in $dir did not start:" >&2
    tail -n 20 "$dir/server.log" >&2 2>/dev/null
    return 1
}

case "$command" in
start)
    durable=0
    for option in "$@"; do
        case "$option" in
        --durable) durable=1 ;;
        *) usage ;;
        esac
    done
    make_directory
    if ! as_server "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust --no-sync -E UTF8 --locale=C \
            >"$dir/initdb.log" 2>&1; then
        echo "postgres-cluster: initdb failed:" >&2
        cat "$dir/initdb.log" >&2
        exit 1
    fi
    synchronous_commit=off
    if [ "$durable" = 1 ]; then synchronous_commit=on; fi
    cat >>"$dir/data/postgresql.conf" <<EOF
fsync = off
synchronous_commit = $synchronous_commit
full_page_writes = off
max_connections = 300
shared_buffers = 32MB
password_encryption = scram-sha-256
wal_level = replica
max_wal_senders = 4
hot_standby = on
EOF
    cat >"$dir/data/pg_hba.conf" <<'EOF'
local all         all                trust
local replication all                trust
host  all         all 127.0.0.1/32   scram-sha-256
EOF
    launch || exit 1
    print_variables
    ;;
standby)
    [ "$#" -eq 1 ] || usage
    primary=$dir
    dir=$1
    [ -f "$primary/port" ] || { echo "postgres-cluster: no cluster in $primary" >&2; exit 1; }
    make_directory
    if ! as_server "$bindir/pg_basebackup" -h "$primary" -p "$(cat "$primary/port")" -U postgres -D "$dir/data" -R \
            -X stream --checkpoint=fast --no-sync >"$dir/basebackup.log" 2>&1; then
        echo "postgres-cluster: pg_basebackup failed:" >&2
        cat "$dir/basebackup.log" >&2
        exit 1
    fi
    launch || exit 1
    print_variables
    ;;
restart)
    [ -f "$dir/port" ] || { echo "postgres-cluster: no cluster in $dir" >&2; exit 1; }
    if ! detached as_server "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -m immediate -w -t 60 restart -o \
            "-c listen_addresses=127.0.0.1 -c port=$(cat "$dir/port") -c unix_socket_directories=$dir" >/dev/null 2>&1; then
        echo "postgres-cluster: the restart of $dir failed:" >&2
        tail -n 20 "$dir/server.log" >&2 2>/dev/null
        exit 1
    fi
    ;;
stop)
    mode=${1:-fast}
    as_server "$bindir/pg_ctl" -D "$dir/data" -m "$mode" -w -t 60 stop >/dev/null 2>&1 || exit 1
    ;;
launch)
    launch || exit 1
    ;;
promote)
    if ! detached as_server "$bindir/pg_ctl" -D "$dir/data" -w -t 60 promote >/dev/null 2>&1; then
        echo "postgres-cluster: the promotion of $dir failed:" >&2
        tail -n 20 "$dir/server.log" >&2 2>/dev/null
        exit 1
    fi
    ;;
pgbouncer)
    [ "$#" -eq 3 ] || usage
    pool=$1
    database=$2
    role=$3
    [ -f "$dir/port" ] || { echo "postgres-cluster: no cluster in $dir" >&2; exit 1; }
    pgbouncer=$(command -v pgbouncer || ls /usr/sbin/pgbouncer 2>/dev/null)
    [ -n "$pgbouncer" ] || { echo "postgres-cluster: pgbouncer is not installed (apt-get install pgbouncer)" >&2; exit 1; }
    cluster=$dir
    dir=$pool
    make_directory
    for _ in 1 2 3 4 5 6 7 8; do
        port=$((20000 + RANDOM % 30000))
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then continue; fi
        cat >"$pool/pgbouncer.ini" <<EOF
[databases]
$database = host=$cluster port=$(cat "$cluster/port") dbname=$database user=$role
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = 1
max_client_conn = 200
logfile = $pool/pgbouncer.log
pidfile = $pool/pgbouncer.pid
EOF
        chmod 644 "$pool/pgbouncer.ini"
        # PgBouncer refuses to run as root.
        detached as_server "$pgbouncer" -d "$pool/pgbouncer.ini" >/dev/null 2>&1 || continue
        for _ in $(seq 100); do
            if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
                echo "PORT=$port"
                exit 0
            fi
            sleep 0.05
        done
        [ -f "$pool/pgbouncer.pid" ] && kill -9 "$(cat "$pool/pgbouncer.pid")" 2>/dev/null
    done
    echo "postgres-cluster: PgBouncer did not start:" >&2
    tail -n 20 "$pool/pgbouncer.log" >&2 2>/dev/null
    exit 1
    ;;
pgbouncer-stop)
    # SIGKILL: a process started by a caller that blocks signals (as Swift's runtime does) keeps SIGTERM blocked.
    if [ -f "$dir/pgbouncer.pid" ]; then kill -9 "$(cat "$dir/pgbouncer.pid")" 2>/dev/null; fi
    rm -rf "$dir"
    ;;
remove)
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_server "$bindir/pg_ctl" -D "$dir/data" -m immediate -w -t 60 stop >/dev/null 2>&1
    fi
    rm -rf "$dir"
    ;;
*)
    usage
    ;;
esac
