//! The trust boundary, with real roles and real connections (invariant 8: no role touches a lease outside the
//! clusters it was granted, and knowing (lease, epoch) is not enough to write or to end a tenure).
//!
//! Two application roles, each granted one cluster; an operator granted one cluster; a role some careless DBA
//! gave table privileges. Every refusal is checked where it matters — in the database — and in its audit row.

use crate::common;

use std::time::Duration;

use common::fixture::{app_role, app_store, take_over};
use common::{
    client_as, guarded_writes_per_second, median, role, sqlstate, store_as, url_as, TestDb,
};
use pgfence::{Error, LossReason, Next, Store, StoreConfig};
use proptest::prelude::*;
use serde_json::json;

const TTL: Duration = Duration::from_secs(60);

/// A fresh database with two application roles, both granted cluster `c`, and a store of `c` logged in as each.
async fn two_applications() -> (TestDb, String, String, Store, Store) {
    let db = TestDb::new().await;
    let owner = db.store("c").await;
    let (app, s1) = app_store(&db, &owner, "app", "c").await;
    let (app2, s2) = app_store(&db, &owner, "app2", "c").await;
    (db, app, app2, s1, s2)
}

/// `result` is a denial for `expected`, and says stop: a denied role or secret is denied again however often it
/// asks or campaigns.
fn denied(result: Result<impl std::fmt::Debug, Error>, expected: LossReason, what: &str) {
    match result {
        Err(e @ Error::Denied { reason, .. }) if reason == expected => {
            assert_eq!(e.next(), Next::Stop, "{what}");
        }
        other => panic!("{what}: expected Denied {{ {expected:?} }}, got {other:?}"),
    }
}

/// Audit rows: (role, scope, lease, reason, operation, count), ordered.
async fn audit(db: &TestDb) -> Vec<(String, String, String, String, String, i64)> {
    db.client()
        .await
        .query(
            "SELECT role::text, scope, lease, reason, operation, count FROM pgfence.rejections \
              ORDER BY role, scope, lease, reason, operation",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect()
}

/// Every call of a store of cluster a logged in as a role granted only cluster b, with everything `lease`'s
/// leaked fence carries, is refused as `Denied { NoGrant }`.
async fn every_call_of_another_clusters_role_is_denied(intruder: &Store, lease: &pgfence::Lease) {
    let fence = lease.fence();
    denied(
        intruder.acquire("sched", "pod-x", TTL).await,
        LossReason::NoGrant,
        "acquire",
    );
    denied(
        intruder.acquire("fresh", "pod-x", TTL).await,
        LossReason::NoGrant,
        "acquire of a new lease",
    );
    let mut stolen = lease.clone();
    denied(
        intruder.renew(&mut stolen).await,
        LossReason::NoGrant,
        "renew",
    );
    denied(
        intruder.release(lease).await,
        LossReason::NoGrant,
        "release",
    );
    denied(
        intruder.tasks().create(&fence, "evil", &json!({})).await,
        LossReason::NoGrant,
        "create_task",
    );
    denied(
        intruder.tasks().claim(&fence, "job", "evil").await,
        LossReason::NoGrant,
        "claim_task",
    );
    denied(
        intruder
            .fenced(&fence, "evil", async |_conn| Ok::<_, Error>(()))
            .await,
        LossReason::NoGrant,
        "fenced",
    );
}

/// Row-level security shows the role `who` (through its raw client and its store of cluster a) nothing of
/// cluster a — not even through an error raised by its own condition on a view — and no tenure secret at all.
async fn another_clusters_role_reads_nothing(
    raw: &tokio_postgres::Client,
    intruder: &Store,
    who: &str,
) {
    for table in [
        "pgfence.leases",
        "pgfence.tenures",
        "pgfence.tasks",
        "pgfence.task_events",
        "pgfence.tenure_history",
    ] {
        let n: i64 = raw
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 0, "{table} as {who}");
    }
    // Not even through an error raised by the caller's own condition on the view (it would quote the row).
    let through_error = raw
        .query_one(
            "SELECT count(*) FROM pgfence.tenure_history WHERE (lease || holder)::int = 0",
            &[],
        )
        .await;
    assert!(
        matches!(&through_error, Ok(row) if row.get::<_, i64>(0) == 0),
        "{through_error:?}"
    );
    assert!(intruder.lease_status("sched").await.unwrap().is_none());
    assert!(intruder
        .tasks()
        .get("sched", "job")
        .await
        .unwrap()
        .is_none());
    let secrets = raw
        .query_one("SELECT count(*) FROM pgfence.tenure_secrets", &[])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&secrets), "42501");
}

/// A second application role, granted another cluster, cannot acquire, renew, release, write under, fence,
/// force-release or read the first cluster's leases — even knowing holder, epoch and secret — and every
/// refusal is a typed error (`Denied { NoGrant }`) and one aggregated audit row under the refused role. Its own
/// cluster works as usual, and the first role's lease is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_cannot_touch_or_read_another_clusters_leases() {
    let db = TestDb::new().await;
    let owner = db.store("a").await;
    let app = app_role(&db, &owner, "app", Some("a")).await;
    let app2 = app_role(&db, &owner, "app2", Some("b")).await;

    let a = store_as(&db, &app, "a").await;
    let lease = a.acquire("sched", "pod-a", TTL).await.unwrap();
    a.tasks()
        .create(&lease.fence(), "job", &json!({}))
        .await
        .unwrap();

    // app2 pointed at cluster a, with everything a leaked fence carries.
    let intruder = store_as(&db, &app2, "a").await;
    every_call_of_another_clusters_role_is_denied(&intruder, &lease).await;
    // force_release without operator rights: refused like every other call without the right ('no_grant').
    let raw = client_as(&db, &app2).await;
    let forced = raw
        .query_one(
            "SELECT outcome, reason FROM pgfence.force_release('a/sched')",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (forced.get::<_, String>(0), forced.get::<_, String>(1)),
        ("refused".to_owned(), "no_grant".to_owned())
    );

    another_clusters_role_reads_nothing(&raw, &intruder, &app2).await;

    // Nothing moved: the tenure is app's, live, with one task.
    let status = a.lease_status("sched").await.unwrap().unwrap();
    assert_eq!(
        (status.holder.as_deref(), status.epoch),
        (Some("pod-a"), Some(lease.epoch()))
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.tasks").await,
        1,
        "no task was written by the intruder"
    );
    let mut renewed = lease.clone();
    a.renew(&mut renewed).await.unwrap();

    // Its own cluster works.
    let b = store_as(&db, &app2, "b").await;
    let own = b.acquire("sched", "pod-b", TTL).await.unwrap();
    b.tasks()
        .create(&own.fence(), "job", &json!({}))
        .await
        .unwrap();
    assert_eq!(b.admin().leases().await.unwrap().len(), 1);
    assert_eq!(
        a.admin().leases().await.unwrap().len(),
        1,
        "app sees only a/sched"
    );

    // The audit: one aggregated role-scope row for app2's no_grant refusals (the first one's operation), none
    // for app; the intruder sees its own row, app sees none of it.
    let rows = audit(&db).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (who, scope, lease_name, reason, operation, count) = &rows[0];
    assert_eq!(
        (
            who.as_str(),
            scope.as_str(),
            lease_name.as_str(),
            reason.as_str()
        ),
        (app2.as_str(), "role", "a/sched", "no_grant")
    );
    assert_eq!(operation, "acquire");
    assert_eq!(
        *count, 8,
        "acquire ×2, renew, release, create_task, claim_task, fenced, force_release"
    );
    let own_view: i64 = raw
        .query_one("SELECT count(*) FROM pgfence.rejections", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(own_view, 1);
    let app_view: i64 = client_as(&db, &app)
        .await
        .query_one("SELECT count(*) FROM pgfence.rejections", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(app_view, 0, "a role-scope row is its role's own");
}

/// The one-statement path, on a table of the application's: a forged fence is refused and audited and writes
/// nothing — and as an application role, a statement not gated on the verdict fails whole (PF006), never with a
/// missing privilege; the real fence writes.
async fn a_forged_one_statement_write_is_refused(
    db: &TestDb,
    store: &Store,
    app: &str,
    forged: &pgfence::Fence,
    real: &pgfence::Fence,
) {
    db.client()
        .await
        .batch_execute(&format!(
            "CREATE TABLE shards (id int PRIMARY KEY, owner text); INSERT INTO shards VALUES (1, 'a'); \
             GRANT SELECT, UPDATE ON shards TO {app}"
        ))
        .await
        .unwrap();
    let gated = || {
        diesel::sql_query(
            "UPDATE shards SET owner = 'evil' WHERE id = 1 AND (SELECT passed FROM pgfence_guard)",
        )
    };
    denied(
        store.guarded_write(forged, "evil", gated()).await,
        LossReason::BadSecret,
        "guarded_write",
    );
    let ungated = store
        .guarded_write(
            forged,
            "evil",
            diesel::sql_query("UPDATE shards SET owner = 'evil' WHERE id = 1 -- pgfence_guard"),
        )
        .await
        .unwrap_err();
    assert_eq!(
        ungated.sqlstate(),
        Some(pgfence::sqlstate::SqlState::UngatedWrite),
        "{ungated}"
    );
    assert_eq!(store.guarded_write(real, "move", gated()).await.unwrap(), 1);
    assert_eq!(
        db.scalar("SELECT count(*) FROM shards WHERE owner = 'evil'")
            .await,
        1,
        "only the real fence wrote"
    );
}

/// Through SQL, as `raw` (the holder's role): a wrong, an empty and an absurdly long secret for `c/sched` at
/// `epoch` are refused by the guard, renew and release alike; a missing one (NULL) is bad input: 22023, nothing
/// audited.
async fn forged_secrets_through_sql_are_refused(raw: &tokio_postgres::Client, epoch: i64) {
    for (label, presented) in [
        ("wrong", "f".repeat(64)),
        ("empty", String::new()),
        ("huge", "x".repeat(10_000_000)),
    ] {
        let row = raw
            .query_one(
                "SELECT outcome, reason FROM pgfence.fence('c/sched', $1, $2, 'sql_write', NULL, NULL)",
                &[&epoch, &presented],
            )
            .await
            .unwrap();
        assert_eq!(
            (row.get::<_, String>(0), row.get::<_, Option<String>>(1)),
            ("refused".to_owned(), Some("bad_secret".to_owned())),
            "{label} secret"
        );
        let renew = raw
            .query_one(
                "SELECT outcome, reason FROM pgfence.renew('c/sched', $1, $2, 60000)",
                &[&epoch, &presented],
            )
            .await
            .unwrap();
        assert_eq!(renew.get::<_, String>(0), "refused", "{label} renew");
        let release = raw
            .query_one(
                "SELECT outcome, reason FROM pgfence.release('c/sched', $1, $2)",
                &[&epoch, &presented],
            )
            .await
            .unwrap();
        assert_eq!(release.get::<_, String>(0), "refused", "{label} release");
    }
    let missing: Option<&str> = None;
    for sql in [
        "SELECT outcome FROM pgfence.fence('c/sched', $1, $2, 'sql_write', NULL, NULL)",
        "SELECT outcome FROM pgfence.renew('c/sched', $1, $2, 60000)",
        "SELECT outcome FROM pgfence.release('c/sched', $1, $2)",
    ] {
        let err = raw.query_one(sql, &[&epoch, &missing]).await.unwrap_err();
        assert_eq!(sqlstate(&err), "22023", "{sql}: {err}");
    }
}

/// Knowing (lease, epoch) is not enough: a fence with the current epoch and a wrong secret is refused
/// (`Denied { BadSecret }`, SQL outcome 'refused') for every guarded write, renewal and release, even by the
/// role that holds the lease, and audited as 'bad_secret'; a missing (NULL) one is bad input (22023, not
/// audited); the tenure stays live and its real fence still writes.
/// The secret never shows in Debug, errors or the audit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_fence_cannot_write_renew_or_release() {
    let db = TestDb::new().await;
    let owner = db.store("c").await;
    let (app, store) = app_store(&db, &owner, "app", "c").await;
    let lease = store.acquire("sched", "pod-a", TTL).await.unwrap();
    let real = lease.fence();
    store
        .tasks()
        .create(&real, "job", &json!({}))
        .await
        .unwrap();
    let secret = real.secret().expose_secret().to_owned();

    let forged = pgfence::Fence::new(real.lease(), real.epoch(), common::forged_secret()).unwrap();
    denied(
        store.tasks().create(&forged, "evil", &json!({})).await,
        LossReason::BadSecret,
        "create_task",
    );
    denied(
        store.tasks().claim(&forged, "job", "evil").await,
        LossReason::BadSecret,
        "claim_task",
    );
    denied(
        store
            .tasks()
            .append_event(&forged, "job", "evil", &json!({}))
            .await,
        LossReason::BadSecret,
        "append_event",
    );
    denied(
        store
            .fenced(&forged, "evil", async |_conn| Ok::<_, Error>(()))
            .await,
        LossReason::BadSecret,
        "fenced",
    );
    a_forged_one_statement_write_is_refused(&db, &store, &app, &forged, &real).await;
    forged_secrets_through_sql_are_refused(&client_as(&db, &app).await, lease.epoch().get()).await;

    // The tenure is live and the real fence writes.
    let status = store.lease_status("sched").await.unwrap().unwrap();
    assert_eq!(status.state, pgfence::LeaseState::Held);
    store
        .tasks()
        .append_event(&real, "job", "real", &json!({}))
        .await
        .unwrap();
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.tasks WHERE key = 'evil'")
            .await,
        0
    );

    // Audited per (role, lease, epoch, operation), as bad_secret, never with the secret.
    let rows = audit(&db).await;
    let ops: Vec<(&str, i64)> = rows
        .iter()
        .map(|r| {
            assert_eq!(
                (r.0.as_str(), r.1.as_str(), r.3.as_str()),
                (app.as_str(), "tenure", "bad_secret")
            );
            (r.4.as_str(), r.5)
        })
        .collect();
    assert_eq!(
        ops,
        [
            ("append_event", 1),
            ("claim_task", 1),
            ("create_task", 1),
            // The fenced transaction and the gated one-statement write; the ungated one rolled back whole.
            ("evil", 2),
            ("release", 3),
            ("renew", 3),
            ("sql_write", 3),
        ]
    );
    let everything = db
        .client()
        .await
        .query_one(
            "SELECT string_agg(r::text, ' ') FROM pgfence.rejections r",
            &[],
        )
        .await
        .unwrap()
        .get::<_, String>(0);
    assert!(!everything.contains(&secret), "the secret is in the audit");
    assert!(
        !format!("{lease:?} {real:?}").contains(&secret),
        "Debug shows the secret"
    );
    let err = store
        .tasks()
        .create(&forged, "evil", &json!({}))
        .await
        .unwrap_err();
    assert!(!err.to_string().contains(&secret) && !format!("{err:?}").contains(&secret));
}

/// Knowing a holder's name (readable by every role of the cluster) does not end its tenure: another role
/// acquiring with the same holder name is told the lease is held; the same role may (a restart of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_role_using_a_holder_name_does_not_take_over() {
    let (_db, _, _, s1, s2) = two_applications().await;
    let lease = s1.acquire("sched", "pod-a", TTL).await.unwrap();
    match s2.acquire("sched", "pod-a", TTL).await {
        Err(Error::Held { holder, epoch, .. }) => {
            assert_eq!((holder.as_str(), epoch), ("pod-a", lease.epoch()))
        }
        other => panic!("expected Held, got {other:?}"),
    }
    s1.tasks()
        .create(&lease.fence(), "job", &json!({}))
        .await
        .unwrap();
    let restarted = s1.acquire("sched", "pod-a", TTL).await.unwrap();
    assert!(restarted.epoch() > lease.epoch());
}

/// The serialized fence carries the secret (a leader hands it to its workers), and a fence deserialized without
/// it is refused before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_handed_to_a_worker_writes_and_a_stripped_one_is_refused() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let lease = store.acquire("sched", "pod-a", TTL).await.unwrap();
    let wire = serde_json::to_string(&lease.fence()).unwrap();
    let worker_fence: pgfence::Fence = serde_json::from_str(&wire).unwrap();
    store
        .tasks()
        .create(&worker_fence, "from-worker", &json!({}))
        .await
        .unwrap();
    let mut stripped: serde_json::Value = serde_json::from_str(&wire).unwrap();
    stripped.as_object_mut().unwrap().remove("secret");
    assert!(serde_json::from_value::<pgfence::Fence>(stripped.clone()).is_err());
    stripped["secret"] = json!("not hex");
    assert!(serde_json::from_value::<pgfence::Fence>(stripped).is_err());
}

/// Audit rows are per role: two roles refused for the same (lease, epoch, operation) get a row each, and one
/// role's refusals never change the other's row. A flood of distinct bogus lease names from one role is one
/// row per (role, reason), whatever the names. Stored texts are bounded as the API bounds them: an over-long
/// target key is 22023 and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_rows_are_per_role_and_bounded() {
    let (db, app, app2, s1, s2) = two_applications().await;
    let old = s1.acquire("sched", "pod-a", TTL).await.unwrap();
    s1.acquire("sched", "pod-a", TTL).await.unwrap();
    s1.tasks()
        .create(&old.fence(), "job", &json!({}))
        .await
        .unwrap_err();
    for _ in 0..5 {
        s2.tasks()
            .create(&old.fence(), "someone-elses", &json!({}))
            .await
            .unwrap_err();
    }
    let rows = audit(&db).await;
    let stale: Vec<(&str, i64)> = rows
        .iter()
        .filter(|r| r.3 == "superseded")
        .map(|r| (r.0.as_str(), r.5))
        .collect();
    let mut expected = vec![(app.as_str(), 1), (app2.as_str(), 5)];
    expected.sort();
    assert_eq!(stale, expected, "{rows:?}");

    // 300 distinct bogus names: one row per role and reason.
    let raw = client_as(&db, &app2).await;
    for i in 0..300 {
        let row = raw
            .query_one(
                "SELECT outcome, reason FROM pgfence.fence($1, 1, 'no-secret', 'flood', NULL, NULL)",
                &[&format!("c/bogus-{i}")],
            )
            .await
            .unwrap();
        assert_eq!(
            row.get::<_, Option<String>>(1).as_deref(),
            Some("unknown_lease")
        );
    }
    for i in 0..50 {
        raw.query_one(
            "SELECT outcome FROM pgfence.fence($1, 1, 'no-secret', 'flood', NULL, NULL)",
            &[&format!("elsewhere-{i}/x")],
        )
        .await
        .unwrap();
    }
    let flood: Vec<(String, String, i64)> = db
        .client()
        .await
        .query(
            "SELECT role::text, reason, count FROM pgfence.rejections WHERE scope = 'role' ORDER BY reason",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        flood,
        [
            (app2.clone(), "no_grant".to_owned(), 50),
            (app2.clone(), "unknown_lease".to_owned(), 300)
        ]
    );
    // Operation labels are the caller's: 40 distinct ones on one stale tenure cost at most 17 rows.
    for i in 0..40 {
        raw.query_one(
            "SELECT outcome FROM pgfence.fence('c/sched', $1, 'no-secret', $2, NULL, NULL)",
            &[&old.epoch().get(), &format!("label-{i}")],
        )
        .await
        .unwrap();
    }
    let per_tenure = db
        .scalar(&format!(
            "SELECT count(*) FROM pgfence.rejections WHERE role = '{app2}' AND scope = 'tenure' \
               AND lease = 'c/sched' AND presented_epoch = {}",
            old.epoch().get()
        ))
        .await;
    assert!(per_tenure <= 17, "{per_tenure} rows");
    let err = raw
        .query_one(
            "SELECT outcome FROM pgfence.fence('c/sched', 1, 'no-secret', 'op', 'tasks', repeat('k', 257))",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&err), "22023");
    let err = raw
        .query_one(
            "SELECT outcome FROM pgfence.fence('c/sched', 1, 'no-secret', 'op', repeat('t', 65), NULL)",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&err), "22023");
}

/// Invariant 8 over a grant's life: `revoke` removes one cluster's grant and says so (a second revoke says it
/// removed nothing); the role is then refused on that cluster (no grant, audited) and keeps the other; once its
/// last grant is gone it loses its privileges on pgfence's objects altogether (42501). A refused role or a
/// malformed cluster is `InvalidInput` and revokes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_removes_one_grant_and_says_whether_it_did() {
    let db = TestDb::new().await;
    let app = role(&db, "app").await;
    let owner = db.store("a").await;
    owner
        .admin()
        .grant_application(&app, Some("a"))
        .await
        .unwrap();
    owner
        .admin()
        .grant_application(&app, Some("b"))
        .await
        .unwrap();
    let (a, b) = (
        store_as(&db, &app, "a").await,
        store_as(&db, &app, "b").await,
    );
    a.acquire("sched", "pod", TTL).await.unwrap();
    for bad in [
        owner.admin().revoke("public", Some("a")).await,
        owner.admin().revoke(&app, Some("a/b")).await,
        owner.admin().revoke(&app, Some("")).await,
    ] {
        assert!(matches!(bad, Err(Error::InvalidInput { .. })), "{bad:?}");
    }
    // A role name has at most 63 characters (PostgreSQL's limit): 63 reaches the database, which knows no
    // such role; 64 is refused before anything is sent.
    let unknown = owner
        .admin()
        .revoke(&"r".repeat(63), None)
        .await
        .unwrap_err();
    assert_eq!(
        unknown.sqlstate(),
        Some(pgfence::sqlstate::SqlState::UndefinedObject),
        "{unknown}"
    );
    assert!(matches!(
        owner.admin().revoke(&"r".repeat(64), None).await,
        Err(Error::InvalidInput { field: "role", .. })
    ));
    assert_eq!(db.scalar("SELECT count(*) FROM pgfence.grants").await, 2);
    assert!(owner.admin().revoke(&app, Some("a")).await.unwrap().removed);
    assert!(!owner.admin().revoke(&app, Some("a")).await.unwrap().removed);
    assert!(
        !owner.admin().revoke(&app, None).await.unwrap().removed,
        "no every-cluster grant"
    );
    denied(
        a.acquire("sched", "pod", TTL).await,
        LossReason::NoGrant,
        "acquire after its grant was revoked",
    );
    b.acquire("sched", "pod", TTL).await.unwrap();
    assert!(owner.admin().revoke(&app, Some("b")).await.unwrap().removed);
    let err = b.acquire("other", "pod", TTL).await.unwrap_err();
    assert_eq!(
        err.sqlstate(),
        Some(pgfence::sqlstate::SqlState::InsufficientPrivilege),
        "{err}"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM pgfence.grants").await, 0);
}

/// `grant` and `revoke` refuse PUBLIC, pseudo-roles, predefined pg_* roles, superusers, BYPASSRLS roles and the
/// owner — through the CLI (exit 2 with a clear message), the library (`InvalidInput` naming the role) and SQL
/// (22023) — and change no grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_refuses_public_pseudo_predefined_and_superuser_roles() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let su = format!("{}_su", db.name);
    let bypass = format!("{}_bypass", db.name);
    client
        .batch_execute(&format!(
            "CREATE ROLE {su} SUPERUSER; CREATE ROLE {bypass} BYPASSRLS"
        ))
        .await
        .unwrap();
    for name in [
        "public",
        "PUBLIC",
        "current_user",
        "session_user",
        "pg_monitor",
        "pg_read_all_data",
    ] {
        let out = tokio::process::Command::new(common::pgfence_bin())
            .args(["grant", "--role", name, "--on-cluster", "c"])
            .env("DATABASE_URL", &db.url)
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert!(
            stderr.contains("PUBLIC, pseudo-roles and predefined pg_* roles"),
            "{stderr}"
        );
        let sql = client
            .query_one("SELECT pgfence.grant_application($1, 'c')", &[&name])
            .await
            .unwrap_err();
        assert_eq!(sqlstate(&sql), "22023", "{name}");
    }
    let store = db.store("c").await;
    let owner: String = client
        .query_one("SELECT session_user::text", &[])
        .await
        .unwrap()
        .get(0);
    for name in [su.as_str(), bypass.as_str(), owner.as_str()] {
        for err in [
            store
                .admin()
                .grant_application(name, Some("c"))
                .await
                .unwrap_err(),
            store.admin().grant_operator(name, None).await.unwrap_err(),
            store.admin().revoke(name, Some("c")).await.unwrap_err(),
            store.admin().revoke(name, None).await.unwrap_err(),
        ] {
            assert!(
                matches!(err, Error::InvalidInput { field: "role", .. }),
                "{name}: {err:?}"
            );
        }
        for sql in [
            "SELECT pgfence.grant_application($1, NULL)",
            "SELECT pgfence.revoke($1, NULL)",
        ] {
            let err = client.query_one(sql, &[&name]).await.unwrap_err();
            assert_eq!(sqlstate(&err), "22023", "{sql} {name}: {err}");
        }
    }
    assert_eq!(db.scalar("SELECT count(*) FROM pgfence.grants").await, 0);
}

/// A trigger on a pgfence table would run as the owner inside every pgfence function: TRIGGER (like TRUNCATE
/// and REFERENCES) is revoked by every grant, and a trigger pgfence did not create is dropped — here the one
/// `careless` (through `raw`) made after a DBA gave it TRIGGER, at `owner`'s next grant.
async fn a_grant_drops_a_foreign_trigger_and_its_privileges(
    db: &TestDb,
    owner: &Store,
    raw: &tokio_postgres::Client,
    careless: &str,
) {
    db.client()
        .await
        .batch_execute(&format!(
            "GRANT TRIGGER, TRUNCATE ON pgfence.rejections, pgfence.tenures TO {careless}"
        ))
        .await
        .unwrap();
    raw.batch_execute(
        "CREATE FUNCTION pg_temp.evil() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$; \
         CREATE TRIGGER zz_evil BEFORE INSERT ON pgfence.rejections FOR EACH ROW EXECUTE FUNCTION pg_temp.evil()",
    )
    .await
    .unwrap();
    app_role(db, owner, "other", Some("c")).await;
    let left: i64 = db
        .scalar(&format!(
            "SELECT (SELECT count(*) FROM pg_trigger WHERE tgname = 'zz_evil') \
                  + (SELECT count(*) FROM unnest(ARRAY['pgfence.rejections', 'pgfence.tenures']) t \
                      WHERE has_table_privilege('{careless}', t, 'TRIGGER') \
                         OR has_table_privilege('{careless}', t, 'TRUNCATE'))"
        ))
        .await;
    assert_eq!(
        left, 0,
        "the foreign trigger and the dangerous privileges are gone"
    );
}

/// Raw writes (by `careless`, through `raw`) of a cluster the role has no grant on: refused before anything of
/// it is read, so the refusal names no holder of it.
async fn a_raw_write_of_another_cluster_is_refused_unread(
    db: &TestDb,
    raw: &tokio_postgres::Client,
    careless: &str,
) {
    let foreign = db.store("other").await;
    foreign.acquire("x", "secret-holder", TTL).await.unwrap();
    db.client()
        .await
        .batch_execute(&format!("GRANT INSERT ON pgfence.tasks TO {careless}"))
        .await
        .unwrap();
    let err = raw
        .execute(
            "INSERT INTO pgfence.tasks (lease, key, state, fence) VALUES ('other/x', 'k', 'pending', 1)",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&err), "PF001");
    let text = format!("{err:?}");
    assert!(
        text.contains("no_grant") && !text.contains("secret-holder"),
        "{text}"
    );
}

/// Enforcement covers every pgfence table: a role a DBA gave table privileges on leases, tenures, rejections and
/// grants cannot roll an epoch back, change a holder, delete tenures or rejections, or grant itself a cluster —
/// row-level security leaves it no row to change (whatever enforcement says), and with enforcement on its
/// INSERTs are refused too (PF001). The owner's functions keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_role_but_the_owner_writes_pgfence_tables() {
    let db = TestDb::new().await;
    let owner = db.store("c").await;
    let careless = app_role(&db, &owner, "careless", Some("c")).await;
    let lease = owner.acquire("sched", "pod-a", TTL).await.unwrap();
    owner
        .tasks()
        .create(&lease.fence(), "job", &json!({}))
        .await
        .unwrap();
    owner
        .tasks()
        .create(
            &pgfence::Fence::new(
                lease.qualified_name(),
                lease.epoch(),
                common::forged_secret(),
            )
            .unwrap(),
            "x",
            &json!({}),
        )
        .await
        .unwrap_err();
    db.client()
        .await
        .batch_execute(&format!(
            "GRANT INSERT, UPDATE, DELETE, TRUNCATE ON pgfence.leases, pgfence.tenures, pgfence.rejections, \
             pgfence.grants, pgfence.instance, pgfence.tenure_secrets TO {careless}"
        ))
        .await
        .unwrap();
    let raw = client_as(&db, &careless).await;
    let changes = [
        "UPDATE pgfence.leases SET epoch = 0",
        "UPDATE pgfence.leases SET holder = 'me'",
        "DELETE FROM pgfence.tenures",
        "DELETE FROM pgfence.rejections",
        "UPDATE pgfence.tenure_secrets SET hash = sha256('x')",
    ];
    for enforcement in [
        pgfence::admin::Enforcement::Off,
        pgfence::admin::Enforcement::Error,
    ] {
        owner.admin().set_enforcement(enforcement).await.unwrap();
        for sql in changes {
            match raw.execute(sql, &[]).await {
                Ok(n) => assert_eq!(n, 0, "{sql} changed rows ({enforcement:?})"),
                Err(e) => assert!(
                    ["42501", "PF001"].contains(&sqlstate(&e).as_str()),
                    "{sql}: {e}"
                ),
            }
        }
        let insert = raw
            .execute(
                &format!(
                    "INSERT INTO pgfence.grants (role, cluster) VALUES ('{careless}', 'other')"
                ),
                &[],
            )
            .await
            .unwrap_err();
        assert!(
            ["42501", "PF001"].contains(&sqlstate(&insert).as_str()),
            "{insert}"
        );
        // TRUNCATE bypasses row-level security: refused by the owner-only trigger whether enforcement is on or
        // not. (The privilege itself is revoked by every grant or enforcement change: granted again here, as a
        // DBA might, to reach the trigger.)
        db.client()
            .await
            .batch_execute(&format!(
                "GRANT TRUNCATE ON pgfence.rejections TO {careless}"
            ))
            .await
            .unwrap();
        let truncate = raw
            .execute("TRUNCATE pgfence.rejections", &[])
            .await
            .unwrap_err();
        assert_eq!(sqlstate(&truncate), "PF001", "{truncate}");
    }
    a_grant_drops_a_foreign_trigger_and_its_privileges(&db, &owner, &raw, &careless).await;
    a_raw_write_of_another_cluster_is_refused_unread(&db, &raw, &careless).await;

    // With enforcement on the functions still write every table.
    let status = owner.lease_status("sched").await.unwrap().unwrap();
    assert_eq!(status.holder.as_deref(), Some("pod-a"));
    let next = owner
        .acquire("sched", "pod-b", Duration::from_millis(200))
        .await;
    assert!(matches!(next, Err(Error::Held { .. })));
    let next = take_over(&owner, "sched", "pod-b").await;
    owner
        .tasks()
        .create(&next.fence(), "job-2", &json!({}))
        .await
        .unwrap();
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.tenures WHERE lease = 'c/sched'")
            .await,
        2
    );
}

/// LISTEN leaks no lease name: a release notifies the lease's lock key, which a role without a grant on the
/// cluster cannot map to a name (its reads of pgfence.leases show nothing of that cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_notifications_name_no_lease() {
    let db = TestDb::new().await;
    let owner = db.store("secret-cluster").await;
    let outsider = app_role(&db, &owner, "outsider", Some("other")).await;
    let (client, mut rx) = common::listen(&url_as(&db, &outsider), "pgfence_lease_free").await;
    let lease = owner.acquire("payroll-run", "pod", TTL).await.unwrap();
    owner.release(&lease).await.unwrap();
    let payload = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("a notification")
        .unwrap();
    assert!(
        !payload.contains("payroll") && !payload.contains("secret-cluster"),
        "{payload}"
    );
    let key: i32 = payload.parse().expect("the payload is a lock key");
    let seen: i64 = client
        .query_one(
            "SELECT count(*) FROM pgfence.leases WHERE lock_key = $1",
            &[&key],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(seen, 0);
}

/// Text that the Rust check leaves to the database (invariant: bad input is a typed error and writes nothing,
/// whichever side refuses it): U+1AC1 (Unicode 14.0, combining class 230) before U+1CD4 (class 1) is out of order
/// by the tables of PostgreSQL 15 and later, unassigned (so in order) by PostgreSQL 13's. The database's refusal
/// of a holder, a task key or an event kind comes back as `InvalidInput` naming the argument, and nothing of
/// the call is written; an older database accepts the text, and so does the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_databases_refusal_of_newer_unicode_is_invalid_input() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let text = "\u{1ac1}\u{1cd4}";
    let client = db.client().await;
    let database_nfc: bool = client
        .query_one("SELECT $1 IS NFC NORMALIZED", &[&text])
        .await
        .unwrap()
        .get(0);
    let version: i32 = client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        version < 150000 || !database_nfc,
        "PostgreSQL 15 has Unicode 14.0"
    );
    let invalid = |result: pgfence::Result<()>, field: &str| match result {
        Err(Error::InvalidInput { field: f, reason }) if !database_nfc => {
            assert_eq!(f, field);
            assert!(reason.contains("NFC"), "{reason}");
        }
        Ok(()) if database_nfc => {}
        other => panic!("{field}: {other:?} (database judges NFC: {database_nfc})"),
    };
    invalid(store.acquire("sched", text, TTL).await.map(drop), "holder");
    let lease = store.acquire("sched", "pod", TTL).await.unwrap();
    invalid(
        store
            .tasks()
            .create(&lease.fence(), text, &json!({}))
            .await
            .map(drop),
        "task key",
    );
    store
        .tasks()
        .create(&lease.fence(), "job", &json!({}))
        .await
        .unwrap();
    invalid(
        store
            .tasks()
            .append_event(&lease.fence(), "job", text, &json!({}))
            .await
            .map(drop),
        "event kind",
    );
    if !database_nfc {
        // Only the lease granted to "pod", its task and that task's creation event.
        assert_eq!(db.scalar("SELECT count(*) FROM pgfence.tenures").await, 1);
        assert_eq!(db.scalar("SELECT count(*) FROM pgfence.tasks").await, 1);
        assert_eq!(
            db.scalar("SELECT count(*) FROM pgfence.task_events").await,
            1
        );
    }
}

/// Whether `text` has a character that was not assigned in Unicode 13.0 (the oldest tables a supported database
/// judges NFC with), by an oracle independent of pgfence's table: the Age property of Perl's Unicode::UCD (a
/// character newer than Perl's own Unicode version is `Unassigned` there, which counts as newer).
fn newer_than_unicode_13(text: &str) -> bool {
    let code_points: Vec<String> = text
        .chars()
        .map(|c| format!("{:X}", u32::from(c)))
        .collect();
    let output = std::process::Command::new("perl")
        .args([
            "-MUnicode::UCD=charprop",
            "-e",
            r#"for (@ARGV) { my $a = charprop(hex $_, "Age"); my ($M, $m) = $a =~ /^V(\d+)_(\d+)$/;
               print(($a eq "Unassigned" || $M > 13 || ($M == 13 && $m > 0)) ? 1 : 0) }"#,
        ])
        .args(&code_points)
        .output()
        .expect("perl with Unicode::UCD (Debian package perl) for the age of characters");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout.contains(&b'1')
}

fn arbitrary_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[a-z/ \\t\\n\u{7f}\u{85}\u{9f}e\u{301}\u{e9}\u{212b}\u{c5}\u{1e9b}\u{323}ﬁ가\u{1100}\u{1161}]{0,12}",
        // Characters with a part in normalization that are newer than some database's Unicode tables (Garay and
        // Vedic marks, a Tulu-Tigalari composition pair), among settled ones.
        "[ae\u{301}\u{1cd4}\u{10d69}\u{1ac1}\u{113b8}\u{113c2}\u{16d67}]{1,6}",
        (0usize..3, 60usize..70).prop_map(|(c, n)| ["a", "é", "\u{1d160}"][c].repeat(n)),
        (190usize..210).prop_map(|n| "n".repeat(n)),
        (250usize..260).prop_map(|n| "h".repeat(n)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    /// One validation (invariant: the SQL functions refuse exactly what the Rust API refuses, so no client can
    /// store what the CLI cannot show or address): for arbitrary strings as cluster, lease name and holder,
    /// `pgfence._lease_problem` / `pgfence._text_problem` accept exactly what `Fence::new` and the holder check
    /// accept — control characters, empty segments, lengths and Unicode NFC included. Where this build's Unicode
    /// tables and the database's judge NFC differently (characters newer than the older of the two), the Rust
    /// check must not be the stricter one: what the database stores stays addressable. An acquisition reports
    /// the database's refusal of a holder as `InvalidInput` as well, so its verdict is always the database's.
    #[test]
    fn sql_and_rust_validation_agree(cluster in arbitrary_text(), name in arbitrary_text(), holder in arbitrary_text()) {
        static DB: std::sync::OnceLock<(tokio::runtime::Runtime, TestDb, Store)> = std::sync::OnceLock::new();
        static CASE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let (runtime, db, store) = DB.get_or_init(|| {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            let db = runtime.block_on(TestDb::new());
            let store = runtime.block_on(db.store("v"));
            (runtime, db, store)
        });
        // PostgreSQL text cannot hold NUL: the driver refuses it before the database could judge.
        prop_assume!(![&cluster, &name, &holder].iter().any(|s| s.contains('\0')));
        let qualified = format!("{cluster}/{name}");
        let rust_lease = pgfence::Fence::new(qualified.clone(), pgfence::Epoch::new(1).unwrap(), common::forged_secret()).is_ok();
        // The holder through the library's own check: refused before sending, or sent (and then acquired).
        let case = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let rust_holder = !matches!(
            runtime.block_on(store.acquire(&format!("h{case}"), &holder, TTL)),
            Err(Error::InvalidInput { .. })
        );
        let (sql_lease, sql_holder, database_nfc): (bool, bool, bool) = runtime.block_on(async {
            let client = db.client().await;
            let row = client
                .query_one(
                    "SELECT pgfence._lease_problem($1) IS NULL, pgfence._text_problem($2, 256) IS NULL, \
                            $1 IS NFC NORMALIZED",
                    &[&qualified, &holder],
                )
                .await
                .unwrap();
            (row.get(0), row.get(1), row.get(2))
        });
        prop_assert!(rust_lease || !sql_lease, "the database stores lease {:?}, which Rust refuses", qualified);
        if rust_lease != sql_lease {
            // Rust accepted what the database refuses: only text newer than Unicode 13.0 is left to it.
            prop_assert!(!database_nfc && newer_than_unicode_13(&qualified), "lease {:?}", qualified);
        }
        prop_assert_eq!(rust_holder, sql_holder, "holder {:?}", holder);
    }
}

fn env_secs(name: &str, default: u64) -> Duration {
    Duration::from_secs(
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

/// The secret check made free: neither hashed nor compared.
const NO_SECRET: &str =
    "CREATE OR REPLACE FUNCTION pgfence._secret_matches(p_hash bytea, p_secret text) \
     RETURNS boolean LANGUAGE sql STABLE AS $$ SELECT true $$;";
/// The grant check made free as well.
const NO_SECRET_NO_GRANT: &str =
    "CREATE OR REPLACE FUNCTION pgfence._secret_matches(p_hash bytea, p_secret text) \
     RETURNS boolean LANGUAGE sql STABLE AS $$ SELECT true $$; \
     CREATE OR REPLACE FUNCTION pgfence._grant_of(p_cluster text, p_operator boolean DEFAULT false) \
     RETURNS TABLE (granted boolean) LANGUAGE sql STABLE AS $$ SELECT true $$;";

/// The cost of the trust boundary on a guarded write, measured (not a pass/fail test): the same guarded writes
/// against three databases of one server, in interleaved rounds — the migration as it is; a copy whose guard
/// neither hashes nor compares the tenure secret (`_secret_matches` answers true); and a copy that also skips the
/// grant check (`_grant_of` answers true). Prints the median writes per second of each and the ratios.
///
/// `PGFENCE_MEASURE_ROUNDS` (default 7) rounds of `PGFENCE_MEASURE_SECS` (default 3) seconds per variant;
/// `cargo test --release --test suite trust::measure_trust_boundary_cost -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_trust_boundary_cost() {
    let rounds: usize = std::env::var("PGFENCE_MEASURE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let secs = env_secs("PGFENCE_MEASURE_SECS", 3);
    let writers = 4;
    let mut variants = Vec::new();
    for (label, patch) in [
        ("as migrated", ""),
        // The same again: the spread between two identical databases is the noise floor of the comparison.
        ("as migrated (second copy)", ""),
        ("no secret check", NO_SECRET),
        ("no secret, no grant check", NO_SECRET_NO_GRANT),
    ] {
        let db = TestDb::new().await;
        if !patch.is_empty() {
            db.client().await.batch_execute(patch).await.unwrap();
        }
        let app = app_role(&db, &db.store("c").await, "app", Some("c")).await;
        let store =
            Store::connect(StoreConfig::new(url_as(&db, &app), "c").pool_size(writers as u32))
                .await
                .unwrap();
        let fence = store
            .acquire("hot", "leader", Duration::from_secs(3600))
            .await
            .unwrap()
            .fence();
        guarded_writes_per_second(&store, &fence, writers, Duration::from_millis(500)).await;
        variants.push((label, db, store, fence, Vec::new()));
    }
    for _ in 0..rounds {
        for (_, _, store, fence, rates) in variants.iter_mut() {
            rates.push(guarded_writes_per_second(store, fence, writers, secs).await);
        }
    }
    // Per round, each variant's rate divided by the first's (rounds are paired: the load of the machine moves
    // between rounds more than within one), then the median over rounds.
    let base: Vec<f64> = variants[0].4.clone();
    eprintln!("guarded writes (append_event), {writers} writers, {rounds} interleaved rounds of {secs:?}:");
    for (label, _, _, _, rates) in variants.iter_mut() {
        let mut ratios: Vec<f64> = base.iter().zip(rates.iter()).map(|(b, r)| b / r).collect();
        let ratio = median(&mut ratios);
        eprintln!(
            "  {label:<28} median {:8.0} writes/s   'as migrated' / this, median of rounds {ratio:.3}",
            median(rates)
        );
    }
}

/// A flood of refusals no tenure explains, measured: a leader writes alone, then while 4 connections of another
/// role send distinct bogus (lease, epoch, operation) triples — half unknown leases of a cluster the role may
/// use, half leases of clusters it may not — then alone again. Prints the leader's writes per second in each
/// phase, the ratio, the flood's refusals per second and the audit rows it left (the bound: one row per role
/// and reason). `PGFENCE_FLOOD_SECS` (default 60) and `PGFENCE_ALONE_SECS` (default 20);
/// `cargo test --release --test suite trust::measure_bogus_flood -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_bogus_flood() {
    let flood_for = env_secs("PGFENCE_FLOOD_SECS", 60);
    let alone_for = env_secs("PGFENCE_ALONE_SECS", 20);
    let db = TestDb::new().await;
    let owner = db.store("c").await;
    let (_, leader) = app_store(&db, &owner, "app", "c").await;
    let flooder = app_role(&db, &owner, "flooder", Some("c")).await;
    let fence = leader
        .acquire("hot", "leader", Duration::from_secs(3600))
        .await
        .unwrap()
        .fence();
    guarded_writes_per_second(&leader, &fence, 1, Duration::from_millis(500)).await;
    let before = guarded_writes_per_second(&leader, &fence, 1, alone_for).await;

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut flood = Vec::new();
    for f in 0..4 {
        let client = client_as(&db, &flooder).await;
        let stop = stop.clone();
        flood.push(tokio::spawn(async move {
            let statement = client
                .prepare("SELECT outcome FROM pgfence.fence($1, $2, 'no-secret', $3, NULL, NULL)")
                .await
                .unwrap();
            let mut i: i64 = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let lease = if i % 2 == 0 {
                    format!("c/bogus-{f}-{i}")
                } else {
                    format!("elsewhere-{f}-{i}/x")
                };
                client
                    .query_one(&statement, &[&lease, &(i + 1), &format!("op-{i}")])
                    .await
                    .unwrap();
                i += 1;
            }
            i
        }));
    }
    let during = guarded_writes_per_second(&leader, &fence, 1, flood_for).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut refused = 0;
    for h in flood {
        refused += h.await.unwrap();
    }
    let after = guarded_writes_per_second(&leader, &fence, 1, alone_for).await;
    let rows = db
        .client()
        .await
        .query(
            "SELECT role::text, reason, count, pg_size_pretty(pg_total_relation_size('pgfence.rejections')) \
               FROM pgfence.rejections ORDER BY reason",
            &[],
        )
        .await
        .unwrap();
    eprintln!(
        "leader alone {before:.0} writes/s, during the flood {during:.0} ({:.3} x the mean alone), after {after:.0}",
        during / ((before + after) / 2.0)
    );
    eprintln!(
        "flood: {refused} refusals in {flood_for:?} ({:.0}/s) from 4 connections, audit rows left: {}",
        refused as f64 / flood_for.as_secs_f64(),
        rows.len()
    );
    for r in &rows {
        eprintln!(
            "  role {} reason {} count {} (table {})",
            r.get::<_, String>(0),
            r.get::<_, String>(1),
            r.get::<_, i64>(2),
            r.get::<_, String>(3)
        );
    }
}
