//! [`Store`]: the pool of connections to one database, the cluster its lease names are qualified with, and the
//! identity every connection of it is checked against. How it is configured is [`config`], how one statement
//! runs on it [`statement`], and how its schema is installed [`migrate`].

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig, PoolError};
use diesel_async::AsyncPgConnection;

use crate::connect::conninfo::endpoint;
use crate::connect::identity::{
    read_identity, ConnectSettings, DatabaseIdentity, ExpectedIdentity,
};
use crate::connect::pooler::{check_transaction_pooler, PoolerMode};
use crate::connect::{Connector, Kind};
use crate::error::{error_chain, Error, Result};
use crate::limits::DEFAULT_MIGRATION_LOCK_WAIT;
use crate::validate::validate_cluster;
use config::StoreConfig;

pub(crate) mod config;
pub(crate) mod migrate;
pub(crate) mod statement;

/// The bb8 pool type pgfence uses; bring your own with [`Store::from_pool`].
pub type Pool = bb8::Pool<AsyncDieselConnectionManager<AsyncPgConnection>>;

/// A connection checked out of the store's [`Pool`] by [`Admin::conn`](crate::admin::Admin::conn); it derefs to the diesel-async
/// connection and goes back to the pool when dropped.
///
/// It also holds the checkout's turn: a store that built its pool ([`Store::connect`]) hands its connections
/// out in the order they were asked for, so that a task that gives its connection back and asks again at once
/// cannot keep a waiting task out (bb8 alone gives a returned connection to whichever task asks next).
pub struct PooledConnection<'a> {
    // Declared first, so dropped first: the connection is back in the pool before the next turn begins.
    conn: bb8::PooledConnection<'a, AsyncDieselConnectionManager<AsyncPgConnection>>,
    _turn: Option<tokio::sync::SemaphorePermit<'a>>,
}

impl std::fmt::Debug for PooledConnection<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledConnection")
            .field("turn", &self._turn.is_some())
            .finish_non_exhaustive()
    }
}

impl std::ops::Deref for PooledConnection<'_> {
    type Target = AsyncPgConnection;
    fn deref(&self) -> &AsyncPgConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for PooledConnection<'_> {
    fn deref_mut(&mut self) -> &mut AsyncPgConnection {
        &mut self.conn
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
    /// The endpoint the configuration names, without credentials (see [`Admin::endpoint`](crate::admin::Admin::endpoint)).
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
    /// One turn per connection of a pool the store built, taken first come, first served by every checkout
    /// (tokio's semaphore is fair); `None` for an application's pool, whose other users take no turns.
    turns: Option<tokio::sync::Semaphore>,
    /// The pool's size, as the turns count it (for the timeout's message).
    pool_size: u32,
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

#[derive(diesel::QueryableByName)]
struct NativeInstalled {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    installed: bool,
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
        let settings = config.settings()?;
        let target = settings.target.clone();
        // Reported with every belief: a name the database would refuse (a control character in a socket path,
        // more than 512 bytes of hosts) is not reported at all.
        let endpoint = Some(endpoint(settings.connector.config()))
            .filter(|e| crate::validate::check_text("endpoint", e, 512).is_ok());
        // One direct connection first: its error is the real cause, and the identity is checked before a pool
        // (and anything that writes) exists.
        let (mut first, identity, _) = settings.open_checked(Kind::Coded).await?;
        tracing::info!(database = %target, cluster = %config.cluster,
            sslmode = %settings.connector.ssl_mode(),
            system_identifier = ?identity.system_identifier, instance_id = ?identity.instance_id, "connected");
        let direct = config.direct_settings(&settings, &identity)?;
        let second = check_pooler(&config, &settings, &mut first, direct.as_ref()).await?;
        let last_error = LastError::default();
        let pool = build_pool(&config, &settings, &last_error, first, second)?;
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
                turns: Some(tokio::sync::Semaphore::new(config.pool_size as usize)),
                pool_size: config.pool_size,
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
    /// that backend's cancel key); a server that refuses them just lets the statement finish. Checkouts go
    /// through the pool as the application's own do, in whatever order bb8 hands connections out: pgfence
    /// cannot queue the application's other users of the pool.
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
                turns: None,
                pool_size: 0,
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

    /// [`Admin::cluster`](crate::admin::Admin::cluster).
    pub(crate) fn cluster(&self) -> &str {
        &self.inner.cluster
    }

    /// [`Admin::endpoint`](crate::admin::Admin::endpoint).
    pub(crate) fn endpoint(&self) -> Option<&str> {
        self.inner.endpoint.as_deref()
    }

    /// [`Admin::target`](crate::admin::Admin::target).
    pub(crate) fn target(&self) -> &str {
        &self.inner.target
    }

    /// How many acquisitions the leadership runtime sends at once through this store: one per connection of
    /// the pool it built; for an application's pool (whose size it does not know), its current size, at least 4.
    pub(crate) fn acquisition_turns(&self) -> usize {
        match self.inner.pool_size {
            0 => (self.inner.pool.state().connections as usize).max(4),
            size => size as usize,
        }
    }

    /// [`Admin::pool`](crate::admin::Admin::pool).
    pub(crate) fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// [`Admin::conn`](crate::admin::Admin::conn).
    pub(crate) async fn conn(&self) -> Result<PooledConnection<'_>> {
        // A free turn is taken at once (none is free while a task waits: the semaphore hands released turns to
        // the waiters in order); only a wait for one needs the deadline, which the pool's wait then shares.
        let (turn, deadline) = match &self.inner.turns {
            None => (None, None),
            Some(turns) => match turns.try_acquire() {
                Ok(turn) => (Some(turn), None),
                Err(_) => {
                    let deadline = tokio::time::Instant::now() + self.inner.checkout_timeout;
                    match tokio::time::timeout_at(deadline, turns.acquire()).await {
                        Ok(turn) => (
                            Some(turn.expect("the store never closes its turns")),
                            Some(deadline),
                        ),
                        Err(_) => {
                            return Err(self.pool_timeout(Some(format!(
                            "all {} of the pool's connections stayed checked out by other tasks",
                            self.inner.pool_size
                        ))))
                        }
                    }
                }
            },
        };
        // The pool's own wait is bounded by the checkout timeout (its connection timeout).
        let got = match deadline {
            None => self.inner.pool.get().await,
            Some(deadline) => tokio::time::timeout_at(deadline, self.inner.pool.get())
                .await
                .unwrap_or(Err(bb8::RunError::TimedOut)),
        };
        match got {
            Ok(conn) => Ok(PooledConnection { conn, _turn: turn }),
            Err(bb8::RunError::User(err)) => Err(Error::Connect {
                target: self.inner.target.clone(),
                cause: err.to_string(),
            }),
            Err(bb8::RunError::TimedOut) => Err(self.pool_timeout(None)),
        }
    }

    /// The checkout timeout's error: what it waited for, else the last connection error the pool saw.
    fn pool_timeout(&self, waited_for: Option<String>) -> Error {
        let last_error = || {
            self.inner
                .last_error
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        };
        Error::PoolTimeout {
            target: self.inner.target.clone(),
            waited: self.inner.checkout_timeout,
            cause: waited_for.or_else(last_error),
        }
    }

    /// [`Admin::identity`](crate::admin::Admin::identity).
    pub(crate) async fn identity(&self) -> Result<DatabaseIdentity> {
        let mut conn = self.checked().await?;
        let identity = read_identity(&mut conn).await;
        conn.disarm();
        identity
    }

    /// [`Admin::verify_identity`](crate::admin::Admin::verify_identity).
    pub(crate) async fn verify_identity(&self) -> Result<DatabaseIdentity> {
        let identity = self.identity().await?;
        if identity.in_recovery {
            return Err(Error::NotPrimary {
                target: self.inner.target.clone(),
            });
        }
        identity.verify(&self.inner.expected)?;
        Ok(identity)
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

    /// Whether this store can open connections of its own outside the pool whose session lasts: every store
    /// can (one built [`from_pool`](Store::from_pool) through the pool's manager), except one behind
    /// [`PoolerMode::Transaction`] without a direct URL.
    fn can_open_dedicated(&self) -> bool {
        self.inner.direct.is_some() || self.inner.pooler == PoolerMode::Session
    }

    /// A new connection outside the pool (for LISTEN and migrations), secured like the pool's: through the
    /// direct URL when there is one.
    async fn open_dedicated(&self, kind: Kind) -> Result<AsyncPgConnection> {
        if let Some(direct) = &self.inner.direct {
            return direct.open_checked(kind).await.map(|(conn, ..)| conn);
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

    /// `name` qualified by this store's cluster (`cluster/name`), as the database stores it.
    pub(crate) fn qualify(&self, name: &str) -> String {
        format!("{}/{}", self.inner.cluster, name)
    }

    /// A new connection outside the pool, checked as every pooled connection is when it is created: a primary
    /// with the expected identity ([`Error::NotPrimary`], [`Error::WrongDatabase`] otherwise). Bounded by the
    /// connect timeout (and as much again for the identity query). For the leader's renewals, which must not
    /// queue behind the pool's reconnect backoff; through the direct URL when there is one. Returned with the
    /// connector of the host it reached, where its cancel requests go.
    async fn open_dedicated_checked(&self) -> Result<(AsyncPgConnection, Arc<Connector>)> {
        let settings = match (&self.inner.direct, &self.inner.connect) {
            (Some(direct), _) => direct,
            (None, Some(settings)) => settings,
            (None, None) => {
                return Err(Error::Connect {
                    target: self.inner.target.clone(),
                    cause: "a store built from an application pool opens no connections of its own"
                        .to_owned(),
                })
            }
        };
        let (conn, _, host) = settings.open_checked(Kind::Coded).await?;
        Ok((conn, host))
    }
}

/// Behind a transaction-mode pooler: checks with a second connection that the pooler keeps the driver's prepared
/// statements, and returns that connection (verified like the first) for the pool.
async fn check_pooler(
    config: &StoreConfig,
    settings: &ConnectSettings,
    first: &mut AsyncPgConnection,
    direct: Option<&ConnectSettings>,
) -> Result<Option<AsyncPgConnection>> {
    if config.pooler == PoolerMode::Session {
        return Ok(None);
    }
    let target = &settings.target;
    let (mut second, ..) = settings.open_checked(Kind::Coded).await?;
    let shared =
        check_transaction_pooler(first, &mut second, target, config.connect_timeout).await?;
    match direct {
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
    Ok(Some(second))
}

/// The store's pool: every new connection opened and checked through `settings`, the verified connections
/// `first` (and `second`, the pooler check's) handed to it instead of being dropped.
fn build_pool(
    config: &StoreConfig,
    settings: &ConnectSettings,
    last_error: &LastError,
    first: AsyncPgConnection,
    second: Option<AsyncPgConnection>,
) -> Result<Pool> {
    let setup = settings.clone();
    let mut manager_config = ManagerConfig::default();
    manager_config.custom_setup = Box::new(move |_url| {
        let setup = setup.clone();
        Box::pin(async move {
            // Every new connection re-checks primary and identity: after a failover or a DNS change the
            // pool must not quietly start writing elsewhere.
            let (conn, ..) = setup
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
        .min_idle(0)
        .idle_timeout(config.idle_timeout)
        .reaper_rate(config.idle_timeout.min(Duration::from_secs(30)))
        .connection_timeout(config.checkout_timeout)
        // A ping on every checkout costs a round trip per operation (see `ping_on_checkout`); by default
        // broken connections are detected by the failing statement instead and then discarded.
        .test_on_check_out(config.ping_on_checkout)
        .error_sink(Box::new(last_error.clone()))
        .build_unchecked(manager);
    pool.add(first).map_err(|_| Error::Database {
        sqlstate: None,
        message: "the pool refused its first connection".to_owned(),
        source: None,
    })?;
    if let Some(second) = second {
        // Verified like the first (dropped if the pool is full).
        let _ = pool.add(second);
    }
    Ok(pool)
}
