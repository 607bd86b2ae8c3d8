#!/usr/bin/env bash
# The shapes of the portable guard (pgfence._install_guard: plpgsql, sql) side by side on one server, with the
# unguarded UPDATE and the FOR SHARE peer, and throwaway variants of the SQL shape that drop one protection each
# (made here, in the scratch database, never in the product): without the secret check (sql_nosecret), without
# the grant check (sql_nogrant), and with a pinned search_path (sql_set: what the other defence against a hostile
# search_path would cost; the shape's own defence, qualified names, is resolved when the plan is made).
#
# A throwaway server from BIN (fsync off), one database migrated with the working tree, an application role
# granted the cluster (BYPASSRLS after the grant, so the peer's FOR SHARE sees the lease row), 1,000 rows; then
# ROUNDS interleaved rounds: in each, at 1 and at 4 clients, every workload for SECS seconds (pgbench -M prepared,
# the one-statement guarded UPDATE Store::guarded_write sends, each variant of the guard named in it). Prints the
# median tx/s and the medians of the per-round ratios.
#
# usage: benches/guard_shapes.sh BIN [ROUNDS] [SECS] [WORKLOADS]   (as root or as the postgres OS user)
#   BIN: the server's bin directory, e.g. "$(.ci/pg-versions bin 18)" or /usr/lib/postgresql/15/bin
#   WORKLOADS (default "update peer plpgsql sql sql_nosecret sql_nogrant sql_set")
set -euo pipefail
bin=$1
rounds=${2:-5}
secs=${3:-2}
workloads=${4:-update peer plpgsql sql sql_nosecret sql_nogrant sql_set}
root=$(cd "$(dirname "$0")/.." && pwd)

as_postgres() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
dir=$(mktemp -d /tmp/pgfence-guard-shapes.XXXXXX)
chmod 755 "$dir"
if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; fi
port=$((40000 + RANDOM % 10000))
as_postgres "$bin/initdb" -D "$dir/data" -E UTF8 --locale=C.UTF-8 -A trust -U postgres >/dev/null
as_postgres "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w -o "-p $port -k $dir -c listen_addresses='' \
    -c fsync=off -c max_connections=50" start >/dev/null
trap 'as_postgres "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
export PGHOST=$dir PGPORT=$port PGUSER=postgres
psql=(psql -X -q -v ON_ERROR_STOP=1)
"${psql[@]}" -d postgres -c "CREATE DATABASE t"
cat "$root"/migrations/*/up.sql | "${psql[@]}" -d t >/dev/null
"${psql[@]}" -d t >/dev/null <<'SQL'
CREATE ROLE app LOGIN;
SELECT pgfence.grant_application('app', 'c');
ALTER ROLE app BYPASSRLS;
CREATE SCHEMA b; GRANT USAGE ON SCHEMA b TO app;
CREATE TABLE b.t (id bigint PRIMARY KEY, v bigint NOT NULL DEFAULT 0);
INSERT INTO b.t (id) SELECT generate_series(0, 999);
GRANT SELECT, UPDATE ON b.t TO app;
CREATE TABLE b.creds AS SELECT secret, epoch FROM pgfence.acquire('c/l', 'h', 36000000);
GRANT SELECT, UPDATE ON pgfence.leases TO app;
SQL
# Copies of each shape (and the variants) in schema v, with the definitions pgfence._install_guard installs.
python3 - <<'PY' | "${psql[@]}" -d t >/dev/null
import subprocess
def run(sql):
    return subprocess.run(["psql", "-X", "-At", "-d", "t", "-c", sql], check=True, capture_output=True,
                          text=True).stdout
def definition(shape):
    run(f"SELECT pgfence._install_guard('{shape}')")
    return run("SELECT pg_get_functiondef('pgfence.fence(text,bigint,text,text,text,text)'::regprocedure)")
plpgsql, sql = definition("plpgsql"), definition("sql")
run("SELECT pgfence._install_guard()")
secret = """             AND pg_catalog.length(p_secret) OPERATOR(pg_catalog.<=) 128
             AND s.hash OPERATOR(pg_catalog.=) pg_catalog.sha256(pg_catalog.convert_to(p_secret, 'UTF8'))\n"""
grant = sql[sql.index("             AND (pg_catalog.pg_has_role(session_user, current_user, 'MEMBER')"):
            sql.index("             AS admitted,")]
assert secret in sql and grant
variants = {
    "plpgsql": plpgsql,
    "sql": sql,
    "sql_nosecret": sql.replace(secret, ""),
    "sql_nogrant": sql.replace(grant, ""),
    "sql_set": sql.replace(" SECURITY DEFINER\n", " SECURITY DEFINER\n SET search_path TO 'pg_catalog', 'pg_temp'\n", 1),
}
print("CREATE SCHEMA v; GRANT USAGE ON SCHEMA v TO app;")
for name, text in variants.items():
    print(text.replace("FUNCTION pgfence.fence(", f"FUNCTION v.{name}(", 1).rstrip() + ";")
    print(f"GRANT EXECUTE ON FUNCTION v.{name}(text,bigint,text,text,text,text) TO app;")
PY
cat >"$dir/update.sql" <<'S'
\set id random(0, 999)
UPDATE b.t SET v = v + 1 WHERE id = :id;
S
cat >"$dir/peer.sql" <<'S'
\set id random(0, 999)
WITH l AS (SELECT 1 FROM pgfence.leases WHERE name = 'c/l' AND epoch = :epoch FOR SHARE) UPDATE b.t SET v = v + 1 WHERE id = :id AND EXISTS (SELECT FROM l);
S
for f in plpgsql sql sql_nosecret sql_nogrant sql_set; do
    cat >"$dir/$f.sql" <<S
\set id random(0, 999)
WITH RECURSIVE pgfence_write AS (UPDATE b.t SET v = v + 1 WHERE id = :id AND (SELECT passed FROM pgfence_guard) RETURNING 1), pgfence_guard AS MATERIALIZED (SELECT g.outcome = 'ok' AS passed, g.outcome, g.reason, g.current_epoch, g.current_holder FROM v.$f('c/l', :epoch, :secret, 'bench', NULL, NULL) g) SELECT g.outcome, g.reason, g.current_epoch, g.current_holder, CASE WHEN g.passed OR w.n = 0 THEN w.n ELSE pgfence.ungated_write(g.outcome, w.n) END AS n FROM pgfence_guard g, (SELECT count(*) AS n FROM pgfence_write) w;
S
done
read -r epoch secret < <(psql -X -At -F ' ' -d t -c "SELECT epoch, secret FROM b.creds")
for w in $workloads; do
    case $w in
        update | peer) ;;
        *) [ "$(psql -X -At -d t -U app -c "SELECT outcome FROM v.$w('c/l', $epoch, '$secret', 'bench', NULL, NULL)")" = ok ] \
               || { echo "guard_shapes: v.$w does not admit" >&2; exit 1; } ;;
    esac
done
echo "# $("$bin/postgres" --version) rounds=$rounds secs=$secs" >"$dir/results"
for r in $(seq 1 "$rounds"); do
    for c in 1 4; do
        for w in $workloads; do
            tps=$(pgbench -n -M prepared -U app -c "$c" -j "$c" -T "$secs" -D epoch="$epoch" -D secret="$secret" \
                -f "$dir/$w.sql" t 2>&1 | sed -n 's/^tps = \([0-9.]*\) .*/\1/p' | head -1)
            echo "$r $c $w $tps" >>"$dir/results"
            echo "round $r, c=$c: $w $tps tx/s" >&2
        done
    done
done
python3 - "$dir/results" <<'PY'
import collections, statistics, sys
lines = open(sys.argv[1]).read().splitlines()
print(lines[0])
rows = [l.split() for l in lines[1:]]
runs = collections.defaultdict(dict)
for r, c, w, tps in rows:
    runs[(r, c)][w] = float(tps)
names = list(dict.fromkeys(w for _, _, w, _ in rows))
bases = [b for b in ("update", "peer", "plpgsql", "sql") if b in names]
for c in ("1", "4"):
    rounds = [k for k in runs if k[1] == c]
    print(f"c={c}: median tx/s, and the median of the per-round ratios (÷ {', '.join(bases)})")
    for w in names:
        ratios = "  ".join(f"{statistics.median(runs[k][w] / runs[k][b] for k in rounds):.2f}" for b in bases)
        print(f"  {w:<13} {statistics.median(runs[k][w] for k in rounds):>8.0f}   {ratios}")
PY
