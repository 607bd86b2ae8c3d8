//! Every connection pgfence opens, one concern per file: the connection string ([`conninfo`]), TLS ([`tls`] and
//! its rustls side), sockets ([`socket`]), the SQLSTATE read off the wire ([`sqlstate`]), cancel requests
//! ([`cancel`]), the identity a new connection must show ([`identity`]) and what a pooler in between must keep
//! ([`pooler`]).
//!
//! [`Connector::reach`] is the one place where the hosts of a connection string are tried: in order, each within
//! the connect timeout as a whole (libpq's rule; tokio-postgres's own timeout covers only the socket), each
//! checked against `target_session_attrs`, and the failures of all of them named in one error. The pool, the
//! leader's renewals, migrations, the LISTEN connection and [`Connector::connect`] all open their connections
//! through it.

use std::fmt;
use std::str::FromStr;
#[cfg(feature = "tls")]
use std::sync::Arc;

use diesel_async::AsyncPgConnection;
use tokio_postgres::tls::MakeTlsConnect;

use crate::error::{error_chain, Error, Result};
use conninfo::{describe, process_env, single_host, split_tls_parameters, Given};
use socket::Socket;
use sqlstate::WireStream;
use tls::{Attempt, SslMode, TlsSettings};

pub(crate) mod cancel;
pub(crate) mod conninfo;
pub(crate) mod identity;
pub(crate) mod pooler;
pub(crate) mod socket;
pub(crate) mod sqlstate;
pub(crate) mod tls;
#[cfg(feature = "tls")]
mod verify;

/// The decrypted stream of a TLS connection opened by a [`Connector`], read through a [`WireStream`] for the
/// SQLSTATE of every error (a plaintext connection never uses it).
#[cfg(feature = "tls")]
pub type TlsStream = verify::Decrypted<tokio_postgres::Socket>;

/// The stream of a TLS connection opened by a [`Connector`] (built without the `tls` feature: plaintext only).
#[cfg(not(feature = "tls"))]
pub type TlsStream = tokio_postgres::tls::NoTlsStream;

/// A connection opened by [`Connector::connect`]: drive it (spawn it) for the [`tokio_postgres::Client`] to work,
/// or hand both to diesel-async (`AsyncPgConnection::try_from_client_and_connection`).
pub type Connection = tokio_postgres::Connection<tokio_postgres::Socket, TlsStream>;

/// The TLS stream of a connection of pgfence's own pool: decrypted bytes over a socket pgfence opened.
#[cfg(feature = "tls")]
pub(crate) type PoolTlsStream = verify::Decrypted<WireStream<Socket>>;
#[cfg(not(feature = "tls"))]
pub(crate) type PoolTlsStream = tokio_postgres::tls::NoTlsStream;

/// A connection of pgfence's own pool: every byte, plaintext or decrypted, passes through a [`WireStream`].
pub(crate) type PoolConnection = tokio_postgres::Connection<WireStream<Socket>, PoolTlsStream>;

/// How pgfence opens a connection: the connection string with its TLS parameters resolved (connection string
/// first, then the libpq environment), and the TLS configuration they describe.
///
/// [`Store::connect`](crate::Store::connect) builds one from its [`StoreConfig`](crate::StoreConfig); it is public
/// for code that wants its own tokio-postgres client secured exactly like pgfence's connections (the `pgfence`
/// command's tools do).
///
/// ```no_run
/// # async fn example() -> pgfence::Result<()> {
/// let connector = pgfence::connection::Connector::new(
///     "postgres://app@db.example.com/control?sslmode=verify-full&sslrootcert=/etc/ssl/certs/rds-ca.pem",
/// )?;
/// let (client, connection) = connector.connect().await?;
/// tokio::spawn(connection);
/// client.simple_query("SELECT 1").await.ok();
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Connector {
    config: tokio_postgres::Config,
    tls: TlsSettings,
    target: String,
    /// The application's own rustls configuration ([`Connector::with_tls`]).
    custom: Option<tls::Custom>,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("target", &self.target)
            .field("sslmode", &self.tls.mode)
            .field("roots", &self.tls.roots)
            .field(
                "client_certificate",
                &self.tls.client.as_ref().map(|c| &c.0),
            )
            .field("application_tls", &self.custom.is_some())
            .finish()
    }
}

/// Which connection [`Connector::open`] opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// For the pool, migrations and the leader's renewals: over a socket pgfence opened, so that every error's
    /// SQLSTATE is read off the wire ([`WireStream`](crate::connection::WireStream)); pgfence drives it (diesel-async drives
    /// only tokio-postgres's own sockets), so diesel-async's `notifications_stream` stays empty on it.
    Coded,
    /// For LISTEN: opened and driven by tokio-postgres and diesel-async, so that notifications arrive; only a TLS
    /// connection's errors are read off the wire.
    Listening,
}

impl Connector {
    /// Parses a connection string (a `postgres://` URL or `key=value` pairs) and resolves its TLS parameters,
    /// falling back to `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT` and `PGSSLKEY` for those it does not give.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidUrl`] for a malformed string or an inconsistent TLS setup (an unknown `sslmode`,
    ///   `verify-full` without root certificates).
    /// - [`Error::Tls`] when a certificate or key file cannot be read — or when TLS is demanded of a build
    ///   without the `tls` feature.
    pub fn new(url: &str) -> Result<Connector> {
        Self::build(url, &process_env, false)
    }

    /// As [`new`](Self::new), with an application's own rustls configuration instead of the certificate
    /// parameters (see [`StoreConfig::tls`](crate::StoreConfig::tls)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a malformed string, an unknown `sslmode`, or `sslrootcert`, `sslcert` or
    /// `sslkey` in the string (they belong in the configuration, which replaces them; the `PGSSL*` file
    /// variables of the environment are ignored).
    #[cfg(feature = "tls")]
    pub fn with_tls(url: &str, tls: Arc<rustls::ClientConfig>) -> Result<Connector> {
        let mut connector = Self::build(url, &process_env, true)?;
        connector.custom = Some(tls::Custom::new(Arc::unwrap_or_clone(tls)));
        Ok(connector)
    }

    fn build(url: &str, env: &dyn Fn(&str) -> Option<String>, custom: bool) -> Result<Connector> {
        let (rest, given) = split_tls_parameters(url)?;
        let mut config =
            tokio_postgres::Config::from_str(&rest).map_err(|e| Error::InvalidUrl {
                reason: e.to_string(),
            })?;
        let given = if custom {
            // Only the mode: the application's configuration stands for the certificate parameters, and stray
            // PGSSLROOTCERT/PGSSLCERT/PGSSLKEY in the environment must not make it unusable.
            Given {
                mode: given
                    .mode
                    .or_else(|| env("PGSSLMODE").filter(|v| !v.is_empty())),
                ..given
            }
        } else {
            given.or_env(env)
        };
        let tls = TlsSettings::resolve(given, env, custom)?;
        let target = describe(&config);
        let unix_only = !config.get_hosts().is_empty()
            && config
                .get_hosts()
                .iter()
                .all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)));
        config.ssl_mode(match tls.mode {
            // The server offers no TLS on a Unix socket; libpq does not ask there.
            _ if unix_only => tokio_postgres::config::SslMode::Disable,
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer if cfg!(feature = "tls") => tokio_postgres::config::SslMode::Prefer,
            SslMode::Prefer => tokio_postgres::config::SslMode::Disable,
            _ => tokio_postgres::config::SslMode::Require,
        });
        let connector = Connector {
            config,
            tls,
            target,
            custom: None,
        };
        if connector.tls.mode.requires_tls() && !cfg!(feature = "tls") {
            return Err(tls::tls_error(
                &connector.target,
                format!(
                    "sslmode={} needs TLS, and pgfence was built without its `tls` feature",
                    connector.tls.mode
                ),
            ));
        }
        if !custom {
            // Fail now, not at the first connection, on an unreadable certificate or key.
            #[cfg(feature = "tls")]
            connector.tls.client_config(&connector.target)?;
        }
        Ok(connector)
    }

    /// The tokio-postgres configuration, without the TLS parameters pgfence handles.
    pub fn config(&self) -> &tokio_postgres::Config {
        &self.config
    }

    /// The tokio-postgres configuration, to set `application_name`, timeouts and the like before connecting.
    pub fn config_mut(&mut self) -> &mut tokio_postgres::Config {
        &mut self.config
    }

    /// The effective `sslmode`.
    pub fn ssl_mode(&self) -> SslMode {
        self.tls.mode
    }

    /// The database as `user@host:port/database` (no credentials).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// One connector per host of a multi-host connection string (`host=a,b`, `postgres://a,b/…`), in the order
    /// given, each with that host only and naming it; a single-host connector as it is. pgfence tries the hosts
    /// itself, so that the connect timeout bounds each host's whole attempt as in libpq (tokio-postgres's bounds
    /// only the socket) and every message names the host it is about.
    pub(crate) fn per_host(&self) -> Vec<Connector> {
        let hosts = self.config.get_hosts();
        if hosts.len() <= 1 {
            return vec![self.clone()];
        }
        (0..hosts.len())
            .map(|i| {
                let mut one = self.clone();
                one.config = single_host(&self.config, i);
                one.target = describe(&one.config);
                one
            })
            .collect()
    }

    /// The TLS settings as libpq environment variables (`PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`), for
    /// a libpq tool such as `psql` or `pgbench` to connect the same way. An application's own rustls
    /// configuration has no such form: only `PGSSLMODE` is given then.
    pub fn libpq_env(&self) -> Vec<(&'static str, String)> {
        self.tls.libpq_env()
    }

    /// Opens a connection: the hosts of a multi-host string are tried in order, each within the connect timeout as
    /// a whole. `prefer` falls back to plaintext when the server offers no TLS or the handshake fails (logged at
    /// debug level).
    ///
    /// # Errors
    ///
    /// - [`Error::Tls`] when the handshake fails (the server's certificate failed verification: "unknown
    ///   issuer", "certificate not valid for name …") or the server does not support the TLS the mode demands.
    /// - [`Error::NotPrimary`] when `target_session_attrs=read-write` found only standbys.
    /// - [`Error::Connect`] for everything else (refused, authentication, timeout), naming each host's cause.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future closes the socket it was opening; nothing persists.
    pub async fn connect(&self) -> Result<(tokio_postgres::Client, Connection)> {
        self.reach(|host| async move { host.connect_driven().await })
            .await
            .map(|(connected, _)| connected)
    }

    /// Opens a diesel-async connection of `kind`; returns it with the connector of the host it reached (the one
    /// its cancel requests must go to).
    pub(crate) async fn open(&self, kind: Kind) -> Result<(AsyncPgConnection, Connector)> {
        self.reach(|host| async move { host.open_one(kind).await })
            .await
    }

    /// Tries the hosts of a multi-host connection string in order, opening each with `open` (given that host's
    /// connector) until one succeeds; returns what it opened and the connector of the host it reached. Each host's whole attempt
    /// (socket, TLS, startup, authentication, `target_session_attrs`) is bounded by the connect timeout, as in
    /// libpq: a first host that accepts TCP and never answers costs one timeout, not the whole attempt. When every
    /// host failed, the error names each with its cause, and it is [`Error::NotPrimary`] when a host was refused
    /// only for being read-only; a single host's error is returned as it is.
    pub(crate) async fn reach<T, F>(&self, open: impl Fn(Connector) -> F) -> Result<(T, Connector)>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        let limit = self.config.get_connect_timeout().copied();
        let hosts = self.per_host();
        let single = hosts.len() == 1;
        let mut failures = Vec::new();
        let mut read_only = false;
        let mut all_tls = true;
        for host in hosts {
            let target = host.target.clone();
            let attempt = open(host.clone());
            let outcome = match limit {
                Some(limit) => tokio::time::timeout(limit, attempt)
                    .await
                    .unwrap_or_else(|_| {
                        Err(Error::Connect {
                            target: target.clone(),
                            cause: format!("no answer to the connection startup within {limit:?}"),
                        })
                    }),
                None => attempt.await,
            };
            let error = match outcome {
                Ok(opened) => return Ok((opened, host)),
                Err(e) => e,
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
            tracing::debug!(host = %target, %cause, "host not usable; trying the next");
            failures.push(format!("{target}: {cause}"));
        }
        let target = failures.join("; ");
        if read_only {
            return Err(Error::NotPrimary { target });
        }
        if all_tls {
            return Err(tls::tls_error(&self.target, target));
        }
        Err(Error::Connect {
            target: self.target.clone(),
            cause: format!("no host could be used: {target}"),
        })
    }

    /// Opens a diesel-async connection of `kind` to this connector's single host (no timeout of its own).
    async fn open_one(&self, kind: Kind) -> Result<AsyncPgConnection> {
        let opened = match kind {
            Kind::Listening => {
                let (client, connection) = self.connect_driven().await?;
                AsyncPgConnection::try_from_client_and_connection(client, connection).await
            }
            Kind::Coded => {
                let (client, connection) = self.connect_coded().await?;
                drive(connection, self.target.clone());
                AsyncPgConnection::try_from(client).await
            }
        };
        opened.map_err(|e| Error::Connect {
            target: self.target.clone(),
            cause: e.to_string(),
        })
    }

    /// Opens a connection to this connector's single host over tokio-postgres's own socket (which diesel-async
    /// can drive, and which delivers notifications); `target_session_attrs` is checked here, as for every host.
    async fn connect_driven(&self) -> Result<(tokio_postgres::Client, Connection)> {
        let tls = self.tls.make_tls(self.custom.as_ref(), &self.target)?;
        self.tls
            .with_prefer_fallback(
                &self.config,
                &self.target,
                tls,
                |mut config, tls| async move {
                    let progress = tls::progress(&tls);
                    config.target_session_attrs(tokio_postgres::config::TargetSessionAttrs::Any);
                    let connected = config.connect(tls).await;
                    self.settle(&config, &progress, connected).await
                },
            )
            .await
    }

    /// Opens a connection to this connector's single host over a socket pgfence opens (see [`Socket`]), so that
    /// every byte passes through a [`WireStream`].
    async fn connect_coded(&self) -> Result<(tokio_postgres::Client, PoolConnection)> {
        let tls = self.tls.make_tls(self.custom.as_ref(), &self.target)?;
        self.tls
            .with_prefer_fallback(
                &self.config,
                &self.target,
                tls,
                |config, mut tls| async move {
                    let progress = tls::progress(&tls);
                    let (host, hostaddr, port) =
                        self.address().map_err(|e| Attempt::Other(e.to_string()))?;
                    let socket =
                        Socket::open(&config, &host, hostaddr, port)
                            .await
                            .map_err(|e| {
                                Attempt::Other(format!(
                                    "error connecting to server: {}",
                                    error_chain(&e)
                                ))
                            })?;
                    let handshake = MakeTlsConnect::<WireStream<Socket>>::make_tls_connect(
                        &mut tls,
                        server_name(&host),
                    )
                    .map_err(|e| Attempt::Handshake(e.to_string()))?;
                    let connected = config
                        .connect_raw(WireStream::socket(socket), handshake)
                        .await;
                    self.settle(&config, &progress, connected).await
                },
            )
            .await
    }

    /// The host this connector reaches (its first, for a multi-host string: see [`per_host`](Self::per_host)),
    /// with its `hostaddr` and port.
    fn address(&self) -> Result<(tokio_postgres::config::Host, Option<std::net::IpAddr>, u16)> {
        let hosts = self.config.get_hosts();
        let addrs = self.config.get_hostaddrs();
        let ports = self.config.get_ports();
        let host = match (hosts.first(), addrs.first()) {
            (Some(host), _) => host.clone(),
            (None, Some(ip)) => tokio_postgres::config::Host::Tcp(ip.to_string()),
            (None, None) => {
                return Err(Error::Connect {
                    target: self.target.clone(),
                    cause: "the connection string names no host".to_owned(),
                })
            }
        };
        Ok((
            host,
            addrs.first().copied(),
            ports.first().copied().unwrap_or(5432),
        ))
    }

    /// One attempt's end, whichever socket it used: a session that started is checked against
    /// `target_session_attrs` (a plaintext `prefer` session noted); a failure is classified for the host loop.
    async fn settle<S, T>(
        &self,
        config: &tokio_postgres::Config,
        progress: &tls::Progress,
        connected: std::result::Result<
            (tokio_postgres::Client, tokio_postgres::Connection<S, T>),
            tokio_postgres::Error,
        >,
    ) -> std::result::Result<(tokio_postgres::Client, tokio_postgres::Connection<S, T>), Attempt>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        match connected {
            Ok(connected) => {
                self.tls.note_plaintext(&self.target, progress);
                self.check_session(connected)
                    .await
                    .map_err(Attempt::Session)
            }
            Err(e) => Err(self.tls.failed_attempt(config, progress, &e)),
        }
    }

    /// `target_session_attrs=read-write` (or `read-only`), checked as tokio-postgres does on a connection it opens:
    /// `SHOW transaction_read_only`, driving the connection meanwhile.
    async fn check_session<S, T>(
        &self,
        (client, mut connection): (tokio_postgres::Client, tokio_postgres::Connection<S, T>),
    ) -> Result<(tokio_postgres::Client, tokio_postgres::Connection<S, T>)>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        use tokio_postgres::config::TargetSessionAttrs;
        let wanted = self.config.get_target_session_attrs();
        if wanted == TargetSessionAttrs::Any {
            return Ok((client, connection));
        }
        let fail = |cause: String| Error::Connect {
            target: self.target.clone(),
            cause,
        };
        let rows = {
            let show = client.simple_query("SHOW transaction_read_only");
            tokio::select! {
                rows = show => rows.map_err(|e| fail(error_chain(&e)))?,
                ended = &mut connection => {
                    return Err(fail(match ended {
                        Ok(()) => "the server closed the connection".to_owned(),
                        Err(e) => error_chain(&e),
                    }));
                }
            }
        };
        let read_only = rows.iter().any(|message| {
            matches!(message, tokio_postgres::SimpleQueryMessage::Row(row) if row.get(0) == Some("on"))
        });
        match (wanted, read_only) {
            (TargetSessionAttrs::ReadWrite, true) => Err(Error::NotPrimary {
                target: self.target.clone(),
            }),
            (TargetSessionAttrs::ReadOnly, false) => Err(fail(
                "the server accepts writes and target_session_attrs=read-only".to_owned(),
            )),
            _ => Ok((client, connection)),
        }
    }
}

/// The name the server's certificate must carry (verify-full); a Unix socket never uses TLS.
fn server_name(host: &tokio_postgres::config::Host) -> &str {
    match host {
        tokio_postgres::config::Host::Tcp(name) => name.as_str(),
        #[cfg(unix)]
        tokio_postgres::config::Host::Unix(_) => "",
    }
}

/// Drives a pool connection until its client is dropped (the connection then ends itself) or it fails.
fn drive(mut connection: PoolConnection, target: String) {
    tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let Err(e) = message {
                tracing::debug!(database = %target, error = %error_chain(&e), "connection ended");
                break;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::conninfo::env_of;

    #[test]
    fn an_application_configuration_reads_only_the_mode_from_the_environment() {
        let env = env_of(&[("PGSSLMODE", "prefer"), ("PGSSLROOTCERT", "/env/ca.pem")]);
        let connector = Connector::build("postgres://app@db/control", &env, true).unwrap();
        assert_eq!(connector.ssl_mode(), SslMode::Prefer);
        let connector = Connector::build("postgres://app@db/control", &env_of(&[]), true).unwrap();
        assert_eq!(connector.ssl_mode(), SslMode::Require);
        let err =
            Connector::build("postgres://app@db/control?sslcert=/c.pem", &env, true).unwrap_err();
        assert!(matches!(err, Error::InvalidUrl { .. }), "{err}");
    }
}
