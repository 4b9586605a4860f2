#!/usr/bin/env bash
# Runs CMD… with a throwaway PostgreSQL cluster, then stops it and removes it (also when CMD fails or is
# interrupted).
#
#   Scripts/with-postgres.sh swift test
#
# The cluster lives in a fresh temporary directory (Scripts/postgres-cluster.sh sets it up): `initdb` runs as the
# `postgres` OS user when this script runs as root (PostgreSQL refuses to run as root), as the current user otherwise.
# The server listens on a Unix socket in that directory (trust authentication: the tests' superuser connection) and on
# 127.0.0.1 at a free port (scram-sha-256 passwords: the tests of roles, passwords and refused logins). fsync and
# synchronous commits are off: the data is thrown away.
#
# CMD sees:
#   REPLICA_TEST_POSTGRES_URL   libpq URL of database `replica_test` as the superuser, over the socket
#   REPLICA_TEST_POSTGRES_PORT  the TCP port on 127.0.0.1
#   REPLICA_REQUIRE_POSTGRES=1  tests that need the server fail (rather than skip) if it is missing
#   REPLICA_POSTGRES_CLUSTER    the path of Scripts/postgres-cluster.sh (tests that need a cluster of their own)
# Exit status: CMD's; 1 when the cluster cannot be set up.
set -uo pipefail

if [ "$#" -eq 0 ]; then
    echo "usage: $0 CMD [ARG…]" >&2
    exit 2
fi

cluster_script="$(cd "$(dirname "$0")" && pwd)/postgres-cluster.sh"
parent=$(mktemp -d "${TMPDIR:-/tmp}/replica-postgres.XXXXXX") || exit 1
chmod 755 "$parent"
dir="$parent/cluster"
cleanup() {
    "$cluster_script" remove "$dir" >/dev/null 2>&1
    rm -rf "$parent"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

variables=$("$cluster_script" start "$dir") || exit 1
port=$(sed -n 's/^PORT=//p' <<<"$variables")

bindir=""
for candidate in "${PG_BINDIR:-}" /usr/lib/postgresql/*/bin; do
    if [ -n "$candidate" ] && [ -x "$candidate/psql" ]; then bindir=$candidate; fi
done
psql=${bindir:+$bindir/}psql
if ! "$psql" -X -q -h "$dir" -p "$port" -U postgres -d postgres -c "CREATE DATABASE replica_test" >/dev/null; then
    echo "with-postgres: could not create the test database" >&2
    exit 1
fi

export REPLICA_TEST_POSTGRES_URL="postgresql://postgres@/replica_test?host=$dir&port=$port"
export REPLICA_TEST_POSTGRES_PORT="$port"
export REPLICA_REQUIRE_POSTGRES=1
export REPLICA_POSTGRES_CLUSTER="$cluster_script"
"$@"
