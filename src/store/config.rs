//! [`StoreConfig`]: how a store reaches its database and what it expects of it.

use std::fmt;
#[cfg(feature = "tls")]
use std::sync::Arc;
use std::time::Duration;

use crate::connect::conninfo::redact;
use crate::connect::identity::{ConnectSettings, DatabaseIdentity, ExpectedIdentity};
use crate::connect::pooler::PoolerMode;
use crate::connect::Connector;
use crate::error::{Error, Result};
use crate::limits::DEFAULT_MIGRATION_LOCK_WAIT;
use crate::validate::validate_cluster;

/// How to reach the database and what to expect of it.
///
/// `Debug` never prints the connection string, only `user@host:port/database`.
#[derive(Clone)]
pub struct StoreConfig {
    url: String,
    pub(super) cluster: String,
    pub(super) pool_size: u32,
    pub(super) idle_timeout: Duration,
    pub(super) ping_on_checkout: bool,
    pub(super) connect_timeout: Duration,
    pub(super) checkout_timeout: Duration,
    pub(super) migration_lock_wait: Duration,
    pub(super) application_name: String,
    pub(super) expected: ExpectedIdentity,
    #[cfg(feature = "tls")]
    tls: Option<Arc<rustls::ClientConfig>>,
    pub(super) pooler: PoolerMode,
    pub(super) direct_url: Option<String>,
    pub(super) native_guard: bool,
}

impl fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreConfig")
            .field("target", &redact(&self.url))
            .field("cluster", &self.cluster)
            .field("pool_size", &self.pool_size)
            .field("idle_timeout", &self.idle_timeout)
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
            idle_timeout: Duration::from_secs(600),
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

    pub(super) fn connector(&self) -> Result<Connector> {
        self.connector_for(&self.url)
    }

    /// A connector for `url` with this configuration's TLS.
    pub(super) fn connector_for(&self, url: &str) -> Result<Connector> {
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            return Connector::with_tls(url, tls.clone());
        }
        Connector::new(url)
    }

    /// Checks the configuration and builds the way to its database: the connector, with the application name and
    /// connect timeout applied unless the connection string sets them, and the identity to expect.
    pub(super) fn settings(&self) -> Result<ConnectSettings> {
        validate_cluster(&self.cluster)?;
        if self.checkout_timeout.is_zero()
            || self.connect_timeout.is_zero()
            || self.migration_lock_wait.is_zero()
        {
            return Err(Error::invalid(
                "timeout",
                "connect and checkout timeouts and the migration lock wait must be positive",
            ));
        }
        let mut connector = self.connector()?;
        let pg = connector.config_mut();
        if pg.get_application_name().is_none() {
            pg.application_name(&self.application_name);
        }
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(self.connect_timeout);
        }
        Ok(ConnectSettings::new(connector, self.expected.clone()))
    }

    /// The way to the direct URL, when there is one: its connections must reach the database `seen` through
    /// `settings`.
    pub(super) fn direct_settings(
        &self,
        settings: &ConnectSettings,
        seen: &DatabaseIdentity,
    ) -> Result<Option<ConnectSettings>> {
        match &self.direct_url {
            Some(url) => Ok(Some(settings.for_direct_url(
                self.connector_for(url)?,
                &self.application_name,
                seen,
            ))),
            None => Ok(None),
        }
    }

    /// Maximum number of pooled connections (default 16).
    ///
    /// Size it for the tasks that write at once; the others wait their turn, first come, first served, up to
    /// the [checkout timeout](Self::checkout_timeout). The leader's renewals do not queue here (they keep a
    /// connection of their own).
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// How long a pooled connection may sit idle before the pool closes it (default 10 minutes, at least one
    /// second). A replica of a large fleet sets it short (`pgfence replica` uses 10 s), so that its pool
    /// shrinks to nothing between bursts of writes: at steady state it then keeps only its renewal connection
    /// and its listener. Idle connections are looked for every `min(idle_timeout, 30 s)`.
    pub fn idle_timeout(mut self, idle: Duration) -> Self {
        self.idle_timeout = idle.max(Duration::from_secs(1));
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
    /// `pgfence.fence`. See [`Store::native_guard`](crate::Store::native_guard).
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

    /// How long [`Store::migrate`](crate::Store::migrate) waits for another migration (or any session holding the migration lock) to
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
    /// `pool_mode = transaction`): [`Store::connect`](crate::Store::connect) then checks that the pooler keeps named prepared statements
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
    /// [`Store::migrate`](crate::Store::migrate) is refused.
    pub fn direct_url(mut self, url: impl Into<String>) -> Self {
        self.direct_url = Some(url.into());
        self
    }
}
