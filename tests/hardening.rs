//! The trust boundary against roles of the same cluster and careless grants (invariant 8, and invariant 7's
//! liveness: a role without a tenure's secret can never make that tenure's holder, or a takeover of it, wait).
//!
//! Every entry point decides holder, epoch and secret on an unlocked read before it takes any lock, so a role
//! that presents a forged secret and leaves its transaction open holds nothing the holder or an operator needs.

use crate::common;

use std::time::{Duration, Instant};

use common::fixture::{app_role, app_store};
use common::{client_as, owned_db, role, store_as, url_as, TestDb};
use pgfence::{Lease, Store};

const TTL: Duration = Duration::from_secs(60);

/// The audit's bound per (role, lease, presented epoch) (docs/security.md): 16 (operation, reason) pairs and an
/// `other` row for each of the 10 reasons a tenure explains.
const PER_TENURE: usize = 16 + 10;

/// How long a forged call left open may delay the holder at most: a bound a loaded machine keeps (the calls take
/// milliseconds; 59 ms was seen under 4 CPU hogs and parallel test runs), far below what the bug it is for causes —
/// the holder waiting for the attacker's transaction until the lock-wait bound (seconds), then PF003.
const HOLDER_DELAY: Duration = Duration::from_secs(1);

/// A database with a holder role and an attacker role (both granted cluster `ta`), an operator of `ta`, and a
/// lease `ta/x` held by the holder role: (db, holder's store, the lease, attacker, operator).
async fn holder_and_attacker() -> (TestDb, Store, Lease, String, String) {
    let db = TestDb::new().await;
    let owner = db.store("ta").await;
    let (_, store) = app_store(&db, &owner, "holder", "ta").await;
    let attacker = app_role(&db, &owner, "attacker", Some("ta")).await;
    let operator = role(&db, "oper").await;
    owner
        .admin()
        .grant_operator(&operator, Some("ta"))
        .await
        .unwrap();
    let lease = store.acquire("x", "a-ctrl", TTL).await.unwrap();
    (db, store, lease, attacker, operator)
}

/// The forged calls a role of the same cluster can leave open in a transaction: each presents the current
/// holder and epoch (both readable) with a wrong secret. Before "decide before locking", each of them held the
/// lease row (or the belief row) until its transaction ended.
fn forged_calls(epoch: i64) -> Vec<(&'static str, String)> {
    let forged = "f".repeat(64);
    vec![
        (
            "renew",
            format!("SELECT * FROM pgfence.renew('ta/x', {epoch}, '{forged}', 60000)"),
        ),
        (
            "renew_many",
            format!(
                "SELECT * FROM pgfence.renew_many(array_fill('ta/x'::text, ARRAY[2000]), \
                 array_fill({epoch}::bigint, ARRAY[2000]), array_fill('{forged}'::text, ARRAY[2000]), 60000)"
            ),
        ),
        (
            "release",
            format!("SELECT * FROM pgfence.release('ta/x', {epoch}, '{forged}')"),
        ),
        (
            "report_belief",
            format!(
                "SELECT pgfence.report_belief('ta/x', {epoch}, '{forged}', 'end', now(), now(), NULL, \
                 'released', NULL)"
            ),
        ),
        (
            "fence",
            format!("SELECT * FROM pgfence.fence('ta/x', {epoch}, '{forged}', 'hold', NULL, NULL)"),
        ),
        (
            "create_task",
            format!("SELECT * FROM pgfence.create_task('ta/x', {epoch}, '{forged}', 'k', '{{}}')"),
        ),
    ]
}

/// Invariant 7's liveness against a role without the secret: with each forged call left open in a transaction
/// of another role of the same cluster, the holder's renewal (alone and batched), its belief report and an
/// operator's takeover are not delayed (the holder by at most 1 s; the takeover finishes within the grace + 1 s,
/// and within half the grace, since nothing of the tenure is in flight to wait for), and every forged call was refused
/// and audited. Fails on a function that locks before it checks the secret: the holder then waits for the
/// attacker's transaction (PF003 after the lock-wait bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_call_left_open_delays_neither_the_holder_nor_a_takeover() {
    let (db, store, mut lease, attacker, operator) = holder_and_attacker().await;
    let holder_raw = db.client().await;
    let grace = Duration::from_millis(
        db.scalar("SELECT takeover_grace_ms FROM pgfence.instance")
            .await as u64,
    );
    for (what, sql) in forged_calls(lease.epoch().get()) {
        let open = client_as(&db, &attacker).await;
        open.batch_execute("BEGIN").await.unwrap();
        let answer = open
            .simple_query(&sql)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e:?}"));
        drop(answer);

        let started = Instant::now();
        store
            .renew(&mut lease)
            .await
            .unwrap_or_else(|e| panic!("renewal behind an open forged {what}: {e}"));
        let renewal = started.elapsed();
        let secret = lease.fence().secret().expose_secret().to_owned();
        let started = Instant::now();
        let outcome: String = holder_raw
            .query_one(
                "SELECT outcome FROM pgfence.renew_many(ARRAY['ta/x'], ARRAY[$1::bigint], ARRAY[$2], 60000)",
                &[&lease.epoch().get(), &secret],
            )
            .await
            .unwrap_or_else(|e| panic!("batched renewal behind an open forged {what}: {e}"))
            .get(0);
        let batched = started.elapsed();
        assert_eq!(outcome, "renewed", "{what}");
        let started = Instant::now();
        holder_raw
            .query_one(
                "SELECT pgfence.report_belief('ta/x', $1, $2, 'start', now(), now(), NULL, NULL, NULL)",
                &[&lease.epoch().get(), &secret],
            )
            .await
            .unwrap_or_else(|e| panic!("belief report behind an open forged {what}: {e}"));
        let report = started.elapsed();
        for (step, took) in [
            ("renew", renewal),
            ("renew_many", batched),
            ("report_belief", report),
        ] {
            assert!(
                took <= HOLDER_DELAY,
                "the holder's {step} took {took:?} behind an open forged {what}"
            );
        }
        open.batch_execute("COMMIT").await.unwrap();
        let audited = db
            .scalar(&format!(
                "SELECT count(*) FROM pgfence.rejections WHERE role = '{attacker}' AND reason = 'bad_secret' \
                   AND operation = '{}'",
                match what {
                    "renew_many" => "renew",
                    "fence" => "hold",
                    other => other,
                }
            ))
            .await;
        assert_eq!(audited, 1, "the forged {what} is audited");
    }

    // The operator's takeover, with every forged call open at once (each from a role of its own: one role's
    // open refusal holds its own audit row, which that role's next refusal of the same kind waits for).
    let owner = db.store("ta").await;
    let mut open = Vec::new();
    for (i, (what, sql)) in forged_calls(lease.epoch().get()).into_iter().enumerate() {
        let attacker = app_role(&db, &owner, &format!("attacker{i}"), Some("ta")).await;
        let client = client_as(&db, &attacker).await;
        client.batch_execute("BEGIN").await.unwrap();
        client
            .simple_query(&sql)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e:?}"));
        open.push(client);
    }
    let oper = store_as(&db, &operator, "ta").await;
    let started = Instant::now();
    oper.admin()
        .force_release("x")
        .await
        .expect("the operator's takeover");
    let took = started.elapsed();
    assert!(
        took <= grace + Duration::from_secs(1),
        "the takeover took {took:?} behind the open forged calls (grace {grace:?})"
    );
    assert!(
        took <= grace / 2,
        "nothing of the tenure was in flight, yet the takeover took {took:?} (grace {grace:?})"
    );
}

/// A holder's store of cluster `ta` and a lease name of it acquired `times` times in a row (epochs 1..=times):
/// every epoch below the last is a real, superseded tenure.
async fn superseded_tenures(store: &Store, name: &str, times: usize) -> Lease {
    let mut last = None;
    for _ in 0..times {
        last = Some(store.acquire(name, "a-ctrl", TTL).await.unwrap());
    }
    last.unwrap()
}

/// Audit rows of one role: (scope, lease, presented epoch, reason, operation, count).
async fn audit_of(db: &TestDb, role: &str) -> Vec<(String, String, i64, String, String, i64)> {
    db.client()
        .await
        .query(
            "SELECT scope, lease, presented_epoch, reason, operation, count FROM pgfence.rejections \
              WHERE role = $1::text::name ORDER BY scope, lease, presented_epoch, operation",
            &[&role],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect()
}

/// The audit's label cap holds under concurrency: four connections of one role, released together by a barrier,
/// refuse 20 distinct operation labels on the same superseded tenure, for 12 tenures: each tenure gets exactly
/// 17 rows (16 labels and `other`), and the counts add up to every refusal sent. Fails on a cap checked by a
/// count read before the insert (four connections then reach 19-20 rows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_label_cap_holds_under_concurrent_refusals() {
    let (db, store, _lease, attacker, _) = holder_and_attacker().await;
    const TENURES: usize = 12;
    for t in 0..TENURES {
        superseded_tenures(&store, &format!("cap-{t}"), 2).await;
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(4));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (db, attacker, barrier) = (db.clone(), attacker.clone(), barrier.clone());
        writers.push(tokio::spawn(async move {
            let client = client_as(&db, &attacker).await;
            let fence = client
                .prepare("SELECT outcome FROM pgfence.fence($1, 1, 'no-secret', $2, NULL, NULL)")
                .await
                .unwrap();
            for t in 0..TENURES {
                // Bounded: a writer that failed never arrives, and the others must not wait for it forever.
                tokio::time::timeout(Duration::from_secs(10), barrier.wait())
                    .await
                    .expect("another writer failed: see its panic above");
                for label in 0..5 {
                    let outcome: String = client
                        .query_one(
                            &fence,
                            &[&format!("ta/cap-{t}"), &format!("label-{w}-{label}")],
                        )
                        .await
                        .unwrap()
                        .get(0);
                    assert_eq!(outcome, "refused");
                }
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let rows = audit_of(&db, &attacker).await;
    for t in 0..TENURES {
        let lease = format!("ta/cap-{t}");
        let of: Vec<_> = rows.iter().filter(|r| r.1 == lease).collect();
        assert_eq!(of.len(), 17, "{lease}: {of:?}");
        assert!(of.iter().all(|r| r.0 == "tenure" && r.2 == 1), "{of:?}");
        assert_eq!(
            of.iter().map(|r| r.5).sum::<i64>(),
            20,
            "{lease}: every refusal counted"
        );
        assert_eq!(of.iter().filter(|r| r.4 == "other").count(), 1, "{of:?}");
    }
}

/// Rows of one tenure of one role: (reason, operation, slot, count).
async fn tenure_rows(
    db: &TestDb,
    role: &str,
    lease: &str,
    epoch: i64,
) -> Vec<(String, String, i16, i64)> {
    db.client()
        .await
        .query(
            "SELECT reason, operation, slot, count FROM pgfence.rejections \
              WHERE role = $1::text::name AND scope = 'tenure' AND lease = $2 AND presented_epoch = $3 \
              ORDER BY slot",
            &[&role, &lease, &epoch],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

/// Writer `w` of [`the_audit_counts_each_reason_apart_under_concurrent_refusals`], as `attacker`: for each of
/// the `tenures` expired leases `ta/mix-<t>` (all writers in step through `barrier`), six fences under labels of
/// its own and `release` (refused as expired), and forged releases (bad secret) — after the `release` label, and
/// after every label for an even writer. The calls whose answer was not the expected reason.
async fn mixed_refusals_writer(
    db: &TestDb,
    attacker: &str,
    w: usize,
    tenures: usize,
    barrier: &tokio::sync::Barrier,
    forged: &str,
) -> Vec<String> {
    let client = client_as(db, attacker).await;
    let fence = client
        .prepare(
            "SELECT reason FROM pgfence.fence(p_lease => $1, p_epoch => 1, p_secret => $2, p_operation => $3, \
             p_table => NULL, p_key => NULL)",
        )
        .await
        .unwrap();
    let release = client
        .prepare("SELECT reason FROM pgfence.release(p_lease => $1, p_epoch => 1, p_secret => $2)")
        .await
        .unwrap();
    // A failure is collected, not raised: a writer that stopped would leave the others at the barrier.
    let mut failures = Vec::new();
    let mut expect = async |statement,
                            params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
                            want| {
        match client.query_one(statement, params).await {
            Ok(row) if row.get::<_, Option<String>>(0).as_deref() == Some(want) => {}
            Ok(row) => failures.push(format!("{want}: {:?}", row.get::<_, Option<String>>(0))),
            Err(e) => failures.push(format!("{want}: {e:?}")),
        }
    };
    for t in 0..tenures {
        let lease = format!("ta/mix-{t}");
        barrier.wait().await;
        for label in 0..6 {
            let label = match label {
                5 => "release".to_owned(),
                _ => format!("label-{w}-{label}"),
            };
            expect(&fence, &[&lease, &forged, &label], "expired").await;
            if label == "release" || w.is_multiple_of(2) {
                expect(&release, &[&lease, &forged], "bad_secret").await;
            }
        }
    }
    failures
}

/// The audit counts each reason apart: a forgery is never counted as a stale write, nor a stale write as a
/// forgery, also when both name the same (role, lease, epoch, operation) — first one after the other (forged
/// fences of a live tenure, then fences of it once superseded), then under concurrency: four connections of one
/// role, released together by a barrier, refuse each of 8 expired tenures under 20 labels of their own and the
/// label `release` (expired), and send forged releases of it (bad secret, operation `release`). Each tenure's
/// counts per reason are exact (24 expired, 4 bad secret), 16 rows take the 16 places of its (operation,
/// reason) pairs, and the rest is counted under `other`, one row per reason: 17 or 18 rows, never more than
/// 16 + 2. Fails on rows shared between reasons (the old audit: the first refusal's reason took the others'
/// counts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_counts_each_reason_apart_under_concurrent_refusals() {
    let (db, store, lease, attacker, _) = holder_and_attacker().await;
    let forged = "f".repeat(64);
    let client = client_as(&db, &attacker).await;
    let fence = "SELECT reason FROM pgfence.fence(p_lease => $1, p_epoch => $2, p_secret => $3, p_operation => $4, p_table => NULL, p_key => NULL)";
    let epoch = lease.epoch().get();
    for _ in 0..3 {
        let reason: Option<String> = client
            .query_one(fence, &[&"ta/x", &epoch, &forged, &"x"])
            .await
            .unwrap()
            .get(0);
        assert_eq!(reason.as_deref(), Some("bad_secret"));
    }
    store.acquire("x", "a-ctrl", TTL).await.unwrap();
    for _ in 0..2 {
        let reason: Option<String> = client
            .query_one(fence, &[&"ta/x", &epoch, &forged, &"x"])
            .await
            .unwrap()
            .get(0);
        assert_eq!(reason.as_deref(), Some("superseded"));
    }
    let rows = tenure_rows(&db, &attacker, "ta/x", epoch).await;
    let mut counts: Vec<(&str, &str, i64)> = rows
        .iter()
        .map(|r| (r.0.as_str(), r.1.as_str(), r.3))
        .collect();
    counts.sort();
    assert_eq!(
        counts,
        [("bad_secret", "x", 3), ("superseded", "x", 2)],
        "{rows:?}"
    );

    const TENURES: usize = 8;
    const WRITERS: usize = 4;
    for t in 0..TENURES {
        store
            .acquire(&format!("mix-{t}"), "a-ctrl", Duration::from_millis(100))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(WRITERS));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (db, attacker, barrier, forged) = (
            db.clone(),
            attacker.clone(),
            barrier.clone(),
            forged.clone(),
        );
        writers.push(tokio::spawn(async move {
            mixed_refusals_writer(&db, &attacker, w, TENURES, &barrier, &forged).await
        }));
    }
    let mut failures = Vec::new();
    for w in writers {
        failures.extend(w.await.unwrap());
    }
    assert!(
        failures.is_empty(),
        "{} calls failed: {failures:?}",
        failures.len()
    );
    // Per tenure: 4 × 6 expired fences; forged releases: 1 per writer, and 5 more per even writer.
    let forgeries = (WRITERS + WRITERS / 2 * 5) as i64;
    for t in 0..TENURES {
        let lease = format!("ta/mix-{t}");
        let rows = tenure_rows(&db, &attacker, &lease, 1).await;
        let sum = |reason: &str| {
            rows.iter()
                .filter(|r| r.0 == reason)
                .map(|r| r.3)
                .sum::<i64>()
        };
        assert_eq!(
            (sum("expired"), sum("bad_secret")),
            (WRITERS as i64 * 6, forgeries),
            "{lease}: {rows:?}"
        );
        assert!(
            (17..=18).contains(&rows.len()),
            "{lease}: {} rows: {rows:?}",
            rows.len()
        );
        assert_eq!(
            rows.iter().filter(|r| r.2 < 16).count(),
            16,
            "{lease}: {rows:?}"
        );
        for reason in ["expired", "bad_secret"] {
            assert!(
                rows.iter()
                    .filter(|r| r.0 == reason && r.1 == "other")
                    .count()
                    <= 1,
                "{lease}: {rows:?}"
            );
        }
    }
}

/// Concurrent first refusals of one tenure never deadlock: six connections of one role, released together by a
/// barrier, are refused on a tenure with no audit row yet, three of them under one operation label and three
/// under labels of their own (so they race for the row of a label and for the places of new labels at once),
/// for 150 tenures. Every call answers `stale`, none fails (40P01 or otherwise), and each tenure's counts add up
/// to the six refusals. Fails on an insert whose place index is not one of its conflict arbiters: two inserts
/// then wait for each other's transaction inside PostgreSQL's speculative insertion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_refusals_of_a_tenure_never_deadlock() {
    let (db, store, _lease, attacker, _) = holder_and_attacker().await;
    const TENURES: usize = 150;
    const WRITERS: usize = 6;
    for t in 0..TENURES {
        superseded_tenures(&store, &format!("dl-{t}"), 2).await;
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(WRITERS));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (db, attacker, barrier) = (db.clone(), attacker.clone(), barrier.clone());
        writers.push(tokio::spawn(async move {
            let client = client_as(&db, &attacker).await;
            let fence = client
                .prepare("SELECT outcome FROM pgfence.fence($1, 1, 'no-secret', $2, NULL, NULL)")
                .await
                .unwrap();
            let label = if w % 2 == 0 {
                "shared".to_owned()
            } else {
                format!("own-{w}")
            };
            // A failure is collected, not raised: a writer that stopped would leave the others at the barrier.
            let mut failures = Vec::new();
            for t in 0..TENURES {
                // Bounded all the same: a writer that failed to start never arrives.
                tokio::time::timeout(Duration::from_secs(10), barrier.wait())
                    .await
                    .expect("another writer never reached the barrier");
                match client
                    .query_one(&fence, &[&format!("ta/dl-{t}"), &label])
                    .await
                {
                    Ok(row) if row.get::<_, String>(0) == "refused" => {}
                    Ok(row) => failures.push(format!(
                        "tenure {t}, writer {w}: {:?}",
                        row.get::<_, String>(0)
                    )),
                    Err(e) => failures.push(format!("tenure {t}, writer {w}: {e:?}")),
                }
            }
            failures
        }));
    }
    let mut failures = Vec::new();
    for w in writers {
        failures.extend(w.await.unwrap());
    }
    assert!(
        failures.is_empty(),
        "{} calls failed: {failures:?}",
        failures.len()
    );
    let rows = audit_of(&db, &attacker).await;
    for t in 0..TENURES {
        let lease = format!("ta/dl-{t}");
        let of: Vec<_> = rows.iter().filter(|r| r.1 == lease).collect();
        assert_eq!(of.len(), 4, "{lease}: one row per label: {of:?}");
        assert_eq!(
            of.iter().map(|r| r.5).sum::<i64>(),
            WRITERS as i64,
            "{lease}: {of:?}"
        );
    }
}

/// A bogus `lease`'s fenced transaction and four task writes, through `store`, each refused (stale or denied)
/// and so audited: how many (5).
async fn library_writes_of_a_bogus_lease_are_refused(
    store: &Store,
    lease: &str,
    payload: &serde_json::Value,
) -> i64 {
    let refused = |result: Result<(), pgfence::Error>, what: &str| match result {
        Err(pgfence::Error::Stale { .. } | pgfence::Error::Denied { .. }) => 1,
        other => panic!("{what}: {other:?}"),
    };
    let fence = common::forged_fence(lease, 1);
    let mut audited = 0;
    audited += refused(
        store
            .fenced(&fence, "flood", async |_conn| Ok::<(), pgfence::Error>(()))
            .await,
        "fenced",
    );
    audited += refused(
        store.tasks().create(&fence, "k", payload).await.map(drop),
        "create",
    );
    audited += refused(
        store.tasks().claim(&fence, "k", "w").await.map(drop),
        "claim",
    );
    audited += refused(
        store
            .tasks()
            .transition(
                &fence,
                "k",
                pgfence::tasks::TaskState::Pending,
                pgfence::tasks::TaskState::Running,
                payload,
            )
            .await
            .map(drop),
        "transition",
    );
    audited += refused(
        store
            .tasks()
            .append_event(&fence, "k", "note", payload)
            .await
            .map(drop),
        "append",
    );
    audited
}

/// Refusals that no tenure explains are role rows, from every audited function: one role sends, 20 times each
/// and every time under a new name or epoch, fences and the four task writes of leases that do not exist (the
/// library's calls), renewals, releases and belief reports of them (SQL), fences and belief reports of epochs
/// never issued of a live lease, every call of a cluster it has no grant on, and raw task INSERTs (enforcement
/// in audit mode) of both kinds.
/// The audit then holds no tenure row of that role and one role row per reason, whose counts are every refusal
/// audited (renewals and releases of unknown leases are answered `lost` and `not_held`, not audited). Fails on
/// refusals aggregated per lease (the issue's `report_belief` flood: a tenure row per bogus name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_audited_function_keeps_refusals_no_tenure_explains_in_role_rows() {
    let (db, _store, lease, attacker, _) = holder_and_attacker().await;
    let owner = db.store("ta").await;
    db.client()
        .await
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA pgfence TO {attacker}; GRANT SELECT, INSERT ON pgfence.tasks TO {attacker}"
        ))
        .await
        .unwrap();
    owner
        .admin()
        .set_enforcement(pgfence::admin::Enforcement::Audit)
        .await
        .unwrap();
    let attacker_store = store_as(&db, &attacker, "ta").await;
    let client = client_as(&db, &attacker).await;
    let forged = "f".repeat(64);
    let payload = serde_json::json!({});
    let x_epoch = lease.epoch().get();
    let mut audited = 0i64;
    let refused = |result: Result<(), pgfence::Error>, what: &str| match result {
        Err(pgfence::Error::Stale { .. } | pgfence::Error::Denied { .. }) => 1,
        other => panic!("{what}: {other:?}"),
    };
    for i in 0..20i64 {
        for lease in [format!("ta/bogus-{i}"), format!("zz/bogus-{i}")] {
            audited +=
                library_writes_of_a_bogus_lease_are_refused(&attacker_store, &lease, &payload)
                    .await;
            let ungranted = lease.starts_with("zz/");
            for sql in [
                "SELECT reason FROM pgfence.renew(p_lease => $1, p_epoch => 1, p_secret => $2, p_ttl_ms => 60000)",
                "SELECT reason FROM pgfence.release(p_lease => $1, p_epoch => 1, p_secret => $2)",
                "SELECT reason FROM pgfence.renew_many(p_leases => ARRAY[$1], p_epochs => ARRAY[1::bigint], \
                 p_secrets => ARRAY[$2], p_ttl_ms => 60000)",
                "SELECT pgfence.report_belief(p_lease => $1, p_epoch => 1, p_secret => $2, p_event => 'start', \
                 p_at => now(), p_sent_at => now(), p_endpoint => NULL, p_cause => NULL, p_detail => NULL)",
            ] {
                client.query_one(sql, &[&lease, &forged]).await.unwrap();
                if ungranted || sql.contains("report_belief") {
                    audited += 1;
                }
            }
            let raw = client
                .execute(
                    "INSERT INTO pgfence.tasks (lease, key, state, fence) VALUES ($1, 'k', 'pending', 1)",
                    &[&lease],
                )
                .await
                .unwrap();
            assert_eq!(raw, 0, "the raw insert of {lease} was skipped");
            audited += 1;
        }
        let future = common::forged_fence("ta/x", x_epoch + 1 + i);
        audited += refused(
            attacker_store
                .fenced(&future, "flood", async |_conn| Ok::<(), pgfence::Error>(()))
                .await,
            "fenced, future epoch",
        );
        client
            .query_one(
                "SELECT pgfence.report_belief(p_lease => 'ta/x', p_epoch => $1, p_secret => $2, p_event => 'start', \
                 p_at => now(), p_sent_at => now(), p_endpoint => NULL, p_cause => NULL, p_detail => NULL)",
                &[&(x_epoch + 1 + i), &forged],
            )
            .await
            .unwrap();
        audited += 1;
    }
    let rows = audit_of(&db, &attacker).await;
    let tenure: Vec<_> = rows.iter().filter(|r| r.0 != "role").collect();
    assert!(
        tenure.is_empty(),
        "{} tenure rows, the first: {:?}",
        tenure.len(),
        tenure.first()
    );
    let mut reasons: Vec<&str> = rows.iter().map(|r| r.3.as_str()).collect();
    reasons.sort();
    assert_eq!(
        reasons,
        ["bad_secret", "future_epoch", "no_grant", "unknown_lease"],
        "{rows:?}"
    );
    assert_eq!(rows.iter().map(|r| r.5).sum::<i64>(), audited, "{rows:?}");
}

/// Refusals each flooding connection of [`the_audit_is_bounded_per_role_whatever_the_flood`] sends.
const PER_CONNECTION: i64 = 100_000;
/// Entries per `renew_many` call of the flood.
const BATCH: usize = 2_000;

/// Flooding connection `w` of [`the_audit_is_bounded_per_role_whatever_the_flood`], as `attacker`, with the
/// epochs (ta/x's current, ta/many's current, ta/jump's current): 3 s of single refusals with distinct epochs,
/// labels and names through `fence`, `renew` and `report_belief`, then the rest of its `PER_CONNECTION` through
/// `renew_many` (forged secrets of the live tenure and leases of another cluster, `BATCH` a call). How many
/// refusals it sent.
async fn flood_writer(
    db: &TestDb,
    attacker: &str,
    w: i64,
    forged: &str,
    epochs: (i64, i64, i64),
) -> i64 {
    let (x_epoch, many_epoch, jump_epoch) = epochs;
    let client = client_as(db, attacker).await;
    let mut sent = 0i64;
    // Single refusals: 3 s of distinct epochs, labels and names through every refused path.
    let until = std::time::Instant::now() + Duration::from_secs(3);
    let mut i = 0i64;
    while std::time::Instant::now() < until {
        i += 1;
        let (lease, epoch) = match i % 4 {
            0 => ("ta/many", 1 + i % (many_epoch - 1)),
            1 => ("ta/jump", 2 + (w * 1_000_000 + i) % (jump_epoch - 3)),
            2 => ("ta/many", many_epoch + 1 + i),
            _ => ("ta/x", x_epoch),
        };
        let sql = match i % 3 {
            0 => "SELECT outcome FROM pgfence.fence($1, $2, $3, 'flood-' || ($4::bigint % 40), NULL, NULL)",
            1 => "SELECT outcome FROM pgfence.renew($1, $2, $3, 60000) WHERE $4::bigint IS NOT NULL",
            _ => "SELECT pgfence.report_belief($1 || ($4::bigint)::text, $2, $3, 'start', now(), now(), NULL, NULL, NULL)",
        };
        client
            .query_one(sql, &[&lease, &epoch, &forged, &i])
            .await
            .unwrap();
        sent += 1;
    }
    // The bulk through renew_many: forged secrets of the live tenure, and leases of another cluster.
    let calls = (PER_CONNECTION - sent).max(0) as usize / BATCH;
    for c in 0..calls {
        let leases: Vec<String> = (0..BATCH)
            .map(|k| {
                if k % 2 == 0 {
                    "ta/x".to_owned()
                } else {
                    format!("other/{w}-{c}-{k}")
                }
            })
            .collect();
        let epochs: Vec<i64> = (0..BATCH).map(|_| x_epoch).collect();
        let secrets: Vec<&str> = (0..BATCH).map(|_| forged).collect();
        let rows = client
            .query(
                "SELECT outcome FROM pgfence.renew_many($1, $2, $3, 60000)",
                &[&leases, &epochs, &secrets],
            )
            .await
            .unwrap();
        assert!(rows.iter().all(|r| r.get::<_, String>(0) == "refused"));
        sent += BATCH as i64;
    }
    sent
}

/// `renew_many` is linear in its length: 2,000 forged entries (as `attacker`, of `lease`) cost about ten times
/// 200, and under a second.
async fn renew_many_is_linear_in_its_length(
    db: &TestDb,
    attacker: &str,
    lease: &pgfence::Lease,
    forged: &str,
) {
    let client = client_as(db, attacker).await;
    let time_of = async |n: usize| {
        let leases: Vec<&str> = (0..n).map(|_| "ta/x").collect();
        let epochs: Vec<i64> = (0..n).map(|_| lease.epoch().get()).collect();
        let secrets: Vec<&str> = (0..n).map(|_| forged).collect();
        // Past the backpressure's second: each call is timed without its 10 ms answer delay mattering.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let started = std::time::Instant::now();
        client
            .query(
                "SELECT outcome FROM pgfence.renew_many($1, $2, $3, 60000)",
                &[&leases, &epochs, &secrets],
            )
            .await
            .unwrap();
        started.elapsed()
    };
    let small = time_of(200).await;
    let large = time_of(2_000).await;
    eprintln!("renew_many of forged entries: 200 in {small:?}, 2,000 in {large:?}");
    assert!(
        large < Duration::from_secs(1) && large < small * 40,
        "renew_many of 200 forged entries took {small:?}, of 2,000 {large:?}"
    );
}

/// The audit is bounded per role whatever it is flooded with: four connections of one role send 100,000
/// refusals each — forged secrets and leases of a cluster it has no grant on through `renew_many` (2,000 a
/// call), and distinct presented epochs (real old tenures, epochs never issued in a failover-sized jump,
/// future ones), operation labels, bogus lease names and bogus belief reports through `fence`, `renew` and
/// `report_belief` — and the audit ends with at most 26 tenure rows per (lease, epoch) and 16 × 26 per lease
/// (the bound of docs/security.md) and one role row per reason, whose counts add up to every refusal sent.
/// `renew_many` stays linear in its length. Fails on a tenure row per presented epoch (the old rule), and on
/// renew_many's one audit call per entry (its 2,000 entries took seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_is_bounded_per_role_whatever_the_flood() {
    let (db, store, lease, attacker, _) = holder_and_attacker().await;
    // A lease with 20 real tenures, and one whose epoch jumped as a failover's does (epochs 2..2^32 never
    // issued).
    let old = superseded_tenures(&store, "many", 20).await;
    let jumped = store.acquire("jump", "a-ctrl", TTL).await.unwrap();
    db.client()
        .await
        .batch_execute("UPDATE pgfence.leases SET epoch = 4294967296 WHERE name = 'ta/jump'")
        .await
        .unwrap();
    let jumped_now = store.acquire("jump", "a-ctrl", TTL).await.unwrap();
    assert!(jumped_now.epoch().get() > 4294967296, "{jumped:?}");
    let forged = "f".repeat(64);

    let started = std::time::Instant::now();
    let mut writers = Vec::new();
    for w in 0..4i64 {
        let (db, attacker, forged) = (db.clone(), attacker.clone(), forged.clone());
        let (x_epoch, many_epoch, jump_epoch) = (
            lease.epoch().get(),
            old.epoch().get(),
            jumped_now.epoch().get(),
        );
        writers.push(tokio::spawn(async move {
            flood_writer(
                &db,
                &attacker,
                w,
                &forged,
                (x_epoch, many_epoch, jump_epoch),
            )
            .await
        }));
    }
    let mut sent = 0;
    for w in writers {
        sent += w.await.unwrap();
    }
    let took = started.elapsed();
    let rows = audit_of(&db, &attacker).await;
    let counted: i64 = rows.iter().map(|r| r.5).sum();
    // report_belief's bogus names and fence/renew of another cluster are the only refusals that count once;
    // renew of a superseded or future epoch is answered 'refused' with a loss reason (not a refused write's
    // audit): not audited.
    let tenure_rows_per_lease = |lease: &str| {
        rows.iter()
            .filter(|r| r.0 == "tenure" && r.1 == lease)
            .count()
    };
    for lease in ["ta/x", "ta/many", "ta/jump"] {
        assert!(
            tenure_rows_per_lease(lease) <= 16 * PER_TENURE,
            "{lease}: {} tenure rows",
            tenure_rows_per_lease(lease)
        );
    }
    let mut per_tenure = std::collections::HashMap::new();
    for r in rows.iter().filter(|r| r.0 == "tenure") {
        *per_tenure.entry((r.1.as_str(), r.2)).or_insert(0) += 1;
    }
    assert!(
        per_tenure.values().all(|n| *n <= PER_TENURE),
        "{per_tenure:?}"
    );
    // Epochs never issued (the jump's gap) and tenures older than the lease's 16 newest get no tenure row: only
    // ta/jump's two real tenures and ta/many's epochs 5 to 19 (of 20) can have them.
    assert!(
        tenure_rows_per_lease("ta/jump") <= 2 * PER_TENURE,
        "{rows:?}"
    );
    assert!(
        rows.iter()
            .all(|r| !(r.0 == "tenure" && r.1 == "ta/many" && r.2 < 5)),
        "a tenure row for one of ta/many's oldest tenures"
    );
    let role_rows: Vec<_> = rows.iter().filter(|r| r.0 == "role").collect();
    let mut reasons: Vec<&str> = role_rows.iter().map(|r| r.3.as_str()).collect();
    reasons.dedup();
    assert_eq!(
        reasons.len(),
        role_rows.len(),
        "one role row per reason: {role_rows:?}"
    );
    assert!(
        rows.len() <= 3 * 16 * PER_TENURE + 13,
        "{} rows",
        rows.len()
    );
    assert!(
        counted <= sent && counted >= 4 * (PER_CONNECTION - 20_000),
        "counted {counted} of {sent}"
    );
    eprintln!(
        "flood: {sent} refusals from 4 connections in {took:?}; {} audit rows ({} role-scope), counts {counted}",
        rows.len(),
        role_rows.len()
    );

    renew_many_is_linear_in_its_length(&db, &attacker, &lease, &forged).await;
}

/// A database migrated by a non-superuser owner (the documented layout): (db, owner role, the owner's store).
async fn owned_installation() -> (TestDb, String, Store) {
    let (db, owner) = owned_db().await;
    let store = store_as(&db, &owner, "c1").await;
    store.migrate().await.unwrap();
    // The mutation gate's weakened SQL, when one is set (TestDb::new applies it to the template's clones).
    common::apply_mutant(&db.url).await;
    (db, owner, store)
}

/// Runs `sql` on a connection of its own and returns the WARNINGs and NOTICEs the server sent.
async fn notices_of(url: &str, sql: &str) -> Vec<String> {
    use futures_util::StreamExt;
    let (client, mut connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        let mut notices = Vec::new();
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notice(notice) = message {
                notices.push(notice.message().to_owned());
            }
        }
        notices
    });
    client.batch_execute(sql).await.unwrap();
    drop(client);
    driver.await.unwrap()
}

/// What a role given `GRANT ALL` on pgfence's tables (and the schema) does in the window before the next
/// `_harden`: it creates a trigger on two pgfence tables whose function, run as the owner inside pgfence's
/// functions, grants it every cluster as an operator, zeroes the other roles' audit counts and copies the
/// transaction's tenure secrets into a table of its own; and as itself it changes the takeover grace, the
/// instance id and the migration record, and (with the grant option) passes privileges on to a third role.
async fn careless_grant_window(
    with_grant_option: bool,
) -> (TestDb, String, String, String, String) {
    let (db, owner, owner_store) = owned_installation().await;
    let app1 = app_role(&db, &owner_store, "app1", Some("c1")).await;
    let app2 = app_role(&db, &owner_store, "app2", Some("c2")).await;
    let app3 = role(&db, "app3").await;
    let option = if with_grant_option {
        " WITH GRANT OPTION"
    } else {
        ""
    };
    db.client()
        .await
        .batch_execute(&format!(
            "GRANT ALL ON ALL TABLES IN SCHEMA pgfence TO {app2}{option}; \
             GRANT ALL ON ALL SEQUENCES IN SCHEMA pgfence TO {app2}{option}; \
             GRANT ALL ON SCHEMA pgfence TO {app2}{option}; \
             CREATE SCHEMA evil AUTHORIZATION {app2}"
        ))
        .await
        .unwrap();
    let raw = client_as(&db, &app2).await;
    raw.batch_execute(&format!(
        "CREATE TABLE evil.loot (what text); GRANT INSERT ON evil.loot TO PUBLIC; GRANT USAGE ON SCHEMA evil TO PUBLIC;
         CREATE FUNCTION evil.steal() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             BEGIN
                 INSERT INTO pgfence.grants (role, cluster, operator, granted_by)
                 VALUES ('{app2}'::regrole, NULL, true, '{owner}');
             EXCEPTION WHEN OTHERS THEN INSERT INTO evil.loot VALUES ('refused: ' || SQLERRM);
             END;
             BEGIN
                 UPDATE pgfence.rejections SET count = 0 WHERE role <> '{app2}';
             EXCEPTION WHEN OTHERS THEN INSERT INTO evil.loot VALUES ('refused: ' || SQLERRM);
             END;
             INSERT INTO evil.loot SELECT 'secret ' || s FROM pgfence.leases l,
                 LATERAL current_setting('pgfence.tenure_secret_' || l.lock_key, true) AS s WHERE s <> '';
             RETURN NULL;
         END $$;
         CREATE TRIGGER zz_steal AFTER INSERT ON pgfence.tasks FOR EACH ROW EXECUTE FUNCTION evil.steal();
         CREATE TRIGGER zz_steal AFTER INSERT ON pgfence.rejections FOR EACH ROW EXECUTE FUNCTION evil.steal();"
    ))
    .await
    .unwrap();
    for sql in [
        "UPDATE pgfence.instance SET takeover_grace_ms = 600000".to_owned(),
        "UPDATE pgfence.instance SET instance_id = gen_random_uuid()".to_owned(),
        "DELETE FROM pgfence.__diesel_schema_migrations".to_owned(),
        format!("INSERT INTO pgfence.grants (role, cluster, operator) VALUES ('{app2}'::regrole, NULL, true)"),
    ] {
        // Refused (row-level security or the trusted-writes trigger), or it changes nothing.
        if let Ok(n) = raw.execute(sql.as_str(), &[]).await {
            assert_eq!(n, 0, "{sql}");
        }
    }
    if with_grant_option {
        raw.batch_execute(&format!(
            "GRANT SELECT ON pgfence.tenure_secrets, pgfence.grants TO {app3}; GRANT USAGE ON SCHEMA pgfence TO {app3}"
        ))
        .await
        .unwrap();
    }
    // app1 works meanwhile: a task (the trigger on tasks fires) and a stale write (the one on rejections).
    let store = store_as(&db, &app1, "c1").await;
    let old = store.acquire("x", "pod-a", TTL).await.unwrap();
    let lease = store.acquire("x", "pod-a", TTL).await.unwrap();
    store
        .tasks()
        .create(&lease.fence(), "job", &serde_json::json!({}))
        .await
        .unwrap();
    store
        .tasks()
        .create(&old.fence(), "late", &serde_json::json!({}))
        .await
        .unwrap_err();
    (db, owner, app1, app2, app3)
}

/// `_harden` repairs what a careless GRANT ALL let a role do (invariant 8): in the window, its owner-run trigger
/// could neither grant it anything nor bend another role's audit, and as itself it could not change the instance
/// settings or the migration record; after the next grant (which runs `_harden`) no foreign trigger, privilege,
/// grant option or privilege passed on is left, the role cannot end another cluster's tenure, a new tenure's
/// secret is no longer exposed, and the WARNINGs say what was removed. Fails on a `_harden` that only drops
/// triggers and revokes TRIGGER/TRUNCATE/REFERENCES (the DML privileges and what was passed on stayed).
async fn harden_repairs_the_careless_grant(with_grant_option: bool) {
    let (db, owner, app1, app2, app3) = careless_grant_window(with_grant_option).await;
    let admin = db.client().await;
    let one = |sql: &'static str| {
        let admin = &admin;
        async move { admin.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    assert_eq!(
        one("SELECT count(*) FROM pgfence.grants WHERE cluster IS NULL").await,
        0
    );
    assert_eq!(
        one("SELECT count(*) FROM pgfence.rejections WHERE count = 0").await,
        0
    );
    assert_eq!(
        one("SELECT takeover_grace_ms FROM pgfence.instance").await,
        2000
    );
    assert!(one("SELECT count(*) FROM pgfence.__diesel_schema_migrations").await >= 5);
    let instance: String = admin
        .query_one("SELECT instance_id::text FROM pgfence.instance", &[])
        .await
        .unwrap()
        .get(0);

    let warnings = notices_of(&url_as(&db, &owner), "SELECT pgfence._harden()").await;
    let said = warnings.join("\n");
    assert!(
        said.contains("dropped trigger 'zz_steal'") && said.contains("revoked"),
        "{said}"
    );
    assert_eq!(
        one(
            "SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid \
              WHERE c.relnamespace = 'pgfence'::regnamespace AND t.tgname = 'zz_steal'"
        )
        .await,
        0
    );
    for (who, expected_select) in [(app2.as_str(), true), (app3.as_str(), false)] {
        let privileges: Vec<String> = admin
            .query(
                "SELECT c.relname || ':' || p FROM pg_class c, unnest(ARRAY['INSERT', 'UPDATE', 'DELETE', \
                  'TRUNCATE', 'REFERENCES', 'TRIGGER', 'SELECT WITH GRANT OPTION']) p \
                  WHERE c.relnamespace = 'pgfence'::regnamespace AND c.relkind IN ('r', 'v', 'S') \
                    AND has_table_privilege($1::text, c.oid, p)",
                &[&who],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(privileges.is_empty(), "{who} kept {privileges:?}");
        let reads: bool = admin
            .query_one(
                "SELECT has_table_privilege($1::text, 'pgfence.leases', 'SELECT')",
                &[&who],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(reads, expected_select, "{who}: SELECT on leases");
        let secrets: bool = admin
            .query_one(
                "SELECT has_table_privilege($1::text, 'pgfence.tenure_secrets', 'SELECT')",
                &[&who],
            )
            .await
            .unwrap()
            .get(0);
        assert!(!secrets, "{who} reads tenure secrets");
    }
    let create: bool = admin
        .query_one(
            "SELECT has_schema_privilege($1::text, 'pgfence', 'CREATE')",
            &[&app2],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!create, "CREATE on the schema");
    let same: String = admin
        .query_one("SELECT instance_id::text FROM pgfence.instance", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(same, instance);

    // app2 cannot end cluster c1's tenure, and a new tenure's secret goes nowhere.
    let intruder = store_as(&db, &app2, "c1").await;
    assert!(intruder.admin().force_release("x").await.is_err());
    let loot = one("SELECT count(*) FROM evil.loot").await;
    let store = store_as(&db, &app1, "c1").await;
    let fresh = store.acquire("x", "pod-a", TTL).await.unwrap();
    store
        .tasks()
        .create(&fresh.fence(), "after", &serde_json::json!({}))
        .await
        .unwrap();
    assert_eq!(
        one("SELECT count(*) FROM evil.loot").await,
        loot,
        "nothing captured after _harden"
    );

    // A function the owner adds later is not executable by granted roles.
    client_as(&db, &owner)
        .await
        .batch_execute(
            "CREATE FUNCTION pgfence.added_later() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        )
        .await
        .unwrap();
    let runs: bool = admin
        .query_one(
            "SELECT has_function_privilege($1::text, 'pgfence.added_later()', 'EXECUTE')",
            &[&app2],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        !runs,
        "a function added later is executable by a granted role"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harden_repairs_a_careless_grant_all() {
    harden_repairs_the_careless_grant(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harden_repairs_a_careless_grant_all_with_grant_option() {
    harden_repairs_the_careless_grant(true).await;
}

/// Backpressure on every refused path that holds no lock (the audit's bound in time): a forged `renew`,
/// `renew_many`, `release` and `report_belief` repeated within a second is answered at least 10 ms later, so a
/// role hammering any of them gets about 100 refusals a second per audit row. (A lower bound on a sleep: it cannot
/// be met early.) Fails on a refused path that passes `p_may_wait => false` to the audit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refused_path_answers_a_repeat_later() {
    let (db, _store, lease, attacker, _) = holder_and_attacker().await;
    let client = client_as(&db, &attacker).await;
    for (what, sql) in forged_calls(lease.epoch().get())
        .into_iter()
        .filter(|(what, _)| ["renew", "renew_many", "release", "report_belief"].contains(what))
    {
        client.simple_query(&sql).await.unwrap();
        let started = Instant::now();
        client.simple_query(&sql).await.unwrap();
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(10),
            "a repeated forged {what} was answered in {took:?}"
        );
    }
}

/// Plants, as the role running it, an overload of every function of the schema pgfence (read from the catalog, so
/// a function added later is covered without a change here): for each parameter, one copy per type of
/// `text, integer, bigint, numeric, name, boolean` (other than the parameter's own), with the other parameters,
/// their names and (after that parameter) their defaults as the original has them. An untyped NULL or `'…'`
/// literal resolves to the `text` copy, an integer literal or an `integer` value passed to a `bigint` parameter to
/// the `integer` copy, a `name` (a catalog column) passed to a `text` parameter to the `name` copy. Each copy
/// records that it ran in `plant.hits` and bumps the sequence `plant.hit_count`, which no rollback undoes.
const PLANT_OVERLOADS: &str = r#"
DO $plant$
DECLARE
    f record;
    args text[];
    t text;
    made int := 0;
BEGIN
    FOR f IN SELECT p.proname, ARRAY(SELECT unnest(p.proargtypes::regtype[]::text[])) AS types, p.pronargs AS n,
                    p.pronargdefaults AS ndefaults, pg_get_function_result(p.oid) AS result,
                    coalesce((SELECT array_agg(a.name ORDER BY a.i)
                                FROM unnest(p.proargnames, coalesce(p.proargmodes,
                                            array_fill('i'::"char", ARRAY[cardinality(p.proargnames)])))
                                     WITH ORDINALITY AS a(name, mode, i)
                               WHERE a.mode IN ('i', 'b', 'v')), array_fill(''::text, ARRAY[p.pronargs])) AS names
               FROM pg_proc p
              WHERE p.pronamespace = 'pgfence'::regnamespace AND p.prokind = 'f' AND p.pronargs > 0
                AND p.prorettype <> 'trigger'::regtype
    LOOP
        FOR i IN 1..f.n LOOP
            FOREACH t IN ARRAY ARRAY['text', 'integer', 'bigint', 'numeric', 'name', 'boolean'] LOOP
                CONTINUE WHEN f.types[i] = t;
                args := ARRAY[]::text[];
                FOR j IN 1..f.n LOOP
                    args := args || format('%s %s%s', CASE WHEN f.names[j] <> '' THEN quote_ident(f.names[j]) END,
                                           CASE WHEN j = i THEN t ELSE f.types[j] END,
                                           CASE WHEN j > i AND j > f.n - f.ndefaults THEN ' DEFAULT NULL' ELSE '' END);
                END LOOP;
                BEGIN
                    EXECUTE format('CREATE FUNCTION pgfence.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L',
                        f.proname, array_to_string(args, ', '), f.result,
                        format($b$BEGIN
                                      INSERT INTO plant.hits VALUES (%L, session_user, current_user);
                                      PERFORM nextval('plant.hit_count');
                                      %s
                                  END$b$,
                               format('pgfence.%I(%s)', f.proname, array_to_string(args, ', ')),
                               CASE WHEN f.result ~ '^(TABLE|SETOF)' OR f.result = 'void' THEN 'RETURN;'
                                    ELSE 'RETURN NULL;' END));
                    made := made + 1;
                EXCEPTION WHEN duplicate_function THEN NULL;
                END;
            END LOOP;
        END LOOP;
    END LOOP;
    INSERT INTO plant.planted VALUES (made);
END
$plant$;
-- And one of every other kind a role with CREATE on the schema can make there.
CREATE OPERATOR pgfence.= (LEFTARG = text, RIGHTARG = text, FUNCTION = plant.loud_texteq);
CREATE OPERATOR pgfence.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = textcat);
CREATE TYPE pgfence.planted_enum AS ENUM ('a');
CREATE DOMAIN pgfence.planted_domain AS text;
CREATE TABLE pgfence.planted_table (a pgfence.planted_enum, b serial);
CREATE VIEW pgfence.planted_view AS SELECT * FROM pgfence.planted_table;
CREATE FUNCTION pgfence.planted_function(pgfence.planted_domain) RETURNS int LANGUAGE sql AS 'SELECT 1';
CREATE PROCEDURE pgfence.planted_procedure() LANGUAGE sql AS 'SELECT 1';
CREATE AGGREGATE pgfence.planted_aggregate(int) (SFUNC = int4pl, STYPE = int);
CREATE COLLATION pgfence.planted_collation FROM "C";
CREATE TEXT SEARCH CONFIGURATION pgfence.planted_search (COPY = simple);
CREATE STATISTICS pgfence.planted_statistics ON a, b FROM pgfence.planted_table;
"#;

/// The objects in the schema pgfence that a role other than its owner owns, as `kind name (owner)`.
async fn foreign_objects(db: &TestDb) -> Vec<String> {
    db.client()
        .await
        .query(
            "WITH s AS (SELECT oid, nspowner FROM pg_namespace WHERE nspname = 'pgfence') \
             SELECT format('function %s (%s)', p.oid::regprocedure, p.proowner::regrole) FROM pg_proc p, s \
              WHERE p.pronamespace = s.oid AND p.proowner <> s.nspowner \
             UNION ALL SELECT format('relation %s (%s)', c.oid::regclass, c.relowner::regrole) FROM pg_class c, s \
              WHERE c.relnamespace = s.oid AND c.relowner <> s.nspowner \
             UNION ALL SELECT format('type %s (%s)', t.oid::regtype, t.typowner::regrole) FROM pg_type t, s \
              WHERE t.typnamespace = s.oid AND t.typowner <> s.nspowner \
             UNION ALL SELECT format('operator %s (%s)', o.oid::regoperator, o.oprowner::regrole) FROM pg_operator o, s \
              WHERE o.oprnamespace = s.oid AND o.oprowner <> s.nspowner \
             UNION ALL SELECT format('collation %s', c.collname) FROM pg_collation c, s \
              WHERE c.collnamespace = s.oid AND c.collowner <> s.nspowner \
             UNION ALL SELECT format('text search configuration %s', c.cfgname) FROM pg_ts_config c, s \
              WHERE c.cfgnamespace = s.oid AND c.cfgowner <> s.nspowner \
             UNION ALL SELECT format('statistics %s', x.stxname) FROM pg_statistic_ext x, s \
              WHERE x.stxnamespace = s.oid AND x.stxowner <> s.nspowner",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Which planted overloads ran, in whose session and as which role (`plant.hits`), and whether any ran at all
/// even in a transaction that rolled back (`plant.hit_count`).
async fn planted_runs(db: &TestDb) -> (Vec<String>, bool) {
    let client = db.client().await;
    let hits = client
        .query(
            "SELECT format('%s in a session of %s as %s', fn, session_role, as_role) FROM plant.hits",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let called: bool = client
        .query_one("SELECT is_called FROM plant.hit_count", &[])
        .await
        .unwrap()
        .get(0);
    (hits, called)
}

/// The calls a granted role (`app1`, cluster c1) and a role granted another cluster (`app3`) make: an acquisition,
/// a guarded write, a stale one, a renewal, a forged fence, renewal, release and belief report (typed as the
/// library sends them), a release, and app3's refused acquisition and write on c1 (`refused` / `no_grant`).
/// Every path of the effect ledger once (intent, unknown outcome, the in-doubt list, a retry, a stale outcome
/// kept or not as a late report, a task write that checks for doubt), as the role of `store`.
async fn ledger_calls(store: &Store, old: &pgfence::Lease, lease: &pgfence::Lease) {
    use pgfence::effects::{Outcome, Settlement};
    let (ledger, fence, empty) = (store.effects(), lease.fence(), serde_json::json!({}));
    // A task and key of this tenure's own (the calls run once in the window and once after the repair).
    let task = format!("effects-{}", lease.epoch());
    let key = format!("{task}/x");
    store.tasks().create(&fence, &task, &empty).await.unwrap();
    ledger.intend(&fence, &task, &key, &empty).await.unwrap();
    let unknown = Outcome::Unknown(empty.clone());
    ledger.record_outcome(&fence, &key, &unknown).await.unwrap();
    assert_eq!(ledger.in_doubt("x").await.unwrap().len(), 1);
    let retry = Settlement::Retry {
        observed: empty.clone(),
    };
    ledger.settle(&fence, &key, &retry).await.unwrap();
    let late = Outcome::Done(empty.clone());
    assert!(ledger
        .record_outcome(&old.fence(), &key, &late)
        .await
        .is_err());
    ledger.record_outcome(&fence, &key, &late).await.unwrap();
    store.tasks().claim(&fence, &task, "w").await.unwrap();
}

async fn everyday_calls(db: &TestDb, app1: &str, app3: &str) {
    let store = store_as(db, app1, "c1").await;
    let old = store.acquire("x", "pod-a", TTL).await.unwrap();
    let mut lease = store.acquire("x", "pod-a", TTL).await.unwrap();
    store
        .tasks()
        .create(&lease.fence(), "job", &serde_json::json!({}))
        .await
        .unwrap();
    assert!(store
        .tasks()
        .create(&old.fence(), "late", &serde_json::json!({}))
        .await
        .is_err());
    ledger_calls(&store, &old, &lease).await;
    store.renew(&mut lease).await.unwrap();
    let raw = client_as(db, app1).await;
    let forged = "f".repeat(64);
    for sql in [
        "SELECT outcome::text FROM pgfence.fence('c1/x'::text, $1::bigint, $2::text, 'hold'::text, NULL::text, NULL::text)",
        "SELECT outcome::text FROM pgfence.renew('c1/x'::text, $1::bigint, $2::text, 60000::bigint)",
        "SELECT outcome::text FROM pgfence.release('c1/x'::text, $1::bigint, $2::text)",
        "SELECT pgfence.report_belief('c1/x'::text, $1::bigint, $2::text, 'end'::text, now(), now(), NULL::text, \
         'released'::text, NULL::text)::text",
    ] {
        let answer: Option<String> = raw
            .query_one(sql, &[&lease.epoch().get(), &forged])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .get(0);
        assert!(answer.is_some(), "{sql}: no answer");
    }
    store.release(&lease).await.unwrap();
    let outsider = store_as(db, app3, "c1").await;
    let refused = outsider.acquire("x", "pod-b", TTL).await.unwrap_err();
    assert!(
        matches!(
            refused,
            pgfence::Error::Denied {
                reason: pgfence::LossReason::NoGrant,
                ..
            }
        ),
        "{refused:?}"
    );
    let refused = outsider
        .tasks()
        .create(&old.fence(), "intruder", &serde_json::json!({}))
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            pgfence::Error::Denied {
                reason: pgfence::LossReason::NoGrant,
                ..
            }
        ),
        "{refused:?}"
    );
}

/// Invariant 8 against a careless `GRANT ALL ON SCHEMA pgfence` (CREATE on the trust root): a role that plants an
/// overload of every pgfence function (generated from the catalog, each writing a side table) and one object of
/// every other kind never gets its code run by pgfence — not in the window, in another role's refused calls, nor
/// during the repair — and the next grant drops every object of another role in the schema and says so in what
/// it returns (what the CLI prints). Fails when one internal call passes an untyped NULL or literal, or a value
/// of another type than the parameter's (the planted copy then runs as the owner), and on a `_harden` that leaves
/// foreign functions in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_planted_during_a_careless_schema_grant_never_run_and_are_dropped() {
    let (db, _owner, owner_store) = owned_installation().await;
    let app1 = app_role(&db, &owner_store, "app1", Some("c1")).await;
    let app3 = app_role(&db, &owner_store, "app3", Some("c3")).await;
    let app2 = role(&db, "app2").await;
    db.client()
        .await
        .batch_execute(&format!(
            "GRANT ALL ON SCHEMA pgfence TO {app2}; CREATE SCHEMA plant AUTHORIZATION {app2}"
        ))
        .await
        .unwrap();
    let planter = client_as(&db, &app2).await;
    planter
        .batch_execute(
            "CREATE TABLE plant.hits (fn text, session_role name, as_role name); \
             CREATE TABLE plant.planted (n int); \
             CREATE SEQUENCE plant.hit_count; \
             CREATE FUNCTION plant.loud_texteq(text, text) RETURNS boolean LANGUAGE plpgsql AS $$ \
                 BEGIN INSERT INTO plant.hits VALUES ('operator =', session_user, current_user); \
                       PERFORM nextval('plant.hit_count'); RETURN $1 OPERATOR(pg_catalog.=) $2; END $$; \
             GRANT USAGE ON SCHEMA plant TO PUBLIC; GRANT INSERT ON plant.hits TO PUBLIC; \
             GRANT USAGE, UPDATE ON SEQUENCE plant.hit_count TO PUBLIC; \
             GRANT EXECUTE ON FUNCTION plant.loud_texteq(text, text) TO PUBLIC;",
        )
        .await
        .unwrap();
    planter.batch_execute(PLANT_OVERLOADS).await.unwrap();
    let planted = db.scalar("SELECT n::bigint FROM plant.planted").await;
    assert!(planted > 1000, "planted only {planted} overloads");
    assert!(foreign_objects(&db).await.len() as i64 > planted);

    // The window: the planted copies exist, and everyday calls (refused ones in another role's session among
    // them) never run one.
    everyday_calls(&db, &app1, &app3).await;
    assert_eq!(planted_runs(&db).await, (vec![], false), "in the window");

    // The next grant repairs: no object of another role is left, and what it dropped is in its answer.
    let repairs = owner_store
        .admin()
        .grant_application(&app3, Some("c4"))
        .await
        .unwrap();
    assert_eq!(foreign_objects(&db).await, Vec::<String>::new());
    let said = repairs.join("\n");
    for expected in [
        "dropped function 'pgfence._reject(p_lease text, p_epoch bigint, p_current_epoch text"
            .to_owned(),
        "dropped operator 'pgfence.=(text, text)'".to_owned(),
        "dropped table 'pgfence.planted_table'".to_owned(),
        "dropped type 'pgfence.planted_enum'".to_owned(),
        format!("revoked CREATE on SCHEMA pgfence from '{app2}'"),
    ] {
        assert!(said.contains(&expected), "{expected} not in {said}");
    }
    assert!(said.contains(&format!("owned by '{app2}'")), "{said}");
    assert_eq!(
        repairs.iter().filter(|r| r.starts_with("dropped ")).count() as i64,
        planted + 12,
        "one repair per object dropped"
    );
    assert!(!said.contains("EXECUTE on FUNCTION"), "{said}");

    // After it, the same calls again; the side table stays empty throughout.
    everyday_calls(&db, &app1, &app3).await;
    assert_eq!(planted_runs(&db).await, (vec![], false), "after the repair");
}
