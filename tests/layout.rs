//! The advisory-lock and role layout (docs/security.md, "Advisory locks: the hardened layout"): the layout that
//! works with EXECUTE on the advisory-lock functions revoked from PUBLIC, what migrate and the grants say when the
//! owner lacks what pgfence needs, and the bounds that hold when the layout is not hardened and a role that can
//! merely connect holds pgfence's advisory keys.

use crate::common;

use std::time::{Duration, Instant};

use common::{client_as, owned_db, role, sqlstate, store_as, url_as, TestDb};
use pgfence::schema::LayoutSeverity;
use pgfence::schema::GUARD_LOCK_CLASS;
use pgfence::{Error, ForceReleased, Store, StoreConfig};
use serde_json::json;

const TTL: Duration = Duration::from_secs(60);

/// Every advisory-lock function that takes a lock, as docs/security.md revokes them from PUBLIC.
const REVOKE_FROM_PUBLIC: &str = "REVOKE EXECUTE ON FUNCTION \
    pg_advisory_lock(bigint), pg_advisory_lock(integer, integer), \
    pg_advisory_lock_shared(bigint), pg_advisory_lock_shared(integer, integer), \
    pg_advisory_xact_lock(bigint), pg_advisory_xact_lock(integer, integer), \
    pg_advisory_xact_lock_shared(bigint), pg_advisory_xact_lock_shared(integer, integer), \
    pg_try_advisory_lock(bigint), pg_try_advisory_lock(integer, integer), \
    pg_try_advisory_lock_shared(bigint), pg_try_advisory_lock_shared(integer, integer), \
    pg_try_advisory_xact_lock(bigint), pg_try_advisory_xact_lock(integer, integer), \
    pg_try_advisory_xact_lock_shared(bigint), pg_try_advisory_xact_lock_shared(integer, integer) \
    FROM PUBLIC";

/// The grants of docs/security.md's hardened layout, to `owner`: the advisory-lock functions pgfence calls
/// (exactly those) and pg_signal_backend.
fn grants_to(owner: &str) -> String {
    format!(
        "GRANT EXECUTE ON FUNCTION pg_advisory_lock(bigint), pg_advisory_xact_lock(integer, integer), \
         pg_try_advisory_xact_lock(integer, integer), pg_advisory_xact_lock_shared(integer, integer), \
         pg_try_advisory_xact_lock_shared(integer, integer), \
         pg_try_advisory_lock_shared(integer, integer) TO {owner}; \
         GRANT pg_signal_backend TO {owner}"
    )
}

/// The owner (or another role) as a store of cluster `c`.
async fn store_of(db: &TestDb, who: &str) -> Store {
    store_as(db, who, "c").await
}

/// A raw session of `who` and its backend pid.
async fn session(db: &TestDb, who: &str) -> (tokio_postgres::Client, i32) {
    let client = client_as(db, who).await;
    let pid = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    (client, pid)
}

/// The hardened layout works (the security fix must not break pgfence): with EXECUTE on every lock-taking
/// advisory function revoked from PUBLIC (the documented list is all of them), the functions pgfence calls granted
/// to a non-superuser owner, and pg_signal_backend, the owner migrates with no layout problem left, grants an
/// application role that acquires and writes through the guard, and a takeover ends a guarded transaction held
/// open past the grace. A role with only CONNECT gets 42501 from the guard's advisory lock, though pg_locks shows
/// it the key of a guard held by another session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hardened_layout_works_and_refuses_outsiders_the_guard_lock() {
    let (db, owner) = owned_db().await;
    let admin = db.client().await;
    let taking: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'pg_catalog'::regnamespace \
               AND proname ~ '^pg_(try_)?advisory_' AND proname !~ 'unlock'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        taking, 16,
        "the documented REVOKE names every lock-taking advisory function"
    );
    admin
        .batch_execute(&format!("{REVOKE_FROM_PUBLIC}; {}", grants_to(&owner)))
        .await
        .unwrap();
    let store = store_of(&db, &owner).await;
    store.migrate().await.unwrap();
    assert_eq!(store.admin().layout_problems().await.unwrap(), vec![]);
    client_as(&db, &owner)
        .await
        .batch_execute("SELECT pgfence.set_takeover_grace('300 ms')")
        .await
        .unwrap();
    let app = role(&db, "app").await;
    store
        .admin()
        .grant_application(&app, Some("c"))
        .await
        .unwrap();
    let as_app = store_of(&db, &app).await;
    let lease = as_app.acquire("a", "pod-1", TTL).await.unwrap();
    as_app
        .tasks()
        .create(&lease.fence(), "job", &json!({}))
        .await
        .unwrap();
    as_app
        .tasks()
        .append_event(&lease.fence(), "job", "started", &json!({}))
        .await
        .unwrap();

    // A guarded transaction of the application stays open past the grace.
    let (inside, mut entered) = tokio::sync::mpsc::channel::<()>(1);
    let fence = lease.fence();
    let writer = as_app.clone();
    let open = tokio::spawn(async move {
        writer
            .fenced(&fence, "hold", async move |conn| {
                use pgfence::reexports::diesel_async::RunQueryDsl;
                inside.send(()).await.unwrap();
                // Idle in the transaction between statements, until the takeover ends the session.
                for _ in 0..200 {
                    pgfence::reexports::diesel::sql_query("SELECT 1")
                        .execute(conn)
                        .await?;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok::<_, Error>(())
            })
            .await
    });
    entered.recv().await.unwrap();
    let key = db
        .scalar("SELECT lock_key::bigint FROM pgfence.leases WHERE name = 'c/a'")
        .await as i32;
    let outsider = role(&db, "outsider").await;
    let (out, _) = session(&db, &outsider).await;
    let seen: i64 = out
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::int::oid \
               AND objid = $2::int::oid AND objsubid = 2 \
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[&GUARD_LOCK_CLASS, &key],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(seen, 1, "pg_locks shows every role the key of a held guard");
    out.batch_execute("BEGIN").await.unwrap();
    let refused = out
        .query_one(
            "SELECT pg_advisory_xact_lock($1, $2)",
            &[&GUARD_LOCK_CLASS, &key],
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&refused), "42501", "{refused}");

    let started = Instant::now();
    let ended = store.admin().force_release("a").await.unwrap();
    assert!(matches!(ended, ForceReleased::Ended { .. }), "{ended:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(300)
            && started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let open = tokio::time::timeout(Duration::from_secs(5), open)
        .await
        .expect("the blocker was ended")
        .unwrap();
    assert!(
        open.is_err(),
        "the ended transaction did not commit: {open:?}"
    );
}

/// Without EXECUTE on the advisory-lock functions pgfence calls, the owner's migrate is refused before anything
/// is changed (no schema), 42501, naming the functions and the GRANT to run; on an installed schema whose owner
/// lost them, a grant is refused the same way and records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_and_grant_refuse_an_owner_without_the_advisory_functions() {
    let (db, owner) = owned_db().await;
    let admin = db.client().await;
    admin.batch_execute(REVOKE_FROM_PUBLIC).await.unwrap();
    let store = store_of(&db, &owner).await;
    let err = store.migrate().await.unwrap_err();
    assert!(matches!(err, Error::Migration { .. }), "{err:?}");
    assert_eq!(
        err.sqlstate(),
        Some(pgfence::sqlstate::SqlState::InsufficientPrivilege),
        "{err}"
    );
    let text = err.to_string();
    for needed in [
        "GRANT EXECUTE ON FUNCTION",
        "pg_advisory_lock(bigint)",
        "pg_advisory_xact_lock_shared(integer,integer)",
        "pg_try_advisory_xact_lock(integer,integer)",
    ] {
        assert!(text.contains(needed), "{needed}: {text}");
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM pg_namespace WHERE nspname = 'pgfence'")
            .await,
        0,
        "nothing was created"
    );

    admin.batch_execute(&grants_to(&owner)).await.unwrap();
    store.migrate().await.unwrap();
    admin
        .batch_execute(&format!(
            "REVOKE EXECUTE ON FUNCTION pg_advisory_xact_lock_shared(integer, integer) FROM {owner}"
        ))
        .await
        .unwrap();
    let problems = store.admin().layout_problems().await.unwrap();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].severity, LayoutSeverity::Error);
    let app = role(&db, "app").await;
    let err = store
        .admin()
        .grant_application(&app, Some("c"))
        .await
        .unwrap_err();
    assert_eq!(
        err.sqlstate(),
        Some(pgfence::sqlstate::SqlState::InsufficientPrivilege),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("pg_advisory_xact_lock_shared(integer,integer)"),
        "{err}"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM pgfence.grants").await, 0);
}

/// The migration lock's wait is bounded: a role with only CONNECT holding the migration key makes migrate fail
/// within its bound (PF003, transient) naming that session's pid and role, instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outsider_holding_the_migration_key_makes_migrate_fail_within_its_bound() {
    let (db, owner) = owned_db().await;
    let outsider = role(&db, "outsider").await;
    let (out, pid) = session(&db, &outsider).await;
    // The migration lock's key: the ASCII bytes of "pgfence", then a version byte.
    out.query_one("SELECT pg_advisory_lock($1)", &[&0x7067_6665_6e63_6501_i64])
        .await
        .unwrap();
    let store = Store::connect(
        StoreConfig::new(url_as(&db, &owner), "c").migration_lock_wait(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(10), store.migrate())
        .await
        .expect("migrate must not wait without bound")
        .unwrap_err();
    let waited = started.elapsed();
    eprintln!("migrate behind an outsider's migration lock failed after {waited:?}: {err}");
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
    assert_eq!(
        err.sqlstate(),
        Some(pgfence::sqlstate::SqlState::LockWaitEnded),
        "{err}"
    );
    assert!(err.is_transient());
    let text = err.to_string();
    assert!(
        text.contains(&format!("pid {pid}")) && text.contains(&outsider),
        "{text}"
    );
    out.batch_execute("SELECT pg_advisory_unlock_all()")
        .await
        .unwrap();
    assert!(!store.migrate().await.unwrap().is_empty());
}

/// Without the hardened layout, a role with only CONNECT holding a lease's guard key exclusively delays the
/// lease's writers and takeovers only within their bounds: a guarded write fails PF003 after grace + 5 s and a
/// takeover (its owner without pg_signal_backend, as the layout check warns) after the grace, each naming the
/// outsider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outsider_holding_a_guard_key_is_named_within_the_bounds() {
    let (db, owner) = owned_db().await;
    let store = store_of(&db, &owner).await;
    store.migrate().await.unwrap();
    let problems = store.admin().layout_problems().await.unwrap();
    assert!(
        problems
            .iter()
            .all(|p| p.severity == LayoutSeverity::Warning)
            && problems
                .iter()
                .any(|p| p.problem.contains("pg_signal_backend"))
            && problems
                .iter()
                .any(|p| p.problem.starts_with("PUBLIC may execute")),
        "{problems:?}"
    );
    client_as(&db, &owner)
        .await
        .batch_execute("SELECT pgfence.set_takeover_grace('300 ms')")
        .await
        .unwrap();
    let lease = store.acquire("a", "pod-1", TTL).await.unwrap();
    let key = db
        .scalar("SELECT lock_key::bigint FROM pgfence.leases WHERE name = 'c/a'")
        .await as i32;
    let outsider = role(&db, "outsider").await;
    let (out, pid) = session(&db, &outsider).await;
    out.query_one(
        "SELECT pg_advisory_lock($1, $2)",
        &[&GUARD_LOCK_CLASS, &key],
    )
    .await
    .unwrap();

    let started = Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(15),
        store.tasks().create(&lease.fence(), "job", &json!({})),
    )
    .await
    .expect("the guard's wait is bounded")
    .unwrap_err();
    let waited = started.elapsed();
    eprintln!("a guarded write behind an outsider's guard key failed after {waited:?}: {err}");
    assert_eq!(
        err.sqlstate(),
        Some(pgfence::sqlstate::SqlState::LockWaitEnded),
        "{err}"
    );
    assert!(
        err.to_string().contains(&format!("pid {pid}")) && err.to_string().contains(&outsider),
        "{err}"
    );
    assert!(waited < Duration::from_secs(8), "grace + 5 s: {waited:?}");

    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(15), store.admin().force_release("a"))
        .await
        .expect("the takeover's wait is bounded")
        .unwrap_err();
    let waited = started.elapsed();
    eprintln!("a takeover behind an outsider's guard key failed after {waited:?}: {err}");
    assert_eq!(
        err.sqlstate(),
        Some(pgfence::sqlstate::SqlState::LockWaitEnded),
        "{err}"
    );
    assert!(err.to_string().contains(&outsider), "{err}");
    assert!(
        waited < Duration::from_secs(3),
        "the grace and a failed termination: {waited:?}"
    );
}
