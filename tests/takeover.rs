//! Bounded, fair takeover: a takeover waits only for guarded writes already past their check, never for ones
//! that start after it; a stalled holder delays a successor by at most the takeover grace; every lock wait of
//! pgfence is bounded and, when it ends, names who blocked; a direct UPDATE of a lease row serializes against
//! guarded writes like the functions do; guards refuse to decide outside READ COMMITTED.
//!
//! Invariants checked: 7 (a takeover waits only for guarded writes past their check; a stalled holder delays it
//! by at most a bounded grace), 3 (no stale write commits after a takeover), 1 (epochs never go down).
//!
//! The measurement behind the README's takeover figures is `#[ignore]`d here (it runs for minutes):
//! `cargo test --release --test suite takeover:: -- --ignored --nocapture`.

use crate::common;

use std::time::{Duration, Instant};

use common::{median, sqlstate, wait_until_blocked_on_lock, TestDb};
use pgfence::{Error, Fence, LossReason, Store};

const TTL: Duration = Duration::from_secs(60);

async fn app_table(db: &TestDb) {
    db.client()
        .await
        .batch_execute("CREATE TABLE app_writes (id bigserial PRIMARY KEY, epoch bigint NOT NULL)")
        .await
        .unwrap();
}

/// A raw session named `application_name`, for holding transactions open.
async fn session(db: &TestDb, application_name: &str) -> tokio_postgres::Client {
    let url = format!(
        "{}{}application_name={application_name}",
        db.url,
        if db.url.contains('?') { '&' } else { '?' }
    );
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect raw session");
    tokio::spawn(connection);
    client
}

/// `SELECT outcome, reason FROM pgfence.fence(lease, epoch, secret, 'fenced_transaction', NULL, NULL)` on a raw
/// session.
async fn fence_outcome(
    client: &tokio_postgres::Client,
    fence: &pgfence::Fence,
) -> Result<(String, Option<String>), tokio_postgres::Error> {
    client
        .query_one(
            "SELECT outcome, reason FROM pgfence.fence($1, $2, $3, 'fenced_transaction', NULL, NULL)",
            &[
                &fence.lease(),
                &fence.epoch().get(),
                &fence.secret().expose_secret(),
            ],
        )
        .await
        .map(|r| (r.get(0), r.get(1)))
}

/// Fairness: a takeover that waits for a guarded transaction in flight is not overtaken by a guard of the
/// current epoch that starts after it. The later guard queues behind the takeover and, once it commits, is
/// refused. (With row locks — FOR KEY SHARE guards against a FOR UPDATE takeover — the later guard was granted
/// at once and a stream of them held the takeover off without bound.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_takeover_is_not_overtaken_by_later_guards() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let lease = store.acquire("fair", "leader", TTL).await.unwrap();

    let in_flight = session(&db, "in-flight").await;
    in_flight.batch_execute("BEGIN").await.unwrap();
    assert_eq!(
        fence_outcome(&in_flight, &lease.fence()).await.unwrap().0,
        "ok"
    );

    let taker = tokio::spawn({
        let store = store.clone();
        async move { store.admin().force_release("fair").await }
    });
    wait_until_blocked_on_lock(&db, 1).await;

    let later = session(&db, "later").await;
    let later_guard = tokio::spawn(async move {
        later.batch_execute("BEGIN").await.unwrap();
        let outcome = fence_outcome(&later, &lease.fence()).await;
        later.batch_execute("COMMIT").await.unwrap();
        outcome
    });
    // Both the takeover and the later guard wait: the later guard did not overtake the queued takeover. A guard
    // that overtakes it is answered and commits at once, which ends this wait (no timeout needed to see it).
    let probe = db.client().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while common::lock_waiters(&probe).await < 2 {
        if later_guard.is_finished() {
            panic!(
                "the later guard overtook the queued takeover: {:?}",
                later_guard.await.unwrap()
            );
        }
        assert!(Instant::now() < deadline, "the later guard never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(!later_guard.is_finished() && !taker.is_finished());

    in_flight.batch_execute("COMMIT").await.unwrap();
    let released = tokio::time::timeout(Duration::from_secs(10), taker)
        .await
        .expect("the takeover completes once the guard in flight commits")
        .unwrap()
        .unwrap();
    assert!(
        matches!(released, pgfence::ForceReleased::Ended { .. }),
        "{released:?}"
    );
    let (outcome, reason) = tokio::time::timeout(Duration::from_secs(10), later_guard)
        .await
        .expect("the later guard completes after the takeover")
        .unwrap()
        .unwrap();
    assert_eq!(
        (outcome.as_str(), reason.as_deref()),
        ("refused", Some("released"))
    );
}

/// A holder that sits idle inside a guarded transaction past its ttl delays a successor's takeover by at most
/// the grace (plus the time to end it): the successor's acquisition terminates the stalled backend, and the
/// stalled transaction's write never commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_guarded_transaction_delays_a_takeover_by_at_most_the_grace() {
    const GRACE: Duration = Duration::from_millis(300);
    const SHORT_TTL: Duration = Duration::from_millis(500);
    let db = TestDb::new().await;
    app_table(&db).await;
    let owner = db.client().await;
    owner
        .query_one("SELECT pgfence.set_takeover_grace('300 ms')", &[])
        .await
        .unwrap();
    let store = db.store("c").await;
    let acquired_at = Instant::now();
    let lease = store.acquire("idle", "stalled", SHORT_TTL).await.unwrap();
    let epoch = lease.epoch().get();

    let stalled = session(&db, "stalled-writer").await;
    stalled.batch_execute("BEGIN").await.unwrap();
    assert_eq!(
        fence_outcome(&stalled, &lease.fence()).await.unwrap().0,
        "ok"
    );
    stalled
        .execute("INSERT INTO app_writes (epoch) VALUES ($1)", &[&epoch])
        .await
        .unwrap();

    // The successor tries as a candidate would: until the database says the lease is free.
    let taker = db.store("c").await;
    let successor = loop {
        let attempt = Instant::now();
        match taker.acquire("idle", "successor", TTL).await {
            Ok(successor) => break (successor, attempt.elapsed()),
            Err(Error::Held { .. }) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("acquire: {e}"),
        }
        assert!(acquired_at.elapsed() < Duration::from_secs(10));
    };
    let (successor, took) = successor;
    let since_acquired = acquired_at.elapsed();
    eprintln!("takeover of an idle holder: acquire took {took:?}, {since_acquired:?} after the first acquisition");
    assert!(successor.epoch() > lease.epoch());
    assert!(
        took >= GRACE,
        "the takeover waited {took:?}, less than the grace"
    );
    assert!(
        took <= GRACE + Duration::from_secs(1),
        "the takeover waited {took:?}, more than grace + 1 s"
    );
    assert!(
        since_acquired <= SHORT_TTL + GRACE + Duration::from_secs(1),
        "takeover completed {since_acquired:?} after the acquisition: more than ttl + grace + 1 s"
    );

    let commit = stalled.batch_execute("COMMIT").await;
    assert!(
        commit.is_err(),
        "the stalled transaction committed after its successor's acquisition"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM app_writes").await,
        0,
        "the stalled write must not commit"
    );
}

/// The three kinds of takeover of a live tenure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Takeover {
    ForceRelease,
    Release,
    Reacquire,
}

impl Takeover {
    const ALL: [Takeover; 3] = [
        Takeover::ForceRelease,
        Takeover::Release,
        Takeover::Reacquire,
    ];

    /// Runs the takeover of `lease` (whose holder is `holder`); returns the holder's next tenure (the same
    /// holder acquiring again after a release or force-release).
    async fn run(self, store: &Store, lease: &pgfence::Lease) -> Result<pgfence::Lease, Error> {
        match self {
            Takeover::ForceRelease => {
                store.admin().force_release(lease.name()).await?;
            }
            Takeover::Release => {
                store.release(lease).await?;
            }
            Takeover::Reacquire => return store.acquire(lease.name(), lease.holder(), TTL).await,
        }
        store.acquire(lease.name(), lease.holder(), TTL).await
    }

    /// The reasons a write of the ended tenure may be refused with: the takeover's own, or `superseded` once
    /// the holder's next acquisition (part of `run`) has committed too.
    fn reasons(self) -> &'static [&'static str] {
        match self {
            Takeover::Reacquire => &["superseded"],
            _ => &["released", "superseded"],
        }
    }
}

/// A write arriving while a takeover waits out its grace is refused once the takeover has committed, with the
/// takeover's reason, and its session lives on: it is never answered ok and then ended. For each kind of takeover
/// (an operator's force_release, the holder's release, the holder's new acquisition), behind a guarded transaction
/// left open (so the takeover waits the whole grace and then ends it). Invariant 7 (a write arriving during a
/// takeover, in whatever phase, is refused). Fails on the previous protocol (gate mutation grace-lets-writes-in):
/// the late write was let in when the takeover's wait for the guard lock ran out, answered ok, and committed just
/// before the takeover. The interleaving is forced, not hoped for: the late write is seen queued (a second lock
/// waiter in pg_stat_activity) while the takeover still waits; on a machine so slow that the grace ran out first,
/// the attempt proves nothing and is made again with twice the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_arriving_during_the_grace_is_refused_never_accepted_and_ended() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    for kind in Takeover::ALL {
        let mut grace = Duration::from_millis(600);
        let mut attempt = 0;
        while !late_write_during_the_grace(&db, &store, kind, grace, attempt).await {
            attempt += 1;
            grace *= 2;
            assert!(
                attempt < 4,
                "{kind:?}: the late write never queued while the takeover waited out its grace"
            );
        }
    }
}

/// One attempt of [`a_write_arriving_during_the_grace_is_refused_never_accepted_and_ended`] with `grace`: `false`
/// when the late write did not queue before the takeover's wait ended (nothing proven; the takeover has been
/// waited for).
async fn late_write_during_the_grace(
    db: &TestDb,
    store: &Store,
    kind: Takeover,
    grace: Duration,
    attempt: usize,
) -> bool {
    let probe = db.client().await;
    probe
        .query_one(
            "SELECT pgfence.set_takeover_grace($1::text::interval)",
            &[&format!("{} ms", grace.as_millis())],
        )
        .await
        .unwrap();
    let lease = store
        .acquire(&format!("grace-{kind:?}-{attempt}"), "h1", TTL)
        .await
        .unwrap();
    let fence = lease.fence();
    let in_flight = session(db, "in-flight").await;
    in_flight.batch_execute("BEGIN").await.unwrap();
    assert_eq!(fence_outcome(&in_flight, &fence).await.unwrap().0, "ok");
    let late = std::sync::Arc::new(session(db, "late-writer").await);
    let taker = {
        let (store, lease) = (store.clone(), lease.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let next = kind.run(&store, &lease).await;
            (next, started.elapsed())
        })
    };
    // The takeover is queued for the guard lock, waiting out the grace for the transaction in flight.
    wait_until_blocked_on_lock(db, 1).await;
    let answer = tokio::spawn({
        let (late, fence) = (late.clone(), fence.clone());
        async move { fence_outcome(&late, &fence).await }
    });
    // The late write queues too, while the takeover still waits.
    let queued = loop {
        if common::lock_waiters(&probe).await >= 2 {
            break true;
        }
        if taker.is_finished() {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let (next, took) = taker.await.unwrap();
    let next = next.unwrap_or_else(|e| panic!("{kind:?}: the takeover failed: {e}"));
    assert!(next.epoch() > lease.epoch());
    let answer = answer.await.unwrap();
    if !queued {
        eprintln!(
            "{kind:?}: the late write came after the grace of {grace:?}; again with a longer one"
        );
        let _ = in_flight.batch_execute("ROLLBACK").await;
        return false;
    }
    let (outcome, reason) = answer.unwrap_or_else(|e| {
        panic!(
            "{kind:?}: the late write failed instead of being refused: {e} ({})",
            sqlstate(&e)
        )
    });
    assert_ne!(
        outcome, "ok",
        "{kind:?}: a write arriving during the grace was accepted"
    );
    assert!(
        kind.reasons().contains(&reason.as_deref().unwrap_or("")),
        "{kind:?}: refused with {reason:?}"
    );
    late.query_one("SELECT 1", &[])
        .await
        .unwrap_or_else(|e| panic!("{kind:?}: the late writer's session was ended: {e}"));
    // Bounded generously (a loaded machine stretches it): ending the holders must follow the grace, not wait on.
    assert!(
        took >= grace && took <= grace + Duration::from_secs(5),
        "{kind:?}: the takeover took {took:?}, not within [grace, grace + 5 s]"
    );
    assert!(
        in_flight.batch_execute("COMMIT").await.is_err(),
        "{kind:?}: the transaction left open past the grace committed"
    );
    true
}

/// One storm writer's account.
#[derive(Debug, Default)]
struct StormTally {
    accepted: u64,
    refused: u64,
    timed_out: u64,
    /// Sessions ended under the writer, with whether its previous write had been answered ok.
    ended: Vec<bool>,
    other_errors: Vec<String>,
}

/// One storm writer: `create_task` of the current tenure (`fence`'s latest) back to back under a 20 ms
/// statement_timeout, on a session of its own named `storm-<w>`, until `stop`; what became of its writes.
async fn storm_writer(
    db: &TestDb,
    w: usize,
    rx: &mut tokio::sync::watch::Receiver<Fence>,
    stop: &std::sync::atomic::AtomicBool,
) -> StormTally {
    use std::sync::atomic::Ordering;
    let mut tally = StormTally::default();
    let connect = || async {
        let c = session(db, &format!("storm-{w}")).await;
        c.batch_execute("SET statement_timeout = '20ms'")
            .await
            .unwrap();
        c
    };
    let mut client = connect().await;
    let mut last_ok = false;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let fence = rx.borrow_and_update().clone();
        n += 1;
        let key = format!("storm-{w}-{n}");
        let answer = client
            .query_one(
                "SELECT outcome FROM pgfence.create_task($1, $2, $3, $4, '{}'::jsonb)",
                &[
                    &fence.lease(),
                    &fence.epoch().get(),
                    &fence.secret().expose_secret(),
                    &key,
                ],
            )
            .await;
        match answer {
            Ok(row) if row.get::<_, String>(0) == "ok" => {
                tally.accepted += 1;
                last_ok = true;
            }
            Ok(_) => {
                tally.refused += 1;
                last_ok = false;
            }
            Err(e) if sqlstate(&e) == "57014" => {
                tally.timed_out += 1;
                last_ok = false;
            }
            Err(e) if sqlstate(&e) == "57P01" || e.is_closed() => {
                tally.ended.push(last_ok);
                client = connect().await;
                last_ok = false;
            }
            Err(e) => {
                tally.other_errors.push(format!("{e} ({})", sqlstate(&e)));
                last_ok = false;
            }
        }
    }
    tally
}

/// The start of the takeover `taker` runs for `c/storm`, by the database clock (seconds since the epoch): the
/// first moment `control` sees it holding the intent lock (it waits out the grace for the transaction in
/// flight, so it is seen); `None` if it finished unseen.
async fn takeover_start<T>(
    control: &tokio_postgres::Client,
    taker: &tokio::task::JoinHandle<T>,
) -> Option<f64> {
    let mut start = None;
    while start.is_none() && !taker.is_finished() {
        let row = control
            .query_one(
                &format!(
                    "SELECT extract(epoch FROM clock_timestamp())::float8, EXISTS (SELECT 1 FROM pg_locks k \
                       JOIN pgfence.leases l ON k.objid = (-l.lock_key)::oid AND l.name = 'c/storm' \
                      WHERE k.locktype = 'advisory' AND k.classid = {} AND k.objsubid = 2 \
                        AND k.mode = 'ExclusiveLock' AND k.granted)",
                    pgfence::schema::GUARD_LOCK_CLASS
                ),
                &[],
            )
            .await
            .unwrap();
        if row.get::<_, bool>(1) {
            start = Some(row.get::<_, f64>(0));
        } else {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    start
}

/// Every accepted storm write of an ended tenure whose commit (created_at, database clock) came later than
/// `margin` seconds after its takeover began (`started_at`: ended epoch, takeover start).
async fn accepted_after_their_takeover_began(
    control: &tokio_postgres::Client,
    started_at: &[(i64, f64)],
    margin: f64,
) -> Vec<String> {
    let mut slipped = Vec::new();
    for row in control
        .query(
            "SELECT fence, extract(epoch FROM created_at)::float8 FROM pgfence.tasks WHERE key LIKE 'storm-%'",
            &[],
        )
        .await
        .unwrap()
    {
        let (epoch, at): (i64, f64) = (row.get(0), row.get(1));
        if let Some((_, start)) = started_at.iter().find(|(e, _)| *e == epoch) {
            if at > start + margin {
                slipped.push(format!("epoch {epoch}: accepted {:.3} s after its takeover began", at - start));
            }
        }
    }
    slipped
}

/// A takeover under a continuous storm of writes of the ending tenure lets none of them in and completes within
/// grace + 1 s, every time: `PGFENCE_STORM_ROUNDS` (default 100) takeovers — force_release, the holder's release
/// and its new acquisition in turn — each behind a guarded transaction left open (so each waits out the grace and
/// ends it), while four writers send create_task of the current tenure back to back, each under a 20 ms
/// statement_timeout, so that new writes keep arriving in every phase of a takeover (queued, grace, ending the
/// holders, queued again). Checked, from outside: no write of an ended tenure was accepted after its takeover began
/// (by the database clock: each accepted task's created_at against the first moment the takeover was seen holding
/// its intent lock in pg_locks, with a margin of half the grace for a write already past its check), no storm writer's session was ended (so none was answered ok and
/// then ended), no takeover failed, and the slowest took at most grace + 1 s. Invariant 7. Fails on the previous protocol
/// (grace-lets-writes-in). A guard without its intent probe makes it fail only by chance (the window is the
/// instant between a takeover's rounds); guard::a_write_arriving_while_a_takeover_holds_its_intent_lock_waits_on_
/// either_path catches that every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_under_a_write_storm_lets_no_write_in_and_ends_within_its_bound() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    const GRACE: Duration = Duration::from_millis(150);
    const WRITERS: usize = 4;
    let rounds: usize = std::env::var("PGFENCE_STORM_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let db = TestDb::new().await;
    let control = db.client().await;
    control
        .query_one("SELECT pgfence.set_takeover_grace('150 ms')", &[])
        .await
        .unwrap();
    let store = db.store("c").await;
    let mut lease = store.acquire("storm", "leader", TTL).await.unwrap();
    let (tx, rx) = tokio::sync::watch::channel(lease.fence());
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (db, mut rx, stop) = (db.clone(), rx.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            storm_writer(&db, w, &mut rx, &stop).await
        }));
    }

    let mut started_at = Vec::new();
    let mut took = Vec::new();
    let mut failed = Vec::new();
    for round in 0..rounds {
        let kind = Takeover::ALL[round % 3];
        let in_flight = session(&db, "in-flight").await;
        in_flight.batch_execute("BEGIN").await.unwrap();
        assert_eq!(
            fence_outcome(&in_flight, &lease.fence()).await.unwrap().0,
            "ok"
        );
        let t = Instant::now();
        let taker = {
            let (store, lease) = (store.clone(), lease.clone());
            tokio::spawn(async move { kind.run(&store, &lease).await })
        };
        // The takeover's start, by the database clock: the first moment it is seen holding the intent lock (it
        // waits out the grace for the transaction in flight, so it is seen).
        let start = takeover_start(&control, &taker).await;
        match taker.await.unwrap() {
            Ok(next) => {
                took.push(t.elapsed());
                let start = start.expect("the takeover was never seen holding its intent lock");
                started_at.push((lease.epoch().get(), start));
                lease = next;
                tx.send(lease.fence()).unwrap();
            }
            Err(e) => {
                failed.push(format!("round {round} ({kind:?}): {e}"));
                lease = store.acquire("storm", "leader", TTL).await.unwrap();
                tx.send(lease.fence()).unwrap();
            }
        }
        assert!(in_flight.batch_execute("COMMIT").await.is_err());
    }
    stop.store(true, Ordering::Relaxed);
    let mut tallies = Vec::new();
    for w in writers {
        tallies.push(w.await.unwrap());
    }

    // Every accepted write of an ended tenure, against its takeover's start (database clock).
    let slipped =
        accepted_after_their_takeover_began(&control, &started_at, GRACE.as_secs_f64() / 2.0).await;
    took.sort();
    let p = |q: f64| took[((took.len() - 1) as f64 * q).round() as usize];
    let accepted: u64 = tallies.iter().map(|t| t.accepted).sum();
    let refused: u64 = tallies.iter().map(|t| t.refused).sum();
    let timed_out: u64 = tallies.iter().map(|t| t.timed_out).sum();
    let ended: Vec<bool> = tallies.iter().flat_map(|t| t.ended.clone()).collect();
    let other: Vec<&String> = tallies.iter().flat_map(|t| &t.other_errors).collect();
    eprintln!(
        "write storm: {rounds} takeovers, grace {GRACE:?}: took p50 {:?}, p99 {:?}, max {:?}; failed {}; \
         writes accepted {accepted}, refused {refused}, timed out {timed_out}; storm sessions ended {} \
         (after an ok: {}); accepted after their takeover began: {:?}",
        p(0.5),
        p(0.99),
        p(1.0),
        failed.len(),
        ended.len(),
        ended.iter().filter(|ok| **ok).count(),
        slipped
    );
    assert!(failed.is_empty(), "takeovers failed: {failed:?}");
    assert!(
        slipped.is_empty(),
        "writes let in during a takeover: {slipped:?}"
    );
    assert!(
        ended.is_empty(),
        "storm writers' sessions were ended: {ended:?} (true: after an ok)"
    );
    assert!(other.is_empty(), "storm writers' errors: {other:?}");
    assert!(
        accepted > 0 && refused > 0 && timed_out > 0,
        "the storm did not reach every phase"
    );
    assert!(
        p(1.0) <= GRACE + Duration::from_secs(1),
        "the slowest takeover took {:?}, more than grace + 1 s",
        p(1.0)
    );
}

/// An answer that an unlocked read decides ('held') takes no lock: `BEGIN; SELECT pgfence.acquire(…)` left open
/// by anyone blocks neither the holder's renewal nor its writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_answered_held_and_left_open_blocks_nobody() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let mut lease = store.acquire("open", "leader", TTL).await.unwrap();

    let careless = session(&db, "careless").await;
    careless.batch_execute("BEGIN").await.unwrap();
    let outcome: String = careless
        .query_one(
            "SELECT outcome FROM pgfence.acquire('c/open', 'rival', 60000)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(outcome, "held");

    let renewed = tokio::time::timeout(Duration::from_secs(2), store.renew(&mut lease)).await;
    assert!(
        matches!(renewed, Ok(Ok(()))),
        "renewal behind an open 'held' answer: {renewed:?}"
    );
    let write = tokio::time::timeout(
        Duration::from_secs(2),
        store
            .tasks()
            .create(&lease.fence(), "k", &serde_json::json!({})),
    )
    .await;
    assert!(matches!(write, Ok(Ok(_))), "{write:?}");
    careless.batch_execute("ROLLBACK").await.unwrap();
}

/// Every lock wait is bounded and names who blocks: a takeover behind a transaction that keeps the lease row
/// locked fails with PF003 after grace + 5 s, naming the blocking backend's pid and application_name; a guard
/// behind a takeover left uncommitted fails the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_waits_are_bounded_and_name_the_blocker() {
    let db = TestDb::new().await;
    let owner = db.client().await;
    owner
        .query_one("SELECT pgfence.set_takeover_grace('0')", &[])
        .await
        .unwrap();
    let store = db.store("c").await;
    let lease = store.acquire("bounded", "leader", TTL).await.unwrap();
    let epoch = lease.epoch().get();

    // A renewal left uncommitted holds the lease row.
    let open_renewal = session(&db, "open-renewal").await;
    open_renewal.batch_execute("BEGIN").await.unwrap();
    let pid: i32 = open_renewal
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    open_renewal
        .query_one(
            "SELECT pgfence.renew('c/bounded', $1, $2, 60000)",
            &[&epoch, &lease.fence().secret().expose_secret()],
        )
        .await
        .unwrap();
    let started = Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(15),
        store.admin().force_release("bounded"),
    )
    .await
    .expect("the takeover's wait must be bounded")
    .unwrap_err();
    let waited = started.elapsed();
    assert_eq!(
        err.sqlstate(),
        Some(pgfence::sqlstate::SqlState::LockWaitEnded),
        "{err}"
    );
    let message = err.to_string();
    assert!(
        message.contains(&format!("pid {pid}")) && message.contains("'open-renewal'"),
        "the error must name the blocker: {message}"
    );
    assert!(
        waited >= Duration::from_secs(5) && waited < Duration::from_secs(8),
        "bounded by grace + 5 s, waited {waited:?}"
    );
    assert!(err.is_transient());
    open_renewal.batch_execute("ROLLBACK").await.unwrap();

    // A takeover left uncommitted holds the guard lock: a guard waits grace + 5 s and names it.
    let open_takeover = session(&db, "open-takeover").await;
    open_takeover.batch_execute("BEGIN").await.unwrap();
    open_takeover
        .query_one("SELECT pgfence.force_release('c/bounded')", &[])
        .await
        .unwrap();
    let started = Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(15),
        store
            .tasks()
            .create(&lease.fence(), "k", &serde_json::json!({})),
    )
    .await
    .expect("the guard's wait must be bounded")
    .unwrap_err();
    assert_eq!(
        err.sqlstate(),
        Some(pgfence::sqlstate::SqlState::LockWaitEnded),
        "{err}"
    );
    assert!(
        err.to_string().contains("'open-takeover'"),
        "the error must name the blocker: {err}"
    );
    assert!(started.elapsed() < Duration::from_secs(8));
    open_takeover.batch_execute("ROLLBACK").await.unwrap();
}

/// A direct UPDATE of a lease row by a role with table privileges serializes like a takeover (a trigger takes
/// the exclusive guard lock): it waits for the guarded transaction in flight, holds off a guard that starts
/// meanwhile (which is then refused), and can neither lower an epoch nor delete a lease row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_lease_update_serializes_against_guarded_writes() {
    let db = TestDb::new().await;
    app_table(&db).await;
    let store = db.store("c").await;
    let lease = store.acquire("direct", "leader", TTL).await.unwrap();
    let epoch = lease.epoch().get();

    let in_flight = session(&db, "in-flight").await;
    in_flight.batch_execute("BEGIN").await.unwrap();
    assert_eq!(
        fence_outcome(&in_flight, &lease.fence()).await.unwrap().0,
        "ok"
    );

    let bump = session(&db, "owner-bump").await;
    let bumped = tokio::spawn(async move {
        bump.batch_execute(
            "BEGIN; UPDATE pgfence.leases SET epoch = epoch + 1 WHERE name = 'c/direct'",
        )
        .await
        .unwrap();
        bump
    });
    wait_until_blocked_on_lock(&db, 1).await;
    assert!(!bumped.is_finished(), "the bump must wait for the guard");
    in_flight
        .execute("INSERT INTO app_writes (epoch) VALUES ($1)", &[&epoch])
        .await
        .unwrap();
    in_flight.batch_execute("COMMIT").await.unwrap();
    let bump = tokio::time::timeout(Duration::from_secs(10), bumped)
        .await
        .expect("the bump proceeds once the guard commits")
        .unwrap();

    // The bump is uncommitted: a guard of the old epoch waits for it, then is refused.
    let late = tokio::spawn({
        let store = store.clone();
        let fence = lease.fence();
        async move {
            store
                .tasks()
                .create(&fence, "late", &serde_json::json!({}))
                .await
        }
    });
    wait_until_blocked_on_lock(&db, 1).await;
    bump.batch_execute("COMMIT").await.unwrap();
    match late.await.unwrap() {
        Err(Error::Stale { reason, .. }) => assert_eq!(reason, LossReason::Superseded),
        other => panic!("expected a stale refusal, got {other:?}"),
    }
    assert_eq!(db.scalar("SELECT count(*) FROM app_writes").await, 1);

    let owner = db.client().await;
    for sql in [
        "UPDATE pgfence.leases SET epoch = epoch - 1 WHERE name = 'c/direct'",
        "DELETE FROM pgfence.leases WHERE name = 'c/direct'",
    ] {
        let err = owner.batch_execute(sql).await.unwrap_err();
        assert_eq!(sqlstate(&err), "PF005", "{sql}: {err}");
    }
}

/// Under REPEATABLE READ a guard's snapshot may predate a takeover: the guard refuses to decide (PF004, naming
/// READ COMMITTED) instead of refusing the current epoch or accepting an old one; the library's own calls run
/// their guards at READ COMMITTED whatever the session default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guards_refuse_to_decide_outside_read_committed() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let first = store.acquire("iso", "a", TTL).await.unwrap();

    let rr = session(&db, "rr").await;
    rr.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
        .await
        .unwrap();
    let second = common::fixture::take_over(&store, "iso", "b").await;
    for fence in [first.fence(), second.fence()] {
        let epoch = fence.epoch();
        let err = fence_outcome(&rr, &fence).await.unwrap_err();
        assert_eq!(sqlstate(&err), "PF004", "epoch {epoch}: {err}");
        assert!(err
            .as_db_error()
            .is_some_and(|e| e.message().contains("READ COMMITTED")));
        rr.batch_execute("ROLLBACK; BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
            .await
            .unwrap();
    }
    rr.batch_execute("ROLLBACK").await.unwrap();

    // A session default of REPEATABLE READ: the library's single statements and fenced transactions still decide.
    db.client()
        .await
        .batch_execute(&format!(
            "ALTER DATABASE {} SET default_transaction_isolation = 'repeatable read'",
            db.name
        ))
        .await
        .unwrap();
    let rr_store = db.store("c").await;
    rr_store
        .tasks()
        .create(&second.fence(), "ok", &serde_json::json!({}))
        .await
        .unwrap();
    match rr_store
        .tasks()
        .create(&first.fence(), "stale", &serde_json::json!({}))
        .await
    {
        Err(Error::Stale { reason, .. }) => assert_eq!(reason, LossReason::Superseded),
        other => panic!("expected a stale refusal, got {other:?}"),
    }
}

/// renew_many checks its input exactly as renew does (bad epochs and names raise 22023 and renew nothing), and
/// a tenure listed twice gets one consistent answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_many_validates_like_renew_and_answers_duplicates_consistently() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let lease = store.acquire("many", "h", TTL).await.unwrap();
    let epoch = lease.epoch().get();
    let client = db.client().await;
    for (leases, epochs) in [
        (vec!["c/many"], vec![Some(0_i64)]),
        (vec!["c/many"], vec![Some(-1)]),
        (vec!["c/many"], vec![None]),
        (vec!["x"], vec![Some(epoch)]),
        (vec!["/many"], vec![Some(epoch)]),
    ] {
        let secrets = vec![lease.fence().secret().expose_secret().to_owned()];
        let err = client
            .query(
                "SELECT * FROM pgfence.renew_many($1, $2, $3, 60000)",
                &[&leases, &epochs, &secrets],
            )
            .await
            .unwrap_err();
        assert_eq!(sqlstate(&err), "22023", "{leases:?} {epochs:?}: {err}");
        let renew = client
            .query_one(
                "SELECT pgfence.renew($1, $2, $3, 60000)",
                &[&leases[0], &epochs[0], &secrets[0]],
            )
            .await
            .unwrap_err();
        assert_eq!(sqlstate(&renew), "22023", "renew agrees: {renew}");
    }
    let rows = client
        .query(
            "SELECT outcome, reason FROM pgfence.renew_many(ARRAY['c/many', 'c/many'], \
             ARRAY[$1::bigint, $1::bigint], ARRAY[$2, $2], 60000)",
            &[&epoch, &lease.fence().secret().expose_secret()],
        )
        .await
        .unwrap();
    let answers: Vec<(String, Option<String>)> =
        rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        answers,
        vec![("renewed".to_owned(), None), ("renewed".to_owned(), None)]
    );
}

// ------------------------------------------------------------------------------------------------------------
// Measurement (ignored): takeover latency under busy writers, an idle holder, MultiXacts and throughput, for the
// guard as built (shared advisory guard lock) and for the previous row-lock guard (FOR KEY SHARE guards, FOR
// UPDATE takeovers), side by side in one run.

/// The previous protocol, for comparison only: guards lock the lease row FOR KEY SHARE, takeovers FOR UPDATE.
const ROW_LOCK_GUARD: &str = r#"
CREATE OR REPLACE FUNCTION pgfence._guard(p_lease text, p_epoch bigint, p_operation text, p_table text, p_key text)
RETURNS pgfence.write_result LANGUAGE plpgsql AS $$
DECLARE
    l   pgfence.leases;
    why text;
    tl  bigint := pgfence._timeline();
BEGIN
    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;
    why := pgfence._loss_reason(l, NULL, p_epoch, clock_timestamp(), tl);
    IF why IS NOT NULL THEN
        RETURN pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, why, p_operation, p_table, p_key, p_may_wait => true);
    END IF;
    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease FOR KEY SHARE;
    why := pgfence._loss_reason(l, NULL, p_epoch, clock_timestamp(), tl);
    IF why IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, why, p_operation, p_table, p_key);
END;
$$;
CREATE OR REPLACE FUNCTION pgfence._take_guard_lock(p_lease text, p_lock_key integer) RETURNS void
LANGUAGE plpgsql SET lock_timeout = '10s' AS $$
BEGIN
    PERFORM 1 FROM pgfence.leases WHERE name = p_lease FOR UPDATE;
END;
$$;
CREATE OR REPLACE FUNCTION pgfence._lease_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN NEW;
END;
$$;
"#;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Guard {
    Advisory,
    RowLock,
}

impl Guard {
    fn label(self) -> &'static str {
        match self {
            Guard::Advisory => "advisory guard lock (built)",
            Guard::RowLock => "row-lock guard (previous)",
        }
    }
}

async fn measured_db(guard: Guard) -> TestDb {
    let db = TestDb::new().await;
    app_table(&db).await;
    if guard == Guard::RowLock {
        db.client()
            .await
            .batch_execute(ROW_LOCK_GUARD)
            .await
            .unwrap();
    }
    db
}

/// One fenced transaction: an INSERT, then `hold_ms` inside the transaction (the work of a real controller).
async fn busy_write(store: &Store, fence: &Fence, hold_ms: i32) -> Result<(), Error> {
    let epoch = fence.epoch().get();
    store
        .fenced(fence, "busy", async move |conn| {
            use diesel::sql_types::{BigInt, Integer};
            use diesel_async::RunQueryDsl;
            diesel::sql_query(
                "INSERT INTO app_writes (epoch) SELECT $1 FROM pg_sleep($2 / 1000.0)",
            )
            .bind::<BigInt, _>(epoch)
            .bind::<Integer, _>(hold_ms)
            .execute(conn)
            .await?;
            Ok::<_, Error>(())
        })
        .await
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// Takeover latency (force_release, and acquire of an expired lease) with `writers` busy fenced writers on the
/// current leader, each transaction holding `hold_ms`. Returns (force_release latencies, acquire latencies).
async fn takeovers(
    guard: Guard,
    writers: usize,
    hold_ms: i32,
    rounds: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let db = measured_db(guard).await;
    let store = Store::connect(
        db.config("c")
            .pool_size(writers as u32 + 2)
            .checkout_timeout(Duration::from_secs(30)),
    )
    .await
    .unwrap();
    let taker = db.store("c").await;
    let (mut forced, mut acquired) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let expire = round % 2 == 1;
        let ttl = if expire {
            Duration::from_millis(400)
        } else {
            TTL
        };
        let lease = store.acquire("busy", "leader", ttl).await.unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let mut tasks = Vec::new();
        for _ in 0..writers {
            let (store, fence, stop) = (store.clone(), lease.fence(), stop.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.is_cancelled() {
                    if busy_write(&store, &fence, hold_ms).await.is_err() {
                        break;
                    }
                }
            }));
        }
        // Let every writer get going.
        tokio::time::sleep(Duration::from_millis(150)).await;
        if expire {
            // Wait for expiry by the database clock, then time the successor's acquisition.
            common::wait_until_expired(&db.client().await, "c/busy").await;
            let started = Instant::now();
            let next = taker.acquire("busy", "successor", TTL).await;
            acquired.push(started.elapsed());
            match next {
                Ok(next) => {
                    taker.release(&next).await.unwrap();
                }
                Err(e) => eprintln!("{}: acquire after expiry failed: {e}", guard.label()),
            }
        } else {
            let started = Instant::now();
            let ended = taker.admin().force_release("busy").await;
            forced.push(started.elapsed());
            if let Err(e) = ended {
                eprintln!("{}: force_release failed: {e}", guard.label());
            }
        }
        stop.cancel();
        for t in tasks {
            let _ = t.await;
        }
    }
    (forced, acquired)
}

/// Guarded-write throughput (fenced transactions without a hold, `writers` concurrent, `secs` long) and
/// MultiXacts created per guarded write.
async fn throughput(guard: Guard, writers: usize, secs: u64) -> (f64, f64) {
    let db = measured_db(guard).await;
    let store = Store::connect(db.config("c").pool_size(writers as u32 + 1))
        .await
        .unwrap();
    let lease = store.acquire("tp", "leader", TTL).await.unwrap();
    let client = db.client().await;
    let next_multixact = |client: tokio_postgres::Client| async move {
        client.batch_execute("CHECKPOINT").await.unwrap();
        let row = client
            .query_one(
                "SELECT next_multixact_id::text::bigint FROM pg_control_checkpoint()",
                &[],
            )
            .await
            .unwrap();
        (client, row.get::<_, i64>(0))
    };
    let (client, mx_before) = next_multixact(client).await;
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..writers {
        let (store, fence) = (store.clone(), lease.fence());
        tasks.push(tokio::spawn(async move {
            let mut n = 0_u64;
            while Instant::now() < deadline {
                busy_write(&store, &fence, 0).await.unwrap();
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    let (_, mx_after) = next_multixact(client).await;
    (
        total as f64 / secs as f64,
        (mx_after - mx_before) as f64 / total as f64,
    )
}

/// The README's takeover table. It prints the figures, and asserts only a loose bound for the guard as built
/// (p99 within twice the in-flight transaction's hold + 20 ms: on 2 cores the longest transaction in flight runs
/// longer than its nominal hold).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (minutes): cargo test --release --test suite takeover:: -- --ignored --nocapture"]
async fn measure_takeover_latency() {
    const HOLD_MS: i32 = 20;
    const ROUNDS: usize = 40;
    println!("Takeover latency with busy writers (fenced transactions holding {HOLD_MS} ms), {ROUNDS} takeovers each:");
    println!(
        "| guard | writers | force_release p50 | p99 | acquire after expiry p50 | p99 |\n|---|---|---|---|---|---|"
    );
    for writers in [6, 64] {
        for guard in [Guard::Advisory, Guard::RowLock] {
            let (mut forced, mut acquired) = takeovers(guard, writers, HOLD_MS, ROUNDS).await;
            forced.sort();
            acquired.sort();
            println!(
                "| {} | {writers} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms |",
                guard.label(),
                percentile(&forced, 0.5).as_secs_f64() * 1e3,
                percentile(&forced, 0.99).as_secs_f64() * 1e3,
                percentile(&acquired, 0.5).as_secs_f64() * 1e3,
                percentile(&acquired, 0.99).as_secs_f64() * 1e3,
            );
            if guard == Guard::Advisory {
                let bound = Duration::from_millis(HOLD_MS as u64 + 20);
                assert!(percentile(&forced, 0.99) <= bound * 2, "force_release p99");
            }
        }
    }
}

/// The README's throughput and MultiXact figures: the guard as built against the previous row-lock guard,
/// interleaved rounds, medians of paired ratios. Asserts 0 MultiXacts per guarded write for the guard as built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (about a minute): cargo test --release --test suite takeover:: -- --ignored --nocapture"]
async fn measure_guard_throughput_and_multixacts() {
    println!("Guarded-write throughput (fenced transaction: guard + INSERT + COMMIT), 3 interleaved rounds of 3 s, medians:");
    println!("| writers | advisory (built) tx/s | row lock (previous) tx/s | ratio | MultiXacts/write advisory | row lock |\n|---|---|---|---|---|---|");
    for writers in [1, 8, 32] {
        let (mut a, mut r, mut am, mut rm) = (vec![], vec![], vec![], vec![]);
        for _ in 0..3 {
            let (tp, mx) = throughput(Guard::Advisory, writers, 3).await;
            a.push(tp);
            am.push(mx);
            let (tp, mx) = throughput(Guard::RowLock, writers, 3).await;
            r.push(tp);
            rm.push(mx);
        }
        let mut ratios: Vec<f64> = a.iter().zip(&r).map(|(a, r)| a / r).collect();
        println!(
            "| {writers} | {:.0} | {:.0} | {:.2} | {:.3} | {:.3} |",
            median(&mut a),
            median(&mut r),
            median(&mut ratios),
            median(&mut am),
            median(&mut rm)
        );
        assert!(median(&mut am) < 0.001, "MultiXacts per guarded write");
    }
}

/// Every lock wait is bounded and names who blocks, also for pgfence's own DDL: switching enforcement while a
/// transaction holds a pgfence table fails with PF003 after grace + 5 s, naming that backend, instead of waiting
/// for it without bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_enforcement_waits_a_bounded_time_for_table_locks() {
    let db = TestDb::new().await;
    let owner = db.client().await;
    owner
        .query_one("SELECT pgfence.set_takeover_grace('0')", &[])
        .await
        .unwrap();
    let holder = session(&db, "table-holder").await;
    holder
        .batch_execute("BEGIN; LOCK TABLE pgfence.tasks IN ROW EXCLUSIVE MODE")
        .await
        .unwrap();
    let pid: i32 = holder
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let started = Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(15),
        owner.query_one("SELECT pgfence.set_enforcement(true)", &[]),
    )
    .await
    .expect("the wait must be bounded")
    .unwrap_err();
    assert_eq!(sqlstate(&err), "PF003", "{err}");
    let message = err.as_db_error().unwrap().message().to_owned();
    assert!(message.contains(&format!("pid {pid}")), "{message}");
    assert!(
        started.elapsed() >= Duration::from_secs(5) && started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    holder.batch_execute("ROLLBACK").await.unwrap();
    owner
        .query_one("SELECT pgfence.set_enforcement(true)", &[])
        .await
        .unwrap();
}
