//! Guarded writes: the task/event operations, the generic fenced transaction, the audit of rejected writes,
//! the lock ordering that makes the guard linearizable, and raw-SQL enforcement.
//!
//! Invariants checked: 3 (stale writes never commit after a takeover), 4 (refusals are typed errors and audit
//! rows), 6 (a retry by stable key has exactly one effect).

use crate::common;

use std::time::Duration;

use common::fixture::take_over;
use common::{move_shard, wait_until_blocked_on_lock, TestDb};
use pgfence::admin::RejectionFilter;
use pgfence::schema::GUARD_LOCK_CLASS;
use pgfence::tasks::TaskState;
use pgfence::{Error, Fence, LossReason, Next, Store};
use serde_json::json;

const TTL: Duration = Duration::from_secs(60);

async fn app_table(db: &TestDb) {
    db.client()
        .await
        .batch_execute(common::SHARDS_TABLE)
        .await
        .unwrap();
}

/// The task life cycle under one tenure: create (idempotent by key, one event), claim (the pending guard),
/// transition, append; each write raises the row fence and appends exactly one event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_life_cycle_writes_one_event_per_effect() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let lease = store.acquire("sched", "pod-a", TTL).await.unwrap();
    let fence = lease.fence();

    let created = store
        .tasks()
        .create(&fence, "job-1", &json!({"image": "api:1"}))
        .await
        .unwrap();
    assert!(created.created);
    assert_eq!(created.task.state, TaskState::Pending);
    assert_eq!(created.task.payload, json!({"image": "api:1"}));
    assert_eq!(created.task.fence, lease.epoch());

    // Invariant 6: a retry by stable key returns the same task and adds no event.
    let retried = store
        .tasks()
        .create(&fence, "job-1", &json!({"image": "other"}))
        .await
        .unwrap();
    assert!(!retried.created);
    assert_eq!(retried.task.id, created.task.id);
    assert_eq!(retried.event_id, None);
    assert_eq!(retried.task.payload, json!({"image": "api:1"}));

    let claimed = store
        .tasks()
        .claim(&fence, "job-1", "worker-7")
        .await
        .unwrap();
    assert_eq!(claimed.task.state, TaskState::Claimed);
    assert_eq!(claimed.task.assignee.as_deref(), Some("worker-7"));
    assert_eq!(claimed.task.version, 2);

    let running = store
        .tasks()
        .transition(
            &fence,
            "job-1",
            TaskState::Claimed,
            TaskState::Running,
            &json!({}),
        )
        .await
        .unwrap();
    assert_eq!(running.task.state, TaskState::Running);
    store
        .tasks()
        .append_event(&fence, "job-1", "progress", &json!({"pct": 50}))
        .await
        .unwrap();
    store
        .tasks()
        .transition(
            &fence,
            "job-1",
            TaskState::Running,
            TaskState::Succeeded,
            &json!({"ok": true}),
        )
        .await
        .unwrap();

    let kinds: Vec<String> = store
        .tasks()
        .events("sched", "job-1")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        ["created", "claimed", "running", "progress", "succeeded"]
    );
    let task = store.tasks().get("sched", "job-1").await.unwrap().unwrap();
    assert_eq!(task.state, TaskState::Succeeded);
    assert_eq!(
        store
            .admin()
            .rejections(&RejectionFilter::default())
            .await
            .unwrap()
            .len(),
        0
    );
}

/// A business-guard failure (claiming a task that is not pending, a transition from the wrong state, a missing
/// task) is its own error and not a fencing rejection: nothing is audited, nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn business_guard_failures_are_not_fencing_rejections() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let fence = store.acquire("sched", "pod-a", TTL).await.unwrap().fence();
    store
        .tasks()
        .create(&fence, "job-1", &json!({}))
        .await
        .unwrap();
    store.tasks().claim(&fence, "job-1", "w1").await.unwrap();
    match store.tasks().claim(&fence, "job-1", "w2").await {
        Err(Error::Conflict {
            expected, actual, ..
        }) => {
            assert_eq!(expected, TaskState::Pending);
            assert_eq!(actual, TaskState::Claimed);
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert!(matches!(
        store
            .tasks()
            .transition(
                &fence,
                "job-1",
                TaskState::Running,
                TaskState::Failed,
                &json!({})
            )
            .await,
        Err(Error::Conflict {
            actual: TaskState::Claimed,
            ..
        })
    ));
    assert!(matches!(
        store.tasks().claim(&fence, "nope", "w1").await,
        Err(Error::TaskNotFound { .. })
    ));
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.rejections").await,
        0
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.task_events").await,
        2
    );
}

/// Concurrent claims of one pending task: exactly one assignee wins (the conditional pending guard).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_have_exactly_one_winner() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let fence = store.acquire("sched", "pod-a", TTL).await.unwrap().fence();
    for round in 0..30 {
        let key = format!("job-{round}");
        store
            .tasks()
            .create(&fence, &key, &json!({}))
            .await
            .unwrap();
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(4));
        let handles: Vec<_> = (0..4)
            .map(|w| {
                let (store, fence, key, barrier) =
                    (store.clone(), fence.clone(), key.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.tasks().claim(&fence, &key, &format!("w{w}")).await
                })
            })
            .collect();
        let mut wins = 0;
        for h in handles {
            match h.await.unwrap() {
                Ok(_) => wins += 1,
                Err(Error::Conflict { .. }) => {}
                Err(other) => panic!("{other}"),
            }
        }
        assert_eq!(wins, 1, "round {round}");
    }
}

/// Invariant 3 and 4 for every write kind: after a takeover, each operation presenting the old epoch is refused
/// with `Error::Stale` and recorded in `pgfence.rejections` with its context; nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_write_after_takeover_is_rejected_and_audited() {
    let db = TestDb::new().await;
    app_table(&db).await;
    let store = db.store("c").await;
    let old = store.acquire("sched", "pod-a", TTL).await.unwrap();
    store
        .tasks()
        .create(&old.fence(), "job-1", &json!({}))
        .await
        .unwrap();
    store.release(&old).await.unwrap();
    let new = store.acquire("sched", "pod-b", TTL).await.unwrap();
    let stale = old.fence();
    let tasks_before = db.scalar("SELECT count(*) FROM pgfence.task_events").await;

    let results = vec![
        (
            "create_task",
            store
                .tasks()
                .create(&stale, "job-2", &json!({}))
                .await
                .map(|_| ()),
        ),
        (
            "claim_task",
            store.tasks().claim(&stale, "job-1", "w").await.map(|_| ()),
        ),
        (
            "transition_task",
            store
                .tasks()
                .transition(
                    &stale,
                    "job-1",
                    TaskState::Pending,
                    TaskState::Cancelled,
                    &json!({}),
                )
                .await
                .map(|_| ()),
        ),
        (
            "append_event",
            store
                .tasks()
                .append_event(&stale, "job-1", "x", &json!({}))
                .await
                .map(|_| ()),
        ),
        (
            "move_shard",
            move_shard(&store, &stale, "pod-a").await.map(|_| ()),
        ),
    ];
    for (operation, result) in &results {
        match result {
            Err(Error::Stale {
                lease,
                presented,
                current,
                reason,
                operation: op,
            }) => {
                assert_eq!(lease, "c/sched");
                assert_eq!(*presented, old.epoch());
                assert_eq!(*current, Some(new.epoch()));
                assert_eq!(*reason, LossReason::Superseded);
                assert_eq!(op, operation);
            }
            other => panic!("{operation}: expected Stale, got {other:?}"),
        }
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.task_events").await,
        tasks_before
    );
    assert_eq!(db.scalar("SELECT count(*) FROM shards").await, 0);
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.tasks WHERE key = 'job-2'")
            .await,
        0
    );

    let mut filter = RejectionFilter::default();
    filter.lease = Some("sched".into());
    let audit = store.admin().rejections(&filter).await.unwrap();
    assert_eq!(audit.len(), results.len());
    let mut ops: Vec<&str> = audit.iter().map(|r| r.operation.as_str()).collect();
    ops.sort();
    assert_eq!(
        ops,
        [
            "append_event",
            "claim_task",
            "create_task",
            "move_shard",
            "transition_task"
        ]
    );
    for row in &audit {
        assert_eq!(row.lease, "c/sched");
        assert_eq!(row.presented_epoch, old.epoch().get());
        assert_eq!(row.current_epoch, Some(new.epoch().get()));
        assert_eq!(row.current_holder.as_deref(), Some("pod-b"));
        assert_eq!(row.reason, "superseded");
        assert_eq!(row.application_name.as_deref(), Some("pgfence"));
        assert_eq!(row.client_addr.as_deref(), Some("127.0.0.1"));
        assert!(row.backend_pid > 0);
    }
    let claim = audit.iter().find(|r| r.operation == "claim_task").unwrap();
    assert_eq!(claim.target_table.as_deref(), Some("tasks"));
    assert_eq!(claim.target_key.as_deref(), Some("job-1"));
}

/// Invariant 4, read back as the operator filters it: the audit of a store's cluster by default, of one lease
/// of it (a name that merely starts with it is another lease), or of every cluster in the database (the lease
/// filter then ignored); newest first, cut by `limit` (at least 1) and `since`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_are_listed_per_cluster_per_lease_or_for_every_cluster() {
    let db = TestDb::new().await;
    let (a, b) = (db.store("a").await, db.store("b").await);
    for (store, lease) in [(&a, "sched"), (&a, "sched2"), (&b, "sched")] {
        let first = store.acquire(lease, "pod", TTL).await.unwrap().fence();
        store.admin().force_release(lease).await.unwrap();
        let refused = store.tasks().create(&first, "k", &json!({})).await;
        assert!(matches!(refused, Err(Error::Stale { .. })), "{refused:?}");
    }
    let list =
        async |store: &Store, lease: Option<&str>, all_clusters: bool, limit: Option<i64>| {
            let mut filter = RejectionFilter::default();
            filter.lease = lease.map(str::to_owned);
            filter.all_clusters = all_clusters;
            filter.limit = limit;
            let rows = store.admin().rejections(&filter).await.unwrap();
            rows.into_iter().map(|r| r.lease).collect::<Vec<_>>()
        };
    assert_eq!(list(&a, None, false, None).await, ["a/sched2", "a/sched"]);
    assert_eq!(list(&a, Some("sched"), false, None).await, ["a/sched"]);
    assert_eq!(list(&b, None, false, None).await, ["b/sched"]);
    let every = ["b/sched", "a/sched2", "a/sched"];
    assert_eq!(list(&a, None, true, None).await, every);
    assert_eq!(list(&a, Some("sched"), true, None).await, every);
    assert_eq!(list(&a, None, true, Some(1)).await, ["b/sched"]);
    let mut filter = RejectionFilter::default();
    filter.limit = Some(0);
    match a.admin().rejections(&filter).await {
        Err(Error::InvalidInput { field, .. }) => assert_eq!(field, "limit"),
        other => panic!("expected InvalidInput for limit 0, got {other:?}"),
    }
    let mut filter = RejectionFilter::default();
    filter.all_clusters = true;
    // An hour past the database's clock (never this process's).
    let later = db
        .scalar("SELECT (extract(epoch FROM now() + interval '1 hour') * 1000000)::bigint")
        .await;
    filter.since = Some(chrono::DateTime::from_timestamp_micros(later).unwrap());
    assert!(a.admin().rejections(&filter).await.unwrap().is_empty());
}

/// Writes after release, after force-release, after expiry and with a never-issued epoch are refused with the
/// matching reason, and each is audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_stale_epoch_is_refused_with_its_reason() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let a = store.acquire("l1", "pod-a", TTL).await.unwrap();
    store.release(&a).await.unwrap();
    let released = store.tasks().create(&a.fence(), "k", &json!({})).await;
    assert!(
        matches!(
            released,
            Err(Error::Stale {
                reason: LossReason::Released,
                ..
            })
        ),
        "{released:?}"
    );

    let b = store.acquire("l2", "pod-a", TTL).await.unwrap();
    store.admin().force_release("l2").await.unwrap();
    let forced = store.tasks().create(&b.fence(), "k", &json!({})).await;
    assert!(
        matches!(
            forced,
            Err(Error::Stale {
                reason: LossReason::Released,
                ..
            })
        ),
        "{forced:?}"
    );

    let c = store
        .acquire("l3", "pod-a", Duration::from_millis(200))
        .await
        .unwrap();
    while store.lease_status("l3").await.unwrap().unwrap().state == pgfence::LeaseState::Held {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let expired = store.tasks().create(&c.fence(), "k", &json!({})).await;
    assert!(
        matches!(
            expired,
            Err(Error::Stale {
                reason: LossReason::Expired,
                ..
            })
        ),
        "{expired:?}"
    );

    let d = store.acquire("l4", "pod-a", TTL).await.unwrap();
    let future = common::forged_fence("c/l4", d.epoch().get() + 1);
    let bogus = store.tasks().create(&future, "k", &json!({})).await;
    assert!(
        matches!(
            bogus,
            Err(Error::Stale {
                reason: LossReason::FutureEpoch,
                ..
            })
        ),
        "{bogus:?}"
    );

    let unknown = common::forged_fence("c/never", 1);
    let missing = store.tasks().create(&unknown, "k", &json!({})).await;
    assert!(
        matches!(
            missing,
            Err(Error::Stale {
                reason: LossReason::UnknownLease,
                current: None,
                ..
            })
        ),
        "{missing:?}"
    );

    let reasons: Vec<String> = store
        .admin()
        .rejections(&RejectionFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.reason)
        .collect();
    assert_eq!(
        reasons,
        [
            "unknown_lease",
            "future_epoch",
            "expired",
            "released",
            "released"
        ]
    );
    assert_eq!(db.scalar("SELECT count(*) FROM pgfence.tasks").await, 0);
}

/// The generic fenced transaction commits the caller's statements when the fence is current, rolls them back
/// when the caller fails, and on a stale fence runs nothing but keeps the audit row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_transaction_commits_rolls_back_and_refuses() {
    let db = TestDb::new().await;
    app_table(&db).await;
    let store = db.store("c").await;
    let lease = store.acquire("rebalancer", "pod-a", TTL).await.unwrap();
    assert_eq!(
        move_shard(&store, &lease.fence(), "node-1").await.unwrap(),
        1
    );

    let failed: Result<(), Error> = store
        .fenced(&lease.fence(), "move_shard", async |conn| {
            use diesel_async::RunQueryDsl;
            diesel::sql_query("UPDATE shards SET owner = 'node-2'")
                .execute(conn)
                .await?;
            diesel::sql_query("SELECT 1/0").execute(conn).await?;
            Ok(())
        })
        .await;
    assert!(matches!(failed, Err(Error::Database { .. })), "{failed:?}");
    let client = db.client().await;
    let owner: String = client
        .query_one("SELECT owner FROM shards", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(owner, "node-1", "the failed transaction rolled back");

    let successor = store.acquire("rebalancer", "pod-b", TTL).await;
    assert!(matches!(successor, Err(Error::Held { .. })));
    store.release(&lease).await.unwrap();
    store.acquire("rebalancer", "pod-b", TTL).await.unwrap();
    assert!(matches!(
        move_shard(&store, &lease.fence(), "node-3").await,
        Err(Error::Stale { .. })
    ));
    let owner: String = client
        .query_one("SELECT owner FROM shards", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(owner, "node-1");
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.rejections WHERE operation = 'move_shard'")
            .await,
        1
    );
}

/// Invariant 3, the lock ordering itself: a stale write issued while a takeover is in flight (uncommitted)
/// waits for it, then sees the new epoch and is refused — it does not slip through on an old snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_during_an_uncommitted_takeover_waits_and_is_refused() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let lease = store.acquire("sched", "pod-a", TTL).await.unwrap();
    store
        .tasks()
        .create(&lease.fence(), "job", &json!({}))
        .await
        .unwrap();

    let takeover = db.client().await;
    takeover.batch_execute("BEGIN").await.unwrap();
    let row = takeover
        .query_one(
            "SELECT (pgfence.acquire('c/sched', 'pod-a', 60000)).epoch",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 2);

    let (store2, fence) = (store.clone(), lease.fence());
    let write = tokio::spawn(async move {
        store2
            .tasks()
            .append_event(&fence, "job", "late", &json!({}))
            .await
    });
    wait_until_blocked_on_lock(&db, 1).await;
    takeover.batch_execute("COMMIT").await.unwrap();
    let result = write.await.unwrap();
    assert!(
        matches!(
            result,
            Err(Error::Stale {
                reason: LossReason::Superseded,
                ..
            })
        ),
        "{result:?}"
    );
}

/// What a controller does after a real refusal: the write of a superseded tenure is refused as `Stale`
/// (superseded) and its error says campaign again ([`Next::Recampaign`]) — as do the renewal of that tenure and a
/// rival's acquisition while the lease is held — while the new tenure's write goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_writes_error_says_recampaign() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let mut old = store.acquire("sched", "pod-a", TTL).await.unwrap();
    // The same holder acquiring again supersedes its earlier tenure at once.
    let new = store.acquire("sched", "pod-a", TTL).await.unwrap();
    assert_eq!(new.epoch().get(), old.epoch().get() + 1);

    let refused = store
        .tasks()
        .create(&old.fence(), "job", &json!({}))
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            Error::Stale {
                reason: LossReason::Superseded,
                ..
            }
        ),
        "{refused:?}"
    );
    assert_eq!(refused.next(), Next::Recampaign);
    let lost = store.renew(&mut old).await.unwrap_err();
    assert!(
        matches!(
            lost,
            Error::Lost {
                reason: LossReason::Superseded,
                ..
            }
        ),
        "{lost:?}"
    );
    assert_eq!(lost.next(), Next::Recampaign);
    let held = store.acquire("sched", "pod-b", TTL).await.unwrap_err();
    assert!(matches!(held, Error::Held { .. }), "{held:?}");
    assert_eq!(held.next(), Next::Recampaign);
    store
        .tasks()
        .create(&new.fence(), "job", &json!({}))
        .await
        .unwrap();
}

/// The other direction: a takeover waits for a fenced transaction that already passed its check, so that
/// transaction's writes commit before the new epoch exists. A renewal, which only moves the expiry, does not
/// wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_waits_for_a_fenced_transaction_in_flight_but_a_renewal_does_not() {
    let db = TestDb::new().await;
    app_table(&db).await;
    let store = db.store("c").await;
    let mut lease = store.acquire("sched", "pod-a", TTL).await.unwrap();

    let (checked_tx, checked_rx) = tokio::sync::oneshot::channel::<()>();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let (store2, fence) = (store.clone(), lease.fence());
    let fenced = tokio::spawn(async move {
        store2
            .fenced(&fence, "slow_move", async move |conn| {
                use diesel_async::RunQueryDsl;
                diesel::sql_query("INSERT INTO shards VALUES (1, 'pod-a')")
                    .execute(conn)
                    .await?;
                checked_tx.send(()).unwrap();
                finish_rx.await.unwrap();
                Ok::<_, Error>(())
            })
            .await
    });
    checked_rx.await.unwrap();

    // The renewal completes while the fenced transaction is open (a timeout, so a blocked renewal fails the test
    // instead of hanging it).
    tokio::time::timeout(Duration::from_secs(5), store.renew(&mut lease))
        .await
        .expect("renewal waited for a guarded write")
        .unwrap();

    let store3 = store.clone();
    let takeover = tokio::spawn(async move { store3.acquire("sched", "pod-a", TTL).await });
    wait_until_blocked_on_lock(&db, 1).await;
    assert!(!takeover.is_finished());
    finish_tx.send(()).unwrap();
    fenced.await.unwrap().unwrap();
    let new = takeover.await.unwrap().unwrap();
    assert_eq!(new.epoch().get(), 2);
    assert_eq!(db.scalar("SELECT count(*) FROM shards").await, 1);
}

/// The guard and the audit work from plain SQL, in the form the README shows (`SELECT * FROM f(…)`): each
/// statement calls the function once (one epoch per acquisition, one audit row per refusal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_and_audit_are_usable_from_plain_sql() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let acquire =
        "SELECT outcome, epoch, secret FROM pgfence.acquire('prod/scheduler', 'psql-1', 15000)";
    let row = client.query_one(acquire, &[]).await.unwrap();
    assert_eq!(
        (row.get::<_, String>(0), row.get::<_, i64>(1)),
        ("acquired".to_owned(), 1)
    );
    let secret: String = row.get(2);
    let all = client
        .query_one(
            "SELECT * FROM pgfence.create_task('prod/scheduler', 1, $1, 'job-1', '{}')",
            &[&secret],
        )
        .await
        .unwrap();
    assert_eq!(all.get::<_, String>("outcome"), "ok");
    assert!(all.get::<_, bool>("created"));
    let row = client.query_one(acquire, &[]).await.unwrap();
    assert_eq!(row.get::<_, i64>(1), 2, "one call, one new epoch");
    let stale = client
        .query_one(
            "SELECT * FROM pgfence.claim_task('prod/scheduler', 1, $1, 'job-1', 'w')",
            &[&secret],
        )
        .await
        .unwrap();
    assert_eq!(stale.get::<_, String>("outcome"), "refused");
    assert_eq!(stale.get::<_, Option<i64>>("current_epoch"), Some(2));
    client.batch_execute("BEGIN").await.unwrap();
    let fenced = client
        .query_one(
            "SELECT outcome FROM pgfence.fence('prod/scheduler', 1, $1, 'psql_update', NULL, NULL)",
            &[&secret],
        )
        .await
        .unwrap();
    assert_eq!(fenced.get::<_, String>(0), "refused");
    client.batch_execute("COMMIT").await.unwrap();
    let rows = client
        .query(
            "SELECT operation, presented_epoch, current_epoch FROM pgfence.rejections ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(String, i64, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        got,
        [
            ("claim_task".to_owned(), 1, 2),
            ("psql_update".to_owned(), 1, 2)
        ]
    );
    let err = client
        .query_one(
            "SELECT * FROM pgfence.acquire('prod/scheduler', 'x', 0)",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code().unwrap().code(), "22023");
}

/// With enforcement on, raw SQL that does not carry the lease's current epoch is refused by the database
/// (SQLSTATE PF001), and so is raw SQL that carries it outside a transaction that presented the tenure's secret
/// to the guard (knowing the epoch is not enough); raw SQL in a fenced transaction is accepted, DELETE is
/// refused; with it off, raw SQL is not checked.
/// Task events are append-only either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enforcement_refuses_raw_sql_without_the_current_epoch() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let old = store.acquire("sched", "pod-a", TTL).await.unwrap();
    store
        .tasks()
        .create(&old.fence(), "job", &json!({}))
        .await
        .unwrap();
    let new = store.acquire("sched", "pod-a", TTL).await.unwrap();
    assert_eq!(
        store.admin().enforcement().await.unwrap(),
        pgfence::admin::Enforcement::Off
    );
    store
        .admin()
        .set_enforcement(pgfence::admin::Enforcement::Error)
        .await
        .unwrap();
    assert_eq!(
        store.admin().enforcement().await.unwrap(),
        pgfence::admin::Enforcement::Error
    );

    let client = db.client().await;
    let code = |e: tokio_postgres::Error| e.code().map(|c| c.code().to_owned());
    let stale = client
        .execute(
            "UPDATE pgfence.tasks SET state = 'cancelled', fence = $1",
            &[&old.epoch().get()],
        )
        .await
        .unwrap_err();
    assert_eq!(code(stale).as_deref(), Some("PF001"));
    let no_epoch = client
        .execute("UPDATE pgfence.tasks SET state = 'cancelled'", &[])
        .await
        .unwrap_err();
    assert_eq!(code(no_epoch).as_deref(), Some("PF001"));
    let insert = client
        .execute(
            "INSERT INTO pgfence.task_events (task_id, lease, epoch, kind) SELECT id, lease, $1, 'raw' FROM pgfence.tasks",
            &[&old.epoch().get()],
        )
        .await
        .unwrap_err();
    assert_eq!(code(insert).as_deref(), Some("PF001"));
    let delete = client
        .execute("DELETE FROM pgfence.tasks", &[])
        .await
        .unwrap_err();
    assert_eq!(code(delete).as_deref(), Some("PF001"));
    // Knowing the current epoch is not enough: the transaction must present the tenure's secret to the guard.
    let forged = client
        .execute(
            "UPDATE pgfence.tasks SET state = 'cancelled', fence = $1",
            &[&new.epoch().get()],
        )
        .await
        .unwrap_err();
    assert_eq!(code(forged).as_deref(), Some("PF001"));
    client.batch_execute("BEGIN").await.unwrap();
    let fenced: String = client
        .query_one(
            "SELECT outcome FROM pgfence.fence($1, $2, $3, 'fenced_transaction', NULL, NULL)",
            &[
                &new.qualified_name(),
                &new.epoch().get(),
                &new.fence().secret().expose_secret(),
            ],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(fenced, "ok");
    assert_eq!(
        client
            .execute(
                "UPDATE pgfence.tasks SET state = 'cancelled', fence = $1",
                &[&new.epoch().get()]
            )
            .await
            .unwrap(),
        1
    );
    client.batch_execute("COMMIT").await.unwrap();
    // pgfence's own writes pass the trigger by construction.
    store
        .tasks()
        .create(&new.fence(), "job-2", &json!({}))
        .await
        .unwrap();

    let mutate_event = client
        .execute("UPDATE pgfence.task_events SET kind = 'x'", &[])
        .await
        .unwrap_err();
    assert_eq!(code(mutate_event).as_deref(), Some("PF002"));

    store
        .admin()
        .set_enforcement(pgfence::admin::Enforcement::Off)
        .await
        .unwrap();
    client
        .execute("UPDATE pgfence.tasks SET state = 'pending'", &[])
        .await
        .unwrap();
    let mutate_event = client
        .execute("DELETE FROM pgfence.task_events", &[])
        .await
        .unwrap_err();
    assert_eq!(code(mutate_event).as_deref(), Some("PF002"));
}

/// Bad task input (empty or NUL keys, NUL inside JSON strings, oversized or deeply nested payloads, bad kinds)
/// is a typed error before anything reaches the database: no row and no audit entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_task_input_is_refused_and_writes_nothing() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let fence = store.acquire("sched", "pod-a", TTL).await.unwrap().fence();
    let mut deep = json!(1);
    for _ in 0..(pgfence::limits::MAX_PAYLOAD_DEPTH + 1) {
        deep = json!([deep]);
    }
    let huge = json!({"blob": "x".repeat(pgfence::limits::MAX_PAYLOAD_BYTES)});
    let results = vec![
        store.tasks().create(&fence, "", &json!({})).await,
        store.tasks().create(&fence, "a\0b", &json!({})).await,
        store
            .tasks()
            .create(&fence, &"k".repeat(300), &json!({}))
            .await,
        store
            .tasks()
            .create(&fence, "k", &json!({"s": "nul\u{0}"}))
            .await,
        store
            .tasks()
            .create(&fence, "k", &json!({"nul\u{0}key": 1}))
            .await,
        store.tasks().create(&fence, "k", &deep).await,
        store.tasks().create(&fence, "k", &huge).await,
        store.tasks().claim(&fence, "k", "").await,
        store
            .tasks()
            .append_event(&fence, "k", "", &json!({}))
            .await,
        store
            .tasks()
            .append_event(&fence, "k", &"e".repeat(65), &json!({}))
            .await,
    ];
    for (i, result) in results.iter().enumerate() {
        assert!(
            matches!(result, Err(Error::InvalidInput { .. })),
            "case {i}: {result:?}"
        );
    }
    assert_eq!(db.scalar("SELECT count(*) FROM pgfence.tasks").await, 0);
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.rejections").await,
        0
    );
}

/// A guarded write is one statement, prepared once per connection and reused: after 20 calls on a one-connection
/// pool, the server holds exactly one prepared statement for `pgfence.create_task`, executed 20 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_writes_reuse_one_prepared_statement() {
    use diesel::sql_types::BigInt;
    use diesel_async::RunQueryDsl;
    let db = TestDb::new().await;
    let store = Store::connect(db.config("c").pool_size(1)).await.unwrap();
    let fence = store.acquire("sched", "pod-a", TTL).await.unwrap().fence();
    for i in 0..20 {
        store
            .tasks()
            .create(&fence, &format!("job-{i}"), &json!({}))
            .await
            .unwrap();
    }
    #[derive(diesel::QueryableByName, Debug)]
    struct Prepared {
        #[diesel(sql_type = BigInt)]
        statements: i64,
        #[diesel(sql_type = BigInt)]
        executions: i64,
    }
    let mut conn = store.admin().conn().await.unwrap();
    let prepared: Prepared = diesel::sql_query(
        "SELECT count(*) AS statements, coalesce(sum(generic_plans + custom_plans), 0)::bigint AS executions \
           FROM pg_prepared_statements WHERE statement LIKE 'SELECT * FROM pgfence.create_task(%'",
    )
    .get_result(&mut *conn)
    .await
    .unwrap();
    assert_eq!(prepared.statements, 1, "{prepared:?}");
    assert_eq!(prepared.executions, 20, "{prepared:?}");
}

/// A cancelled fenced transaction (its future dropped while the transaction is open and holds the lease row's
/// share lock) never leaves a pooled connection inside that transaction: the pool discards the connection, the
/// server ends the transaction, and a takeover from another process completes promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_fenced_transaction_leaves_no_lock_behind() {
    let db = TestDb::new().await;
    app_table(&db).await;
    let store = Store::connect(db.config("c").pool_size(1)).await.unwrap();
    let lease = store.acquire("sched", "pod-a", TTL).await.unwrap();

    let (inside_tx, inside_rx) = tokio::sync::oneshot::channel::<()>();
    let (store2, fence) = (store.clone(), lease.fence());
    let fenced = tokio::spawn(async move {
        store2
            .fenced(&fence, "never_finishes", async move |conn| {
                use diesel_async::RunQueryDsl;
                diesel::sql_query("INSERT INTO shards VALUES (1, 'pod-a')")
                    .execute(conn)
                    .await?;
                inside_tx.send(()).unwrap();
                std::future::pending::<()>().await;
                Ok::<_, Error>(())
            })
            .await
    });
    inside_rx.await.unwrap();
    fenced.abort();
    assert!(fenced.await.unwrap_err().is_cancelled());

    // Another process takes over: it must not wait for a transaction nobody will ever finish.
    let other = db.store("c").await;
    let takeover = tokio::time::timeout(
        Duration::from_secs(10),
        other.acquire("sched", "pod-a", TTL),
    )
    .await;
    let new = takeover
        .expect("takeover blocked by a leaked transaction")
        .unwrap();
    assert_eq!(new.epoch().get(), 2);
    assert_eq!(
        db.scalar("SELECT count(*) FROM shards").await,
        0,
        "the cancelled transaction rolled back"
    );
    // The one-connection pool still works: the broken connection was replaced.
    let result = store
        .tasks()
        .create(&new.fence(), "job", &json!({}))
        .await
        .unwrap();
    assert!(result.created);
}

/// Invariants 3 and 4 when the session default is REPEATABLE READ: a stale write issued during an uncommitted
/// takeover is still refused *and audited* (single-statement writes retry once in a fresh snapshot; fenced
/// transactions run at READ COMMITTED), never committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_writes_are_refused_and_audited_under_repeatable_read() {
    let db = TestDb::new().await;
    app_table(&db).await;
    db.client()
        .await
        .batch_execute(&format!(
            "ALTER DATABASE {} SET default_transaction_isolation = 'repeatable read'",
            db.name
        ))
        .await
        .unwrap();
    let store = db.store("c").await;
    let first = store.acquire("sched", "pod-a", TTL).await.unwrap();
    store
        .tasks()
        .create(&first.fence(), "job", &json!({}))
        .await
        .unwrap();

    for round in 0..2 {
        // The fence is current until the takeover below, so the write really has to wait for it.
        let lease = store.acquire("sched", "pod-a", TTL).await.unwrap();
        let takeover = db.client().await;
        takeover
            .batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
            .await
            .unwrap();
        takeover
            .query_one(
                "SELECT epoch FROM pgfence.acquire('c/sched', 'pod-a', 60000)",
                &[],
            )
            .await
            .unwrap();
        let (store2, fence) = (store.clone(), lease.fence());
        let write = tokio::spawn(async move {
            if round == 0 {
                store2
                    .tasks()
                    .append_event(&fence, "job", "late", &json!({}))
                    .await
                    .map(|_| ())
            } else {
                move_shard(&store2, &fence, "pod-a").await.map(|_| ())
            }
        });
        wait_until_blocked_on_lock(&db, 1).await;
        takeover.batch_execute("COMMIT").await.unwrap();
        let result = write.await.unwrap();
        assert!(
            matches!(result, Err(Error::Stale { .. })),
            "round {round}: {result:?}"
        );
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.rejections").await,
        2
    );
    assert_eq!(db.scalar("SELECT count(*) FROM shards").await, 0);
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.task_events WHERE kind = 'late'")
            .await,
        0
    );
}

/// A lease call abandoned while it waits (a timeout around `acquire`) is cancelled on the server, not left to
/// complete behind the caller's back: once the lock it waited for is free, it has not acquired anything, and
/// the pool's connection was replaced rather than reused mid-statement. The takeover grace is raised to a
/// minute first, so that the function's own bounded lock wait (grace + 5 s) cannot end the wait within the
/// 10 s this test allows: only the cancel request can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_acquire_is_cancelled_on_the_server() {
    let db = TestDb::new().await;
    db.client()
        .await
        .query_one("SELECT pgfence.set_takeover_grace('60 seconds')", &[])
        .await
        .unwrap();
    let store = Store::connect(db.config("c").pool_size(1)).await.unwrap();
    let first = store.acquire("sched", "pod-a", TTL).await.unwrap();
    store.release(&first).await.unwrap();

    let blocker = db.client().await;
    blocker.batch_execute("BEGIN").await.unwrap();
    blocker
        .query_one(
            "SELECT 1 FROM pgfence.leases WHERE name = 'c/sched' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
    let store2 = store.clone();
    let attempt = tokio::spawn(async move { store2.acquire("sched", "pod-b", TTL).await });
    wait_until_blocked_on_lock(&db, 1).await;
    attempt.abort();
    assert!(attempt.await.unwrap_err().is_cancelled());
    // The cancel request travels asynchronously: wait until the server has dropped the waiting statement
    // (without the cancel it would wait on the lock until the blocker lets go, then commit).
    let observer = db.client().await;
    common::wait_for_lock_waiters(
        &observer,
        Duration::from_secs(10),
        |n| n == 0,
        "the abandoned acquire is still waiting for the lock",
    )
    .await;
    blocker.batch_execute("ROLLBACK").await.unwrap();

    // Wait until no acquisition is running any more, then look at the outcome.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let running: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                   AND state = 'active' AND query LIKE '%pgfence.acquire%' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if running == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the abandoned acquire is still running"
        );
        tokio::task::yield_now().await;
    }
    let status = store.lease_status("sched").await.unwrap().unwrap();
    assert_eq!(status.state, pgfence::LeaseState::Released, "{status:?}");
    assert_eq!(status.epoch, Some(first.epoch()));
    // The one-connection pool works again.
    let next = store.acquire("sched", "pod-c", TTL).await.unwrap();
    assert_eq!(next.epoch().get(), first.epoch().get() + 1);
}

/// The row fence, defence in depth behind the lease guard: a task row last written by a higher epoch than the one
/// presented refuses claim, transition and append even when the presented epoch is the lease's current one
/// (reason `row_fence`, audited, nothing written). The higher fence is set by the owner directly, the only way it
/// can get ahead of the lease while the lease guard is correct.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_fence_above_the_presented_epoch_refuses_the_write() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let fence = store.acquire("rf", "pod-a", TTL).await.unwrap().fence();
    store.tasks().create(&fence, "k", &json!({})).await.unwrap();
    db.client()
        .await
        .batch_execute("UPDATE pgfence.tasks SET fence = fence + 10 WHERE key = 'k'")
        .await
        .unwrap();
    let events_before = db.scalar("SELECT count(*) FROM pgfence.task_events").await;
    let refused = [
        store.tasks().claim(&fence, "k", "w-1").await.err(),
        store
            .tasks()
            .transition(
                &fence,
                "k",
                TaskState::Pending,
                TaskState::Cancelled,
                &json!({}),
            )
            .await
            .err(),
        store
            .tasks()
            .append_event(&fence, "k", "note", &json!({}))
            .await
            .err(),
    ];
    for (operation, err) in ["claim_task", "transition_task", "append_event"]
        .iter()
        .zip(refused)
    {
        match err {
            Some(Error::Stale {
                reason: LossReason::RowFence,
                current,
                ..
            }) => assert_eq!(current.map(|e| e.get()), Some(fence.epoch().get() + 10)),
            other => panic!("{operation}: expected a row_fence refusal, got {other:?}"),
        }
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.task_events").await,
        events_before,
        "nothing written"
    );
    assert_eq!(
        db.scalar("SELECT (state = 'pending')::int::bigint FROM pgfence.tasks WHERE key = 'k'")
            .await,
        1
    );
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM pgfence.rejections WHERE reason = 'row_fence' \
              AND operation IN ('claim_task', 'transition_task', 'append_event')"
        )
        .await,
        3,
        "each refusal audited"
    );
}

/// A fenced transaction's operation label is checked before anything is sent: 1 to 64 characters, no control
/// characters. Exactly 64 is accepted; 65, empty and a control character are `InvalidInput` (not a database
/// error), and neither the work nor an audit row happens (bad input writes nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_operation_labels_are_checked_before_anything_is_sent() {
    let db = TestDb::new().await;
    app_table(&db).await;
    let store = db.store("c").await;
    let lease = store.acquire("ops", "pod-a", TTL).await.unwrap();
    let fence = lease.fence();
    let run = |operation: String| {
        let (store, fence) = (store.clone(), fence.clone());
        async move {
            store
                .fenced(&fence, &operation, async |conn| {
                    use diesel_async::RunQueryDsl;
                    diesel::sql_query("INSERT INTO shards VALUES (1, 'x') ON CONFLICT DO NOTHING")
                        .execute(conn)
                        .await?;
                    Ok::<_, Error>(())
                })
                .await
        }
    };
    run("o".repeat(pgfence::limits::MAX_OPERATION_LEN))
        .await
        .unwrap();
    db.client()
        .await
        .batch_execute("DELETE FROM shards")
        .await
        .unwrap();
    for bad in [
        "o".repeat(pgfence::limits::MAX_OPERATION_LEN + 1),
        String::new(),
        "re\nbalance".to_owned(),
    ] {
        match run(bad.clone()).await {
            Err(Error::InvalidInput { field, .. }) => assert_eq!(field, "operation", "{bad:?}"),
            other => panic!("{bad:?}: expected InvalidInput, got {other:?}"),
        }
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM shards").await,
        0,
        "no work ran"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.rejections").await,
        0,
        "nothing audited"
    );
    // Before anything is sent: with a store's only connection taken, a bad label is refused at once. (The
    // database checks the label too, with the same error; that check would wait here for a connection.)
    let narrow = Store::connect(db.config("c").pool_size(1)).await.unwrap();
    let taken = narrow.admin().pool().get().await.unwrap();
    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        narrow.fenced(&fence, "", async |_| Ok::<_, Error>(())),
    )
    .await
    .expect("refused without waiting for a connection");
    assert!(
        matches!(
            refused,
            Err(Error::InvalidInput {
                field: "operation",
                ..
            })
        ),
        "{refused:?}"
    );
    drop(taken);
}

// ---------------------------------------------------------------------------------------------------------
// One-statement guarded writes (`Store::guarded_write`) and the fewest round trips of `Store::fenced`.

diesel::table! {
    shards (id) {
        id -> Integer,
        owner -> Text,
    }
}

/// A fresh database with the application table `shards`, after `setup` (SQL) ran on it.
async fn shards_db(setup: &str) -> TestDb {
    let db = TestDb::new().await;
    app_table(&db).await;
    db.client().await.batch_execute(setup).await.unwrap();
    db
}

/// The caller's UPDATE with the guard's verdict in its WHERE clause, as SQL text with binds.
fn move_shard_sql(
    id: i32,
    owner: &str,
) -> impl diesel::query_builder::QueryFragment<diesel::pg::Pg> + Clone + Send + 'static {
    use diesel::sql_types::{Integer, Text};
    diesel::sql_query(
        "UPDATE shards SET owner = $1 WHERE id = $2 AND (SELECT passed FROM pgfence_guard)",
    )
    .bind::<Text, _>(owner.to_owned())
    .bind::<Integer, _>(id)
}

/// Invariants 3 and 4 for a driver pgfence does not wrap: `guarded_write_sql` prepared with tokio-postgres and
/// run with the statement's binds, then the fence's (lease, epoch, secret, operation), writes under the current
/// fence and answers `ok` with the current epoch and the row count; after a takeover the old fence's run writes
/// nothing, answers `stale` / `superseded` with the current epoch and holder, and is audited.
#[tokio::test]
async fn guarded_write_sql_guards_another_drivers_statement() {
    async fn run(
        client: &tokio_postgres::Client,
        statement: &tokio_postgres::Statement,
        fence: &Fence,
        owner: &str,
    ) -> (String, Option<String>, Option<i64>, Option<String>, i64) {
        let row = client
            .query_one(
                statement,
                &[
                    &owner,
                    &1i32,
                    &fence.lease(),
                    &fence.epoch().get(),
                    &fence.secret().expose_secret(),
                    &"move",
                ],
            )
            .await
            .unwrap();
        (
            row.get("outcome"),
            row.get("reason"),
            row.get("current_epoch"),
            row.get("current_holder"),
            row.get("n"),
        )
    }
    let db = shards_db("INSERT INTO shards VALUES (1, 'node-1')").await;
    let store = db.store("prod").await;
    let old = store.acquire("sched", "pod-a", TTL).await.unwrap().fence();
    let client = db.client().await;
    let statement = client
        .prepare(&pgfence::guard::guarded_write_sql(
            "UPDATE shards SET owner = $1 WHERE id = $2 AND (SELECT passed FROM pgfence_guard)",
            2,
            false,
        ))
        .await
        .unwrap();
    assert_eq!(
        run(&client, &statement, &old, "node-2").await,
        ("ok".to_owned(), None, Some(1), None, 1)
    );
    take_over(&store, "sched", "pod-b").await;
    assert_eq!(
        run(&client, &statement, &old, "stale").await,
        (
            "refused".to_owned(),
            Some("superseded".to_owned()),
            Some(2),
            Some("pod-b".to_owned()),
            0
        )
    );
    let owner: String = client
        .query_one("SELECT owner FROM shards WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(owner, "node-2", "the stale run wrote nothing");
    assert_eq!(
        db.scalar("SELECT sum(count)::bigint FROM pgfence.rejections WHERE presented_epoch = 1 AND operation = 'move'")
            .await,
        1,
        "the stale run is audited"
    );
}

/// Invariants 3 and 4 through the one-statement path: the current fence writes and gets the row count; after a
/// takeover the old fence's statement writes nothing and is refused as stale and audited, in SQL text and in
/// diesel's query builder (UPDATE, and INSERT … SELECT gated in its WHERE).
#[tokio::test]
async fn guarded_write_writes_under_the_current_fence_and_refuses_a_stale_one_with_audit() {
    use diesel::prelude::*;
    let db = shards_db("INSERT INTO shards VALUES (1, 'node-1'), (2, 'node-1')").await;
    let store = db.store("prod").await;
    let old = store.acquire("sched", "pod-a", TTL).await.unwrap().fence();
    assert_eq!(
        store
            .guarded_write(&old, "move", move_shard_sql(1, "node-2"))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .guarded_write(&old, "move", move_shard_sql(9, "node-2"))
            .await
            .unwrap(),
        0
    );
    let dsl = |owner: &'static str| {
        diesel::update(
            shards::table
                .filter(shards::id.eq(2))
                .filter(pgfence::guard::fence_passed()),
        )
        .set(shards::owner.eq(owner))
    };
    assert_eq!(
        store
            .guarded_write(&old, "move", dsl("node-3"))
            .await
            .unwrap(),
        1
    );
    let insert = |id: i32| {
        use diesel::sql_types::Integer;
        diesel::sql_query(
            "INSERT INTO shards (id, owner) SELECT $1, 'new' WHERE (SELECT passed FROM pgfence_guard)",
        )
        .bind::<Integer, _>(id)
    };
    assert_eq!(
        store.guarded_write(&old, "add", insert(3)).await.unwrap(),
        1
    );

    let new = take_over(&store, "sched", "pod-b").await.fence();
    for result in [
        store
            .guarded_write(&old, "move", move_shard_sql(1, "stale"))
            .await,
        store.guarded_write(&old, "move", dsl("stale")).await,
        store.guarded_write(&old, "add", insert(4)).await,
    ] {
        match result {
            Err(Error::Stale {
                presented,
                current,
                reason,
                ..
            }) => {
                assert_eq!(presented, old.epoch());
                assert_eq!(current, Some(new.epoch()));
                assert_eq!(reason, LossReason::Superseded);
            }
            other => panic!("a stale one-statement write must be refused, got {other:?}"),
        }
    }
    let owners = db
        .client()
        .await
        .query("SELECT id, owner FROM shards ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get::<_, i32>(0), r.get::<_, String>(1)))
        .collect::<Vec<_>>();
    assert_eq!(
        owners,
        vec![
            (1, "node-2".to_owned()),
            (2, "node-3".to_owned()),
            (3, "new".to_owned())
        ],
        "nothing written under the stale fence"
    );
    let audit = store
        .admin()
        .rejections(&RejectionFilter::default())
        .await
        .unwrap();
    let count = |op: &str| {
        audit
            .iter()
            .filter(|r| r.operation == op)
            .map(|r| r.count)
            .sum::<i64>()
    };
    assert_eq!(
        (count("move"), count("add")),
        (2, 1),
        "every refusal audited: {audit:?}"
    );
    assert_eq!(
        store
            .guarded_write(&new, "move", move_shard_sql(1, "node-4"))
            .await
            .unwrap(),
        1
    );
}

/// A statement that does not test the verdict is refused before it is sent; one that names it without being
/// gated by it, and changes rows under a refused fence, fails as a whole (PF006): the refused write never
/// commits (invariant 3 even for a misused API).
#[tokio::test]
async fn an_ungated_statement_never_commits_under_a_refused_fence() {
    let db = shards_db("INSERT INTO shards VALUES (1, 'node-1')").await;
    let store = db.store("prod").await;
    let old = store.acquire("sched", "pod-a", TTL).await.unwrap().fence();
    let ungated = || diesel::sql_query("UPDATE shards SET owner = 'stale' WHERE id = 1");
    match store.guarded_write(&old, "move", ungated()).await {
        Err(Error::InvalidInput { field, .. }) => assert_eq!(field, "guarded write"),
        other => panic!("an ungated statement must be refused before it is sent, got {other:?}"),
    }
    let disguised =
        || diesel::sql_query("UPDATE shards SET owner = 'stale' WHERE id = 1 /* pgfence_guard */");
    // Under the current fence it writes (the guard passed: nothing to refuse).
    assert_eq!(
        store
            .guarded_write(&old, "move", disguised())
            .await
            .unwrap(),
        1
    );
    take_over(&store, "sched", "pod-b").await;
    db.client()
        .await
        .batch_execute("UPDATE shards SET owner = 'node-b'")
        .await
        .unwrap();
    let err = store
        .guarded_write(&old, "move", disguised())
        .await
        .unwrap_err();
    assert_eq!(
        err.sqlstate(),
        Some(pgfence::sqlstate::SqlState::UngatedWrite),
        "{err}"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM shards WHERE id = 1 AND owner = 'node-b'")
            .await,
        1,
        "the refused, ungated write rolled back"
    );
}

/// Invariant 6: a guarded write is acknowledged only once it committed. A deferred constraint trigger fails
/// the commit of every write to the table: the one-statement write (autocommit, one round trip) must report
/// the failure, and so must a task write, and nothing is written.
#[tokio::test]
async fn a_guarded_write_whose_commit_fails_is_an_error_not_an_acknowledgement() {
    let db = shards_db(
            "INSERT INTO shards VALUES (1, 'node-1');
             CREATE FUNCTION fail_at_commit() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'refused at commit' USING ERRCODE = '23514'; END $$;
             CREATE CONSTRAINT TRIGGER at_commit AFTER UPDATE ON shards DEFERRABLE INITIALLY DEFERRED
               FOR EACH ROW EXECUTE FUNCTION fail_at_commit();",
        ).await;
    let store = db.store("prod").await;
    let fence = store.acquire("sched", "pod-a", TTL).await.unwrap().fence();
    let err = store
        .guarded_write(&fence, "move", move_shard_sql(1, "node-2"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("refused at commit"), "{err}");
    assert_eq!(
        db.scalar("SELECT count(*) FROM shards WHERE owner = 'node-2'")
            .await,
        0
    );
    // The pool's connection is still usable afterwards.
    assert_eq!(
        store
            .guarded_write(&fence, "move", move_shard_sql(9, "x"))
            .await
            .unwrap(),
        0
    );
}

/// The guard needs READ COMMITTED; a session whose default isolation is REPEATABLE READ still gets guarded
/// one-statement writes, task writes and fenced transactions (run in an explicit READ COMMITTED transaction).
#[tokio::test]
async fn guarded_writes_work_under_a_repeatable_read_session_default() {
    let db = shards_db(
        "INSERT INTO shards VALUES (1, 'node-1');
         DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = %L',
                                    current_database(), 'repeatable read'); END $$",
    )
    .await;
    let store = db.store("prod").await;
    let fence = store.acquire("sched", "pod-a", TTL).await.unwrap().fence();
    assert_eq!(
        store
            .guarded_write(&fence, "move", move_shard_sql(1, "node-2"))
            .await
            .unwrap(),
        1
    );
    store.tasks().create(&fence, "t", &json!({})).await.unwrap();
    store
        .tasks()
        .append_event(&fence, "t", "tick", &json!({}))
        .await
        .unwrap();
    assert_eq!(move_shard(&store, &fence, "node-3").await.unwrap(), 1);
}

/// The round trips the client path saves: a one-statement guarded write, and `Cached` statements inside a
/// fenced transaction, are prepared once per connection (the server keeps one prepared statement for each,
/// however many calls); and the fenced transaction's guard runs inside its transaction (its guard lock is held
/// while the caller's work runs) although BEGIN and the guard travel together.
#[tokio::test]
async fn guarded_statements_are_prepared_once_and_fenced_guards_run_inside_their_transaction() {
    let db = shards_db("INSERT INTO shards VALUES (1, 'node-1')").await;
    let store = Store::connect(db.config("prod").pool_size(1))
        .await
        .unwrap();
    let fence = store.acquire("sched", "pod-a", TTL).await.unwrap().fence();
    for i in 0..5 {
        let owner = format!("node-{i}");
        assert_eq!(
            store
                .guarded_write(&fence, "move", move_shard_sql(1, &owner))
                .await
                .unwrap(),
            1
        );
        let held = store
            .fenced(&fence, "move", async move |conn| {
                use diesel::sql_types::{BigInt, Text};
                use diesel_async::RunQueryDsl;
                #[derive(diesel::QueryableByName)]
                struct Held {
                    #[diesel(sql_type = BigInt)]
                    n: i64,
                }
                pgfence::guard::Cached::new(
                    diesel::sql_query("UPDATE shards SET owner = $1 WHERE id = 1").bind::<Text, _>(owner),
                )
                .execute(conn)
                .await?;
                let held: Held = diesel::sql_query(format!(
                    "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND classid = {GUARD_LOCK_CLASS} \
                       AND mode = 'ShareLock' AND granted AND pid = pg_backend_pid()",
                ))
                .get_result(conn)
                .await?;
                Ok::<_, Error>(held.n)
            })
            .await
            .unwrap();
        assert_eq!(
            held, 1,
            "the guard lock is held by the fenced transaction itself"
        );
    }
    let mut conn = store.admin().conn().await.unwrap();
    use diesel_async::RunQueryDsl;
    #[derive(diesel::QueryableByName, Debug)]
    struct Prepared {
        #[diesel(sql_type = diesel::sql_types::Text)]
        statement: String,
    }
    let prepared: Vec<Prepared> = diesel::sql_query("SELECT statement FROM pg_prepared_statements")
        .load(&mut *conn)
        .await
        .unwrap();
    let count = |start: &str| {
        prepared
            .iter()
            .filter(|p| p.statement.starts_with(start))
            .count()
    };
    assert_eq!(
        count("WITH RECURSIVE pgfence_write AS (UPDATE shards"),
        1,
        "{prepared:?}"
    );
    assert_eq!(
        count("UPDATE shards SET owner = $1 WHERE id = 1"),
        1,
        "{prepared:?}"
    );
}

/// What the guard's fast path (`pgfence._admit`: the guard lock taken first from the lock key a session remembers,
/// then one read) could get wrong, presented to one session whose memory names the tenure (as a forger would set
/// it; the memory is only a session setting): each write must get exactly the answer of the full guard.
/// Invariant: the fast path admits only what the full guard admits — never a wrong secret, an expired or
/// superseded tenure, a tenure granted before the current timeline, or a write outside READ COMMITTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fast_path_admits_nothing_the_full_guard_refuses() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (epoch, secret) = common::sql_acquire(&c, "c/l", "h", 60_000).await;
    assert_eq!(
        sql_fence(&c, "c/l", epoch, &secret).await,
        ("ok".into(), None)
    );
    // The first admitted write made the session remember the lease's lock key for this epoch.
    let known: String = c.query_one(FAST_MEMORY, &[&"c/l"]).await.unwrap().get(0);
    assert!(known.ends_with(&format!(" {epoch} c/l")), "{known}");
    let refused = |reason: &str| ("refused".to_owned(), Some(reason.to_owned()));

    remember(&c, &c, "c/l", epoch).await;
    assert_eq!(
        sql_fence(&c, "c/l", epoch, "forged").await,
        refused("bad_secret")
    );

    remember(&c, &c, "c/l", epoch).await;
    c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    let err = c
        .query_one(FENCE_SQL, &[&"c/l", &epoch, &secret])
        .await
        .unwrap_err();
    assert_eq!(err.code().unwrap().code(), "PF004", "{err}");
    c.batch_execute("ROLLBACK").await.unwrap();

    // Granted before a promotion (the row's timeline made older than the server's).
    c.batch_execute("UPDATE pgfence.leases SET timeline = timeline - 1 WHERE name = 'c/l'")
        .await
        .unwrap();
    remember(&c, &c, "c/l", epoch).await;
    assert_eq!(
        sql_fence(&c, "c/l", epoch, &secret).await,
        refused("failover")
    );

    let (short, short_secret) = common::sql_acquire(&c, "c/short", "h", 100).await;
    remember(&c, &c, "c/short", short).await;
    common::wait_until_expired(&c, "c/short").await;
    assert_eq!(
        sql_fence(&c, "c/short", short, &short_secret).await,
        refused("expired")
    );

    let (next, _) = common::sql_acquire(&c, "c/short", "h", 60_000).await;
    assert_eq!(next, short + 1);
    remember(&c, &c, "c/short", short).await;
    assert_eq!(
        sql_fence(&c, "c/short", short, &short_secret).await,
        refused("superseded")
    );
}

/// A forged memory of a lease's lock key (another lease's key) must not let a write skip the lease's own guard
/// lock, and a role without a grant on the cluster must be refused even with the remembered key, the epoch and
/// the secret. Invariants: an admitted write holds its lease's guard lock to its commit (a takeover waits for
/// it); the per-cluster grant is checked on every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_memory_skips_neither_the_guard_lock_nor_the_grant() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (epoch, secret) = common::sql_acquire(&c, "c/l", "h", 60_000).await;
    let (other, _) = common::sql_acquire(&c, "c/other", "h", 60_000).await;
    let other_key: i32 = common::lock_key(&c, "c/other").await;
    assert_eq!(other, 1);
    c.batch_execute("BEGIN").await.unwrap();
    c.execute(
        "SELECT set_config('pgfence.known_' || (hashtext($1) & 15), $2, false)",
        &[&"c/l", &format!("{other_key} {epoch} c/l")],
    )
    .await
    .unwrap();
    assert_eq!(
        sql_fence(&c, "c/l", epoch, &secret).await,
        ("ok".into(), None)
    );
    let pid: i32 = c
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let held: i64 = db
        .client()
        .await
        .query_one(
            &format!(
                "SELECT count(*) FROM pg_locks k JOIN pgfence.leases l ON k.objid = l.lock_key::oid \
                  WHERE k.locktype = 'advisory' AND k.classid = {GUARD_LOCK_CLASS}::oid AND k.objsubid = 2 \
                    AND k.granted AND k.pid = $1 AND l.name = 'c/l'"
            ),
            &[&pid],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, 1, "the admitted write holds c/l's own guard lock");
    c.batch_execute("COMMIT").await.unwrap();

    let owner = db.store("c").await;
    let intruder = common::fixture::app_role(&db, &owner, "intruder", Some("d")).await;
    let i = common::client_as(&db, &intruder).await;
    remember(&c, &i, "c/l", epoch).await;
    assert_eq!(
        sql_fence(&i, "c/l", epoch, &secret).await,
        ("refused".into(), Some("no_grant".into()))
    );
}

/// A write that arrives while a takeover holds the lease's intent lock — between the takeover's rounds, when the
/// guard lock itself is free — must wait for the takeover to end, on the fast path (a session remembering the
/// lock key) as on the full guard (a session remembering nothing), and through the native guard
/// (`pgfence_native.fence`, its session remembering the tenure). The intent lock is held here by a session in an
/// open transaction, as a takeover holds it; each writer must be seen waiting for it in `pg_locks` before it is
/// answered. Invariant 7 (no write gets in while a takeover ends the holders) and the takeover's bound: without the
/// intent probe, a write finds the guard lock free, is admitted, and a takeover ending its holders must end it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_arriving_while_a_takeover_holds_its_intent_lock_waits_on_either_path() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // The native path where this run has the native guard; the portable paths always.
    let native = common::create_native(&c).await;
    let (epoch, secret) = common::sql_acquire(&c, "c/l", "h", 60_000).await;
    let key: i32 = common::lock_key(&c, "c/l").await;
    let takeover = db.client().await;
    for path in ["fast", "full", "native"] {
        if path == "native" && !native {
            continue;
        }
        let writer = db.client().await;
        let function = if path == "native" {
            "pgfence_native.fence"
        } else {
            "pgfence.fence"
        };
        match path {
            "fast" => remember(&c, &writer, "c/l", epoch).await,
            "native" => {
                let row = writer
                    .query_one(
                        &format!("SELECT outcome FROM {function}($1, $2, $3, 'op', NULL, NULL)"),
                        &[&"c/l", &epoch, &secret],
                    )
                    .await
                    .unwrap();
                assert_eq!(row.get::<_, String>(0), "ok");
            }
            _ => {}
        }
        let pid: i32 = writer
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        takeover.batch_execute("BEGIN").await.unwrap();
        takeover
            .execute(
                "SELECT pg_advisory_xact_lock($1, -$2::int)",
                &[&GUARD_LOCK_CLASS, &key],
            )
            .await
            .unwrap();
        let secret = secret.clone();
        let sql = format!("SELECT outcome, reason FROM {function}($1, $2, $3, 'op', NULL, NULL)");
        let write = tokio::spawn(async move {
            let row = writer
                .query_one(&sql, &[&"c/l", &epoch, &secret])
                .await
                .unwrap();
            (row.get::<_, String>(0), row.get::<_, Option<String>>(1))
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let waiting: bool = c
                .query_one(
                    &format!(
                        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = $1 \
                           AND classid = {GUARD_LOCK_CLASS} AND objid = (-$2::int)::oid AND objsubid = 2 \
                           AND NOT granted)"
                    ),
                    &[&pid, &key],
                )
                .await
                .unwrap()
                .get(0);
            if waiting {
                break;
            }
            assert!(
                !write.is_finished(),
                "{path}: a write was answered {:?} while a takeover held the intent lock",
                write.await.unwrap()
            );
            assert!(
                std::time::Instant::now() < deadline,
                "{path}: the write neither waited nor ended"
            );
            tokio::task::yield_now().await;
        }
        takeover.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(write.await.unwrap(), ("ok".into(), None), "{path}");
    }
}

const FENCE_SQL: &str = "SELECT outcome, reason FROM pgfence.fence($1, $2, $3, 'op', NULL, NULL)";
const FAST_MEMORY: &str = "SELECT current_setting('pgfence.known_' || (hashtext($1) & 15), true)";

/// `pgfence.fence` through SQL: its outcome and reason.
async fn sql_fence(
    c: &tokio_postgres::Client,
    lease: &str,
    epoch: i64,
    secret: &str,
) -> (String, Option<String>) {
    let row = c
        .query_one(FENCE_SQL, &[&lease, &epoch, &secret])
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Sets the session's memory of `lease`'s lock key for `epoch` (the key read off the lease by `owner`, as
/// anyone can read it; the memory is a session setting any role can set).
async fn remember(
    owner: &tokio_postgres::Client,
    c: &tokio_postgres::Client,
    lease: &str,
    epoch: i64,
) {
    let key: i32 = common::lock_key(owner, lease).await;
    c.execute(
        "SELECT set_config('pgfence.known_' || (hashtext($1) & 15), $2, false)",
        &[&lease, &format!("{key} {epoch} {lease}")],
    )
    .await
    .unwrap();
}
