#!/usr/bin/env bash
# The cargo-mutants sweep: every mutant cargo-mutants generates in one module of the library, run against the
# tests that exercise that module. It complements the mutation gate (tests/mutation/gate.py), whose hand-written
# mutations weaken the protocol and run in CI: the sweep is generated, takes from 6 (tasks) to 80 (leader) minutes
# per module on 2 cores, and is run by hand when a module changes. docs/mutants.md holds the last results and the review of
# every surviving mutant (killed by a test since, or why it is equivalent).
#
# Usage (from the repository root; needs `cargo install cargo-mutants`):
#     tests/mutation/sweep.sh MODULE...     # tasks lease fence leader
# Results: target/mutants/sweep/MODULE/mutants.out/{caught,missed,timeout,unviable}.txt
#
# The mutants are applied in a git worktree of HEAD under target/mutants/sweep/tree (committed code only), never
# in the working tree; its target directory starts as a copy of this one (`cp -a` keeps the timestamps cargo's
# fingerprints compare, so only pgfence itself recompiles), and each mutant then rebuilds in a few seconds.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
work="$root/target/mutants/sweep"
tree="$work/tree"
[ $# -gt 0 ] || { sed -n '2,14p' "$0"; exit 2; }
cargo mutants --version >/dev/null

if [ ! -d "$tree" ]; then
    mkdir -p "$work"
    git worktree add --detach "$tree" HEAD >/dev/null
    [ -d "$root/target/debug" ] && mkdir -p "$tree/target" && cp -a "$root/target/debug" "$tree/target/"
else
    git -C "$tree" checkout --detach --quiet "$(git rev-parse HEAD)"
fi

# The tests of the shared suite binary that are too slow for a run per mutant and exercise none of these
# modules: the CLI's exit codes (it runs the binary ~100 times), multi-host connection and the embedded server.
skip=(--test-threads 6 --skip hostile::cli_arguments --skip multihost:: --skip embedded::)
common=(cargo mutants -p pgfence --in-place --baseline skip --build-timeout 400
        # QueryResult is diesel's alias of Result: cargo-mutants offers constructors it does not have.
        -E 'QueryResult::(new|from_iter|from)\(')

# A test run that outlives this many seconds counts as a timeout (a catch, though a slow one). The suite's tests
# bound their own waits below it; the leader binary bounds every wait on a runtime signal to 15 s (tests/leader.rs,
# WAIT) and normally finishes in about 13 s.
timeout=240

sweep() { # module file-glob cargo-targets… -- test-filters…
    local module=$1 files=$2; shift 2
    local targets=()
    while [ "$1" != "--" ]; do targets+=(-C "$1"); shift; done
    shift
    echo "== $module ($files)"
    (cd "$tree" && "${common[@]}" --timeout "$timeout" "${targets[@]}" -o "$work/$module" -f "$files" -- -- "$@") || true
    wc -l "$work/$module"/mutants.out/{caught,missed,timeout,unviable}.txt
}

for module in "$@"; do
    case $module in
        tasks)
            sweep tasks src/tasks.rs --lib --test suite -- "${skip[@]}" \
                guard:: hostile::payload hostile::task hostile::any_epoch tasks ;;
        lease)
            sweep lease 'src/lease/*.rs' --lib --test suite -- "${skip[@]}" \
                lease:: guard::every_kind guard::stale_write trust::a_forged trust::another_role \
                hostile::lease_names hostile::ttls hostile::any_epoch store::identity takeover::renew_many lease ;;
        fence)
            sweep fence 'src/{fence/*.rs,admin.rs,audit.rs}' --lib --test suite -- "${skip[@]}" \
                guard:: privileges::repeated privileges::prune privileges::audit_mode trust::a_forged \
                trust::a_fence_handed trust::grant_refuses trust::two_applications trust::a_role_cannot \
                hostile::any_epoch takeover::guards_refuse sqlstate:: fence ;;
        leader)
            timeout=60 sweep leader 'src/leader/**/*.rs' --lib --test leader -- ;;
        *) echo "unknown module: $module (tasks lease fence leader)" >&2; exit 2 ;;
    esac
done
