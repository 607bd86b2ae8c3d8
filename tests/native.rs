//! The native guard (native/: the `pgfence_native` extension, `pgfence_native.fence`): it answers every call as the
//! portable `pgfence.fence` does, admits from its private memory only what `pgfence.fence` admitted to the same
//! backend, re-reads on every write what may change (the grant, the expiry, the timeline, the epoch), and the
//! library uses it when it is installed and stops when it goes.
//!
//! Invariants checked: 3 (no stale write is admitted: the native fast path reads after the guard lock, on a
//! snapshot taken after it), 4 (every refusal is the portable guard's, audited), 5 (a tenure's secret and the
//! cluster grant are checked on every write), and that the native path is the fast path (it does not call the
//! portable guard when it remembers the tenure).

use crate::common;

#[path = "native/differential.rs"]
mod differential;
#[path = "native/moments.rs"]
mod moments;

use std::time::Duration;

use common::fixture::app_role;
use common::{TestDb, NATIVE_SQL};
use pgfence::Store;

type Answer = Result<(String, Option<String>), String>;

/// `fence` through `function` (`pgfence.fence` or `pgfence_native.fence`): the outcome and reason, or the error's
/// SQLSTATE.
async fn call(
    c: &tokio_postgres::Client,
    function: &str,
    lease: &str,
    epoch: i64,
    secret: Option<&str>,
    operation: &str,
) -> Answer {
    c.query_one(
        &format!("SELECT outcome, reason FROM {function}($1, $2, $3, $4, NULL, NULL)"),
        &[&lease, &epoch, &secret, &operation],
    )
    .await
    .map(|row| (row.get(0), row.get(1)))
    .map_err(|e| {
        e.code()
            .map_or_else(|| e.to_string(), |c| c.code().to_owned())
    })
}

/// The same call through the native guard on `native` and the portable guard on `portable`: the two answers.
async fn both(
    native: &tokio_postgres::Client,
    portable: &tokio_postgres::Client,
    lease: &str,
    epoch: i64,
    secret: Option<&str>,
    operation: &str,
) -> (Answer, Answer) {
    (
        call(
            native,
            "pgfence_native.fence",
            lease,
            epoch,
            secret,
            operation,
        )
        .await,
        call(portable, "pgfence.fence", lease, epoch, secret, operation).await,
    )
}

/// A test database with the native guard, or `None` when this run has none (the test then skips, saying so).
async fn native_db() -> Option<TestDb> {
    let db = TestDb::new().await;
    common::create_native(&db.client().await)
        .await
        .then_some(db)
}

fn ok() -> Answer {
    Ok(("ok".into(), None))
}

fn refused(reason: &str) -> Answer {
    Ok(("refused".into(), Some(reason.into())))
}

/// Asserts that the native and the portable guard gave the same answer, and that it is `want`.
#[track_caller]
fn same((a, b): (Answer, Answer), want: Answer) {
    assert_eq!(a, b, "native and portable answers differ");
    assert_eq!(a, want);
}

/// From the memory: twenty admissions of the remembered tenure (`c/l` at `epoch`) in one transaction of `n`,
/// none of them through the portable guard (the write mark of a new second included: the native guard records
/// it itself).
async fn remembered_admissions_skip_the_portable_guard(
    n: &tokio_postgres::Client,
    epoch: i64,
    s: Option<&str>,
) {
    n.batch_execute("BEGIN; SET LOCAL track_functions = 'pl'")
        .await
        .unwrap();
    for _ in 0..20 {
        assert_eq!(
            call(n, "pgfence_native.fence", "c/l", epoch, s, "op").await,
            ok()
        );
    }
    let portable_calls: i64 = n
        .query_one(
            "SELECT coalesce(pg_stat_get_xact_function_calls(\
               'pgfence.fence(text, bigint, text, text, text, text)'::regprocedure), 0)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    n.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        portable_calls, 0,
        "remembered admissions that went to pgfence.fence"
    );
}

/// A short tenure of `c/short` (acquired by `owner`), once admitted, remembered by `n`: native and portable
/// guards answer alike when it expires, when a next tenure supersedes it, and when that one is released.
async fn expiry_supersession_and_release_answer_alike(
    n: &tokio_postgres::Client,
    p: &tokio_postgres::Client,
    owner: &tokio_postgres::Client,
) {
    let (short, short_secret) = common::sql_acquire(owner, "c/short", "h", 200).await;
    let ss = Some(short_secret.as_str());
    same(both(n, p, "c/short", short, ss, "op").await, ok());
    assert_eq!(common::remembered(n, "c/short").await, vec![short]);
    common::wait_until_expired(owner, "c/short").await;
    same(
        both(n, p, "c/short", short, ss, "op").await,
        refused("expired"),
    );
    let (next, next_secret) = common::sql_acquire(owner, "c/short", "h", 600_000).await;
    same(
        both(n, p, "c/short", short, ss, "op").await,
        refused("superseded"),
    );
    same(
        both(n, p, "c/short", next, Some(&next_secret), "op").await,
        ok(),
    );
    owner
        .query_one(
            "SELECT outcome FROM pgfence.release('c/short', $1, $2)",
            &[&next, &next_secret],
        )
        .await
        .unwrap();
    same(
        both(n, p, "c/short", next, Some(&next_secret), "op").await,
        refused("released"),
    );
}

/// Every kind of call, through the native guard in one session and the portable guard in another, gets the same
/// answer — the admissions, each refusal reason, each input error — while the native session remembers the
/// tenure; and once it remembers it, its admissions do not call the portable guard (the fast path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_guard_answers_every_call_as_the_portable_guard() {
    let Some(db) = native_db().await else {
        return;
    };
    let (n, p, owner) = (db.client().await, db.client().await, db.client().await);
    let (epoch, secret) = common::sql_acquire(&owner, "c/l", "h", 600_000).await;
    let s = Some(secret.as_str());

    same(both(&n, &p, "c/l", epoch, s, "op").await, ok());
    assert_eq!(common::remembered(&n, "c/l").await, vec![epoch]);

    remembered_admissions_skip_the_portable_guard(&n, epoch, s).await;

    same(
        both(&n, &p, "c/l", epoch, Some("forged"), "op").await,
        refused("bad_secret"),
    );
    // A session that never saw the tenure admitted, presenting a forged secret again and again: each refused
    // (a refusal is never remembered).
    let forger = db.client().await;
    for _ in 0..2 {
        assert_eq!(
            call(
                &forger,
                "pgfence_native.fence",
                "c/l",
                epoch,
                Some("forged"),
                "op"
            )
            .await,
            refused("bad_secret")
        );
    }
    assert!(common::remembered(&forger, "c/l").await.is_empty());
    // A wrong secret does not make the holder's session forget its tenure.
    assert_eq!(common::remembered(&n, "c/l").await, vec![epoch]);
    same(
        both(&n, &p, "c/l", epoch + 1, s, "op").await,
        refused("future_epoch"),
    );
    same(
        both(&n, &p, "c/l", epoch, None, "op").await,
        Err("22023".into()),
    );
    same(
        both(&n, &p, "c/l", epoch, s, "bad\u{7}label").await,
        Err("22023".into()),
    );
    same(both(&n, &p, "c/l", epoch, s, "").await, Err("22023".into()));
    same(
        both(&n, &p, "c/nope", 1, s, "op").await,
        refused("unknown_lease"),
    );

    // Calls of another epoch, input errors and unknown leases leave the memory as it was.
    assert_eq!(common::remembered(&n, "c/l").await, vec![epoch]);
    // Under REPEATABLE READ, with the tenure remembered.
    for _ in 0..2 {
        same(both(&n, &p, "c/l", epoch, s, "op").await, ok());
        for c in [&n, &p] {
            c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                .await
                .unwrap();
        }
        same(
            both(&n, &p, "c/l", epoch, s, "op").await,
            Err("PF004".into()),
        );
        for c in [&n, &p] {
            c.batch_execute("ROLLBACK").await.unwrap();
        }
    }

    // Granted before a promotion: the row's timeline older than the server's; twice, the tenure remembered again
    // in between.
    for _ in 0..2 {
        assert_eq!(common::remembered(&n, "c/l").await, vec![epoch]);
        owner
            .batch_execute("UPDATE pgfence.leases SET timeline = timeline - 1 WHERE name = 'c/l'")
            .await
            .unwrap();
        same(
            both(&n, &p, "c/l", epoch, s, "op").await,
            refused("failover"),
        );
        owner
            .batch_execute("UPDATE pgfence.leases SET timeline = timeline + 1 WHERE name = 'c/l'")
            .await
            .unwrap();
        same(both(&n, &p, "c/l", epoch, s, "op").await, ok());
    }

    expiry_supersession_and_release_answer_alike(&n, &p, &owner).await;
}

/// The memory is the backend's, not the role's: a session that remembers a tenure and then becomes a login role
/// without a grant on the cluster is refused `no_grant`, and one whose current role may not execute
/// `pgfence.fence` is refused as a call of it is (42501); a role whose grant of the cluster is revoked is refused
/// on its next write although its session remembers the tenure (the grant is read on every write). Invariant 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_memory_admits_no_role_the_grant_does_not() {
    let Some(db) = native_db().await else {
        return;
    };
    let owner_store = db.store("c").await;
    let intruder = app_role(&db, &owner_store, "intruder", Some("d")).await;
    let app = app_role(&db, &owner_store, "app", Some("c")).await;
    // A second cluster, so that revoking "c" leaves the role its privileges (and the answer is the guard's).
    owner_store
        .admin()
        .grant_application(&app, Some("e"))
        .await
        .unwrap();
    let owner = db.client().await;
    let (epoch, secret) = common::sql_acquire(&owner, "c/l", "h", 600_000).await;
    let s = Some(secret.as_str());

    // A superuser session remembers the tenure, then takes the intruder's login identity.
    let n = db.client().await;
    assert_eq!(
        call(&n, "pgfence_native.fence", "c/l", epoch, s, "op").await,
        ok()
    );
    assert_eq!(common::remembered(&n, "c/l").await, vec![epoch]);
    n.batch_execute(&format!("SET SESSION AUTHORIZATION {intruder}"))
        .await
        .unwrap();
    assert_eq!(
        call(&n, "pgfence_native.fence", "c/l", epoch, s, "op").await,
        refused("no_grant")
    );
    n.batch_execute("RESET SESSION AUTHORIZATION")
        .await
        .unwrap();
    // A current role that may not execute pgfence.fence (the login role is still the superuser, granted
    // everything): refused as a call of pgfence.fence is, whatever the session remembers.
    assert_eq!(
        call(&n, "pgfence_native.fence", "c/l", epoch, s, "op").await,
        ok()
    );
    n.batch_execute(&format!("SET ROLE {intruder}"))
        .await
        .unwrap();
    owner
        .batch_execute(&format!(
            "REVOKE EXECUTE ON FUNCTION pgfence.fence(text, bigint, text, text, text, text) FROM {intruder}"
        ))
        .await
        .unwrap();
    for function in ["pgfence_native.fence", "pgfence.fence"] {
        assert_eq!(
            call(&n, function, "c/l", epoch, s, "op").await,
            Err("42501".into()),
            "{function}"
        );
    }
    n.batch_execute("RESET ROLE").await.unwrap();

    // A granted role (the grant rows, not the owner's membership, admit it) loses its grant.
    let a = common::client_as(&db, &app).await;
    for _ in 0..2 {
        assert_eq!(
            call(&a, "pgfence_native.fence", "c/l", epoch, s, "op").await,
            ok()
        );
    }
    assert!(
        owner_store
            .admin()
            .revoke(&app, Some("c"))
            .await
            .unwrap()
            .removed
    );
    assert_eq!(
        call(&a, "pgfence.fence", "c/l", epoch, s, "op").await,
        refused("no_grant")
    );
    assert_eq!(
        call(&a, "pgfence_native.fence", "c/l", epoch, s, "op").await,
        refused("no_grant")
    );
}

/// A tenure remembered by a session is not admitted again after the pgfence schema was dropped and created anew,
/// even when the new schema's lease reuses the name, the epoch and the lock key (identity columns restart): the
/// memory names the table and the tenure's acquisition, and the old secret is refused `bad_secret`. Invariant 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_schema_does_not_revive_a_remembered_tenure() {
    let Some(db) = native_db().await else {
        return;
    };
    let owner = db.client().await;
    let n = db.client().await;
    let (epoch, old_secret) = common::sql_acquire(&owner, "c/l", "h", 600_000).await;
    let key: i32 = common::lock_key(&owner, "c/l").await;
    assert_eq!(
        call(
            &n,
            "pgfence_native.fence",
            "c/l",
            epoch,
            Some(&old_secret),
            "op"
        )
        .await,
        ok()
    );
    owner
        .batch_execute("DROP SCHEMA pgfence CASCADE")
        .await
        .unwrap();
    db.store("c").await.migrate().await.unwrap();
    owner.batch_execute(NATIVE_SQL).await.unwrap();
    let (again, _new_secret) = common::sql_acquire(&owner, "c/l", "h", 600_000).await;
    let new_key: i32 = common::lock_key(&owner, "c/l").await;
    assert_eq!((again, new_key), (epoch, key), "the new tenure reuses them");
    // The backend still has the library loaded, and its memory.
    assert_eq!(
        call(
            &n,
            "pgfence_native.fence",
            "c/l",
            epoch,
            Some(&old_secret),
            "op"
        )
        .await,
        refused("bad_secret")
    );
}

/// A write whose statement began before a takeover committed, and whose guard runs after it, is judged on the
/// takeover's result: the guard's read is on a snapshot taken after its lock, not the statement's. Through both
/// guards; the statement waits on an advisory lock the test holds (so it began before the takeover) and then
/// calls the guard. Invariant 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_reads_after_its_lock_not_at_its_statement_s_start() {
    let Some(db) = native_db().await else {
        return;
    };
    let owner = db.client().await;
    for function in ["pgfence_native.fence", "pgfence.fence"] {
        let lease = format!("c/{}", function.replace('.', "-"));
        let (epoch, secret) = common::sql_acquire(&owner, &lease, "h", 600_000).await;
        let writer = db.client().await;
        // Remembered: the write below takes the fast path.
        for _ in 0..2 {
            assert_eq!(
                call(&writer, function, &lease, epoch, Some(&secret), "op").await,
                ok()
            );
        }
        let gate = db.client().await;
        gate.batch_execute("BEGIN; SELECT pg_advisory_xact_lock(42)")
            .await
            .unwrap();
        let pid: i32 = writer
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        let sql = format!(
            "SELECT f.outcome, f.reason FROM (SELECT pg_advisory_xact_lock(42)::text AS x) w, \
               LATERAL {function}(w.x || $1, $2, $3, 'op', NULL, NULL) f"
        );
        let (lease2, secret2) = (lease.clone(), secret.clone());
        let write = tokio::spawn(async move {
            writer
                .query_one(&sql, &[&lease2, &epoch, &secret2])
                .await
                .map(|r| (r.get::<_, String>(0), r.get::<_, Option<String>>(1)))
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !owner
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND NOT granted)",
                &[&pid],
            )
            .await
            .unwrap()
            .get::<_, bool>(0)
        {
            assert!(std::time::Instant::now() < deadline, "the write never waited");
            tokio::task::yield_now().await;
        }
        // The takeover commits while the write's statement waits.
        let (next, _) = common::sql_acquire(&owner, &lease, "h", 600_000).await;
        assert_eq!(next, epoch + 1);
        gate.batch_execute("COMMIT").await.unwrap();
        assert_eq!(
            write.await.unwrap().unwrap(),
            ("refused".to_owned(), Some("superseded".to_owned())),
            "{function}"
        );
    }
}

/// The library uses the native guard when the extension is installed, unless configured not to; when the
/// extension goes, the write that finds it missing fails (SQLSTATE 42883) and the next ones use the portable
/// guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_uses_the_native_guard_when_installed_and_stops_when_it_goes() {
    let Some(db) = native_db().await else {
        return;
    };
    db.client()
        .await
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL DEFAULT 0); INSERT INTO t VALUES (1)")
        .await
        .unwrap();
    let store = db.store("c").await;
    assert!(store.native_guard().await.unwrap());
    let off = Store::connect(db.config("c").native_guard(false))
        .await
        .unwrap();
    assert!(!off.native_guard().await.unwrap());
    let lease = store
        .acquire("l", "h", Duration::from_secs(60))
        .await
        .unwrap();
    let write = || {
        diesel::sql_query(
            "UPDATE t SET v = v + 1 WHERE id = 1 AND (SELECT passed FROM pgfence_guard)",
        )
    };
    for s in [&store, &off] {
        assert_eq!(
            s.guarded_write(&lease.fence(), "op", write())
                .await
                .unwrap(),
            1
        );
        s.fenced(&lease.fence(), "op", async |_conn| {
            Ok::<_, pgfence::Error>(())
        })
        .await
        .unwrap();
    }
    db.client()
        .await
        .batch_execute("DROP EXTENSION pgfence_native")
        .await
        .unwrap();
    let err = store
        .guarded_write(&lease.fence(), "op", write())
        .await
        .unwrap_err();
    assert_eq!(
        err.sqlstate(),
        Some(pgfence::sqlstate::SqlState::UndefinedFunction),
        "{err}"
    );
    assert!(!store.native_guard().await.unwrap());
    assert_eq!(
        store
            .guarded_write(&lease.fence(), "op", write())
            .await
            .unwrap(),
        1
    );
    assert_eq!(db.scalar("SELECT v::bigint FROM t").await, 3);
}

/// A write the native guard admits from its memory holds the lease's guard lock, shared, to the end of its
/// transaction, as every admitted write does: a takeover waits for it. Checked in `pg_locks` from another
/// session while the writer's transaction is open, and gone after its commit. And it records the write mark
/// when one is due, as pgfence.fence does. Invariant 3 (no takeover commits before a write it did not wait for)
/// and the overlap review's record of the last accepted write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_admission_holds_the_guard_lock_to_its_commit_and_marks_the_write() {
    let Some(db) = native_db().await else {
        return;
    };
    let owner = db.client().await;
    let (epoch, secret) = common::sql_acquire(&owner, "c/l", "h", 600_000).await;
    let s = Some(secret.as_str());
    let writer = db.client().await;
    let pid: i32 = writer
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    for _ in 0..2 {
        assert_eq!(
            call(&writer, "pgfence_native.fence", "c/l", epoch, s, "op").await,
            ok()
        );
    }
    assert_eq!(common::remembered(&writer, "c/l").await, vec![epoch]);
    let held = || async {
        owner
            .query_one(
                &format!(
                    "SELECT count(*) FROM pg_locks k JOIN pgfence.leases l ON k.objid = l.lock_key::oid \
                      WHERE k.locktype = 'advisory' AND k.classid = {}::oid AND k.objsubid = 2 \
                        AND k.mode = 'ShareLock' AND k.granted AND k.pid = $1 AND l.name = 'c/l'",
                    pgfence::schema::GUARD_LOCK_CLASS
                ),
                &[&pid],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    for _ in 0..3 {
        writer.batch_execute("BEGIN").await.unwrap();
        assert_eq!(
            call(&writer, "pgfence_native.fence", "c/l", epoch, s, "op").await,
            ok()
        );
        assert_eq!(held().await, 1, "the admitted write holds the guard lock");
        writer.batch_execute("COMMIT").await.unwrap();
        assert_eq!(held().await, 0, "released at the commit");
    }
    // The write mark of a remembered admission (pgfence.write_marks: the session's first admitted write of the
    // tenure in each second) is recorded by the native guard itself, in the write's transaction.
    owner
        .execute(
            "DELETE FROM pgfence.write_marks WHERE backend = $1",
            &[&pid],
        )
        .await
        .unwrap();
    writer
        .batch_execute("SELECT set_config('pgfence.write_mark', '', false)")
        .await
        .unwrap();
    assert_eq!(
        call(&writer, "pgfence_native.fence", "c/l", epoch, s, "op").await,
        ok()
    );
    let marks: i64 = owner
        .query_one(
            "SELECT count(*) FROM pgfence.write_marks WHERE lease = 'c/l' AND epoch = $1 AND backend = $2",
            &[&epoch, &pid],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(marks, 1, "the admitted write's mark");
}

/// The native guard is built only against the installation of the server the tests run (`PG_BIN`): a `pg_config`
/// of another installation (Debian's 15 on `PATH` while `PG_BIN` names a packaged 18) is refused, saying which
/// installation it belongs to — else the tests would start that installation's server and a run meant for one
/// version would silently test another. The `pg_config` of the server's own installation is accepted.
#[test]
fn a_pg_config_of_another_installation_is_refused() {
    let Some(own) = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("pg_config"))
        .chain(std::iter::once("/usr/bin/pg_config".into()))
        .find(|p| p.is_file())
    else {
        eprintln!("skipped a_pg_config_of_another_installation_is_refused: no pg_config on PATH");
        return;
    };
    let out = std::process::Command::new(&own)
        .arg("--bindir")
        .output()
        .expect("pg_config --bindir");
    let its_bin = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let accepted = common::native::pg_config_of(&its_bin, Some(own.as_os_str()));
    assert_eq!(
        accepted.as_deref(),
        Ok(own.as_path()),
        "its own installation"
    );

    // Another installation: a directory with the three server binaries (links to the same files would resolve to
    // the same directory, so these are stand-ins) that is not pg_config's bindir.
    let other = tempfile::tempdir().expect("tempdir");
    for name in ["initdb", "pg_ctl", "postgres"] {
        std::fs::write(other.path().join(name), b"#!/bin/sh\n").unwrap();
    }
    for chosen in [Some(own.as_os_str()), None] {
        let refused = common::native::pg_config_of(other.path(), chosen)
            .expect_err("a pg_config of another installation");
        assert!(
            refused.contains(&other.path().display().to_string())
                && refused.contains("PG_BIN")
                && (chosen.is_none() || refused.contains(&its_bin.display().to_string())),
            "{refused}"
        );
    }
}
