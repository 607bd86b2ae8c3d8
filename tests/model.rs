//! The pgfence protocol, model-checked: every interleaving of acquire, renew, release, force_release, guarded
//! writes, the guard lock's queue, expiry by the database clock, holders' local deadlines, lost replies and a
//! promotion of an asynchronous standby, explored exhaustively within bounds (stateright, breadth first).
//!
//! `cargo test --test model` explores the bounded configuration in full and checks that each deliberate
//! weakening of the protocol is found; `cargo test --test model -- --ignored` explores the large one
//! (everything at once). See docs/model.md. A change to the guard or to the lease protocol changes the model
//! (tests/model/protocol.rs) in the same commit.
//!
//! A second model (`tests/model/handover.rs`) checks the leadership runtime's cooperative balanced handover on
//! top of that protocol: members heartbeating membership rows, the desired owner of a lease computed from the
//! live set, the holder that drains and releases, the successor that acquires only a free lease, pauses and
//! crashes mid-drain, writes in flight (docs/model.md, "The balanced handover"); `-- --ignored` also explores
//! its two larger configurations.
//!
//! A third model (`tests/model/effects.rs`) checks the effect ledger: intents, external calls to an engine
//! that dedupes by effect key, outcomes, late reports and the successors' settles across a succession of
//! tenures, with the engine's state as the ground truth (docs/model.md, "The effect ledger").

#[path = "model/assignment.rs"]
mod assignment;
#[path = "model/assignment_props.rs"]
mod assignment_props;
#[path = "model/assignment_step.rs"]
mod assignment_step;
#[path = "model/assignment_tests.rs"]
mod assignment_tests;
#[path = "model/effects.rs"]
mod effects;
#[path = "model/handover.rs"]
mod handover;
#[path = "model/properties.rs"]
mod properties;
#[path = "model/protocol.rs"]
mod protocol;
#[path = "model/trace.rs"]
mod trace;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model};

use protocol::{Config, Protocol, Weakening};

/// Threads of the checker (the machines running the suite have 2 cores).
fn threads() -> usize {
    std::env::var("PGFENCE_MODEL_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(2)
}

/// Explores `cfg` in full and asserts that no `always` property fails and that the `examples` are reached.
fn check_all(name: &str, cfg: Config, examples: &[&str]) {
    check_within(name, cfg, examples, None)
}

/// Like `check_all`, stopping after `budget` if given: then the search is depth first, because its memory
/// grows with the states seen and not with a breadth-first frontier (which filled 16 GB in 8 minutes on the
/// large configuration), and it is a partial exploration when the budget ends it.
fn check_within(name: &str, cfg: Config, examples: &[&str], budget: Option<Duration>) {
    let started = Instant::now();
    let builder = Protocol { cfg }.checker().threads(threads());
    match budget {
        Some(b) => report(
            name,
            builder.timeout(b).spawn_dfs().join(),
            started,
            budget,
            examples,
        ),
        None => report(name, builder.spawn_bfs().join(), started, budget, examples),
    }
}

fn report(
    name: &str,
    checker: impl Checker<Protocol>,
    started: Instant,
    budget: Option<Duration>,
    examples: &[&str],
) {
    let elapsed = started.elapsed();
    println!(
        "model {name}: {} states ({} unique), max depth {}, {:.1?}{}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        elapsed,
        match budget {
            Some(b) if elapsed >= b => " (stopped by the time budget: a partial exploration)",
            _ => " (complete)",
        }
    );
    let discoveries = checker.discoveries();
    let mut failed = Vec::new();
    for p in checker.model().properties() {
        match (p.expectation, discoveries.get(p.name)) {
            (stateright::Expectation::Always, Some(path))
            | (stateright::Expectation::Eventually, Some(path)) => {
                failed.push(format!(
                    "VIOLATED: {}\n{}",
                    p.name,
                    trace::render(checker.model(), path)
                ));
            }
            (stateright::Expectation::Sometimes, None) if examples.contains(&p.name) => {
                failed.push(format!("NEVER REACHED: {}", p.name))
            }
            _ => {}
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Explores `weakenings` applied to the bounded configuration until `expected` fails, and prints the shortest
/// counterexample.
fn find_in(cfg: Config, weakenings: &[Weakening], expected: &'static str) {
    let started = Instant::now();
    let model = Protocol {
        cfg: cfg.with(weakenings),
    };
    let checker = model
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([expected])))
        .timeout(Duration::from_secs(300))
        .spawn_bfs()
        .join();
    let discoveries = checker.discoveries();
    let safety = properties::safety_names(checker.model());
    let broken: Vec<_> = safety
        .iter()
        .filter(|n| discoveries.contains_key(*n))
        .collect();
    let Some(path) = discoveries.get(expected) else {
        panic!("{weakenings:?}: no counterexample for {expected:?} (broken: {broken:?})");
    };
    println!(
        "{weakenings:?} breaks {expected:?} ({} states, {:.1?}); also broken so far: {broken:?}\n{}",
        checker.unique_state_count(),
        started.elapsed(),
        trace::render(checker.model(), path)
    );
}

#[test]
fn takeovers_renewals_and_deadlines_keep_every_property() {
    check_all(
        "takeover",
        Config::takeover(),
        &[
            properties::S_TERMINATED,
            properties::S_REFUSED_AFTER_WAIT,
            properties::S_WRITE_AFTER_TAKEOVER,
        ],
    );
}

#[test]
fn lost_replies_and_retries_keep_every_property() {
    check_all(
        "retries",
        Config::retries(),
        &[properties::S_WRITE_AFTER_TAKEOVER, properties::S_REACQUIRED],
    );
}

#[test]
fn force_release_keeps_every_property() {
    check_all(
        "force_release",
        Config::force_release(),
        &[properties::S_TERMINATED, properties::S_WRITE_AFTER_TAKEOVER],
    );
}

#[test]
fn release_keeps_every_property() {
    check_all(
        "release",
        Config::release(),
        &[properties::S_TERMINATED, properties::S_WRITE_AFTER_TAKEOVER],
    );
}

#[test]
fn a_promotion_keeps_every_property() {
    check_all(
        "promotion",
        Config::promotion(),
        &[
            properties::S_FAILOVER_REFUSED,
            properties::S_ACKED_LOST,
            properties::S_WRITE_AFTER_TAKEOVER,
        ],
    );
}

/// Everything at once (long): `cargo test --test model -- --ignored --nocapture`. Stops after
/// `PGFENCE_MODEL_MINUTES` (default 10) if it has not finished, and says so.
#[test]
#[ignore = "the large configuration: cargo test --test model -- --ignored --nocapture"]
fn everything_at_once_keeps_every_property() {
    let minutes: u64 = std::env::var("PGFENCE_MODEL_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(10);
    check_within(
        "large",
        Config::large(),
        &[],
        Some(Duration::from_secs(60 * minutes)),
    );
}

#[test]
fn a_guard_without_its_shared_lock_is_found() {
    find_in(
        Config::takeover(),
        &[Weakening::GuardWithoutLock],
        properties::FENCING,
    );
}

#[test]
fn a_fast_path_without_its_shared_lock_is_found() {
    find_in(
        Config::takeover(),
        &[Weakening::AdmitWithoutLock],
        properties::FENCING,
    );
}

#[test]
fn a_takeover_without_its_exclusive_lock_is_found() {
    find_in(
        Config::takeover(),
        &[Weakening::TakeoverWithoutExclusiveLock],
        properties::FENCING,
    );
}

#[test]
fn a_takeover_without_grace_is_found() {
    // The bound (grace + 3 rounds) must fit in the clock range.
    find_in(
        Config {
            max_clock: 7,
            ..Config::takeover()
        },
        &[Weakening::TakeoverWithoutGrace],
        properties::TAKEOVER_BOUNDED,
    );
}

#[test]
fn a_superseded_check_accepting_the_previous_epoch_is_found() {
    find_in(
        Config::takeover(),
        &[Weakening::SupersededAcceptsPrevious],
        properties::REFUSALS_AUDITED,
    );
}

#[test]
fn a_superseded_check_accepting_the_previous_epoch_without_the_secret_is_found() {
    find_in(
        Config::takeover(),
        &[
            Weakening::SupersededAcceptsPrevious,
            Weakening::SecretNotChecked,
        ],
        properties::FENCING,
    );
}

#[test]
fn a_superseded_check_refusing_the_current_epoch_is_found() {
    find_in(
        Config::takeover(),
        &[Weakening::SupersededRefusesCurrent],
        properties::REFUSALS_AUDITED,
    );
}

#[test]
fn the_failover_boundary_removed_is_found() {
    find_in(
        Config::promotion(),
        &[Weakening::FailoverBoundaryRemoved],
        properties::FAILOVER_FENCE,
    );
}

#[test]
fn epochs_without_the_timeline_jump_are_found() {
    find_in(
        Config::promotion(),
        &[Weakening::NoEpochJump],
        properties::EPOCHS_INCREASE,
    );
}

#[test]
fn a_local_deadline_without_the_margin_is_found() {
    find_in(
        Config::takeover(),
        &[Weakening::DeadlineWithoutMargin],
        properties::BELIEF,
    );
}

#[test]
fn a_local_deadline_from_the_receive_time_is_found() {
    find_in(
        Config::takeover(),
        &[Weakening::DeadlineFromReceive],
        properties::BELIEF,
    );
}

/// The configuration in which writes of a live tenure keep arriving while an operator force-releases it: one
/// holder writing four times, a long ttl.
fn write_storm() -> Config {
    Config {
        holders: 1,
        renews: 0,
        releases: 0,
        writes: 4,
        promotions: 0,
        ttl: 6,
        max_clock: 6,
        ..Config::large()
    }
}

/// The protocol as built against a storm of writes of the tenure a force_release ends: no write passes its
/// check while the takeover is under way, the takeover never fails, and it waits at most the grace.
#[test]
fn a_force_release_under_a_write_storm_keeps_every_property() {
    check_all("write_storm", write_storm(), &[properties::S_TERMINATED]);
}

/// The previous protocol (no intent lock): when the takeover's wait runs out after the grace, the writes queued
/// behind it are granted and pass their check before the holders are ended (the grace lets writes in).
#[test]
fn a_takeover_without_its_intent_lock_lets_writes_in() {
    find_in(
        write_storm(),
        &[Weakening::TakeoverWithoutIntentLock],
        properties::WRITES_HELD_OFF,
    );
}

/// The previous protocol (no intent lock): between the terminations and the next request the exclusive request
/// is not queued, so a write of the live tenure takes the guard lock in that gap; three times in a row and the
/// force_release gives up with PF003.
#[test]
fn a_takeover_without_its_intent_lock_can_fail_when_writes_slip_in_three_rounds() {
    find_in(
        write_storm(),
        &[Weakening::TakeoverWithoutIntentLock],
        properties::TAKEOVER_COMPLETES,
    );
}

/// A guard whose fast path does not probe the intent lock: a write arriving while the takeover ends the holders
/// takes the guard lock and passes.
#[test]
fn a_fast_path_without_the_intent_probe_lets_writes_in() {
    find_in(
        write_storm(),
        &[Weakening::FastPathWithoutIntentProbe],
        properties::WRITES_HELD_OFF,
    );
}

/// The previous secret re-check (only when the pre-check did not match it) does not back the epoch comparison
/// up: with an off-by-one in it, a write whose pre-check matched its secret and that waited through a
/// re-acquisition by the same holder is judged by the epoch alone and commits after the next epoch's
/// acquisition. (With the re-check as built it is refused as bad_secret: see
/// `a_superseded_check_accepting_the_previous_epoch_is_found`.)
#[test]
fn the_previous_secret_recheck_lets_an_off_by_one_through() {
    find_in(
        Config::takeover(),
        &[
            Weakening::SupersededAcceptsPrevious,
            Weakening::SecretRecheckOnlyIfUnchecked,
        ],
        properties::FENCING,
    );
}

// The balanced handover (tests/model/handover.rs).

/// Explores the handover configuration `cfg` in full (breadth first) and asserts that no `always` property
/// fails and that the `examples` are reached.
fn check_handover(name: &str, cfg: handover::Config, examples: &[&str]) {
    let started = Instant::now();
    let checker = handover::Handover { cfg }
        .checker()
        .threads(threads())
        .spawn_bfs()
        .join();
    println!(
        "model {name}: {} states ({} unique), max depth {}, {:.1?} (complete)",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed(),
    );
    let discoveries = checker.discoveries();
    let mut failed = Vec::new();
    for p in checker.model().properties() {
        match (p.expectation, discoveries.get(p.name)) {
            (Expectation::Always, Some(path)) | (Expectation::Eventually, Some(path)) => {
                let steps = handover::until_broken(checker.model(), path, p.name);
                failed.push(format!(
                    "VIOLATED: {}\n{}",
                    p.name,
                    handover::render(checker.model(), &steps)
                ))
            }
            (Expectation::Sometimes, None) if examples.contains(&p.name) => {
                failed.push(format!("NEVER REACHED: {}", p.name))
            }
            _ => {}
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Explores the handover configuration `cfg` with `weakenings` until `expected` fails, and prints the
/// counterexample (breadth first: a shortest one with one checker thread; cut at its first violating state).
fn find_in_handover(
    cfg: handover::Config,
    weakenings: &[handover::Weakening],
    expected: &'static str,
) {
    let started = Instant::now();
    let checker = handover::Handover {
        cfg: cfg.with(weakenings),
    }
    .checker()
    .threads(threads())
    .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([expected])))
    .timeout(Duration::from_secs(300))
    .spawn_bfs()
    .join();
    let discoveries = checker.discoveries();
    let broken: Vec<_> = handover::safety_names(checker.model())
        .into_iter()
        .filter(|n| discoveries.contains_key(n))
        .collect();
    let Some(path) = discoveries.get(expected) else {
        panic!("{weakenings:?}: no counterexample for {expected:?} (broken: {broken:?})");
    };
    let steps = handover::until_broken(checker.model(), path, expected);
    println!(
        "{weakenings:?} breaks {expected:?} in {} steps ({} states, {:.1?}); also broken so far: {broken:?}\n{}",
        steps.len() - 1,
        checker.unique_state_count(),
        started.elapsed(),
        handover::render(checker.model(), &steps)
    );
}

/// What every handover configuration must reach.
const HANDOVER_EXAMPLES: &[&str] = &[
    handover::S_GRACEFUL,
    handover::S_INFLIGHT_REFUSED,
    handover::S_EXPIRED_MID_DRAIN,
    handover::S_TERMINATED,
    handover::S_RESUMED_REFUSED,
    handover::S_HANDBACK,
];

#[test]
fn a_balanced_handover_between_two_keeps_every_property() {
    check_handover(
        "handover (two members)",
        handover::Config::two(),
        HANDOVER_EXAMPLES,
    );
}

#[test]
fn a_balanced_handover_among_three_keeps_every_property() {
    check_handover(
        "handover (three members)",
        handover::Config::three(),
        HANDOVER_EXAMPLES,
    );
}

/// The two handover configurations with a second write of the first holder and a longer clock (about 50 s):
/// `cargo test --test model -- --ignored --nocapture handover`.
#[test]
#[ignore = "the larger handover configurations: cargo test --test model -- --ignored --nocapture handover"]
fn a_balanced_handover_with_more_writes_and_time_keeps_every_property() {
    check_handover(
        "handover (two members, large)",
        handover::Config::two_large(),
        HANDOVER_EXAMPLES,
    );
    check_handover(
        "handover (three members, large)",
        handover::Config::three_large(),
        HANDOVER_EXAMPLES,
    );
}

#[test]
fn a_successor_acquiring_before_the_release_commits_is_found() {
    find_in_handover(
        handover::Config::two(),
        &[handover::Weakening::AcquireWhileHeld],
        handover::FENCING,
    );
}

#[test]
fn a_release_without_its_exclusive_guard_lock_is_found() {
    find_in_handover(
        handover::Config::two(),
        &[handover::Weakening::ReleaseWithoutGuard],
        handover::RELEASE_FENCE,
    );
}

#[test]
fn a_ping_pong_assignment_without_hysteresis_is_found() {
    find_in_handover(
        handover::Config::two(),
        &[
            handover::Weakening::AcquireUnsettled,
            handover::Weakening::AssignmentFlips,
        ],
        handover::CONVERGES,
    );
}

/// The flipping assignment alone is enough: the settle rule is hysteresis at a join only, not against an
/// assignment that does not depend on the member set alone.
#[test]
fn an_assignment_flipping_on_every_heartbeat_is_found() {
    find_in_handover(
        handover::Config::two(),
        &[handover::Weakening::AssignmentFlips],
        handover::CONVERGES,
    );
}

/// A successor woken only by a release (its NOTIFY), never taking an expired lease: a holder that stops
/// mid-drain leaves the lease without a leader.
#[test]
fn a_successor_that_never_takes_an_expired_lease_is_found() {
    find_in_handover(
        handover::Config::two(),
        &[handover::Weakening::AcquireOnlyReleased],
        handover::CONVERGES,
    );
}

// The effect ledger (tests/model/effects.rs).

/// Explores the effect ledger configuration `cfg` in full (breadth first) and asserts that no `always`
/// property fails and that the `examples` are reached.
fn check_effects(name: &str, cfg: effects::Config, examples: &[&str]) {
    let started = Instant::now();
    let checker = effects::Effects { cfg }
        .checker()
        .threads(threads())
        .spawn_bfs()
        .join();
    println!(
        "model {name}: {} states ({} unique), max depth {}, {:.1?} (complete)",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed(),
    );
    let discoveries = checker.discoveries();
    let mut failed = Vec::new();
    for p in checker.model().properties() {
        match (p.expectation, discoveries.get(p.name)) {
            (Expectation::Always, Some(path)) | (Expectation::Eventually, Some(path)) => {
                let steps = effects::until_broken(checker.model(), path, p.name);
                failed.push(format!("VIOLATED: {}\n{}", p.name, effects::render(&steps)))
            }
            (Expectation::Sometimes, None) if examples.contains(&p.name) => {
                failed.push(format!("NEVER REACHED: {}", p.name))
            }
            _ => {}
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Explores the effect ledger configuration `cfg` with `weakenings` until `expected` fails, and prints the
/// counterexample (breadth first, cut at its first violating state).
fn find_in_effects(
    cfg: effects::Config,
    weakenings: &[effects::Weakening],
    expected: &'static str,
) {
    let started = Instant::now();
    let checker = effects::Effects {
        cfg: cfg.with(weakenings),
    }
    .checker()
    .threads(threads())
    .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([expected])))
    .timeout(Duration::from_secs(300))
    .spawn_bfs()
    .join();
    let discoveries = checker.discoveries();
    let broken: Vec<_> = effects::safety_names(checker.model())
        .into_iter()
        .filter(|n| discoveries.contains_key(n))
        .collect();
    let Some(path) = discoveries.get(expected) else {
        panic!("{weakenings:?}: no counterexample for {expected:?} (broken: {broken:?})");
    };
    let steps = effects::until_broken(checker.model(), path, expected);
    println!(
        "{weakenings:?} breaks {expected:?} in {} steps ({} states, {:.1?}); also broken so far: {broken:?}\n{}",
        steps.len() - 1,
        checker.unique_state_count(),
        started.elapsed(),
        effects::render(&steps)
    );
}

#[test]
fn effects_across_two_successors_keep_every_property() {
    check_effects(
        "effects (one task, two handovers)",
        effects::Config::one_task(),
        &[
            effects::S_LATE_AFTER_SETTLE,
            effects::S_RETRY_APPLIED,
            effects::S_TWO_SUCCESSORS,
            effects::S_LATE_APPLY,
            effects::S_DEDUPED,
            effects::S_CONFIRMED,
            effects::S_OWN_UNKNOWN,
            effects::S_ABANDONED_APPLIED,
        ],
    );
}

#[test]
fn effects_of_two_tasks_keep_every_property() {
    check_effects(
        "effects (two tasks, one handover)",
        effects::Config::two_tasks(),
        &[
            effects::S_LATE_AFTER_SETTLE,
            effects::S_RETRY_APPLIED,
            effects::S_LATE_APPLY,
            effects::S_DEDUPED,
            effects::S_CONFIRMED,
        ],
    );
}

/// Two tasks with two faults (a few minutes):
/// `cargo test --test model -- --ignored --nocapture effects`.
#[test]
#[ignore = "the larger effect ledger configuration: cargo test --test model -- --ignored --nocapture effects"]
fn effects_of_two_tasks_with_two_faults_keep_every_property() {
    check_effects(
        "effects (two tasks, one handover, two faults)",
        effects::Config::two_tasks_large(),
        &[effects::S_RETRY_APPLIED, effects::S_OWN_UNKNOWN],
    );
}

#[test]
fn effects_settled_by_two_workers_keep_every_property() {
    check_effects(
        "effects (two workers settle)",
        effects::Config::double_settle(),
        &[effects::S_CONFIRMED],
    );
}

/// A tenure racing itself (issue #43): its settle of its own 'unknown' attempt and another worker's 'done' for
/// it, in either order and interleaved between the settle's pre-checks and its UPDATE.
#[test]
fn effects_of_a_tenure_racing_itself_keep_every_property() {
    check_effects(
        "effects (a tenure racing itself)",
        effects::Config::self_race(),
        &[effects::S_SELF_REPORT, effects::S_OWN_UNKNOWN],
    );
}

#[test]
fn effects_a_settle_rechecking_only_the_settlement_is_found() {
    find_in_effects(
        effects::Config::self_race(),
        &[effects::Weakening::SettleRechecksOnlySettlement],
        effects::SETTLED_IN_DOUBT,
    );
}

#[test]
fn effects_a_settle_without_the_fence_is_found() {
    find_in_effects(
        effects::Config::one_task(),
        &[effects::Weakening::SettleWithoutFence],
        effects::FENCED,
    );
}

#[test]
fn effects_an_in_doubt_list_omitting_the_last_intent_is_found() {
    find_in_effects(
        effects::Config::one_task(),
        &[effects::Weakening::InDoubtOmitsLast],
        effects::NO_LOST_INTENT,
    );
}

#[test]
fn effects_a_retry_minting_a_new_key_is_found() {
    find_in_effects(
        effects::Config::one_task(),
        &[effects::Weakening::RetryMintsNewKey],
        effects::ONE_KEY,
    );
}

#[test]
fn effects_a_settle_without_its_null_condition_is_found() {
    find_in_effects(
        effects::Config::double_settle(),
        &[effects::Weakening::SettleWithoutNullCheck],
        effects::SETTLED_ONCE,
    );
}

#[test]
fn effects_a_late_report_taken_as_the_outcome_is_found() {
    find_in_effects(
        effects::Config::one_task(),
        &[effects::Weakening::LateReportWrites],
        effects::LATE_INERT,
    );
}
