#!/usr/bin/env bash
# What `pgfence status` costs at the size of a fleet: M live members of one group, all declaring the same S names,
# the group assigned (name j to member j mod M) and one held lease per name led by its assigned member — the
# database benches/membership_cost.sh builds, built the same way through the SQL API, without running M
# processes. Then runs the given pgfence binary's `status`, `status --json` (and `status --all`) RUNS times each
# and prints the median wall time, the output size, and each statement the command sent with its median server
# time (from the server's log, log_min_duration_statement = 0), and EXPLAIN ANALYZE of the reads behind it.
#
# With KEEP=1 the server stays up after the runs (the script prints its DATABASE_URL and waits for Enter).
#
# usage: benches/status_cost.sh [M] [S] [RUNS] [PGFENCE]    e.g. benches/status_cost.sh 100 10000 5
#        PGFENCE defaults to $CARGO_TARGET_DIR/release/pgfence (build it first:
#        cargo build --release -p pgfence-cli); as root or as the postgres OS user
set -euo pipefail

m=${1:-100}
s=${2:-10000}
runs=${3:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
pgfence=${4:-${CARGO_TARGET_DIR:-$root/target}/release/pgfence}
bin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)}
[ -x "$pgfence" ] || { echo "no pgfence binary at $pgfence" >&2; exit 2; }

as_postgres() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

dir=$(mktemp -d /tmp/pgfence-status-cost.XXXXXX)
chmod 755 "$dir"
if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; fi
trap 'as_postgres "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
as_postgres "$bin/initdb" -D "$dir/data" -A trust -U postgres >/dev/null
cat >> "$dir/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$dir'
fsync = off
synchronous_commit = off
max_locks_per_transaction = 512
log_line_prefix = '%a|'
CONF
as_postgres "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w start >/dev/null
export PGHOST=$dir PGUSER=postgres PGDATABASE=postgres
url="host=$dir user=postgres dbname=postgres"
"$pgfence" --database-url "$url" migrate >/dev/null 2>&1

names="(SELECT array_agg('n' || lpad(j::text, 6, '0') ORDER BY j) FROM generate_series(0, $s - 1) j)"
member="'m' || lpad(i::text, 3, '0')"
psql_q() { as_postgres psql -q -v ON_ERROR_STOP=1 "$@" >/dev/null; }
echo "== $m members x $s names, PostgreSQL $("$bin/postgres" --version | awk '{print $3}'), $runs runs each"
psql_q -c "CREATE TABLE sec (member text, inc bigint, secret text)"
psql_q -c "INSERT INTO sec SELECT $member, (r).incarnation, (r).secret FROM (SELECT i, pgfence.join_group('c/g', $member, 1, $names, '{}', '{}', 3600000) r FROM generate_series(0, $m - 1) i) x"
psql_q -c "SELECT count(*) FROM (SELECT pgfence.heartbeat('c/g', member, inc, secret, 3600000) FROM sec) x"
psql_q -c "SELECT count(*) FROM (SELECT pgfence.acquire('c/n' || lpad(j::text, 6, '0'), 'm' || lpad((j % $m)::text, 3, '0'), 3600000) FROM generate_series(0, $s - 1) j) x"
psql_q -c "UPDATE pgfence.groups SET pending_since = now() - interval '1 hour', changed_at = now() - interval '1 hour'"
psql_q -c "SELECT (pgfence.claim_rebalance('c/g', member, inc, secret)).outcome FROM sec WHERE member = 'm000'"
psql_q -c "SELECT (pgfence.assign_group('c/g', 'm000', s.inc, s.secret, (SELECT version FROM pgfence.groups), 0, $names, (SELECT array_agg('m' || lpad((j % $m)::text, 3, '0') ORDER BY j) FROM generate_series(0, $s - 1) j), '{}', (SELECT array_agg(member) FROM sec))).outcome FROM sec s WHERE member = 'm000'"
psql_q -c "ANALYZE"
echo "leases: $(as_postgres psql -Atc 'SELECT count(*) FROM pgfence.leases'), assigned: $(as_postgres psql -Atc 'SELECT count(*) FROM pgfence.assignments')"

median() { sort -n | awk '{v[NR]=$1} END {if (NR == 0) print "-"; else if (NR % 2) print v[(NR+1)/2]; else printf "%.1f\n", (v[NR/2]+v[NR/2+1])/2}'; }

# One variant: RUNS runs of `pgfence ARGS`, the median wall time and the statements it sent (by the log).
measure() {
    local label=$1; shift
    local times=() bytes=0
    for _ in $(seq "$runs"); do
        : > "$dir/run.log"
        local before
        before=$(wc -c < "$dir/log")
        local t0 t1
        t0=$(date +%s%N)
        "$pgfence" --database-url "$url" "$@" > "$dir/out"
        t1=$(date +%s%N)
        tail -c +"$((before + 1))" "$dir/log" | grep '^pgfence-cli|' >> "$dir/statements.$label" || true
        times+=("$(( (t1 - t0) / 1000000 ))")
        bytes=$(wc -c < "$dir/out")
    done
    printf '%-28s median %6s ms wall (runs: %s), %s lines, %s bytes\n' "pgfence $*" \
        "$(printf '%s\n' "${times[@]}" | median)" "${times[*]}" "$(wc -l < "$dir/out")" "$bytes"
    # Each distinct statement (its first 90 characters) with its count per run and its median server time.
    # (The extended protocol logs a parse, a bind and an execute per statement: the kind is kept, up to the name.)
    sed -n 's/^pgfence-cli|LOG:  duration: \([0-9.]*\) ms  \([a-z]*\)[^:]*: \(.*\)$/\1\t\2: \3/p' "$dir/statements.$label" |
        awk -F'\t' -v runs="$runs" '{k = substr($2, 1, 90); n[k]++; t[k] = t[k] " " $1}
            END {for (k in n) print n[k] / runs "\t" t[k] "\t" k}' |
        while IFS=$'\t' read -r count durations text; do
            printf '    %4s x %9s ms  %s\n' "$count" "$(printf '%s\n' $durations | median)" "$text"
        done | sort -k3 -rn | head -16
}

psql_q -c "ALTER SYSTEM SET log_min_duration_statement = 0" -c "SELECT pg_reload_conf()"
measure text status
measure json status --json
if "$pgfence" status --help | grep -q -- '--all'; then measure all status --all; fi
psql_q -c "ALTER SYSTEM RESET log_min_duration_statement" -c "SELECT pg_reload_conf()"

echo "== EXPLAIN ANALYZE of the reads behind status"
explain() {
    echo "-- $1"
    as_postgres psql -At -c "EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON) $2" | grep -E 'Execution Time|^[A-Z][a-zA-Z ]+\(' | head -4
}
explain "group_members (every row, with its name lists)" \
    "SELECT \"group\", member, assigned, leads FROM pgfence.group_members ORDER BY \"group\", member"
if as_postgres psql -Atc "SELECT 1 FROM pg_views WHERE schemaname = 'pgfence' AND viewname = 'group_member_counts'" | grep -q 1; then
    explain "group_member_counts (counts only)" \
        "SELECT * FROM pgfence.group_member_counts ORDER BY \"group\", member"
fi

if [ "${KEEP:-0}" = 1 ]; then
    echo "server up: DATABASE_URL='$url'  (Enter stops it)"
    read -r _
fi
