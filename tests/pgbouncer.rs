//! pgfence through PgBouncer, in session and in transaction pooling mode, in front of the throwaway server.
//!
//! The stance these tests prove (README, "Connection poolers (PgBouncer)"):
//! - Session mode needs no option: connect, migrate, leases, guarded writes, fenced transactions, the audit,
//!   concurrent writers and LISTEN all work as they do directly.
//! - Transaction mode needs a pooler that keeps named prepared statements (PgBouncer ≥ 1.21 with
//!   `max_prepared_statements` > 0): diesel-async names every statement, with or without its statement cache.
//!   One that does not (Debian bookworm's 1.18) is refused by `Store::connect` with the reason.
//! - A transaction-mode pooler never carries pgfence's LISTEN nor its migrations: electors poll
//!   (`poll_every`), or LISTEN and migrations use `StoreConfig::direct_url`.
//!
//! Invariants checked through each pooler: 1 (epochs increase), 3 and 4 (a stale write is refused, typed and
//! audited), and that concurrent guarded writers all commit.
//!
//! Each test starts its own PgBouncer as the `postgres` OS user when run as root (PgBouncer refuses root), on a
//! free loopback port, without a Unix socket, from a private 0700 directory. It authenticates clients with SCRAM
//! against the role's verifier copied from `pg_authid` and logs in to the server with the client's own SCRAM
//! proof: no password is written to a file, an argument or a log (reading `pg_authid` takes a superuser, as the
//! throwaway server's is). Without the `pgbouncer` binary every test
//! says so and passes — unless `PGFENCE_REQUIRE_PGBOUNCER` is set (`.ci/run` sets it), when it fails.

mod common;

use std::io::Write;
use std::net::{Ipv4Addr, TcpStream};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::{guarded_writes_per_second, median, move_shard, unused_port, TestDb};
use pgfence::admin::RejectionFilter;
use pgfence::leader::{
    run_with_leadership, AcquisitionTurn, Elector, Ended, Health, HeldLease, LeadershipOptions,
    LeaseOptions, PgElector, Wakeups,
};
use pgfence::{Error, LossReason, PoolerMode, Released, Store, StoreConfig};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_secs(30);

// ------------------------------------------------------------------------------------------------------------
// A PgBouncer of the test's own.

/// PgBouncer's `pool_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PoolMode {
    Session,
    Transaction,
}

/// The pgbouncer binary: `$PGBOUNCER` (authoritative when set), else `pgbouncer` on `$PATH`, else Debian's
/// `/usr/sbin/pgbouncer`.
fn pgbouncer_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PGBOUNCER").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "PGBOUNCER={} is not a file", path.display());
        return Some(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("pgbouncer"))
        .find(|p| p.is_file())
}

/// `(major, minor)` of the pgbouncer binary (`pgbouncer --version` prints `PgBouncer 1.18.0` first).
fn pgbouncer_version(binary: &Path) -> (u32, u32) {
    let out = Command::new(binary)
        .arg("--version")
        .output()
        .expect("run pgbouncer --version");
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("unexpected `pgbouncer --version` output: {text}"));
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Whether this PgBouncer can keep protocol-level named prepared statements in transaction mode (1.21 added
/// `max_prepared_statements`).
fn can_keep_prepared_statements(binary: &Path) -> bool {
    pgbouncer_version(binary) >= (1, 21)
}

/// The pgbouncer binary, or `None` after saying why the test does not run. Fails instead when
/// `PGFENCE_REQUIRE_PGBOUNCER` is set (CI). Also installs the log capture every test may read.
fn pgbouncer_or_skip() -> Option<PathBuf> {
    install_log_capture();
    match pgbouncer_binary() {
        Some(binary) => Some(binary),
        None if std::env::var_os("PGFENCE_REQUIRE_PGBOUNCER").is_some_and(|v| !v.is_empty()) => {
            panic!("PGFENCE_REQUIRE_PGBOUNCER is set but no pgbouncer binary was found ($PGBOUNCER, $PATH, /usr/sbin)")
        }
        None => {
            eprintln!(
                "SKIPPED: no pgbouncer binary ($PGBOUNCER, $PATH, /usr/sbin); `.ci/run` installs Debian's \
                 pgbouncer package (`apt-get install pgbouncer`)"
            );
            None
        }
    }
}

/// The uid and gid of the `postgres` OS user when this process is root (PgBouncer refuses to run as root).
fn run_as() -> Option<(u32, u32)> {
    let id = |args: &[&str]| -> Option<u32> {
        let out = Command::new("id").args(args).output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    if id(&["-u"])? != 0 {
        return None;
    }
    let uid =
        id(&["-u", "postgres"]).expect("the postgres OS user (the embedded server runs as it too)");
    let gid = id(&["-g", "postgres"]).expect("the postgres OS group");
    Some((uid, gid))
}

/// A running PgBouncer in front of the test server. Stopped when dropped — or, should this process die first,
/// when its end of the wrapper's stdin pipe closes.
struct Bouncer {
    port: u16,
    dir: tempfile::TempDir,
    wrapper: Child,
    stdin: Option<ChildStdin>,
}

impl Bouncer {
    /// Starts a PgBouncer in `mode` for the server of `db` (every database on it), with at most `server_conns`
    /// server connections per database and role; `max_prepared_statements` is written only when given (the
    /// setting exists from PgBouncer 1.21 on).
    async fn start(
        binary: &Path,
        db: &TestDb,
        mode: PoolMode,
        server_conns: u32,
        max_prepared_statements: Option<u32>,
    ) -> Bouncer {
        let config: tokio_postgres::Config = db.url.parse().unwrap();
        let user = config.get_user().unwrap().to_owned();
        // The verifier, not the password: PgBouncer checks the client's SCRAM proof against it and, since the
        // server holds the very same verifier (same salt and iterations), logs in to the server with that proof.
        let verifier: String = db
            .client()
            .await
            .query_one(
                "SELECT rolpassword FROM pg_authid WHERE rolname = current_user",
                &[],
            )
            .await
            .expect("read the role's SCRAM verifier (the test role must be a superuser)")
            .get(0);
        assert!(
            verifier.starts_with("SCRAM-SHA-256$"),
            "the test role has a SCRAM verifier"
        );
        let owner = run_as();
        // As root, the postgres user must be able to reach the directory: /tmp rather than a private TMPDIR.
        let base = if owner.is_some() {
            PathBuf::from("/tmp")
        } else {
            std::env::temp_dir()
        };
        let dir = tempfile::Builder::new()
            .prefix("pgfence-bouncer-")
            .tempdir_in(base)
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let private = |name: &str, text: &str| -> PathBuf {
            let path = dir.path().join(name);
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .and_then(|mut file| file.write_all(text.as_bytes()))
                .unwrap();
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
            }
            path
        };
        let auth_file = private("userlist.txt", &format!("\"{user}\" \"{verifier}\"\n"));
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
        }

        // A port free a moment ago may be taken by the time PgBouncer binds it: try a few.
        for attempt in 0..5 {
            let port = unused_port();
            let ini = private(
                &format!("pgbouncer-{attempt}.ini"),
                &format!(
                    "[databases]\n\
                     * = host=127.0.0.1 port={server}\n\
                     [pgbouncer]\n\
                     listen_addr = 127.0.0.1\n\
                     listen_port = {port}\n\
                     unix_socket_dir =\n\
                     auth_type = scram-sha-256\n\
                     auth_file = {auth}\n\
                     pool_mode = {mode}\n\
                     default_pool_size = {server_conns}\n\
                     max_client_conn = 500\n\
                     logfile = {log}\n\
                     pidfile = {pid}\n\
                     {prepared}",
                    server = db.port(),
                    auth = auth_file.display(),
                    mode = match mode {
                        PoolMode::Session => "session",
                        PoolMode::Transaction => "transaction",
                    },
                    log = dir.path().join("pgbouncer.log").display(),
                    pid = dir.path().join("pgbouncer.pid").display(),
                    prepared = max_prepared_statements
                        .map(|n| format!("max_prepared_statements = {n}\n"))
                        .unwrap_or_default(),
                ),
            );
            // PgBouncer in the foreground under a shell that exits with it, and stops it (SIGTERM: immediate
            // shutdown) once its stdin closes, which happens when this process drops the Bouncer or dies.
            // (Background jobs read /dev/null: the watcher reads the pipe through descriptor 3.)
            const SCRIPT: &str = "trap '' HUP INT QUIT PIPE\n\
                                  exec 3<&0\n\
                                  \"$1\" \"$2\" 3<&- &\n\
                                  child=$!\n\
                                  (read -r _line <&3; kill -TERM \"$child\" 2>/dev/null) &\n\
                                  exec 3<&-\n\
                                  wait \"$child\"\n";
            let mut cmd = Command::new("/bin/sh");
            cmd.arg("-c")
                .arg(SCRIPT)
                .arg("pgfence-bouncer")
                .arg(binary)
                .arg(&ini)
                .current_dir(dir.path())
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0);
            if let Some((uid, gid)) = owner {
                cmd.uid(uid).gid(gid);
            }
            let mut wrapper = cmd.spawn().expect("spawn pgbouncer");
            let stdin = wrapper.stdin.take();
            let deadline = Instant::now() + Duration::from_secs(10);
            let listening = loop {
                if TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok() {
                    break true;
                }
                if !matches!(wrapper.try_wait(), Ok(None)) {
                    break false;
                }
                assert!(
                    Instant::now() < deadline,
                    "pgbouncer listening within 10 s: {}",
                    read_log(dir.path())
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            if listening {
                return Bouncer {
                    port,
                    dir,
                    wrapper,
                    stdin,
                };
            }
            drop(stdin);
            let _ = wrapper.wait();
        }
        panic!("pgbouncer did not start: {}", read_log(dir.path()))
    }

    /// `url` (a URL of the test server) with this PgBouncer's port instead of the server's.
    fn url(&self, url: &str) -> String {
        let config: tokio_postgres::Config = url.parse().unwrap();
        let server = format!("127.0.0.1:{}", config.get_ports()[0]);
        assert!(url.contains(&server), "a 127.0.0.1 URL");
        url.replacen(&server, &format!("127.0.0.1:{}", self.port), 1)
    }

    /// PgBouncer's own log.
    fn log(&self) -> String {
        read_log(self.dir.path())
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !matches!(self.wrapper.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.wrapper.kill();
        let _ = self.wrapper.wait();
    }
}

fn read_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("pgbouncer.log")).unwrap_or_default()
}

// ------------------------------------------------------------------------------------------------------------
// pgfence's log lines, captured for the whole test binary.

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn captured() -> &'static Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED.get_or_init(Captured::default)
}

/// Installs a global subscriber that keeps every pgfence event at info level and above (before any test of
/// this binary reaches a log line, so that no call site is cached as disabled).
fn install_log_capture() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let sink = captured().clone();
        tracing::subscriber::set_global_default(
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::INFO)
                .with_ansi(false)
                .with_writer(move || sink.clone())
                .finish(),
        )
        .expect("install the log capture");
    });
}

fn logs() -> String {
    String::from_utf8_lossy(&captured().0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
}

// ------------------------------------------------------------------------------------------------------------
// What every pooler must carry.

/// Writers and writes each in [`every_operation_is_correct`]'s concurrent phase.
const WRITERS: usize = 8;
const WRITES: usize = 25;

/// Acquire, renew, guarded writes (`create_task`, `claim_task`, `append_event`), a fenced transaction, a
/// release and a takeover with a larger epoch; the old fence's writes refused as stale, typed and audited, and
/// nothing of them written; then `WRITERS` concurrent guarded writers on the store's pool, every write
/// committed. `db` is read directly to check.
async fn every_operation_is_correct(store: &Store, db: &TestDb) {
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS shards (id int PRIMARY KEY, owner text NOT NULL)",
        )
        .await
        .unwrap();
    let mut old = store.acquire("sched", "pod-a", TTL).await.unwrap();
    store.renew(&mut old).await.unwrap();
    let fence = old.fence();
    store
        .tasks()
        .create(&fence, "job-1", &json!({"image": "api:1.7"}))
        .await
        .unwrap();
    store
        .tasks()
        .claim(&fence, "job-1", "worker-1")
        .await
        .unwrap();
    store
        .tasks()
        .append_event(&fence, "job-1", "progress", &json!({"pct": 50}))
        .await
        .unwrap();
    assert_eq!(move_shard(store, &fence, "pod-a").await.unwrap(), 1);
    assert_eq!(store.release(&old).await.unwrap(), Released::Released);

    let new = store.acquire("sched", "pod-b", TTL).await.unwrap();
    assert!(new.epoch() > old.epoch(), "invariant 1: epochs increase");
    let events_before = db.scalar("SELECT count(*) FROM pgfence.task_events").await;
    let stale = [
        (
            "append_event",
            store
                .tasks()
                .append_event(&fence, "job-1", "late", &json!({}))
                .await
                .map(|_| ()),
        ),
        (
            "move_shard",
            move_shard(store, &fence, "pod-a").await.map(|_| ()),
        ),
    ];
    for (operation, result) in &stale {
        match result {
            Err(Error::Stale {
                lease,
                presented,
                current,
                reason,
                operation: op,
            }) => {
                assert_eq!(lease, &old.qualified_name());
                assert_eq!(*presented, old.epoch());
                assert_eq!(*current, Some(new.epoch()));
                assert_eq!(*reason, LossReason::Superseded);
                assert_eq!(op, operation);
            }
            other => panic!("{operation}: expected Stale, got {other:?}"),
        }
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.task_events").await,
        events_before,
        "a refused write wrote nothing"
    );
    let owner: String = db
        .client()
        .await
        .query_one("SELECT owner FROM shards WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(owner, "pod-a");
    let mut filter = RejectionFilter::default();
    filter.lease = Some("sched".into());
    let audit = store.admin().rejections(&filter).await.unwrap();
    let mut audited: Vec<(&str, i64)> = audit
        .iter()
        .map(|r| (r.operation.as_str(), r.presented_epoch))
        .collect();
    audited.sort();
    let presented = old.epoch().get();
    assert_eq!(
        audited,
        [("append_event", presented), ("move_shard", presented)],
        "invariant 4: each stale write audited"
    );

    // Concurrent writers, each on a pooled connection of its own, every write acknowledged and committed.
    let fence = new.fence();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (store, fence) = (store.clone(), fence.clone());
        writers.push(tokio::spawn(async move {
            let key = format!("w{w}");
            store
                .tasks()
                .create(&fence, &key, &json!({}))
                .await
                .unwrap();
            for i in 0..WRITES {
                store
                    .tasks()
                    .append_event(&fence, &key, "tick", &json!({ "i": i }))
                    .await
                    .unwrap();
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM pgfence.task_events e JOIN pgfence.tasks t ON t.id = e.task_id \
             WHERE t.key LIKE 'w%' AND e.kind = 'tick'"
        )
        .await,
        (WRITERS * WRITES) as i64
    );
    store.release(&new).await.unwrap();
}

// ------------------------------------------------------------------------------------------------------------
// Session mode.

/// Through a session-mode PgBouncer, with no pooler option: connect, migrate a fresh database through it, and
/// every operation is correct. Neither pgfence's log nor PgBouncer's shows the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_needs_no_option() {
    let Some(binary) = pgbouncer_or_skip() else {
        return;
    };
    let db = TestDb::empty().await;
    let bouncer = Bouncer::start(&binary, &db, PoolMode::Session, 20, None).await;
    let store = Store::connect(
        StoreConfig::new(bouncer.url(&db.url), &db.name)
            .pool_size(WRITERS as u32)
            .checkout_timeout(Duration::from_secs(10)),
    )
    .await
    .unwrap();
    assert!(store
        .admin()
        .target()
        .ends_with(&format!(":{}/{}", bouncer.port, db.name)));
    assert!(
        !store.migrate().await.unwrap().is_empty(),
        "migrated through the pooler"
    );
    every_operation_is_correct(&store, &db).await;

    let password = common::url_with_password(&db.url, "unused").1;
    assert!(!logs().contains(&password), "the password in pgfence's log");
    assert!(
        !bouncer.log().contains(&password),
        "the password in PgBouncer's log"
    );
    assert!(
        bouncer.log().contains("login attempt"),
        "clients went through PgBouncer"
    );
}

/// Through a session-mode PgBouncer the elector's LISTEN connection works: a waiting candidate is woken by the
/// release notification, long before its 5 s poll. Prints the handover time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_carries_listen() {
    let Some(binary) = pgbouncer_or_skip() else {
        return;
    };
    let db = TestDb::new().await;
    let bouncer = Bouncer::start(&binary, &db, PoolMode::Session, 20, None).await;
    let config = || StoreConfig::new(bouncer.url(&db.url), &db.name);
    let handover = handover(&db, config, Duration::from_secs(5), true).await;
    assert!(
        handover.woken_before_the_timer,
        "woken by NOTIFY: {handover:?}"
    );
    eprintln!(
        "session-mode PgBouncer, LISTEN through it: release to new leader {:?}",
        handover.release_to_start
    );
}

// ------------------------------------------------------------------------------------------------------------
// Transaction mode.

/// The settings that make a transaction-mode PgBouncer behave like Debian bookworm's 1.18, whatever the version
/// installed: no prepared statement is kept (1.21 and later: `max_prepared_statements = 0`).
fn losing_prepared_statements(binary: &Path) -> Option<u32> {
    can_keep_prepared_statements(binary).then_some(0)
}

/// Through a transaction-mode PgBouncer that keeps no prepared statement (1.18, or `max_prepared_statements =
/// 0`), with several server connections, diesel-async fails — with its statement cache and without it:
/// statements it prepares in one round trip and runs in the next land on another server session ("prepared
/// statement \"s…\" does not exist", or, where another client's statement of the same name lives there, an
/// "unexpected message from server"), and so do those of its own connection setup. Only statements inside an
/// explicit transaction with the cache off survive, which pgfence's autocommit statements (acquire, renew,
/// reads, the elector's renewal) are not. Prints the failure counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_mode_without_kept_statements_fails_with_or_without_the_statement_cache() {
    use diesel::connection::CacheSize;
    use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
    diesel::define_sql_function! { fn abs(x: diesel::sql_types::Integer) -> diesel::sql_types::Integer; }

    let Some(binary) = pgbouncer_or_skip() else {
        return;
    };
    let db = TestDb::new().await;
    let prepared = losing_prepared_statements(&binary);
    let bouncer = Bouncer::start(&binary, &db, PoolMode::Transaction, 3, prepared).await;
    let url = bouncer.url(&db.url);
    const CLIENTS: i32 = 8;
    const STATEMENTS: i32 = 100;
    let mut failed = Vec::new();
    for (cache, in_transaction) in [(true, false), (false, false), (false, true)] {
        let mut clients = Vec::new();
        for c in 0..CLIENTS {
            let url = url.clone();
            clients.push(tokio::spawn(async move {
                let mut setups_failed = 0;
                let mut conn = loop {
                    match AsyncPgConnection::establish(&url).await {
                        Ok(conn) => break conn,
                        Err(e) => {
                            assert!(setups_failed < 1000, "no connection set up: {e}");
                            setups_failed += 1;
                        }
                    }
                };
                if !cache {
                    conn.set_prepared_statement_cache_size(CacheSize::Disabled);
                }
                let mut failures = 0;
                for i in 0..STATEMENTS {
                    let query = diesel::select(abs(c * STATEMENTS + i));
                    let result: Result<i32, diesel::result::Error> = if in_transaction {
                        conn.build_transaction()
                            .read_committed()
                            .run(async move |conn: &mut AsyncPgConnection| {
                                query.get_result(conn).await
                            })
                            .await
                    } else {
                        query.get_result(&mut conn).await
                    };
                    match result {
                        Ok(n) => assert_eq!(n, c * STATEMENTS + i),
                        Err(e) => {
                            // The same cause seen two ways: the statement is missing on the server session
                            // it landed on, or a same-named statement of another client answers there with
                            // rows the driver did not ask for.
                            let text = e.to_string();
                            assert!(
                                text.contains("prepared statement")
                                    || text.contains("unexpected message from server"),
                                "unexpected failure: {e}"
                            );
                            failures += 1;
                        }
                    }
                }
                (setups_failed, failures)
            }));
        }
        let (mut setups, mut failures) = (0, 0);
        for client in clients {
            let (s, f) = client.await.unwrap();
            setups += s;
            failures += f;
        }
        eprintln!(
            "transaction-mode PgBouncer, 3 server connections, {CLIENTS} clients × {STATEMENTS} statements, \
             statement cache {}, {}: {failures} statements failed, {setups} connection setups failed",
            if cache { "on" } else { "off" },
            if in_transaction {
                "each in BEGIN … COMMIT"
            } else {
                "autocommit"
            },
        );
        failed.push(failures);
    }
    assert!(failed[0] > 0, "statement cache on: statements fail");
    assert!(
        failed[1] > 0,
        "statement cache off, autocommit: statements still fail"
    );
    assert_eq!(
        failed[2], 0,
        "statement cache off, in transactions: none fails"
    );
}

/// `Store::connect` declared behind a transaction-mode pooler checks that a statement it prepared survives the
/// pooler lending its connection another server session; PgBouncer 1.18 (or `max_prepared_statements = 0`)
/// fails that check, every time, and the error says why and what to do — without the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_mode_without_kept_statements_is_refused_at_connect() {
    let Some(binary) = pgbouncer_or_skip() else {
        return;
    };
    let db = TestDb::new().await;
    let prepared = losing_prepared_statements(&binary);
    let bouncer = Bouncer::start(&binary, &db, PoolMode::Transaction, 4, prepared).await;
    let password = common::url_with_password(&db.url, "unused").1;
    for _ in 0..3 {
        let refused = Store::connect(
            StoreConfig::new(bouncer.url(&db.url), "c").pooler(PoolerMode::Transaction),
        )
        .await
        .unwrap_err();
        let text = refused.to_string();
        assert!(matches!(refused, Error::Connect { .. }), "{refused:?}");
        assert!(text.contains("did not survive the pooler"), "{text}");
        assert!(text.contains("max_prepared_statements"), "{text}");
        assert!(!text.contains(&password), "{text}");
    }
}

/// How many server connections a transaction-mode PgBouncer may open for the tests that run pgfence through
/// it, and its `max_prepared_statements`. From 1.21 on: several, with statements kept. On 1.18: one server
/// session for the database, which all of this process's connections share transaction by transaction — the
/// only transaction-mode configuration of 1.18 in which a statement survives (tokio-postgres names statements
/// uniquely within one process; a second process would collide with "prepared statement already exists").
/// Enough to prove what does not depend on the prepared statements: pgfence keeps no session state between
/// transactions, and the LISTEN and migration stance.
fn transaction_pool(binary: &Path) -> (u32, Option<u32>) {
    if can_keep_prepared_statements(binary) {
        (3, Some(100))
    } else {
        (1, None)
    }
}

/// Through a transaction-mode PgBouncer whose statements survive (see [`transaction_pool`]): `migrate` is
/// refused without a direct URL (its lock and `search_path` are session state) and applies through
/// `direct_url`; every operation is correct, with the store's connections multiplexed onto the pooler's server
/// sessions transaction by transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_mode_runs_every_operation_and_migrates_through_the_direct_url() {
    let Some(binary) = pgbouncer_or_skip() else {
        return;
    };
    let db = TestDb::empty().await;
    let (server_conns, prepared) = transaction_pool(&binary);
    let bouncer = Bouncer::start(&binary, &db, PoolMode::Transaction, server_conns, prepared).await;
    let config = || {
        StoreConfig::new(bouncer.url(&db.url), &db.name)
            .pooler(PoolerMode::Transaction)
            .pool_size(WRITERS as u32)
            .checkout_timeout(Duration::from_secs(10))
    };

    let pooled_only = Store::connect(config()).await.unwrap();
    match pooled_only.migrate().await {
        Err(Error::Migration { reason, .. }) => assert!(reason.contains("direct_url"), "{reason}"),
        other => panic!("expected a refused migration, got {other:?}"),
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM pg_namespace WHERE nspname = 'pgfence'")
            .await,
        0,
        "nothing migrated"
    );

    let store = Store::connect(config().direct_url(db.url.clone()))
        .await
        .unwrap();
    assert!(
        !store.migrate().await.unwrap().is_empty(),
        "migrated over the direct URL"
    );
    assert!(
        store.migrate().await.unwrap().is_empty(),
        "migrating again is a no-op"
    );
    every_operation_is_correct(&store, &db).await;
}

/// Behind a transaction-mode pooler without a direct URL, pgfence opens no LISTEN connection and says so at
/// info level; a waiting candidate takes over by polling: at its timer (poll_every, up to 10 % jitter), not
/// before. Prints the handover time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_mode_without_a_direct_url_hands_over_by_polling() {
    let Some(binary) = pgbouncer_or_skip() else {
        return;
    };
    let db = TestDb::new().await;
    let (server_conns, prepared) = transaction_pool(&binary);
    let bouncer = Bouncer::start(&binary, &db, PoolMode::Transaction, server_conns, prepared).await;
    let config =
        || StoreConfig::new(bouncer.url(&db.url), &db.name).pooler(PoolerMode::Transaction);
    let poll_every = Duration::from_secs(1);
    let handover = handover(&db, config, poll_every, false).await;

    assert!(
        !handover.woken_before_the_timer,
        "no notification: {handover:?}"
    );
    assert!(
        handover.refusal_to_start >= poll_every
            && handover.refusal_to_start < poll_every.mul_f64(1.1) + Duration::from_millis(500),
        "by polling, within poll_every (+10 % jitter) and a margin: {handover:?}"
    );
    let said = logs().lines().any(|line| {
        line.contains(" INFO ")
            && line.contains(&format!("/{}", db.name))
            && line.contains("no LISTEN connection, electors learn of released leases by polling")
    });
    assert!(said, "the info log line: {}", logs());
    let listening = db
        .scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND query = 'LISTEN pgfence_lease_free'",
        )
        .await;
    assert_eq!(listening, 0, "nothing LISTENs");
    eprintln!(
        "transaction-mode PgBouncer, no direct URL, poll_every {poll_every:?}: release to new leader {:?}",
        handover.release_to_start
    );
}

/// Behind a transaction-mode pooler with a direct URL, the elector LISTENs over it (and says so): a waiting
/// candidate is woken by the release notification, long before its 5 s poll. Prints the handover time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_mode_listens_on_the_direct_url() {
    let Some(binary) = pgbouncer_or_skip() else {
        return;
    };
    let db = TestDb::new().await;
    let (server_conns, prepared) = transaction_pool(&binary);
    let bouncer = Bouncer::start(&binary, &db, PoolMode::Transaction, server_conns, prepared).await;
    let config = || {
        StoreConfig::new(bouncer.url(&db.url), &db.name)
            .pooler(PoolerMode::Transaction)
            .direct_url(db.url.clone())
    };
    let handover = handover(&db, config, Duration::from_secs(5), true).await;
    assert!(
        handover.woken_before_the_timer,
        "woken by NOTIFY: {handover:?}"
    );
    let said = logs().lines().any(|line| {
        line.contains(" INFO ")
            && line.contains(&format!("/{}", db.name))
            && line.contains("LISTEN and migrations use the direct URL")
    });
    assert!(said, "the info log line: {}", logs());
    eprintln!(
        "transaction-mode PgBouncer, LISTEN on the direct URL: release to new leader {:?}",
        handover.release_to_start
    );
}

/// The direct URL must reach the database the pool reaches: one pointing elsewhere is refused before anything
/// is migrated there (no pooler needed to show it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_url_to_another_database_is_refused() {
    install_log_capture();
    let db = TestDb::new().await;
    let elsewhere = TestDb::empty().await;
    let store =
        Store::connect(StoreConfig::new(db.url.clone(), "c").direct_url(elsewhere.url.clone()))
            .await
            .unwrap();
    match store.migrate().await {
        Err(Error::WrongDatabase { what, .. }) => assert_eq!(what, "database"),
        other => panic!("expected WrongDatabase, got {other:?}"),
    }
    assert_eq!(
        elsewhere
            .scalar("SELECT count(*) FROM pg_namespace WHERE nspname = 'pgfence'")
            .await,
        0,
        "nothing migrated there"
    );
}

// ------------------------------------------------------------------------------------------------------------
// Handover.

/// An elector that reports every refused acquisition, so that a test learns that a candidate is waiting instead
/// of guessing with a sleep.
#[derive(Clone)]
struct Watched {
    inner: PgElector,
    refused: mpsc::UnboundedSender<(Instant, Duration)>,
}

impl Elector for Watched {
    fn qualify(&self, name: &str) -> String {
        self.inner.qualify(name)
    }

    async fn acquire(
        &self,
        name: &str,
        holder: &str,
        options: &LeaseOptions,
    ) -> pgfence::Result<HeldLease> {
        let result = self.inner.acquire(name, holder, options).await;
        if let Err(Error::Held { expires_in, .. }) = &result {
            let _ = self.refused.send((Instant::now(), *expires_in));
        }
        result
    }

    async fn acquisition_turn(&self) -> AcquisitionTurn {
        self.inner.acquisition_turn().await
    }

    fn wakeups(&self) -> Wakeups {
        self.inner.wakeups()
    }

    async fn health(&self) -> Health {
        self.inner.health().await
    }
    async fn join(
        &self,
        group: &str,
        member: &str,
        spec: &pgfence::groups::MemberSpec,
        options: &LeaseOptions,
    ) -> pgfence::Result<pgfence::leader::Membership> {
        self.inner.join(group, member, spec, options).await
    }

    async fn assigned(
        &self,
        membership: &pgfence::leader::Membership,
    ) -> pgfence::Result<pgfence::leader::Assigned> {
        self.inner.assigned(membership).await
    }

    async fn rebalance(
        &self,
        membership: &pgfence::leader::Membership,
    ) -> pgfence::Result<pgfence::groups::Rebalance> {
        self.inner.rebalance(membership).await
    }

    async fn in_doubt(&self, name: &str) -> pgfence::Result<Vec<pgfence::effects::InDoubt>> {
        self.inner.in_doubt(name).await
    }

    async fn handover_gap(&self, name: &str, epoch: pgfence::Epoch) -> Option<Duration> {
        self.inner.handover_gap(name, epoch).await
    }
}

#[derive(Debug)]
struct Handover {
    /// From the holder's release to the new leader's callback start.
    release_to_start: Duration,
    /// From the candidate's refused attempt to its callback start.
    refusal_to_start: Duration,
    /// Whether the candidate started before its timer (min(time left, poll_every) after its refusal) could
    /// have woken it: only a release notification wakes it earlier.
    woken_before_the_timer: bool,
}

/// One graceful handover on `db`: a holder on a store of `config` holds "sched"; a candidate on another store of
/// `config` campaigns with `poll_every` and is refused; once the candidate's elector LISTENs (when `listens`),
/// the holder releases.
async fn handover(
    db: &TestDb,
    config: impl Fn() -> StoreConfig,
    poll_every: Duration,
    listens: bool,
) -> Handover {
    let mut options = LeadershipOptions::new(TTL);
    options.poll_every = poll_every;
    let holder = PgElector::new(Store::connect(config()).await.unwrap());
    let (refused_tx, mut refused_rx) = mpsc::unbounded_channel();
    let candidate = Watched {
        inner: PgElector::new(Store::connect(config()).await.unwrap()),
        refused: refused_tx,
    };
    let held = holder
        .acquire("sched", "old", &options.lease)
        .await
        .unwrap();
    let (started_tx, started_rx) = oneshot::channel::<Instant>();
    let run = tokio::spawn(async move {
        run_with_leadership(
            &candidate,
            "sched",
            "new",
            &options,
            &CancellationToken::new(),
            move |_ctx| async move {
                started_tx.send(Instant::now()).unwrap();
                Ok::<_, Error>(())
            },
        )
        .await
    });
    let (refused_at, expires_in) = refused_rx.recv().await.expect("the candidate campaigns");
    if listens {
        // The candidate's elector opens its LISTEN connection when it first waits.
        let deadline = Instant::now() + Duration::from_secs(5);
        while db
            .scalar(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND query = 'LISTEN pgfence_lease_free' \
                   AND state = 'idle'",
            )
            .await
            == 0
        {
            assert!(Instant::now() < deadline, "a LISTEN connection within 5 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let timer = refused_at + expires_in.min(poll_every);
    let released_at = Instant::now();
    assert_eq!(held.release().await.unwrap(), Released::Released);
    let started = tokio::time::timeout(poll_every * 3, started_rx)
        .await
        .expect("the candidate took over")
        .unwrap();
    assert!(matches!(run.await.unwrap().unwrap(), Ended::Returned));
    Handover {
        release_to_start: started - released_at,
        refusal_to_start: started - refused_at,
        woken_before_the_timer: started < timer,
    }
}

// ------------------------------------------------------------------------------------------------------------
// Cost.

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A store on `url` over a pool of the application's own (diesel-async's default connection setup, no ping on
/// checkout, as `Store::connect` builds it), with diesel-async's prepared statement cache on or off.
async fn store_with_statement_cache(url: &str, size: u32, cache: bool) -> Store {
    use diesel::connection::CacheSize;
    use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
    use diesel_async::{AsyncConnection, AsyncPgConnection};
    let mut manager_config = ManagerConfig::default();
    manager_config.custom_setup = Box::new(move |url| {
        Box::pin(async move {
            let mut conn = AsyncPgConnection::establish(url).await?;
            if !cache {
                conn.set_prepared_statement_cache_size(CacheSize::Disabled);
            }
            Ok(conn)
        })
    });
    let manager =
        AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(url, manager_config);
    let pool = bb8::Pool::builder()
        .max_size(size)
        .test_on_check_out(false)
        .build(manager)
        .await
        .unwrap();
    Store::from_pool(pool, "c", pgfence::ExpectedIdentity::default())
        .await
        .unwrap()
}

/// Measured, not asserted: what diesel-async's prepared statement cache is worth on guarded writes
/// (`append_event`, 4 writers), directly to the server, and what a session-mode PgBouncer costs; every variant
/// in each round, rounds interleaved, medians of per-round ratios to the store as built.
/// `PGFENCE_MEASURE_ROUNDS=9 cargo test --test pgbouncer measure_statement_cache_cost -- --ignored --nocapture`
/// (debug build; `PGFENCE_MEASURE_SECS` per variant and round, default 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_statement_cache_cost() {
    let Some(binary) = pgbouncer_or_skip() else {
        return;
    };
    let rounds = env_number("PGFENCE_MEASURE_ROUNDS", 7) as usize;
    let secs = Duration::from_secs(env_number("PGFENCE_MEASURE_SECS", 3));
    let writers = 4;
    let db = TestDb::new().await;
    let bouncer = Bouncer::start(&binary, &db, PoolMode::Session, 20, None).await;
    let as_built = |url: String| async move {
        Store::connect(StoreConfig::new(url, "c").pool_size(writers as u32))
            .await
            .unwrap()
    };
    let mut variants: Vec<(&str, Store, Vec<f64>)> = vec![
        (
            "direct, as built (cache on)",
            as_built(db.url.clone()).await,
            Vec::new(),
        ),
        (
            "direct, own pool, cache on",
            store_with_statement_cache(&db.url, writers as u32, true).await,
            Vec::new(),
        ),
        (
            "direct, own pool, cache off",
            store_with_statement_cache(&db.url, writers as u32, false).await,
            Vec::new(),
        ),
        (
            "session-mode PgBouncer, as built",
            as_built(bouncer.url(&db.url)).await,
            Vec::new(),
        ),
    ];
    let fence = variants[0]
        .1
        .acquire("hot", "leader", Duration::from_secs(3600))
        .await
        .unwrap()
        .fence();
    for (_, store, _) in &variants {
        guarded_writes_per_second(store, &fence, writers, Duration::from_millis(500)).await;
    }
    for _ in 0..rounds {
        for (_, store, rates) in variants.iter_mut() {
            rates.push(guarded_writes_per_second(store, &fence, writers, secs).await);
        }
    }
    // Per round, each variant's rate divided by a reference's (rounds are paired: the load of the machine moves
    // between rounds more than within one), then the median over rounds. The like-for-like reference of the
    // cache off is the same pool with the cache on.
    let as_built = variants[0].2.clone();
    let own_pool = variants[1].2.clone();
    let ratio = |rates: &[f64], base: &[f64]| {
        let mut ratios: Vec<f64> = rates.iter().zip(base).map(|(r, b)| r / b).collect();
        median(&mut ratios)
    };
    eprintln!(
        "guarded writes (append_event), {writers} writers, {rounds} interleaved rounds of {secs:?} \
         (medians of per-round ratios):"
    );
    for (label, _, rates) in variants.iter_mut() {
        eprintln!(
            "  {label:<34} {:7.0} writes/s   ÷ as built {:.3}   ÷ own pool, cache on {:.3}",
            median(&mut rates.clone()),
            ratio(rates, &as_built),
            ratio(rates, &own_pool),
        );
    }
}
