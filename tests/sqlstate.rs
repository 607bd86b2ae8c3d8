//! Errors carry the server's SQLSTATE, never a meaning guessed from message text: against a database whose
//! `lc_messages` is German, deadlocks and lock timeouts are still retryable (`40P01`, `55P03`), a missing schema is
//! still [`Error::SchemaMissing`], a privilege failure is `42501`, and pgfence's own codes (`PF001`, the `PF004`
//! READ COMMITTED fallback) still work. An application role cannot change `lc_messages` (superuser only), so a
//! server set up in another language is the case to survive.
//!
//! Needs the `de_DE.UTF-8` locale in the operating system (`localedef -i de_DE -f UTF-8 de_DE.UTF-8`; `.ci/run`
//! makes it). Without it every test says so and passes — unless `PGFENCE_REQUIRE_LOCALE` is set (`.ci/run` sets
//! it), when it fails.

use crate::common;

use std::time::Duration;

use common::TestDb;
use diesel_async::SimpleAsyncConnection;
use pgfence::admin::Enforcement;
use pgfence::{Error, Store};
use serde_json::json;

const LOCALE: &str = "de_DE.UTF-8";

/// A fresh database (migrated, or `empty`) whose sessions speak German, or `None` after saying why not.
async fn german(empty: bool) -> Option<TestDb> {
    let db = if empty {
        TestDb::empty().await
    } else {
        TestDb::new().await
    };
    let client = db.client().await;
    let set = format!("ALTER DATABASE {} SET lc_messages TO '{LOCALE}'", db.name);
    if let Err(e) = client.batch_execute(&set).await {
        if std::env::var_os("PGFENCE_REQUIRE_LOCALE").is_some_and(|v| !v.is_empty()) {
            panic!(
                "PGFENCE_REQUIRE_LOCALE is set but the server refuses lc_messages = {LOCALE}: {e}"
            );
        }
        eprintln!(
            "SKIPPED: the server refuses lc_messages = {LOCALE} ({e}); make the locale with \
             `localedef -i de_DE -f UTF-8 de_DE.UTF-8` (`.ci/run` does)"
        );
        return None;
    }
    Some(db)
}

fn database_error(result: diesel::QueryResult<()>) -> Error {
    Error::from(result.expect_err("the statement must fail"))
}

/// The messages really are German (so the other tests prove something), and a plain server error keeps its code.
#[tokio::test]
async fn a_german_server_error_keeps_its_sqlstate() {
    let Some(db) = german(false).await else {
        return;
    };
    let store = db.store("de").await;
    let mut conn = store.admin().conn().await.unwrap();
    let error = database_error(conn.batch_execute("SELECT 1/0").await);
    let Error::Database {
        sqlstate, message, ..
    } = &error
    else {
        panic!("{error:?}")
    };
    assert_eq!(
        sqlstate.map(|s| s.to_string()).as_deref(),
        Some("22012"),
        "{error}"
    );
    assert!(
        message.contains("Division durch Null"),
        "the server does not speak German: {message}"
    );
}

/// Invariant: a deadlock is transient whatever the server's language (a retry of the same transaction can clear
/// it). Two transactions lock two rows in opposite orders; the server aborts one with 40P01.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_in_german_is_retryable() {
    let Some(db) = german(false).await else {
        return;
    };
    let setup = db.client().await;
    setup
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS pair (id int PRIMARY KEY, v int); \
             INSERT INTO pair VALUES (1, 0), (2, 0) ON CONFLICT DO NOTHING; \
             ALTER DATABASE {} SET deadlock_timeout TO '50ms'",
            db.name
        ))
        .await
        .unwrap();
    let store = db.store("de").await;
    let mut a = store.admin().conn().await.unwrap();
    let mut b = store.admin().conn().await.unwrap();
    a.batch_execute("BEGIN; UPDATE pair SET v = 1 WHERE id = 1")
        .await
        .unwrap();
    b.batch_execute("BEGIN; UPDATE pair SET v = 1 WHERE id = 2")
        .await
        .unwrap();
    let (first, second) = tokio::join!(
        a.batch_execute("UPDATE pair SET v = 2 WHERE id = 2"),
        b.batch_execute("UPDATE pair SET v = 2 WHERE id = 1"),
    );
    let failed = match (first, second) {
        (Err(e), Ok(())) | (Ok(()), Err(e)) => Error::from(e),
        other => panic!("exactly one side must be chosen as the deadlock victim: {other:?}"),
    };
    assert_eq!(
        failed.sqlstate(),
        Some(pgfence::sqlstate::SqlState::DeadlockDetected),
        "{failed}"
    );
    assert!(failed.is_transient(), "{failed}");
}

/// Invariant: a lock wait that timed out is transient whatever the language (`55P03`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_timeout_in_german_is_retryable() {
    let Some(db) = german(false).await else {
        return;
    };
    let holder = db.client().await;
    holder
        .batch_execute("CREATE TABLE one (id int PRIMARY KEY); INSERT INTO one VALUES (1)")
        .await
        .unwrap();
    holder
        .batch_execute("BEGIN; LOCK TABLE one IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let store = db.store("de").await;
    let mut conn = store.admin().conn().await.unwrap();
    let error = database_error(
        conn.batch_execute("SET lock_timeout = '50ms'; SELECT * FROM one")
            .await,
    );
    assert_eq!(
        error.sqlstate(),
        Some(pgfence::sqlstate::SqlState::LockNotAvailable),
        "{error}"
    );
    assert!(error.is_transient(), "{error}");
    holder.batch_execute("ROLLBACK").await.unwrap();
}

/// Invariant: a database that was never migrated is named as such (not a generic error), whatever the language.
#[tokio::test]
async fn a_missing_schema_in_german_is_schema_missing() {
    let Some(db) = german(true).await else { return };
    let store = Store::connect(db.config("de")).await.unwrap();
    let error = store
        .acquire("scheduler", "pod-a", Duration::from_secs(10))
        .await
        .expect_err("no schema");
    assert!(matches!(error, Error::SchemaMissing), "{error:?}");
}

/// A privilege failure keeps its code (`42501`) in German.
#[tokio::test]
async fn a_privilege_failure_in_german_is_42501() {
    let Some(db) = german(false).await else {
        return;
    };
    let role = common::role(&db, "nopriv").await;
    // A role without USAGE on the pgfence schema cannot even read the store's identity.
    let error = Store::connect(pgfence::StoreConfig::new(common::url_as(&db, &role), "de"))
        .await
        .expect_err("a role without privileges on the schema");
    assert_eq!(
        error.sqlstate(),
        Some(pgfence::sqlstate::SqlState::InsufficientPrivilege),
        "{error}"
    );
}

/// pgfence's own codes in German: a raw write refused by enforcement is `PF001`, and a guarded write under a
/// session default other than READ COMMITTED is refused with `PF004` before anything is written and runs again in
/// a READ COMMITTED transaction (so it succeeds).
#[tokio::test]
async fn pgfence_codes_work_in_german() {
    let Some(db) = german(false).await else {
        return;
    };
    let store = db.store("de").await;
    store
        .admin()
        .set_enforcement(Enforcement::Error)
        .await
        .unwrap();
    let mut conn = store.admin().conn().await.unwrap();
    let error = database_error(
        // (Every table that references the tasks: a TRUNCATE that leaves one out fails its foreign key first.)
        conn.batch_execute(
            "TRUNCATE pgfence.tasks, pgfence.task_events, pgfence.effects, pgfence.effect_reports",
        )
        .await,
    );
    assert_eq!(
        error.sqlstate(),
        Some(pgfence::sqlstate::SqlState::RawWriteRefused),
        "{error}"
    );
    drop(conn);

    db.client()
        .await
        .batch_execute(&format!(
            "ALTER DATABASE {} SET default_transaction_isolation TO 'repeatable read'",
            db.name
        ))
        .await
        .unwrap();
    let store = db.store("de").await;
    let lease = store
        .acquire("scheduler", "pod-a", Duration::from_secs(30))
        .await
        .unwrap();
    store
        .tasks()
        .create(&lease.fence(), "deploy-1", &json!({"image": "api:1"}))
        .await
        .expect("the PF004 refusal is recognised by its code and the write runs in READ COMMITTED");
}

/// pgfence's own codes by name (`pgfence::sqlstate::SqlState`'s `PF00x` variants) are exactly the codes its
/// migrations raise to their callers (`USING ERRCODE = 'PF…'`; a code the SQL also catches, `WHEN SQLSTATE
/// 'PF…'`, only rolls back a block and never reaches a client): a code added to the SQL without its variant, or a
/// variant whose code the SQL does not raise, fails here, so the Rust names cannot drift from the SQL.
#[test]
fn the_named_pgfence_codes_are_the_ones_the_migrations_raise() {
    use pgfence::sqlstate::SqlState;
    use std::collections::BTreeSet;
    let named_set: BTreeSet<&str> = SqlState::NAMED
        .iter()
        .map(|s| s.code())
        .filter(|c| c.starts_with("PF"))
        .collect();
    let migrations = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let (mut raised, mut caught) = (BTreeSet::new(), BTreeSet::new());
    let codes_after = |sql: &str, prefix: &str| -> Vec<String> {
        sql.match_indices(prefix)
            .map(|(at, _)| sql[at + prefix.len() - 2..][..5].to_owned())
            .collect()
    };
    for dir in std::fs::read_dir(&migrations).expect("the migrations folder") {
        let up = dir.expect("a migration").path().join("up.sql");
        let Ok(sql) = std::fs::read_to_string(&up) else {
            continue;
        };
        raised.extend(codes_after(&sql, "ERRCODE = 'PF"));
        caught.extend(codes_after(&sql, "WHEN SQLSTATE 'PF"));
    }
    let raised: BTreeSet<&str> = raised.difference(&caught).map(String::as_str).collect();
    assert!(
        !raised.is_empty(),
        "no PF code found in {}",
        migrations.display()
    );
    assert_eq!(
        named_set, raised,
        "pgfence::sqlstate's PF codes (left) and the codes the migrations raise (right) differ"
    );
}
