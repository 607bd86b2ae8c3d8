#!/usr/bin/env bash
# The fleet's cost curve: `pgfence demo --scenario fleet` (real `pgfence replica` processes, a rolling start one
# every 100 ms, a throwaway server each run) for every M replicas x S names given, one run each, one after the
# other, and one table row per run: convergence (after the last start), tenures begun until balanced (above S is
# churn), statements per second and server time per second at steady state, the server time of one replica's
# renewal statement (its heartbeat and its leases: one per replica per ttl/3), connections, memory per replica,
# a SIGKILLed replica's names led again, a SIGTERMed one's handover p99, a join, and the replicas' warnings.
# A run that does not converge within WITHIN prints "never" and the curve goes on.
#
# usage: benches/fleet_curve.sh "M1xS1 M2xS2 ..." [TTL] [STABLE] [WITHIN] [PGFENCE]
#        e.g. benches/fleet_curve.sh "10x1000 30x1000 100x1000 10x10000 30x10000 100x10000" 15s 20s 300s
#        PGFENCE defaults to $CARGO_TARGET_DIR/release/pgfence (cargo build --release -p pgfence-cli)
set -uo pipefail

sizes=${1:?"usage: $0 \"MxS ...\" [TTL] [STABLE] [WITHIN] [PGFENCE]"}
ttl=${2:-15s}
stable=${3:-20s}
within=${4:-300s}
root=$(cd "$(dirname "$0")/.." && pwd)
pgfence=${5:-${CARGO_TARGET_DIR:-$root/target}/release/pgfence}
[ -x "$pgfence" ] || { echo "no pgfence binary at $pgfence" >&2; exit 2; }
out=$(mktemp -d /tmp/pgfence-fleet-curve.XXXXXX)

printf '| M x S | names per replica | balanced after the last start | tenures begun until balanced | statements/s (steady) | server ms/s (steady) | renewal statement, ms | connections | memory per replica, MiB (median / max) | SIGKILL: led again after | SIGTERM: handover p99, ms | join: leads its quota after | replicas warnings / errors |\n'
printf '|---|---|---|---|---|---|---|---|---|---|---|---|---|\n'
for size in $sizes; do
    m=${size%x*}
    s=${size#*x}
    json=$out/fleet-${m}x${s}.json
    "$pgfence" demo --json --scenario fleet --replicas "$m" --names "$s" --fleet-ttl "$ttl" --stable "$stable" \
        --within "$within" >"$json" 2>"$out/fleet-${m}x${s}.err"
    python3 - "$json" "$m" "$s" <<'PY'
import json, sys
path, m, s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:
    r = json.load(open(path))
except ValueError:
    print(f"| {m} x {s} | {s // m} | never (no report: see {path[:-5]}.err) |" + " |" * 10)
    sys.exit(0)
sec = lambda v: "never" if v is None else f"{v / 1000:.1f} s"
f1 = lambda v: "-" if v is None else f"{v:.1f}"
print(f"| {m} x {s} | {s / m:.0f} | {sec(r['converged_ms'])} | {r['tenures_until_balanced']} | "
      f"{r['statements_per_s']:.1f} | {r['server_ms_per_s']:.0f} | {f1(r['renewal_ms'])} | {r['connections']} | "
      f"{r['rss_median_mib']:.1f} / {r['rss_max_mib']:.1f} | {sec(r['killed_releds_ms'])} | "
      f"{f1(r['handover_p99_ms'])} | {sec(r['join_ms'])} | {r['replica_warnings']} / {r['replica_errors']} |")
PY
done
echo "reports: $out"
