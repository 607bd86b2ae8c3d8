//! The native guard against the portable one at the three moments no single call's state shows: a takeover
//! holding the lease's intent lock when the call arrives, a takeover committing while the call's statement waits
//! for its turn, and a schema dropped and created anew under a session's memory. Each moment is played once
//! through `pgfence_native.fence` and once through `pgfence.fence`, with the same interleaving (forced with locks
//! and waited for in `pg_locks`, never by sleeping); the two must tell the same story.
//!
//! Invariants checked: 3, 5 and 7 on the native path. Shown to fail on the gate mutations
//! `native-without-intent-probe`, `native-reads-at-statement-start` and `native-trusts-a-recreated-schema` —
//! with the table of tests/native/differential.rs, on every `native-*` mutation of the gate.

use crate::common;

use std::time::{Duration, Instant};

use common::{TestDb, NATIVE_SQL};
use pgfence::schema::GUARD_LOCK_CLASS;

const GUARDS: [&str; 2] = ["pgfence_native.fence", "pgfence.fence"];

/// How long a forced interleaving may take to reach its next step before the test gives up (a hang is a failure,
/// never a pass).
const STEP: Duration = Duration::from_secs(30);

/// The answer of one guard call: outcome and reason, or the error's SQLSTATE.
async fn answer(
    c: &tokio_postgres::Client,
    sql: &str,
    lease: &str,
    epoch: i64,
    secret: &str,
) -> String {
    match c.query_one(sql, &[&lease, &epoch, &secret]).await {
        Ok(r) => format!(
            "{} {}",
            r.get::<_, String>(0),
            r.get::<_, Option<String>>(1).unwrap_or_default()
        ),
        Err(e) => format!("error {}", common::sqlstate(&e)),
    }
}

/// `pid`'s backend is waiting for an advisory lock (`objsubid`: 1 the guard lock's pair, 2 the intent lock's, any
/// when `None`).
async fn waits(owner: &tokio_postgres::Client, pid: i32, objsubid: Option<i32>) -> bool {
    owner
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND NOT granted \
               AND ($2::int IS NULL OR objsubid = $2::int))",
            &[&pid, &objsubid],
        )
        .await
        .unwrap()
        .get(0)
}

async fn pid(c: &tokio_postgres::Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

/// A session of its own that has admitted the tenure once (so the guard under test takes its fast path: the
/// native memory, the portable guard's known slot).
async fn remembering(
    db: &TestDb,
    function: &str,
    lease: &str,
    epoch: i64,
    secret: &str,
) -> tokio_postgres::Client {
    let writer = db.client().await;
    let sql = format!("SELECT outcome, reason FROM {function}($1, $2, $3, 'op', NULL, NULL)");
    for _ in 0..2 {
        assert_eq!(
            answer(&writer, &sql, lease, epoch, secret).await,
            "ok ",
            "{function}"
        );
    }
    writer
}

/// A takeover holds the lease's intent lock (as it does between its rounds, the guard lock itself free) when a
/// write of the current tenure arrives. The story: whether the write was answered before the takeover let go, and
/// its answer after.
async fn intent_lock_held(db: &TestDb, function: &str, i: usize) -> String {
    let owner = db.client().await;
    let lease = format!("c/intent{i}");
    let (epoch, secret) = common::sql_acquire(&owner, &lease, "h", 600_000).await;
    let key: i32 = common::lock_key(&owner, &lease).await;
    let writer = remembering(db, function, &lease, epoch, &secret).await;
    let writer_pid = pid(&writer).await;
    let takeover = db.client().await;
    takeover.batch_execute("BEGIN").await.unwrap();
    takeover
        .execute(
            "SELECT pg_advisory_xact_lock($1, -$2::int)",
            &[&GUARD_LOCK_CLASS, &key],
        )
        .await
        .unwrap();
    let sql = format!("SELECT outcome, reason FROM {function}($1, $2, $3, 'op', NULL, NULL)");
    let write = tokio::spawn(async move { answer(&writer, &sql, &lease, epoch, &secret).await });
    let deadline = Instant::now() + STEP;
    let before = loop {
        if write.is_finished() {
            break "answered while the intent lock was held";
        }
        if waits(&owner, writer_pid, Some(2)).await {
            break "waited for the intent lock";
        }
        assert!(
            Instant::now() < deadline,
            "{function}: the write neither waited nor ended"
        );
        tokio::task::yield_now().await;
    };
    takeover.batch_execute("ROLLBACK").await.unwrap();
    format!("{before}, then: {}", write.await.unwrap())
}

/// A write's statement begins, then waits (on a lock the test holds) before it calls the guard; meanwhile a
/// takeover commits a new epoch. The story: the guard's answer, which must be judged on the lease after the
/// takeover.
async fn takeover_while_the_statement_waits(db: &TestDb, function: &str, i: usize) -> String {
    let owner = db.client().await;
    let lease = format!("c/snapshot{i}");
    let (epoch, secret) = common::sql_acquire(&owner, &lease, "h", 600_000).await;
    let writer = remembering(db, function, &lease, epoch, &secret).await;
    let writer_pid = pid(&writer).await;
    let gate = db.client().await;
    let gate_key = 4_200 + i as i64;
    gate.batch_execute(&format!("BEGIN; SELECT pg_advisory_xact_lock({gate_key})"))
        .await
        .unwrap();
    let sql = format!(
        "SELECT f.outcome, f.reason FROM (SELECT pg_advisory_xact_lock({gate_key})::text AS x) w, \
           LATERAL {function}(w.x || $1, $2, $3, 'op', NULL, NULL) f"
    );
    let write = tokio::spawn(async move { answer(&writer, &sql, &lease, epoch, &secret).await });
    let deadline = Instant::now() + STEP;
    while !waits(&owner, writer_pid, None).await {
        assert!(
            !write.is_finished(),
            "{function}: the statement did not wait for the gate"
        );
        assert!(
            Instant::now() < deadline,
            "{function}: the statement never waited"
        );
        tokio::task::yield_now().await;
    }
    let lease = format!("c/snapshot{i}");
    let (next, _) = common::sql_acquire(&owner, &lease, "h", 600_000).await;
    assert_eq!(next, epoch + 1);
    gate.batch_execute("COMMIT").await.unwrap();
    write.await.unwrap()
}

/// Each guard's session admits a tenure; the pgfence schema is dropped and migrated again, and the lease acquired
/// again — the new tenure reuses the name, the epoch and the lock key (the database's first lease both times).
/// The story: each guard's answer to the old tenure's secret.
async fn schema_created_anew(db: &TestDb) -> Vec<String> {
    let owner = db.client().await;
    let (epoch, old_secret) = common::sql_acquire(&owner, "c/anew", "h", 600_000).await;
    let key = common::lock_key(&owner, "c/anew").await;
    let mut sessions = Vec::new();
    for function in GUARDS {
        sessions.push(remembering(db, function, "c/anew", epoch, &old_secret).await);
    }
    owner
        .batch_execute("DROP SCHEMA pgfence CASCADE")
        .await
        .unwrap();
    db.store("c").await.migrate().await.unwrap();
    owner.batch_execute(NATIVE_SQL).await.unwrap();
    let (again, _) = common::sql_acquire(&owner, "c/anew", "h", 600_000).await;
    assert_eq!(
        (again, common::lock_key(&owner, "c/anew").await),
        (epoch, key),
        "the new tenure reuses the epoch and the lock key"
    );
    let mut stories = Vec::new();
    for (function, session) in GUARDS.iter().zip(&sessions) {
        let sql = format!("SELECT outcome, reason FROM {function}($1, $2, $3, 'op', NULL, NULL)");
        stories.push(answer(session, &sql, "c/anew", epoch, &old_secret).await);
    }
    stories
}

/// Invariants 3, 5 and 7 on the native path, at the moments between calls: the native guard waits for a
/// takeover's intent lock as the portable one does, judges a write on the lease as it is after its lock (not as
/// its statement began), and forgets every tenure of a schema that was dropped — the same story as the portable
/// guard's each time, and the one the verdict tells (the portable guard's is checked too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_guard_agrees_with_the_verdict_at_every_moment_between_calls() {
    let (db, anew) = (TestDb::new().await, TestDb::new().await);
    if !common::create_native(&db.client().await).await
        || !common::create_native(&anew.client().await).await
    {
        return;
    }
    let mut differ = Vec::new();
    let mut stories = Vec::new();
    // First, in a database of its own: the schema created anew must reuse the first lease's lock key.
    for (function, story) in GUARDS.iter().zip(schema_created_anew(&anew).await) {
        stories.push(("schema created anew", *function, story));
    }
    for (i, function) in GUARDS.iter().enumerate() {
        stories.push((
            "intent lock held",
            *function,
            intent_lock_held(&db, function, i).await,
        ));
        stories.push((
            "takeover while the statement waits",
            *function,
            takeover_while_the_statement_waits(&db, function, i).await,
        ));
    }
    let expected = [
        ("intent lock held", "waited for the intent lock, then: ok "),
        ("takeover while the statement waits", "refused superseded"),
        ("schema created anew", "refused bad_secret"),
    ];
    for (moment, want) in expected {
        let of = |function: &str| {
            stories
                .iter()
                .find(|(m, f, _)| *m == moment && *f == function)
                .map(|(_, _, s)| s.clone())
                .unwrap()
        };
        let (native, portable) = (of(GUARDS[0]), of(GUARDS[1]));
        if native != portable {
            differ.push(format!(
                "{moment}:\n  native:   {native}\n  portable: {portable}"
            ));
        }
        assert_eq!(portable, want, "{moment}: the portable guard's story");
    }
    assert!(
        differ.is_empty(),
        "the guards disagree:\n{}",
        differ.join("\n")
    );
}
