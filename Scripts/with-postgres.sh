#!/usr/bin/env bash
# Runs CMD… with a throwaway PostgreSQL cluster, then stops it and removes it (also when CMD fails or is
# interrupted).
#
#   Scripts/with-postgres.sh swift test
#
# The cluster lives in a fresh temporary directory: `initdb` runs as the `postgres` OS user when this script runs as
# root (PostgreSQL refuses to run as root), as the current user otherwise. The server listens on a Unix socket in
# that directory (trust authentication: the tests' superuser connection) and on 127.0.0.1 at a free port
# (scram-sha-256 passwords: the tests of roles, passwords and refused logins). fsync is off: the data is thrown
# away.
#
# CMD sees:
#   REPLICA_TEST_POSTGRES_URL   libpq URL of database `replica_test` as the superuser, over the socket
#   REPLICA_TEST_POSTGRES_PORT  the TCP port on 127.0.0.1
#   REPLICA_REQUIRE_POSTGRES=1  tests that need the server fail (rather than skip) if it is missing
# Exit status: CMD's; 1 when the cluster cannot be set up.
set -uo pipefail

if [ "$#" -eq 0 ]; then
    echo "usage: $0 CMD [ARG…]" >&2
    exit 2
fi

bindir=""
for candidate in "${PG_BINDIR:-}" /usr/lib/postgresql/*/bin; do
    if [ -n "$candidate" ] && [ -x "$candidate/initdb" ] && [ -x "$candidate/pg_ctl" ]; then bindir=$candidate; fi
done
if [ -z "$bindir" ]; then
    if command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
        bindir=$(dirname "$(command -v initdb)")
    else
        echo "with-postgres: no PostgreSQL server binaries (initdb, pg_ctl) found; install postgresql" >&2
        exit 1
    fi
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/replica-postgres.XXXXXX") || exit 1
as_server() { "$@"; }
if [ "$(id -u)" = 0 ]; then
    if ! id postgres >/dev/null 2>&1; then
        echo "with-postgres: running as root, but there is no 'postgres' OS user to run the server as" >&2
        rm -rf "$dir"
        exit 1
    fi
    chown postgres: "$dir"
    chmod 700 "$dir"
    as_server() { runuser -u postgres -- "$@"; }
fi

started=0
cleanup() {
    if [ "$started" = 1 ]; then
        as_server "$bindir/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1
    fi
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if ! as_server "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust --no-sync -E UTF8 --locale=C \
        >"$dir/initdb.log" 2>&1; then
    echo "with-postgres: initdb failed:" >&2
    cat "$dir/initdb.log" >&2
    exit 1
fi
cat >"$dir/data/pg_hba.conf" <<'EOF'
local all all                trust
host  all all 127.0.0.1/32   scram-sha-256
EOF

# A free port: the server's own bind decides (a port taken in the meantime makes it fail; try another).
for attempt in 1 2 3 4 5 6 7 8; do
    port=$((20000 + RANDOM % 30000))
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then continue; fi
    if as_server "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start -o \
            "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir -c fsync=off \
             -c synchronous_commit=off -c full_page_writes=off -c max_connections=300 -c shared_buffers=32MB \
             -c password_encryption=scram-sha-256" >/dev/null 2>&1; then
        started=1
        break
    fi
done
if [ "$started" != 1 ]; then
    echo "with-postgres: the server did not start:" >&2
    cat "$dir/server.log" >&2 2>/dev/null
    exit 1
fi

if ! as_server "$bindir/psql" -X -q -h "$dir" -p "$port" -U postgres -d postgres \
        -c "CREATE DATABASE replica_test" >/dev/null; then
    echo "with-postgres: could not create the test database" >&2
    exit 1
fi

export REPLICA_TEST_POSTGRES_URL="postgresql://postgres@/replica_test?host=$dir&port=$port"
export REPLICA_TEST_POSTGRES_PORT="$port"
export REPLICA_REQUIRE_POSTGRES=1
"$@"
