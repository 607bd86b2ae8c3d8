#!/usr/bin/env bash
# The guard's server time before and after a change of the migrations, side by side.
#
# Starts a throwaway PostgreSQL server (pg_stat_statements loaded, fsync off), creates two databases — one migrated
# with migrations/*/up.sql as of REV (default HEAD), one with the working tree's, each in the order the migrations
# apply — and runs pgbench -M prepared on each in turn, round after round (interleaved, so both see the same
# noise): the guard alone, the one-statement guarded UPDATE that Store::guarded_write sends, the same UPDATE
# unguarded, the same UPDATE behind the floor of a plpgsql guard (floor-update: the lock and a fresh read only),
# pgfence.append_event and the same writes without the guard; and, when the pgfence_native extension is installed
# on the server (native/), the guarded UPDATE and the guard alone through pgfence_native.fence (native-update,
# native-fence). WORKLOADS="update guarded-update" picks some. Prints, per statement and database, the
# median over rounds of the mean server time per call (pg_stat_statements, top-level statements) and of tx/s, and
# the after ÷ before ratios.
#
# usage: benches/guard_server_time.sh [REV] [ROUNDS] [SECONDS]    (as root or as the postgres OS user)
set -euo pipefail

rev=${1:-HEAD}
rounds=${2:-3}
secs=${3:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)

as_postgres() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

dir=$(mktemp -d /tmp/pgfence-guard-time.XXXXXX)
chmod 755 "$dir"
if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; fi
port=$((50000 + RANDOM % 10000))
native=
as_postgres "$bin/initdb" -D "$dir/data" -E UTF8 --locale=C.UTF-8 -A trust -U postgres >/dev/null
as_postgres "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w -o "-p $port -k $dir -c listen_addresses='' \
    -c fsync=off -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=top" start >/dev/null
trap 'as_postgres "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT

psql=(psql -X -q -h "$dir" -p "$port" -U postgres -v ON_ERROR_STOP=1)
# Every migration in version order (the directory names start with the version), as of REV and as in the tree.
for path in $(git -C "$root" ls-tree -r --name-only "$rev" -- migrations | grep '/up\.sql$' | sort); do
    git -C "$root" show "$rev:$path" >>"$dir/before.sql"
done
cat "$root"/migrations/*/up.sql >"$dir/after.sql"

for db in before after; do
    "${psql[@]}" -d postgres -c "CREATE DATABASE $db"
    "${psql[@]}" -d "$db" -c "CREATE EXTENSION pg_stat_statements" -f "$dir/$db.sql" >/dev/null
    "${psql[@]}" -d "$db" >/dev/null <<'SQL'
-- Migrations older than the one-statement write lack its safety net; the statement below calls it (only on a
-- refusal that changed rows, which never happens here).
DO $$ BEGIN
    IF to_regprocedure('pgfence.ungated_write(text, bigint)') IS NULL THEN
        CREATE FUNCTION pgfence.ungated_write(p_outcome text, p_written bigint) RETURNS bigint
        LANGUAGE plpgsql AS 'BEGIN RAISE EXCEPTION ''ungated write''; END';
    END IF;
END $$;
CREATE SCHEMA b;
CREATE TABLE b.t (id bigint PRIMARY KEY, v bigint NOT NULL DEFAULT 0);
INSERT INTO b.t (id) SELECT generate_series(0, 99);
CREATE TYPE b.write_result AS (
    outcome text, reason text, current_epoch bigint, current_holder text, task_id bigint, task_key text,
    task_state text, assignee text, payload jsonb, fence bigint, version bigint, created boolean, event_id bigint);
-- pgfence.append_event without the guard: the same task UPDATE and event INSERT.
CREATE FUNCTION b.append_event_unguarded(p_lease text, p_epoch bigint, p_key text, p_kind text, p_payload jsonb)
RETURNS b.write_result LANGUAGE plpgsql AS $$
DECLARE t pgfence.tasks; ev bigint;
BEGIN
    UPDATE pgfence.tasks SET fence = p_epoch, updated_at = clock_timestamp()
     WHERE lease = p_lease AND key = p_key AND fence <= p_epoch RETURNING * INTO t;
    INSERT INTO pgfence.task_events (task_id, lease, epoch, kind, payload)
    VALUES (t.id, p_lease, p_epoch, p_kind, coalesce(p_payload, '{}')) RETURNING id INTO ev;
    RETURN ROW('ok', NULL, p_epoch, NULL, t.id, t.key, t.state, t.assignee, t.payload, t.fence, t.version,
               false, ev)::b.write_result;
END $$;
-- The floor of a plpgsql guard (the bench's raw-advisory-update): the lock and a fresh read of the epoch, nothing
-- else (no grant, secret, timeline, intent probe or audit; a yardstick, not safe).
CREATE FUNCTION b.fence_floor(p_lease text, p_epoch bigint) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE l pgfence.leases;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended(p_lease, 0));
    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;
    IF l.epoch = p_epoch AND l.state = 'held' AND l.expires_at > clock_timestamp() THEN
        RETURN 'ok';
    END IF;
    RETURN 'refused';
END $$;
CREATE TABLE b.creds AS SELECT secret, epoch FROM pgfence.acquire('c/l', 'h', 36000000);
SELECT pgfence.create_task('c/l', (SELECT epoch FROM b.creds), (SELECT secret FROM b.creds), 'k1', '{}');
SELECT pgfence.create_task('c/l', (SELECT epoch FROM b.creds), (SELECT secret FROM b.creds), 'k2', '{}');
SQL
    if [ -f "$("$bin/pg_config" --sharedir)/extension/pgfence_native.control" ]; then
        "${psql[@]}" -d "$db" -c "CREATE EXTENSION pgfence_native" >/dev/null
        native=yes
    fi
done

cat >"$dir/update.sql" <<'SQL'
\set id random(0, 99)
UPDATE b.t SET v = v + 1 WHERE id = :id;
SQL
cat >"$dir/guarded-update.sql" <<'SQL'
\set id random(0, 99)
WITH RECURSIVE pgfence_write AS (UPDATE b.t SET v = v + 1 WHERE id = :id AND (SELECT passed FROM pgfence_guard)
 RETURNING 1), pgfence_guard AS MATERIALIZED (SELECT g.outcome = 'ok' AS passed, g.outcome, g.reason, g.current_epoch, g.current_holder FROM pgfence.fence('c/l', :epoch, :secret, 'bench', NULL, NULL) g) SELECT g.outcome, g.reason, g.current_epoch, g.current_holder, CASE WHEN g.passed OR w.n = 0 THEN w.n ELSE pgfence.ungated_write(g.outcome, w.n) END AS n FROM pgfence_guard g, (SELECT count(*) AS n FROM pgfence_write) w;
SQL
cat >"$dir/floor-update.sql" <<'SQL'
\set id random(0, 99)
WITH g AS (SELECT b.fence_floor('c/l', :epoch) AS outcome), u AS (UPDATE b.t SET v = v + 1 WHERE id = :id AND (SELECT outcome FROM g) = 'ok' RETURNING 1) SELECT (SELECT outcome FROM g) AS outcome, (SELECT count(*) FROM u) AS written;
SQL
echo "SELECT * FROM pgfence.fence('c/l', :epoch, :secret, 'bench', NULL, NULL);" >"$dir/fence.sql"
sed 's/pgfence\.fence(/pgfence_native.fence(/' "$dir/guarded-update.sql" >"$dir/native-update.sql"
sed 's/pgfence\.fence(/pgfence_native.fence(/' "$dir/fence.sql" >"$dir/native-fence.sql"
echo "SELECT * FROM pgfence.append_event('c/l', :epoch, :secret, 'k1', 'note', '{}');" >"$dir/append.sql"
echo "SELECT * FROM b.append_event_unguarded('c/l', :epoch, 'k2', 'note', '{}');" >"$dir/append-unguarded.sql"

echo "guard server time: migrations/*/up.sql as of $rev (before) against the working tree (after); $rounds rounds of ${secs} s" >&2
for r in $(seq 1 "$rounds"); do
    for w in ${WORKLOADS:-update floor-update guarded-update fence append append-unguarded ${native:+native-update native-fence}}; do
        for db in before after; do
            read -r epoch secret < <("${psql[@]}" -d "$db" -At -F ' ' -c "SELECT epoch, secret FROM b.creds")
            "${psql[@]}" -d "$db" -c "SELECT pg_stat_statements_reset()" >/dev/null
            tps=$("$bin/pgbench" -h "$dir" -p "$port" -U postgres -n -M prepared -c 1 -T "$secs" \
                -D epoch="$epoch" -D secret="$secret" -f "$dir/$w.sql" "$db" 2>&1 |
                sed -n 's/^tps = \([0-9.]*\) .*/\1/p' | head -1)
            us=$("${psql[@]}" -d "$db" -At -c "SELECT round((mean_exec_time * 1000)::numeric, 1)
                FROM pg_stat_statements WHERE toplevel AND calls > 100 ORDER BY calls DESC LIMIT 1")
            echo "$w $db $tps $us" >>"$dir/results"
            echo "round $r: $w $db: $tps tx/s, $us µs" >&2
        done
    done
done

python3 - "$dir/results" <<'PY'
import statistics
import sys

rows = [line.split() for line in open(sys.argv[1])]
workloads = list(dict.fromkeys(r[0] for r in rows))
def med(w, db, i):
    return statistics.median(float(r[i]) for r in rows if r[0] == w and r[1] == db)
print(f"{'statement':<18} {'µs before':>10} {'µs after':>9} {'ratio':>6} {'tx/s before':>12} {'tx/s after':>11}")
for w in workloads:
    b, a = med(w, "before", 3), med(w, "after", 3)
    print(f"{w:<18} {b:>10.1f} {a:>9.1f} {a / b:>6.2f} {med(w, 'before', 2):>12.0f} {med(w, 'after', 2):>11.0f}")
PY
