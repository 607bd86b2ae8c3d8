#!/usr/bin/env bash
# Runs pgfence's SQL regression suite (tests/regress/sql/*.sql, in the order of tests/regress/schedule) with
# PostgreSQL's own pg_regress against a throwaway server: each script runs in psql and its output must equal
# tests/regress/expected/<name>.out. The scripts are what a client that is not the Rust library sends (the SQL
# section of docs/protocol.md is sql/protocol.sql, verbatim).
#
# The server lives in a private 0700 directory, listens only on a Unix socket there, and runs as the `postgres`
# OS user when this script runs as root (initdb and postgres refuse root). The migrations (migrations/*/up.sql, in
# the order Store::migrate applies them) are loaded with psql, without diesel, by the superuser; then the roles
# the scripts connect as are made and granted:
#   app    the scripts' own login role: application grant on cluster prod-eu-1 (pg_regress connects as it)
#   ops    operator grant on cluster other (an operator, but not of prod-eu-1)
#   nobody a login role without any grant
#
# PGFENCE_MUTANT_SQL=<file>: SQL applied after the migrations (a weakened pgfence function); the suite should
# then fail. PGFENCE_MIGRATIONS=<dir>: load <dir>/*/up.sql instead of the tree's migrations (to show what the
# suite finds on another revision). PGFENCE_REGRESS_KEEP=1 keeps the temporary directory (server log, results).
#
# Random values (secrets, times, process ids) never reach the output: the scripts keep them in psql variables
# (\gset) and select booleans or lengths of them.
#
# Exit status: 0 when every script's output matches expected/, 1 otherwise (regression.diffs printed), 2 when the
# PostgreSQL programs are missing.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# In version order, as diesel applies them (the directory names start with the version).
migrations=("${PGFENCE_MIGRATIONS:-$repo/migrations}"/*/up.sql)
port=54339

# --- the PostgreSQL binaries and a throwaway server (tests/scratch-server.sh)
# shellcheck source=../scratch-server.sh
. "$here/../scratch-server.sh"
bindir="$(scratch_bindir)"
clientdir="$(scratch_clientdir pgxs/src/test/regress/pg_regress)"
regress="$clientdir/../lib/pgxs/src/test/regress/pg_regress"
echo "== server: $("$bindir/postgres" --version) ($bindir)"
scratch_server_start regress "$port" 20 PGFENCE_REGRESS_KEEP
unset PGDATABASE PGSERVICE PGOPTIONS PGPASSWORD PGHOSTADDR PGUSER 2>/dev/null || true
psql=("$clientdir/psql" -X -q -v ON_ERROR_STOP=1 -U postgres)

db=pgfence_regress
"${psql[@]}" -d postgres -c "CREATE DATABASE $db"
for file in "${migrations[@]}" ${PGFENCE_MUTANT_SQL:+"$PGFENCE_MUTANT_SQL"}; do
    "${psql[@]}" -d "$db" -v client_min_messages=warning -f "$file" >"$tmp/load.log" 2>&1 \
        || { cat "$tmp/load.log" >&2; echo "run.sh: loading $file failed" >&2; exit 1; }
done
"${psql[@]}" -d "$db" <<'SQL' >"$tmp/setup.log" 2>&1 || { cat "$tmp/setup.log" >&2; exit 1; }
SET client_min_messages = warning;
CREATE ROLE app LOGIN;
CREATE ROLE ops LOGIN;
CREATE ROLE nobody LOGIN;
SELECT pgfence.grant_application('app', 'prod-eu-1');
SELECT pgfence.grant_operator('ops', 'other');
-- The application's own table, which protocol.sql guards.
CREATE TABLE public.shards (id integer PRIMARY KEY, owner text NOT NULL);
INSERT INTO public.shards VALUES (7, 'node-1');
ALTER TABLE public.shards OWNER TO app;
SQL

mkdir -p "$tmp/out"
status=0
"$regress" --use-existing --bindir="$clientdir" --host="$tmp" --port="$port" --user=app --dbname="$db" \
    --inputdir="$here" --outputdir="$tmp/out" --schedule="$here/schedule" || status=$?
end_ns=$(date +%s%N)
echo "== SQL regression suite took $(( (end_ns - start_ns) / 1000000 )) ms (server start included)"
if [ "$status" != 0 ]; then
    if [ -s "$tmp/out/regression.diffs" ]; then
        echo "== regression.diffs"
        cat "$tmp/out/regression.diffs"
    fi
    echo "run.sh: SQL regression suite FAILED (pg_regress exit $status)" >&2
    exit 1
fi
