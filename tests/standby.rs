//! Integration tests of streaming-replication standbys
//! (`EmbeddedServer::start_standby` / `promote`) against the system's
//! PostgreSQL binaries, and of how a `Store` treats a standby and a promoted
//! one.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use pgfence::embedded::EmbeddedServer;
use pgfence::{Error, Store, StoreConfig};

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

fn port_accepts(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
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
    let primary_identity = store.identity().await.expect("primary identity");
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
    let identity = promoted.identity().await.expect("promoted identity");
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
    assert!(!port_accepts(standby_port), "standby port still accepts");
    // The primary does not depend on its standby.
    assert!(primary.is_running());
    assert!(primary_root.exists());

    blocking(move || drop(primary));
    assert!(
        !primary_root.exists(),
        "primary dir {} still exists",
        primary_root.display()
    );
    assert!(!port_accepts(primary_port), "primary port still accepts");
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
