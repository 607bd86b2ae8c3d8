//! The fault matrix: handover under orderly release, a cancelled controller, a holder killed with SIGKILL,
//! dropped connections, a database restart, a network partition, a wrong database, a failover to an
//! asynchronous standby that lost the last transactions, uncertain completion, and a failover under a running
//! leader. Real processes where a process dies, real PostgreSQL servers (one per scenario that breaks its
//! server), a TCP proxy on loopback for partitions and redirects.
//!
//! Invariants checked: 1 (epochs increase, also across failover), 2 (one holder per epoch), 3 (no stale write
//! commits), 4 (refusals audited), 5 (the holder gives up by its own clock before the database can grant a
//! successor), 6 (acknowledged writes survive; a retry by key has one effect), 7 (after a promotion no tenure
//! current before it can write or renew).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::proxy::{Proxy, HOLD_ALL, HOLD_REPLIES, PASS};
use common::TestDb;
use pgfence::embedded::EmbeddedServer;
use pgfence::leader::{
    run_with_leadership, Elector, Ended, LeadershipOptions, LeaseOptions, LossCause, PgElector,
};
use pgfence::{
    Epoch, Error, ExpectedIdentity, Fence, LossReason, RejectionFilter, Store, StoreConfig,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const CHILD_ENV: &str = "PGFENCE_FAULTS_CHILD_URL";

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

async fn server() -> EmbeddedServer {
    tokio::task::spawn_blocking(EmbeddedServer::start)
        .await
        .unwrap()
        .unwrap()
}

async fn migrated_store(url: &str, app: &str) -> Store {
    let store = Store::connect(
        StoreConfig::new(url, "f")
            .application_name(app)
            .connect_timeout(Duration::from_millis(500))
            .checkout_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    store.migrate().await.unwrap();
    store
}

fn options(ttl_ms: u64) -> LeaseOptions {
    let mut options = LeaseOptions::new(Duration::from_millis(ttl_ms));
    options.renew_every = Some(Duration::from_millis(ttl_ms / 5));
    options
}

/// The first epoch issued on WAL timeline 2, the one a first promotion starts: (2 − 1) · 2^32 + 1.
const FIRST_EPOCH_OF_TIMELINE_2: i64 = (1 << 32) + 1;

/// Waits until the boolean `sql` is true on `standby` (an error, such as a table not replayed yet, counts as false),
/// polling: replay is not announced.
async fn wait_for_replay(standby: &EmbeddedServer, sql: &str, what: &str) {
    let (client, connection) = tokio_postgres::connect(&standby.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !client
        .query_one(sql, &[])
        .await
        .map(|r| r.get::<_, bool>(0))
        .unwrap_or(false)
    {
        assert!(
            Instant::now() < deadline,
            "the standby did not replay {what} within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Acquires `name` as `holder`, retrying while another tenure is live; returns the lease and when it was got.
async fn take_over(
    elector: &PgElector,
    name: &str,
    holder: &str,
    options: &LeaseOptions,
) -> (pgfence::leader::HeldLease, Instant) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut wakeups = elector.wakeups();
        match elector.acquire(name, holder, options).await {
            Ok(lease) => return (lease, Instant::now()),
            Err(Error::Held { expires_in, .. }) => {
                wakeups
                    .wait(
                        &elector.qualify(name),
                        expires_in.min(Duration::from_millis(50)),
                    )
                    .await
            }
            Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("{e}"),
        }
        assert!(Instant::now() < deadline, "no takeover within 30 s");
    }
}

// ------------------------------------------------------------------------------------------------------------

/// Scenario 1, orderly release: the successor acquires promptly (woken by NOTIFY); the old epoch's later writes
/// are refused and audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orderly_release_hands_over_promptly_and_fences_the_old_epoch() {
    let db = TestDb::new().await;
    let store = db.store("f").await;
    let elector = PgElector::new(store.clone());
    let options = options(10_000);
    let old = elector.acquire("l", "a", &options).await.unwrap();
    let fence = old.fence();
    store.create_task(&fence, "job", &json!({})).await.unwrap();
    let waiting = {
        let elector = elector.clone();
        tokio::spawn(async move { take_over(&elector, "l", "b", &options).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released_at = Instant::now();
    old.release().await.unwrap();
    let (new, acquired_at) = waiting.await.unwrap();
    eprintln!(
        "orderly release: successor acquired {:?} after the release",
        acquired_at - released_at
    );
    assert_eq!(new.epoch().get(), fence.epoch().get() + 1);
    assert!(
        acquired_at - released_at < Duration::from_secs(1),
        "{:?}",
        acquired_at - released_at
    );
    assert!(matches!(
        store.append_event(&fence, "job", "late", &json!({})).await,
        Err(Error::Stale { .. })
    ));
    assert_eq!(
        store
            .rejections(&RejectionFilter::default())
            .await
            .unwrap()
            .len(),
        1
    );
}

/// Scenario 3, a holder killed with SIGKILL (a real child process): the successor acquires only after the ttl,
/// and any write carrying the dead holder's epoch is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_with_sigkill_is_succeeded_after_the_ttl() {
    let db = TestDb::new().await;
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "child_holds_a_lease_until_killed",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &db.url)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut epoch = None;
    while let Some(line) = lines.next_line().await.unwrap() {
        if let Some(rest) = line.split("HOLDING EPOCH ").nth(1) {
            epoch = rest.trim().parse::<i64>().ok();
            break;
        }
    }
    let epoch = Epoch::new(epoch.expect("the child acquired")).unwrap();
    let status = std::process::Command::new("kill")
        .args(["-KILL", &child.id().unwrap().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let killed_at = Instant::now();
    child.wait().await.unwrap();

    let store = db.store("f").await;
    let elector = PgElector::new(store.clone());
    let (lease, acquired_at) = take_over(&elector, "l", "successor", &options(2_000)).await;
    let waited = acquired_at - killed_at;
    eprintln!("SIGKILLed holder succeeded after {waited:?} (ttl 2 s)");
    assert!(lease.epoch() > epoch);
    assert!(
        waited < Duration::from_secs(2) + Duration::from_millis(1500),
        "{waited:?}"
    );
    let dead = Fence::new("f/l", epoch).unwrap();
    assert!(matches!(
        store.create_task(&dead, "ghost", &json!({})).await,
        Err(Error::Stale { .. })
    ));
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.tasks WHERE key = 'ghost'")
            .await,
        0
    );
}

/// The child process of the SIGKILL scenario: acquires with a 2 s ttl, renews, writes until it is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_holds_a_lease_until_killed() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let store = Store::connect(StoreConfig::new(url, "f").application_name("doomed"))
        .await
        .unwrap();
    let elector = PgElector::new(store.clone());
    let lease = elector
        .acquire("l", "doomed", &options(2_000))
        .await
        .unwrap();
    println!("HOLDING EPOCH {}", lease.epoch());
    let mut n = 0;
    loop {
        let _ = store
            .create_task(&lease.fence(), &format!("child-{n}"), &json!({}))
            .await;
        n += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Scenario 4, dropped connections: the holder's backends are terminated again and again. It recovers (renewals
/// resume on new connections) or declares the loss by its own clock before the database could grant a
/// successor — never two holders trusting one lease at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_backends_never_leave_two_holders() {
    let db = TestDb::new().await;
    let holder_store = Store::connect(db.config("f").application_name("victim"))
        .await
        .unwrap();
    let holder = PgElector::new(holder_store);
    let rival = PgElector::new(db.store("f").await);
    let options = options(1_000);
    let lease = holder.acquire("l", "victim", &options).await.unwrap();
    let loss = lease.lost();
    let lost_at = tokio::spawn(async move { loss.await.map(|cause| (cause, Instant::now())) });
    let rival_task = {
        let rival = rival.clone();
        tokio::spawn(async move { take_over(&rival, "l", "rival", &options).await })
    };
    let killer = db.client().await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) && lease.is_held() {
        killer
            .batch_execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'victim'")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    if lease.is_held() {
        eprintln!(
            "the holder kept its lease through 3 s of terminated backends (renewals resumed)"
        );
        // The release itself may meet the last terminated connection; then the lease expires after its ttl.
        if let Err(e) = lease.release().await {
            assert!(e.is_transient(), "{e}");
        }
        let (next, _) = rival_task.await.unwrap();
        assert!(next.epoch().get() > 1);
        return;
    }
    let (next, acquired_at) = rival_task.await.unwrap();
    let (cause, lost_at) = lost_at.await.unwrap().expect("a loss, not a release");
    eprintln!(
        "the holder gave up ({cause}) {:?} before the rival acquired",
        acquired_at - lost_at
    );
    assert!(
        lost_at.min(lease.trust_until()) <= acquired_at,
        "the rival acquired before the holder gave up"
    );
    assert_eq!(next.epoch().get(), 2);
}

/// Scenario 5, a database restart (immediate stop, crash recovery) under a stream of guarded writes: no
/// acknowledged write is lost, no stale write is accepted afterwards, and epochs continue upward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_loses_no_acknowledged_write() {
    let server = server().await;
    let store = migrated_store(&server.url(), "writer").await;
    let lease = store
        .acquire("l", "a", Duration::from_secs(60))
        .await
        .unwrap();
    let fence = lease.fence();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (store, fence, stop) = (store.clone(), fence.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut acked, mut failed) = (Vec::new(), 0);
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let key = format!("k{n}");
                match store.create_task(&fence, &key, &json!({})).await {
                    Ok(_) => acked.push(key),
                    Err(e) if e.is_transient() => failed += 1,
                    Err(e) => panic!("{e}"),
                }
                n += 1;
            }
            (acked, failed)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    blocking(|| server.crash()).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    blocking(|| server.start_again()).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    let (acked, failed) = writer.await.unwrap();
    eprintln!(
        "{} writes acknowledged across the restart, {failed} failed transiently",
        acked.len()
    );
    assert!(!acked.is_empty());
    let reader = migrated_store(&server.url(), "reader").await;
    for key in &acked {
        assert!(
            reader.task("l", key).await.unwrap().is_some(),
            "acknowledged {key} was lost"
        );
    }
    let next = reader
        .acquire("l", "a", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(next.epoch().get(), fence.epoch().get() + 1);
    assert!(matches!(
        reader.create_task(&fence, "late", &json!({})).await,
        Err(Error::Stale { .. })
    ));
}

/// Scenario 6, a network partition between holder and database (a proxy holding all traffic): the holder
/// declares the loss on its own clock before the database expires the lease; the successor takes over; when the
/// partition heals, the old holder's writes — including one sent before the cut and held in flight — are refused
/// and audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_gives_up_first_and_its_late_writes_are_refused() {
    let db = TestDb::new().await;
    let proxy = Proxy::start(db.port()).await;
    let holder_store = Store::connect(
        StoreConfig::new(proxy.url(&db.name), "f")
            .application_name("partitioned")
            .connect_timeout(Duration::from_millis(300))
            .checkout_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let holder = PgElector::new(holder_store.clone());
    let direct = db.store("f").await;
    let rival = PgElector::new(direct.clone());
    let options = options(1_500);
    let lease = holder.acquire("l", "partitioned", &options).await.unwrap();
    let fence = lease.fence();
    holder_store
        .create_task(&fence, "job", &json!({}))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await; // a renewal or two

    proxy.set(HOLD_ALL);
    let cut_at = Instant::now();
    let in_flight = {
        let (store, fence) = (holder_store.clone(), fence.clone());
        tokio::spawn(async move {
            store
                .append_event(&fence, "job", "sent-before-the-cut", &json!({}))
                .await
        })
    };
    let cause = lease.lost().await.unwrap();
    let gave_up_at = Instant::now();
    assert!(
        matches!(cause, LossCause::DeadlineExceeded { .. }),
        "{cause:?}"
    );
    let (new, acquired_at) = take_over(&rival, "l", "rival", &options).await;
    eprintln!(
        "partition: holder gave up {:?} after the cut, the successor acquired {:?} after the cut (ttl 1.5 s)",
        gave_up_at - cut_at,
        acquired_at - cut_at
    );
    assert!(
        gave_up_at.min(lease.trust_until()) < acquired_at,
        "the holder trusted its lease after the successor got it"
    );
    assert_eq!(new.epoch().get(), fence.epoch().get() + 1);

    proxy.set(PASS);
    let late = in_flight.await.unwrap();
    assert!(matches!(late, Err(Error::Stale { .. })), "{late:?}");
    let after_heal = holder_store
        .create_task(&fence, "after-heal", &json!({}))
        .await;
    assert!(
        matches!(after_heal, Err(Error::Stale { .. })),
        "{after_heal:?}"
    );
    let audit = direct
        .rejections(&RejectionFilter::default())
        .await
        .unwrap();
    let ops: Vec<&str> = audit.iter().map(|r| r.operation.as_str()).collect();
    assert!(
        ops.contains(&"append_event") && ops.contains(&"create_task"),
        "{ops:?}"
    );
    assert!(audit
        .iter()
        .all(|r| r.application_name.as_deref() == Some("partitioned")));
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.task_events WHERE kind = 'sent-before-the-cut'")
            .await,
        0
    );
}

/// Scenario 7, a wrong database: a process configured for one database's identity refuses another at connect,
/// and when its connections are redirected mid-life (DNS, a proxy), new connections are refused, so it writes
/// nothing there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_pointed_at_another_database_refuses_to_write() {
    let (a, b) = (server().await, server().await);
    let store_a = migrated_store(&a.url(), "setup").await;
    let store_b = migrated_store(&b.url(), "setup").await;
    let identity_a = store_a.identity().await.unwrap();
    let expected = ExpectedIdentity {
        system_identifier: identity_a.system_identifier.clone(),
        instance_id: identity_a.instance_id.clone(),
        database: None,
    };
    let refused = Store::connect(StoreConfig::new(b.url(), "f").expect(expected.clone())).await;
    assert!(
        matches!(refused, Err(Error::WrongDatabase { .. })),
        "{refused:?}"
    );

    let proxy = Proxy::start(a.port()).await;
    let store = Store::connect(
        StoreConfig::new(proxy.url("postgres"), "f")
            .expect(expected)
            .pool_size(1)
            .checkout_timeout(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let lease = store
        .acquire("l", "p", Duration::from_secs(60))
        .await
        .unwrap();
    proxy.redirect(b.port());
    let mut refused_writes = 0;
    for i in 0..5 {
        match store
            .create_task(&lease.fence(), &format!("k{i}"), &json!({}))
            .await
        {
            Ok(_) => panic!("wrote to the wrong database"),
            Err(e) => {
                refused_writes += 1;
                let text = e.to_string();
                assert!(
                    e.is_transient() || text.contains("wrong database"),
                    "{text}"
                );
            }
        }
    }
    assert_eq!(refused_writes, 5);
    assert_eq!(store_b.leases().await.unwrap().len(), 0);
    let health = PgElector::new(store).health().await;
    assert_ne!(health.identity_as_expected, Some(true), "{health:?}");
    drop((store_a, store_b));
    blocking(move || drop((a, b)));
}

/// Scenario 8, failover to an asynchronous standby that lost the last transactions: the standby stops receiving,
/// the primary issues more epochs (and acknowledges a write with the newest), then dies. After the promotion the
/// standby still shows the oldest tenure as current, but a promotion is a fencing boundary (invariant 7): the next
/// acquisition takes that tenure over at once — no force-release, no waiting for its ttl — and ends it as
/// 'failover'; every epoch issued from then on is greater than every epoch issued before, including the lost ones
/// (invariant 1), and the lost epochs can never write there (invariant 3). The write acknowledged under the newest
/// lost epoch is lost with it: invariant 6 covers restarts, not the tail an asynchronous standby never received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epochs_stay_above_lost_ones_after_failover_to_an_async_standby() {
    let primary = server().await;
    let store = migrated_store(&primary.url(), "primary").await;
    let mut last = store
        .acquire("l", "a", Duration::from_secs(60))
        .await
        .unwrap();
    let standby = blocking(|| primary.start_standby()).unwrap();
    wait_for_replay(
        &standby,
        "SELECT count(*) = 1 FROM pgfence.leases WHERE epoch = 1",
        "epoch 1",
    )
    .await;
    blocking(|| standby.stop()).unwrap();
    for _ in 0..3 {
        last = store
            .acquire("l", "a", Duration::from_secs(60))
            .await
            .unwrap();
    }
    store
        .create_task(&last.fence(), "acknowledged-then-lost", &json!({}))
        .await
        .unwrap();
    let highest_before = last.epoch();
    assert_eq!(highest_before.get(), 4);
    drop(store);
    blocking(|| primary.crash()).unwrap();

    blocking(|| standby.start_again()).unwrap();
    blocking(|| standby.promote()).unwrap();
    let promoted = Store::connect(StoreConfig::new(standby.url(), "f"))
        .await
        .unwrap();
    let status = promoted.lease_status("l").await.unwrap().unwrap();
    assert_eq!(
        status.epoch.map(|e| e.get()),
        Some(1),
        "the standby lost epochs 2 to 4"
    );
    assert_eq!(
        status.state,
        pgfence::LeaseState::Held,
        "epoch 1 looks current on the promoted server: {status:?}"
    );
    assert!(
        promoted
            .task("l", "acknowledged-then-lost")
            .await
            .unwrap()
            .is_none(),
        "an asynchronous standby loses the primary's last acknowledged writes"
    );
    let next = promoted
        .acquire("l", "b", Duration::from_secs(60))
        .await
        .expect("the pre-promotion tenure is taken over at once");
    eprintln!(
        "highest epoch before the failover {highest_before}, first after {}",
        next.epoch()
    );
    assert_eq!(next.epoch().get(), FIRST_EPOCH_OF_TIMELINE_2);
    assert!(
        next.epoch() > highest_before,
        "epoch {} reissued after failover",
        next.epoch()
    );
    let ended: Vec<(i64, Option<String>)> = promoted
        .tenures("l")
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.epoch.get(), t.end_reason))
        .collect();
    assert_eq!(
        ended,
        [
            (1, Some("failover".to_owned())),
            (FIRST_EPOCH_OF_TIMELINE_2, None)
        ]
    );
    for lost in 1..=highest_before.get() {
        let stale = Fence::new("f/l", Epoch::new(lost).unwrap()).unwrap();
        match promoted.create_task(&stale, "k", &json!({})).await {
            Err(Error::Stale {
                reason: LossReason::Superseded,
                ..
            }) => {}
            other => panic!(
                "epoch {lost} after the failover: expected Stale {{ Superseded }}, got {other:?}"
            ),
        }
    }
    drop(promoted);
    blocking(move || drop((standby, primary)));
}

/// Scenario 10, failover under a running leader: a controller leads through `run_with_leadership`, connected
/// through a proxy (a stand-in for a virtual IP or DNS name) to the primary. The primary crashes, its
/// asynchronous standby is promoted and the proxy is pointed at it. The leader's next renewal reaches the
/// promoted server, where the tenure was granted before the promotion: the runtime reports a definitive loss
/// with reason 'failover' (not a deadline loss: the renewal was answered), cancels the callback, whose last
/// write with the old fence is refused and audited as 'failover', and the campaign leads again at once with
/// the epoch 2^32+1 — without any operator action (no force-release, no waiting for the old ttl). Invariants 1,
/// 4 and 7.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_loses_at_a_failover_and_leads_again_without_operator_action() {
    const WAIT: Duration = Duration::from_secs(15);
    let primary = server().await;
    let standby = blocking(|| primary.start_standby()).unwrap();
    drop(migrated_store(&primary.url(), "setup").await);
    let proxy = Proxy::start(primary.port()).await;
    let store = Store::connect(
        StoreConfig::new(proxy.url("postgres"), "f")
            .application_name("leader")
            .connect_timeout(Duration::from_millis(500))
            .checkout_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let elector = PgElector::new(store.clone());
    // The ttl outlasts the outage (crash, promotion, redirect), so the loss must come from the database's
    // answer, not from the local deadline.
    let mut options = LeadershipOptions::new(Duration::from_secs(10));
    options.lease.renew_every = Some(Duration::from_millis(200));
    options.lease.retry_every = Some(Duration::from_millis(100));

    let (leading_tx, mut leading_rx) = tokio::sync::mpsc::unbounded_channel::<(Epoch, Instant)>();
    let (late_tx, mut late_rx) =
        tokio::sync::mpsc::unbounded_channel::<(Epoch, pgfence::Result<pgfence::TaskWrite>)>();
    let (ended_tx, mut ended_rx) =
        tokio::sync::mpsc::unbounded_channel::<(pgfence::Result<Ended<Error>>, Instant)>();
    let parent = CancellationToken::new();
    // The application's campaign loop: lead, and when leadership ends for any reason but shutdown, campaign
    // again at once.
    let campaign = tokio::spawn({
        let (store, parent) = (store.clone(), parent.clone());
        async move {
            loop {
                let (store, leading_tx, late_tx, stopping) = (
                    store.clone(),
                    leading_tx.clone(),
                    late_tx.clone(),
                    parent.clone(),
                );
                let ended = run_with_leadership(
                    &elector,
                    "ctl",
                    "pod-a",
                    &options,
                    &parent,
                    move |ctx| async move {
                        let started = format!("started-{}", ctx.epoch());
                        store.create_task(ctx.fence(), &started, &json!({})).await?;
                        let _ = leading_tx.send((ctx.epoch(), Instant::now()));
                        ctx.cancelled().await;
                        if !stopping.is_cancelled() {
                            // Lost: one more write with this tenure's fence, as a controller with work in flight
                            // would attempt. Idempotent by key, so retried while the answer is a connection
                            // error (a pooled connection to the crashed primary may still be handed out).
                            let mut attempts = 0;
                            let late = loop {
                                attempts += 1;
                                match store
                                    .create_task(ctx.fence(), "after-the-loss", &json!({}))
                                    .await
                                {
                                    Err(e) if e.is_transient() && attempts < 20 => {
                                        tokio::time::sleep(Duration::from_millis(50)).await
                                    }
                                    answer => break answer,
                                }
                            };
                            let _ = late_tx.send((ctx.epoch(), late));
                        }
                        Ok::<_, Error>(())
                    },
                )
                .await;
                let shutdown = matches!(ended, Ok(Ended::Cancelled { .. }));
                let _ = ended_tx.send((ended, Instant::now()));
                if shutdown {
                    return;
                }
            }
        }
    });

    let (first, _) = tokio::time::timeout(WAIT, leading_rx.recv())
        .await
        .expect("the controller did not lead on the primary within 15 s")
        .expect("campaign ended");
    assert_eq!(first.get(), 1);
    // The standby has the tenure (and its first write), so the promoted server will show it as current.
    wait_for_replay(
        &standby,
        "SELECT EXISTS (SELECT 1 FROM pgfence.tasks WHERE key = 'started-1')",
        "the leader's tenure",
    )
    .await;

    blocking(|| primary.crash()).unwrap();
    let promote_started = Instant::now();
    blocking(|| standby.promote()).unwrap();
    let promoted_at = Instant::now();
    proxy.redirect(standby.port());
    eprintln!(
        "promotion took {:?}",
        promoted_at.duration_since(promote_started)
    );

    let (ended, lost_at) = tokio::time::timeout(WAIT, ended_rx.recv())
        .await
        .expect("the runtime reported no loss within 15 s of the promotion")
        .expect("campaign ended");
    match ended {
        Ok(Ended::Lost {
            cause:
                LossCause::Definitive {
                    reason: LossReason::Failover,
                },
            callback_stopped: true,
        }) => {}
        other => {
            panic!("expected Lost {{ Definitive {{ Failover }}, callback stopped }}, got {other:?}")
        }
    }
    let (late_epoch, late) = tokio::time::timeout(WAIT, late_rx.recv())
        .await
        .expect("the cancelled callback made no late write")
        .expect("campaign ended");
    assert_eq!(late_epoch, first);
    match late {
        Err(Error::Stale {
            reason: LossReason::Failover,
            presented,
            ..
        }) if presented == first => {}
        other => {
            panic!("the old tenure's late write: expected Stale {{ Failover }}, got {other:?}")
        }
    }

    let (again, leading_again_at) = tokio::time::timeout(WAIT, leading_rx.recv())
        .await
        .expect("the controller did not lead again within 15 s of the loss")
        .expect("campaign ended");
    assert_eq!(again.get(), FIRST_EPOCH_OF_TIMELINE_2);
    eprintln!(
        "from promotion to the loss {:?}, to leading again at epoch {again} {:?} (from the loss {:?})",
        lost_at.duration_since(promoted_at),
        leading_again_at.duration_since(promoted_at),
        leading_again_at.duration_since(lost_at)
    );

    // The database's side of it, on the promoted server.
    let promoted = Store::connect(StoreConfig::new(standby.url(), "f"))
        .await
        .unwrap();
    let tenures: Vec<(i64, Option<String>)> = promoted
        .tenures("ctl")
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.epoch.get(), t.end_reason))
        .collect();
    assert_eq!(
        tenures,
        [
            (1, Some("failover".to_owned())),
            (FIRST_EPOCH_OF_TIMELINE_2, None)
        ]
    );
    let audited: Vec<(i64, String, String)> = promoted
        .rejections(&RejectionFilter {
            lease: Some("ctl".into()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.presented_epoch, r.reason, r.operation))
        .collect();
    assert_eq!(
        audited,
        [(1, "failover".to_owned(), "create_task".to_owned())]
    );

    parent.cancel();
    let (ended, _) = tokio::time::timeout(WAIT, ended_rx.recv())
        .await
        .expect("the runtime did not stop within 15 s of the shutdown")
        .expect("campaign ended");
    assert!(
        matches!(
            ended,
            Ok(Ended::Cancelled {
                callback_stopped: true
            })
        ),
        "{ended:?}"
    );
    tokio::time::timeout(WAIT, campaign)
        .await
        .expect("the campaign loop did not return")
        .unwrap();
    drop((promoted, store));
    blocking(move || drop((standby, primary)));
}

/// Scenario 9, uncertain completion: the server commits but the reply never arrives (held by the proxy) and the
/// caller gives up; a retry by the same stable task key has exactly one effect and one event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_lost_reply_has_exactly_one_effect() {
    let db = TestDb::new().await;
    let proxy = Proxy::start(db.port()).await;
    let store = Store::connect(StoreConfig::new(proxy.url(&db.name), "f").pool_size(1))
        .await
        .unwrap();
    let fence = store
        .acquire("l", "a", Duration::from_secs(60))
        .await
        .unwrap()
        .fence();
    // Warm up: the statement is prepared on the connection, so the next call is one Bind/Execute that the server
    // runs and commits without waiting for anything from the client.
    store
        .create_task(&fence, "warm-up", &json!({}))
        .await
        .unwrap();
    proxy.set(HOLD_REPLIES);
    let attempt = tokio::spawn({
        let (store, fence) = (store.clone(), fence.clone());
        async move {
            tokio::time::timeout(
                Duration::from_secs(2),
                store.create_task(&fence, "deploy-7", &json!({"v": 1})),
            )
            .await
        }
    });
    // The server commits; the client never hears of it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while db
        .scalar("SELECT count(*) FROM pgfence.tasks WHERE key = 'deploy-7'")
        .await
        == 0
    {
        assert!(
            Instant::now() < deadline,
            "the first attempt never committed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        attempt.await.unwrap().is_err(),
        "the reply was held, so the call cannot have completed"
    );
    proxy.set(PASS);
    let retry = store
        .create_task(&fence, "deploy-7", &json!({"v": 1}))
        .await
        .unwrap();
    assert!(!retry.created, "the retry found the committed task");
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.tasks WHERE key = 'deploy-7'")
            .await,
        1
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.task_events e JOIN pgfence.tasks t ON t.id = e.task_id WHERE t.key = 'deploy-7'")
            .await,
        1
    );
}

/// Scenario 2, a cancelled controller: cancelling the parent stops the callback (it observes its token), the
/// lease is released in the database, and the leader gauge drops to 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_controller_stops_releases_and_drops_the_gauge() {
    common::metrics_probe::install();
    let db = TestDb::new().await;
    let store = db.store(&db.name).await;
    let elector = PgElector::new(store.clone());
    let parent = tokio_util::sync::CancellationToken::new();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
    let run = {
        let (elector, parent) = (elector.clone(), parent.clone());
        tokio::spawn(async move {
            pgfence::leader::run_with_leadership(
                &elector,
                "ctl",
                "pod",
                &pgfence::leader::LeadershipOptions::new(Duration::from_secs(10)),
                &parent,
                move |ctx| async move {
                    started_tx.send(()).unwrap();
                    ctx.cancelled().await;
                    stopped_tx.send(()).unwrap();
                    Ok::<_, Error>(())
                },
            )
            .await
        })
    };
    started_rx.await.unwrap();
    let gauge = || {
        common::metrics_probe::gauge(
            pgfence::leader::METRIC_LEADER,
            &[("lease", &elector.qualify("ctl"))],
        )
    };
    assert_eq!(gauge(), Some(1.0));
    parent.cancel();
    stopped_rx.await.unwrap();
    let ended = run.await.unwrap().unwrap();
    assert!(
        matches!(
            ended,
            pgfence::leader::Ended::Cancelled {
                callback_stopped: true
            }
        ),
        "{ended:?}"
    );
    assert_eq!(gauge(), Some(0.0));
    let status = store.lease_status("ctl").await.unwrap().unwrap();
    assert_eq!(status.state, pgfence::LeaseState::Released);
}
