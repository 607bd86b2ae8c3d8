//! The effect ledger against real PostgreSQL: intents and outcomes recorded under the fence, what an ended tenure
//! leaves in doubt, the successor's exactly-once settle, late reports kept as evidence, and tasks that refuse to
//! move on while an effect is in doubt.
//!
//! Invariants checked (numbers as in the README's invariant map): 3 (a stale tenure's ledger write never
//! commits), 4 (every refused ledger write is a typed error and an audit row), 8 (a forged fence leaves no
//! evidence), 9 (an intent whose tenure ended without an outcome is in doubt until exactly one later tenure
//! settles it; an ended tenure's late outcome is refused and kept as a late report).

use crate::common;

use std::sync::Arc;

use common::fixture::{self, take_over};
use common::TestDb;
use pgfence::admin::RejectionFilter;
use pgfence::effects::{EffectConflict, EffectState, Outcome, Settlement};
use pgfence::tasks::TaskState;
use pgfence::{Error, LossReason, Store};
use serde_json::json;

/// A task `key` of lease `name` created under `store`'s current tenure `lease`.
async fn task(store: &Store, lease: &pgfence::Lease, key: &str) {
    store
        .tasks()
        .create(&lease.fence(), key, &json!({}))
        .await
        .unwrap();
}

/// Invariant 9 (the ordinary path): an intent then its outcome, each one guarded write with its event; a retry of
/// the intent is answered from the record (nothing written twice); a done effect is never attempted again; and
/// nothing of a live tenure's is in doubt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_and_its_outcome_are_recorded_once_and_never_in_doubt() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let lease = fixture::lease(&store, "sched").await;
    let fence = lease.fence();
    task(&store, &lease, "job").await;
    let ledger = store.effects();
    let intent = json!({"launch": "api:1.7"});

    let first = ledger
        .intend(&fence, "job", "job/launch", &intent)
        .await
        .unwrap();
    assert!(first.created);
    assert_eq!(
        (first.effect.attempt, first.effect.state),
        (1, EffectState::Open)
    );
    assert_eq!(first.effect.epoch, lease.epoch());
    let again = ledger
        .intend(&fence, "job", "job/launch", &intent)
        .await
        .unwrap();
    assert!(!again.created, "a retry of the same intent writes nothing");
    assert_eq!(again.effect.id, first.effect.id);
    let other = ledger
        .intend(&fence, "job", "job/launch", &json!({"launch": "api:1.8"}))
        .await;
    assert!(
        matches!(
            other,
            Err(Error::EffectConflict {
                reason: EffectConflict::IntentDiffers,
                ..
            })
        ),
        "{other:?}"
    );
    assert!(
        ledger.in_doubt("sched").await.unwrap().is_empty(),
        "in flight, not in doubt"
    );

    let done = ledger
        .record_outcome(
            &fence,
            "job/launch",
            &Outcome::Done(json!({"workload": "w-1"})),
        )
        .await
        .unwrap();
    assert_eq!(done.effect.state, EffectState::Done);
    assert_eq!(done.effect.detail, Some(json!({"workload": "w-1"})));
    let repeat = ledger
        .record_outcome(
            &fence,
            "job/launch",
            &Outcome::Done(json!({"workload": "w-1"})),
        )
        .await
        .unwrap();
    assert!(!repeat.created);
    let changed = ledger
        .record_outcome(&fence, "job/launch", &Outcome::Failed(json!({})))
        .await;
    assert!(
        matches!(
            changed,
            Err(Error::EffectConflict {
                reason: EffectConflict::OutcomeRecorded,
                ..
            })
        ),
        "{changed:?}"
    );
    let redo = ledger.intend(&fence, "job", "job/launch", &intent).await;
    assert!(
        matches!(
            redo,
            Err(Error::EffectConflict {
                reason: EffectConflict::Done,
                ..
            })
        ),
        "{redo:?}"
    );
    let kinds: Vec<String> = store
        .tasks()
        .events("sched", "job")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["created", "effect_intent", "effect_done"]);
    assert!(store
        .admin()
        .rejections(&RejectionFilter::default())
        .await
        .unwrap()
        .is_empty());
}

/// Invariants 3 and 4: a tenure that has ended is refused before it calls anything — its intent is a stale
/// write, refused and audited, and nothing is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_tenure_is_refused_its_intent_and_audited() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let old = fixture::lease(&store, "sched").await;
    task(&store, &old, "job").await;
    let new = take_over(&store, "sched", "pod-b").await;

    let refused = store
        .effects()
        .intend(&old.fence(), "job", "job/launch", &json!({}))
        .await;
    assert!(
        matches!(
            refused,
            Err(Error::Stale {
                reason: LossReason::Superseded,
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM pgfence.effects").await, 0);
    let audit = store
        .admin()
        .rejections(&RejectionFilter::default())
        .await
        .unwrap();
    assert!(
        audit
            .iter()
            .any(|r| r.operation == "record_intent" && r.presented_epoch == old.epoch().get()),
        "{audit:?}"
    );
    assert!(store.effects().in_doubt("sched").await.unwrap().is_empty());
    drop(new);
}

/// Invariant 9, the handover: an intent whose tenure ended without an outcome is in doubt for the successor,
/// with the tenure that left it; the old tenure's late outcome is refused (audited) and kept as the attempt's
/// late report; the task refuses to move on and to take another effect until the successor settles; the settle
/// is an event of the successor's epoch, and a second settle names who settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_finds_the_ended_tenures_intent_in_doubt_and_settles_it_once() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let old = fixture::lease(&store, "sched").await;
    task(&store, &old, "job").await;
    let ledger = store.effects();
    ledger
        .intend(&old.fence(), "job", "job/launch", &json!({"n": 1}))
        .await
        .unwrap();
    let new = take_over(&store, "sched", "pod-b").await;

    let late = ledger
        .record_outcome(
            &old.fence(),
            "job/launch",
            &Outcome::Done(json!({"workload": "w-7"})),
        )
        .await;
    assert!(matches!(late, Err(Error::Stale { .. })), "{late:?}");
    let doubts = ledger.in_doubt("sched").await.unwrap();
    assert_eq!(doubts.len(), 1, "{doubts:?}");
    let doubt = &doubts[0];
    assert_eq!(
        (doubt.effect.key.as_str(), doubt.effect.task_key.as_str()),
        ("job/launch", "job")
    );
    assert_eq!(doubt.effect.epoch, old.epoch());
    assert_eq!(doubt.effect.intent, json!({"n": 1}));
    assert_eq!(doubt.tenure.holder.as_deref(), Some("pod-a"));
    assert_eq!(doubt.tenure.end_reason.as_deref(), Some("forced"));
    assert!(doubt.tenure.ended_at.is_some() && doubt.tenure.last_write_at.is_some());
    let report = doubt
        .late_report
        .as_ref()
        .expect("the late outcome is kept");
    assert_eq!(
        (report.state, &report.detail),
        (EffectState::Done, &json!({"workload": "w-7"}))
    );

    let fence = new.fence();
    for refused in [
        store
            .tasks()
            .claim(&fence, "job", "worker")
            .await
            .map(|_| ()),
        store
            .tasks()
            .transition(
                &fence,
                "job",
                TaskState::Pending,
                TaskState::Cancelled,
                &json!({}),
            )
            .await
            .map(|_| ()),
        ledger
            .intend(&fence, "job", "job/other", &json!({}))
            .await
            .map(|_| ()),
    ] {
        assert!(
            matches!(&refused, Err(Error::InDoubt { effect_key, epoch, .. })
                if effect_key == "job/launch" && *epoch == old.epoch()),
            "{refused:?}"
        );
    }

    let settled = ledger
        .settle(
            &fence,
            "job/launch",
            &Settlement::Confirmed {
                observed: json!({"workload": "w-7"}),
            },
        )
        .await
        .unwrap();
    assert_eq!(settled.effect.state, EffectState::Confirmed);
    assert_eq!(settled.effect.settled_by, Some(new.epoch()));
    assert!(settled.in_doubt_for.is_some());
    let twice = ledger
        .settle(
            &fence,
            "job/launch",
            &Settlement::Abandon {
                reason: "again".into(),
            },
        )
        .await;
    assert!(
        matches!(twice, Err(Error::EffectConflict { reason: EffectConflict::Settled { by: Some(by) }, .. })
            if by == new.epoch()),
        "{twice:?}"
    );
    assert!(ledger.in_doubt("sched").await.unwrap().is_empty());
    store.tasks().claim(&fence, "job", "worker").await.unwrap();
    let events = store.tasks().events("sched", "job").await.unwrap();
    let settle = events
        .iter()
        .find(|e| e.kind == "effect_confirmed")
        .expect("the settle is an event");
    assert_eq!(settle.epoch, new.epoch().get());
}

/// Invariant 9, retry: a retry is the next attempt of the same effect key (the external system sees the same
/// idempotency key), recorded as the settling tenure's intent with the same intent, in flight under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_the_next_attempt_of_the_same_key_under_the_new_epoch() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let old = fixture::lease(&store, "sched").await;
    task(&store, &old, "job").await;
    let ledger = store.effects();
    ledger
        .intend(&old.fence(), "job", "job/launch", &json!({"n": 1}))
        .await
        .unwrap();
    let new = take_over(&store, "sched", "pod-b").await;
    let fence = new.fence();

    let retry = ledger
        .settle(
            &fence,
            "job/launch",
            &Settlement::Retry {
                observed: json!({"engine": "no such key"}),
            },
        )
        .await
        .unwrap();
    assert_eq!(retry.effect.key, "job/launch");
    assert_eq!(
        (retry.effect.attempt, retry.effect.state),
        (2, EffectState::Open)
    );
    assert_eq!(retry.effect.epoch, new.epoch());
    assert_eq!(retry.effect.intent, json!({"n": 1}));
    assert!(
        ledger.in_doubt("sched").await.unwrap().is_empty(),
        "the retry is in flight"
    );
    let done = ledger
        .record_outcome(&fence, "job/launch", &Outcome::Done(json!({})))
        .await
        .unwrap();
    assert_eq!(
        (done.effect.attempt, done.effect.state),
        (2, EffectState::Done)
    );
    assert_eq!(
        db.scalar("SELECT count(DISTINCT effect_key) FROM pgfence.effects")
            .await,
        1,
        "one key for every attempt"
    );
}

/// Invariant 9, unknown outcomes: an outcome the tenure itself does not know is in doubt at once (the task waits),
/// and the same tenure may settle it or report the final outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_is_in_doubt_for_its_own_tenure_too() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let lease = fixture::lease(&store, "sched").await;
    let fence = lease.fence();
    task(&store, &lease, "a").await;
    task(&store, &lease, "b").await;
    let ledger = store.effects();
    for key in ["a", "b"] {
        ledger
            .intend(&fence, key, &format!("{key}/call"), &json!({}))
            .await
            .unwrap();
        ledger
            .record_outcome(
                &fence,
                &format!("{key}/call"),
                &Outcome::Unknown(json!({"timeout_ms": 5000})),
            )
            .await
            .unwrap();
    }
    assert_eq!(ledger.in_doubt("sched").await.unwrap().len(), 2);
    let refused = store.tasks().claim(&fence, "a", "w").await;
    assert!(matches!(refused, Err(Error::InDoubt { .. })), "{refused:?}");
    let known = ledger
        .record_outcome(&fence, "a/call", &Outcome::Failed(json!({"status": 500})))
        .await
        .unwrap();
    assert_eq!(known.effect.state, EffectState::Failed);
    ledger
        .settle(
            &fence,
            "b/call",
            &Settlement::Abandon {
                reason: "superseded by a newer rollout".into(),
            },
        )
        .await
        .unwrap();
    assert!(ledger.in_doubt("sched").await.unwrap().is_empty());
    store.tasks().claim(&fence, "a", "w").await.unwrap();
}

/// Bad input and settles that do not apply get a typed error and write nothing, through Rust and through SQL:
/// an empty reason, an unknown key, an effect in flight, one with a final outcome, and a stale settler (audited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settling_what_is_not_in_doubt_or_with_bad_input_writes_nothing() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let lease = fixture::lease(&store, "sched").await;
    let fence = lease.fence();
    task(&store, &lease, "job").await;
    let ledger = store.effects();
    ledger
        .intend(&fence, "job", "job/launch", &json!({}))
        .await
        .unwrap();
    let written = || db.scalar("SELECT count(*) FROM pgfence.task_events");
    let before = written().await;

    let empty = ledger
        .settle(
            &fence,
            "job/launch",
            &Settlement::Abandon { reason: " ".into() },
        )
        .await;
    assert!(
        matches!(
            empty,
            Err(Error::InvalidInput {
                field: "reason",
                ..
            })
        ),
        "{empty:?}"
    );
    let bad_key = ledger.intend(&fence, "job", "", &json!({})).await;
    assert!(
        matches!(
            bad_key,
            Err(Error::InvalidInput {
                field: "effect key",
                ..
            })
        ),
        "{bad_key:?}"
    );
    let unknown = ledger
        .settle(
            &fence,
            "nope",
            &Settlement::Retry {
                observed: json!({}),
            },
        )
        .await;
    assert!(
        matches!(unknown, Err(Error::EffectNotFound { .. })),
        "{unknown:?}"
    );
    let no_task = ledger.intend(&fence, "ghost", "ghost/x", &json!({})).await;
    assert!(
        matches!(no_task, Err(Error::TaskNotFound { .. })),
        "{no_task:?}"
    );
    let in_flight = ledger
        .settle(
            &fence,
            "job/launch",
            &Settlement::Confirmed {
                observed: json!({}),
            },
        )
        .await;
    assert!(
        matches!(
            in_flight,
            Err(Error::EffectConflict {
                reason: EffectConflict::InFlight,
                ..
            })
        ),
        "{in_flight:?}"
    );
    assert_eq!(written().await, before, "nothing written by a refused call");

    ledger
        .record_outcome(&fence, "job/launch", &Outcome::Done(json!({})))
        .await
        .unwrap();
    let final_outcome = ledger
        .settle(
            &fence,
            "job/launch",
            &Settlement::Confirmed {
                observed: json!({}),
            },
        )
        .await;
    assert!(
        matches!(
            final_outcome,
            Err(Error::EffectConflict {
                reason: EffectConflict::NotInDoubt,
                ..
            })
        ),
        "{final_outcome:?}"
    );
}

/// Invariants 3 and 4 for the settle: a tenure that has ended cannot settle (refused as stale, audited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_tenure_cannot_settle_and_is_audited() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let old = fixture::lease(&store, "sched").await;
    let (fence, ledger) = (old.fence(), store.effects());
    let new = take_over(&store, "sched", "pod-b").await;
    task(&store, &new, "next").await;
    ledger
        .intend(&new.fence(), "next", "next/x", &json!({}))
        .await
        .unwrap();
    let stale = ledger
        .settle(
            &fence,
            "next/x",
            &Settlement::Confirmed {
                observed: json!({}),
            },
        )
        .await;
    assert!(matches!(stale, Err(Error::Stale { .. })), "{stale:?}");
    let audit = store
        .admin()
        .rejections(&RejectionFilter::default())
        .await
        .unwrap();
    assert!(
        audit.iter().any(|r| r.operation == "settle_effect"),
        "{audit:?}"
    );
}

/// Bad input through SQL (psql, psycopg) gets 22023 naming the argument and writes nothing: an unknown outcome or
/// resolution, an abandon without a reason, an intent without its jsonb.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ledger_input_through_sql_is_refused_and_writes_nothing() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let lease = fixture::lease(&store, "sched").await;
    let fence = lease.fence();
    task(&store, &lease, "job").await;
    store
        .effects()
        .intend(&fence, "job", "job/launch", &json!({}))
        .await
        .unwrap();
    let client = db.client().await;
    let (epoch, secret) = (
        fence.epoch().get(),
        fence.secret().expose_secret().to_owned(),
    );
    for (sql, what) in [
        ("SELECT * FROM pgfence.record_outcome('c/sched', $1, $2, 'job/launch', 'maybe', '{}')", "outcome"),
        ("SELECT * FROM pgfence.settle_effect('c/sched', $1, $2, 'job/launch', 'skipped', '{}')", "resolution"),
        ("SELECT * FROM pgfence.settle_effect('c/sched', $1, $2, 'job/launch', 'abandoned', '{}')", "reason"),
        ("SELECT * FROM pgfence.record_intent('c/sched', $1, $2, 'job', 'job/x', NULL)", "jsonb"),
    ] {
        let err = client.query(sql, &[&epoch, &secret]).await.unwrap_err();
        assert_eq!(common::sqlstate(&err), "22023", "{sql}: {err}");
        assert!(format!("{err:?}").contains(what), "{sql}: {err:?}");
    }
    assert_eq!(db.scalar("SELECT count(*) FROM pgfence.effects").await, 1);
}

/// Invariant 8: knowing an ended tenure's lease and epoch is not enough to leave evidence — a late outcome with a
/// forged secret is refused and kept nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_late_outcome_is_refused_and_not_kept() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let old = fixture::lease(&store, "sched").await;
    task(&store, &old, "job").await;
    store
        .effects()
        .intend(&old.fence(), "job", "job/launch", &json!({}))
        .await
        .unwrap();
    let _new = take_over(&store, "sched", "pod-b").await;

    let forged = common::forged_fence("c/sched", old.epoch().get());
    let refused = store
        .effects()
        .record_outcome(&forged, "job/launch", &Outcome::Done(json!({"lie": true})))
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.effect_reports")
            .await,
        0
    );
    let doubts = store.effects().in_doubt("sched").await.unwrap();
    assert!(doubts[0].late_report.is_none(), "{doubts:?}");
}

/// Invariant 9, exactly once under races: settles of one in-doubt effect released together — by connections of
/// the current tenure, and by the ended tenure at the same moment — settle it once; every other one is told it is
/// settled (by whom) or refused as stale, and the task's history holds one settle. Many rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_settles_of_one_effect_settle_it_exactly_once() {
    const ROUNDS: usize = 20;
    const RACERS: usize = 4;
    let db = TestDb::new().await;
    let store = db.store("c").await;
    for round in 0..ROUNDS {
        let name = format!("race-{round}");
        let old = fixture::lease(&store, &name).await;
        task(&store, &old, "job").await;
        store
            .effects()
            .intend(&old.fence(), "job", "job/x", &json!({}))
            .await
            .unwrap();
        let new = take_over(&store, &name, "pod-b").await;
        let barrier = Arc::new(tokio::sync::Barrier::new(RACERS + 1));
        let mut racers = Vec::new();
        for i in 0..=RACERS {
            // Racer 0 presents the ended tenure's fence; the others the current one's.
            let fence = if i == 0 { old.fence() } else { new.fence() };
            let (store, barrier) = (store.clone(), barrier.clone());
            racers.push(tokio::spawn(async move {
                barrier.wait().await;
                let settlement = if i % 2 == 0 {
                    Settlement::Confirmed {
                        observed: json!({ "racer": i }),
                    }
                } else {
                    Settlement::Retry {
                        observed: json!({ "racer": i }),
                    }
                };
                store.effects().settle(&fence, "job/x", &settlement).await
            }));
        }
        let mut settled = 0;
        for (i, racer) in racers.into_iter().enumerate() {
            match racer.await.unwrap() {
                Ok(_) => settled += 1,
                Err(Error::Stale { .. }) if i == 0 => {}
                Err(Error::EffectConflict {
                    reason: EffectConflict::Settled { by },
                    ..
                }) if i > 0 => {
                    assert_eq!(by, Some(new.epoch()), "round {round}");
                }
                // A racer that finds the retry's new attempt (open under this tenure) as the key's last one.
                Err(Error::EffectConflict {
                    reason: EffectConflict::InFlight,
                    ..
                }) if i > 0 => {}
                other => panic!("round {round}, racer {i}: {other:?}"),
            }
        }
        assert_eq!(settled, 1, "round {round}: exactly one settle");
        let settles = db
            .scalar(&format!(
                "SELECT count(*) FROM pgfence.task_events e JOIN pgfence.tasks t ON t.id = e.task_id \
                  WHERE t.lease = 'c/{name}' AND e.kind IN ('effect_confirmed', 'effect_retried')"
            ))
            .await;
        assert_eq!(settles, 1, "round {round}: one settle in the history");
    }
}

/// Invariant 8 and row-level security: a role granted another cluster sees none of this cluster's effects in
/// doubt; a granted role of this cluster writes and settles through the functions its grant lets it execute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_sees_and_settles_the_effects_of_its_own_clusters_only() {
    let db = TestDb::new().await;
    let owner = db.store("c").await;
    let (_, app) = fixture::app_store(&db, &owner, "effapp", "c").await;
    let (other_role, other) = fixture::app_store(&db, &owner, "effother", "d").await;
    let old = fixture::lease(&app, "sched").await;
    task(&app, &old, "job").await;
    app.effects()
        .intend(&old.fence(), "job", "job/x", &json!({}))
        .await
        .unwrap();
    let new = take_over(&owner, "sched", "pod-b").await;

    assert_eq!(app.effects().in_doubt("sched").await.unwrap().len(), 1);
    let client = common::client_as(&db, &other_role).await;
    let rows = client
        .query("SELECT * FROM pgfence.in_doubt_effects('c/sched')", &[])
        .await
        .unwrap();
    assert!(rows.is_empty(), "another cluster's role sees nothing");
    let seen = client
        .query("SELECT * FROM pgfence.effects", &[])
        .await
        .unwrap();
    assert!(
        seen.is_empty(),
        "row-level security hides the ledger of other clusters"
    );
    drop(other);
    app.effects()
        .settle(
            &new.fence(),
            "job/x",
            &Settlement::Confirmed {
                observed: json!({}),
            },
        )
        .await
        .unwrap();
}

/// Invariant 9, by default: the leadership runtime hands a new tenure's callback what earlier tenures left in
/// doubt (read before the callback runs), so a controller written from the README settles it before its first
/// write without remembering to look.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_tenure_s_callback_is_handed_the_effects_in_doubt() {
    use pgfence::leader::{run_with_leadership, Ended, LeadershipOptions, PgElector};
    use pgfence::reexports::tokio_util::sync::CancellationToken;

    let db = TestDb::new().await;
    let store = db.store("c").await;
    let old = fixture::lease(&store, "ctl").await;
    task(&store, &old, "job").await;
    store
        .effects()
        .intend(&old.fence(), "job", "job/launch", &json!({"n": 1}))
        .await
        .unwrap();
    store.release(&old).await.unwrap();

    let elector = PgElector::new(store.clone());
    let (sender, handed) = tokio::sync::oneshot::channel();
    let options = LeadershipOptions::new(std::time::Duration::from_secs(30));
    let ended = run_with_leadership(
        &elector,
        "ctl",
        "pod-b",
        &options,
        &CancellationToken::new(),
        move |ctx| async move {
            let _ = sender.send((ctx.epoch(), ctx.in_doubt().to_vec()));
            Ok::<(), std::convert::Infallible>(())
        },
    )
    .await
    .unwrap();
    assert!(matches!(ended, Ended::Returned), "{ended:?}");
    let (epoch, doubts) = handed.await.unwrap();
    assert!(epoch > old.epoch());
    assert_eq!(doubts.len(), 1, "{doubts:?}");
    assert_eq!(doubts[0].effect.key, "job/launch");
    assert_eq!(doubts[0].tenure.end_reason.as_deref(), Some("released"));
}
