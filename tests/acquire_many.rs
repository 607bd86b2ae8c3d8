//! `pgfence.acquire_many`, the batched acquisition the PostgreSQL elector sends when many of its names must be
//! acquired at once: each lease is answered exactly as `pgfence.acquire` would answer it, bad input writes
//! nothing, a cluster without a grant is refused and audited, and a locked lease is answered busy at once (the
//! elector then acquires it alone).

use std::time::Duration;

use crate::common::{client_as, fixture, sqlstate, wait_until_expired, TestDb};
use pgfence::leader::{Elector, LeaseOptions, PgElector};

const TTL: Duration = Duration::from_secs(30);

/// One row of `acquire_many`: (lease, outcome, reason, epoch, holder, secret, in_doubt, gap_us).
type Row = (
    String,
    String,
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<i32>,
    Option<i64>,
);

async fn acquire_many(c: &tokio_postgres::Client, leases: &[&str], holder: &str) -> Vec<Row> {
    c.query(
        "SELECT lease, outcome, reason, epoch, holder, secret, in_doubt, gap_us \
           FROM pgfence.acquire_many($1, $2, 30000)",
        &[&leases, &holder],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| {
        (
            r.get(0),
            r.get(1),
            r.get(2),
            r.get(3),
            r.get(4),
            r.get(5),
            r.get(6),
            r.get(7),
        )
    })
    .collect()
}

/// Invariant 1 (strictly increasing epochs, compare-and-set), through the batch: a new lease, one another holder
/// holds live, one released and one expired are answered as `acquire` answers each — acquired with the next
/// epoch (the previous tenure ended), held with the live holder, acquired, acquired — in name order, each
/// acquired tenure with a secret the lease's renewal accepts; the handover gap is given only after a release.
#[tokio::test]
async fn each_lease_of_a_batch_is_answered_as_acquire_answers_it() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let held = fixture::lease(&store, "b-held").holder("other").await;
    let released = fixture::lease(&store, "c-released").holder("other").await;
    store.release(&released).await.unwrap();
    let expired = fixture::lease(&store, "d-expired")
        .holder("other")
        .ttl(Duration::from_millis(200))
        .await;
    let c = db.client().await;
    wait_until_expired(&c, "c/d-expired").await;

    let rows = acquire_many(
        &c,
        &["c/d-expired", "c/a-new", "c/c-released", "c/b-held"],
        "me",
    )
    .await;
    let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        names,
        ["c/a-new", "c/b-held", "c/c-released", "c/d-expired"],
        "name order"
    );
    let outcome = |i: usize| (rows[i].1.as_str(), rows[i].3);
    assert_eq!(outcome(0), ("acquired", Some(1)));
    assert_eq!(outcome(1), ("held", Some(held.epoch().get())));
    assert_eq!(rows[1].4.as_deref(), Some("other"));
    assert!(rows[1].5.is_none(), "a held lease gives no secret");
    assert_eq!(outcome(2), ("acquired", Some(released.epoch().get() + 1)));
    assert_eq!(outcome(3), ("acquired", Some(expired.epoch().get() + 1)));
    assert!(
        rows[2].7.is_some_and(|us| us >= 0),
        "a released predecessor: a gap"
    );
    assert_eq!(rows[3].7, None, "an expired predecessor: no handover gap");
    assert_eq!(rows[0].7, None, "no predecessor: no gap");
    for row in [&rows[0], &rows[2], &rows[3]] {
        assert_eq!(row.6, Some(0), "nothing in doubt");
        let renewed: String = c
            .query_one(
                "SELECT outcome FROM pgfence.renew($1, $2, $3, 30000)",
                &[&row.0, &row.3.unwrap(), &row.5.as_deref().unwrap()],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(renewed, "renewed", "{}", row.0);
    }
    let ended: String = c
        .query_one(
            "SELECT end_reason FROM pgfence.tenures WHERE lease = 'c/d-expired' AND epoch = $1",
            &[&expired.epoch().get()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        ended, "expired",
        "the tenure before was ended as acquire ends it"
    );
}

/// Bad input writes nothing (invariant: a refused call leaves no trace but its error): NULL, empty, too many,
/// a NULL lease, a lease named twice, a malformed one, a bad holder or ttl — 22023 before any lease row exists.
#[tokio::test]
async fn bad_input_to_a_batch_writes_nothing() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let many: Vec<String> = (0..257).map(|i| format!("c/n{i}")).collect();
    let cases = [
        "SELECT * FROM pgfence.acquire_many(NULL, 'me', 30000)".to_owned(),
        "SELECT * FROM pgfence.acquire_many('{}', 'me', 30000)".to_owned(),
        format!(
            "SELECT * FROM pgfence.acquire_many('{{{}}}', 'me', 30000)",
            many.join(",")
        ),
        "SELECT * FROM pgfence.acquire_many(ARRAY['c/a', NULL], 'me', 30000)".to_owned(),
        "SELECT * FROM pgfence.acquire_many(ARRAY['c/a', 'c/a'], 'me', 30000)".to_owned(),
        "SELECT * FROM pgfence.acquire_many(ARRAY['c/a', 'no-cluster'], 'me', 30000)".to_owned(),
        "SELECT * FROM pgfence.acquire_many(ARRAY['c/a'], '', 30000)".to_owned(),
        "SELECT * FROM pgfence.acquire_many(ARRAY['c/a'], 'me', 1)".to_owned(),
    ];
    for sql in &cases {
        let err = c.batch_execute(sql).await.unwrap_err();
        assert_eq!(sqlstate(&err), "22023", "{sql}: {err}");
    }
    let rows: i64 = c
        .query_one(
            "SELECT (SELECT count(*) FROM pgfence.leases) + (SELECT count(*) FROM pgfence.tenures) \
                  + (SELECT count(*) FROM pgfence.rejections)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "nothing written");
}

/// Invariant 6 (a role reaches only the clusters it was granted), through the batch: the leases of a cluster the
/// role has no grant on are refused with `no_grant` and audited once for the call; the granted cluster's leases
/// are acquired in the same call.
#[tokio::test]
async fn a_batch_refuses_the_leases_of_a_cluster_without_a_grant_and_audits_once() {
    let db = TestDb::new().await;
    let owner = db.store("c").await;
    let (role, _store) = fixture::app_store(&db, &owner, "app", "c").await;
    let c = client_as(&db, &role).await;
    let rows = acquire_many(&c, &["c/a", "x/a", "x/b"], "me").await;
    let answers: Vec<(&str, &str, Option<&str>)> = rows
        .iter()
        .map(|r| (r.0.as_str(), r.1.as_str(), r.2.as_deref()))
        .collect();
    assert_eq!(
        answers,
        [
            ("c/a", "acquired", None),
            ("x/a", "refused", Some("no_grant")),
            ("x/b", "refused", Some("no_grant"))
        ]
    );
    let admin = db.client().await;
    let audited: i64 = admin
        .query_one(
            "SELECT coalesce(sum(count), 0)::int8 FROM pgfence.rejections WHERE reason = 'no_grant'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(audited, 1, "one refusal audited for the call");
    let x_rows: i64 = admin
        .query_one(
            "SELECT count(*) FROM pgfence.leases WHERE name LIKE 'x/%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(x_rows, 0, "nothing written for the refused cluster");
}

/// Liveness (every wait on a lock is bounded): a batch waits for no lock, since it holds what it took until all
/// of it commits. A lease whose row another transaction holds is answered `busy` at once — nothing done for it,
/// its epoch unchanged — while the batch's other lease is acquired; through the elector, the busy lease is then
/// acquired alone (with `acquire`'s bounded wait) once the row is free.
#[tokio::test]
async fn a_batch_answers_busy_for_a_locked_lease_and_the_elector_acquires_it_alone() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let old = fixture::lease(&store, "locked").holder("other").await;
    store.release(&old).await.unwrap();
    let lock = crate::common::RowLock::take(&db, "c/locked").await;
    let c = db.client().await;
    let rows = tokio::time::timeout(
        Duration::from_secs(5),
        acquire_many(&c, &["c/locked", "c/free"], "me"),
    )
    .await
    .expect("a batch waits for no lock");
    let answers: Vec<(&str, &str)> = rows.iter().map(|r| (r.0.as_str(), r.1.as_str())).collect();
    assert_eq!(answers, [("c/free", "acquired"), ("c/locked", "busy")]);
    let epoch = db
        .scalar("SELECT epoch FROM pgfence.leases WHERE name = 'c/locked'")
        .await;
    assert_eq!(epoch, old.epoch().get(), "nothing done for the busy lease");

    let elector = PgElector::new(store.clone());
    let options = LeaseOptions::new(TTL);
    let acquiring = elector.acquire("locked", "pod-a", &options);
    tokio::pin!(acquiring);
    // Alone, it waits for the row (bounded): seen waiting in pg_locks, then the lock is let go.
    tokio::select! {
        _ = &mut acquiring => panic!("acquired while the row is locked"),
        _ = crate::common::wait_until_blocked_on_lock(&db, 1) => {}
    }
    lock.release().await;
    let lease = acquiring.await.unwrap();
    assert_eq!(lease.epoch().get(), old.epoch().get() + 1);
}

/// Invariant 3 through the batch (no stale write commits after a takeover): a guarded transaction of the ended
/// tenure still open — past its check, holding the lease's guard lock — makes the batch answer `busy` for that
/// lease (it neither takes the lease under the writer nor waits for it), while the batch's other lease is
/// acquired. (`acquire` alone then waits the takeover grace and ends the writer, as the takeover tests show.)
#[tokio::test]
async fn a_batch_answers_busy_for_a_lease_whose_guard_an_old_writer_holds() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let old = fixture::lease(&store, "guarded")
        .holder("other")
        .ttl(Duration::from_millis(300))
        .await;
    let writer = db.client().await;
    writer.batch_execute("BEGIN").await.unwrap();
    let outcome: String = writer
        .query_one(
            "SELECT outcome FROM pgfence.fence($1, $2, $3, 'fenced_transaction', NULL, NULL)",
            &[
                &"c/guarded",
                &old.epoch().get(),
                &old.fence().secret().expose_secret(),
            ],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(outcome, "ok", "the old tenure's write is past its check");
    let c = db.client().await;
    wait_until_expired(&c, "c/guarded").await;
    let rows = tokio::time::timeout(
        Duration::from_secs(5),
        acquire_many(&c, &["c/guarded", "c/other"], "me"),
    )
    .await
    .expect("a batch waits for no lock");
    let answers: Vec<(&str, &str)> = rows.iter().map(|r| (r.0.as_str(), r.1.as_str())).collect();
    assert_eq!(answers, [("c/guarded", "busy"), ("c/other", "acquired")]);
    let epoch = db
        .scalar("SELECT epoch FROM pgfence.leases WHERE name = 'c/guarded'")
        .await;
    assert_eq!(epoch, old.epoch().get(), "not taken under the open writer");
    writer.batch_execute("COMMIT").await.unwrap();
}
