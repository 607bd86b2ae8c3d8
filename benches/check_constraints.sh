#!/usr/bin/env bash
# What the table constraints cost a write: pgfence's CHECK constraints call the text rules through plpgsql
# wrappers (pgfence._storable_text, _storable_lease, _storable_cluster), not the inlinable SQL rules themselves,
# because a statement that writes a table prepares its CHECK expressions anew on every execution, and an
# inlinable SQL function in one is parsed and inlined each time.
#
# A throwaway server from BIN (fsync off) with two databases migrated from the working tree: `wrapped` as it is,
# and `inlined`, where every CHECK constraint calls the SQL rule directly (`pgfence._text_problem(x, max) IS
# NULL`, as before the wrappers; rewritten here in the scratch copy, never in the product). Then ROUNDS
# interleaved rounds, one client, pgbench -M prepared, each workload for SECS seconds in each database:
#   acquire1    pgfence.acquire_many of one new lease (an INSERT and an UPDATE of its row, a tenure, a belief)
#   acquire100  pgfence.acquire_many of 100 new leases (one statement; figures are per statement)
#   reacquire   pgfence.acquire of one of 1,000 existing leases by its own holder (the UPDATE path)
#   insert      a bare INSERT of one lease row (nothing but the row and its constraints)
#   append      pgfence.append_event on one task of a held lease (a guarded write: the task row and an event)
# Prints each workload's median latency per database and the median of the per-round ratios wrapped / inlined.
#
# usage: benches/check_constraints.sh [BIN] [ROUNDS] [SECS]   (as root or as the postgres OS user)
#   BIN: the server's bin directory (default: the newest /usr/lib/postgresql/*/bin), e.g. "$(.ci/pg-versions bin 18)"
set -euo pipefail
bin=${1:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)}
rounds=${2:-5}
secs=${3:-3}
root=$(cd "$(dirname "$0")/.." && pwd)

as_postgres() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
dir=$(mktemp -d /tmp/pgfence-checks.XXXXXX)
chmod 755 "$dir"
if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; fi
port=$((40000 + RANDOM % 10000))
as_postgres "$bin/initdb" -D "$dir/data" -E UTF8 --locale=C.UTF-8 -A trust -U postgres >/dev/null
as_postgres "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w -o "-p $port -k $dir -c listen_addresses='' \
    -c fsync=off -c max_connections=20" start >/dev/null
trap 'as_postgres "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
export PGHOST=$dir PGPORT=$port PGUSER=postgres
psql=(psql -X -q -v ON_ERROR_STOP=1)
for db in wrapped inlined; do
    "${psql[@]}" -d postgres -c "CREATE DATABASE $db"
done
cat "$root"/migrations/*/up.sql | "${psql[@]}" -d wrapped >/dev/null
# The same migrations with each CHECK constraint calling the SQL rule itself (only lines holding a CHECK).
cat "$root"/migrations/*/up.sql | sed -E \
    -e '/CHECK \(/s/pgfence\._storable_text\(([a-z_]+), (pgfence\._max_[a-z_]+\(\))\)/pgfence._text_problem(\1, \2) IS NULL/g' \
    -e '/CHECK \(/s/pgfence\._storable_lease\(([a-z_]+)\)/pgfence._lease_problem(\1) IS NULL/g' \
    -e '/CHECK \(/s/pgfence\._storable_cluster\(([a-z_]+)\)/pgfence._cluster_problem(\1) IS NULL/g' \
    | "${psql[@]}" -d inlined >/dev/null
for db in wrapped inlined; do
    "${psql[@]}" -d $db >/dev/null <<'SQL'
CREATE TABLE public.creds AS SELECT secret, epoch FROM pgfence.acquire('c/t', 'h', 36000000);
SELECT pgfence.create_task('c/t', epoch, secret, 'k1', '{}'::jsonb) FROM public.creds;
SQL
    "${psql[@]}" -d $db -c "SELECT count(*) FROM generate_series(0, 3) b, LATERAL pgfence.acquire_many(ARRAY(SELECT 'c/r' || g FROM generate_series(b * 250 + 1, b * 250 + 250) g ORDER BY 1), 'h', 3600000) a" >/dev/null
done
wrapped_checks=$("${psql[@]}" -At -d wrapped -c "SELECT count(*) FROM pg_constraint WHERE connamespace = 'pgfence'::regnamespace AND pg_get_constraintdef(oid) ~ '_storable_'")
inlined_checks=$("${psql[@]}" -At -d inlined -c "SELECT count(*) FROM pg_constraint WHERE connamespace = 'pgfence'::regnamespace AND pg_get_constraintdef(oid) ~ '_storable_'")
echo "constraints through a wrapper: wrapped $wrapped_checks, inlined $inlined_checks"

cat >"$dir/acquire1.sql" <<'SQL'
\set id random(1, 2000000000)
SELECT count(*) FROM pgfence.acquire_many(ARRAY['c/a' || :id], 'h', 15000);
SQL
cat >"$dir/acquire100.sql" <<'SQL'
\set id random(1, 2000000000)
SELECT count(*) FROM pgfence.acquire_many(ARRAY(SELECT 'c/b' || :id || '-' || lpad(g::text, 3, '0') FROM generate_series(1, 100) g), 'h', 15000);
SQL
cat >"$dir/reacquire.sql" <<'SQL'
\set id random(1, 1000)
SELECT outcome FROM pgfence.acquire('c/r' || :id, 'h', 3600000);
SQL
cat >"$dir/insert.sql" <<'SQL'
\set id random(1, 2000000000)
INSERT INTO pgfence.leases (name) VALUES ('c/i' || :id) ON CONFLICT (name) DO NOTHING;
SQL
cat >"$dir/append.sql" <<'SQL'
SELECT secret, epoch FROM public.creds \gset
SELECT outcome FROM pgfence.append_event('c/t', :epoch, :secret, 'k1', 'progress', '{}'::jsonb);
SQL
workloads="acquire1 acquire100 reacquire insert append"
out="$dir/results"
: >"$out"
for round in $(seq 1 "$rounds"); do
    for w in $workloads; do
        for db in wrapped inlined; do
            lat=$(pgbench -n -M prepared -T "$secs" -f "$dir/$w.sql" "$db" 2>&1 | awk '/latency average/ {print $4}')
            echo "$round $w $db $lat" >>"$out"
        done
    done
done
python3 - "$out" "$bin" "$rounds" "$secs" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
lat = {}
for r, w, db, v in rows:
    lat.setdefault((w, db), {})[r] = float(v)
print(f"server {sys.argv[2]}, {sys.argv[3]} rounds of {sys.argv[4]} s, one client, latency per statement (ms)")
print(f"{'workload':<12} {'wrapped':>9} {'inlined':>9} {'wrapped/inlined':>16}")
for w in ["acquire1", "acquire100", "reacquire", "insert", "append"]:
    a, b = lat[(w, "wrapped")], lat[(w, "inlined")]
    ratios = [a[r] / b[r] for r in a if r in b]
    print(f"{w:<12} {statistics.median(a.values()):>9.3f} {statistics.median(b.values()):>9.3f} "
          f"{statistics.median(ratios):>16.2f}")
PY
