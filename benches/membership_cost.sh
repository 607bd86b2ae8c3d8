#!/usr/bin/env bash
# What each membership statement costs at the size of a fleet: M members of one group, all declaring the same S
# names, one held lease per name; timed with psql's \timing on a throwaway server (fsync off), the statements
# a member sends per tick (the heartbeat), per read of its names, and those of one rebalance.
#
# Starts a throwaway PostgreSQL server, migrates a database with migrations/*/up.sql of REV (default: the working
# tree; give a commit to measure an older design, e.g. one with pgfence.roster), and prints each statement's time.
# Statements a revision does not have are skipped with a note.
#
# usage: benches/membership_cost.sh [M] [S] [REV]    e.g. benches/membership_cost.sh 100 10000
#        (as root or as the postgres OS user)
set -euo pipefail

m=${1:-30}
s=${2:-3000}
rev=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)}

as_postgres() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

dir=$(mktemp -d /tmp/pgfence-membership-cost.XXXXXX)
chmod 755 "$dir"
if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; fi
trap 'as_postgres "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
as_postgres "$bin/initdb" -D "$dir/data" -A trust -U postgres >/dev/null
cat >> "$dir/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$dir'
fsync = off
synchronous_commit = off
CONF
as_postgres "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w start >/dev/null
export PGHOST=$dir PGUSER=postgres PGDATABASE=postgres
for f in "$root"/migrations/*/up.sql; do
    if [ -n "$rev" ]; then
        git -C "$root" show "$rev:${f#$root/}" | as_postgres psql -q -v ON_ERROR_STOP=1 >/dev/null
    else
        as_postgres psql -q -v ON_ERROR_STOP=1 -f "$f" >/dev/null
    fi
done

names="(SELECT array_agg('n' || lpad(j::text, 6, '0') ORDER BY j) FROM generate_series(0, $s - 1) j)"
member="'m' || lpad(i::text, 3, '0')"
has() { [ "$(as_postgres psql -Atc "SELECT count(*) FROM pg_proc WHERE proname = '$1' AND pronamespace = 'pgfence'::regnamespace")" != 0 ]; }
timed() {
    local label=$1 sql=$2
    local ms
    ms=$(as_postgres psql -At -c '\timing on' -c "$sql" 2>&1 | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | tail -1)
    printf '%-44s %10s ms\n' "$label" "${ms:-failed}"
}

echo "== $m members x $s names, PostgreSQL $("$bin/postgres" --version | awk '{print $3}')${rev:+, migrations of $rev}"
as_postgres psql -q -c "CREATE TABLE sec (member text, inc bigint, secret text)"
timed "join, first declaring the set" "SELECT 1 FROM pgfence.join_group('c/g', 'm-first', 1, $names, '{}', '{}', 600000)"
as_postgres psql -q -c "INSERT INTO sec SELECT $member, (r).incarnation, (r).secret FROM (SELECT i, pgfence.join_group('c/g', $member, 1, $names, '{}', '{}', 600000) r FROM generate_series(0, $m - 1) i) x" >/dev/null
as_postgres psql -q -c "SELECT count(*) FROM (SELECT pgfence.heartbeat('c/g', member, inc, secret, 600000) FROM sec) x" >/dev/null
as_postgres psql -q -c "SELECT count(*) FROM (SELECT pgfence.acquire('c/n' || lpad(j::text, 6, '0'), 'm' || lpad((j % $m)::text, 3, '0'), 600000) FROM generate_series(0, $s - 1) j) x" >/dev/null
as_postgres psql -q -c "ANALYZE" >/dev/null
if has roster; then
    timed "roster (every member's names and leads)" "SELECT count(*) FROM pgfence.roster('c/g')"
fi
if has claim_rebalance; then
    as_postgres psql -q -c "UPDATE pgfence.groups SET pending_since = now() - interval '1 hour', changed_at = now() - interval '1 hour'"
    as_postgres psql -q -c "SELECT (pgfence.claim_rebalance('c/g', member, inc, secret)).outcome FROM sec WHERE member = 'm000'" >/dev/null
    timed "rebalance_inputs" "SELECT count(*) FROM pgfence.rebalance_inputs('c/g')"
    timed "group_names (the set)" "SELECT cardinality(pgfence.group_names('c/g', (SELECT min(set_id) FROM pgfence.members)))"
    timed "group_assignment (before the first)" "SELECT count(*) FROM pgfence.group_assignment('c/g')"
    timed "assign_group (every name moves)" "SELECT (pgfence.assign_group('c/g', 'm000', s.inc, s.secret, (SELECT version FROM pgfence.groups), 0, $names, (SELECT array_agg('m' || lpad((j % $m)::text, 3, '0') ORDER BY j) FROM generate_series(0, $s - 1) j), '{}', (SELECT array_agg(member) FROM sec))).outcome FROM sec s WHERE member = 'm000'"
    timed "group_assignment" "SELECT count(*) FROM pgfence.group_assignment('c/g')"
    timed "assigned_names (one member's)" "SELECT cardinality(names) FROM pgfence.assigned_names('c/g', 'm007')"
fi
timed "heartbeat" "SELECT (pgfence.heartbeat('c/g', member, inc, secret, 600000)).outcome FROM sec WHERE member = 'm005'"
timed "heartbeat, another member" "SELECT (pgfence.heartbeat('c/g', member, inc, secret, 600000)).outcome FROM sec WHERE member = 'm006'"
timed "group_members (the operator's view)" "SELECT count(*) FROM pgfence.group_members"
