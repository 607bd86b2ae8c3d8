//! The fault matrix: handover under orderly release, a cancelled controller, a holder killed with SIGKILL,
//! dropped connections, a database restart, a network partition, a wrong database, a failover to an
//! asynchronous standby that lost the last transactions, uncertain completion, and a failover under a running
//! leader. Real processes where a process dies, real PostgreSQL servers (one per scenario that breaks its
//! server), a TCP proxy on loopback for partitions and redirects.
//!
//! Every safety scenario (1, 3, 5, 6, 8) also races the guard lock: a guarded transaction of the ending tenure
//! is held open past its check (by a channel) while the takeover runs. Either the server shows the takeover
//! waiting for it and it is then let commit — first — or it is held until the takeover returns, which must have
//! ended it after the grace: a commit sent after the takeover returned must fail. A write sent only after the
//! takeover committed is refused by the guard's unlocked read and never touches the lock, so such writes alone
//! would pass with the lock removed.
//!
//! Invariants checked: 1 (epochs increase, also across failover), 2 (one holder per epoch), 3 (no stale write
//! commits), 4 (refusals audited), 5 (the holder gives up by its own clock before the database can grant a
//! successor), 6 (acknowledged writes survive; a retry by key has one effect), 7 (a takeover waits for the
//! guarded writes past their check, or ends them after the grace; after a promotion no tenure current before it
//! can write or renew).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::proxy::{Proxy, HOLD_ALL, HOLD_REPLIES, PASS};
use common::TestDb;
use pgfence::admin::RejectionFilter;
use pgfence::embedded::EmbeddedServer;
use pgfence::leader::{
    run_with_leadership, Elector, Ended, LeadershipOptions, LeaseOptions, PgElector, TenureEnd,
};
use pgfence::{Epoch, Error, ExpectedIdentity, Fence, LossReason, Store, StoreConfig};
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
    common::apply_mutant(url).await;
    store
}

fn options(ttl_ms: u64) -> LeaseOptions {
    let mut options = LeaseOptions::new(Duration::from_millis(ttl_ms));
    options.renew_every = Duration::from_millis(ttl_ms / 5);
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

/// A takeover by a waiting candidate.
struct TakenOver {
    lease: pgfence::leader::HeldLease,
    /// When the acquisition returned.
    at: Instant,
    /// How long the successful acquisition call took (the takeover's own waits, not the candidate's).
    last_attempt: Duration,
    /// Whether the wait before the successful attempt was cut short by a release notification (it would
    /// otherwise have lasted until the expiry the database announced).
    woken: bool,
}

/// Acquires `name` as `holder`, retrying while another tenure is live: after a `held` answer it waits for a
/// release notification or the announced expiry, whichever is first. `waiting` is told after the first `held`
/// answer (the candidate is then subscribed to notifications and waiting).
async fn take_over(
    elector: &PgElector,
    name: &str,
    holder: &str,
    options: &LeaseOptions,
    mut waiting: Option<tokio::sync::oneshot::Sender<()>>,
) -> TakenOver {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut woken = false;
    loop {
        let mut wakeups = elector.wakeups();
        let attempt = Instant::now();
        match elector.acquire(name, holder, options).await {
            Ok(lease) => {
                return TakenOver {
                    lease,
                    at: Instant::now(),
                    last_attempt: attempt.elapsed(),
                    woken,
                }
            }
            Err(Error::Held { expires_in, .. }) => {
                if let Some(waiting) = waiting.take() {
                    let _ = waiting.send(());
                }
                let started = Instant::now();
                wakeups.wait(&elector.qualify(name), expires_in).await;
                woken = started.elapsed() < expires_in;
            }
            Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("{e}"),
        }
        assert!(Instant::now() < deadline, "no takeover within 30 s");
    }
}

/// A plain client for raw SQL (observing the server, creating tables).
async fn raw_client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// The application table the held guarded transactions write to.
async fn create_held_writes_table(url: &str) {
    raw_client(url)
        .await
        .batch_execute(
            "CREATE TABLE held_writes (id bigserial PRIMARY KEY, tag text NOT NULL, epoch bigint NOT NULL)",
        )
        .await
        .unwrap();
}

/// Sets the takeover grace of the database (an operator setting) and returns it.
async fn set_takeover_grace(client: &tokio_postgres::Client, grace: Duration) -> Duration {
    let ms: i64 = client
        .query_one(
            "SELECT pgfence.set_takeover_grace($1::text::interval)",
            &[&format!("{} ms", grace.as_millis())],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(ms as u128, grace.as_millis());
    grace
}

/// A guarded transaction of a tenure, held open past its check: `Store::fenced` passed the guard (so the
/// transaction holds the lease's guard lock shared until it ends) and inserted a row tagged `tag` into
/// `held_writes`; it commits when released (ordered by a channel, never by a sleep).
struct HeldWrite {
    tag: String,
    /// Its backend.
    pid: i32,
    release: Option<tokio::sync::oneshot::Sender<()>>,
    outcome: tokio::task::JoinHandle<pgfence::Result<()>>,
}

impl HeldWrite {
    /// Opens it; a connection error before the check (a pooled connection from before a restart) is retried.
    async fn open(store: &Store, fence: &Fence, tag: &str) -> HeldWrite {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<i32>();
            let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
            let outcome = tokio::spawn({
                let (store, fence, tag) = (store.clone(), fence.clone(), tag.to_owned());
                async move {
                    let epoch = fence.epoch().get();
                    store
                        .fenced(&fence, "held_write", async move |conn| {
                            use diesel::sql_types::{BigInt, Integer, Text};
                            use diesel_async::RunQueryDsl;
                            #[derive(diesel::QueryableByName)]
                            struct Pid {
                                #[diesel(sql_type = Integer)]
                                pid: i32,
                            }
                            let row: Pid = diesel::sql_query(
                                "INSERT INTO held_writes (tag, epoch) VALUES ($1, $2) \
                                 RETURNING pg_backend_pid() AS pid",
                            )
                            .bind::<Text, _>(tag)
                            .bind::<BigInt, _>(epoch)
                            .get_result(conn)
                            .await?;
                            let _ = ready_tx.send(row.pid);
                            let _ = go_rx.await;
                            Ok::<_, Error>(())
                        })
                        .await
                }
            });
            match ready_rx.await {
                Ok(pid) => {
                    return HeldWrite {
                        tag: tag.to_owned(),
                        pid,
                        release: Some(go_tx),
                        outcome,
                    }
                }
                Err(_) => {
                    let e = outcome.await.unwrap().expect_err("ended before its write");
                    assert!(
                        e.is_transient() && attempts < 20,
                        "the guarded transaction {tag} did not pass its check: {e}"
                    );
                }
            }
        }
    }

    /// Lets it commit (sends its COMMIT).
    fn release(&mut self) {
        if let Some(go) = self.release.take() {
            let _ = go.send(());
        }
    }

    /// Releases it if not yet, waits for its answer and checks it against the database: stored exactly when
    /// acknowledged, and never acknowledged when the takeover had already returned while it was open. Returns
    /// whether it committed.
    async fn finish(mut self, observer: &tokio_postgres::Client, order: Order) -> bool {
        self.release();
        let answer = self.outcome.await.unwrap();
        if order == Order::TakeoverReturnedFirst {
            assert!(
                answer.is_err(),
                "{}: a guarded write of the ended tenure, past its check when the takeover began, committed after \
                 the takeover had committed (the takeover neither waited for it nor ended it)",
                self.tag
            );
        }
        let stored: i64 = observer
            .query_one(
                "SELECT count(*) FROM held_writes WHERE tag = $1",
                &[&self.tag],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            stored,
            i64::from(answer.is_ok()),
            "{}: answered {answer:?}, stored {stored} times",
            self.tag
        );
        match &answer {
            Ok(()) => eprintln!("{}: committed first; the takeover waited for it", self.tag),
            Err(e) => eprintln!("{}: ended by the takeover ({e})", self.tag),
        }
        answer.is_ok()
    }
}

/// How a takeover must treat a guarded transaction of the ending tenure that is past its check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Wait for it: the test lets it commit once the server shows the takeover blocked by it.
    Wait,
    /// End it: it is not let go before the takeover returns, so the takeover waits the grace and terminates it;
    /// it must have returned by the instant given (the bound the scenario states).
    EndBy(Instant),
}

/// Whether the takeover was seen blocked by the held transaction (which was then let go) or returned first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    TakeoverWaited,
    TakeoverReturnedFirst,
}

/// Races `takeover` (already started) against `held`. With `Expect::Wait` the held transaction is released as
/// soon as the server shows the takeover waiting for the guard lock it holds; if the takeover returns first
/// instead, it committed while the held transaction was open past its check — allowed only if it ended it
/// (checked by [`HeldWrite::finish`]).
async fn race_takeover<T: Send + 'static>(
    observer: &tokio_postgres::Client,
    held: &mut HeldWrite,
    takeover: tokio::task::JoinHandle<T>,
    expect: Expect,
) -> (T, Order) {
    let mut takeover = takeover;
    match expect {
        Expect::Wait => {
            tokio::select! {
                done = &mut takeover => return (done.unwrap(), Order::TakeoverReturnedFirst),
                () = blocked_on_guard_lock_by(observer, held.pid) => {}
            }
            held.release();
            (takeover.await.unwrap(), Order::TakeoverWaited)
        }
        Expect::EndBy(deadline) => {
            match tokio::time::timeout_at(deadline.into(), &mut takeover).await {
                Ok(done) => (done.unwrap(), Order::TakeoverReturnedFirst),
                Err(_) => panic!(
                    "{}: the takeover had not ended the open guarded transaction by the stated bound",
                    held.tag
                ),
            }
        }
    }
}

/// Returns once some backend waits for an advisory lock that backend `pid` blocks, polling the server's own
/// lock state.
async fn blocked_on_guard_lock_by(observer: &tokio_postgres::Client, pid: i32) {
    loop {
        let blocked: bool = observer
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.wait_event_type = 'Lock' \
                   AND a.wait_event = 'advisory' AND $1::int = ANY (pg_blocking_pids(a.pid)))",
                &[&pid],
            )
            .await
            .unwrap()
            .get(0);
        if blocked {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

// ------------------------------------------------------------------------------------------------------------

/// Scenario 1, orderly release: the release waits for the tenure's guarded transaction already past its check
/// (it commits first: nothing of the old epoch commits after the release); the waiting successor is woken by the
/// release's notification and acquires promptly; the old epoch's later writes are refused and audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orderly_release_hands_over_promptly_and_fences_the_old_epoch() {
    let db = TestDb::new().await;
    create_held_writes_table(&db.url).await;
    let observer = db.client().await;
    let store = db.store("f").await;
    let elector = PgElector::new(store.clone());
    let options = options(10_000);
    let old = elector.acquire("l", "a", &options).await.unwrap();
    let fence = old.fence();
    store
        .tasks()
        .create(&fence, "job", &json!({}))
        .await
        .unwrap();
    let (waiting_tx, waiting_rx) = tokio::sync::oneshot::channel();
    let successor = {
        let elector = elector.clone();
        tokio::spawn(async move { take_over(&elector, "l", "b", &options, Some(waiting_tx)).await })
    };
    waiting_rx.await.unwrap();

    let mut held = HeldWrite::open(&store, &fence, "in-flight-at-the-release").await;
    let release = tokio::spawn(async move {
        let released = old.release().await;
        (released, Instant::now())
    });
    let ((released, released_at), order) =
        race_takeover(&observer, &mut held, release, Expect::Wait).await;
    assert!(
        matches!(released, Ok(pgfence::Released::Released)),
        "{released:?}"
    );
    held.finish(&observer, order).await;

    let new = successor.await.unwrap();
    let handover = new.at.saturating_duration_since(released_at);
    eprintln!("orderly release: successor acquired {handover:?} after the release returned");
    assert_eq!(new.lease.epoch().get(), fence.epoch().get() + 1);
    assert!(
        new.woken,
        "the successor acquired {handover:?} after the release, at the end of its wait for the announced expiry: \
         the release's notification did not wake it"
    );
    assert!(matches!(
        store
            .tasks()
            .append_event(&fence, "job", "late", &json!({}))
            .await,
        Err(Error::Stale { .. })
    ));
    assert_eq!(
        store
            .admin()
            .rejections(&RejectionFilter::default())
            .await
            .unwrap()
            .len(),
        1
    );
}

/// Scenario 3, a holder killed with SIGKILL (a real child process) while another process sharing its fence (a
/// worker of the same holder) is inside a guarded transaction past its check and never finishes it: the
/// successor acquires only after the ttl (the database ends the tenure as 'expired'), its acquisition waits the
/// takeover grace for that transaction and then ends it, so the transaction never commits; any later write
/// carrying the dead holder's epoch is refused. The successor is delayed by at most ttl + grace + 1 s (the bound
/// the README states for a holder idle inside a fenced transaction).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_with_sigkill_is_succeeded_after_the_ttl() {
    const TTL: Duration = Duration::from_millis(2_000);
    let db = TestDb::new().await;
    create_held_writes_table(&db.url).await;
    let observer = db.client().await;
    let grace = set_takeover_grace(&observer, Duration::from_millis(300)).await;
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "child_holds_a_lease_until_killed",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &db.url)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    // The child hands over its fence as a leader hands it to a worker: serialized (with the tenure secret).
    let mut fence = None;
    while let Some(line) = lines.next_line().await.unwrap() {
        if let Some(rest) = line.split("HOLDING FENCE ").nth(1) {
            fence = serde_json::from_str::<Fence>(rest.trim()).ok();
            break;
        }
    }
    let dead = fence.expect("the child acquired");
    let epoch = dead.epoch();
    // The worker's check passes while the child holds the lease; the child is killed only after that.
    let worker = Store::connect(db.config("f").application_name("worker-of-the-dead"))
        .await
        .unwrap();
    let mut held = HeldWrite::open(&worker, &dead, "worker-of-the-killed-holder").await;
    let status = std::process::Command::new("kill")
        .args(["-KILL", &child.id().unwrap().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let killed_at = Instant::now();
    child.wait().await.unwrap();

    let store = db.store("f").await;
    let elector = PgElector::new(store.clone());
    let takeover = tokio::spawn(async move {
        take_over(
            &elector,
            "l",
            "successor",
            &options(TTL.as_millis() as u64),
            None,
        )
        .await
    });
    let bound = killed_at + TTL + grace + Duration::from_secs(1);
    let (new, order) = race_takeover(&observer, &mut held, takeover, Expect::EndBy(bound)).await;
    let committed = held.finish(&observer, order).await;
    assert!(!committed);
    let waited = new.at - killed_at;
    eprintln!(
        "SIGKILLed holder succeeded after {waited:?} (ttl {TTL:?}, grace {grace:?}); the acquisition itself took \
         {:?}",
        new.last_attempt
    );
    assert!(new.lease.epoch() > epoch);
    assert!(
        new.last_attempt >= grace,
        "the acquisition took {:?}: it did not wait the grace for the open guarded transaction",
        new.last_attempt
    );
    assert!(
        new.last_attempt <= grace + Duration::from_secs(1) && waited <= TTL + grace + Duration::from_secs(1),
        "the successor acquired {waited:?} after the kill ({:?} in the acquisition): more than ttl + grace + 1 s",
        new.last_attempt
    );
    let ended: Vec<(i64, Option<String>)> = store
        .history()
        .tenures("l")
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.epoch.get(), t.end_reason))
        .collect();
    assert_eq!(
        ended,
        [
            (epoch.get(), Some("expired".to_owned())),
            (new.lease.epoch().get(), None)
        ],
        "the successor acquired only after the dead holder's ttl"
    );
    assert!(matches!(
        store.tasks().create(&dead, "ghost", &json!({})).await,
        Err(Error::Stale { .. })
    ));
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.tasks WHERE key = 'ghost'")
            .await,
        0
    );
}

/// The child process of the SIGKILL scenario: acquires with a 2 s ttl, renews, writes until it is killed.
/// Ignored: not a test of its own, but the entry point the scenario re-executes this binary into (with
/// `--ignored` and its environment); run alone it does nothing, and would count as a pass that checked nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the SIGKILL scenario's child process, run by it"]
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
    println!(
        "HOLDING FENCE {}",
        serde_json::to_string(&lease.fence()).unwrap()
    );
    let mut n = 0;
    loop {
        let _ = store
            .tasks()
            .create(&lease.fence(), &format!("child-{n}"), &json!({}))
            .await;
        n += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What [`terminated_backends_never_leave_two_holders`]'s holder writes with `fence` until the first refusal:
/// (the acknowledged keys, the keys whose answer was lost with their connection and why, the refusal's reason).
async fn writes_until_refused(
    store: &Store,
    fence: &Fence,
) -> (Vec<String>, Vec<(String, String)>, Option<LossReason>) {
    let (mut acked, mut unanswered, mut refused) = (Vec::new(), Vec::new(), None);
    for n in 0.. {
        let key = format!("w{n}");
        match store.tasks().create(fence, &key, &json!({})).await {
            Ok(_) => acked.push(key),
            Err(Error::Stale { reason, .. }) => {
                refused = Some(reason);
                break;
            }
            // Its connection was terminated (or a new one could not be had in time): the write may or
            // may not have committed.
            Err(
                e @ (Error::Database { .. } | Error::Connect { .. } | Error::PoolTimeout { .. }),
            ) => unanswered.push((key, e.to_string())),
            Err(e) => panic!("{key}: {e}"),
        }
    }
    (acked, unanswered, refused)
}

/// Scenario 4, dropped connections: the holder's backends are terminated again and again while it writes. It
/// recovers (renewals resume on new connections) or declares the loss by its own clock before the database could
/// grant a successor — never two holders trusting one lease at once. Its writes: every acknowledged one is
/// stored, every stored one was acknowledged or had its answer lost with its connection, and once the rival
/// holds the lease they are refused and audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_backends_never_leave_two_holders() {
    let db = TestDb::new().await;
    let holder_store = Store::connect(db.config("f").application_name("victim"))
        .await
        .unwrap();
    let holder = PgElector::new(holder_store.clone());
    let rival = PgElector::new(db.store("f").await);
    let options = options(1_000);
    let lease = holder.acquire("l", "victim", &options).await.unwrap();
    let fence = lease.fence();
    let loss = lease.lost();
    let lost_at = tokio::spawn(async move { (loss.await, Instant::now()) });
    // Writes with the holder's fence until the first refusal (the rival's tenure has begun by then).
    let writer = tokio::spawn({
        let (store, fence) = (holder_store.clone(), fence.clone());
        async move { writes_until_refused(&store, &fence).await }
    });
    let rival_task = {
        let rival = rival.clone();
        tokio::spawn(async move { take_over(&rival, "l", "rival", &options, None).await })
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
    let kept = lease.is_held();
    let next = if kept {
        eprintln!(
            "the holder kept its lease through 3 s of terminated backends (renewals resumed)"
        );
        // The release itself may meet the last terminated connection; then the lease expires after its ttl.
        if let Err(e) = lease.release().await {
            assert!(e.is_transient(), "{e}");
        }
        let next = rival_task.await.unwrap().lease;
        assert!(next.epoch().get() > 1);
        next
    } else {
        let new = rival_task.await.unwrap();
        let (cause, lost_at) = lost_at.await.unwrap();
        assert!(cause.is_loss(), "a loss, not a release: {cause:?}");
        eprintln!(
            "the holder gave up ({cause}) {:?} before the rival acquired",
            new.at.saturating_duration_since(lost_at)
        );
        assert!(
            lost_at.min(lease.trust_until()) <= new.at,
            "the rival acquired before the holder gave up"
        );
        assert_eq!(new.lease.epoch().get(), 2);
        new.lease
    };

    let (acked, unanswered, refused) = writer.await.unwrap();
    eprintln!(
        "the holder's writes: {} acknowledged, {} unanswered (connection terminated), then refused as {refused:?}",
        acked.len(),
        unanswered.len()
    );
    assert!(!acked.is_empty(), "no write of the holder was acknowledged");
    assert!(refused.is_some());
    let stored: std::collections::BTreeSet<String> = killer
        .query(
            "SELECT key FROM pgfence.tasks WHERE lease = 'f/l' AND fence = $1",
            &[&fence.epoch().get()],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    for key in &acked {
        assert!(
            stored.contains(key),
            "acknowledged {key} is missing (its connection terminated between the statement's answer and its \
             commit? see a_write_is_acknowledged_only_once_committed)"
        );
    }
    for key in &stored {
        assert!(
            acked.contains(key) || unanswered.iter().any(|(k, _)| k == key),
            "{key} is stored but was neither acknowledged nor unanswered"
        );
    }
    let audited = killer
        .query_one(
            "SELECT coalesce(sum(count), 0)::bigint FROM pgfence.rejections WHERE presented_epoch = $1",
            &[&fence.epoch().get()],
        )
        .await
        .unwrap()
        .get::<_, i64>(0) as usize;
    assert!(
        (1..=1 + unanswered.len()).contains(&audited),
        "{audited} refusals audited for 1 answered and {} unanswered",
        unanswered.len()
    );
    assert!(next.epoch() > fence.epoch());
}

/// Scenario 5, a database restart (immediate stop, crash recovery) under a stream of guarded writes: no
/// acknowledged write is lost; after the restart a takeover waits for the old tenure's guarded transaction past
/// its check (it commits first, nothing of the old epoch after); no stale write is accepted afterwards, and
/// epochs continue upward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_loses_no_acknowledged_write() {
    let server = server().await;
    let store = migrated_store(&server.url(), "writer").await;
    create_held_writes_table(&server.url()).await;
    let lease = store
        .acquire("l", "a", Duration::from_secs(60))
        .await
        .unwrap();
    let fence = lease.fence();
    let stop = Arc::new(AtomicBool::new(false));
    // Which incarnation of the server a write was sent to (sent after the restart had completed: 1).
    let incarnation = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // The writer's acknowledged writes so far, per incarnation.
    let (progress_tx, mut progress) = tokio::sync::watch::channel([0usize; 2]);
    let writer = {
        let (store, fence, stop, incarnation) = (
            store.clone(),
            fence.clone(),
            stop.clone(),
            incarnation.clone(),
        );
        tokio::spawn(async move {
            let (mut acked, mut failed) = (Vec::new(), 0);
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let key = format!("k{n}");
                let sent_to = incarnation.load(Ordering::SeqCst);
                match store.tasks().create(&fence, &key, &json!({})).await {
                    Ok(_) => {
                        acked.push(key);
                        progress_tx.send_modify(|p| p[sent_to] += 1);
                    }
                    Err(e) if e.is_transient() => failed += 1,
                    Err(e) => panic!("{e}"),
                }
                n += 1;
            }
            (acked, failed)
        })
    };
    // Crash once writes are flowing; stop once writes sent after the restart are acknowledged.
    progress.wait_for(|p| p[0] >= 50).await.unwrap();
    blocking(|| server.crash()).unwrap();
    blocking(|| server.start_again()).unwrap();
    incarnation.store(1, Ordering::SeqCst);
    progress.wait_for(|p| p[1] >= 20).await.unwrap();
    stop.store(true, Ordering::SeqCst);
    let (acked, failed) = writer.await.unwrap();
    eprintln!(
        "{} writes acknowledged across the restart, {failed} failed transiently",
        acked.len()
    );
    let reader = migrated_store(&server.url(), "reader").await;
    for key in &acked {
        assert!(
            reader.tasks().get("l", key).await.unwrap().is_some(),
            "acknowledged {key} was lost (the server stopped between the statement's answer and its commit? \
             see a_write_is_acknowledged_only_once_committed)"
        );
    }

    let observer = raw_client(&server.url()).await;
    let mut held = HeldWrite::open(&store, &fence, "in-flight-after-the-restart").await;
    let takeover = tokio::spawn({
        let reader = reader.clone();
        async move { reader.acquire("l", "a", Duration::from_secs(60)).await }
    });
    let (next, order) = race_takeover(&observer, &mut held, takeover, Expect::Wait).await;
    let next = next.unwrap();
    held.finish(&observer, order).await;
    assert_eq!(next.epoch().get(), fence.epoch().get() + 1);
    assert!(matches!(
        reader.tasks().create(&fence, "late", &json!({})).await,
        Err(Error::Stale { .. })
    ));
}

/// After the partition healed: the write sent during the cut (`during_the_cut`) and one sent after it heals, by
/// the partitioned holder's store with its old `fence`, are refused as stale and audited under its
/// application_name (`direct` reads the audit), and nothing of the first is stored.
async fn the_late_writes_are_refused_and_audited(
    db: &TestDb,
    holder_store: &Store,
    direct: &Store,
    fence: &Fence,
    during_the_cut: tokio::task::JoinHandle<pgfence::Result<pgfence::tasks::TaskWrite>>,
) {
    let late = during_the_cut.await.unwrap();
    assert!(matches!(late, Err(Error::Stale { .. })), "{late:?}");
    // The pool may hand out the connection the takeover terminated first (it is found dead on use): a client
    // retries a connection error.
    let mut after_heal = holder_store
        .tasks()
        .create(fence, "after-heal", &json!({}))
        .await;
    for _ in 0..3 {
        match &after_heal {
            Err(e) if e.is_transient() => {
                after_heal = holder_store
                    .tasks()
                    .create(fence, "after-heal", &json!({}))
                    .await
            }
            _ => break,
        }
    }
    assert!(
        matches!(after_heal, Err(Error::Stale { .. })),
        "{after_heal:?}"
    );
    let audit = direct
        .admin()
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
        db.scalar("SELECT count(*) FROM pgfence.task_events WHERE kind = 'sent-during-the-cut'")
            .await,
        0
    );
}

/// Scenario 6, a network partition between holder and database (a proxy holding all traffic): the holder
/// declares the loss on its own clock before the database expires the lease; the successor takes over. A guarded
/// transaction the holder began before the cut — past its check, its write sent — has its COMMIT held in flight
/// by the partition: the successor's acquisition waits the takeover grace for it and then ends it, so when the
/// partition heals that COMMIT fails and nothing of it is stored. A write sent during the partition and one
/// after it heals are refused and audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_gives_up_first_and_its_late_writes_are_refused() {
    let db = TestDb::new().await;
    create_held_writes_table(&db.url).await;
    let observer = db.client().await;
    let grace = set_takeover_grace(&observer, Duration::from_millis(300)).await;
    let proxy = Proxy::start(&db.url).await;
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
        .tasks()
        .create(&fence, "job", &json!({}))
        .await
        .unwrap();
    // A renewal through the proxy first (the local deadline moves).
    let first_deadline = lease.trust_until();
    while lease.trust_until() == first_deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut before_the_cut = HeldWrite::open(&holder_store, &fence, "sent-before-the-cut").await;
    // Two more connections, idle at the cut (a new one could not be opened during the partition): for the
    // renewal and for the write sent during the cut.
    let empty = json!({});
    let tasks = holder_store.tasks();
    let (one, two) = tokio::join!(
        tasks.append_event(&fence, "job", "connection-1", &empty),
        tasks.append_event(&fence, "job", "connection-2", &empty)
    );
    one.unwrap();
    two.unwrap();

    proxy.set(HOLD_ALL);
    let cut_at = Instant::now();
    // Its COMMIT leaves the holder now, into the partition.
    before_the_cut.release();
    let during_the_cut = {
        let (store, fence) = (holder_store.clone(), fence.clone());
        tokio::spawn(async move {
            store
                .tasks()
                .append_event(&fence, "job", "sent-during-the-cut", &json!({}))
                .await
        })
    };
    let cause = lease.lost().await;
    let gave_up_at = Instant::now();
    assert!(
        matches!(cause, TenureEnd::DeadlineExceeded { .. }),
        "{cause:?}"
    );
    let takeover =
        tokio::spawn(async move { take_over(&rival, "l", "rival", &options, None).await });
    // The database's expiry is at most a ttl after the cut (the last renewal was before it).
    let bound = cut_at + Duration::from_millis(1_500) + grace + Duration::from_secs(1);
    let (new, order) = race_takeover(
        &observer,
        &mut before_the_cut,
        takeover,
        Expect::EndBy(bound),
    )
    .await;
    eprintln!(
        "partition: holder gave up {:?} after the cut, the successor acquired {:?} after the cut (ttl 1.5 s, \
         grace {grace:?}; the acquisition took {:?})",
        gave_up_at - cut_at,
        new.at - cut_at,
        new.last_attempt
    );
    assert!(
        gave_up_at.min(lease.trust_until()) < new.at,
        "the holder trusted its lease after the successor got it"
    );
    assert_eq!(new.lease.epoch().get(), fence.epoch().get() + 1);
    proxy.set(PASS);
    assert!(!before_the_cut.finish(&observer, order).await);
    assert!(
        new.last_attempt >= grace && new.last_attempt <= grace + Duration::from_secs(1),
        "the acquisition took {:?}: not the grace ({grace:?}) for the open guarded transaction plus at most 1 s \
         to end it",
        new.last_attempt
    );

    the_late_writes_are_refused_and_audited(&db, &holder_store, &direct, &fence, during_the_cut)
        .await;
}

/// Scenario 7, a wrong database: a process configured for one database's identity refuses another at connect,
/// and when its connections are redirected mid-life (DNS, a proxy), new connections are refused, so it writes
/// nothing there — although the other database has a lease of the same name at the same epoch, where its
/// writes would be accepted if they arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_pointed_at_another_database_refuses_to_write() {
    let (a, b) = (server().await, server().await);
    let store_a = migrated_store(&a.url(), "setup").await;
    let store_b = migrated_store(&b.url(), "setup").await;
    let identity_a = store_a.admin().identity().await.unwrap();
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

    // On b the same lease at the same epoch: a write that reached b would be accepted there.
    let on_b = store_b
        .acquire("l", "someone-else", Duration::from_secs(60))
        .await
        .unwrap();
    // Each embedded server has a superuser password of its own. The process behind the proxy logs in as a role
    // that exists on both servers with one password, so that after the redirect it does get in to b, and what
    // refuses its writes is the identity check, not the login.
    for server in [&a, &b] {
        raw_client(&server.url())
            .await
            .batch_execute("CREATE ROLE wanderer LOGIN SUPERUSER PASSWORD 'wanderer-on-a-and-b'")
            .await
            .unwrap();
    }
    let proxy = Proxy::start(&common::url_with_credentials(
        &a.url(),
        "wanderer",
        "wanderer-on-a-and-b",
    ))
    .await;
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
            .tasks()
            .create(&lease.fence(), &format!("k{i}"), &json!({}))
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
    assert_eq!(on_b.epoch(), lease.epoch());
    let b_client = raw_client(&b.url()).await;
    for table in ["pgfence.tasks", "pgfence.task_events", "pgfence.rejections"] {
        let rows: i64 = b_client
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            rows, 0,
            "the redirected process wrote to {table} on the wrong database"
        );
    }
    let health = PgElector::new(store).health().await;
    assert_ne!(health.identity_as_expected, Some(true), "{health:?}");
    drop((store_a, store_b));
    blocking(move || drop((a, b)));
}

/// Three takeovers of `l` on the primary by the same holder, each while a guarded transaction of the tenure it
/// ends is held open past its check: each waits for it (it commits first). The last tenure.
async fn three_takeovers_each_after_a_held_write(
    store: &Store,
    on_primary: &tokio_postgres::Client,
    mut last: pgfence::Lease,
) -> pgfence::Lease {
    for _ in 0..3 {
        let mut held = HeldWrite::open(
            store,
            &last.fence(),
            &format!("epoch-{}-at-its-takeover", last.epoch()),
        )
        .await;
        let takeover = tokio::spawn({
            let store = store.clone();
            async move { store.acquire("l", "a", Duration::from_secs(60)).await }
        });
        let (next, order) = race_takeover(on_primary, &mut held, takeover, Expect::Wait).await;
        last = next.unwrap();
        held.finish(on_primary, order).await;
    }
    last
}

/// What the promoted (asynchronous) standby shows: epoch 1 current and held — it lost epochs 2 to 4 — and
/// not the primary's last acknowledged write.
async fn the_promoted_server_lost_the_epochs_after_1(promoted: &Store) {
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
            .tasks()
            .get("l", "acknowledged-then-lost")
            .await
            .unwrap()
            .is_none(),
        "an asynchronous standby loses the primary's last acknowledged writes"
    );
}

/// Scenario 8, failover to an asynchronous standby that lost the last transactions: the standby stops receiving,
/// the primary issues more epochs (and acknowledges a write with the newest), then dies. After the promotion the
/// standby still shows the oldest tenure as current, but a promotion is a fencing boundary (invariant 7): the next
/// acquisition takes that tenure over at once — no force-release, no waiting for its ttl — and ends it as
/// 'failover'; every epoch issued from then on is greater than every epoch issued before, including the lost ones
/// (invariant 1), and the lost epochs can never write there (invariant 3). The write acknowledged under the newest
/// lost epoch is lost with it: invariant 6 covers restarts, not the tail an asynchronous standby never received.
///
/// The guard lock races: every acquisition on the primary waits for a guarded transaction of the tenure it ends,
/// held open past its check (it commits first); so does an acquisition on the promoted server for the first
/// tenure granted there. No write of a pre-promotion tenure can be in flight on the promoted server: a guard
/// there refuses it ('failover') before it takes the lock, which the loop over the lost epochs checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epochs_stay_above_lost_ones_after_failover_to_an_async_standby() {
    let primary = server().await;
    let store = migrated_store(&primary.url(), "primary").await;
    // Created before the standby's base backup, so the promoted server has it too.
    create_held_writes_table(&primary.url()).await;
    let on_primary = raw_client(&primary.url()).await;
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
    last = three_takeovers_each_after_a_held_write(&store, &on_primary, last).await;
    store
        .tasks()
        .create(&last.fence(), "acknowledged-then-lost", &json!({}))
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
    the_promoted_server_lost_the_epochs_after_1(&promoted).await;
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
        .history()
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
        let stale = common::forged_fence("f/l", lost);
        match promoted.tasks().create(&stale, "k", &json!({})).await {
            Err(Error::Stale {
                reason: LossReason::Superseded,
                ..
            }) => {}
            other => panic!(
                "epoch {lost} after the failover: expected Stale {{ Superseded }}, got {other:?}"
            ),
        }
    }

    // The guard lock fences on the promoted server too.
    let on_promoted = raw_client(&standby.url()).await;
    let mut held =
        HeldWrite::open(&promoted, &next.fence(), "first-tenure-after-the-failover").await;
    let takeover = tokio::spawn({
        let promoted = promoted.clone();
        async move { promoted.acquire("l", "b", Duration::from_secs(60)).await }
    });
    let (after, order) = race_takeover(&on_promoted, &mut held, takeover, Expect::Wait).await;
    assert_eq!(after.unwrap().epoch().get(), FIRST_EPOCH_OF_TIMELINE_2 + 1);
    held.finish(&on_promoted, order).await;
    match promoted
        .tasks()
        .create(&next.fence(), "late", &json!({}))
        .await
    {
        Err(Error::Stale {
            reason: LossReason::Superseded,
            ..
        }) => {}
        other => panic!("the first post-promotion tenure after its takeover: {other:?}"),
    }
    drop(promoted);
    blocking(move || drop((standby, primary)));
}

/// The controller of [`a_leader_loses_at_a_failover_and_leads_again_without_operator_action`]: it writes
/// `started-<epoch>` and reports that it leads; once cancelled for a loss (not `stopping`), it makes one more
/// write with its tenure's fence, as a controller with work in flight would, and reports its answer.
async fn lead_then_write_late(
    ctx: pgfence::leader::LeaderContext,
    store: Store,
    leading_tx: tokio::sync::mpsc::UnboundedSender<(Epoch, Instant)>,
    late_tx: tokio::sync::mpsc::UnboundedSender<(
        Epoch,
        pgfence::Result<pgfence::tasks::TaskWrite>,
    )>,
    stopping: CancellationToken,
) -> Result<(), Error> {
    let started = format!("started-{}", ctx.epoch());
    store
        .tasks()
        .create(&ctx.fence(), &started, &json!({}))
        .await?;
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
                .tasks()
                .create(&ctx.fence(), "after-the-loss", &json!({}))
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
    Ok(())
}

/// The runtime reported the loss as the failover, the callback stopped; the old tenure's (`first`'s) late write
/// came back refused as `Stale { Failover }`.
async fn the_loss_is_the_failover_and_the_late_write_refused(
    ended: pgfence::Result<Ended<Error>>,
    late_rx: &mut tokio::sync::mpsc::UnboundedReceiver<(
        Epoch,
        pgfence::Result<pgfence::tasks::TaskWrite>,
    )>,
    first: Epoch,
) {
    const WAIT: Duration = Duration::from_secs(15);
    match ended {
        Ok(Ended::Lost {
            end: TenureEnd::Lost {
                reason: LossReason::Failover,
            },
            callback_stopped: true,
        }) => {}
        other => {
            panic!("expected Lost {{ Lost {{ Failover }}, callback stopped }}, got {other:?}")
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
}

/// The database's side of the failover, on the promoted server (`standby`): the first tenure ended by the
/// failover and the new one current, and the late write audited as a failover refusal.
async fn the_promoted_server_ended_the_tenure_by_the_failover(standby: &EmbeddedServer) {
    let promoted = Store::connect(StoreConfig::new(standby.url(), "f"))
        .await
        .unwrap();
    let tenures: Vec<(i64, Option<String>)> = promoted
        .history()
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
    let mut filter = RejectionFilter::default();
    filter.lease = Some("ctl".into());
    let audited: Vec<(i64, String, String)> = promoted
        .admin()
        .rejections(&filter)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.presented_epoch, r.reason, r.operation))
        .collect();
    assert_eq!(
        audited,
        [(1, "failover".to_owned(), "create_task".to_owned())]
    );
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
    let proxy = Proxy::start(&primary.url()).await;
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
    options.lease.renew_every = Duration::from_millis(200);
    options.lease.retry_every = Duration::from_millis(100);

    let (leading_tx, mut leading_rx) = tokio::sync::mpsc::unbounded_channel::<(Epoch, Instant)>();
    let (late_tx, mut late_rx) = tokio::sync::mpsc::unbounded_channel::<(
        Epoch,
        pgfence::Result<pgfence::tasks::TaskWrite>,
    )>();
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
                let ended =
                    run_with_leadership(&elector, "ctl", "pod-a", &options, &parent, move |ctx| {
                        lead_then_write_late(ctx, store, leading_tx, late_tx, stopping)
                    })
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
    the_loss_is_the_failover_and_the_late_write_refused(ended, &mut late_rx, first).await;
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

    the_promoted_server_ended_the_tenure_by_the_failover(&standby).await;

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
    drop(store);
    blocking(move || drop((standby, primary)));
}

/// Scenario 9, uncertain completion: the server commits but the reply never arrives (held by the proxy) and the
/// caller gives up; a retry by the same stable task key has exactly one effect and one event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_lost_reply_has_exactly_one_effect() {
    let db = TestDb::new().await;
    let proxy = Proxy::start(&db.url).await;
    let store = Store::connect(StoreConfig::new(proxy.url(&db.name), "f").pool_size(1))
        .await
        .unwrap();
    let fence = store
        .acquire("l", "a", Duration::from_secs(60))
        .await
        .unwrap()
        .fence();
    // Warm up: the statement is prepared on the connection. The write is one autocommit statement; the proxy holds
    // every reply from now on, so the server commits and the client never hears of it.
    store
        .tasks()
        .create(&fence, "warm-up", &json!({}))
        .await
        .unwrap();
    proxy.set(HOLD_REPLIES);
    let attempt = tokio::spawn({
        let (store, fence) = (store.clone(), fence.clone());
        async move {
            tokio::time::timeout(
                Duration::from_secs(2),
                store.tasks().create(&fence, "deploy-7", &json!({"v": 1})),
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
        .tasks()
        .create(&fence, "deploy-7", &json!({"v": 1}))
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

/// Scenario 9b, the reverse of 9: the statement is answered but its commit fails. A one-statement guarded
/// write sent with the extended protocol commits when the server processes the Sync that follows it, after it
/// has sent the statement's rows and CommandComplete; a commit that fails there — here a deferred constraint
/// trigger, in scenario 4 a backend terminated in between — must make the write an error, never an
/// acknowledgement (invariant 6: an acknowledged write is stored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_is_acknowledged_only_once_committed() {
    let db = TestDb::new().await;
    let store = db.store("f").await;
    let fence = store
        .acquire("l", "a", Duration::from_secs(60))
        .await
        .unwrap()
        .fence();
    db.client()
        .await
        .batch_execute(
            "CREATE FUNCTION fail_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN RAISE EXCEPTION 'the commit fails'; END $$; \
             CREATE CONSTRAINT TRIGGER fail_at_commit AFTER INSERT ON pgfence.task_events \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fail_at_commit();",
        )
        .await
        .unwrap();
    let answer = store
        .tasks()
        .create(&fence, "never-committed", &json!({}))
        .await;
    let stored = db
        .scalar("SELECT count(*) FROM pgfence.tasks WHERE key = 'never-committed'")
        .await;
    assert_eq!(stored, 0);
    assert!(
        answer.is_err(),
        "the write was acknowledged ({answer:?}) but its transaction did not commit"
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
            pgfence::metrics::METRIC_LEADER,
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

/// Invariant 9 across a promotion: an effect's attempt left open by a tenure granted before the promotion is in
/// doubt on the promoted server in every reader of the ledger — `in_doubt_effects` (`Effects::in_doubt`),
/// `Effects::ledger` and `Effects::task_ledger` (what `pgfence tasks --lease L --task K` prints) — before any
/// successor acquires: the lease row still says held and unexpired, only the timeline ended the tenure. (The
/// ledger's read once judged liveness by itself, without the timeline, and showed it as not in doubt.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_attempt_of_a_tenure_before_a_promotion_is_in_doubt_in_every_reader() {
    let primary = server().await;
    let store = migrated_store(&primary.url(), "primary").await;
    let lease = store
        .acquire("fx", "a", Duration::from_secs(600))
        .await
        .unwrap();
    store
        .tasks()
        .create(&lease.fence(), "t", &json!({}))
        .await
        .unwrap();
    store
        .effects()
        .intend(&lease.fence(), "t", "t/launch", &json!({"n": 1}))
        .await
        .unwrap();
    // Before the promotion: this tenure's own attempt in flight, in doubt nowhere.
    let before: Vec<bool> = store
        .effects()
        .ledger("fx")
        .await
        .unwrap()
        .iter()
        .map(|a| a.in_doubt)
        .collect();
    assert_eq!(before, [false]);
    let standby = blocking(|| primary.start_standby()).unwrap();
    wait_for_replay(
        &standby,
        "SELECT count(*) = 1 FROM pgfence.effects",
        "the open attempt",
    )
    .await;
    drop(store);
    blocking(|| primary.crash()).unwrap();
    blocking(|| standby.promote()).unwrap();
    let promoted = Store::connect(StoreConfig::new(standby.url(), "f"))
        .await
        .unwrap();
    let listed: Vec<String> = promoted
        .effects()
        .in_doubt("fx")
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.effect.key)
        .collect();
    assert_eq!(listed, ["t/launch"], "in_doubt_effects");
    let ledger: Vec<(String, bool)> = promoted
        .effects()
        .ledger("fx")
        .await
        .unwrap()
        .into_iter()
        .map(|a| (a.effect.key, a.in_doubt))
        .collect();
    assert_eq!(ledger, [("t/launch".to_owned(), true)], "Effects::ledger");
    let task: Vec<(String, bool)> = promoted
        .effects()
        .task_ledger("fx", "t")
        .await
        .unwrap()
        .into_iter()
        .map(|a| (a.effect.key, a.in_doubt))
        .collect();
    assert_eq!(
        task,
        [("t/launch".to_owned(), true)],
        "Effects::task_ledger"
    );
    drop(promoted);
    blocking(move || drop((standby, primary)));
}
