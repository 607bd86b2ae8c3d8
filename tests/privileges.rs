//! Least privilege with real roles and real connections as those roles: the application role writes only
//! through the guarded functions, the functions cannot be redirected through `search_path`, enforcement audits
//! raw writes from roles that do hold table privileges, and the audit stays bounded under a hammering stale
//! writer.
//!
//! Invariants checked: 3 (no write around the guard), 4 (every refusal is a typed error and accounted for in the
//! audit, aggregated).

mod common;

use std::time::{Duration, Instant};

use common::TestDb;
use pgfence::{Enforcement, Error, RejectionFilter, Store, StoreConfig};
use serde_json::json;

const TTL: Duration = Duration::from_secs(60);

/// Creates a login role named after the test database (roles are cluster-wide; databases are per test).
async fn role(db: &TestDb, suffix: &str) -> String {
    let name = format!("{}_{suffix}", db.name);
    db.client()
        .await
        .batch_execute(&format!(
            "CREATE ROLE {name} LOGIN; GRANT CONNECT ON DATABASE {} TO {name}",
            db.name
        ))
        .await
        .unwrap();
    name
}

fn url_as(db: &TestDb, role: &str) -> String {
    db.url.replacen("postgres@", &format!("{role}@"), 1)
}

async fn client_as(db: &TestDb, role: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&url_as(db, role), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

fn sqlstate(err: &tokio_postgres::Error) -> String {
    err.code().map(|c| c.code().to_owned()).unwrap_or_default()
}

/// The application role can lease, write through the guarded functions, run fenced transactions on its own
/// tables and read everything — and cannot INSERT, UPDATE, DELETE or TRUNCATE any pgfence table, nor
/// force-release, switch enforcement, prune or migrate. A role without grants cannot even acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_role_writes_only_through_the_guarded_functions() {
    let db = TestDb::new().await;
    let app = role(&db, "app").await;
    let owner = db.store("c").await;
    owner.grant_application(&app).await.unwrap();
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
        .create_task(&lease.fence(), "job", &json!({}))
        .await
        .unwrap();
    store.claim_task(&lease.fence(), "job", "w").await.unwrap();
    let moved: Result<usize, Error> = store
        .fenced(&lease.fence(), "move", |conn| {
            Box::pin(async move {
                use diesel_async::RunQueryDsl;
                Ok(diesel::sql_query("INSERT INTO shards VALUES (1, 'pod-a')")
                    .execute(conn)
                    .await?)
            })
        })
        .await;
    assert_eq!(moved.unwrap(), 1);
    assert_eq!(store.leases().await.unwrap().len(), 1);
    assert_eq!(store.tenures("sched").await.unwrap().len(), 1);
    store.rejections(&RejectionFilter::default()).await.unwrap();
    assert!(store.identity().await.unwrap().instance_id.is_some());

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
        "force_release('c/sched')",
        "set_enforcement(true, 'error')",
        "prune_rejections('0', 10)",
    ] {
        let err = raw
            .batch_execute(&format!("SELECT pgfence.{call}"))
            .await
            .unwrap_err();
        assert_eq!(sqlstate(&err), "42501", "{call}: {err}");
    }
    let forced = store.force_release("sched").await.unwrap_err();
    assert_eq!(forced.sqlstate(), Some("42501"), "{forced}");
    assert!(store.migrate().await.is_err());
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

/// Every function the application role may call is SECURITY DEFINER with its search_path pinned, and nothing
/// in the schema is granted to PUBLIC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_are_security_definer_with_a_pinned_search_path_and_nothing_is_public() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let unsafe_functions: Vec<String> = client
        .query(
            "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
              WHERE n.nspname = 'pgfence' AND p.proname IN ('acquire', 'renew', 'renew_many', 'release', \
                    'force_release', 'fence', 'create_task', 'claim_task', 'transition_task', 'append_event', \
                    'set_enforcement', 'prune_rejections', 'identity', 'grant_application', 'grant_operator') \
                AND NOT (p.prosecdef AND EXISTS (SELECT 1 FROM unnest(p.proconfig) c WHERE c LIKE 'search_path=%'))",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(unsafe_functions.is_empty(), "{unsafe_functions:?}");
    let public_grants: i64 = client
        .query_one(
            "SELECT (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace, \
                     aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a \
                     WHERE n.nspname = 'pgfence' AND a.grantee = 0) \
                  + (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, \
                     aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a \
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
    let db = TestDb::new().await;
    let app = role(&db, "sneaky").await;
    db.store("c").await.grant_application(&app).await.unwrap();
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
    let db = TestDb::new().await;
    let legacy = role(&db, "legacy").await;
    let owner = db.store("c").await;
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
        .create_task(&old.fence(), "job", &json!({}))
        .await
        .unwrap();
    let new = owner.acquire("sched", "pod-a", TTL).await.unwrap();
    owner.set_enforcement(Enforcement::Audit).await.unwrap();
    assert_eq!(owner.enforcement().await.unwrap(), Enforcement::Audit);

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
    let current = raw
        .execute(
            "UPDATE pgfence.tasks SET state = 'cancelled', fence = $1",
            &[&new.epoch().get()],
        )
        .await
        .unwrap();
    assert_eq!(
        current, 1,
        "a raw write carrying the current epoch is a guarded write"
    );

    let rows = db.client().await
        .query(
            "SELECT operation, reason, session_role, count FROM pgfence.rejections ORDER BY operation",
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
/// audit grows by one aggregated row per operation, with the exact count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_rejections_are_aggregated_with_an_exact_count() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let old = store.acquire("sched", "pod-a", TTL).await.unwrap();
    store
        .create_task(&old.fence(), "job", &json!({}))
        .await
        .unwrap();
    store
        .acquire("sched", "pod-b", Duration::from_millis(100))
        .await
        .unwrap_err();
    store.force_release("sched").await.unwrap();
    store.acquire("sched", "pod-b", TTL).await.unwrap();
    let mut tasks = Vec::new();
    for w in 0..4 {
        let (store, fence) = (store.clone(), old.fence());
        tasks.push(tokio::spawn(async move {
            for i in 0..100 {
                let result = if i % 2 == 0 {
                    store
                        .append_event(&fence, "job", "retry", &json!({"w": w}))
                        .await
                        .map(|_| ())
                } else {
                    store
                        .create_task(&fence, &format!("new-{w}-{i}"), &json!({}))
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
    let rows = store.rejections(&RejectionFilter::default()).await.unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows.iter().all(|r| r.count == 200), "{rows:?}");
    assert!(rows.iter().all(|r| r.last_rejected_at >= r.rejected_at));
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
    let db = TestDb::new().await;
    let store = db.store("c").await;
    for n in 0..25 {
        let name = format!("l{n}");
        let lease = store.acquire(&name, "pod", TTL).await.unwrap();
        store.acquire(&name, "pod", TTL).await.unwrap();
        store
            .create_task(&lease.fence(), "k", &json!({}))
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
        .prune_rejections(Duration::from_secs(86_400), 10)
        .await
        .unwrap();
    assert_eq!(deleted, 23);
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.rejections").await,
        2
    );
    assert!(matches!(
        store.prune_rejections(Duration::ZERO, 0).await,
        Err(Error::InvalidInput { .. })
    ));

    let cli = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgfence"))
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
}

/// Measurement, not a pass/fail check (run with `cargo test --release --test privileges -- --ignored
/// --nocapture`): the current leader's guarded-write throughput alone and while a stale writer hammers at full
/// speed from 4 connections, in interleaved rounds; prints the median ratio.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_leader_throughput_under_a_hammering_stale_writer() {
    let db = TestDb::new().await;
    let store = Store::connect(db.config("c").pool_size(12)).await.unwrap();
    let stale = store.acquire("sched", "pod-a", TTL).await.unwrap();
    let leader = store.acquire("sched", "pod-a", TTL).await.unwrap();
    for w in 0..4 {
        store
            .create_task(&leader.fence(), &format!("job-{w}"), &json!({}))
            .await
            .unwrap();
    }
    let round = |hammer: bool| {
        let store = store.clone();
        let (leader, stale) = (leader.fence(), stale.fence());
        async move {
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let mut hammers = Vec::new();
            if hammer {
                for _ in 0..4 {
                    let (store, stale, stop) = (store.clone(), stale.clone(), stop.clone());
                    hammers.push(tokio::spawn(async move {
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            let _ = store
                                .append_event(&stale, "job-0", "stale", &json!({}))
                                .await;
                        }
                    }));
                }
            }
            let started = Instant::now();
            let mut writers = Vec::new();
            for w in 0..4 {
                let (store, leader) = (store.clone(), leader.clone());
                writers.push(tokio::spawn(async move {
                    let mut n = 0u64;
                    while started.elapsed() < Duration::from_secs(3) {
                        store
                            .append_event(&leader, &format!("job-{w}"), "tick", &json!({}))
                            .await
                            .unwrap();
                        n += 1;
                    }
                    n
                }));
            }
            let mut total = 0;
            for w in writers {
                total += w.await.unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            for h in hammers {
                h.await.unwrap();
            }
            total as f64 / started.elapsed().as_secs_f64()
        }
    };
    let (mut alone, mut hammered) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        alone.push(round(false).await);
        hammered.push(round(true).await);
    }
    alone.sort_by(|a, b| a.partial_cmp(b).unwrap());
    hammered.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let hammer_count = db
        .scalar("SELECT coalesce(sum(count), 0)::bigint FROM pgfence.rejections")
        .await;
    eprintln!(
        "leader append_event tx/s, 4 writers, median of 5 interleaved rounds: alone {:.0}, with 4 stale hammering \
         connections {:.0} (ratio {:.2}); {hammer_count} stale writes refused, {} audit rows",
        alone[2],
        hammered[2],
        hammered[2] / alone[2],
        db.scalar("SELECT count(*) FROM pgfence.rejections").await
    );
}

/// `pgfence grant` gives a role the application rights (it can then lease) or the operator rights (it can then
/// force-release too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grant_command_sets_up_application_and_operator_roles() {
    let db = TestDb::new().await;
    let (app, ops) = (role(&db, "cliapp").await, role(&db, "cliops").await);
    for (role, extra) in [(&app, None), (&ops, Some("--operator"))] {
        let mut args = vec!["grant", "--role", role.as_str()];
        args.extend(extra);
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgfence"))
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
    assert_eq!(
        app_store.force_release("l").await.unwrap_err().sqlstate(),
        Some("42501")
    );
    let ops_store = Store::connect(StoreConfig::new(url_as(&db, &ops), "c"))
        .await
        .unwrap();
    assert!(matches!(
        ops_store.force_release("l").await.unwrap(),
        pgfence::ForceReleased::Ended { .. }
    ));
    ops_store
        .prune_rejections(Duration::from_secs(3600), 100)
        .await
        .unwrap();
}
