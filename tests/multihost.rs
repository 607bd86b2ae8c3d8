//! Multi-host connection strings (`postgres://a,b/…?target_session_attrs=read-write`), as libpq treats them:
//! hosts are tried in order, each within the connect timeout (a first host that accepts TCP and never answers
//! costs one timeout, not the whole attempt); a standby is never written to (identity before any write: a store
//! that reaches only standbys is `Error::NotPrimary`, the CLI's exit 4); every message names the host it is
//! about.

use crate::common;

use std::time::{Duration, Instant};

use pgfence::embedded::EmbeddedServer;
use pgfence::{Error, Store, StoreConfig};

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// `url` (one host) with the host list replaced by `hosts` and `target_session_attrs=read-write`.
fn multi(url: &str, hosts: &[String]) -> String {
    let (scheme_user, rest) = url.split_once('@').unwrap();
    let path = &rest[rest.find('/').unwrap()..];
    format!(
        "{scheme_user}@{}{path}?target_session_attrs=read-write",
        hosts.join(",")
    )
}

/// A TCP port that accepts connections and never answers (a host hung in its startup).
async fn black_hole() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (port, task)
}

/// A hung first host costs one connect timeout; the primary listed second is reached, and the store works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_first_host_costs_one_timeout_and_the_next_host_is_used() {
    let primary = blocking(EmbeddedServer::start).expect("start primary");
    let (hung, _task) = black_hole().await;
    let url = multi(
        &primary.url(),
        &[
            format!("127.0.0.1:{hung}"),
            format!("127.0.0.1:{}", primary.port()),
        ],
    );
    let started = Instant::now();
    let store = Store::connect(StoreConfig::new(&url, "c").connect_timeout(Duration::from_secs(2)))
        .await
        .expect("the second host is reached");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(5),
        "one timeout for the hung host, then the primary: {took:?}"
    );
    store.migrate().await.unwrap();
    store
        .acquire("l", "pod", Duration::from_secs(10))
        .await
        .unwrap();
}

/// With a standby listed first, `target_session_attrs=read-write` skips it and the primary is used; with only
/// standbys (or only the standby) the store is refused as `NotPrimary` naming the host it reached, and the CLI
/// exits 4. Hosts that cannot be reached are named each with its cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standbys_are_skipped_or_refused_and_every_host_is_named() {
    let primary = blocking(EmbeddedServer::start).expect("start primary");
    let standby = blocking(|| primary.start_standby()).expect("start standby");
    let host = |port: u16| format!("127.0.0.1:{port}");
    let both = multi(
        &primary.url(),
        &[host(standby.port()), host(primary.port())],
    );
    let store = Store::connect(StoreConfig::new(&both, "c")).await.unwrap();
    assert!(!store.admin().identity().await.unwrap().in_recovery);

    let only_standby = multi(
        &primary.url(),
        &[host(standby.port()), host(standby.port())],
    );
    match Store::connect(StoreConfig::new(&only_standby, "c")).await {
        Err(Error::NotPrimary { target }) => {
            assert!(target.contains(&standby.port().to_string()), "{target}")
        }
        other => panic!("expected NotPrimary, got {other:?}"),
    }
    let out = tokio::process::Command::new(common::pgfence_bin())
        .args(["status"])
        .env("DATABASE_URL", &only_standby)
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Two closed ports: the error names both, each with its cause.
    let (a, b) = (common::unused_port(), common::unused_port());
    let dead = multi(&primary.url(), &[host(a), host(b)]);
    let err = Store::connect(StoreConfig::new(&dead, "c"))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&a.to_string()) && text.contains(&b.to_string()),
        "{text}"
    );
    assert!(text.contains("refused"), "{text}");
    assert!(
        !text.contains(primary.url().split('@').next().unwrap()),
        "credentials: {text}"
    );
}

/// A TestDb's URL with a refused host listed before the real one: every connection reaches the second host.
fn behind_a_refused_host(db: &common::TestDb) -> String {
    multi(
        &db.url,
        &[
            format!("127.0.0.1:{}", common::unused_port()),
            format!("127.0.0.1:{}", db.port()),
        ],
    )
}

/// Waits (at most 10 s) until no backend of `db` waits for a lock, while the lock it waited for is still held:
/// only a cancel request delivered to the server it runs on can end that wait so soon.
async fn until_no_lock_wait(db: &common::TestDb, what: &str) {
    common::wait_for_lock_waiters(
        &db.client().await,
        Duration::from_secs(10),
        |n| n == 0,
        &format!("{what} is still waiting for the lock: its cancel request did not reach the host it runs on"),
    )
    .await;
}

/// Invariant: a cancel request goes to the host the connection reached, not to the first host of the
/// connection string. With a refused host listed first, a pooled statement abandoned while it waits for a lock
/// (a timeout around `acquire`) is cancelled on the second host, where it runs. The function's own bounded lock
/// wait is raised to over a minute first, so that within the 10 s allowed only the cancel request can end it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_pooled_statement_is_cancelled_on_the_host_it_runs_on() {
    let db = common::TestDb::new().await;
    db.scalar("SELECT count(*) FROM (SELECT pgfence.set_takeover_grace('60 seconds')) g")
        .await;
    let store = Store::connect(
        StoreConfig::new(behind_a_refused_host(&db), "c")
            .pool_size(1)
            .connect_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let first = store
        .acquire("sched", "pod-a", Duration::from_secs(30))
        .await
        .unwrap();
    store.release(&first).await.unwrap();

    let blocker = common::RowLock::take(&db, "c/sched").await;
    let store2 = store.clone();
    let attempt = tokio::spawn(async move {
        store2
            .acquire("sched", "pod-b", Duration::from_secs(30))
            .await
    });
    common::wait_until_blocked_on_lock(&db, 1).await;
    attempt.abort();
    assert!(attempt.await.unwrap_err().is_cancelled());
    until_no_lock_wait(&db, "the abandoned acquire").await;
    blocker.release().await;
    let status = store.lease_status("sched").await.unwrap().unwrap();
    assert_eq!(status.state, pgfence::LeaseState::Released, "{status:?}");
}

/// Invariant: the leader's renewal connection (opened outside the pool) sends its cancel request to the host it
/// reached. With a refused host listed first, a renewal blocked on the lease row past the local deadline is
/// given up — the tenure is declared lost — and its statement is cancelled on the second host while the row
/// stays locked, so it cannot renew the tenure behind the loss already declared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_renewal_is_cancelled_on_the_host_it_runs_on() {
    use pgfence::leader::{Elector, LeaseOptions, PgElector};
    let db = common::TestDb::new().await;
    db.scalar("SELECT count(*) FROM (SELECT pgfence.set_takeover_grace('60 seconds')) g")
        .await;
    let store = Store::connect(
        StoreConfig::new(behind_a_refused_host(&db), "c").connect_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let elector = PgElector::new(store);
    let mut options = LeaseOptions::new(Duration::from_secs(2));
    options.renew_every = Duration::from_millis(300);
    let held = elector.acquire("renewed", "pod-a", &options).await.unwrap();
    let blocker = common::RowLock::take(&db, "c/renewed").await;
    common::wait_until_blocked_on_lock(&db, 1).await;
    let loss = tokio::time::timeout(Duration::from_secs(10), held.lost())
        .await
        .expect("the tenure is declared lost at its local deadline");
    assert!(loss.is_loss(), "a loss, not an orderly end: {loss:?}");
    until_no_lock_wait(&db, "the late renewal").await;
    blocker.release().await;
}
