//! The lease protocol against real PostgreSQL: compare-and-set acquisition, renewal, release, force-release,
//! expiry by the database clock, cluster qualification and input validation.
//!
//! Invariants checked (numbers as in the README's invariant map): 1 (epochs strictly increase), 2 (one holder
//! per epoch), 5 (expiry by the database clock; the local deadline is never later than the database's expiry,
//! measured from the database side).

use crate::common;

use std::time::Duration;

use common::{database_expiry, RowLock, TestDb};
use pgfence::{Epoch, Error, ForceReleased, LeaseState, LossReason, Released};

const TTL: Duration = Duration::from_secs(30);

/// Polls the database until it reports the lease expired; expiry is a time-based fact, so the test waits on
/// the database's own verdict rather than on a local sleep of a guessed length.
async fn wait_expired(store: &pgfence::Store, name: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let status = store
            .lease_status(name)
            .await
            .unwrap()
            .expect("lease exists");
        if status.state != LeaseState::Held {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "lease never expired");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs `statement` (an acquisition or renewal of `qualified`) while the test holds the lease row, and lets it
/// through after it has waited: the database runs it — and reads the clock its expiry is computed from — at
/// least `DELAY` after it was sent.
async fn delayed_by_row_lock<T: Send + 'static>(
    db: &TestDb,
    qualified: &str,
    statement: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    const DELAY: Duration = Duration::from_millis(100);
    let lock = RowLock::take(db, qualified).await;
    let statement = tokio::spawn(statement);
    common::wait_until_blocked_on_lock(db, 1).await;
    tokio::time::sleep(DELAY).await;
    lock.release().await;
    statement.await.unwrap()
}

/// Invariant 1 and 2: the first acquisition issues epoch 1; a second holder is refused with the current
/// holder, epoch and remaining time as computed by the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_issues_epoch_one_then_refuses_other_holders() {
    let db = TestDb::new().await;
    let store = db.store("c1").await;
    let lease = store.acquire("scheduler", "pod-a", TTL).await.unwrap();
    assert_eq!(lease.epoch(), Epoch::new(1).unwrap());
    assert_eq!(lease.qualified_name(), "c1/scheduler");
    assert_eq!((lease.name(), lease.holder()), ("scheduler", "pod-a"));
    assert!(lease.remaining() <= TTL && lease.remaining() > TTL - Duration::from_secs(5));

    match store.acquire("scheduler", "pod-b", TTL).await {
        Err(Error::Held {
            lease,
            holder,
            epoch,
            expires_in,
        }) => {
            assert_eq!(lease, "c1/scheduler");
            assert_eq!(holder, "pod-a");
            assert_eq!(epoch.get(), 1);
            assert!(
                expires_in <= TTL && expires_in > TTL - Duration::from_secs(5),
                "{expires_in:?}"
            );
        }
        other => panic!("expected Held, got {other:?}"),
    }
    let status = store.lease_status("scheduler").await.unwrap().unwrap();
    assert_eq!(status.state, LeaseState::Held);
    assert_eq!(status.holder.as_deref(), Some("pod-a"));
    assert_eq!(status.transitions, 1);
    let left = status.expires_in.expect("a held lease's time left");
    assert!(
        left <= TTL && left > TTL - Duration::from_secs(5),
        "{left:?}"
    );
    // The operator's view lists the same lease.
    let all = store.admin().all_leases().await.unwrap();
    assert_eq!(
        all.iter()
            .map(|s| (s.name.as_str(), s.state))
            .collect::<Vec<_>>(),
        [("c1/scheduler", LeaseState::Held)]
    );
    // A lease nobody holds has no time left, not a stale one.
    store.release(&lease).await.unwrap();
    let status = store.lease_status("scheduler").await.unwrap().unwrap();
    assert_eq!(
        (status.state, status.expires_in),
        (LeaseState::Released, None)
    );
}

/// Release frees the lease at once for a successor (epoch + 1); releasing again, or releasing the old epoch
/// after the successor took over, is a no-op that never touches the successor's tenure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_is_immediate_idempotent_and_never_frees_a_successor() {
    let db = TestDb::new().await;
    let store = db.store("c1").await;
    let a = store.acquire("rollout", "pod-a", TTL).await.unwrap();
    assert_eq!(store.release(&a).await.unwrap(), Released::Released);
    assert_eq!(
        store.release(&a).await.unwrap(),
        Released::NotHeld(LossReason::Released)
    );

    let b = store.acquire("rollout", "pod-b", TTL).await.unwrap();
    assert_eq!(b.epoch().get(), 2);
    assert_eq!(
        store.release(&a).await.unwrap(),
        Released::NotHeld(LossReason::Superseded)
    );
    let status = store.lease_status("rollout").await.unwrap().unwrap();
    assert_eq!(status.state, LeaseState::Held);
    assert_eq!(status.holder.as_deref(), Some("pod-b"));
    assert_eq!(status.epoch, Some(b.epoch()));

    let tenures = store.history().tenures("rollout").await.unwrap();
    assert_eq!(tenures.len(), 2);
    assert_eq!(tenures[0].end_reason.as_deref(), Some("released"));
    assert!(tenures[1].ended_at.is_none());
}

/// Invariant 5: expiry is decided by the database clock; after it, renewal reports the loss as `Expired`, any
/// other holder can acquire (epoch + 1), and the expired tenure is recorded as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lease_can_be_taken_over_and_its_renewal_is_lost() {
    let db = TestDb::new().await;
    let store = db.store("c1").await;
    let mut a = store
        .acquire("gc", "pod-a", Duration::from_millis(300))
        .await
        .unwrap();
    wait_expired(&store, "gc").await;
    match store.renew(&mut a).await {
        Err(Error::Lost { reason, epoch, .. }) => {
            assert_eq!(reason, LossReason::Expired);
            assert_eq!(epoch.get(), 1);
        }
        other => panic!("expected Lost(expired), got {other:?}"),
    }
    let b = store.acquire("gc", "pod-b", TTL).await.unwrap();
    assert_eq!(b.epoch().get(), 2);
    let mut a_again = a.clone();
    match store.renew(&mut a_again).await {
        Err(Error::Lost {
            reason, current, ..
        }) => {
            assert_eq!(reason, LossReason::Superseded);
            assert_eq!(current, Some(b.epoch()));
        }
        other => panic!("expected Lost(superseded), got {other:?}"),
    }
    let tenures = store.history().tenures("gc").await.unwrap();
    assert_eq!(tenures[0].end_reason.as_deref(), Some("expired"));
}

/// Invariant 5 for a renewal: it extends a live tenure in the database (its expiry moves later, by the database
/// clock) and moves the local deadline to (send time + ttl), which is never later than the database's new expiry.
/// The renewal is held up by a row lock between its send and the moment the database runs it, so a deadline
/// computed from the *receive* time (later than the database's clock read) lands after the database's expiry and
/// fails the check; the send time lands at least that delay before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_extends_a_live_tenure() {
    let db = TestDb::new().await;
    let store = db.store("c1").await;
    let ttl = Duration::from_secs(2);
    let mut lease = store.acquire("gc", "pod-a", ttl).await.unwrap();
    let acquired = database_expiry(&db.client().await, "c1/gc").await;
    let deadline_before = lease.local_deadline();
    let renewed_before = store.lease_status("gc").await.unwrap().unwrap().renewed_at;
    let lease = delayed_by_row_lock(&db, "c1/gc", {
        let store = store.clone();
        async move {
            store.renew(&mut lease).await.unwrap();
            lease
        }
    })
    .await;
    let renewed = database_expiry(&db.client().await, "c1/gc").await;
    assert!(
        renewed.not_before > acquired.not_after,
        "the database's expiry did not move later: {acquired:?} → {renewed:?}"
    );
    assert!(lease.local_deadline() > deadline_before);
    assert!(
        lease.local_deadline() <= renewed.not_before,
        "the local deadline is {:?} past the database's expiry",
        lease.local_deadline() - renewed.not_before
    );
    let status = store.lease_status("gc").await.unwrap().unwrap();
    assert_eq!(status.state, LeaseState::Held);
    assert!(status.renewed_at > renewed_before);
}

/// Invariant 5 for an acquisition: its local deadline (send time + ttl) is never later than the expiry the
/// database granted, with the acquisition held up by a row lock between its send and the database's clock read,
/// as for renewals (a deadline from the receive time fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisitions_local_deadline_is_never_later_than_the_database_expiry() {
    let db = TestDb::new().await;
    let store = db.store("c1").await;
    let ttl = Duration::from_secs(2);
    // A released lease row to lock.
    let first = store.acquire("gc", "pod-a", ttl).await.unwrap();
    store.release(&first).await.unwrap();
    let lease = delayed_by_row_lock(&db, "c1/gc", {
        let store = store.clone();
        async move { store.acquire("gc", "pod-b", ttl).await.unwrap() }
    })
    .await;
    assert_eq!(lease.epoch().get(), 2);
    let expiry = database_expiry(&db.client().await, "c1/gc").await;
    assert!(
        lease.local_deadline() <= expiry.not_before,
        "the local deadline is {:?} past the database's expiry",
        lease.local_deadline() - expiry.not_before
    );
}

/// Invariant 1 and 2: the same holder acquiring again gets a new epoch, which fences its earlier tenure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reacquire_by_the_same_holder_issues_a_new_epoch() {
    let db = TestDb::new().await;
    let store = db.store("c1").await;
    let first = store.acquire("sched", "pod-a", TTL).await.unwrap();
    let second = store.acquire("sched", "pod-a", TTL).await.unwrap();
    assert_eq!(second.epoch().get(), first.epoch().get() + 1);
    let tenures = store.history().tenures("sched").await.unwrap();
    assert_eq!(tenures[0].end_reason.as_deref(), Some("reacquired"));
    let status = store.lease_status("sched").await.unwrap().unwrap();
    assert_eq!(status.transitions, 1, "same holder: no transition");
    let mut stale = first.clone();
    assert!(matches!(
        store.renew(&mut stale).await,
        Err(Error::Lost {
            reason: LossReason::Superseded,
            ..
        })
    ));
}

/// Force-release ends the current tenure (recorded as `forced`); the next acquisition issues epoch + 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_ends_the_tenure_and_keeps_the_epoch_counting() {
    let db = TestDb::new().await;
    let store = db.store("c1").await;
    assert_eq!(
        store.admin().force_release("nobody").await.unwrap(),
        ForceReleased::Unknown
    );
    let a = store.acquire("sched", "pod-a", TTL).await.unwrap();
    assert_eq!(
        store.admin().force_release("sched").await.unwrap(),
        ForceReleased::Ended {
            epoch: a.epoch(),
            holder: "pod-a".into()
        }
    );
    assert_eq!(
        store.admin().force_release("sched").await.unwrap(),
        ForceReleased::NotHeld
    );
    let b = store.acquire("sched", "pod-b", TTL).await.unwrap();
    assert_eq!(b.epoch().get(), 2);
    assert_eq!(
        store.history().tenures("sched").await.unwrap()[0]
            .end_reason
            .as_deref(),
        Some("forced")
    );
}

/// Invariant 1: across release, expiry, force-release and re-acquisition, every acquisition issues exactly
/// the previous epoch + 1, and nothing resets the counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epochs_strictly_increase_through_every_kind_of_handover() {
    let db = TestDb::new().await;
    let store = db.store("c1").await;
    let mut last = 0;
    for round in 0..20 {
        let holder = format!("pod-{}", round % 3);
        let ttl = if round % 4 == 1 {
            Duration::from_millis(150)
        } else {
            TTL
        };
        let lease = store.acquire("sched", &holder, ttl).await.unwrap();
        assert_eq!(lease.epoch().get(), last + 1, "round {round}");
        last = lease.epoch().get();
        match round % 4 {
            0 => assert_eq!(store.release(&lease).await.unwrap(), Released::Released),
            1 => wait_expired(&store, "sched").await,
            2 => {
                store.admin().force_release("sched").await.unwrap();
            }
            _ => {} // the next round's holder differs or re-acquires: either way epoch + 1 once it is free
        }
        if round % 4 == 3 {
            store.admin().force_release("sched").await.unwrap();
        }
    }
    assert_eq!(store.history().tenures("sched").await.unwrap().len(), 20);
}

/// Two clusters sharing one database never contend: the same lease name is independent per cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_sharing_a_database_never_contend() {
    let db = TestDb::new().await;
    let eu = db.store("prod-eu").await;
    let us = db.store("prod-us").await;
    let a = eu.acquire("scheduler", "pod-a", TTL).await.unwrap();
    let b = us.acquire("scheduler", "pod-b", TTL).await.unwrap();
    assert_eq!(a.epoch().get(), 1);
    assert_eq!(b.epoch().get(), 1);
    assert_eq!(eu.admin().leases().await.unwrap().len(), 1);
    assert_eq!(
        us.admin().leases().await.unwrap()[0].holder.as_deref(),
        Some("pod-b")
    );
}

/// Concurrent acquisitions of one free lease: exactly one wins per round, and the winners' epochs are
/// consecutive (at most one holder per epoch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquisitions_have_exactly_one_winner() {
    let db = TestDb::new().await;
    let store = db.store("c1").await;
    for round in 1..=50_i64 {
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(4));
        let mut handles = Vec::new();
        for contender in 0..4 {
            let store = store.clone();
            let barrier = barrier.clone();
            handles.push(tokio::spawn(async move {
                barrier.wait().await;
                store.acquire("hot", &format!("pod-{contender}"), TTL).await
            }));
        }
        let mut winners = Vec::new();
        for handle in handles {
            match handle.await.unwrap() {
                Ok(lease) => winners.push(lease),
                Err(Error::Held { .. }) => {}
                Err(other) => panic!("unexpected {other}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}");
        assert_eq!(winners[0].epoch().get(), round);
        store.release(&winners[0]).await.unwrap();
    }
}

/// Lease names, holders and clusters containing quotes and SQL are plain data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotes_and_sql_in_names_are_plain_data() {
    let db = TestDb::new().await;
    let store = db.store("it's").await;
    let name = "x'); DROP TABLE pgfence.leases; --";
    let holder = "pod \"a\" '; SELECT 1; --";
    let lease = store.acquire(name, holder, TTL).await.unwrap();
    let status = store.lease_status(name).await.unwrap().unwrap();
    assert_eq!(status.name, format!("it's/{name}"));
    assert_eq!(status.holder.as_deref(), Some(holder));
    assert_eq!(lease.epoch().get(), 1);
}

/// Bad input is a typed error before anything touches the database: nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_writes_nothing() {
    let db = TestDb::new().await;
    let store = db.store("c1").await;
    let long = "x".repeat(pgfence::limits::MAX_NAME_LEN + 1);
    let cases: Vec<(&str, &str, Duration)> = vec![
        ("", "pod", TTL),
        (&long, "pod", TTL),
        ("nul\0name", "pod", TTL),
        ("name", "", TTL),
        ("name", "pod\0", TTL),
        ("name", "pod", Duration::ZERO),
        ("name", "pod", Duration::from_millis(99)),
        ("name", "pod", Duration::from_secs(24 * 3600 + 1)),
    ];
    for (name, holder, ttl) in cases {
        match store.acquire(name, holder, ttl).await {
            Err(Error::InvalidInput { .. }) => {}
            other => panic!("{name:?}/{holder:?}/{ttl:?}: expected InvalidInput, got {other:?}"),
        }
    }
    assert!(matches!(Epoch::new(0), Err(Error::InvalidInput { .. })));
    assert!(matches!(Epoch::new(-5), Err(Error::InvalidInput { .. })));
    assert!(matches!(
        pgfence::Store::connect(pgfence::StoreConfig::new(db.url.clone(), "a/b")).await,
        Err(Error::InvalidInput {
            field: "cluster",
            ..
        })
    ));
    assert!(matches!(
        pgfence::Fence::new(
            "no-cluster",
            Epoch::new(1).unwrap(),
            common::forged_secret()
        ),
        Err(Error::InvalidInput { .. })
    ));
    assert_eq!(db.scalar("SELECT count(*) FROM pgfence.leases").await, 0);
    assert_eq!(db.scalar("SELECT count(*) FROM pgfence.tenures").await, 0);
}
