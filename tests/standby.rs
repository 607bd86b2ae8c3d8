//! Integration tests of streaming-replication standbys
//! (`EmbeddedServer::start_standby` / `promote`) against the system's
//! PostgreSQL binaries, and of how a `Store` treats a standby and a promoted
//! one: a promotion is a fencing boundary.
//!
//! Invariants checked: 1 (epochs increase across a failover), 4 (refusals
//! are typed errors and audit rows), 7 (after a promotion no tenure current
//! before it can write).

use crate::common;

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgfence::admin::RejectionFilter;
use pgfence::embedded::EmbeddedServer;
use pgfence::{Epoch, Error, Fence, Lease, LeaseState, LossReason, Released, Store, StoreConfig};
use serde_json::json;

/// How long a change on the primary may take to show up on the standby.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs a blocking `EmbeddedServer` call without stalling the runtime's other
/// tasks (the connections' drivers).
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// A client connection to `url`, its driver spawned on the runtime.
async fn client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    tokio::spawn(connection);
    client
}

/// Evaluates the boolean `sql` on `url` every 50 ms until it is true or
/// `timeout` passes; whether it became true.
async fn becomes_true(url: &str, sql: &str, timeout: Duration) -> bool {
    let client = client(url).await;
    poll(timeout, || async {
        client
            .query_one(sql, &[])
            .await
            .and_then(|row| row.try_get::<_, bool>(0))
            .unwrap_or(false)
    })
    .await
}

/// Polls `condition` every 50 ms until it holds or `timeout` passes.
async fn poll<F, Fut>(timeout: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if condition().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The temporary directory of a server (the parent of its data directory).
fn root_of(server: &EmbeddedServer) -> PathBuf {
    server
        .data_dir()
        .parent()
        .expect("data dir has a parent")
        .to_path_buf()
}

/// A store refuses a standby with `Error::NotPrimary` before anything is
/// written (identity before any write), and accepts the same server once it
/// is promoted. The promoted server is the same cluster (same system
/// identifier, same pgfence instance id) and continues the lease's epoch
/// sequence above every epoch of the old timeline (epochs strictly increase
/// across a failover, invariant 1); the replicated tenure does not survive
/// the promotion (invariant 7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_a_standby_is_refused_as_not_primary() {
    let primary = blocking(EmbeddedServer::start).expect("start primary");
    let store = Store::connect(StoreConfig::new(primary.url(), "c"))
        .await
        .expect("connect to the primary");
    store.migrate().await.expect("migrate");
    let lease = store
        .acquire("x", "pod", Duration::from_secs(30))
        .await
        .expect("acquire on the primary");
    assert_eq!(lease.epoch().get(), 1);
    let primary_identity = store.admin().identity().await.expect("primary identity");
    assert!(!primary_identity.in_recovery);

    let standby = blocking(|| primary.start_standby()).expect("start standby");
    assert_ne!(standby.port(), primary.port());
    assert!(
        becomes_true(
            &standby.url(),
            "SELECT to_regclass('pgfence.leases') IS NOT NULL",
            REPLAY_TIMEOUT,
        )
        .await,
        "the standby did not replay the migration within {REPLAY_TIMEOUT:?}"
    );
    assert!(
        becomes_true(
            &standby.url(),
            "SELECT EXISTS (SELECT 1 FROM pgfence.leases WHERE name = 'c/x' AND epoch = 1)",
            REPLAY_TIMEOUT,
        )
        .await,
        "the standby did not replay the acquisition within {REPLAY_TIMEOUT:?}"
    );

    match Store::connect(StoreConfig::new(standby.url(), "c")).await {
        Err(Error::NotPrimary { target }) => {
            assert!(
                target.contains(&standby.port().to_string()),
                "target {target:?} does not name the standby"
            );
        }
        Err(other) => panic!("expected NotPrimary for the standby, got {other:?}"),
        Ok(_) => panic!("a store connected to a standby"),
    }

    blocking(|| standby.promote()).expect("promote");
    let promoted = Store::connect(StoreConfig::new(standby.url(), "c"))
        .await
        .expect("connect to the promoted standby");
    let identity = promoted
        .admin()
        .identity()
        .await
        .expect("promoted identity");
    assert!(!identity.in_recovery, "{identity:?}");
    assert!(
        identity.system_identifier.is_some(),
        "no system identifier: {identity:?}"
    );
    assert_eq!(
        identity.system_identifier, primary_identity.system_identifier,
        "a physical replica shares its primary's system identifier"
    );
    assert_eq!(identity.instance_id, primary_identity.instance_id);
    assert!(
        identity.timeline.unwrap_or(0) >= 1,
        "timeline not readable: {identity:?}"
    );

    // The primary's tenure was replicated, but it was granted on the old timeline: a promotion is a fencing
    // boundary, so it no longer blocks the lease and the next acquisition takes it over at once.
    let status = promoted.lease_status("x").await.unwrap().unwrap();
    assert_eq!(status.epoch.map(|e| e.get()), Some(1), "{status:?}");
    let successor = promoted
        .acquire("x", "pod-b", Duration::from_secs(30))
        .await
        .expect("acquire on the promoted server");
    // Promotion moved the server to WAL timeline 2: epochs issued there start above every epoch of timeline 1.
    assert_eq!(
        successor.epoch().get(),
        (1_i64 << 32) + 1,
        "the epoch must continue above every epoch of the old timeline"
    );

    drop(promoted);
    drop(store);
    blocking(move || {
        drop(standby);
        drop(primary);
    });
}

/// A standby owns its temporary directory like any other embedded server:
/// dropping it and its primary stops both and removes both directories
/// (separate from each other), and frees both ports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_standby_and_its_primary_removes_both_directories() {
    let primary = blocking(EmbeddedServer::start).expect("start primary");
    let standby = blocking(|| primary.start_standby()).expect("start standby");
    let (primary_root, standby_root) = (root_of(&primary), root_of(&standby));
    let (primary_port, standby_port) = (primary.port(), standby.port());
    assert_ne!(primary_root, standby_root);
    assert!(standby.data_dir().join("standby.signal").exists());
    assert!(standby.is_running());

    blocking(move || drop(standby));
    assert!(
        !standby_root.exists(),
        "standby dir {} still exists",
        standby_root.display()
    );
    assert!(
        !common::port_accepts(standby_port),
        "standby port still accepts"
    );
    // The primary does not depend on its standby.
    assert!(primary.is_running());
    assert!(primary_root.exists());

    blocking(move || drop(primary));
    assert!(
        !primary_root.exists(),
        "primary dir {} still exists",
        primary_root.display()
    );
    assert!(
        !common::port_accepts(primary_port),
        "primary port still accepts"
    );
}

/// A standby is read-only, runs on its own port and socket directory (not the
/// primary's, whose settings the base backup copied), and streams: a change
/// committed on the primary after the standby started shows up on it, over a
/// walsender the primary reports as streaming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_streams_on_its_own_port_and_socket_directory() {
    let primary = blocking(EmbeddedServer::start).expect("start primary");
    let standby = blocking(|| primary.start_standby()).expect("start standby");
    let on_standby = client(&standby.url()).await;

    let row = on_standby
        .query_one(
            "SELECT pg_is_in_recovery(), current_setting('port'), \
                    current_setting('unix_socket_directories')",
            &[],
        )
        .await
        .expect("standby settings");
    assert!(row.get::<_, bool>(0), "the standby is not in recovery");
    assert_eq!(row.get::<_, String>(1), standby.port().to_string());
    let socket_dir: String = row.get(2);
    assert!(
        PathBuf::from(&socket_dir).starts_with(root_of(&standby)),
        "socket directory {socket_dir} is not in the standby's directory"
    );

    let refused = on_standby
        .batch_execute("CREATE TABLE on_the_standby ()")
        .await
        .expect_err("a standby accepted a write");
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION),
        "{refused}"
    );

    let on_primary = client(&primary.url()).await;
    on_primary
        .batch_execute("CREATE TABLE streamed (id int); INSERT INTO streamed VALUES (42);")
        .await
        .expect("write on the primary");
    assert!(
        becomes_true(
            &standby.url(),
            // An error (no such table yet) counts as false.
            "SELECT EXISTS (SELECT 1 FROM streamed WHERE id = 42)",
            REPLAY_TIMEOUT,
        )
        .await,
        "the standby did not replay a change made after it started"
    );
    assert!(
        becomes_true(
            &primary.url(),
            "SELECT count(*) = 1 FROM pg_stat_replication WHERE state = 'streaming'",
            REPLAY_TIMEOUT,
        )
        .await,
        "the primary reports no streaming standby"
    );

    drop(on_standby);
    drop(on_primary);
    blocking(move || {
        drop(standby);
        drop(primary);
    });
}

/// The first epoch issued on WAL timeline 2, the one a first promotion starts:
/// (2 − 1) · 2^32 + 1.
const FIRST_EPOCH_OF_TIMELINE_2: i64 = (1 << 32) + 1;

/// The ttl of [`a_failover_is_a_fencing_boundary`]'s tenures: A's is still unexpired when the promoted server
/// is asked, so only the failover can end it.
const TTL: Duration = Duration::from_secs(60);

/// [`common::move_shard`] that also tells, through `ran`, whether the fenced transaction's body ran at all.
async fn move_shard_noting_run(
    store: &Store,
    fence: &Fence,
    owner: &str,
    ran: &Arc<AtomicBool>,
) -> Result<u64, Error> {
    let (owner, ran) = (owner.to_owned(), ran.clone());
    store
        .fenced(fence, "move_shard", async move |conn| {
            ran.store(true, Ordering::SeqCst);
            let n = common::write_shard_owner(conn, owner).await?;
            Ok::<_, Error>(n as u64)
        })
        .await
}

/// Asserts that `result` is a write refused as stale with `reason`, presenting
/// `presented`, during `operation`.
#[track_caller]
fn assert_stale<T: std::fmt::Debug>(
    result: Result<T, Error>,
    reason: LossReason,
    presented: i64,
    operation: &str,
) {
    match result {
        Err(Error::Stale {
            reason: r,
            presented: p,
            operation: o,
            ..
        }) if r == reason && p.get() == presented && o == operation => {}
        other => panic!(
            "expected Stale {{ reason: {reason}, presented: {presented}, operation: {operation} }}, got {other:?}"
        ),
    }
}

/// The run-up to [`a_failover_is_a_fencing_boundary`]'s promotion: A leads on the primary and writes, the
/// standby replays it all and stops; A releases, B acquires epoch 2 and writes (acknowledged); the primary
/// crashes. Returns (primary, standby, A's lease, B's lease).
async fn a_tenure_the_standby_replayed_and_one_it_missed(
) -> (EmbeddedServer, EmbeddedServer, Lease, Lease) {
    let primary = blocking(EmbeddedServer::start).expect("start primary");
    let standby = blocking(|| primary.start_standby()).expect("start standby");
    let store = Store::connect(StoreConfig::new(primary.url(), "f"))
        .await
        .expect("connect to the primary");
    store.migrate().await.expect("migrate");
    common::apply_mutant(&primary.url()).await;
    client(&primary.url())
        .await
        .batch_execute(common::SHARDS_TABLE)
        .await
        .expect("create the application's table");

    // A leads on the primary and writes; the standby replays it all.
    let a = store.acquire("l", "a", TTL).await.expect("A acquires");
    assert_eq!(a.epoch().get(), 1);
    store
        .tasks()
        .create(&a.fence(), "a-1", &json!({"by": "a"}))
        .await
        .expect("A writes on the primary");
    assert!(
        becomes_true(
            &standby.url(),
            "SELECT EXISTS (SELECT 1 FROM pgfence.tasks WHERE key = 'a-1')",
            REPLAY_TIMEOUT,
        )
        .await,
        "the standby did not replay A's tenure and write within {REPLAY_TIMEOUT:?}"
    );

    // The standby stops receiving; the primary goes on without it.
    blocking(|| standby.stop()).expect("stop the standby");
    assert!(matches!(
        store.release(&a).await.expect("A releases"),
        Released::Released
    ));
    let b = store.acquire("l", "b", TTL).await.expect("B acquires");
    assert_eq!(b.epoch().get(), 2);
    store
        .tasks()
        .create(&b.fence(), "b-1", &json!({"by": "b"}))
        .await
        .expect("B's write is acknowledged");
    drop(store);
    blocking(|| primary.crash()).expect("crash the primary");

    blocking(|| standby.start_again()).expect("start the standby again");
    (primary, standby, a, b)
}

/// What the promoted server shows: A's tenure, current and unexpired, granted on timeline 1; B's acquisition,
/// its write and A's release were lost with the old primary.
async fn the_promoted_server_shows_a_s_tenure_current(
    promoted: &Store,
    raw: &tokio_postgres::Client,
) {
    let status = promoted
        .lease_status("l")
        .await
        .unwrap()
        .expect("lease row");
    assert_eq!(status.holder.as_deref(), Some("a"), "{status:?}");
    assert_eq!(status.epoch.map(Epoch::get), Some(1), "{status:?}");
    assert_eq!(status.state, LeaseState::Held, "{status:?}");
    assert!(
        status.expires_in.is_some_and(|left| left > Duration::ZERO),
        "{status:?}"
    );
    let row = raw
        .query_one(
            "SELECT timeline FROM pgfence.leases WHERE name = 'f/l'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, Option<i64>>(0), Some(1));
    assert!(promoted.tasks().get("l", "b-1").await.unwrap().is_none());
    let tenures = promoted.history().tenures("l").await.unwrap();
    assert_eq!(tenures.len(), 1, "{tenures:?}");
    assert_eq!(tenures[0].ended_at, None, "{tenures:?}");
}

/// A's renewal on the promoted server: lost, because of the failover.
async fn a_s_renewal_is_lost_to_the_failover(promoted: &Store, a: &Lease) {
    let mut a_after = a.clone();
    match promoted.renew(&mut a_after).await {
        Err(Error::Lost {
            reason: LossReason::Failover,
            epoch,
            current,
            ..
        }) => {
            assert_eq!(epoch.get(), 1);
            assert_eq!(current.map(Epoch::get), Some(1));
        }
        other => {
            panic!("A's renewal after the failover: expected Lost {{ Failover }}, got {other:?}")
        }
    }
}

/// A's writes on the promoted server: refused as 'failover', whatever their path; nothing of theirs commits
/// (the fenced body does not even run: `ran` stays false).
async fn a_s_writes_are_refused_as_failover(
    promoted: &Store,
    raw: &tokio_postgres::Client,
    fence_a: &Fence,
    ran: &Arc<AtomicBool>,
) {
    for _ in 0..2 {
        assert_stale(
            promoted.tasks().create(fence_a, "a-2", &json!({})).await,
            LossReason::Failover,
            1,
            "create_task",
        );
    }
    assert_stale(
        promoted.tasks().claim(fence_a, "a-1", "worker").await,
        LossReason::Failover,
        1,
        "claim_task",
    );
    assert_stale(
        promoted
            .tasks()
            .append_event(fence_a, "a-1", "progress", &json!({}))
            .await,
        LossReason::Failover,
        1,
        "append_event",
    );
    assert_stale(
        move_shard_noting_run(promoted, fence_a, "a", ran).await,
        LossReason::Failover,
        1,
        "move_shard",
    );
    assert!(
        !ran.load(Ordering::SeqCst),
        "the fenced body ran for a refused fence"
    );
    let count =
        |sql: &'static str| async move { raw.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) };
    assert_eq!(count("SELECT count(*) FROM shards").await, 0);
    assert_eq!(
        count("SELECT count(*) FROM pgfence.tasks WHERE key = 'a-2'").await,
        0
    );
    assert_eq!(
        count("SELECT count(*) FROM pgfence.task_events e JOIN pgfence.tasks t ON t.id = e.task_id WHERE t.key = 'a-1'")
            .await,
        1,
        "only A's 'created' event from before the failover"
    );
}

/// Every refusal of A's writes is audited, aggregated per (lease, presented epoch, operation), with reason
/// 'failover'.
async fn a_s_refusals_are_audited_as_failover(promoted: &Store) {
    let mut filter = RejectionFilter::default();
    filter.lease = Some("l".into());
    let rejections = promoted.admin().rejections(&filter).await.unwrap();
    let mut audited: Vec<(String, i64)> = rejections
        .iter()
        .map(|r| {
            assert_eq!(r.reason, "failover", "{r:?}");
            assert_eq!(r.presented_epoch, 1, "{r:?}");
            assert_eq!(r.current_epoch, Some(1), "{r:?}");
            assert_eq!(r.current_holder.as_deref(), Some("a"), "{r:?}");
            (r.operation.clone(), r.count)
        })
        .collect();
    audited.sort();
    assert_eq!(
        audited,
        [
            ("append_event".to_owned(), 1),
            ("claim_task".to_owned(), 1),
            ("create_task".to_owned(), 2),
            ("move_shard".to_owned(), 1),
        ]
    );
}

/// The next acquisition on the promoted server takes A's tenure over at once (A's ttl has ~a minute left) with
/// an epoch above every epoch of timeline 1, including B's lost one; the tenures record A's as ended by the
/// failover and each tenure's timeline.
async fn the_next_acquisition_takes_over_above_every_lost_epoch(
    promoted: &Store,
    raw: &tokio_postgres::Client,
    b: &Lease,
) {
    let acquiring = Instant::now();
    let next = promoted
        .acquire("l", "b", TTL)
        .await
        .expect("the first acquisition after the promotion succeeds at once");
    eprintln!(
        "took over A's pre-promotion tenure in {:?} (epoch {})",
        acquiring.elapsed(),
        next.epoch()
    );
    assert_eq!(next.epoch().get(), FIRST_EPOCH_OF_TIMELINE_2);
    assert!(next.epoch() > b.epoch());
    promoted
        .tasks()
        .create(&next.fence(), "b-2", &json!({}))
        .await
        .expect("the new tenure writes");

    let tenures: Vec<(i64, String, Option<String>, bool)> = promoted
        .history()
        .tenures("l")
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.epoch.get(), t.holder, t.end_reason, t.ended_at.is_some()))
        .collect();
    assert_eq!(
        tenures,
        [
            (1, "a".to_owned(), Some("failover".to_owned()), true),
            (FIRST_EPOCH_OF_TIMELINE_2, "b".to_owned(), None, false),
        ]
    );
    let timelines: Vec<(i64, Option<i64>)> = raw
        .query(
            "SELECT epoch, timeline FROM pgfence.tenures WHERE lease = 'f/l' ORDER BY epoch",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        timelines,
        [(1, Some(1)), (FIRST_EPOCH_OF_TIMELINE_2, Some(2))]
    );
}

/// A failover is a fencing boundary (invariant 7: after a promotion no tenure
/// current before it can write; invariant 1: epochs keep increasing across the
/// failover; invariant 4: every refusal is a typed error and an audit row).
///
/// Holder A acquires on the primary and writes; the standby replays that and is
/// then stopped, so it misses what follows: A releases, B acquires epoch 2 and
/// writes (acknowledged). The primary crashes and the standby is promoted, with
/// A's release and B's tenure lost. On the promoted server A's tenure looks
/// current in `pgfence.leases` — yet it was granted on the old timeline, so:
/// A's renewal is `Lost { Failover }`; A's task writes and a fenced transaction
/// are `Stale { Failover }`, run nothing and are audited with reason
/// 'failover'; the next acquisition succeeds at once, without a force-release
/// or waiting for A's ttl, with the epoch 2^32+1, above B's lost epoch 2; and
/// A's tenure row ends with 'failover'. B's lost epoch 2 can never write there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_is_a_fencing_boundary() {
    let (primary, standby, a, b) = a_tenure_the_standby_replayed_and_one_it_missed().await;
    let promoting = Instant::now();
    blocking(|| standby.promote()).expect("promote");
    eprintln!("promotion took {:?}", promoting.elapsed());
    let promoted = Store::connect(StoreConfig::new(standby.url(), "f"))
        .await
        .expect("connect to the promoted server");
    let raw = client(&standby.url()).await;
    let identity = promoted.admin().identity().await.expect("identity");
    assert_eq!(identity.timeline, Some(2), "{identity:?}");

    the_promoted_server_shows_a_s_tenure_current(&promoted, &raw).await;
    a_s_renewal_is_lost_to_the_failover(&promoted, &a).await;
    let (fence_a, ran) = (a.fence(), Arc::new(AtomicBool::new(false)));
    a_s_writes_are_refused_as_failover(&promoted, &raw, &fence_a, &ran).await;
    a_s_refusals_are_audited_as_failover(&promoted).await;

    // B's epoch 2 was issued and acknowledged on the old primary but never reached the promoted server: it is
    // refused there too.
    let fence_b_lost = b.fence();
    assert_stale(
        promoted
            .tasks()
            .create(&fence_b_lost, "b-2", &json!({}))
            .await,
        LossReason::FutureEpoch,
        2,
        "create_task",
    );

    the_next_acquisition_takes_over_above_every_lost_epoch(&promoted, &raw, &b).await;

    // Both lost epochs stay fenced out after the takeover, now as superseded.
    assert_stale(
        promoted
            .tasks()
            .create(&fence_b_lost, "b-3", &json!({}))
            .await,
        LossReason::Superseded,
        2,
        "create_task",
    );
    assert_stale(
        move_shard_noting_run(&promoted, &fence_a, "a", &ran).await,
        LossReason::Superseded,
        1,
        "move_shard",
    );
    assert!(!ran.load(Ordering::SeqCst));

    drop((promoted, raw));
    blocking(move || {
        drop(standby);
        drop(primary);
    });
}
