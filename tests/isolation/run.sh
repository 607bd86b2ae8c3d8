#!/usr/bin/env bash
# Runs pgfence's isolation specs (tests/isolation/specs/*.spec, in the order of tests/isolation/schedule) with
# PostgreSQL's own isolationtester, through pg_isolation_regress, against a throwaway server.
#
# The server lives in a private 0700 directory, listens only on a Unix socket there, and runs as the `postgres`
# OS user when this script runs as root (initdb and postgres refuse root). The database gets a small fixture
# (schema isolation_fixture) holding the text of the pgfence migration; every spec's setup calls
# isolation_fixture.load_pgfence() (CALL), which drops and re-creates the pgfence schema from that text, so every
# permutation starts from a freshly migrated schema (lease rows can never be deleted, so this is the only way
# to reset them).
#
# PGFENCE_MUTANT_SQL=<file>: SQL applied after the migration on every load (typically a CREATE OR REPLACE
# FUNCTION of a weakened pgfence function, see mutants/); the suite must then fail.
# `run.sh --mutants` runs the suite once per mutants/*.sql, prints which specs each one fails, and exits
# non-zero if a mutant passes every spec. Not part of the normal run.
# PGFENCE_ISOLATION_KEEP=1 keeps the temporary directory (server log, results) for inspection.
#
# Exit status: 0 when every spec's output matches expected/, non-zero otherwise (regression.diffs printed).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"

if [ "${1:-}" = "--mutants" ]; then
    survived=0
    for m in "$here"/mutants/*.sql; do
        log="$(mktemp)"
        if PGFENCE_MUTANT_SQL="$m" "$0" >"$log" 2>&1; then
            echo "mutant $(basename "$m"): SURVIVED (every spec passed)"
            survived=1
        else
            failed="$(sed -n 's/^test \([^ ]*\) .*FAILED.*/\1/p' "$log" | paste -sd' ' -)"
            echo "mutant $(basename "$m"): killed; failing specs: ${failed:-none (the run itself failed, see below)}"
            [ -n "$failed" ] || cat "$log"
        fi
        rm -f "$log"
    done
    exit "$survived"
fi
repo="$(cd "$here/../.." && pwd)"
migration="$repo/migrations/2026-11-30-000001_pgfence_core/up.sql"
port=54329

# --- the PostgreSQL binaries: the server's bindir and pg_isolation_regress (shipped by postgresql-client-NN)
pick_bindir() {
    if [ -n "${PG_BINDIR:-}" ]; then echo "$PG_BINDIR"; return; fi
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5 -n -r); do
        if [ -x "$d/initdb" ]; then echo "$d"; return; fi
    done
    if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ]; then
        pg_config --bindir; return
    fi
    echo "run.sh: no PostgreSQL server binaries (initdb) found; install the postgresql package" >&2
    exit 2
}
bindir="$(pick_bindir)"
pkglibdir="$(cd "$bindir/../lib" && pwd)"
regress="$pkglibdir/pgxs/src/test/isolation/pg_isolation_regress"
if [ ! -x "$regress" ] || [ ! -x "$(dirname "$regress")/isolationtester" ]; then
    echo "run.sh: $regress or its isolationtester is missing; install postgresql-client-$(basename "$(dirname "$bindir")")" >&2
    exit 2
fi

# --- run server programs as `postgres` when we are root
as_server_user() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    echo "run.sh: running as root needs the postgres OS user to run the server (useradd --system postgres)" >&2
    exit 2
fi

tmp="$(mktemp -d "${TMPDIR:-/tmp}/pgfence-isolation.XXXXXX")"
chmod 0700 "$tmp"
if [ "$(id -u)" = 0 ]; then
    chown postgres: "$tmp"
    if ! runuser -u postgres -- test -w "$tmp"; then
        echo "run.sh: the postgres OS user cannot reach $tmp (set TMPDIR to a directory it can traverse)" >&2
        rm -rf "$tmp"
        exit 2
    fi
fi
started=0
cleanup() {
    local rc=$?
    if [ "$started" = 1 ]; then
        as_server_user "$bindir/pg_ctl" -D "$tmp/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    if [ "${PGFENCE_ISOLATION_KEEP:-0}" = 1 ]; then
        echo "run.sh: kept $tmp" >&2
    else
        rm -rf "$tmp"
    fi
    exit "$rc"
}
trap cleanup EXIT

start_ns=$(date +%s%N)
as_server_user "$bindir/initdb" -D "$tmp/data" -U postgres --auth=trust --encoding=UTF8 --no-locale --no-sync \
    >"$tmp/initdb.log" 2>&1 || { cat "$tmp/initdb.log" >&2; exit 2; }
as_server_user "$bindir/pg_ctl" -D "$tmp/data" -l "$tmp/server.log" -w -o \
    "-c listen_addresses='' -c unix_socket_directories='$tmp' -c port=$port -c fsync=off -c max_connections=30" \
    start >/dev/null || { cat "$tmp/server.log" >&2; exit 2; }
started=1

export PGHOST="$tmp" PGPORT="$port" PGUSER=postgres
unset PGDATABASE PGSERVICE PGOPTIONS PGPASSWORD PGHOSTADDR 2>/dev/null || true
psql=("$bindir/psql" -X -q -v ON_ERROR_STOP=1)

db=pgfence_isolation
"${psql[@]}" -d postgres -c "CREATE DATABASE $db"

mutant_sql=""
if [ -n "${PGFENCE_MUTANT_SQL:-}" ]; then
    mutant_sql="$(cat "$PGFENCE_MUTANT_SQL")"
    echo "== applying mutant $PGFENCE_MUTANT_SQL after the migration (the suite should fail)"
fi

# The fixture: the migration's text (and the mutant's), and a loader that re-creates the pgfence schema from it.
# Applying the migration once here first also proves that it applies cleanly.
"${psql[@]}" -d "$db" -v migration="$(cat "$migration")" -v mutant="$mutant_sql" <<'SQL'
CREATE SCHEMA isolation_fixture;
CREATE TABLE isolation_fixture.script (ord integer PRIMARY KEY, what text NOT NULL, sql text NOT NULL);
INSERT INTO isolation_fixture.script VALUES (1, 'migration', :'migration');
INSERT INTO isolation_fixture.script SELECT 2, 'mutant', :'mutant' WHERE :'mutant' <> '';
CREATE PROCEDURE isolation_fixture.load_pgfence()
LANGUAGE plpgsql SET client_min_messages = warning AS $$
DECLARE
    s record;
BEGIN
    DROP SCHEMA IF EXISTS pgfence CASCADE;
    FOR s IN SELECT * FROM isolation_fixture.script ORDER BY ord LOOP
        EXECUTE s.sql;
    END LOOP;
END;
$$;
CALL isolation_fixture.load_pgfence();
SQL

mkdir -p "$tmp/out"
# A step is cancelled after this many seconds (isolationtester's default is 300): every step here takes well
# under a second, so a step that hangs (a broken protocol, a mutant) fails fast instead of stalling CI.
export PGISOLATIONTIMEOUT="${PGISOLATIONTIMEOUT:-30}"
status=0
"$regress" --use-existing --bindir="$bindir" --host="$tmp" --port="$port" --user=postgres --dbname="$db" \
    --inputdir="$here" --outputdir="$tmp/out" --schedule="$here/schedule" || status=$?
end_ns=$(date +%s%N)
echo "== isolation specs took $(( (end_ns - start_ns) / 1000000 )) ms (server start included)"
if [ "$status" != 0 ]; then
    if [ -s "$tmp/out/regression.diffs" ]; then
        echo "== regression.diffs"
        cat "$tmp/out/regression.diffs"
    fi
    echo "run.sh: isolation specs FAILED (pg_isolation_regress exit $status)" >&2
    exit 1
fi
