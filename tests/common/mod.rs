//! Test support shared by the integration suites: one throwaway PostgreSQL server per test binary (or the
//! server `DATABASE_URL` points at), and one fresh database per test, cloned from a template database that was
//! migrated once.
#![allow(dead_code)]

pub mod fixture;
pub mod native;
pub mod proxy;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use pgfence::embedded::EmbeddedServer;
use pgfence::{Store, StoreConfig};

struct Base {
    /// Keeps the embedded server alive for the whole test binary; its watchdog removes it at exit.
    _server: Option<EmbeddedServer>,
    /// URL of the maintenance database on the server.
    admin_url: String,
    template: String,
}

static BASE: OnceLock<Base> = OnceLock::new();

/// The `pgfence` command-line binary (the workspace member `cli/`), for library suites that also check what an
/// operator sees. Cargo gives `CARGO_BIN_EXE_*` only to the package that owns a binary, so it is built here, once
/// per test process, by the cargo that runs the tests (a no-op when it is up to date) and in the same profile;
/// its path comes from cargo's JSON messages, never from a guess that could pick a stale file.
pub fn pgfence_bin() -> &'static std::path::Path {
    static BIN: OnceLock<std::path::PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut command = std::process::Command::new(cargo);
        command
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["build", "--quiet", "-p", "pgfence-cli", "--bin", "pgfence"])
            .arg("--message-format=json-render-diagnostics");
        if !cfg!(debug_assertions) {
            command.arg("--release");
        }
        let output = command
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run cargo to build the pgfence binary");
        assert!(output.status.success(), "cargo build -p pgfence-cli failed");
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|message| message["reason"] == "compiler-artifact")
            .filter(|message| message["target"]["name"] == "pgfence")
            .find_map(|message| message["executable"].as_str().map(std::path::PathBuf::from))
            .expect("cargo reported no pgfence executable")
    })
}
static NEXT_DB: AtomicUsize = AtomicUsize::new(0);

/// Replaces the user and password of a `postgres://` URL with `user:password` (both inserted as given, so they
/// must not need percent-encoding).
pub fn url_with_credentials(url: &str, user: &str, password: &str) -> String {
    let (scheme, rest) = url
        .split_once("://")
        .expect("DATABASE_URL must be a postgres:// URL");
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let host_start = rest[..authority_end].rfind('@').map_or(0, |at| at + 1);
    format!("{scheme}://{user}:{password}@{}", &rest[host_start..])
}

/// `url` with a password in it, and that password — the one that must never show up in output: the URL's own
/// (the embedded server's random one), or else `sentinel`, put into the URL (a server that asks for no password
/// ignores it).
pub fn url_with_password(url: &str, sentinel: &str) -> (String, String) {
    let config: tokio_postgres::Config = url.parse().expect("a valid connection URL");
    match config.get_password() {
        Some(password) => (
            url.to_owned(),
            String::from_utf8_lossy(password).into_owned(),
        ),
        None => (
            url_with_credentials(url, config.get_user().unwrap_or("postgres"), sentinel),
            sentinel.to_owned(),
        ),
    }
}

fn base() -> &'static Base {
    BASE.get_or_init(|| {
        let (server, admin_url) = match std::env::var("DATABASE_URL") {
            Ok(url) if !url.is_empty() => (None, url),
            _ => {
                let mut options = pgfence::embedded::EmbeddedOptions::default();
                // A copy of the server's installation with the native guard built from native/ (no `make
                // install`): every test server can create the extension. Without it, the tests that need it skip.
                match native::install() {
                    Ok(install) => options.bin_dir = Some(install.bin_dir.clone()),
                    Err(why) if native_everywhere() => {
                        panic!("PGFENCE_TEST_NATIVE=1, but the native guard cannot be built: {why}")
                    }
                    Err(_) => {}
                }
                // A build of pgfence_native other than the installed one (the mutation gate's): found first.
                if let Some(dir) = std::env::var("PGFENCE_NATIVE_LIB_DIR")
                    .ok()
                    .filter(|d| !d.is_empty())
                {
                    options
                        .extra_settings
                        .push(("dynamic_library_path".into(), format!("{dir}:$libdir")));
                }
                let server = EmbeddedServer::start_with(options)
                    .expect("start a throwaway PostgreSQL server");
                let url = server.url();
                (Some(server), url)
            }
        };
        let template = format!("pgfence_tpl_{}", std::process::id());
        // Migrate the template on a runtime of its own, on a thread of its own: the caller is usually a test's
        // runtime, which must not be blocked on from inside.
        let (url, tpl, embedded) = (admin_url.clone(), template.clone(), server.is_some());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                if embedded {
                    check_pg_bin_server(&url).await;
                }
                admin_exec(&url, &format!("CREATE DATABASE {tpl}")).await;
                let store = Store::connect(StoreConfig::new(
                    pgfence::connection::with_database(&url, &tpl),
                    "tpl",
                ))
                .await
                .expect("connect to the template database");
                store
                    .migrate()
                    .await
                    .expect("migrate the template database");
                if native_everywhere() {
                    admin_exec(&pgfence::connection::with_database(&url, &tpl), NATIVE_SQL).await;
                }
                apply_mutant(&pgfence::connection::with_database(&url, &tpl)).await;
            });
            // Dropping the runtime closes every connection to the template, which CREATE DATABASE … TEMPLATE
            // needs.
        })
        .join()
        .expect("template setup");
        Base {
            _server: server,
            admin_url,
            template,
        }
    })
}

/// `PG_BIN` decides the server the tests run: the server started for this test binary must be the version of
/// `$PG_BIN/postgres` (a copy of another installation — the native guard's build against a `pg_config` of another
/// version — would silently test that version instead). Panics, saying both versions, when it is not.
async fn check_pg_bin_server(url: &str) {
    let Some(pg_bin) = std::env::var_os("PG_BIN").filter(|v| !v.is_empty()) else {
        return;
    };
    let postgres = std::path::Path::new(&pg_bin).join("postgres");
    let out = std::process::Command::new(&postgres)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("PG_BIN: {} --version: {e}", postgres.display()));
    // "postgres (PostgreSQL) 18.4" (Debian's adds " (Debian 15.14-0+deb12u1)").
    let wanted = String::from_utf8_lossy(&out.stdout)
        .split(") ")
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .unwrap_or_default()
        .to_owned();
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to the test server");
    let driver = tokio::spawn(connection);
    let running: String = client
        .query_one(
            "SELECT split_part(current_setting('server_version'), ' ', 1)",
            &[],
        )
        .await
        .expect("server_version")
        .get(0);
    drop(client);
    let _ = driver.await;
    assert_eq!(
        running,
        wanted,
        "PG_BIN={} is PostgreSQL {wanted}, but the test server runs {running}",
        postgres.parent().unwrap_or(&postgres).display()
    );
}

/// Whether every test database has the pgfence_native extension (`PGFENCE_TEST_NATIVE=1`): the suites then prove
/// the native guard (stores use it when it is installed). Unset, only the tests that create it themselves use it.
pub fn native_everywhere() -> bool {
    std::env::var("PGFENCE_TEST_NATIVE").is_ok_and(|v| v == "1")
}

/// Creates the pgfence_native extension (native/; the test servers have it when [`native::install`] could build
/// it) in a migrated database, if it is not there yet.
pub const NATIVE_SQL: &str = "CREATE EXTENSION IF NOT EXISTS pgfence_native";

/// Creates the pgfence_native extension in `client`'s database for a test that needs it, and says whether it did:
/// `false` when this run has no native guard (after one line on stderr naming the test and what to install; a
/// failure instead under `PGFENCE_REQUIRE_NATIVE`). Against a server of `DATABASE_URL`, the extension must be
/// installed there.
pub async fn create_native(client: &tokio_postgres::Client) -> bool {
    let external = std::env::var("DATABASE_URL").is_ok_and(|url| !url.is_empty());
    if !external {
        let thread = std::thread::current();
        if native::for_test(thread.name().unwrap_or("a test")).is_none() {
            return false;
        }
    }
    client
        .batch_execute(NATIVE_SQL)
        .await
        .expect("CREATE EXTENSION pgfence_native");
    true
}

/// The mutation hook of the proofs: when `PGFENCE_MUTANT_SQL` names a file, its SQL (typically a `CREATE OR
/// REPLACE FUNCTION` of a deliberately weakened copy of a pgfence function) is run on a freshly migrated
/// database, so a suite can be shown to fail on the weakened protocol without rebuilding anything. Unset in
/// normal runs.
pub async fn apply_mutant(url: &str) {
    let Ok(path) = std::env::var("PGFENCE_MUTANT_SQL") else {
        return;
    };
    if path.is_empty() {
        return;
    }
    let sql =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("PGFENCE_MUTANT_SQL={path}: {e}"));
    admin_exec(url, &sql).await;
    eprintln!("mutant applied: {path}");
}

/// Runs one statement on the server's maintenance database.
pub async fn admin_exec(admin_url: &str, sql: &str) {
    let (client, connection) = tokio_postgres::connect(admin_url, tokio_postgres::NoTls)
        .await
        .expect("connect to the maintenance database");
    let driver = tokio::spawn(connection);
    client
        .batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    drop(client);
    let _ = driver.await;
}

/// A fresh, migrated database for one test.
#[derive(Debug, Clone)]
pub struct TestDb {
    pub url: String,
    pub name: String,
}

impl TestDb {
    /// Clones the migrated template into a new database.
    pub async fn new() -> TestDb {
        let base = base();
        let name = format!(
            "pgfence_t{}_{}",
            std::process::id(),
            NEXT_DB.fetch_add(1, Ordering::Relaxed)
        );
        admin_exec(
            &base.admin_url,
            &format!("CREATE DATABASE {name} TEMPLATE {}", base.template),
        )
        .await;
        TestDb {
            url: pgfence::connection::with_database(&base.admin_url, &name),
            name,
        }
    }

    /// A new, empty database without the pgfence schema.
    pub async fn empty() -> TestDb {
        let base = base();
        let name = format!(
            "pgfence_e{}_{}",
            std::process::id(),
            NEXT_DB.fetch_add(1, Ordering::Relaxed)
        );
        admin_exec(&base.admin_url, &format!("CREATE DATABASE {name}")).await;
        TestDb {
            url: pgfence::connection::with_database(&base.admin_url, &name),
            name,
        }
    }

    /// The server's TCP port.
    pub fn port(&self) -> u16 {
        let authority = self
            .url
            .split("://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_default();
        authority
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a port in the URL")
    }

    /// A store on this database for `cluster`.
    pub async fn store(&self, cluster: &str) -> Store {
        Store::connect(self.config(cluster))
            .await
            .expect("connect store")
    }

    /// The default configuration for this database.
    pub fn config(&self, cluster: &str) -> StoreConfig {
        StoreConfig::new(self.url.clone(), cluster)
            .pool_size(8)
            .checkout_timeout(Duration::from_secs(10))
    }

    /// A plain tokio-postgres client, for raw SQL and for holding transactions open.
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .expect("connect raw client");
        tokio::spawn(connection);
        client
    }

    /// One bigint from a query.
    pub async fn scalar(&self, sql: &str) -> i64 {
        self.client()
            .await
            .query_one(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .get(0)
    }
}

/// A transaction of the test's own holding a lease row's lock, as a takeover or a renewal in flight would: an
/// acquisition or renewal of that lease waits for it, so the statement is *sent* well before the database runs
/// it and reads its clock.
pub struct RowLock(tokio_postgres::Client);

impl RowLock {
    pub async fn take(db: &TestDb, qualified: &str) -> RowLock {
        let client = db.client().await;
        client.batch_execute("BEGIN").await.unwrap();
        let locked = client
            .execute(
                "SELECT 1 FROM pgfence.leases WHERE name = $1 FOR UPDATE",
                &[&qualified],
            )
            .await
            .unwrap();
        assert_eq!(locked, 1, "no lease row {qualified}");
        RowLock(client)
    }

    pub async fn release(self) {
        self.0.batch_execute("COMMIT").await.unwrap();
    }
}

/// Where the database's expiry of a held lease falls on this process's monotonic clock, without comparing two
/// clocks: the database computes the time left (`expires_at - clock_timestamp()`, exact to the microsecond) when
/// it runs the query, which is after the query was sent and before its answer arrived.
#[derive(Debug, Clone, Copy)]
pub struct Expiry {
    /// The expiry is no earlier than this (send time + time left).
    pub not_before: std::time::Instant,
    /// The expiry is no later than this (answer time + time left).
    pub not_after: std::time::Instant,
}

/// Locates the database's expiry of the held lease `qualified` on this process's monotonic clock.
pub async fn database_expiry(client: &tokio_postgres::Client, qualified: &str) -> Expiry {
    let sent = std::time::Instant::now();
    let left_us: i64 = client
        .query_one(
            "SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint \
               FROM pgfence.leases WHERE name = $1 AND state = 'held'",
            &[&qualified],
        )
        .await
        .unwrap()
        .get(0);
    let answered = std::time::Instant::now();
    assert!(left_us > 0, "{qualified} already expired");
    let left = Duration::from_micros(left_us as u64);
    Expiry {
        not_before: sent + left,
        not_after: answered + left,
    }
}

/// Backends of `client`'s database waiting for a lock (`wait_event_type = 'Lock'` in pg_stat_activity).
pub async fn lock_waiters(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
               AND wait_event_type = 'Lock'",
            &[],
        )
        .await
        .expect("read pg_stat_activity")
        .get(0)
}

/// Waits until the number of `client`'s database's backends waiting for a lock satisfies `done`, polling
/// pg_stat_activity for at most `within`; past it, fails saying `what` did not happen. This observes the
/// server's own state instead of guessing with a sleep.
pub async fn wait_for_lock_waiters(
    client: &tokio_postgres::Client,
    within: Duration,
    done: impl Fn(i64) -> bool,
    what: &str,
) {
    let deadline = std::time::Instant::now() + within;
    loop {
        let n = lock_waiters(client).await;
        if done(n) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what} (within {within:?}; {n} backends waiting for a lock)"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Waits until at least `backends` backends of this database are blocked on a lock.
pub async fn wait_until_blocked_on_lock(db: &TestDb, backends: i64) {
    wait_for_lock_waiters(
        &db.client().await,
        Duration::from_secs(20),
        |n| n >= backends,
        "no backend blocked on a lock",
    )
    .await;
}

/// Waits until `lease` (a qualified name) has expired by the database clock — the clock every expiry is judged
/// by — polling, bounded at 20 s.
pub async fn wait_until_expired(client: &tokio_postgres::Client, lease: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while client
        .query_one(
            "SELECT expires_at > clock_timestamp() FROM pgfence.leases WHERE name = $1",
            &[&lease],
        )
        .await
        .expect("read the lease's expiry")
        .get::<_, bool>(0)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{lease} did not expire within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A metrics recorder for tests whose reads do not reset values (tests of one binary run in parallel and
/// share it). Installed once per test binary.
pub mod metrics_probe {
    use std::collections::HashMap;
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Mutex, OnceLock};

    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };
    use metrics_util::registry::{AtomicStorage, Registry};

    struct Probe(Arc<Registry<Key, AtomicStorage>>);

    /// What a metric was described as: its kind (`counter`, `gauge`, `histogram`), unit and help text.
    pub type Description = (&'static str, Option<Unit>, String);

    fn descriptions() -> &'static Mutex<HashMap<String, Description>> {
        static DESCRIPTIONS: OnceLock<Mutex<HashMap<String, Description>>> = OnceLock::new();
        DESCRIPTIONS.get_or_init(Default::default)
    }

    fn describe(kind: &'static str, name: KeyName, unit: Option<Unit>, help: SharedString) {
        descriptions()
            .lock()
            .unwrap()
            .insert(name.as_str().to_owned(), (kind, unit, help.to_string()));
    }

    impl Recorder for Probe {
        fn describe_counter(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
            describe("counter", name, unit, help)
        }
        fn describe_gauge(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
            describe("gauge", name, unit, help)
        }
        fn describe_histogram(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
            describe("histogram", name, unit, help)
        }
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            self.0
                .get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
        }
        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            self.0
                .get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
        }
        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            self.0
                .get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
        }
    }

    fn registry() -> &'static Arc<Registry<Key, AtomicStorage>> {
        static REGISTRY: OnceLock<Arc<Registry<Key, AtomicStorage>>> = OnceLock::new();
        REGISTRY.get_or_init(|| {
            let registry = Arc::new(Registry::atomic());
            metrics::set_global_recorder(Probe(registry.clone()))
                .expect("install the metrics probe");
            registry
        })
    }

    /// Installs the probe (call before the code under test records anything).
    pub fn install() {
        registry();
    }

    fn key(name: &'static str, labels: &[(&'static str, &str)]) -> Key {
        let labels: Vec<metrics::Label> = labels
            .iter()
            .map(|(k, v)| metrics::Label::new(*k, v.to_string()))
            .collect();
        Key::from_parts(name, labels)
    }

    /// A gauge's value, `None` when never set.
    pub fn gauge(name: &'static str, labels: &[(&'static str, &str)]) -> Option<f64> {
        registry()
            .get_gauge_handles()
            .get(&key(name, labels))
            .map(|g| f64::from_bits(g.load(Ordering::SeqCst)))
    }

    /// A counter's value (0 when never incremented).
    pub fn counter(name: &'static str, labels: &[(&'static str, &str)]) -> u64 {
        registry()
            .get_counter_handles()
            .get(&key(name, labels))
            .map(|c| c.load(Ordering::SeqCst))
            .unwrap_or(0)
    }

    /// How the metric `name` was described, if it was.
    pub fn description(name: &str) -> Option<Description> {
        descriptions().lock().unwrap().get(name).cloned()
    }

    /// Every observation of a histogram so far.
    pub fn histogram(name: &'static str, labels: &[(&'static str, &str)]) -> Vec<f64> {
        registry()
            .get_histogram_handles()
            .get(&key(name, labels))
            .map(|h| h.data())
            .unwrap_or_default()
    }
}

/// A well-formed tenure secret that is no tenure's: for fences whose epoch is stale or was never issued (the
/// database refuses those for their epoch before it looks at the secret) and for forgery tests.
#[allow(dead_code)]
pub fn forged_secret() -> pgfence::TenureSecret {
    pgfence::TenureSecret::parse("0".repeat(pgfence::limits::SECRET_LEN)).unwrap()
}

/// A fence for (lease, epoch) with [`forged_secret`].
#[allow(dead_code)]
pub fn forged_fence(lease: &str, epoch: i64) -> pgfence::Fence {
    pgfence::Fence::new(lease, pgfence::Epoch::new(epoch).unwrap(), forged_secret()).unwrap()
}

/// The password of the login roles tests create with [`role`].
#[allow(dead_code)]
pub const ROLE_PASSWORD: &str = "pgfence-test-role";

/// A login role `<database>_<suffix>` (unique to the test's database) with [`ROLE_PASSWORD`], allowed to connect.
#[allow(dead_code)]
pub async fn role(db: &TestDb, suffix: &str) -> String {
    let name = format!("{}_{suffix}", db.name);
    db.client()
        .await
        .batch_execute(&format!(
            "CREATE ROLE {name} LOGIN PASSWORD '{ROLE_PASSWORD}'; \
             GRANT CONNECT ON DATABASE {} TO {name}",
            db.name
        ))
        .await
        .unwrap();
    name
}

/// The test database's URL, logging in as `role` (made by [`role`]).
#[allow(dead_code)]
pub fn url_as(db: &TestDb, role: &str) -> String {
    url_with_credentials(&db.url, role, ROLE_PASSWORD)
}

/// A raw client logged in as `role`, its connection driven on the runtime.
#[allow(dead_code)]
pub async fn client_as(db: &TestDb, role: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&url_as(db, role), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// A client at `url` that LISTENs to `channel`, and the payloads of the notifications it receives, in order.
#[allow(dead_code)]
pub async fn listen(
    url: &str,
    channel: &str,
) -> (
    tokio_postgres::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    use futures_util::StreamExt;
    let (client, mut connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = stream.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN \"{}\"", channel.replace('"', "\"\"")))
        .await
        .unwrap();
    (client, rx)
}

/// A store of `cluster` logged in as `role` (made by [`role`]).
pub async fn store_as(db: &TestDb, role: &str, cluster: &str) -> Store {
    Store::connect(StoreConfig::new(url_as(db, role), cluster))
        .await
        .unwrap()
}

/// A login role `<database>_<suffix>` that may also create schemas in `db`: the documented owner (or a squatter).
pub async fn creator(db: &TestDb, suffix: &str) -> String {
    let name = role(db, suffix).await;
    db.client()
        .await
        .batch_execute(&format!("GRANT CREATE ON DATABASE {} TO {name}", db.name))
        .await
        .unwrap();
    name
}

/// A new, empty database and a non-superuser owner role that may create the schema (the documented layout).
pub async fn owned_db() -> (TestDb, String) {
    let db = TestDb::empty().await;
    let owner = creator(&db, "owner").await;
    (db, owner)
}

/// The median (the upper one of an even count); sorts `values`.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// The median as statistics defines it: the mean of the middle pair for an even count (an even number of
/// paired rounds has no middle round to pick). Sorts `values`.
pub fn midpoint_median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Acquires `lease` for `holder` through SQL (`pgfence.acquire`, as `c`'s role): its epoch and secret.
pub async fn sql_acquire(
    c: &tokio_postgres::Client,
    lease: &str,
    holder: &str,
    ttl_ms: i64,
) -> (i64, String) {
    let row = c
        .query_one(
            "SELECT epoch, secret FROM pgfence.acquire($1, $2, $3) WHERE outcome = 'acquired'",
            &[&lease, &holder, &ttl_ms],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// The lock key of lease `lease` (`pgfence.leases.lock_key`), read through `c`.
pub async fn lock_key(c: &tokio_postgres::Client, lease: &str) -> i32 {
    c.query_one(
        "SELECT lock_key FROM pgfence.leases WHERE name = $1",
        &[&lease],
    )
    .await
    .unwrap()
    .get(0)
}

/// The epochs of `lease` the native guard remembers in `c`'s session (`pgfence_native.remembered`, which only a
/// superuser may call).
pub async fn remembered(c: &tokio_postgres::Client, lease: &str) -> Vec<i64> {
    c.query(
        "SELECT epoch FROM pgfence_native.remembered() WHERE lease = $1",
        &[&lease],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// The SQLSTATE of a driver error, or "" for an error the server did not send (a broken connection).
pub fn sqlstate(err: &tokio_postgres::Error) -> String {
    err.code().map(|c| c.code().to_owned()).unwrap_or_default()
}

/// A loopback port that nothing listens on (bound, read and released at once): connections to it are refused,
/// and a server about to start may listen on it.
pub fn unused_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether a TCP connection to `port` on loopback succeeds within 200 ms: a server listens there.
pub fn port_accepts(port: u16) -> bool {
    let addr = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
    std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// The application's own table of the fenced-transaction tests: which owner each shard belongs to.
pub const SHARDS_TABLE: &str = "CREATE TABLE shards (id int PRIMARY KEY, owner text NOT NULL)";

/// The application's write inside a fenced transaction: shard 1 belongs to `owner` (an upsert on
/// [`SHARDS_TABLE`]); the row count.
pub async fn write_shard_owner(
    conn: &mut diesel_async::AsyncPgConnection,
    owner: String,
) -> Result<usize, diesel::result::Error> {
    use diesel::sql_types::Text;
    use diesel_async::RunQueryDsl;
    diesel::sql_query(
        "INSERT INTO shards VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET owner = EXCLUDED.owner",
    )
    .bind::<Text, _>(owner)
    .execute(conn)
    .await
}

/// A fenced transaction that moves shard 1 to `owner` ([`write_shard_owner`]).
pub async fn move_shard(
    store: &Store,
    fence: &pgfence::Fence,
    owner: &str,
) -> Result<usize, pgfence::Error> {
    let owner = owner.to_owned();
    store
        .fenced(fence, "move_shard", async move |conn| {
            Ok::<_, pgfence::Error>(write_shard_owner(conn, owner).await?)
        })
        .await
}

/// Guarded writes (`Tasks::append_event`, each of `writers` tasks on its own task of one lease) for `duration`:
/// writes per second.
#[allow(dead_code)]
pub async fn guarded_writes_per_second(
    store: &Store,
    fence: &pgfence::Fence,
    writers: usize,
    duration: Duration,
) -> f64 {
    let started = std::time::Instant::now();
    let mut handles = Vec::new();
    for w in 0..writers {
        let (store, fence) = (store.clone(), fence.clone());
        handles.push(tokio::spawn(async move {
            let key = format!("w{w}");
            store
                .tasks()
                .create(&fence, &key, &serde_json::json!({}))
                .await
                .unwrap();
            let mut n = 0u64;
            while started.elapsed() < duration {
                store
                    .tasks()
                    .append_event(&fence, &key, "tick", &serde_json::json!({}))
                    .await
                    .unwrap();
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}
