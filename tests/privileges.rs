//! Least privilege with real roles and real connections as those roles: the application role writes only
//! through the guarded functions, the functions cannot be redirected through `search_path`, enforcement audits
//! raw writes from roles that do hold table privileges, and the audit stays bounded under a hammering stale
//! writer — whose backpressure neither slows the leader nor holds off a takeover.
//!
//! Invariants checked: 3 (no write around the guard), 4 (every refusal is a typed error and accounted for in the
//! audit, aggregated, with the exact count), 7 (stale writers do not delay a takeover).

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fixture::{app_role, take_over};
use common::{client_as, midpoint_median, role, sqlstate, url_as, TestDb};
use pgfence::admin::{Enforcement, RejectionFilter};
use pgfence::{Error, Store, StoreConfig};
use serde_json::json;

const TTL: Duration = Duration::from_secs(60);

/// The backpressure tests measure time and throughput: each runs alone (write), the other tests of this file
/// run side by side with each other (read) but never with a measurement.
static MEASURING: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The application role can lease, write through the guarded functions, run fenced transactions on its own
/// tables and read everything — and cannot INSERT, UPDATE, DELETE or TRUNCATE any pgfence table, nor
/// force-release, switch enforcement, prune or migrate. A role without grants cannot even acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_role_writes_only_through_the_guarded_functions() {
    let _shared = MEASURING.read().await;
    let db = TestDb::new().await;
    let owner = db.store("c").await;
    let app = app_role(&db, &owner, "app", None).await;
    db.client()
        .await
        .batch_execute(&format!("CREATE TABLE shards (id int PRIMARY KEY, owner text); ALTER TABLE shards OWNER TO {app}"))
        .await
        .unwrap();

    let store = Store::connect(StoreConfig::new(url_as(&db, &app), "c"))
        .await
        .unwrap();
    let lease = store.acquire("sched", "pod-a", TTL).await.unwrap();
    store
        .tasks()
        .create(&lease.fence(), "job", &json!({}))
        .await
        .unwrap();
    store
        .tasks()
        .claim(&lease.fence(), "job", "w")
        .await
        .unwrap();
    let moved: Result<usize, Error> = store
        .fenced(&lease.fence(), "move", async |conn| {
            use diesel_async::RunQueryDsl;
            Ok(diesel::sql_query("INSERT INTO shards VALUES (1, 'pod-a')")
                .execute(conn)
                .await?)
        })
        .await;
    assert_eq!(moved.unwrap(), 1);
    assert_eq!(store.admin().leases().await.unwrap().len(), 1);
    assert_eq!(store.history().tenures("sched").await.unwrap().len(), 1);
    store
        .admin()
        .rejections(&RejectionFilter::default())
        .await
        .unwrap();
    assert!(store
        .admin()
        .identity()
        .await
        .unwrap()
        .instance_id
        .is_some());

    let raw = client_as(&db, &app).await;
    for sql in [
        "UPDATE pgfence.tasks SET state = 'failed'",
        "INSERT INTO pgfence.task_events (task_id, lease, epoch, kind) SELECT id, lease, fence, 'x' FROM pgfence.tasks",
        "UPDATE pgfence.leases SET epoch = epoch + 100",
        "DELETE FROM pgfence.rejections",
        "TRUNCATE pgfence.tenures CASCADE",
        "INSERT INTO pgfence.rejections (lease, presented_epoch, reason, operation) VALUES ('c/x', 1, 'x', 'y')",
    ] {
        let err = raw.batch_execute(sql).await.unwrap_err();
        assert_eq!(sqlstate(&err), "42501", "{sql}: {err}");
    }
    for call in [
        "set_enforcement(true, 'error')",
        "prune_rejections('0', 10)",
    ] {
        let err = raw
            .batch_execute(&format!("SELECT pgfence.{call}"))
            .await
            .unwrap_err();
        assert_eq!(sqlstate(&err), "42501", "{call}: {err}");
    }
    // force_release judges the cluster's operator right itself: refused ('no_grant', audited), as for an
    // operator of another cluster (tests/trust.rs).
    let forced = store.admin().force_release("sched").await.unwrap_err();
    assert!(
        matches!(
            forced,
            Error::Denied {
                reason: pgfence::LossReason::NoGrant,
                ..
            }
        ),
        "{forced}"
    );
    let migrate = store.migrate().await.unwrap_err();
    assert_eq!(
        migrate.sqlstate(),
        Some(pgfence::sqlstate::SqlState::InsufficientPrivilege),
        "{migrate}"
    );
    assert_eq!(
        db.scalar("SELECT epoch FROM pgfence.leases").await,
        1,
        "nothing moved the epoch"
    );

    let stranger = role(&db, "stranger").await;
    let err = client_as(&db, &stranger)
        .await
        .batch_execute("SELECT * FROM pgfence.acquire('c/sched', 'x', 1000)")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&err), "42501");
}

/// The functions `grant_application` lets a role execute. The row-level security helpers and the text checks of
/// the CHECK constraints run in the application role's own statements (policies and constraints are evaluated as
/// the querying role): no definer rights.
const APPLICATION: [&str; 43] = [
    "_cluster_problem",
    "_lease_problem",
    "_max_cluster_len",
    "_max_endpoint_len",
    "_max_holder_len",
    "_max_kind_len",
    "_max_label_len",
    "_max_name_len",
    "_readable_clusters",
    "_reads_all",
    "_storable_cluster",
    "_storable_lease",
    "_storable_text",
    "_text_problem",
    "acquire",
    "acquire_many",
    "append_event",
    "assign_group",
    "assigned_names",
    "claim_rebalance",
    "claim_task",
    "create_task",
    "effect_attempts",
    "enforcement",
    "fence",
    "force_release",
    "group_assignment",
    "group_names",
    "heartbeat",
    "identity",
    "in_doubt_effects",
    "join_group",
    "leave_group",
    "rebalance_inputs",
    "record_intent",
    "record_outcome",
    "release",
    "renew",
    "renew_many",
    "report_belief",
    "settle_effect",
    "transition_task",
    "ungated_write",
];

/// What `grant_operator` adds to [`APPLICATION`].
const OPERATOR: [&str; 3] = ["prune_rejections", "set_enforcement", "set_takeover_grace"];

/// The executable functions that do not run as the owner with a pinned search_path: the pure text checks, the
/// limits they name and the constraints' plpgsql wrappers of the checks (IMMUTABLE, qualified names: no rights of
/// their own to lend).
const PLAIN: [&str; 12] = [
    "_cluster_problem",
    "_lease_problem",
    "_max_cluster_len",
    "_max_endpoint_len",
    "_max_holder_len",
    "_max_kind_len",
    "_max_label_len",
    "_max_name_len",
    "_storable_cluster",
    "_storable_lease",
    "_storable_text",
    "_text_problem",
];

/// Every function a granted role may execute — the application's and the operator's, found from the effective
/// privileges of roles granted through `grant_application` and `grant_operator`, not from a list that could
/// miss one — is SECURITY DEFINER with its search_path pinned to `pg_catalog, pg_temp` (or, for `pgfence.fence` in
/// its SQL shape, installed on PostgreSQL 18, with every name qualified instead: tests/guard_shapes.rs), and the
/// two sets are exactly the documented ones. A role without grants may execute nothing, and nothing in the schema
/// (functions, tables, sequences, views, the schema itself) is granted to PUBLIC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_are_security_definer_with_a_pinned_search_path_and_nothing_is_public() {
    let _shared = MEASURING.read().await;
    let db = TestDb::new().await;
    let (app, ops, stranger) = (
        role(&db, "sdapp").await,
        role(&db, "sdops").await,
        role(&db, "sdnone").await,
    );
    let owner = db.store("c").await;
    owner.admin().grant_application(&app, None).await.unwrap();
    owner.admin().grant_operator(&ops, None).await.unwrap();
    let client = db.client().await;
    let executable = |role: String| {
        let client = &client;
        async move {
            client
                .query(
                    "SELECT p.proname::text, p.prosecdef \
                            AND (coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false) \
                                 OR (p.proname = 'fence' AND p.prolang = \
                                     (SELECT oid FROM pg_language WHERE lanname = 'sql'))) \
                       FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
                      WHERE n.nspname = 'pgfence' AND has_function_privilege($1, p.oid, 'EXECUTE') \
                      ORDER BY 1",
                    &[&role],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| (r.get::<_, String>(0), r.get::<_, bool>(1)))
                .collect::<Vec<_>>()
        }
    };
    let pinned = |names: &[&str]| {
        let mut all: Vec<(String, bool)> = names
            .iter()
            .map(|n| (n.to_string(), !PLAIN.contains(n)))
            .collect();
        all.sort();
        all
    };
    assert_eq!(executable(app).await, pinned(&APPLICATION));
    assert_eq!(
        executable(ops).await,
        pinned(&[&APPLICATION[..], &OPERATOR[..]].concat())
    );
    assert_eq!(executable(stranger).await, []);
    // The grant functions themselves run as the owner too.
    let grants: Vec<bool> = client
        .query(
            "SELECT p.prosecdef AND coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false) \
               FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
              WHERE n.nspname = 'pgfence' AND p.proname IN ('grant_application', 'grant_operator')",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(grants, [true, true]);
    let public_grants: i64 = client
        .query_one(
            "SELECT (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace, \
                     aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a \
                     WHERE n.nspname = 'pgfence' AND a.grantee = 0) \
                  + (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, \
                     aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a \
                     WHERE n.nspname = 'pgfence' AND a.grantee = 0) \
                  + (SELECT count(*) FROM pg_namespace n, \
                     aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a \
                     WHERE n.nspname = 'pgfence' AND a.grantee = 0)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(public_grants, 0);
}

/// A caller's own search_path cannot redirect the guard: a role that shadows `clock_timestamp()` in a schema of
/// its own, placed before pg_catalog, still gets expiries from the real database clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_search_path_cannot_redirect_the_guard() {
    let _shared = MEASURING.read().await;
    let db = TestDb::new().await;
    let app = app_role(&db, &db.store("c").await, "sneaky", None).await;
    db.client()
        .await
        .batch_execute(&format!("GRANT CREATE ON DATABASE {} TO {app}", db.name))
        .await
        .unwrap();
    let raw = client_as(&db, &app).await;
    raw.batch_execute(
        "CREATE SCHEMA evil; \
         CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS $$ SELECT 'infinity'::timestamptz $$; \
         SET search_path = evil, pg_catalog",
    )
    .await
    .unwrap();
    let shadowed: String = raw
        .query_one("SELECT clock_timestamp()::text", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        shadowed, "infinity",
        "the shadow is in effect for the caller"
    );
    let row = raw
        .query_one(
            "SELECT outcome, expires_in_ms FROM pgfence.acquire('c/x', 'me', 5000)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "acquired");
    let remaining: i64 = db
        .scalar("SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint FROM pgfence.leases")
        .await;
    assert!(
        (0..=5000).contains(&remaining),
        "expiry computed from the real clock: {remaining} ms"
    );
}

/// Enforcement in audit mode, against a role that does hold table privileges (a legacy writer): a raw write that
/// does not carry the current epoch is refused (the row is skipped), recorded in pgfence.rejections with the
/// writer's role, and warned about; one that carries it goes through. The application role's raw writes are
/// refused by privilege before any trigger runs (42501).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_mode_refuses_and_records_raw_writes_without_the_current_epoch() {
    let _shared = MEASURING.read().await;
    let db = TestDb::new().await;
    let legacy = role(&db, "legacy").await;
    let owner = db.store("c").await;
    let admin = owner.admin();
    // Row-level security bounds even a role with table privileges to the clusters it has a grant on.
    admin.grant_application(&legacy, Some("c")).await.unwrap();
    db.client()
        .await
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA pgfence TO {legacy}; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON pgfence.tasks, pgfence.task_events TO {legacy}"
        ))
        .await
        .unwrap();
    let old = owner.acquire("sched", "pod-a", TTL).await.unwrap();
    owner
        .tasks()
        .create(&old.fence(), "job", &json!({}))
        .await
        .unwrap();
    let new = owner.acquire("sched", "pod-a", TTL).await.unwrap();
    admin.set_enforcement(Enforcement::Audit).await.unwrap();
    assert_eq!(admin.enforcement().await.unwrap(), Enforcement::Audit);

    let raw = client_as(&db, &legacy).await;
    let stale = raw
        .execute(
            "UPDATE pgfence.tasks SET state = 'failed', fence = $1",
            &[&old.epoch().get()],
        )
        .await
        .unwrap();
    assert_eq!(stale, 0, "the stale row was skipped");
    let unfenced = raw
        .execute("UPDATE pgfence.tasks SET state = 'failed'", &[])
        .await
        .unwrap();
    assert_eq!(unfenced, 0);
    let event = raw
        .execute(
            "INSERT INTO pgfence.task_events (task_id, lease, epoch, kind) SELECT id, lease, $1, 'raw' FROM pgfence.tasks",
            &[&old.epoch().get()],
        )
        .await
        .unwrap();
    assert_eq!(event, 0);
    let deleted = raw.execute("DELETE FROM pgfence.tasks", &[]).await.unwrap();
    assert_eq!(deleted, 0);
    let forged = raw
        .execute(
            "UPDATE pgfence.tasks SET state = 'cancelled', fence = $1",
            &[&new.epoch().get()],
        )
        .await
        .unwrap();
    assert_eq!(
        forged, 0,
        "the current epoch without the tenure's secret is skipped"
    );
    raw.batch_execute("BEGIN").await.unwrap();
    let fenced: String = raw
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
    let current = raw
        .execute(
            "UPDATE pgfence.tasks SET state = 'cancelled', fence = $1",
            &[&new.epoch().get()],
        )
        .await
        .unwrap();
    raw.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        current, 1,
        "a raw write carrying the current epoch in a fenced transaction is a guarded write"
    );

    let rows = db.client().await
        .query(
            "SELECT operation, reason, role::text, count FROM pgfence.rejections ORDER BY operation, reason",
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(String, String, String, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        got,
        [
            (
                "raw_delete".into(),
                "delete_refused".into(),
                legacy.clone(),
                1
            ),
            ("raw_insert".into(), "superseded".into(), legacy.clone(), 1),
            ("raw_update".into(), "bad_secret".into(), legacy.clone(), 1),
            ("raw_update".into(), "superseded".into(), legacy.clone(), 2),
        ]
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.task_events WHERE kind = 'raw'")
            .await,
        0
    );
}

/// A stale holder retrying in a tight loop (four tasks, 100 tries each) gets a typed error every time, while the
/// audit grows by one aggregated row per operation, with the exact count, and the refusals come no faster than
/// the backpressure allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_rejections_are_aggregated_with_an_exact_count() {
    let _shared = MEASURING.read().await;
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let old = store.acquire("sched", "pod-a", TTL).await.unwrap();
    store
        .tasks()
        .create(&old.fence(), "job", &json!({}))
        .await
        .unwrap();
    store
        .acquire("sched", "pod-b", Duration::from_millis(100))
        .await
        .unwrap_err();
    take_over(&store, "sched", "pod-b").await;
    let mut tasks = Vec::new();
    for w in 0..4 {
        let (store, fence) = (store.clone(), old.fence());
        tasks.push(tokio::spawn(async move {
            for i in 0..100 {
                let result = if i % 2 == 0 {
                    store
                        .tasks()
                        .append_event(&fence, "job", "retry", &json!({"w": w}))
                        .await
                        .map(|_| ())
                } else {
                    store
                        .tasks()
                        .create(&fence, &format!("new-{w}-{i}"), &json!({}))
                        .await
                        .map(|_| ())
                };
                assert!(matches!(result, Err(Error::Stale { .. })), "{result:?}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let rows = store
        .admin()
        .rejections(&RejectionFilter::default())
        .await
        .unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows.iter().all(|r| r.count == 200), "{rows:?}");
    // The backpressure serializes the repeats of one operation 10 ms apart (each holds the aggregated row while
    // it waits): the first refusal is not delayed, so 200 refusals span at least 198 waits.
    for r in &rows {
        let span = (r.last_rejected_at - r.rejected_at).to_std().unwrap();
        assert!(
            span >= Duration::from_millis(1_980),
            "{} refusals of {} within {span:?}",
            r.count,
            r.operation
        );
    }
    let create = rows.iter().find(|r| r.operation == "create_task").unwrap();
    assert!(create
        .last_target_key
        .as_deref()
        .unwrap()
        .starts_with("new-"));
}

/// Retention removes rows last seen before the cut-off, in bounded batches, and keeps the rest; through the
/// library and through `pgfence audit prune`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_removes_old_audit_rows_in_batches() {
    let _shared = MEASURING.read().await;
    let db = TestDb::new().await;
    let store = db.store("c").await;
    for n in 0..25 {
        let name = format!("l{n}");
        let lease = store.acquire(&name, "pod", TTL).await.unwrap();
        store.acquire(&name, "pod", TTL).await.unwrap();
        store
            .tasks()
            .create(&lease.fence(), "k", &json!({}))
            .await
            .unwrap_err();
    }
    db.client()
        .await
        .batch_execute(
            "UPDATE pgfence.rejections SET last_rejected_at = clock_timestamp() - interval '2 days' \
              WHERE lease NOT IN ('c/l0', 'c/l1')",
        )
        .await
        .unwrap();
    let deleted = store
        .admin()
        .prune_rejections(Duration::from_secs(86_400), 10)
        .await
        .unwrap();
    assert_eq!(deleted, 23);
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.rejections").await,
        2
    );
    // Batches of 1 to 1,000,000 rows: exactly the edges are accepted (nothing is old enough now), one past
    // either is refused and deletes nothing.
    for batch in [1, 1_000_000] {
        assert_eq!(
            store
                .admin()
                .prune_rejections(Duration::from_secs(86_400), batch)
                .await
                .unwrap(),
            0,
            "batch {batch}"
        );
    }
    for batch in [0, 1_000_001] {
        assert!(
            matches!(
                store.admin().prune_rejections(Duration::ZERO, batch).await,
                Err(Error::InvalidInput { field: "batch", .. })
            ),
            "batch {batch}"
        );
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.rejections").await,
        2
    );

    let cli = tokio::process::Command::new(common::pgfence_bin())
        .args(["audit", "prune", "--older-than", "0s", "--batch", "1"])
        .env("DATABASE_URL", &db.url)
        .output()
        .await
        .unwrap();
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    assert!(String::from_utf8_lossy(&cli.stdout).contains("deleted 2 audit rows"));
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.rejections").await,
        0
    );
}

/// A zombie: a stale holder that retries `append_event` with its old fence in a tight loop until `stop`. Returns
/// how many refusals it got; anything but `Error::Stale` (a PF003, a backend terminated by a takeover) is a
/// failure.
fn zombie(
    store: Store,
    fence: pgfence::Fence,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Result<u64, String>> {
    tokio::spawn(async move {
        let mut refused = 0;
        while !stop.load(Ordering::Relaxed) {
            match store
                .tasks()
                .append_event(&fence, "job-0", "stale", &json!({}))
                .await
            {
                Err(Error::Stale { .. }) => refused += 1,
                other => return Err(format!("a stale writer got {other:?}")),
            }
        }
        Ok(refused)
    })
}

/// Leader and stale writer, side by side: what one round measured.
#[derive(Debug, Clone, Copy)]
struct Round {
    /// The leader's accepted guarded writes per second.
    leader_tps: f64,
    /// The stale writers' refusals in the round, and how long they hammered.
    refusals: u64,
    hammered_for: Duration,
}

/// One round: `writers` leader connections write `append_event` for `length` with the current fence; with
/// `hammers` > 0, that many stale connections hammer meanwhile with the superseded fence.
async fn round(
    leader: &Store,
    zombies: &Store,
    fences: (&pgfence::Fence, &pgfence::Fence),
    writers: usize,
    hammers: usize,
    length: Duration,
) -> Round {
    let (current, stale) = fences;
    let stop = Arc::new(AtomicBool::new(false));
    let hammer_started = Instant::now();
    let hammering: Vec<_> = (0..hammers)
        .map(|_| zombie(zombies.clone(), stale.clone(), stop.clone()))
        .collect();
    let started = Instant::now();
    let mut writing = Vec::new();
    for w in 0..writers {
        let (store, fence) = (leader.clone(), current.clone());
        writing.push(tokio::spawn(async move {
            let mut n = 0u64;
            while started.elapsed() < length {
                store
                    .tasks()
                    .append_event(&fence, &format!("job-{w}"), "tick", &json!({}))
                    .await
                    .unwrap();
                n += 1;
            }
            n
        }));
    }
    let mut accepted = 0;
    for w in writing {
        accepted += w.await.unwrap();
    }
    let leader_tps = accepted as f64 / started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut refusals = 0;
    for h in hammering {
        refusals += h.await.unwrap().unwrap();
    }
    Round {
        leader_tps,
        refusals,
        hammered_for: hammer_started.elapsed(),
    }
}

/// The leader's throughput alone and with stale writers hammering, side by side.
struct Measured {
    alone: Vec<Round>,
    hammered: Vec<Round>,
    /// Every round with stale writers, the warm-up included (for the audit and the rate).
    all_hammered: Vec<Round>,
    hammers: usize,
    stale: pgfence::Fence,
    store: Store,
}

impl Measured {
    /// The median over the pairs of (hammered ÷ alone): the two rounds of a pair ran back to back, under the
    /// same load from the rest of the machine.
    fn ratio(&self) -> f64 {
        midpoint_median(
            &mut self
                .alone
                .iter()
                .zip(&self.hammered)
                .map(|(a, h)| h.leader_tps / a.leader_tps)
                .collect::<Vec<_>>(),
        )
    }

    fn medians(&self) -> (f64, f64) {
        let tps = |rounds: &[Round]| rounds.iter().map(|r| r.leader_tps).collect::<Vec<_>>();
        (
            midpoint_median(&mut tps(&self.alone)),
            midpoint_median(&mut tps(&self.hammered)),
        )
    }

    fn report(&self) -> String {
        let (alone, hammered) = self.medians();
        format!(
            "leader tx/s, median of {} interleaved pairs: alone {alone:.0}, with {} stale connections hammering \
             {hammered:.0} (ratio of medians {:.2}, median of per-pair ratios {:.2}); stale refusals per round {:?}",
            self.alone.len(),
            self.hammers,
            hammered / alone,
            self.ratio(),
            self.hammered.iter().map(|r| r.refusals).collect::<Vec<_>>()
        )
    }

    /// Whatever the throughput: every refusal the stale writers saw is in the audit (one aggregated row, its
    /// count exact), and the backpressure held them to at most one refusal per 10 ms. Each repeat within a
    /// second answers 10 ms later while holding the aggregated row, so a round of t ms gives at most
    /// t / 10 + 1 refusals however many connections hammer; without it they get thousands a second.
    async fn check_audit_and_backpressure(&self) {
        let refused: u64 = self.all_hammered.iter().map(|r| r.refusals).sum();
        let audit: Vec<(i64, String, i64)> = self
            .store
            .admin()
            .rejections(&RejectionFilter::default())
            .await
            .unwrap()
            .iter()
            .map(|r| (r.presented_epoch, r.operation.clone(), r.count))
            .collect();
        assert_eq!(
            audit,
            [(
                self.stale.epoch().get(),
                "append_event".to_owned(),
                refused as i64
            )]
        );
        for r in &self.all_hammered {
            let bound = r.hammered_for.as_millis() as u64 / 10 + 1;
            assert!(
                r.refusals <= bound,
                "{} refusals in {:?} from {} stale connections: more than one per 10 ms ({bound})",
                r.refusals,
                r.hammered_for,
                self.hammers
            );
            assert!(r.refusals >= 1, "the stale writers did hammer: {r:?}");
        }
    }
}

/// The leader's throughput (`writers` connections doing `append_event`) alone and with `hammers` stale
/// connections hammering, in `pairs` pairs of rounds of `length`; the order within a pair alternates, so a drift
/// in the machine's load hits both sides alike. One short warm-up pair first.
async fn leader_alone_and_hammered(
    db: &TestDb,
    writers: usize,
    hammers: usize,
    pairs: usize,
    length: Duration,
) -> Measured {
    // Separate pools, as for a zombie in another process; each as large as its number of connections.
    let leader = Store::connect(db.config("c").pool_size(writers as u32))
        .await
        .unwrap();
    let zombies = Store::connect(db.config("c").pool_size(hammers as u32))
        .await
        .unwrap();
    let stale = leader.acquire("sched", "pod-a", TTL).await.unwrap().fence();
    let current = leader.acquire("sched", "pod-a", TTL).await.unwrap().fence();
    for w in 0..writers {
        leader
            .tasks()
            .create(&current, &format!("job-{w}"), &json!({}))
            .await
            .unwrap();
    }
    let fences = (&current, &stale);
    let warm_up = Duration::from_millis(200);
    let mut all_hammered = vec![round(&leader, &zombies, fences, writers, hammers, warm_up).await];
    round(&leader, &zombies, fences, writers, 0, warm_up).await;
    let (mut alone, mut hammered) = (Vec::new(), Vec::new());
    for pair in 0..pairs {
        for hammering in [pair % 2 == 1, pair % 2 == 0] {
            let r = round(
                &leader,
                &zombies,
                fences,
                writers,
                if hammering { hammers } else { 0 },
                length,
            )
            .await;
            if hammering {
                hammered.push(r);
            } else {
                alone.push(r);
            }
        }
    }
    all_hammered.extend(&hammered);
    Measured {
        alone,
        hammered,
        all_hammered,
        hammers,
        stale,
        store: leader,
    }
}

/// Backpressure does not cost the leader: with 8 stale connections hammering, the leader's guarded-write
/// throughput (4 connections) stays at least 0.65× its throughput alone — the median of the per-pair ratios
/// over 12 interleaved pairs of 200 ms rounds — and the stale writers are held to at most one refusal per
/// 10 ms, every one of them in the audit with the exact count. In this debug build, on 2 cores shared with
/// other work, the ratio measured 0.94–0.99 with the backpressure when this test was written (5 runs) and
/// 0.33–0.41 without it (`pgfence._reject` without its `pg_sleep`); on a later, busier machine 0.73–0.84 with it
/// (the same on the code before the audit's bound was tightened, so the machine, not the change) and 0.41–0.45
/// without: 0.65 sits between them, not at 0.9, which a debug build on busy cores does not give stably. The
/// release figure (0.90–1.07 here) is measured by `measure_leader_throughput_under_a_hammering_stale_writer`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hammering_stale_writer_is_held_back_and_the_leader_keeps_its_throughput() {
    let _alone = MEASURING.write().await;
    let db = TestDb::new().await;
    let measured = leader_alone_and_hammered(&db, 4, 8, 12, Duration::from_millis(200)).await;
    eprintln!("{}", measured.report());
    assert!(
        measured.ratio() >= 0.65,
        "the leader kept only {:.2}× its throughput while stale writers hammered: {}",
        measured.ratio(),
        measured.report()
    );
    measured.check_audit_and_backpressure().await;
}

/// The backpressure itself, seen in the server: a stale writer that retries at once is answered only after a
/// wait in `pg_sleep` (the 10 ms of `pgfence._reject`), and the probe sees its backend in that wait
/// (`wait_event = 'PgSleep'` in pg_stat_activity; nothing else of this test's database sleeps). Deterministic
/// both ways: with the backpressure every repeat sleeps 10 ms of its ~11, so a probe polling throughout sees one
/// at once; without it no refusal ever sleeps, and 300 refusals end the wait unseen. The throughput it buys is
/// `a_hammering_stale_writer_is_held_back_and_the_leader_keeps_its_throughput`'s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_stale_write_is_answered_after_a_wait_in_the_server() {
    let _shared = MEASURING.read().await;
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let stale = store.acquire("sched", "pod-a", TTL).await.unwrap().fence();
    let current = take_over(&store, "sched", "pod-b").await;
    store
        .tasks()
        .create(&current.fence(), "job-0", &json!({}))
        .await
        .unwrap();
    let hammer = Store::connect(db.config("c").pool_size(1)).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn({
        let stop = stop.clone();
        async move {
            for _ in 0..300 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                match hammer
                    .tasks()
                    .append_event(&stale, "job-0", "stale", &json!({}))
                    .await
                {
                    Err(Error::Stale { .. }) => {}
                    other => panic!("a stale writer got {other:?}"),
                }
            }
        }
    });
    let probe = db.client().await;
    let mut seen = false;
    while !seen && !writer.is_finished() {
        seen = probe
            .query_one(
                "SELECT count(*) > 0 FROM pg_stat_activity \
                  WHERE datname = current_database() AND wait_event = 'PgSleep'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
    }
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    assert!(
        seen,
        "300 refusals of a stale writer retrying at once, and none waited in the server before its answer"
    );
}

/// The leader's writer `w`: `append_event` to `job-<w>` under the current tenure's fence (`current`'s latest),
/// back to back until `stop`, counting the accepted writes in `accepted`; the refusals it saw (each stale) per
/// presented epoch.
async fn leader_writes(
    store: &Store,
    w: usize,
    current: &tokio::sync::watch::Receiver<pgfence::Fence>,
    stop: &AtomicBool,
    accepted: &AtomicU64,
) -> HashMap<i64, u64> {
    let mut refused: HashMap<i64, u64> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        let fence = current.borrow().clone();
        match store
            .tasks()
            .append_event(&fence, &format!("job-{w}"), "tick", &json!({}))
            .await
        {
            Ok(_) => {
                accepted.fetch_add(1, Ordering::Relaxed);
            }
            Err(Error::Stale { .. }) => *refused.entry(fence.epoch().get()).or_default() += 1,
            Err(other) => panic!("the leader's write failed: {other:?}"),
        }
    }
    refused
}

/// A takeover is prompt while stale writers hammer: 8 connections retry a superseded epoch in a tight loop and
/// 2 leader connections write with the current fence (and keep writing with it, stale, until they learn the
/// new one), while the lease is taken over 10 times (force_release, then an acquisition by another holder).
/// Bounds: every takeover within 1 s — half the default takeover grace, so a takeover that had to wait out the
/// grace (or terminate a stale writer) fails — and their median within 50 ms (measured here, debug build, 2 busy
/// cores: medians 2–5 ms, the slowest single takeover 53 ms). A backpressure wait under the shared guard lock
/// (stale writes refused only after taking it, then waiting 10 ms) held every takeover off 140–200 ms and fails
/// the median bound. Every stale writer only ever got `Error::Stale` (none was terminated, none hit PF003), and
/// every refusal the clients saw is in the audit: the counts of each (lease, epoch, operation) are exact (a row
/// per reason: an epoch released, then superseded, has two).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_is_prompt_while_stale_writers_hammer() {
    const TAKEOVERS: usize = 10;
    const BOUND: Duration = Duration::from_secs(1);
    const MEDIAN_BOUND: Duration = Duration::from_millis(50);
    let _alone = MEASURING.write().await;
    let db = TestDb::new().await;
    let operator = db.store("c").await;
    let leader = Store::connect(db.config("c").pool_size(2)).await.unwrap();
    let zombies = Store::connect(db.config("c").pool_size(8)).await.unwrap();
    let stale = operator.acquire("sched", "pod-0", TTL).await.unwrap();
    let first = take_over(&operator, "sched", "pod-1").await;
    for w in 0..2 {
        operator
            .tasks()
            .create(&first.fence(), &format!("job-{w}"), &json!({}))
            .await
            .unwrap();
    }
    let (publish, current) = tokio::sync::watch::channel(first.fence());
    let stop = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicU64::new(0));

    let hammering: Vec<_> = (0..8)
        .map(|_| zombie(zombies.clone(), stale.fence(), stop.clone()))
        .collect();
    let mut writing = Vec::new();
    for w in 0..2 {
        let (store, current, stop, accepted) = (
            leader.clone(),
            current.clone(),
            stop.clone(),
            accepted.clone(),
        );
        writing.push(tokio::spawn(async move {
            leader_writes(&store, w, &current, &stop, &accepted).await
        }));
    }

    let mut took = Vec::new();
    for n in 0..TAKEOVERS {
        // Each tenure lasts at least 100 ms and sees the leader write, so every takeover has guarded writes in
        // flight to wait for and stale writers in full swing.
        let (seen, tenure) = (accepted.load(Ordering::Relaxed), Instant::now());
        let deadline = tenure + Duration::from_secs(10);
        while accepted.load(Ordering::Relaxed) < seen + 20
            || tenure.elapsed() < Duration::from_millis(100)
        {
            assert!(Instant::now() < deadline, "the leader stopped writing");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let started = Instant::now();
        assert!(matches!(
            operator.admin().force_release("sched").await.unwrap(),
            pgfence::ForceReleased::Ended { .. }
        ));
        let next = operator
            .acquire("sched", &format!("pod-{}", n + 2), TTL)
            .await
            .unwrap();
        took.push(started.elapsed());
        publish.send(next.fence()).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let mut refused: HashMap<i64, u64> = HashMap::new();
    for h in hammering {
        *refused.entry(stale.epoch().get()).or_default() += h.await.unwrap().unwrap();
    }
    for w in writing {
        for (epoch, n) in w.await.unwrap() {
            *refused.entry(epoch).or_default() += n;
        }
    }
    let mut sorted = took.clone();
    sorted.sort();
    let median = (sorted[TAKEOVERS / 2 - 1] + sorted[TAKEOVERS / 2]) / 2;
    eprintln!(
        "{TAKEOVERS} takeovers under 8 hammering stale connections: median {median:?}, max {:?}; refusals \
         {refused:?}",
        sorted[TAKEOVERS - 1]
    );
    assert!(
        took.iter().all(|t| *t < BOUND),
        "every takeover within {BOUND:?}: {took:?}"
    );
    assert!(
        median < MEDIAN_BOUND,
        "takeovers took {median:?} (median) while stale writers hammered: {took:?}"
    );
    assert!(
        refused[&stale.epoch().get()] >= TAKEOVERS as u64,
        "the stale writers hammered throughout: {refused:?}"
    );
    let mut filter = RejectionFilter::default();
    filter.limit = Some(1000);
    // An epoch refused for two reasons (released by the force-release, then superseded) has a row per reason.
    let mut audit: HashMap<i64, u64> = HashMap::new();
    for r in operator.admin().rejections(&filter).await.unwrap() {
        assert_eq!(r.operation, "append_event");
        *audit.entry(r.presented_epoch).or_default() += r.count as u64;
    }
    assert_eq!(
        audit, refused,
        "the audit's count per refused epoch is exact"
    );
}

/// The README's measurement, in a release build (`cargo test --release --test suite privileges:: -- --ignored
/// --nocapture`): the current leader's guarded-write throughput alone and while a stale writer hammers from 4
/// connections, 5 interleaved pairs of 3-second rounds; prints the medians and the median of the per-pair
/// ratios (a measurement: its ratio is not asserted). The same checks as the test above run on the way (audit
/// exact, at most one refusal per 10 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_leader_throughput_under_a_hammering_stale_writer() {
    let _alone = MEASURING.write().await;
    let db = TestDb::new().await;
    let measured = leader_alone_and_hammered(&db, 4, 4, 5, Duration::from_secs(3)).await;
    eprintln!("{}", measured.report());
    measured.check_audit_and_backpressure().await;
}

/// `pgfence grant` gives a role the application rights (it can then lease) or the operator rights (it can then
/// force-release too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grant_command_sets_up_application_and_operator_roles() {
    let _shared = MEASURING.read().await;
    let db = TestDb::new().await;
    let (app, ops) = (role(&db, "cliapp").await, role(&db, "cliops").await);
    for (role, extra) in [(&app, None), (&ops, Some("--operator"))] {
        let mut args = vec!["grant", "--role", role.as_str(), "--on-cluster", "c"];
        args.extend(extra);
        let out = tokio::process::Command::new(common::pgfence_bin())
            .args(&args)
            .env("DATABASE_URL", &db.url)
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let app_store = Store::connect(StoreConfig::new(url_as(&db, &app), "c"))
        .await
        .unwrap();
    app_store.acquire("l", "pod", TTL).await.unwrap();
    // Without operator rights on the cluster: refused (audited), as every call without its right on a cluster.
    assert!(matches!(
        app_store.admin().force_release("l").await.unwrap_err(),
        Error::Denied {
            reason: pgfence::LossReason::NoGrant,
            ..
        }
    ));
    let ops_store = Store::connect(StoreConfig::new(url_as(&db, &ops), "c"))
        .await
        .unwrap();
    assert!(matches!(
        ops_store.admin().force_release("l").await.unwrap(),
        pgfence::ForceReleased::Ended { .. }
    ));
    // Audit retention spans clusters: it needs operator rights on every cluster.
    assert_eq!(
        ops_store
            .admin()
            .prune_rejections(Duration::from_secs(3600), 100)
            .await
            .unwrap_err()
            .sqlstate(),
        Some(pgfence::sqlstate::SqlState::InsufficientPrivilege)
    );
    let out = tokio::process::Command::new(common::pgfence_bin())
        .args([
            "grant",
            "--role",
            ops.as_str(),
            "--operator",
            "--all-clusters",
        ])
        .env("DATABASE_URL", &db.url)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ops_store
        .admin()
        .prune_rejections(Duration::from_secs(3600), 100)
        .await
        .unwrap();
}
