#!/usr/bin/env python3
"""The mutation gate: every proof of pgfence's protocol must be able to fail.

Each mutation below weakens one thing the protocol or the runtime relies on — one named edit of the SQL in
migrations/*/up.sql or of a Rust source — and names the tests that must catch it (exact test names; a catcher
whose catch depends on timing forces its interleaving instead). The gate applies each mutation, runs only those
tests, in order until one fails, and fails itself unless every mutation is caught. The test binaries are built
once up front (`cargo test --no-run`) and run directly, with `--exact`: an SQL or C mutation rebuilds no Rust.

* SQL mutations are generated from the migrations as they are now (the function's definition is cut out of the
  migrations — the last one, in the order they apply, when a later migration replaces it — edited, and applied
  as CREATE OR REPLACE through PGFENCE_MUTANT_SQL on every migrated test database): no copy to drift. An
  edit that no longer applies (the text it names is gone or ambiguous) fails the gate, so the mutations follow
  the code or are updated with it.
* C mutations (of native/, the pgfence_native extension) are applied to a copy of native/ under
  <target>/mutants/native, built there (PGXS; nothing else is rebuilt), and loaded by the test servers through
  PGFENCE_NATIVE_LIB_DIR (dynamic_library_path, ahead of the tests' own build of native/, see
  tests/common/native.rs); PGFENCE_TEST_NATIVE=1 gives every test database the extension, so the suites run on
  the native guard.
* Rust mutations are applied to a copy of the source tree under <target>/mutants/tree (one copy reused, so only
  pgfence itself recompiles after the first), built in a target directory of its own shared by every Rust mutant
  (<target>/mutants/target): never in the repository's, whose test binaries it would replace.
<target> is cargo's target directory (CARGO_TARGET_DIR when set), so a warm one stays warm for the mutants too.

Usage (from the repository root):
    python3 tests/mutation/gate.py                 # every mutation; writes docs/mutation-gate.md
    python3 tests/mutation/gate.py NAME...         # only these
    python3 tests/mutation/gate.py --list          # the mutations and their catching tests
    python3 tests/mutation/gate.py --repeat 5 NAME...  # each of these 5 times (is every catch deterministic?)
    python3 tests/mutation/gate.py --emit DIR      # write each SQL mutant to DIR/NAME.sql and stop
Exit status: 0 when every mutation selected was caught, 1 otherwise, 2 on a mutation that no longer applies.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# In the order diesel applies them (the directory names start with the version).
MIGRATIONS = sorted(glob.glob(os.path.join(ROOT, "migrations", "*", "up.sql")))


def _target_dir() -> str:
    """Cargo's target directory for the repository (CARGO_TARGET_DIR, a cargo config, or target/)."""
    try:
        out = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)["target_directory"]
    except (OSError, subprocess.CalledProcessError, ValueError, KeyError):
        return os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")


WORK = os.path.join(_target_dir(), "mutants")
REPORT = os.path.join(ROOT, "docs", "mutation-gate.md")


@dataclass
class Edit:
    """Replace `find` (which must occur exactly once) by `replace`, in an SQL function or a Rust file."""

    target: str  # "sql:<function name>", or a path relative to the root (native/… for the C extension)
    find: str
    replace: str
    count: int = 1  # how many occurrences `find` must have (all are replaced)


@dataclass
class Mutation:
    name: str
    weakens: str
    edits: list[Edit]
    # Each suite: a label and the command (run from the root, or from the mutated tree for Rust mutations).
    suites: list[tuple[str, list[str]]] = field(default_factory=list)


# The suites that are modules of the shared test binary tests/suite.rs (see Cargo.toml's [[test]] targets).
SUITE_MODULES = {"guard", "guard_shapes", "lease", "store", "privileges", "trust", "sqlstate", "hostile", "multihost", "embedded",
                 "tls", "takeover", "standby", "migrations", "overlap", "hardening", "layout", "regress",
                 "membership", "spread", "native", "effects", "ledger_races", "acquire_many"}


# The native guard's differential test: every combination of the verdict's inputs through both guards.
DIFFERENTIAL = "differential::the_native_guard_agrees_with_the_verdict_on_every_combination"
# The same comparison at the moments between calls (tests/native/moments.rs): the first catcher of the three native
# mutations no single call shows.
MOMENTS = "moments::the_native_guard_agrees_with_the_verdict_at_every_moment_between_calls"


def cargo_test(test: str, *filters: str) -> tuple[str, list[str]]:
    if test in SUITE_MODULES:
        filters = tuple(f"{test}::{f}" for f in filters) or (f"{test}::",)
        test = "suite"
    # The label is the cargo command that runs the same tests (the gate runs the built binary itself).
    exact = " --exact" if filters and not any(f.endswith("::") for f in filters) else ""
    label = f"cargo test --test {test}" + (f" --{exact} {' '.join(filters)}" if filters else "")
    return label, ["cargo", "test", "--test", test, *filters]


def cargo_unit_test(filter: str) -> tuple[str, list[str]]:
    """The library's own unit tests matching `filter`."""
    exact = "" if filter.endswith("::") else " --exact"
    return f"cargo test --lib --{exact} {filter}", ["cargo", "test", "--lib", filter]


ISOLATION = ("tests/isolation/run.sh", ["bash", "tests/isolation/run.sh"])
# The rescue story of the effect ledger: worker processes and a workload engine, faults placed exactly.
# (A test of the command line's package: run through cargo, which builds nothing new for an SQL mutant.)
RESCUE_STORY = ("cargo test -p pgfence-cli --test rescue the_rescue_story_confirms_retries_and_keeps_late_outcomes",
                ["cargo", "test", "-p", "pgfence-cli", "--test", "rescue", "--",
                 "the_rescue_story_confirms_retries_and_keeps_late_outcomes", "--exact"])

# Texts of the migrations that several mutations edit.
GUARD_FAST_PATH = """    IF NOT pgfence._try_guard_lock(l.lock_key) THEN"""
GUARD_LOCK_STEP = GUARD_FAST_PATH + """
        PERFORM pgfence._await_takeover(p_lease, l.lock_key);
    END IF;
"""
TAKE_INTENT_LOCK = """    IF NOT pg_catalog.pg_try_advisory_xact_lock(pgfence._guard_lock_class(), -p_lock_key) THEN
        wait_ms := pgfence._lock_wait_ms();"""
TAKE_LOCK_FAST_PATH = """    IF pg_catalog.pg_try_advisory_xact_lock(pgfence._guard_lock_class(), p_lock_key) THEN
        RETURN;
    END IF;"""

# The truth table through every SQL shape of the portable guard (no native build needed).
SQL_SHAPES_TABLE = "differential::every_sql_shape_of_the_guard_agrees_with_the_verdict_on_every_combination"

MUTATIONS: list[Mutation] = [
    Mutation(
        "sql-shape-ignores-grant",
        "the SQL shape of pgfence.fence admits from its fast path without reading the grants: a session that "
        "remembers a tenure admits it for a login role without a grant on the cluster",
        [Edit("sql:_install_guard",
              "             AND (pg_catalog.pg_has_role(session_user, current_user, 'MEMBER')\n",
              "             AND (true OR pg_catalog.pg_has_role(session_user, current_user, 'MEMBER')\n")],
        [cargo_test("native", SQL_SHAPES_TABLE)],
    ),
    Mutation(
        "sql-shape-unqualified-operator",
        "the SQL shape of pgfence.fence compares the secret's hash with an unqualified =, which a caller's "
        "search_path can redirect to its own operator",
        [Edit("sql:_install_guard",
              "AND s.hash OPERATOR(pg_catalog.=) pg_catalog.sha256(",
              "AND s.hash = pg_catalog.sha256(")],
        [cargo_test("guard_shapes", "a_hostile_search_path_cannot_redirect_either_shape_of_the_guard")],
    ),
    Mutation(
        "guard-without-lock",
        "the guard reads the lease without taking its shared guard lock",
        [Edit("sql:_guard",
              GUARD_LOCK_STEP, "")],
        [ISOLATION, cargo_test("race", "no_stale_write_commits_after_a_takeover_commits")],
    ),
    Mutation(
        "guard-without-precheck-or-lock",
        "the guard has neither its unlocked pre-check nor its lock: one plain read decides",
        [Edit("sql:_guard",
              """    IF why IS NOT NULL THEN
        kept := pg_catalog.set_config(pgfence._known_slot(p_lease), '', false);
        RETURN pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, why, p_operation, p_table, p_key,
                               p_may_wait => true);
    END IF;
""", ""),
         Edit("sql:_guard",
              GUARD_LOCK_STEP, "")],
        [ISOLATION, cargo_test("race", "no_stale_write_commits_after_a_takeover_commits")],
    ),
    Mutation(
        "guard-row-lock",
        "the previous protocol: the guard locks the lease row FOR KEY SHARE instead of the guard lock (unfair)",
        [Edit("sql:_guard",
              GUARD_LOCK_STEP, "    PERFORM 1 FROM pgfence.leases WHERE name = p_lease FOR KEY SHARE;\n"),
         Edit("sql:_take_guard_lock",
              TAKE_LOCK_FAST_PATH,
              """    PERFORM 1 FROM pgfence.leases WHERE lock_key = p_lock_key FOR UPDATE;
    RETURN;""")],
        [cargo_test("takeover", "a_waiting_takeover_is_not_overtaken_by_later_guards"), ISOLATION],
    ),
    Mutation(
        "takeover-without-exclusive-lock",
        "acquire, release, force_release and the lease-row trigger never take the exclusive guard lock",
        [Edit("sql:_take_guard_lock",
              TAKE_LOCK_FAST_PATH, "    RETURN;")],
        [ISOLATION, cargo_test("race", "no_stale_write_commits_after_a_takeover_commits")],
    ),
    Mutation(
        "grace-lets-writes-in",
        "a takeover takes no intent lock (the previous protocol): writes queued behind it are let in when its wait "
        "for the guard lock runs out after the grace, answered ok, and ended with their sessions",
        [Edit("sql:_take_guard_lock", TAKE_INTENT_LOCK,
              """    IF false THEN
        wait_ms := pgfence._lock_wait_ms();""")],
        [cargo_test("takeover", "a_write_arriving_during_the_grace_is_refused_never_accepted_and_ended")],
    ),
    Mutation(
        "fast-path-without-intent-probe",
        "the guard's fast path takes the guard lock without probing the intent lock: a write arriving while a "
        "takeover ends the holders gets in, is answered ok, and is ended",
        [Edit("sql:_guard", GUARD_FAST_PATH,
              """    IF pg_catalog.pg_try_advisory_xact_lock_shared(pgfence._guard_lock_class(), l.lock_key) IS NOT TRUE THEN""")],
        [cargo_test("native", MOMENTS),
         cargo_test("guard", "a_write_arriving_while_a_takeover_holds_its_intent_lock_waits_on_either_path")],
    ),
    Mutation(
        "admit-without-lock",
        "the guard's fast path reads the lease without taking its guard lock (it only reads the remembered key)",
        [Edit("sql:_admit", "\n       OR NOT pgfence._try_guard_lock(k) THEN", " THEN")],
        [ISOLATION, cargo_test("race", "no_stale_write_commits_after_a_takeover_commits")],
    ),
    Mutation(
        "admit-lock-without-intent-probe",
        "the fast path's guard lock is taken without probing the intent lock: a write arriving while a takeover "
        "ends the holders gets in, is answered ok, and is ended",
        [Edit("sql:_try_guard_lock", """    SELECT (CASE WHEN pg_catalog.pg_try_advisory_lock_shared(pgfence._guard_lock_class(),
                                                             OPERATOR(pg_catalog.-) p_lock_key)
                 THEN CASE WHEN pg_catalog.pg_advisory_unlock_shared(pgfence._guard_lock_class(),
                                                                     OPERATOR(pg_catalog.-) p_lock_key)
                           THEN pg_catalog.pg_try_advisory_xact_lock_shared(pgfence._guard_lock_class(), p_lock_key) END
                 ELSE false END) IS TRUE""",
              "    SELECT pg_catalog.pg_try_advisory_xact_lock_shared(pgfence._guard_lock_class(), p_lock_key)")],
        [cargo_test("native", MOMENTS),
         cargo_test("guard", "a_write_arriving_while_a_takeover_holds_its_intent_lock_waits_on_either_path")],
    ),
    Mutation(
        "admit-trusts-the-remembered-key",
        "the fast path does not check that the lock it took is the lease's own (a remembered key is trusted)",
        [Edit("sql:_admits", "    SELECT l.lock_key = p_lock_key\n           AND ", "    SELECT ")],
        [cargo_test("guard", "a_forged_memory_skips_neither_the_guard_lock_nor_the_grant")],
    ),
    Mutation(
        "admit-ignores-grant",
        "the fast path admits a role without a grant on the cluster that presents a remembered key, epoch and secret",
        [Edit("sql:_admits", "\n           AND u.granted,", ",")],
        [cargo_test("guard", "a_forged_memory_skips_neither_the_guard_lock_nor_the_grant")],
    ),
    Mutation(
        "admit-ignores-secret",
        "the fast path admits a remembered tenure whatever secret is presented",
        [Edit("sql:_admits", "\n           AND pgfence._secret_verdict(s.epoch, s.hash, p_epoch, p_secret) = 'ok'", "")],
        [cargo_test("guard", "the_fast_path_admits_nothing_the_full_guard_refuses")],
    ),
    Mutation(
        "admit-ignores-expiry-and-timeline",
        "the fast path admits a remembered tenure that expired, or was granted before the last promotion",
        [Edit("sql:_admits", "pgfence._loss_reason(l, NULL::text, p_epoch, p_now, p_timeline) IS NULL",
              "pgfence._loss_reason(l, NULL::text, p_epoch, '-infinity'::timestamptz, 0::bigint) IS NULL")],
        [cargo_test("guard", "the_fast_path_admits_nothing_the_full_guard_refuses")],
    ),
    Mutation(
        "admit-any-isolation",
        "the fast path decides under REPEATABLE READ from a snapshot that may predate a takeover",
        [Edit("sql:_admit", " OR NOT pgfence._read_committed()", "")],
        [cargo_test("guard", "the_fast_path_admits_nothing_the_full_guard_refuses")],
    ),
    Mutation(
        "takeover-without-grace",
        "a takeover waits for guard holders without bound instead of ending them after the grace",
        [Edit("sql:_take_guard_lock",
              "PERFORM set_config('lock_timeout', greatest(grace_ms, 1) || 'ms', true);",
              "PERFORM set_config('lock_timeout', '10s', true);")],
        [cargo_test("takeover", "an_idle_guarded_transaction_delays_a_takeover_by_at_most_the_grace")],
    ),
    Mutation(
        "guard-any-isolation",
        "the guard decides under REPEATABLE READ from a snapshot that may predate a takeover",
        [Edit("sql:_guard",
              "IF NOT pgfence._read_committed() THEN",
              "IF false THEN")],
        [cargo_test("takeover", "guards_refuse_to_decide_outside_read_committed"), ISOLATION],
    ),
    Mutation(
        "superseded-off-by-one",
        "an epoch one below the current one is taken for current",
        [Edit("sql:_loss_reason", "WHEN p_epoch < l.epoch THEN 'superseded'",
              "WHEN p_epoch < l.epoch - 1 THEN 'superseded'")],
        [cargo_test("guard", "guarded_write_writes_under_the_current_fence_and_refuses_a_stale_one_with_audit"),
         cargo_test("race", "no_stale_write_commits_after_a_takeover_commits")],
    ),
    Mutation(
        "refusal-without-audit",
        "a refused write leaves no row in pgfence.rejections",
        [Edit("sql:_reject", "VALUES ('role', p_lease, p_epoch, p_reason, p_operation, p_table, p_key, p_lease, p_key, p_count)",
              "SELECT 'role', p_lease, p_epoch, p_reason, p_operation, p_table, p_key, p_lease, p_key, p_count WHERE false"),
         Edit("sql:_reject", "VALUES ('tenure', p_lease, p_epoch, p_current_epoch, p_current_holder, p_reason, op, p_table,\n"
              "                        p_key, p_lease, p_key, p_count, coalesce(free, pgfence._tenure_reason_slot(p_reason)))\n",
              "SELECT 'tenure', p_lease, p_epoch, p_current_epoch, p_current_holder, p_reason, op, p_table,\n"
              "                        p_key, p_lease, p_key, p_count, coalesce(free, pgfence._tenure_reason_slot(p_reason)) WHERE false\n")],
        [cargo_test("guard", "every_kind_of_stale_epoch_is_refused_with_its_reason"), cargo_test("race", "no_stale_write_commits_after_a_takeover_commits")],
    ),
    Mutation(
        "grant-not-checked",
        "every role may use every cluster (the per-cluster grant is not checked, nor row-level security)",
        [Edit("sql:_grant_of", "    SELECT pg_catalog.pg_has_role(session_user,", "    SELECT true OR pg_catalog.pg_has_role(session_user,")],
        [cargo_test("trust", "a_role_cannot_touch_or_read_another_clusters_leases")],
    ),
    Mutation(
        "secret-not-checked",
        "a fence with the current epoch and any secret writes, renews and releases (knowing the epoch suffices)",
        [Edit("sql:_secret_matches", "SELECT coalesce(p_secret IS NOT NULL", "SELECT true OR coalesce(p_secret IS NOT NULL")],
        [cargo_test("trust", "a_forged_fence_cannot_write_renew_or_release")],
    ),
    Mutation(
        "audit-shared-between-roles",
        "tenure refusals of every role are aggregated into one row (one role's refusals change another's count)",
        [Edit("sql:_reject", "INSERT INTO pgfence.rejections (scope, lease, presented_epoch, current_epoch,",
              "INSERT INTO pgfence.rejections (role, scope, lease, presented_epoch, current_epoch,"),
         Edit("sql:_reject", "VALUES ('tenure', p_lease", "VALUES ('shared', 'tenure', p_lease")],
        [cargo_test("trust", "audit_rows_are_per_role_and_bounded")],
    ),
    Mutation(
        "audit-place-not-an-arbiter",
        "a first refusal inserts its audit row with only the label's index as conflict arbiter (the place index is "
        "checked by waiting): two first refusals of one tenure deadlock",
        [Edit("sql:_reject", "                ON CONFLICT DO NOTHING;\n",
              "                ON CONFLICT (role, lease, presented_epoch, operation, reason) WHERE scope = 'tenure' DO NOTHING;\n")],
        [cargo_test("hardening", "concurrent_first_refusals_of_a_tenure_never_deadlock")],
    ),
    Mutation(
        "audit-rows-shared-between-reasons",
        "a tenure refusal is counted in the row of its (role, lease, epoch, operation) whatever its reason: a "
        "forgery of a tenure is counted as the stale write that came first, and vice versa",
        [Edit("sql:_reject", "AND o.presented_epoch = p_epoch AND o.operation = op AND o.reason = p_reason) o",
              "AND o.presented_epoch = p_epoch AND o.operation = op) o")],
        [cargo_test("hardening", "the_audit_counts_each_reason_apart_under_concurrent_refusals")],
    ),
    Mutation(
        "audit-other-place-shared-between-reasons",
        "every reason's overflow row ('other') takes the same place, so only the first reason to overflow a "
        "tenure's 16 places can be counted (the others find no place)",
        [Edit("sql:_reject", "coalesce(free, pgfence._tenure_reason_slot(p_reason))", "coalesce(free, 16)")],
        [cargo_test("hardening", "the_audit_counts_each_reason_apart_under_concurrent_refusals")],
    ),
    Mutation(
        "bogus-refusals-per-lease",
        "refusals no tenure explains (unknown lease, no grant) get a row per lease: a flood of bogus names grows the table",
        [Edit("sql:_reject", "by_role  boolean := p_by_role OR p_reason IN ('no_grant', 'unknown_lease', 'future_epoch');",
              "by_role  boolean := false;"),
         Edit("sql:_reject", "    IF NOT by_role\n       AND NOT EXISTS (SELECT 1 FROM pgfence.tenures t",
              "    IF false\n       AND NOT EXISTS (SELECT 1 FROM pgfence.tenures t")],
        [cargo_test("trust", "audit_rows_are_per_role_and_bounded"),
         cargo_test("hardening", "every_audited_function_keeps_refusals_no_tenure_explains_in_role_rows")],
    ),
    Mutation(
        "validation-without-nfc",
        "the SQL text check accepts text not in Unicode NFC, which the Rust API refuses",
        [Edit("sql:_text_problem", "WHEN NOT p_value IS NFC NORMALIZED THEN", "WHEN false THEN")],
        [cargo_test("trust", "sql_and_rust_validation_agree")],
    ),
    Mutation(
        "validation-ignores-unicode-age",
        "the Rust text check judges NFC by its own Unicode tables throughout, refusing names that an older "
        "database stores",
        [Edit("src/validate.rs", "!value.split(is_unsettled).all(unicode_normalization::is_nfc)",
              "!unicode_normalization::is_nfc(value)")],
        [cargo_test("trust", "sql_and_rust_validation_agree")],
    ),
    Mutation(
        "argument-shortcut-too-wide",
        "the cheap argument tests of the write path pass arguments the full checks refuse (too long, epoch 0)",
        [Edit("sql:_plain_arg", "(p_value ~ '^[ -~]+$' AND octet_length(p_value) <= p_max)", "true"),
         Edit("sql:_plain_labels", "    SELECT pg_catalog.octet_length(p_operation) OPERATOR(pg_catalog.>=) 1",
              "    SELECT true OR pg_catalog.octet_length(p_operation) OPERATOR(pg_catalog.>=) 1"),
         Edit("sql:_plain_lease_args", " AND p_epoch >= 1", "")],
        [cargo_test("trust", "audit_rows_are_per_role_and_bounded"),
         cargo_test("hostile", "sql_functions_refuse_hostile_arguments_cleanly")],
    ),
    Mutation(
        "enforcement-lets-any-role-write",
        "with enforcement on, a role given table privileges may TRUNCATE (and write) pgfence's own tables",
        [Edit("sql:_owner_writes_only", "    IF NOT pg_has_role(current_user,", "    IF false AND NOT pg_has_role(current_user,")],
        [cargo_test("trust", "no_role_but_the_owner_writes_pgfence_tables")],
    ),
    Mutation(
        "foreign-trigger-kept",
        "a trigger a role with table privileges created on a pgfence table survives grants (it runs as the owner)",
        [Edit("sql:_harden", "EXECUTE format('DROP TRIGGER %I ON pgfence.%I', r.tgname, r.relname);", "NULL;")],
        [cargo_test("trust", "no_role_but_the_owner_writes_pgfence_tables")],
    ),
    Mutation(
        "holder-name-takes-over",
        "another role acquiring with a live tenure's holder name starts a new tenure (a forced takeover)",
        [Edit("sql:_held_by_other", "(l.holder IS DISTINCT FROM p_holder OR l.holder_role IS DISTINCT FROM session_user)",
              "l.holder IS DISTINCT FROM p_holder")],
        [cargo_test("trust", "another_role_using_a_holder_name_does_not_take_over")],
    ),
    Mutation(
        "raw-write-ignores-grant",
        "the raw-SQL enforcement judges writes to a cluster the role has no grant on (and reads its lease)",
        [Edit("sql:_enforce_epoch", "IF NOT pgfence._may_use(pgfence._cluster_of(target)) THEN", "IF false THEN")],
        [cargo_test("trust", "no_role_but_the_owner_writes_pgfence_tables")],
    ),
    Mutation(
        "refusal-without-backpressure",
        "a stale writer retrying in a tight loop is answered at once (no 10 ms wait on repeats)",
        [Edit("sql:_reject", "        PERFORM pg_sleep(0.01);\n", "")],
        [cargo_test("privileges", "a_repeated_stale_write_is_answered_after_a_wait_in_the_server"),
         cargo_test("privileges", "a_hammering_stale_writer_is_held_back_and_the_leader_keeps_its_throughput")],
    ),
    Mutation(
        "row-fence-removed",
        "task writes no longer check the row's own fence (tasks.fence <= epoch)",
        [Edit("sql:claim_task", " AND fence <= p_epoch", ""),
         Edit("sql:transition_task", " AND fence <= p_epoch", ""),
         Edit("sql:append_event", " AND fence <= p_epoch", "")],
        [cargo_test("guard", "a_row_fence_above_the_presented_epoch_refuses_the_write")],
    ),
    Mutation(
        "task-writes-unguarded",
        "the opening every task write shares checks the arguments but not the fence",
        [Edit("sql:_open_task_write",
              "    RETURN pgfence._guard(p_lease, p_epoch, p_secret, p_operation, p_table, p_key);",
              "    RETURN NULL;")],
        [cargo_test("guard", "stale_write_after_takeover_is_rejected_and_audited"), cargo_test("race", "no_stale_write_commits_after_a_takeover_commits")],
    ),
    Mutation(
        "renew-ignores-expiry",
        "a renewal extends a tenure whose ttl already ran out by the database clock",
        [Edit("sql:renew", "why := pgfence._loss_reason(l, NULL::text, p_epoch, ts, tl);",
              "why := pgfence._loss_reason(l, NULL::text, p_epoch, '-infinity'::timestamptz, tl);")],
        [cargo_test("lease", "expired_lease_can_be_taken_over_and_its_renewal_is_lost")],
    ),
    Mutation(
        "release-frees-successor",
        "releasing a superseded epoch ends the successor's tenure",
        [Edit("sql:release", "why NOT IN ('expired', 'failover')", "why NOT IN ('expired', 'failover', 'superseded')",
              count=2)],
        [cargo_test("lease", "release_is_immediate_idempotent_and_never_frees_a_successor")],
    ),
    Mutation(
        "failover-boundary-removed",
        "a tenure granted before a promotion stays current after it",
        [Edit("sql:_loss_reason", "        WHEN l.timeline < p_timeline THEN 'failover'\n", "")],
        [cargo_test("standby", "a_failover_is_a_fencing_boundary")],
    ),
    Mutation(
        "abandoned-statement-not-cancelled",
        "a statement abandoned mid-flight (a dropped future) is not cancelled on the server and completes later",
        [Edit("src/connect/cancel.rs", """        let cancelled = match host {
            Some(host) => host.cancel(&token).await,
            None => cancel_unknown(&token).await,
        };""", """        let _ = (&host, &token);
        let cancelled: Result<()> = Ok(());""")],
        [cargo_test("guard", "an_abandoned_acquire_is_cancelled_on_the_server")],
    ),
    Mutation(
        "checkout-without-turns",
        "checkouts are handed out by bb8 alone, not first come, first served: a task that gives its connection "
        "back and asks again at once keeps a waiting task out until its checkout times out",
        [Edit("src/store/mod.rs", "turns: Some(tokio::sync::Semaphore::new(config.pool_size as usize)),",
              "turns: None,")],
        [cargo_test("store", "checkouts_are_served_in_the_order_they_were_asked_for")],
    ),
    Mutation(
        "acquisitions-queue-at-the-pool",
        "the leadership runtime's acquisitions take no turn: a replica's names campaigning at once queue at the "
        "pool, whose checkout timeout fails the back of the queue, and those wait out a poll period",
        [Edit("src/leader/pg/mod.rs", """        match self.inner.turns.clone().acquire_owned().await {
            Ok(permit) => AcquisitionTurn::of(permit),
            // Never closed; were it, the pool's own turns still bound the checkouts.
            Err(_) => AcquisitionTurn::unbounded(),
        }""", """        let _ = (&self.inner.turns, AcquisitionTurn::of);
        AcquisitionTurn::unbounded()""")],
        [cargo_test("spread", "a_replicas_names_campaigning_at_once_queue_for_a_turn_not_at_the_pool")],
    ),
    Mutation(
        "pooled-cancel-at-the-first-host",
        "a pooled statement's cancel request goes to the first host of a multi-host connection string, not to the "
        "host the pool's connections reached: a statement abandoned there keeps waiting",
        [Edit("src/connect/identity.rs", ".unwrap_or_else(|| self.connector.clone())",
              ".map_or_else(|| self.connector.clone(), |_| self.connector.clone())")],
        [cargo_test("multihost", "an_abandoned_pooled_statement_is_cancelled_on_the_host_it_runs_on")],
    ),
    Mutation(
        "renewal-cancel-at-the-first-host",
        "the renewal connection's cancel request goes to the first host of a multi-host connection string, not to "
        "the host it reached: a late renewal keeps waiting behind the loss already declared",
        [Edit("src/store/mod.rs", "Ok((conn, host))", "Ok((conn, settings.connector.clone()))")],
        [cargo_test("multihost", "a_late_renewal_is_cancelled_on_the_host_it_runs_on")],
    ),
    Mutation(
        "deadline-from-receive-time",
        "the local deadline counts the ttl from when the reply arrived, not from when the statement was sent",
        [Edit("src/lease/calls.rs", "local_deadline: sent + ttl,", "local_deadline: Instant::now() + ttl,"),
         Edit("src/lease/calls.rs", "lease.local_deadline = sent + lease.ttl;",
              "lease.local_deadline = Instant::now() + lease.ttl;"),
         Edit("src/leader/pg/renew.rs", "None => member.renewed(sent),", "None => member.renewed(Instant::now()),")],
        [cargo_test("lease", "an_acquisitions_local_deadline_is_never_later_than_the_database_expiry",
                    "renew_extends_a_live_tenure")],
    ),
    Mutation(
        "deadline-without-margin",
        "a holder believes it leads until send time + ttl, without the safety margin",
        [Edit("src/leader/held.rs", "*self.deadline.lock().unwrap_or_else(|p| p.into_inner()) - self.margin",
              "*self.deadline.lock().unwrap_or_else(|p| p.into_inner())")],
        [cargo_test("leader", "the_holder_stops_trusting_a_margin_before_the_database_could_grant_a_successor",
                    "unreachable_database_makes_the_holder_give_up_at_its_local_deadline")],
    ),
    Mutation(
        "guarded-write-acknowledged-before-commit",
        "a one-statement guarded write (and every task write) is acknowledged at its first row, before the implicit "
        "commit that follows it",
        [Edit("src/store/statement.rs", """        let rows: std::result::Result<Vec<U>, diesel::result::Error> =
            query().load(&mut *conn).await;""", """        let rows: std::result::Result<Vec<U>, diesel::result::Error> =
            query().get_result(&mut *conn).await.map(|r| vec![r]);""")],
        [cargo_test("guard", "a_guarded_write_whose_commit_fails_is_an_error_not_an_acknowledgement"),
         cargo_test("faults", "a_write_is_acknowledged_only_once_committed")],
    ),
    Mutation(
        "guarded-write-without-its-safety-net",
        "a one-statement guarded write whose statement is not gated commits its rows although the guard refused",
        [Edit("src/fence/write.rs", "CASE WHEN g.passed OR w.n = 0 THEN w.n ELSE pgfence.ungated_write(g.outcome, w.n) END",
              "w.n")],
        [cargo_test("guard", "an_ungated_statement_never_commits_under_a_refused_fence")],
    ),
    Mutation(
        "fenced-guard-outside-its-transaction",
        "the fenced transaction's guard runs before (outside) the transaction it guards, so its guard lock is "
        "released before the caller's writes",
        [Edit("src/fence/guard.rs", 'batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")', 'batch_execute("SELECT 1")')],
        [cargo_test("guard", "guarded_statements_are_prepared_once_and_fenced_guards_run_inside_their_transaction"),
         cargo_test("race", "no_stale_write_commits_after_a_takeover_commits")],
    ),
    Mutation(
        "sqlstate-not-read-off-the-wire",
        "an error's SQLSTATE comes only from diesel's coarse kind, so a server speaking another language loses "
        "deadlock, lock-timeout, privilege and pgfence codes",
        [Edit("src/error.rs", "sqlstate_of(info.message(), info.details(), info.hint()).or_else(|| kind_sqlstate(kind))",
              "kind_sqlstate(kind)")],
        [cargo_test("sqlstate", "a_german_server_error_keeps_its_sqlstate")],
    ),
    Mutation(
        "guard-without-write-marks",
        "pgfence.fence admits writes without marking them, so a tenure's last accepted write is lost to the review",
        [Edit("sql:_mark",
              """    INSERT INTO pgfence.write_marks AS m (lease, epoch, backend, last_at)
    VALUES (p_lease, p_epoch, pg_catalog.pg_backend_pid(), clock_timestamp())
    ON CONFLICT (lease, epoch, backend) DO UPDATE SET last_at = greatest(m.last_at, EXCLUDED.last_at);
""", "")],
        [cargo_test("overlap", "every_guarded_write_kind_records_its_last_accepted_write")],
    ),
    Mutation(
        "task-write-marked-before-it-writes",
        "a task write is marked when its guard admits it, before the write: one that then answers not_found or "
        "conflict (or a create_task retry) leaves a mark naming a call that wrote nothing",
        [Edit("sql:_open_task_write", "DECLARE\n    problem text;\nBEGIN",
              "DECLARE\n    problem text;\n    r pgfence.write_result;\nBEGIN"),
         Edit("sql:_open_task_write",
              "    RETURN pgfence._guard(p_lease, p_epoch, p_secret, p_operation, p_table, p_key);",
              """    r := pgfence._guard(p_lease, p_epoch, p_secret, p_operation, p_table, p_key);
    IF r.outcome IS NULL THEN
        INSERT INTO pgfence.write_marks AS m (lease, epoch, backend, last_at)
        VALUES (p_lease, p_epoch, pg_catalog.pg_backend_pid(), clock_timestamp())
        ON CONFLICT (lease, epoch, backend) DO UPDATE SET last_at = greatest(m.last_at, EXCLUDED.last_at);
    END IF;
    RETURN r;""")],
        [cargo_test("overlap", "a_task_write_that_writes_nothing_leaves_no_mark")],
    ),
    Mutation(
        "belief-report-without-secret",
        "a belief report is recorded without checking the tenure's secret, so anyone granted may rewrite what a "
        "holder believed",
        [Edit("sql:report_belief",
              "IF NOT pgfence._secret_matches(b.report_hash, p_secret) THEN",
              "IF false THEN")],
        [cargo_test("overlap", "belief_reports_are_authenticated_and_the_first_of_each_kind_stands")],
    ),
    Mutation(
        "renew-locks-before-the-check",
        "a renewal locks the lease row before it judges the presented tenure and secret, so a role without the "
        "secret that leaves its forged renewal open holds the holder's renewals and takeovers off",
        [Edit("sql:renew", "    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;\n    secret := ",
              "    l := pgfence._lock_lease_row(p_lease);\n    secret := ")],
        [cargo_test("hardening", "a_forged_call_left_open_delays_neither_the_holder_nor_a_takeover")],
    ),
    Mutation(
        "renew-many-locks-before-the-check",
        "a batched renewal locks every lease row it names before it judges the entries, so a forged entry left open "
        "holds the holder's renewals off",
        [Edit("sql:renew_many", "    -- Clusters the role has no grant on: their leases are refused.\n",
              "    PERFORM 1 FROM pgfence.leases l WHERE l.name = ANY (p_leases) ORDER BY l.name FOR NO KEY UPDATE OF l;\n")],
        [cargo_test("hardening", "a_forged_call_left_open_delays_neither_the_holder_nor_a_takeover")],
    ),
    Mutation(
        "acquire-many-ignores-grant",
        "a batched acquisition acquires the leases of a cluster the role has no grant on",
        [Edit("sql:acquire_many",
              "WHERE (pgfence._deny_lease_call(d.first, 0::bigint, 'acquire'::text)).outcome IS NOT NULL);",
              "WHERE false);")],
        [cargo_test("acquire_many", "a_batch_refuses_the_leases_of_a_cluster_without_a_grant_and_audits_once")],
    ),
    Mutation(
        "acquire-many-ignores-guard",
        "a batched acquisition takes a lease without its guard lock, under a guarded transaction of the ended tenure "
        "still past its check",
        [Edit("sql:_acquire_checked",
              """    ELSIF NOT (pg_catalog.pg_try_advisory_xact_lock(pgfence._guard_lock_class(), -l.lock_key)
               AND pg_catalog.pg_try_advisory_xact_lock(pgfence._guard_lock_class(), l.lock_key)) THEN""",
              """    ELSIF false THEN""")],
        [cargo_test("acquire_many", "a_batch_answers_busy_for_a_lease_whose_guard_an_old_writer_holds")],
    ),
    Mutation(
        "acquire-many-counts-no-doubt",
        "a batched acquisition answers that nothing is in doubt, so the runtime hands a new tenure's callback none "
        "of the effects its predecessors left in doubt",
        [Edit("sql:acquire_many", "THEN (SELECT count(*)::integer FROM pgfence.in_doubt_effects(n)) ELSE 0 END", "THEN 0 ELSE 0 END")],
        [cargo_test("effects", "a_new_tenure_s_callback_is_handed_the_effects_in_doubt")],
    ),
    Mutation(
        "belief-report-locks-before-the-check",
        "a belief report locks its belief row before it checks the secret, so a forged report left open holds the "
        "holder's own reports off",
        [Edit("sql:report_belief",
              "    SELECT * INTO b FROM pgfence.beliefs WHERE lease = p_lease AND epoch = p_epoch;\n    IF NOT FOUND THEN",
              "    SELECT * INTO b FROM pgfence.beliefs WHERE lease = p_lease AND epoch = p_epoch FOR NO KEY UPDATE;\n"
              "    IF NOT FOUND THEN")],
        [cargo_test("hardening", "a_forged_call_left_open_delays_neither_the_holder_nor_a_takeover")],
    ),
    Mutation(
        "harden-without-repair",
        "_harden only prevents: it revokes no privilege it did not grant (DML, grant options, what was passed on)",
        [Edit("sql:_harden", "    FOR pass IN 1..2 LOOP", "    FOR pass IN 1..0 LOOP")],
        [cargo_test("hardening", "harden_repairs_a_careless_grant_all")],
    ),
    Mutation(
        "untyped-null-in-guard-reject",
        "_guard passes untyped NULLs to _reject again, so an overload with text where _reject has bigint, planted "
        "during a careless schema grant, runs as the owner in every refused write",
        [Edit("sql:_guard", "NULL::bigint, NULL::text, 'no_grant'::text", "NULL, NULL, 'no_grant'")],
        [cargo_test("hardening", "functions_planted_during_a_careless_schema_grant_never_run_and_are_dropped")],
    ),
    Mutation(
        "harden-keeps-foreign-functions",
        "_harden drops no function of another role in the schema, so a planted overload survives the repair",
        [Edit("sql:_harden", "                  WHERE o.owner <> owner_oid\n",
              "                  WHERE o.owner <> owner_oid AND o.catalog <> 'pg_proc'::regclass\n")],
        [cargo_test("hardening", "functions_planted_during_a_careless_schema_grant_never_run_and_are_dropped")],
    ),
    Mutation(
        "audit-bent-by-owner-code",
        "the audit accepts any change from any session, so a trigger run as the owner inside a refused role's call "
        "zeroes its counts",
        [Edit("sql:_own_rejections_only", "    IF bent THEN", "    IF false THEN")],
        [cargo_test("hardening", "harden_repairs_a_careless_grant_all")],
    ),
    Mutation(
        "grants-from-untrusted-sessions",
        "grant rows are accepted from any session, so a trigger run as the owner grants its author every cluster",
        [Edit("sql:_trusted_writes_only", "    IF pgfence._trusted(session_user) THEN",
              "    IF true THEN")],
        [cargo_test("hardening", "harden_repairs_a_careless_grant_all")],
    ),
    Mutation(
        "old-argument-list-resolves",
        "create_task's payload has a default again, so the old call create_task(lease, epoch, key, payload) "
        "resolves with the key as the secret and is audited as a forgery instead of failing",
        [Edit("sql:create_task", "p_key text, p_payload jsonb)", "p_key text, p_payload jsonb DEFAULT '{}')")],
        [cargo_test("regress", "the_sql_surface_answers_as_recorded")],
    ),
    Mutation(
        "null-secret-element-audited",
        "a NULL element of renew_many's secrets is judged (an audited bad_secret) instead of refused as bad input",
        [Edit("sql:renew_many", "    IF array_position(p_secrets, NULL) IS NOT NULL THEN", "    IF false THEN")],
        [cargo_test("regress", "the_sql_surface_answers_as_recorded")],
    ),
    Mutation(
        "review-certain-at-the-latest-placement",
        "the review calls an overlap certain when only the latest placement of the belief's end is after the "
        "successor's acquisition (the clock bounds ignored)",
        [Edit("src/history/review.rs", "if end.earliest.is_some_and(|e| e > next.acquired_at)",
              "if end.latest > next.acquired_at")],
        [cargo_unit_test("history::review::tests::beliefs_are_placed_on_the_database_time_line_through_the_offset_bounds"),
         cargo_test("overlap", "a_frozen_leader_s_overlap_is_reported_with_no_accepted_write_and_its_refusals")],
    ),
    Mutation(
        "review-ignores-refusals",
        "the review does not count the audit's refusals after the successor's acquisition as proof of an overlap",
        [Edit("src/history/review.rs", "&& r.last_rejected_at >= next.acquired_at", "&& r.last_rejected_at < next.acquired_at")],
        [cargo_test("overlap", "a_frozen_leader_s_overlap_is_reported_with_no_accepted_write_and_its_refusals"),
         cargo_unit_test("history::")],
    ),
    Mutation(
        "member-name-counted-twice",
        "a join under the name of a live member replaces it (two processes using one member name both count, "
        "each in turn, and the first is displaced while live)",
        [Edit("sql:join_group", """    IF FOUND AND prior.left_at IS NULL AND prior.expires_at > clock_timestamp() THEN""", """    IF false THEN"""),
         Edit("sql:join_group", """         WHERE x.left_at IS NOT NULL OR x.expires_at <= ts
""", "")],
        [cargo_test("membership", "the_same_member_name_from_two_processes_never_counts_twice")],
    ),
    Mutation(
        "heartbeat-ignores-secret",
        "a heartbeat or leave presenting the member's name and incarnation with any secret is accepted",
        [Edit("sql:_member_loss", """        WHEN NOT pgfence._secret_matches(m.secret_hash, p_secret) THEN 'bad_secret'
""", "")],
        [cargo_test("membership", "a_forged_heartbeat_is_refused_audited_and_holds_no_lock")],
    ),
    Mutation(
        "flap-settles-at-once",
        "no hysteresis: a member whose last incarnation expired is settled (may acquire) at its first heartbeat, "
        "as one that left in order is",
        [Edit("sql:_settle_delay", "    SELECT CASE WHEN p_flaps = 0 THEN interval '0'",
              "    SELECT CASE WHEN true THEN interval '0'")],
        [cargo_test("membership", "a_member_that_expired_settles_one_ttl_after_it_joins_again")],
    ),
    Mutation(
        "assignment-counts-gone-members",
        "the next assignment counts members that left or expired (their names are never reassigned)",
        [Edit("sql:rebalance_inputs", """     WHERE m.grp = p_group AND m.left_at IS NULL AND m.expires_at > clock_timestamp()""",
              """     WHERE m.grp = p_group""")],
        [cargo_test("membership", "a_member_joins_settles_the_group_is_assigned_once_and_a_leave_is_due_at_once")],
    ),
    Mutation(
        "assignment-without-generation-check",
        "a member stores an assignment computed from an older one (two claimants, one whose claim lapsed, "
        "overwrite each other's moves)",
        [Edit("sql:assign_group", """    IF g.generation <> p_generation OR p_version > g.version THEN""",
              """    IF p_version > g.version THEN""")],
        [cargo_test("membership", "a_member_joins_settles_the_group_is_assigned_once_and_a_leave_is_due_at_once")],
    ),
    Mutation(
        "changed-says-now",
        "a group's change tells its members the rebalance may be claimed now, whatever the quiet time: every "
        "join of a rolling start wakes every member to ask for the claim at once",
        [Edit("sql:_group_changed", """'changed ' || coalesce(pgfence._rebalance_in_ms(gr), 0)""",
              """'changed 0'""")],
        [cargo_test("membership", "a_groups_change_says_when_its_rebalance_may_be_claimed")],
    ),
    Mutation(
        "assignment-ignores-members-back",
        "a store computed while a counted member was away is stored after it joined again (its names move away, "
        "and the next assignment moves them back)",
        [Edit("sql:assign_group", """       AND m.member <> ALL (p_counted)""",
              """       AND false""")],
        [cargo_test("membership", "a_computation_that_left_out_a_member_that_is_back_is_refused_and_writes_nothing")],
    ),
    Mutation(
        "assignment-not-sticky",
        "the assignment ignores who holds each name (a plain greedy by score): a join moves more than the "
        "minimum, and names move between members that stay",
        [Edit("src/leader/assign/mod.rs", "        for (m, names) in held.iter_mut().enumerate() {",
              "        for (m, names) in held.iter_mut().enumerate().filter(|_| false) {")],
        [cargo_unit_test("leader::assign::tests::four_members_less_one_keep_their_names_and_get_ten_each"),
         cargo_test("spread", "three_replicas_lead_four_each_and_a_fourth_takes_exactly_three")],
    ),
    # The native guard (native/pgfence_native.c): each suite runs with the mutated extension in every test database.
    # The differential test (the verdict's truth table through both guards) comes first for every mutation that
    # changes what one call leaves the caller; the others (a takeover in flight, a snapshot older than the lock, a
    # schema created anew) need their own scenario.
    Mutation(
        "native-without-lock",
        "the native fast path reads the lease without taking its guard lock, so a takeover does not wait for the "
        "writes it admits",
        [Edit("native/pgfence_native.c", "|| !try_guard_lock(r->lock_key))", "|| (false && !try_guard_lock(r->lock_key)))")],
        [cargo_test("native", DIFFERENTIAL), cargo_test("native", "a_native_admission_holds_the_guard_lock_to_its_commit_and_marks_the_write"), cargo_test("race", "no_stale_write_commits_after_a_takeover_commits")],
    ),
    Mutation(
        "native-without-intent-probe",
        "the native fast path takes the guard lock without probing the intent lock: a write arriving while a "
        "takeover ends the holders gets in",
        [Edit("native/pgfence_native.c", """\tif (holders > 0)
\t\treturn false;
""", "")],
        [cargo_test("native", MOMENTS),
         cargo_test("guard", "a_write_arriving_while_a_takeover_holds_its_intent_lock_waits_on_either_path")],
    ),
    Mutation(
        "native-reads-at-statement-start",
        "the native fast path reads the lease on the statement's snapshot (taken before its lock) instead of one "
        "taken after it",
        [Edit("native/pgfence_native.c", """\tsnap = RegisterSnapshot(GetLatestSnapshot());
\tfound = read_lease(c, lease, snap, &row);
\tnow = GetCurrentTimestamp();""", """\tsnap = RegisterSnapshot(GetActiveSnapshot());
\tfound = read_lease(c, lease, snap, &row);
\tnow = GetCurrentTimestamp();""")],
        [cargo_test("native", MOMENTS), cargo_test("native", "a_guard_reads_after_its_lock_not_at_its_statement_s_start")],
    ),
    Mutation(
        "native-ignores-secret",
        "the native fast path admits a remembered tenure whatever secret is presented",
        [Edit("native/pgfence_native.c", "\tif (!same_secret(r, secret))", "\tif (false && !same_secret(r, secret))")],
        [cargo_test("native", DIFFERENTIAL), cargo_test("native", "the_native_guard_answers_every_call_as_the_portable_guard")],
    ),
    Mutation(
        "native-remembers-refusals",
        "the native guard remembers the secret of any call the portable guard answered, refused ones included",
        [Edit("native/pgfence_native.c", """\t\tif (o != NULL && VARSIZE_ANY_EXHDR(o) == 2 && memcmp(VARDATA_ANY(o), "ok", 2) == 0)""",
              """\t\tif (o != NULL)""")],
        [cargo_test("native", DIFFERENTIAL), cargo_test("native", "the_native_guard_answers_every_call_as_the_portable_guard")],
    ),
    Mutation(
        "native-ignores-grant",
        "the native fast path does not read the grant again: a role that lost it, or a session that became "
        "another login role, is admitted from the memory",
        [Edit("native/pgfence_native.c", "\t\t&& granted(c, owner, lease_name, snap);",
              "\t\t&& (granted(c, owner, lease_name, snap) || true);")],
        [cargo_test("native", DIFFERENTIAL), cargo_test("native", "the_native_memory_admits_no_role_the_grant_does_not")],
    ),
    Mutation(
        "native-ignores-execute-privilege",
        "the native fast path admits a current role that may not execute pgfence.fence",
        [Edit("native/pgfence_native.c", "\n\t\t|| pg_proc_aclcheck(c->fence, GetUserId(), ACL_EXECUTE) != ACLCHECK_OK)", ")")],
        [cargo_test("native", DIFFERENTIAL), cargo_test("native", "the_native_memory_admits_no_role_the_grant_does_not")],
    ),
    Mutation(
        "native-ignores-expiry",
        "the native fast path admits a remembered tenure after its expiry",
        [Edit("native/pgfence_native.c", " && row.expires_at > now", "")],
        [cargo_test("native", DIFFERENTIAL), cargo_test("native", "the_native_guard_answers_every_call_as_the_portable_guard")],
    ),
    Mutation(
        "native-ignores-timeline",
        "the native fast path admits a tenure granted before the current timeline (a promotion)",
        [Edit("native/pgfence_native.c", " && row.timeline >= (int64) GetWALInsertionTimeLine()", "")],
        [cargo_test("native", DIFFERENTIAL), cargo_test("native", "the_native_guard_answers_every_call_as_the_portable_guard")],
    ),
    Mutation(
        "native-any-isolation",
        "the native fast path admits under REPEATABLE READ (a snapshot that may predate a takeover)",
        [Edit("native/pgfence_native.c", " || XactIsoLevel != XACT_READ_COMMITTED", "")],
        [cargo_test("native", DIFFERENTIAL), cargo_test("native", "the_native_guard_answers_every_call_as_the_portable_guard")],
    ),
    Mutation(
        "native-skips-the-write-mark",
        "the native fast path admits without recording the write mark that is due (the overlap review loses the "
        "tenure's last accepted writes)",
        [Edit("native/pgfence_native.c", "\t\twrite_mark(owner, lease, epoch, mark);", "\t\t(void) write_mark;")],
        [cargo_test("native", DIFFERENTIAL), cargo_test("native", "a_native_admission_holds_the_guard_lock_to_its_commit_and_marks_the_write")],
    ),
    Mutation(
        "native-trusts-a-recreated-schema",
        "the native memory names a tenure by lease, epoch and lock key only: after the schema is dropped and "
        "created again, an old secret is admitted for the new tenure that reuses them",
        [Edit("native/pgfence_native.c", "c == NULL || c->leases != r->leases_relid", "c == NULL"),
         Edit("native/pgfence_native.c", "\t\t&& !row.acquired_null && row.acquired_at == r->acquired_at", "\t\t&& !row.acquired_null")],
        [cargo_test("native", MOMENTS), cargo_test("native", "a_recreated_schema_does_not_revive_a_remembered_tenure")],
    ),
    # The effect ledger (issue: in-doubt work). Each is caught by the rescue story over real worker processes,
    # whose faults are placed exactly (a worker paused at a named point, then frozen): deterministic.
    Mutation(
        "settle-without-fence",
        "settle_effect skips the guard: a successor whose tenure ended settles an effect its own successor is "
        "about to settle",
        [Edit("sql:settle_effect",
              """    r := pgfence._open_effect_write(p_lease, p_epoch, p_secret, p_effect_key, 'settle_effect'::text, NULL::text,
                                    NULL::text, NULL::integer, p_detail);""",
              """    r := NULL;""")],
        [cargo_test("effects", "an_ended_tenure_cannot_settle_and_is_audited"), RESCUE_STORY],
    ),
    Mutation(
        "live-epoch-ignores-the-timeline",
        "the ledger's readers judge a tenure live without the timeline (as the Rust read of the ledger once did): "
        "after a promotion, an attempt of a tenure granted before it is shown as not in doubt",
        [Edit("sql:_live_epoch", "clock_timestamp(), pgfence._timeline())", "clock_timestamp(), l.timeline)")],
        [cargo_test("faults", "an_open_attempt_of_a_tenure_before_a_promotion_is_in_doubt_in_every_reader")],
    ),
    Mutation(
        "in-doubt-omits-the-last-intent",
        "the in-doubt list leaves out each ended tenure's last intent (the one most likely in flight when it ended)",
        [Edit("sql:in_doubt_effects",
              """     WHERE e.lease = p_lease AND e.settlement IS NULL""",
              """     WHERE e.lease = p_lease AND e.settlement IS NULL
       AND e.id < (SELECT max(x.id) FROM pgfence.effects x WHERE x.lease = e.lease AND x.epoch = e.epoch)""")],
        [cargo_test("effects", "a_successor_finds_the_ended_tenures_intent_in_doubt_and_settles_it_once"), RESCUE_STORY],
    ),
    # A tenure racing itself (issue #43): each ledger write, claim and transition decides on what it reads after
    # the task's row lock. Caught by tests/ledger_races.rs, whose interleavings are forced (the first call's
    # transaction held open until the second is seen waiting in pg_locks): deterministic.
    Mutation(
        "outcome-decides-before-the-task-lock",
        "record_outcome reads the attempt without the task's row lock: a repeat racing the first call reads it "
        "open and answers conflict/outcome_recorded ('done'), or writes a second 'unknown'",
        [Edit("sql:record_outcome",
              """        PERFORM pgfence._lock_task(p_lease, task_key, 'record_outcome'::text);""",
              """        NULL;""")],
        [cargo_test("ledger_races", "the_three_self_races_of_the_ledger_answer_as_in_sequence")],
    ),
    Mutation(
        "settle-decides-on-the-read-before-the-lock",
        "settle_effect takes the task's row lock but decides on the attempt it read before it: a second settle "
        "after a 'retried' answers 'settled' instead of finding the retry in flight",
        [Edit("sql:settle_effect",
              """    PERFORM pgfence._lock_task(p_lease, task_key, 'settle_effect'::text);
    SELECT * INTO e FROM pgfence._last_attempt(p_lease, p_effect_key);
""",
              """    PERFORM pgfence._lock_task(p_lease, task_key, 'settle_effect'::text);
""")],
        [cargo_test("ledger_races", "every_pair_of_ledger_writes_on_one_attempt_answers_as_in_sequence")],
    ),
    Mutation(
        "settle-rechecks-only-the-settlement",
        "settle_effect without the task's row lock, its UPDATE re-checking the settlement but not the outcome: a "
        "settle racing its own tenure's 'done' settles a done attempt and opens a retry of it",
        [Edit("sql:settle_effect",
              """    PERFORM pgfence._lock_task(p_lease, task_key, 'settle_effect'::text);
    SELECT * INTO e FROM pgfence._last_attempt(p_lease, p_effect_key);
""", ""),
         Edit("sql:settle_effect",
              """     WHERE id = attempt_id AND settlement IS NULL AND (outcome IS NULL OR outcome = 'unknown')""",
              """     WHERE id = attempt_id AND settlement IS NULL""")],
        [cargo_test("ledger_races", "the_three_self_races_of_the_ledger_answer_as_in_sequence")],
    ),
    Mutation(
        "intent-decides-before-the-task-lock",
        "record_intent reads the key's last attempt without the task's row lock: an intent racing its tenure's "
        "'failed' is answered as a retry of the failed attempt instead of opening the next one",
        [Edit("sql:record_intent",
              """    PERFORM pgfence._lock_task(p_lease, p_task_key, 'record_intent'::text);\n""", "")],
        [cargo_test("ledger_races", "every_pair_of_ledger_writes_on_one_attempt_answers_as_in_sequence")],
    ),
    Mutation(
        "tasks-move-before-the-task-lock",
        "claim_task and transition_task read the task's effects in doubt without the task's row lock: a claim "
        "racing its tenure's 'unknown' outcome moves the task",
        [Edit("sql:claim_task", """    PERFORM pgfence._lock_task(p_lease, p_key, 'claim_task'::text);\n""", ""),
         Edit("sql:transition_task", """    PERFORM pgfence._lock_task(p_lease, p_key, 'transition_task'::text);\n""", "")],
        [cargo_test("ledger_races", "a_task_write_racing_itself_answers_as_in_sequence")],
    ),
    Mutation(
        "retry-mints-a-new-key",
        "a retry records its attempt under a new effect key: the engine cannot tell it from the first attempt, "
        "which may still arrive",
        [Edit("sql:settle_effect",
              """        SELECT e.task_id, p_lease, p_effect_key, e.attempt + 1, p_epoch, s.hash, e.intent""",
              """        SELECT e.task_id, p_lease, p_effect_key || '#' || (e.attempt + 1), e.attempt + 1, p_epoch, s.hash,
               e.intent""")],
        [cargo_test("effects", "a_retry_is_the_next_attempt_of_the_same_key_under_the_new_epoch"), RESCUE_STORY],
    ),
]


class Stale(Exception):
    """A mutation whose edit no longer applies to the current source."""


def sql_function(name: str) -> str:
    """The definition of pgfence.<name> in effect once every migration ran — its last CREATE [OR REPLACE] FUNCTION
    in the order the migrations apply — as CREATE OR REPLACE."""
    found = [m.group(0) for path in MIGRATIONS
             for m in re.finditer(rf"^CREATE (?:OR REPLACE )?FUNCTION pgfence\.{re.escape(name)}\(.*?^\$\$;$",
                                  open(path).read(), re.S | re.M)]
    if not found:
        raise Stale(f"function pgfence.{name} not found in the migrations")
    return re.sub(r"^CREATE (?:OR REPLACE )?FUNCTION", "CREATE OR REPLACE FUNCTION", found[-1], count=1)


def apply(text: str, edit: Edit, where: str) -> str:
    n = text.count(edit.find)
    if n != edit.count:
        raise Stale(f"{where}: expected {edit.count} occurrence(s) of {edit.find!r}, found {n}")
    return text.replace(edit.find, edit.replace)


def sql_mutant(mutation: Mutation) -> str | None:
    """The SQL of a mutation's SQL edits (CREATE OR REPLACE of each edited function), or None if it has none."""
    functions: dict[str, str] = {}
    for edit in mutation.edits:
        if not edit.target.startswith("sql:"):
            continue
        name = edit.target[4:]
        functions[name] = apply(functions.get(name) or sql_function(name), edit, f"pgfence.{name}")
    if not functions:
        return None
    header = f"-- mutation {mutation.name}: {mutation.weakens} (generated by tests/mutation/gate.py)\n"
    return header + "\n\n".join(functions.values()) + "\n"


def pg_config() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_config"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return found[-1] if found else "pg_config"


def native_build(mutation: Mutation) -> str | None:
    """A build of native/ with the mutation's C edits (the directory holding its pgfence_native.so), or None if it
    has none."""
    edits = [e for e in mutation.edits if e.target.startswith("native/")]
    if not edits:
        return None
    out = os.path.join(WORK, "native")
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(os.path.join(ROOT, "native"), out,
                    ignore=shutil.ignore_patterns("*.o", "*.so", "*.bc", "results"))
    touched: dict[str, str] = {}
    for edit in edits:
        rel = edit.target[len("native/"):]
        text = touched.get(rel) or open(os.path.join(out, rel)).read()
        touched[rel] = apply(text, edit, edit.target)
    for rel, text in touched.items():
        with open(os.path.join(out, rel), "w") as f:
            f.write(text)
    build = subprocess.run(["make", "-s", f"PG_CONFIG={pg_config()}", "with_llvm=no"], cwd=out,
                           capture_output=True, text=True)
    if build.returncode != 0:
        raise Stale(f"the mutated extension does not build:\n{(build.stdout + build.stderr)[-3000:]}")
    return out


def rust_tree_edits(mutation: Mutation) -> list[Edit]:
    return [e for e in mutation.edits if not e.target.startswith(("sql:", "native/"))]


def rust_tree(mutation: Mutation) -> str | None:
    """A copy of the source tree with the mutation's Rust edits, or None if it has none."""
    edits = rust_tree_edits(mutation)
    if not edits:
        return None
    tree = os.path.join(WORK, "tree")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    for rel in files:
        src, dst = os.path.join(ROOT, rel), os.path.join(tree, rel)
        if not os.path.isfile(src):
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        # Copy only what changed, keeping mtimes of the rest: cargo then rebuilds only what the mutation touched.
        if not os.path.exists(dst) or open(src, "rb").read() != open(dst, "rb").read():
            shutil.copy2(src, dst)
    touched: dict[str, str] = {}
    for edit in edits:
        text = touched.get(edit.target) or open(os.path.join(ROOT, edit.target)).read()
        touched[edit.target] = apply(text, edit, edit.target)
    for rel, text in touched.items():
        with open(os.path.join(tree, rel), "w") as f:
            f.write(text)
    return tree


def failed_tests(output: str) -> list[str]:
    """Names of failed tests in cargo's and pg_regress's output."""
    names = re.findall(r"^test (\S+)\s+\.\.\.\s+FAILED", output, re.M)
    names += re.findall(r"^not ok \d+\s+- (\S+)", output, re.M)
    return sorted(set(names))


def test_target(command: list[str]) -> tuple[str, list[str]] | None:
    """The test target ("lib" for the library's unit tests) and the filters of a `cargo test --test T …` or
    `cargo test --lib …` command; None for any other command."""
    if command[:3] == ["cargo", "test", "--test"] and len(command) > 3:
        return command[3], command[4:]
    if command[:3] == ["cargo", "test", "--lib"]:
        return "lib", command[3:]
    return None


def build_tests(cwd: str, env: dict, targets: set[str]) -> dict[str, str]:
    """Builds the test binaries of `targets` in `cwd` (one cargo call) and returns each one's executable."""
    args = ["cargo", "test", "--no-run", "--message-format=json-render-diagnostics"]
    for target in sorted(targets):
        args += ["--lib"] if target == "lib" else ["--test", target]
    build = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if build.returncode != 0:
        # A toolchain killed by a signal or out of disk says nothing about the mutation: say so, not "stale".
        if re.search(r"terminated with signal|No space left on device|Bus error", build.stderr):
            raise SystemExit(f"gate: a build failed for want of resources (disk full?), not because of a "
                             f"mutation:\n{build.stderr[-1500:]}")
        raise Stale(f"the tree does not build:\n{build.stderr[-3000:]}")
    found: dict[str, str] = {}
    for line in build.stdout.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        if not message.get("profile", {}).get("test"):
            continue
        kind, name = message["target"]["kind"], message["target"]["name"]
        found["lib" if "lib" in kind and name == "pgfence" else name] = message["executable"]
    missing = targets - set(found)
    if missing:
        raise SystemExit(f"gate: cargo built no test binary for {', '.join(sorted(missing))}")
    return found


_LISTED: dict[str, set[str]] = {}


def listed_tests(executable: str, cwd: str, env: dict) -> set[str]:
    """The names of the tests in a test binary (`--list`)."""
    key = f"{executable}@{os.path.getmtime(executable)}"
    if key not in _LISTED:
        out = subprocess.run([executable, "--list", "--format", "terse"], cwd=cwd, env=env, capture_output=True,
                             text=True, check=True).stdout
        _LISTED[key] = {line.rsplit(": ", 1)[0] for line in out.splitlines() if line.endswith(": test")}
    return _LISTED[key]


def catcher_command(command: list[str], binaries: dict[str, str], cwd: str, env: dict) -> list[str]:
    """The command that runs a catcher: a test binary built up front, run directly with its tests' exact names
    (no cargo, no rebuild); other commands (the isolation specs) as they are."""
    parsed = test_target(command)
    if parsed is None:
        return command
    target, filters = parsed
    executable = binaries[target]
    names = listed_tests(executable, cwd, env)
    if not filters:
        raise SystemExit(f"gate: `{' '.join(command)}` names no test: name the tests that catch the mutation")
    unknown = [f for f in filters if not any(name.startswith(f) or f in name for name in names)]
    if unknown:
        raise SystemExit(f"gate: `{' '.join(command)}`: no test in {target} is named {', '.join(unknown)}")
    # Exact names run only those tests; a prefix (a whole module) runs every test under it.
    exact = ["--exact"] if all(f in names for f in filters) else []
    return [executable, *filters, *exact]


def needed_targets(mutations: list[Mutation]) -> set[str]:
    return {parsed[0] for m in mutations for _, command in m.suites
            if (parsed := test_target(command)) is not None}


def run_mutation(mutation: Mutation, binaries: dict[str, str]) -> dict:
    """Applies one mutation and runs its catchers in order until one fails. `binaries`: the test binaries of the
    unmutated tree, built once by the caller (SQL and C mutations run them as they are)."""
    env = dict(os.environ)
    env.pop("PGFENCE_MUTANT_SQL", None)
    os.makedirs(WORK, exist_ok=True)
    sql = sql_mutant(mutation)
    if sql is not None:
        path = os.path.join(WORK, f"{mutation.name}.sql")
        with open(path, "w") as f:
            f.write(sql)
        env["PGFENCE_MUTANT_SQL"] = path
    built = time.monotonic()
    native = native_build(mutation)
    if native is not None:
        env["PGFENCE_NATIVE_LIB_DIR"] = native
        env["PGFENCE_TEST_NATIVE"] = "1"
    cwd = ROOT
    tree = rust_tree(mutation)
    if tree is not None:
        cwd = tree
        # A target directory of its own, shared by every Rust mutant (only pgfence itself recompiles after the
        # first): cargo names a path package's artifacts independently of where the package lies, so building
        # the copy in the repository's target directory would replace the real test binaries with mutated ones.
        env["CARGO_TARGET_DIR"] = os.path.join(WORK, "target")
        # The copy must build before its tests mean anything: a mutant that does not compile is no proof.
        try:
            binaries = build_tests(cwd, env, needed_targets([mutation]))
        except Stale as e:
            raise Stale(f"the mutated tree does not build: {e}") from None
    build_seconds = time.monotonic() - built
    # What a test binary run by cargo would find in its environment.
    env["CARGO_MANIFEST_DIR"] = cwd
    env.setdefault("CARGO", shutil.which("cargo") or "cargo")
    started = time.monotonic()
    for label, command in mutation.suites:
        t0 = time.monotonic()
        run = catcher_command(command, binaries, cwd, env)
        # A mutant may make a wait unbounded: a suite that hangs past its limit counts as caught (by timeout).
        try:
            result = subprocess.run(run, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
            code, output = result.returncode, result.stdout + result.stderr
        except subprocess.TimeoutExpired as e:
            code = -1
            output = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            output += "\n(timed out after 600 s)"
        elapsed = time.monotonic() - t0
        if code != 0:
            tests = failed_tests(output)
            if code == -1:
                tests = tests or ["(timed out)"]
            elif code < 0 or re.search(r"process didn't exit successfully: .*\(signal: ", output):
                tests = tests or ["(the test process died of a signal)"]
            elif not tests:
                # A command that fails without a failing test (a wrong filter, an unknown option, a build error)
                # proves nothing about the mutation: the gate itself is wrong, and says so.
                raise SystemExit(f"gate: `{label}` exited {code} without a failing test, so it caught nothing; "
                                 f"fix the command:\n{output[-2000:]}")
            return {"caught": True, "by": label, "tests": tests, "build": build_seconds,
                    "seconds": elapsed, "total": time.monotonic() - started, "log": output}
    return {"caught": False, "by": None, "tests": [], "build": build_seconds, "seconds": 0.0,
            "total": time.monotonic() - started, "log": ""}


def write_report(rows: list[tuple[Mutation, dict]], seconds: float, up_front: float) -> None:
    builds = up_front + sum(r["build"] for _, r in rows)
    lines = [
        "# Mutation gate",
        "",
        "Generated by `python3 tests/mutation/gate.py` (run by `.ci/run`); do not edit by hand. Each row weakens one",
        "thing the protocol or the runtime relies on and names the first of its named catching tests that failed,",
        "the tests that failed, and how long that test binary ran until it failed (debug build, this machine).",
        "The test binaries are built once up front; a Rust mutation rebuilds pgfence in a copy of the tree (a target",
        "directory shared by the Rust mutants), a C mutation builds native/ only, an SQL mutation builds nothing.",
        "",
        f"Last full run: {len(rows)} mutations in {seconds:.0f} s, {builds:.0f} s of it building "
        f"({up_front:.0f} s up front).",
        "",
        "| mutation | what it weakens | caught by | failing tests | build | time to catch |",
        "|---|---|---|---|---|---|",
    ]
    for mutation, r in rows:
        verdict = f"`{r['by']}`" if r["caught"] else "**SURVIVED**"
        tests = ", ".join(f"`{t}`" for t in r["tests"][:4]) + (" …" if len(r["tests"]) > 4 else "")
        lines.append(f"| `{mutation.name}` | {mutation.weakens} | {verdict} | {tests} | {r['build']:.1f} s "
                     f"| {r['seconds']:.1f} s |")
    os.makedirs(os.path.dirname(REPORT), exist_ok=True)
    with open(REPORT, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv: list[str]) -> int:
    if not MIGRATIONS:
        print("gate: no migrations/*/up.sql found", file=sys.stderr)
        return 2
    if argv[:1] == ["--list"]:
        for m in MUTATIONS:
            print(f"{m.name}: {m.weakens}\n    caught by: {', '.join(label for label, _ in m.suites)}")
        return 0
    if argv[:1] == ["--emit"]:
        out = argv[1] if len(argv) > 1 else os.path.join(WORK, "sql")
        os.makedirs(out, exist_ok=True)
        for m in MUTATIONS:
            sql = sql_mutant(m)
            if sql is not None:
                with open(os.path.join(out, f"{m.name}.sql"), "w") as f:
                    f.write(sql)
                print(os.path.join(out, f"{m.name}.sql"))
        return 0
    repeat = 1
    if argv[:1] == ["--repeat"] and len(argv) > 1:
        repeat, argv = int(argv[1]), argv[2:]
    # Each repetition right after the previous one: a Rust mutant's tree is built once for all of them.
    selected = [m for m in MUTATIONS if not argv or m.name in argv for _ in range(repeat)]
    unknown = set(argv) - {m.name for m in MUTATIONS}
    if unknown:
        print(f"gate: unknown mutation(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    gate_started = time.monotonic()
    # The test binaries of the tree as it is, built once: every SQL and C mutation runs them.
    unmutated = [m for m in selected if rust_tree_edits(m) == []]
    env = dict(os.environ)
    env.pop("PGFENCE_MUTANT_SQL", None)
    try:
        binaries = build_tests(ROOT, env, needed_targets(unmutated)) if unmutated else {}
    except Stale as e:
        print(f"gate: {e}", file=sys.stderr)
        return 2
    up_front = time.monotonic() - gate_started
    print(f"gate: test binaries built in {up_front:.1f} s", flush=True)
    rows, survived, stale = [], [], []
    for m in selected:
        print(f"== mutation {m.name}: {m.weakens}", flush=True)
        try:
            r = run_mutation(m, binaries)
        except Stale as e:
            print(f"   NO LONGER APPLIES: {e}", flush=True)
            stale.append(m.name)
            continue
        rows.append((m, r))
        if r["caught"]:
            print(f"   caught by {r['by']} in {r['seconds']:.1f} s (build {r['build']:.1f} s): "
                  f"{', '.join(r['tests'])}", flush=True)
        else:
            survived.append(m.name)
            print(f"   SURVIVED every suite ({r['total']:.1f} s)", flush=True)
    seconds = time.monotonic() - gate_started
    print(f"gate: {len(rows)} mutation runs in {seconds:.0f} s")
    if not argv and not stale and repeat == 1:
        write_report(rows, seconds, up_front)
        print(f"gate: report written to {os.path.relpath(REPORT, ROOT)}")
    if stale:
        print(f"gate: mutations that no longer apply (update them with the code): {', '.join(stale)}")
        return 2
    if survived:
        print(f"gate: FAILED, survived: {', '.join(survived)}")
        return 1
    print(f"gate: every mutation caught ({len(rows)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
