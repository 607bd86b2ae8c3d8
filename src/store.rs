//! The connection to PostgreSQL: a bb8 pool of diesel-async connections, the identity check that makes sure
//! pgfence writes to the primary it was configured for, and the embedded migrations.

use std::fmt;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::sql_types::{BigInt, Bool, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig, PoolError};
use diesel_async::AsyncPgConnection;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

use crate::error::{error_chain, Error, Result};
use crate::pooler::{self, PoolerMode};
use crate::tls::{redact, Connector};
use crate::validate::validate_cluster;

/// The bb8 pool type pgfence uses; bring your own with [`Store::from_pool`].
pub type Pool = bb8::Pool<AsyncDieselConnectionManager<AsyncPgConnection>>;

/// A connection checked out of the [`Pool`].
pub type PooledConnection<'a> =
    bb8::PooledConnection<'a, AsyncDieselConnectionManager<AsyncPgConnection>>;

/// A pooled connection that is *armed* while a statement is in flight: if it is dropped armed (the caller's
/// future was cancelled or timed out mid-statement), the statement still running on the server is cancelled and
/// the connection is discarded instead of going back to the pool with that statement still running. Disarm it
/// once the statement's result is in.
pub(crate) struct Checked<'a> {
    conn: PooledConnection<'a>,
    armed: bool,
    /// How to reach the server for a cancel request (`None`: an application's pool).
    connector: Option<Arc<Connector>>,
}

impl Checked<'_> {
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }

    /// Disarms once the statement's result is in; when its error ended the session
    /// ([`ends_the_session`](crate::error::ends_the_session)), also marks the connection broken so that bb8
    /// discards it on check-in instead of handing the dead session to the next statement.
    pub(crate) fn settle<T>(&mut self, result: &std::result::Result<T, diesel::result::Error>) {
        self.armed = false;
        if result.as_ref().is_err_and(crate::error::ends_the_session) {
            self.discard_on_check_in();
        }
    }

    /// An error state makes bb8 discard the connection on check-in (diesel-async reports it broken).
    fn discard_on_check_in(&mut self) {
        use diesel_async::TransactionManager;
        diesel_async::AnsiTransactionManager::transaction_manager_status_mut(&mut *self.conn)
            .set_in_error();
    }
}

impl std::ops::Deref for Checked<'_> {
    type Target = AsyncPgConnection;
    fn deref(&self) -> &AsyncPgConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for Checked<'_> {
    fn deref_mut(&mut self) -> &mut AsyncPgConnection {
        &mut self.conn
    }
}

impl Drop for Checked<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let token = self.conn.cancel_token();
        self.discard_on_check_in();
        let connector = self.connector.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                // Over TLS like the connection itself, when it used TLS.
                let cancelled = match connector {
                    Some(connector) => connector.cancel(&token).await,
                    None => crate::tls::cancel_unknown(&token).await,
                };
                if let Err(e) = cancelled {
                    tracing::debug!(error = %e, "cancelling an abandoned statement failed");
                }
            });
        }
    }
}

/// The schema migrations compiled into the crate (the `migrations/` folder).
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// Session advisory lock key held while migrating, so two processes migrating at once take turns.
/// (The ASCII bytes of "pgfence" followed by a version byte.)
const MIGRATION_LOCK_KEY: i64 = 0x7067_6665_6e63_6501;

/// How long [`Store::migrate`] waits for the migration lock unless [`StoreConfig::migration_lock_wait`] says
/// otherwise.
pub const DEFAULT_MIGRATION_LOCK_WAIT: Duration = Duration::from_secs(30);

/// The advisory-lock functions pgfence calls: the migration lock (here), the guard lock and the intent lock (the
/// lease protocol, the guard; the guard probes the intent lock with the session-level pair). The schema owner must
/// be able to execute every one of them; `pgfence._layout_problems()` (000006_roles) checks the same list once the
/// schema exists.
pub const ADVISORY_FUNCTIONS_NEEDED: [&str; 7] = [
    "pg_catalog.pg_advisory_lock(bigint)",
    "pg_catalog.pg_advisory_xact_lock(integer, integer)",
    "pg_catalog.pg_try_advisory_xact_lock(integer, integer)",
    "pg_catalog.pg_advisory_xact_lock_shared(integer, integer)",
    "pg_catalog.pg_try_advisory_xact_lock_shared(integer, integer)",
    "pg_catalog.pg_try_advisory_lock_shared(integer, integer)",
    "pg_catalog.pg_advisory_unlock_shared(integer, integer)",
];

/// What the store expects the database to be. Every field left `None` is not checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpectedIdentity {
    /// The server's system identifier (`pg_control_system()`), which differs between clusters created by
    /// separate `initdb` runs (a physical replica shares it with its primary).
    pub system_identifier: Option<String>,
    /// The pgfence instance id created at migrate time (`pgfence.instance`).
    pub instance_id: Option<String>,
    /// The database name.
    pub database: Option<String>,
}

/// The identity of the database a store talks to, as reported by the server.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct DatabaseIdentity {
    /// The server's system identifier; `None` when the role may not read `pg_control_system()` and the
    /// schema's SECURITY DEFINER helper is not installed yet.
    pub system_identifier: Option<String>,
    /// The current database name.
    pub database: String,
    /// The pgfence instance id created at migrate time; `None` before the first migration.
    pub instance_id: Option<String>,
    /// Whether the server is a standby (`pg_is_in_recovery()`).
    pub in_recovery: bool,
    /// The WAL timeline of the last checkpoint, when readable.
    pub timeline: Option<i64>,
    /// The server version string.
    pub server_version: String,
}

impl DatabaseIdentity {
    /// Compares this identity with what was expected; the first difference is a [`Error::WrongDatabase`].
    ///
    /// # Errors
    ///
    /// [`Error::WrongDatabase`] naming the first field that differs (database, system identifier, instance id, in that order),
    /// with both values. A field the expectation leaves `None` is not compared.
    pub fn verify(&self, expected: &ExpectedIdentity) -> Result<()> {
        fn check(
            what: &'static str,
            expected: &Option<String>,
            actual: &Option<String>,
        ) -> Result<()> {
            match expected {
                Some(want) if Some(want) != actual.as_ref() => Err(Error::WrongDatabase {
                    what,
                    expected: want.clone(),
                    actual: actual.clone().unwrap_or_else(|| "none".to_owned()),
                }),
                _ => Ok(()),
            }
        }
        check("database", &expected.database, &Some(self.database.clone()))?;
        check(
            "system identifier",
            &expected.system_identifier,
            &self.system_identifier,
        )?;
        check("instance id", &expected.instance_id, &self.instance_id)
    }
}

/// How much a gap in the database's role layout matters ([`LayoutProblem`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LayoutSeverity {
    /// pgfence cannot work: migrations and grants refuse to go on.
    Error,
    /// pgfence works, with a residual risk the problem names.
    Warning,
}

/// A gap between the database's advisory-lock and role layout and the hardened one of docs/security.md
/// ([`Store::layout_problems`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct LayoutProblem {
    /// Whether pgfence can work despite it.
    pub severity: LayoutSeverity,
    /// What is missing and what it risks.
    pub problem: String,
    /// The SQL that closes the gap, and who must run it.
    pub fix: String,
}

/// How to reach the database and what to expect of it.
///
/// `Debug` never prints the connection string, only `user@host:port/database`.
#[derive(Clone)]
pub struct StoreConfig {
    url: String,
    cluster: String,
    pool_size: u32,
    ping_on_checkout: bool,
    connect_timeout: Duration,
    checkout_timeout: Duration,
    migration_lock_wait: Duration,
    application_name: String,
    expected: ExpectedIdentity,
    #[cfg(feature = "tls")]
    tls: Option<Arc<rustls::ClientConfig>>,
    pooler: PoolerMode,
    direct_url: Option<String>,
    native_guard: bool,
}

impl fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreConfig")
            .field("target", &redact(&self.url))
            .field("cluster", &self.cluster)
            .field("pool_size", &self.pool_size)
            .field("ping_on_checkout", &self.ping_on_checkout)
            .field("connect_timeout", &self.connect_timeout)
            .field("checkout_timeout", &self.checkout_timeout)
            .field("migration_lock_wait", &self.migration_lock_wait)
            .field("application_name", &self.application_name)
            .field("expected", &self.expected)
            .field("application_tls", &self.has_application_tls())
            .field("pooler", &self.pooler)
            .field("direct", &self.direct_url.as_deref().map(redact))
            .field("native_guard", &self.native_guard)
            .finish()
    }
}

impl StoreConfig {
    /// A configuration for `url` (a `postgres://` URL or a `key=value` connection string) whose leases are
    /// qualified by `cluster` (e.g. `prod-eu-1`): two stores with different clusters never contend, even in one
    /// database.
    pub fn new(url: impl Into<String>, cluster: impl Into<String>) -> Self {
        StoreConfig {
            url: url.into(),
            cluster: cluster.into(),
            pool_size: 16,
            ping_on_checkout: false,
            native_guard: true,
            connect_timeout: Duration::from_secs(5),
            checkout_timeout: Duration::from_secs(5),
            migration_lock_wait: DEFAULT_MIGRATION_LOCK_WAIT,
            application_name: "pgfence".to_owned(),
            expected: ExpectedIdentity::default(),
            #[cfg(feature = "tls")]
            tls: None,
            pooler: PoolerMode::Session,
            direct_url: None,
        }
    }

    fn has_application_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// Secures every connection of the store (the pool, the LISTEN connection, migrations, cancel requests) with
    /// the application's own rustls configuration — its roots, its verifier, its client certificate — instead of
    /// the one pgfence builds from `sslrootcert`, `sslcert` and `sslkey`.
    ///
    /// The connection string's `sslmode` (or `PGSSLMODE`) still decides whether TLS is used: `disable` uses
    /// none, `prefer` falls back to plaintext when the server offers no TLS, and `require`, `verify-ca` and
    /// `verify-full` demand it — and, given here, so does a connection string without `sslmode`. What the
    /// certificate must prove is then this configuration's business alone (its verifier checks the host name or
    /// not). `sslrootcert`, `sslcert` and `sslkey` in the connection string are refused with it
    /// ([`Error::InvalidUrl`]); the environment's are not read. Build the configuration with pgfence's rustls
    /// ([`reexports::rustls`](crate::reexports::rustls)).
    ///
    /// ```no_run
    /// # async fn example(roots: pgfence::reexports::rustls::RootCertStore) -> pgfence::Result<()> {
    /// use std::sync::Arc;
    /// use pgfence::reexports::rustls;
    ///
    /// let provider = Arc::new(rustls::crypto::ring::default_provider());
    /// let tls = rustls::ClientConfig::builder_with_provider(provider)
    ///     .with_safe_default_protocol_versions()
    ///     .expect("ring supports the default versions")
    ///     .with_root_certificates(roots)
    ///     .with_no_client_auth();
    /// let config = pgfence::StoreConfig::new("postgres://app@db.example.com/control", "prod-eu-1")
    ///     .tls(Arc::new(tls));
    /// let store = pgfence::Store::connect(config).await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls(mut self, config: Arc<rustls::ClientConfig>) -> Self {
        self.tls = Some(config);
        self
    }

    fn connector(&self) -> Result<Connector> {
        self.connector_for(&self.url)
    }

    /// A connector for `url` with this configuration's TLS.
    fn connector_for(&self, url: &str) -> Result<Connector> {
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            return Connector::with_tls(url, tls.clone());
        }
        Connector::new(url)
    }

    /// Maximum number of pooled connections (default 16).
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// Whether the pool sends a test query on every check-out, to hand out only connections that answered
    /// (default `false`). It costs a round trip per operation — `pgfence bench` measures it as `update-ping`
    /// against `update` — and without it a connection that broke while idle is found out by the statement that
    /// uses it: that statement fails with a transient error ([`Error::is_transient`]) and the pool discards the
    /// connection. pgfence's own operations then surface the error rather than retry it blindly, because a write
    /// whose connection broke may have committed.
    pub fn ping_on_checkout(mut self, ping: bool) -> Self {
        self.ping_on_checkout = ping;
        self
    }

    /// Whether guarded writes use the `pgfence_native` extension when the database has it (default `true`): its
    /// `pgfence_native.fence` answers exactly as `pgfence.fence` and admits the common case in C, at a fraction of
    /// the server time (docs/performance.md; the extension is in `native/`). `false` always sends the portable
    /// `pgfence.fence`. See [`Store::native_guard`].
    pub fn native_guard(mut self, use_it: bool) -> Self {
        self.native_guard = use_it;
        self
    }

    /// How long to wait for a new connection to be established (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long an operation waits for a pooled connection (default 5 s).
    pub fn checkout_timeout(mut self, timeout: Duration) -> Self {
        self.checkout_timeout = timeout;
        self
    }

    /// How long [`Store::migrate`] waits for another migration (or any session holding the migration lock) to
    /// finish (default [`DEFAULT_MIGRATION_LOCK_WAIT`], 30 s); past it, the migration fails with SQLSTATE
    /// `PF003` naming the sessions that hold the lock.
    pub fn migration_lock_wait(mut self, wait: Duration) -> Self {
        self.migration_lock_wait = wait;
        self
    }

    /// `application_name` of pgfence's connections unless the URL sets one (default `pgfence`); it is
    /// recorded with every rejection.
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = name.into();
        self
    }

    /// The identity the database must have; a mismatch is [`Error::WrongDatabase`] before anything is written.
    pub fn expect(mut self, expected: ExpectedIdentity) -> Self {
        self.expected = expected;
        self
    }

    /// What stands between pgfence and PostgreSQL (default [`PoolerMode::Session`]: PostgreSQL itself, or a
    /// pooler in session mode). Declare [`PoolerMode::Transaction`] for a pooler in transaction mode (PgBouncer's
    /// `pool_mode = transaction`): [`Store::connect`] then checks that the pooler keeps named prepared statements
    /// (PgBouncer 1.21 or later with `max_prepared_statements` > 0) and refuses it otherwise, and pgfence opens no
    /// connection through it that needs a lasting session (see [`direct_url`](Self::direct_url)).
    pub fn pooler(mut self, mode: PoolerMode) -> Self {
        self.pooler = mode;
        self
    }

    /// A URL of the same database that reaches it without a transaction-mode pooler (PostgreSQL itself, or a
    /// pooler in session mode), for the connections whose session must last: the elector's LISTEN connection
    /// and migrations. Every such connection is checked to reach the server and database the pool reaches.
    /// Without it, behind [`PoolerMode::Transaction`], electors learn of released leases by polling
    /// ([`LeadershipOptions::poll_every`](crate::leader::LeadershipOptions::poll_every)) and
    /// [`Store::migrate`] is refused.
    pub fn direct_url(mut self, url: impl Into<String>) -> Self {
        self.direct_url = Some(url.into());
        self
    }
}

/// Remembers the last connection error bb8 saw, so that a checkout timeout can report the real cause
/// ("connection refused") instead of only "timed out".
#[derive(Debug, Clone, Default)]
struct LastError(Arc<Mutex<Option<String>>>);

impl bb8::ErrorSink<PoolError> for LastError {
    fn sink(&self, error: PoolError) {
        tracing::warn!(error = %error, "database connection failed");
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(error.to_string());
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<PoolError>> {
        Box::new(self.clone())
    }
}

/// A pgfence store: the pool, the cluster its lease names are qualified with, and the verified identity of the
/// database. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    cluster: String,
    target: String,
    /// The endpoint the configuration names, without credentials (see [`Store::endpoint`]).
    endpoint: Option<String>,
    checkout_timeout: Duration,
    migration_lock_wait: Duration,
    last_error: LastError,
    expected: ExpectedIdentity,
    connect: Option<ConnectSettings>,
    pooler: PoolerMode,
    /// Where connections outside the pool go when they must not go through the pooler.
    direct: Option<ConnectSettings>,
    native: NativeGuard,
}

/// Whether the store's guarded writes go through `pgfence_native.fence`: allowed by the configuration, and
/// found installed (detected once, again after `migrate` or after the function went missing).
#[derive(Debug)]
struct NativeGuard {
    allowed: bool,
    /// 0: not detected yet; 1: installed; 2: not installed.
    state: std::sync::atomic::AtomicU8,
}

impl NativeGuard {
    fn new(allowed: bool) -> NativeGuard {
        NativeGuard {
            allowed,
            state: std::sync::atomic::AtomicU8::new(0),
        }
    }
}

/// The version of the `pgfence_native` extension this library knows (native/pgfence_native.control).
pub const NATIVE_GUARD_VERSION: &str = "0.1";

#[derive(QueryableByName)]
struct NativeInstalled {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    installed: bool,
}

#[derive(Clone)]
struct ConnectSettings {
    connector: Arc<Connector>,
    target: String,
    expected: ExpectedIdentity,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("target", &self.inner.target)
            .field("cluster", &self.inner.cluster)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Connects, checks that the server is a primary with the expected identity, and builds the pool.
    ///
    /// An unreachable database fails within the connect timeout with the driver's cause
    /// ([`Error::Connect`]); a standby is [`Error::NotPrimary`]; an unexpected identity is
    /// [`Error::WrongDatabase`]. A database without the pgfence schema is accepted (so that
    /// [`migrate`](Self::migrate) can run); lease operations on it fail with [`Error::SchemaMissing`].
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidInput`] for a malformed cluster name or a zero connect or checkout timeout;
    ///   [`Error::InvalidUrl`] for a connection string that does not parse. Nothing was sent.
    /// - [`Error::Connect`] when no host answered within the connect timeout (each host's cause is named),
    ///   [`Error::Tls`] when the server's certificate or TLS settings were refused.
    /// - [`Error::NotPrimary`], [`Error::WrongDatabase`] as above; [`Error::Database`] when the identity query
    ///   itself failed.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future closes the connections opened so far; nothing persists.
    ///
    /// ```no_run
    /// # async fn example() -> pgfence::Result<()> {
    /// use pgfence::{Store, StoreConfig};
    /// let store = Store::connect(StoreConfig::new("postgres://app@db:5432/control", "prod-eu-1")).await?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(config: StoreConfig) -> Result<Store> {
        validate_cluster(&config.cluster)?;
        if config.checkout_timeout.is_zero()
            || config.connect_timeout.is_zero()
            || config.migration_lock_wait.is_zero()
        {
            return Err(Error::invalid(
                "timeout",
                "connect and checkout timeouts and the migration lock wait must be positive",
            ));
        }
        let mut connector = config.connector()?;
        let pg = connector.config_mut();
        if pg.get_application_name().is_none() {
            pg.application_name(&config.application_name);
        }
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(config.connect_timeout);
        }
        let target = connector.target().to_owned();
        // Reported with every belief: a name the database would refuse (a control character in a socket path,
        // more than 512 bytes of hosts) is not reported at all.
        let endpoint = Some(crate::tls::endpoint(connector.config()))
            .filter(|e| crate::validate::check_text("endpoint", e, 512).is_ok());
        let settings = ConnectSettings {
            connector: Arc::new(connector),
            target: target.clone(),
            expected: config.expected.clone(),
        };

        // One direct connection first: its error is the real cause, and the identity is checked before a pool
        // (and anything that writes) exists.
        let (mut first, identity) = settings.open_checked(Kind::Coded).await?;
        tracing::info!(database = %target, cluster = %config.cluster,
            sslmode = %settings.connector.ssl_mode(),
            system_identifier = ?identity.system_identifier, instance_id = ?identity.instance_id, "connected");
        let direct = match &config.direct_url {
            Some(url) => Some(settings.for_direct_url(
                config.connector_for(url)?,
                &config.application_name,
                &identity,
            )),
            None => None,
        };
        let second = match config.pooler {
            PoolerMode::Session => None,
            PoolerMode::Transaction => {
                let (mut second, _) = settings.open_checked(Kind::Coded).await?;
                let shared = pooler::check_transaction_pooler(
                    &mut first,
                    &mut second,
                    &target,
                    config.connect_timeout,
                )
                .await?;
                match &direct {
                    Some(direct) => {
                        tracing::info!(database = %target, direct = %direct.target,
                        shared_sessions_seen = shared,
                        "behind a transaction-mode pooler: LISTEN and migrations use the direct URL")
                    }
                    None => {
                        tracing::info!(database = %target, shared_sessions_seen = shared,
                        "behind a transaction-mode pooler and no direct URL: no LISTEN connection, electors learn \
                         of released leases by polling (LeadershipOptions::poll_every); migrate() is refused")
                    }
                }
                Some(second)
            }
        };

        let last_error = LastError::default();
        let setup = settings.clone();
        let mut manager_config = ManagerConfig::default();
        manager_config.custom_setup = Box::new(move |_url| {
            let setup = setup.clone();
            Box::pin(async move {
                // Every new connection re-checks primary and identity: after a failover or a DNS change the
                // pool must not quietly start writing elsewhere.
                let (conn, _) = setup
                    .open_checked(Kind::Coded)
                    .await
                    .map_err(|e| diesel::ConnectionError::BadConnection(e.to_string()))?;
                Ok(conn)
            })
        });
        let manager =
            AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config("", manager_config);
        let pool = bb8::Pool::builder()
            .max_size(config.pool_size)
            .connection_timeout(config.checkout_timeout)
            // A ping on every checkout costs a round trip per operation (see `ping_on_checkout`); by default
            // broken connections are detected by the failing statement instead and then discarded.
            .test_on_check_out(config.ping_on_checkout)
            .error_sink(Box::new(last_error.clone()))
            .build_unchecked(manager);
        // Hand the already verified connection to the pool instead of dropping it.
        pool.add(first).map_err(|_| Error::Database {
            sqlstate: None,
            message: "the pool refused its first connection".to_owned(),
            source: None,
        })?;
        if let Some(second) = second {
            // The pooler check's second connection, verified like the first (dropped if the pool is full).
            let _ = pool.add(second);
        }

        Ok(Store {
            inner: Arc::new(Inner {
                pool,
                cluster: config.cluster,
                target,
                endpoint,
                checkout_timeout: config.checkout_timeout,
                migration_lock_wait: config.migration_lock_wait,
                last_error,
                expected: config.expected,
                connect: Some(settings),
                pooler: config.pooler,
                direct,
                native: NativeGuard::new(config.native_guard),
            }),
        })
    }

    /// Wraps a pool the application already has, with its own connection setup (TLS included). The pool's
    /// connections are not re-checked by pgfence when they are created; the identity is verified once here.
    ///
    /// Migrations and the LISTEN connection that wakes waiting electors use connections opened by the pool's
    /// manager outside the pool ([`bb8::Pool::dedicated_connection`]), so they are set up exactly like the
    /// application's. Cancel requests for abandoned statements cannot know the application's TLS settings: they
    /// use TLS when the connection did, without verifying the server's certificate (the request carries only
    /// that backend's cancel key); a server that refuses them just lets the statement finish.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidInput`] for a malformed cluster name; nothing was sent.
    /// - [`Error::Connect`], [`Error::PoolTimeout`] when the pool could not hand out a connection to read the
    ///   identity; [`Error::NotPrimary`] for a standby; [`Error::WrongDatabase`] for an identity other than
    ///   `expected`.
    /// - [`Error::Database`] when the identity query failed. The SQLSTATE of errors on the application's own
    ///   connections is the one the driver reports (pgfence reads codes off the wire only on connections it
    ///   opens).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves nothing behind: the identity read only reads.
    pub async fn from_pool(
        pool: Pool,
        cluster: impl Into<String>,
        expected: ExpectedIdentity,
    ) -> Result<Store> {
        let cluster = cluster.into();
        validate_cluster(&cluster)?;
        let last_error = LastError::default();
        let store = Store {
            inner: Arc::new(Inner {
                pool,
                cluster,
                target: "<application pool>".to_owned(),
                endpoint: None,
                checkout_timeout: Duration::from_secs(30),
                migration_lock_wait: DEFAULT_MIGRATION_LOCK_WAIT,
                last_error,
                expected,
                connect: None,
                pooler: PoolerMode::Session,
                direct: None,
                native: NativeGuard::new(true),
            }),
        };
        let identity = store.identity().await?;
        if identity.in_recovery {
            return Err(Error::NotPrimary {
                target: store.inner.target.clone(),
            });
        }
        identity.verify(&store.inner.expected)?;
        Ok(store)
    }

    /// The cluster that qualifies every lease name of this store.
    pub fn cluster(&self) -> &str {
        &self.inner.cluster
    }

    /// The endpoint this store was configured with, as a holder reports it with its beliefs: every host and
    /// port, then the database (`db1:5432,db2:5432/control`), without user, password or other parameters.
    /// `None` for a store built [`from_pool`](Self::from_pool), whose connections pgfence does not know, and when
    /// the configured endpoint is no printable text of at most 512 bytes.
    pub fn endpoint(&self) -> Option<&str> {
        self.inner.endpoint.as_deref()
    }

    /// The database as `user@host:port/database` (no credentials).
    pub fn target(&self) -> &str {
        &self.inner.target
    }

    /// The underlying pool, for the application's own queries.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// Checks a connection out of the pool; a timeout reports the last connection error the pool saw.
    ///
    /// # Errors
    ///
    /// [`Error::PoolTimeout`] after the checkout timeout, naming the last connection error the pool saw;
    /// [`Error::Connect`] when the pool's attempt to open a connection failed. Both are transient.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives up the wait; no connection is lost.
    pub async fn conn(&self) -> Result<PooledConnection<'_>> {
        self.inner.pool.get().await.map_err(|e| match e {
            bb8::RunError::User(err) => Error::Connect {
                target: self.inner.target.clone(),
                cause: err.to_string(),
            },
            bb8::RunError::TimedOut => Error::PoolTimeout {
                target: self.inner.target.clone(),
                waited: self.inner.checkout_timeout,
                last_error: self
                    .inner
                    .last_error
                    .0
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone(),
            },
        })
    }

    /// A pooled connection armed for one statement (see [`Checked`]).
    pub(crate) async fn checked(&self) -> Result<Checked<'_>> {
        Ok(Checked {
            conn: self.conn().await?,
            armed: true,
            connector: self
                .inner
                .connect
                .as_ref()
                .map(|settings| settings.connector.clone()),
        })
    }

    /// Runs one statement that returns one row on an armed connection; returns the instant it was sent (by the
    /// monotonic clock) and the row. The reply is read to its end, which the server sends after the statement's
    /// implicit commit, so a row is never taken for done before it committed (an acquisition, renewal or release
    /// whose commit failed is an error). Dropping the future midway cancels the statement and discards the
    /// connection.
    pub(crate) async fn call_one<Q, U>(&self, query: Q) -> Result<(std::time::Instant, U)>
    where
        Q: diesel_async::methods::LoadQuery<'static, AsyncPgConnection, U> + Send + 'static,
        U: Send + 'static,
    {
        use diesel_async::RunQueryDsl;
        let mut conn = self.checked().await?;
        let sent = std::time::Instant::now();
        let rows: std::result::Result<Vec<U>, diesel::result::Error> = query.load(&mut *conn).await;
        conn.settle(&rows);
        Ok((sent, only_row(rows?)?))
    }

    /// Runs one guarded statement and returns its only row, acknowledged only once the write committed.
    ///
    /// One round trip, autocommit. The rows are read to the end of the reply, which the server sends after the
    /// statement's implicit commit: a commit that fails there (a deferred trigger, a lost connection) is an error
    /// here, never an acknowledgement. (`get_result` would return at the first row, before the commit.)
    ///
    /// The guard needs READ COMMITTED. When the session's default isolation is another, the guard refuses with
    /// `PF004` before anything is written, and the statement runs again in an explicit READ COMMITTED
    /// transaction (three round trips) — the session default is the caller's to choose, so it is not changed.
    pub(crate) async fn call_guarded<Q, U>(&self, query: impl Fn() -> Q) -> Result<U>
    where
        Q: diesel_async::methods::LoadQuery<'static, AsyncPgConnection, U> + Send + 'static,
        U: Send + 'static,
    {
        use diesel_async::RunQueryDsl;
        let mut conn = self.checked().await?;
        let rows: std::result::Result<Vec<U>, diesel::result::Error> =
            query().load(&mut *conn).await;
        let rows = match rows {
            Err(e) if is_isolation_refusal(&e) => {
                let again = query();
                (*conn)
                    .build_transaction()
                    .read_committed()
                    .run(async move |conn: &mut AsyncPgConnection| again.load::<U>(conn).await)
                    .await
            }
            other => other,
        };
        conn.settle(&rows);
        only_row(rows?)
    }

    /// Reads the database's identity now (a fresh query, not a cached value).
    ///
    /// # Errors
    ///
    /// The [errors of every database call](crate#errors). The read needs no grant: any role that can connect
    /// reads its database's identity (the system identifier is `None` when it may not read it).
    pub async fn identity(&self) -> Result<DatabaseIdentity> {
        let mut conn = self.checked().await?;
        let identity = read_identity(&mut conn).await;
        conn.disarm();
        identity
    }

    /// Re-reads the identity and checks it against the configured expectation and that the server is a
    /// primary.
    ///
    /// # Errors
    ///
    /// [`Error::NotPrimary`] when the server is in recovery; [`Error::WrongDatabase`] as in
    /// [`DatabaseIdentity::verify`]; the [errors of every database call](crate#errors).
    pub async fn verify_identity(&self) -> Result<DatabaseIdentity> {
        let identity = self.identity().await?;
        if identity.in_recovery {
            return Err(Error::NotPrimary {
                target: self.inner.target.clone(),
            });
        }
        identity.verify(&self.inner.expected)?;
        Ok(identity)
    }

    /// Applies the embedded migrations that are not applied yet and returns their versions. Migrating twice is
    /// a no-op; two processes migrating at once take turns (a session advisory lock on a dedicated connection,
    /// waited for at most [`StoreConfig::migration_lock_wait`]).
    ///
    /// Before anything is applied, on every run: the migrating role must be able to execute the advisory-lock
    /// functions pgfence calls ([`ADVISORY_FUNCTIONS_NEEDED`]), and an existing schema `pgfence` must be its alone
    /// — owned by exactly that role, with no schema privilege it did not grant and no CREATE for another role, and
    /// no object in it owned by another role (whoever controls the schema could replace pgfence's functions).
    /// After the migrations, the rest of [`layout_problems`](Self::layout_problems) is logged as warnings.
    ///
    /// # Errors
    ///
    /// - [`Error::Migration`] whose [`sqlstate`](Error::sqlstate) is `42501` when one of those checks refused,
    ///   naming the owner, grantee, object or functions and the SQL that fixes it; nothing was changed.
    /// - [`Error::Database`] with SQLSTATE `PF003` (transient) when the migration lock was not free within
    ///   [`StoreConfig::migration_lock_wait`], naming the sessions that hold it (pid, application_name, state,
    ///   role).
    /// - [`Error::Migration`] when a migration failed (its transaction rolled back; the ones before it stay
    ///   applied), with the database's error as its source — a missing privilege keeps its SQLSTATE `42501` —
    ///   or when the store sits behind a transaction-mode pooler without [`StoreConfig::direct_url`].
    /// - [`Error::Connect`], [`Error::Tls`], [`Error::NotPrimary`], [`Error::WrongDatabase`] for the dedicated
    ///   connection the migrations run on.
    pub async fn migrate(&self) -> Result<Vec<String>> {
        if !self.can_open_dedicated() {
            return Err(Error::Migration {
                reason: "behind a transaction-mode pooler, migrations need StoreConfig::direct_url (their lock \
                         and search_path are session state)"
                    .to_owned(),
                source: None,
            });
        }
        let applied = run_migrations(
            self.open_dedicated(Kind::Coded).await?,
            self.inner.migration_lock_wait,
        )
        .await?;
        for problem in self.layout_problems().await? {
            tracing::warn!(severity = ?problem.severity, problem = %problem.problem, fix = %problem.fix,
                "the database's role layout leaves a gap (docs/security.md)");
        }
        // The schema may be new: whether pgfence_native is there is asked again.
        self.forget_native_guard();
        Ok(applied)
    }

    /// Whether this store's guarded writes ([`Store::fenced`], [`Store::guarded_write`]) go through the
    /// `pgfence_native` extension's `pgfence_native.fence` (its version [`NATIVE_GUARD_VERSION`] installed in the
    /// database, and [`StoreConfig::native_guard`] not turned off) rather than the portable `pgfence.fence`.
    /// Both answer every call alike; the native one costs less server time. Asked once per store (one query, on
    /// the first guarded write or here), and again after [`Store::migrate`] or when a guarded write found the
    /// function missing (that write fails with SQLSTATE `42883`; the next one uses the portable guard).
    ///
    /// # Errors
    ///
    /// The [errors of every database call](crate#errors).
    pub async fn native_guard(&self) -> Result<bool> {
        use diesel_async::RunQueryDsl;
        use std::sync::atomic::Ordering;
        let native = &self.inner.native;
        if !native.allowed {
            return Ok(false);
        }
        match std::sync::atomic::AtomicU8::load(&native.state, Ordering::Relaxed) {
            1 => return Ok(true),
            2 => return Ok(false),
            _ => {}
        }
        let mut conn = self.conn().await?;
        let row: NativeInstalled = diesel::sql_query(
            "SELECT EXISTS (SELECT FROM pg_catalog.pg_extension \
                             WHERE extname = 'pgfence_native' AND extversion = $1) AS installed",
        )
        .bind::<diesel::sql_types::Text, _>(NATIVE_GUARD_VERSION)
        .get_result(&mut *conn)
        .await?;
        native
            .state
            .store(if row.installed { 1 } else { 2 }, Ordering::Relaxed);
        tracing::debug!(target: "pgfence", native = row.installed, "guard function detected");
        Ok(row.installed)
    }

    /// Asks again, at the next guarded write, whether `pgfence_native` is installed.
    pub(crate) fn forget_native_guard(&self) {
        self.inner
            .native
            .state
            .store(0, std::sync::atomic::Ordering::Relaxed);
    }

    /// What the database's advisory-lock and role layout lacks, compared with the hardened layout of
    /// docs/security.md; empty when it is that layout. Run as the schema owner (`pgfence._layout_problems()`,
    /// which no other role may execute). [`migrate`](Self::migrate) and the grants check it themselves
    /// (refusing on an [`LayoutSeverity::Error`], logging a warning for the rest); the CLI prints it.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] with SQLSTATE `42501` when the session is not the owner; the [errors of every
    /// database call](crate#errors).
    pub async fn layout_problems(&self) -> Result<Vec<LayoutProblem>> {
        use diesel_async::RunQueryDsl;
        let mut conn = self.checked().await?;
        let rows: std::result::Result<Vec<ProblemRow>, _> =
            diesel::sql_query("SELECT severity, problem, fix FROM pgfence._layout_problems()")
                .load(&mut *conn)
                .await;
        conn.settle(&rows);
        Ok(rows?
            .into_iter()
            .map(|row| LayoutProblem {
                severity: if row.severity == "error" {
                    LayoutSeverity::Error
                } else {
                    LayoutSeverity::Warning
                },
                problem: row.problem,
                fix: row.fix,
            })
            .collect())
    }

    /// Whether this store can open connections of its own outside the pool whose session lasts: every store
    /// can (one built [`from_pool`](Store::from_pool) through the pool's manager), except one behind
    /// [`PoolerMode::Transaction`] without a direct URL.
    pub(crate) fn can_open_dedicated(&self) -> bool {
        self.inner.direct.is_some() || self.inner.pooler == PoolerMode::Session
    }

    /// A new connection outside the pool (for LISTEN and migrations), secured like the pool's: through the
    /// direct URL when there is one.
    pub(crate) async fn open_dedicated(&self, kind: Kind) -> Result<AsyncPgConnection> {
        if let Some(direct) = &self.inner.direct {
            return direct.open_checked(kind).await.map(|(conn, _)| conn);
        }
        match &self.inner.connect {
            Some(settings) if self.inner.pooler == PoolerMode::Session => {
                settings.open(kind).await
            }
            Some(_) => Err(Error::Connect {
                target: self.inner.target.clone(),
                cause: "behind a transaction-mode pooler without a direct URL, no session outlives a transaction"
                    .to_owned(),
            }),
            // The application's manager, with its TLS and setup; bounded like a checkout.
            None => match tokio::time::timeout(
                self.inner.checkout_timeout,
                self.inner.pool.dedicated_connection(),
            )
            .await
            {
                Ok(Ok(conn)) => Ok(conn),
                Ok(Err(e)) => Err(Error::Connect {
                    target: self.inner.target.clone(),
                    cause: error_chain(&e),
                }),
                Err(_) => Err(Error::Connect {
                    target: self.inner.target.clone(),
                    cause: format!(
                        "the application pool's manager opened no connection within {:?}",
                        self.inner.checkout_timeout
                    ),
                }),
            },
        }
    }

    pub(crate) fn qualify(&self, name: &str) -> String {
        format!("{}/{}", self.inner.cluster, name)
    }

    /// Sends a cancel request for the statement running on the connection `token` belongs to, over TLS when
    /// this store's connections use it.
    pub(crate) async fn cancel(&self, token: &tokio_postgres::CancelToken) -> Result<()> {
        match &self.inner.connect {
            Some(settings) => settings.connector.cancel(token).await,
            None => crate::tls::cancel_unknown(token).await,
        }
    }

    /// A new connection outside the pool, checked as every pooled connection is when it is created: a primary
    /// with the expected identity ([`Error::NotPrimary`], [`Error::WrongDatabase`] otherwise). Bounded by the
    /// connect timeout (and as much again for the identity query). For the leader's renewals, which must not
    /// queue behind the pool's reconnect backoff; through the direct URL when there is one.
    pub(crate) async fn open_dedicated_checked(&self) -> Result<AsyncPgConnection> {
        if let Some(direct) = &self.inner.direct {
            return direct.open_checked(Kind::Coded).await.map(|(conn, _)| conn);
        }
        match &self.inner.connect {
            Some(settings) => Ok(settings.open_checked(Kind::Coded).await?.0),
            None => Err(Error::Connect {
                target: self.inner.target.clone(),
                cause: "a store built from an application pool opens no connections of its own"
                    .to_owned(),
            }),
        }
    }
}

impl ConnectSettings {
    /// Settings for the direct URL (its connector built by the same [`StoreConfig`]); its connections must
    /// reach the server and database `seen` through the pooler (and whatever else is expected).
    fn for_direct_url(
        &self,
        mut connector: Connector,
        application_name: &str,
        seen: &DatabaseIdentity,
    ) -> ConnectSettings {
        let config = connector.config_mut();
        if config.get_application_name().is_none() {
            config.application_name(application_name);
        }
        if let (None, Some(timeout)) = (
            config.get_connect_timeout().copied(),
            self.connector.config().get_connect_timeout().copied(),
        ) {
            config.connect_timeout(timeout);
        }
        let target = connector.target().to_owned();
        ConnectSettings {
            connector: Arc::new(connector),
            target,
            expected: ExpectedIdentity {
                system_identifier: (self.expected.system_identifier.clone())
                    .or_else(|| seen.system_identifier.clone()),
                instance_id: (self.expected.instance_id.clone())
                    .or_else(|| seen.instance_id.clone()),
                database: Some(seen.database.clone()),
            },
        }
    }

    /// Opens a connection, each host's attempt bounded by the connect timeout as a whole (tokio-postgres's own
    /// timeout covers only the socket, not the startup and authentication exchange).
    async fn open(&self, kind: Kind) -> Result<AsyncPgConnection> {
        self.open_reaching(kind).await.map(|(conn, _)| conn)
    }

    /// Opens a connection and says which host it reached. The hosts of a multi-host connection string are tried
    /// in order, each within the connect timeout, as libpq does: a first host that accepts TCP and never answers
    /// costs one timeout, not the whole attempt. When every host failed, the error names each with its cause, and
    /// it is [`Error::NotPrimary`] when a host was refused only for being read-only (`target_session_attrs`).
    async fn open_reaching(&self, kind: Kind) -> Result<(AsyncPgConnection, String)> {
        let limit = self
            .connector
            .config()
            .get_connect_timeout()
            .copied()
            .unwrap_or(Duration::from_secs(5));
        let hosts = self.connector.per_host();
        let single = hosts.len() == 1;
        let mut failures = Vec::new();
        let mut read_only = false;
        let mut all_tls = true;
        for host in &hosts {
            let error = match tokio::time::timeout(limit, open_with(host, kind)).await {
                Ok(Ok(conn)) => return Ok((conn, host.target().to_owned())),
                Ok(Err(e)) => e,
                Err(_) => Error::Connect {
                    target: host.target().to_owned(),
                    cause: format!("no answer to the connection startup within {limit:?}"),
                },
            };
            if single {
                return Err(error);
            }
            read_only |= matches!(error, Error::NotPrimary { .. });
            let (is_tls, cause) = match &error {
                Error::Tls { cause, .. } => (true, cause.clone()),
                Error::Connect { cause, .. } => (false, cause.clone()),
                other => (false, other.to_string()),
            };
            all_tls &= is_tls;
            tracing::debug!(host = %host.target(), %cause, "host not usable; trying the next");
            failures.push(format!("{}: {cause}", host.target()));
        }
        let target = failures.join("; ");
        if read_only {
            return Err(Error::NotPrimary { target });
        }
        if all_tls {
            return Err(Error::Tls {
                target: self.target.clone(),
                cause: target,
            });
        }
        Err(Error::Connect {
            target: self.target.clone(),
            cause: format!("no host could be used: {target}"),
        })
    }

    /// Opens a connection and reads the identity, both within the connect timeout.
    async fn open_checked(&self, kind: Kind) -> Result<(AsyncPgConnection, DatabaseIdentity)> {
        let limit = self
            .connector
            .config()
            .get_connect_timeout()
            .copied()
            .unwrap_or(Duration::from_secs(5));
        let (mut conn, reached) = self.open_reaching(kind).await?;
        let started = tokio::time::Instant::now();
        let identity = tokio::time::timeout_at(started + limit, read_identity(&mut conn))
            .await
            .map_err(|_| Error::Connect {
                target: reached.clone(),
                cause: format!(
                    "the server did not answer the identity query within {limit:?} of connecting"
                ),
            })??;
        if identity.in_recovery {
            return Err(Error::NotPrimary { target: reached });
        }
        identity.verify(&self.expected)?;
        Ok((conn, identity))
    }
}

/// Which connection a [`ConnectSettings`] opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// For the pool, migrations and the leader's renewals: over a socket pgfence opened, so that every error's SQLSTATE is read
    /// off the wire ([`WireStream`](crate::WireStream)); pgfence drives it (diesel-async drives only tokio-postgres's
    /// own sockets), so diesel-async's `notifications_stream` stays empty on it.
    Coded,
    /// For LISTEN: opened and driven by tokio-postgres and diesel-async, so that notifications
    /// arrive; only a TLS connection's errors are read off the wire.
    Listening,
}

/// Opens a connection through one host's connector (no timeout of its own).
async fn open_with(connector: &Connector, kind: Kind) -> Result<AsyncPgConnection> {
    let opened = match kind {
        Kind::Listening => {
            let (client, connection) = connector.connect().await?;
            AsyncPgConnection::try_from_client_and_connection(client, connection).await
        }
        Kind::Coded => {
            let (client, connection) = connector.connect_pooled().await?;
            drive(connection, connector.target().to_owned());
            AsyncPgConnection::try_from(client).await
        }
    };
    opened.map_err(|e| Error::Connect {
        target: connector.target().to_owned(),
        cause: e.to_string(),
    })
}

/// Drives a pool connection until its client is dropped (the connection then ends itself) or it fails.
fn drive(mut connection: crate::tls::PoolConnection, target: String) {
    tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let Err(e) = message {
                tracing::debug!(database = %target, error = %error_chain(&e), "connection ended");
                break;
            }
        }
    });
}

#[derive(QueryableByName)]
struct IdentityRow {
    #[diesel(sql_type = Nullable<Text>)]
    system_identifier: Option<String>,
    #[diesel(sql_type = Text)]
    database: String,
    #[diesel(sql_type = Nullable<Text>)]
    instance_id: Option<String>,
    #[diesel(sql_type = Bool)]
    in_recovery: bool,
    #[diesel(sql_type = Nullable<BigInt>)]
    timeline: Option<i64>,
    #[diesel(sql_type = Text)]
    server_version: String,
}

/// Reads the identity through `pgfence.identity()` when the schema is installed, or directly (as far as the
/// role's privileges allow) before the first migration.
async fn read_identity(conn: &mut AsyncPgConnection) -> Result<DatabaseIdentity> {
    use diesel_async::RunQueryDsl;
    let installed: bool = diesel::select(diesel::dsl::sql::<Bool>(
        "to_regprocedure('pgfence.identity()') IS NOT NULL",
    ))
    .get_result(conn)
    .await?;
    let row: IdentityRow = if installed {
        diesel::sql_query(
            "SELECT system_identifier, database, instance_id, in_recovery, timeline, server_version \
             FROM pgfence.identity()",
        )
        .get_result(conn)
        .await?
    } else {
        diesel::sql_query(
            "SELECT CASE WHEN has_function_privilege('pg_control_system()', 'EXECUTE') \
                    THEN (SELECT system_identifier::text FROM pg_control_system()) END AS system_identifier, \
                    current_database()::text AS database, NULL::text AS instance_id, \
                    pg_is_in_recovery() AS in_recovery, NULL::bigint AS timeline, \
                    current_setting('server_version') AS server_version",
        )
        .get_result(conn)
        .await?
    };
    Ok(DatabaseIdentity {
        system_identifier: row.system_identifier,
        database: row.database,
        instance_id: row.instance_id,
        in_recovery: row.in_recovery,
        timeline: row.timeline,
        server_version: row.server_version,
    })
}

/// A row of the layout and schema checks: a problem and its fix.
#[derive(QueryableByName)]
struct ProblemRow {
    #[diesel(sql_type = Text)]
    severity: String,
    #[diesel(sql_type = Text)]
    problem: String,
    #[diesel(sql_type = Text)]
    fix: String,
}

/// A role or object name made safe for a message: control characters replaced, length bounded, quoted (as
/// `pgfence._printable`, which cannot be used before the schema is known to be the migrating role's).
macro_rules! printable {
    ($e:literal) => {
        concat!(
            "quote_literal(regexp_replace(left(",
            $e,
            ", 64), '[[:cntrl:]]', '?', 'g'))"
        )
    };
}

/// The advisory-lock functions of [`ADVISORY_FUNCTIONS_NEEDED`] the migrating role may not execute (run with
/// `search_path = pg_catalog`; before the migration lock, which needs one of them).
fn missing_execute_query() -> String {
    let needed = ADVISORY_FUNCTIONS_NEEDED
        .iter()
        .map(|f| format!("'{f}'"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "SELECT 'error' AS severity, \
                format('the migrating role %s may not execute %s, which pgfence''s functions call as the schema \
                        owner: acquire, guarded writes, takeovers and migrate would fail 42501', \
                       {me}, string_agg(f::text, ', ' ORDER BY f::text)) AS problem, \
                format('GRANT EXECUTE ON FUNCTION %s TO %s (as a superuser, in this database)', \
                       string_agg(f::text, ', ' ORDER BY f::text), quote_ident(current_user::text)) AS fix \
           FROM unnest(ARRAY[{needed}]::regprocedure[]) f \
          WHERE NOT has_function_privilege(f, 'EXECUTE') \
         HAVING count(*) > 0",
        me = printable!("current_user::text"),
    )
}

/// Why the existing schema `pgfence` is not the migrating role's alone, one row per problem (none: it is). Run
/// with `search_path = pg_catalog`, after the migration lock and before anything of the schema is used or
/// created: another role's schema, a schema privilege the migrating role did not grant (or CREATE for another
/// role), or an object in the schema of another role would let that role replace pgfence's functions. The
/// first migration checks the same (000001_schema).
const SCHEMA_PROBLEMS: &str = concat!(
    "WITH me AS (SELECT oid FROM pg_roles WHERE rolname = current_user), \
          s AS (SELECT n.oid, n.nspowner, n.nspacl FROM pg_namespace n WHERE n.nspname = 'pgfence'), \
          objects(what, owner) AS ( \
            SELECT 'relation pgfence.' || quote_ident(c.relname), c.relowner FROM pg_class c, s \
             WHERE c.relnamespace = s.oid \
            UNION ALL SELECT 'function ' || p.oid::regprocedure::text, p.proowner FROM pg_proc p, s \
             WHERE p.pronamespace = s.oid \
            UNION ALL SELECT 'type pgfence.' || quote_ident(t.typname), t.typowner FROM pg_type t, s \
             WHERE t.typnamespace = s.oid \
            UNION ALL SELECT 'operator pgfence.' || o.oprname, o.oprowner FROM pg_operator o, s \
             WHERE o.oprnamespace = s.oid \
            UNION ALL SELECT 'collation pgfence.' || quote_ident(c.collname), c.collowner FROM pg_collation c, s \
             WHERE c.collnamespace = s.oid \
            UNION ALL SELECT 'conversion pgfence.' || quote_ident(c.conname), c.conowner FROM pg_conversion c, s \
             WHERE c.connamespace = s.oid \
            UNION ALL SELECT 'operator family pgfence.' || quote_ident(f.opfname), f.opfowner FROM pg_opfamily f, s \
             WHERE f.opfnamespace = s.oid \
            UNION ALL SELECT 'operator class pgfence.' || quote_ident(c.opcname), c.opcowner FROM pg_opclass c, s \
             WHERE c.opcnamespace = s.oid \
            UNION ALL SELECT 'text search configuration pgfence.' || quote_ident(c.cfgname), c.cfgowner \
              FROM pg_ts_config c, s WHERE c.cfgnamespace = s.oid \
            UNION ALL SELECT 'text search dictionary pgfence.' || quote_ident(d.dictname), d.dictowner \
              FROM pg_ts_dict d, s WHERE d.dictnamespace = s.oid \
            UNION ALL SELECT 'statistics object pgfence.' || quote_ident(x.stxname), x.stxowner \
              FROM pg_statistic_ext x, s WHERE x.stxnamespace = s.oid) \
     SELECT 'error' AS severity, \
            format('the schema pgfence is owned by %s, not by %s (the role migrating); it holds %s objects', ",
    printable!("pg_get_userbyid(s.nspowner)"),
    ", ",
    printable!("current_user::text"),
    ", (SELECT count(*) FROM objects)) AS problem, \
            format('DROP SCHEMA pgfence (as %s or a superuser) when it holds nothing of yours, then migrate \
                    again; ALTER SCHEMA pgfence OWNER TO %s only if you trust every object in it', ",
    printable!("pg_get_userbyid(s.nspowner)"),
    ", quote_ident(current_user::text)) AS fix \
       FROM s, me WHERE s.nspowner <> me.oid \
     UNION ALL \
     SELECT 'error', \
            format('the schema pgfence grants %s to %s (granted by %s)', a.privilege_type, \
                   CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE ",
    printable!("pg_get_userbyid(a.grantee)"),
    " END, ",
    printable!("pg_get_userbyid(a.grantor)"),
    "), \
            format('REVOKE %s ON SCHEMA pgfence FROM %s', a.privilege_type, \
                   CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END) \
       FROM s CROSS JOIN LATERAL aclexplode(s.nspacl) a, me \
      WHERE s.nspowner = me.oid AND a.grantee <> me.oid AND (a.grantor <> me.oid OR a.privilege_type = 'CREATE') \
     UNION ALL \
     SELECT 'error', format('%s in the schema pgfence is owned by %s', o.what, ",
    printable!("pg_get_userbyid(o.owner)"),
    "), \
            format('drop %s (or change its owner to %s once you have checked it), then migrate again', o.what, \
                   quote_ident(current_user::text)) \
       FROM objects o, me, s WHERE s.nspowner = me.oid AND o.owner <> me.oid"
);

/// The refusal of a migration whose pre-flight check found `problems`: [`Error::Migration`] whose source is the
/// privilege error (SQLSTATE `42501`, reachable through [`Error::sqlstate`]).
fn migration_refused(what: &str, problems: &[ProblemRow]) -> Error {
    let listed = |f: fn(&ProblemRow) -> &str| {
        let mut items: Vec<&str> = problems.iter().take(5).map(f).collect();
        if problems.len() > 5 {
            items.push("…");
        }
        items.join("; ")
    };
    let message = format!(
        "{what}: {}. To fix: {}",
        listed(|p| &p.problem),
        listed(|p| &p.fix)
    );
    Error::Migration {
        reason: message.clone(),
        source: Some(Box::new(Error::Database {
            sqlstate: Some("42501".to_owned()),
            message,
            source: None,
        })),
    }
}

/// Takes the migration lock, waiting at most `wait`; past it, `PF003` naming the sessions that hold the lock
/// (pid, application_name, state, role, escaped).
async fn take_migration_lock(conn: &mut AsyncPgConnection, wait: Duration) -> Result<()> {
    use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
    let ms = wait.as_millis().clamp(1, i32::MAX as u128);
    conn.batch_execute(&format!("SET lock_timeout = '{ms}ms'"))
        .await?;
    let locked = conn
        .batch_execute(&format!("SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})"))
        .await;
    if let Err(e) = locked {
        let error = Error::from(e);
        if error.sqlstate() != Some("55P03") {
            return Err(error);
        }
        #[derive(QueryableByName)]
        struct Holders {
            #[diesel(sql_type = Text)]
            holders: String,
        }
        let (classid, objid) = (MIGRATION_LOCK_KEY >> 32, MIGRATION_LOCK_KEY & 0xffff_ffff);
        let holders: Holders = diesel::sql_query(format!(
            "SELECT coalesce(string_agg(format('pid %s (application_name %s, state %s, role %s)', a.pid, {app}, \
                    coalesce(a.state, 'unknown'), {role}), ', ' ORDER BY a.pid), \
                    'no session any more (the holder has just ended)') AS holders \
               FROM pg_stat_activity a \
              WHERE a.pid IN (SELECT k.pid FROM pg_locks k \
                               WHERE k.locktype = 'advisory' AND k.classid = {classid}::bigint::oid \
                                 AND k.objid = {objid}::bigint::oid AND k.objsubid = 1 AND k.granted \
                                 AND k.database = (SELECT d.oid FROM pg_database d \
                                                    WHERE d.datname = current_database()))",
            app = printable!("a.application_name"),
            role = printable!("a.usename::text"),
        ))
        .get_result(conn)
        .await?;
        return Err(Error::Database {
            sqlstate: Some("PF003".to_owned()),
            message: format!(
                "pgfence: migrate waited {wait:?} for the migration lock (advisory lock {MIGRATION_LOCK_KEY}); \
                 held by {}",
                holders.holders
            ),
            source: Some(Box::new(error)),
        });
    }
    conn.batch_execute("RESET lock_timeout").await?;
    Ok(())
}

async fn run_migrations(mut conn: AsyncPgConnection, lock_wait: Duration) -> Result<Vec<String>> {
    use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
    // Nothing of the schema pgfence is used before it is known to be the migrating role's: the checks read the
    // catalogs only. No JIT on this session: the catalog checks and the migrations' own are planned with large
    // row estimates and would be compiled for seconds to run for milliseconds.
    conn.batch_execute("SET search_path = pg_catalog, pg_temp; SET jit = off")
        .await?;
    let missing: Vec<ProblemRow> = diesel::sql_query(missing_execute_query())
        .load(&mut conn)
        .await?;
    if !missing.is_empty() {
        return Err(migration_refused(
            "refusing to migrate: the advisory-lock layout lacks what pgfence needs",
            &missing,
        ));
    }
    // Serialize concurrent migrators; the lock is released when this dedicated connection closes.
    take_migration_lock(&mut conn, lock_wait).await?;
    // CREATE SCHEMA needs CREATE on the database even when the schema exists: only when it does not.
    let exists: bool = diesel::select(diesel::dsl::sql::<Bool>(
        "EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'pgfence')",
    ))
    .get_result(&mut conn)
    .await?;
    if !exists {
        conn.batch_execute("CREATE SCHEMA IF NOT EXISTS pgfence")
            .await?;
    }
    let problems: Vec<ProblemRow> = diesel::sql_query(SCHEMA_PROBLEMS).load(&mut conn).await?;
    if !problems.is_empty() {
        return Err(migration_refused(
            "refusing to migrate into a schema pgfence that another role controls (it could replace pgfence's \
             functions)",
            &problems,
        ));
    }
    conn.batch_execute("SET search_path = pgfence").await?;
    // diesel's migration harness is synchronous; run it on a blocking thread through the wrapper (it blocks on
    // the current runtime's handle, which must not happen on a runtime worker thread).
    let applied = tokio::task::spawn_blocking(move || {
        let mut wrapped: diesel_async::async_connection_wrapper::AsyncConnectionWrapper<
            AsyncPgConnection,
        > = diesel_async::async_connection_wrapper::AsyncConnectionWrapper::from(conn);
        wrapped
            .run_pending_migrations(MIGRATIONS)
            .map(|versions| versions.iter().map(|v| v.to_string()).collect::<Vec<_>>())
            .map_err(|e| Error::Migration {
                reason: e.to_string(),
                source: Some(e),
            })
    })
    .await
    .map_err(|e| Error::Migration {
        reason: format!("migration task failed: {e}"),
        source: Some(Box::new(e)),
    })??;
    if applied.is_empty() {
        tracing::debug!("schema already up to date");
    } else {
        tracing::info!(?applied, "applied migrations");
    }
    Ok(applied)
}

/// Whether a statement failed because its guard ran outside READ COMMITTED (`PF004`, raised before anything is
/// written: the statement can run again in a READ COMMITTED transaction).
pub(crate) fn is_isolation_refusal(error: &diesel::result::Error) -> bool {
    matches!(error, diesel::result::Error::DatabaseError(_, info)
        if crate::wire::sqlstate_of(info.message(), info.details(), info.hint()).as_deref()
            == Some(crate::error::ISOLATION_REFUSAL))
}

/// The row of a statement that returns exactly one.
fn only_row<U>(rows: Vec<U>) -> Result<U> {
    rows.into_iter().next().ok_or_else(|| Error::Database {
        sqlstate: None,
        message: "a pgfence function returned no row".to_owned(),
        source: None,
    })
}
