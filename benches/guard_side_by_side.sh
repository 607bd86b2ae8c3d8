#!/usr/bin/env bash
# The guard's write path as in the working tree against its definition as of REV (default HEAD), side by side in
# ONE pgbench run, as append_event_side_by_side.sh does for append_event alone: a throwaway server
# (pg_stat_statements loaded, fsync off), one database migrated with the working tree, and REV's pgfence.fence,
# _guard, _open_task_write and append_event added to schema b (renamed *_before, calling each other), so a
# change of the guard itself is compared too. pgbench (-M prepared, c=1) mixes four scripts at random — the
# guard alone (pgfence.fence) and a task write (append_event), each before and after, each on a task of its own —
# so all see the same noise. Prints per round the mean server time of each (pg_stat_statements) and
# after ÷ before, then the medians.
#
# usage: benches/guard_side_by_side.sh [REV] [ROUNDS] [SECONDS]    (as root or as the postgres OS user)
set -euo pipefail

rev=${1:-HEAD}
rounds=${2:-7}
secs=${3:-10}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)

as_postgres() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

dir=$(mktemp -d /tmp/pgfence-guard-side-by-side.XXXXXX)
chmod 755 "$dir"
if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; fi
port=$((50000 + RANDOM % 10000))
as_postgres "$bin/initdb" -D "$dir/data" -E UTF8 --locale=C.UTF-8 -A trust -U postgres >/dev/null
as_postgres "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w -o "-p $port -k $dir -c listen_addresses='' \
    -c fsync=off -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=top" start >/dev/null
trap 'as_postgres "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT

psql=(psql -X -q -h "$dir" -p "$port" -U postgres -v ON_ERROR_STOP=1)
"${psql[@]}" -d postgres -c "CREATE DATABASE side"
cat "$root"/migrations/*/up.sql >"$dir/after.sql"
"${psql[@]}" -d side -c "CREATE EXTENSION pg_stat_statements" -f "$dir/after.sql" >/dev/null
# REV's functions: the last definition of each in migration order, renamed into schema b, and their calls of
# each other too.
for path in $(git -C "$root" ls-tree -r --name-only "$rev" -- migrations | grep '/up\.sql$' | sort); do
    git -C "$root" show "$rev:$path"
done | python3 -c '
import re, sys
text = sys.stdin.read()
names = ["fence", "_guard", "_open_task_write", "append_event"]
print("CREATE SCHEMA b;")
for name in names:
    found = re.findall(rf"^CREATE (?:OR REPLACE )?FUNCTION pgfence\.{re.escape(name)}\(.*?^\$\$;$", text, re.S | re.M)
    body = found[-1]
    for other in names:
        body = re.sub(rf"\bpgfence\.{re.escape(other)}\(", f"b.{other}_before(", body)
    print(re.sub(r"^CREATE (?:OR REPLACE )?FUNCTION ", "CREATE FUNCTION ", body, count=1))
' >"$dir/before.sql"
"${psql[@]}" -d side -f "$dir/before.sql" >/dev/null
"${psql[@]}" -d side >/dev/null <<'SQL'
CREATE TABLE b.creds AS SELECT secret, epoch FROM pgfence.acquire('c/l', 'h', 36000000);
SELECT pgfence.create_task('c/l', (SELECT epoch FROM b.creds), (SELECT secret FROM b.creds), 'k1', '{}');
SELECT pgfence.create_task('c/l', (SELECT epoch FROM b.creds), (SELECT secret FROM b.creds), 'k2', '{}');
SQL
read -r epoch secret < <("${psql[@]}" -d side -At -F ' ' -c "SELECT epoch, secret FROM b.creds")
echo "SELECT * FROM pgfence.fence('c/l', :epoch, :secret, 'bench', NULL, NULL);" >"$dir/fence-after.sql"
echo "SELECT * FROM b.fence_before('c/l', :epoch, :secret, 'bench', NULL, NULL);" >"$dir/fence-before.sql"
echo "SELECT * FROM pgfence.append_event('c/l', :epoch, :secret, 'k1', 'note', '{}');" >"$dir/append-after.sql"
echo "SELECT * FROM b.append_event_before('c/l', :epoch, :secret, 'k2', 'note', '{}');" >"$dir/append-before.sql"

echo "fence and append_event as of $rev (before) against the working tree (after), mixed in one run; $rounds rounds of ${secs} s" >&2
for r in $(seq 1 "$rounds"); do
    "${psql[@]}" -d side -c "SELECT pg_stat_statements_reset()" >/dev/null
    "$bin/pgbench" -h "$dir" -p "$port" -U postgres -n -M prepared -c 1 -T "$secs" \
        -D epoch="$epoch" -D secret="$secret" -f "$dir/fence-after.sql@1" -f "$dir/fence-before.sql@1" \
        -f "$dir/append-after.sql@1" -f "$dir/append-before.sql@1" side >/dev/null 2>&1
    "${psql[@]}" -d side -At -F ' ' -c "SELECT
        round((max(mean_exec_time) FILTER (WHERE query LIKE '%b.fence_before%') * 1000)::numeric, 2),
        round((max(mean_exec_time) FILTER (WHERE query LIKE '%pgfence.fence%') * 1000)::numeric, 2),
        round((max(mean_exec_time) FILTER (WHERE query LIKE '%b.append_event_before%') * 1000)::numeric, 2),
        round((max(mean_exec_time) FILTER (WHERE query LIKE '%pgfence.append_event%') * 1000)::numeric, 2)
        FROM pg_stat_statements WHERE toplevel AND calls > 100" >>"$dir/results"
    tail -1 "$dir/results" | awk -v r="$r" '{ printf "round %s: fence %s -> %s µs (%.3f), append_event %s -> %s µs (%.3f)\n", r, $1, $2, $2 / $1, $3, $4, $4 / $3 }' >&2
done

python3 - "$dir/results" <<'PY'
import statistics
import sys

rows = [tuple(map(float, line.split())) for line in open(sys.argv[1])]
for name, i in (("fence", 0), ("append_event", 2)):
    ratios = sorted(r[i + 1] / r[i] for r in rows)
    print(f"{name}: {statistics.median(r[i] for r in rows):.1f} µs before, "
          f"{statistics.median(r[i + 1] for r in rows):.1f} µs after; after ÷ before per round: median "
          f"{statistics.median(ratios):.3f} (min {ratios[0]:.3f}, max {ratios[-1]:.3f})")
PY
