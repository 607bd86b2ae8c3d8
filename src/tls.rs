//! TLS for every connection pgfence opens, with libpq's parameters and semantics.
//!
//! A connection string (URL query parameters or `key=value` pairs) may carry `sslmode`, `sslrootcert`, `sslcert`
//! and `sslkey`; what it leaves out is read from `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT` and `PGSSLKEY`, as libpq
//! does. tokio-postgres's own parser knows `disable`, `prefer` and `require` only, so [`Connector`] takes these
//! parameters out of the string first and hands the rest to [`tokio_postgres::Config`].
//!
//! | `sslmode` | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (default) | when the server offers it; plaintext otherwise, and after a failed handshake | checked against the root certificates when there are any (see below), else not at all |
//! | `require` | always | as for `prefer`: with a root certificate it is checked like `verify-ca` |
//! | `verify-ca` | always | must chain to a root in `sslrootcert`; any host name |
//! | `verify-full` | always | must chain to a root in `sslrootcert` and name the host connected to |
//!
//! `sslrootcert` is a PEM file of one or more CA certificates, or `system` for the operating system's trust
//! store (then `sslmode` defaults to `verify-full` and weaker modes are refused, as in libpq 16). Without it,
//! `~/.postgresql/root.crt` is used when it exists. `sslcert`/`sslkey` (PEM; default
//! `~/.postgresql/postgresql.crt`/`.key` when they exist) present a client certificate. Files are read at every
//! new connection, so rotated certificates are picked up without a restart. Unix-socket connections never use
//! TLS (the server offers none there), whatever the mode.
//!
//! Where pgfence differs from libpq: an `sslcert`, `sslkey` or `sslrootcert` named explicitly that cannot be read
//! is an error (libpq ignores a missing client certificate); `sslmode=allow` is refused; the key file's
//! permissions are not checked.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

#[cfg(feature = "tls")]
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::wire::WireStream;

/// libpq's `sslmode`: whether TLS is used and what the server's certificate must prove.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SslMode {
    /// Plaintext only.
    Disable,
    /// TLS when the server offers it and the handshake succeeds, plaintext otherwise (libpq's default).
    Prefer,
    /// TLS always; the certificate is checked only when root certificates are configured.
    Require,
    /// TLS always; the certificate must chain to a configured root; the host name is not checked.
    VerifyCa,
    /// TLS always; the certificate must chain to a configured root and name the host.
    VerifyFull,
}

impl SslMode {
    /// The name in connection strings (`verify-full`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether a connection without TLS is refused.
    pub fn requires_tls(self) -> bool {
        matches!(
            self,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull
        )
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SslMode {
    type Err = Error;

    fn from_str(text: &str) -> Result<SslMode> {
        Ok(match text {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            "allow" => {
                return Err(Error::InvalidUrl {
                    reason: "sslmode=allow is not supported: use prefer (TLS when offered) or require"
                        .to_owned(),
                })
            }
            other => {
                return Err(Error::InvalidUrl {
                    reason: format!(
                        "invalid sslmode {other:?}: expected disable, prefer, require, verify-ca or verify-full"
                    ),
                })
            }
        })
    }
}

/// The connection-string parameters pgfence reads itself, and the libpq environment variable of each.
const TLS_PARAMETERS: [(&str, &str); 4] = [
    ("sslmode", "PGSSLMODE"),
    ("sslrootcert", "PGSSLROOTCERT"),
    ("sslcert", "PGSSLCERT"),
    ("sslkey", "PGSSLKEY"),
];

/// The TLS parameters as given: by the connection string, else by the environment.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Given {
    mode: Option<String>,
    root_cert: Option<String>,
    cert: Option<String>,
    key: Option<String>,
}

impl Given {
    fn slot(&mut self, name: &str) -> Option<&mut Option<String>> {
        match name {
            "sslmode" => Some(&mut self.mode),
            "sslrootcert" => Some(&mut self.root_cert),
            "sslcert" => Some(&mut self.cert),
            "sslkey" => Some(&mut self.key),
            _ => None,
        }
    }

    /// Fills what the connection string left out from the environment (libpq's precedence).
    fn or_env(mut self, env: &dyn Fn(&str) -> Option<String>) -> Given {
        for (name, var) in TLS_PARAMETERS {
            if let Some(slot) = self.slot(name) {
                if slot.is_none() {
                    *slot = env(var).filter(|v| !v.is_empty());
                }
            }
        }
        self
    }
}

/// Takes pgfence's TLS parameters out of a connection string: returns the rest (for tokio-postgres) and the
/// parameters. A string that does not parse is returned whole, for tokio-postgres to report.
fn split_tls_parameters(url: &str) -> Result<(String, Given)> {
    let mut given = Given::default();
    let rest = if let Some(scheme) = ["postgres://", "postgresql://"]
        .into_iter()
        .find(|s| url.starts_with(s))
    {
        // As tokio-postgres (and libpq) read a URL: the credentials end at the first `@`, the query starts at the
        // first `?` after them.
        let after_scheme = &url[scheme.len()..];
        let host_start = after_scheme.find('@').map_or(0, |at| at + 1);
        let Some(q) = after_scheme[host_start..].find('?') else {
            return Ok((url.to_owned(), given));
        };
        let query_at = scheme.len() + host_start + q;
        let mut kept = Vec::new();
        for pair in url[query_at + 1..].split('&') {
            let slot = pair
                .split_once('=')
                .and_then(|(key, value)| Some((given.slot(&percent_decode(key)?)?, value)));
            match slot {
                Some((slot, value)) => {
                    *slot = Some(percent_decode(value).ok_or_else(|| Error::InvalidUrl {
                        reason: "a TLS parameter is not valid percent-encoded UTF-8".to_owned(),
                    })?)
                }
                None => kept.push(pair),
            }
        }
        let mut rest = url[..query_at].to_owned();
        if !kept.is_empty() {
            rest.push('?');
            rest.push_str(&kept.join("&"));
        }
        rest
    } else {
        let Some(pairs) = keyword_pairs(url) else {
            return Ok((url.to_owned(), given));
        };
        let mut kept = Vec::new();
        for (key, value, span) in pairs {
            match given.slot(key) {
                Some(slot) => *slot = Some(value),
                None => kept.push(&url[span]),
            }
        }
        kept.join(" ")
    };
    Ok((rest, given))
}

fn percent_decode(text: &str) -> Option<String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .ok()
        .map(|s| s.into_owned())
}

/// The `key = value` pairs of a libpq keyword/value string (values quoted with `'`, `\` escaping the next
/// character), each with its byte span; `None` if it does not parse. The grammar is tokio-postgres's.
fn keyword_pairs(text: &str) -> Option<Vec<(&str, String, std::ops::Range<usize>)>> {
    let bytes: Vec<(usize, char)> = text.char_indices().collect();
    let mut i = 0;
    let at = |i: usize| bytes.get(i).map_or(text.len(), |&(at, _)| at);
    let mut pairs = Vec::new();
    loop {
        while bytes.get(i).is_some_and(|&(_, c)| c.is_whitespace()) {
            i += 1;
        }
        if i == bytes.len() {
            return Some(pairs);
        }
        let start = i;
        while bytes
            .get(i)
            .is_some_and(|&(_, c)| !c.is_whitespace() && c != '=')
        {
            i += 1;
        }
        let key = &text[at(start)..at(i)];
        while bytes.get(i).is_some_and(|&(_, c)| c.is_whitespace()) {
            i += 1;
        }
        if key.is_empty() || bytes.get(i).map(|&(_, c)| c) != Some('=') {
            return None;
        }
        i += 1;
        while bytes.get(i).is_some_and(|&(_, c)| c.is_whitespace()) {
            i += 1;
        }
        let mut value = String::new();
        let quoted = bytes.get(i).map(|&(_, c)| c) == Some('\'');
        if quoted {
            i += 1;
        }
        loop {
            match bytes.get(i).map(|&(_, c)| c) {
                None if quoted => return None,
                None => break,
                Some('\'') if quoted => {
                    i += 1;
                    break;
                }
                Some(c) if c.is_whitespace() && !quoted => break,
                Some('\\') => {
                    if let Some(&(_, next)) = bytes.get(i + 1) {
                        value.push(next);
                    }
                    i += 2;
                }
                Some(c) => {
                    value.push(c);
                    i += 1;
                }
            }
        }
        if !quoted && value.is_empty() {
            return None;
        }
        pairs.push((key, value, at(start)..at(i.min(bytes.len()))));
    }
}

/// Where the certificates that vouch for the server come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Roots {
    /// None configured: the certificate is not checked (`prefer`, `require` only).
    None,
    /// A PEM file of CA certificates.
    File(PathBuf),
    /// The operating system's trust store (`sslrootcert=system`).
    System,
}

impl fmt::Display for Roots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Roots::None => f.write_str("no root certificates"),
            Roots::File(path) => write!(f, "sslrootcert {}", path.display()),
            Roots::System => f.write_str("the system's trust store (sslrootcert=system)"),
        }
    }
}

/// How TLS is set up for one connection string: the mode, the roots and the client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TlsSettings {
    mode: SslMode,
    roots: Roots,
    /// Certificate chain and private key files.
    client: Option<(PathBuf, PathBuf)>,
}

/// `~/.postgresql/NAME`, libpq's default place for certificates.
fn default_file(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<PathBuf> {
    env("HOME")
        .filter(|home| !home.is_empty())
        .map(|home| Path::new(&home).join(".postgresql").join(name))
}

impl TlsSettings {
    fn resolve(
        given: Given,
        env: &dyn Fn(&str) -> Option<String>,
        custom: bool,
    ) -> Result<TlsSettings> {
        let mode = given.mode.as_deref().map(SslMode::from_str).transpose()?;
        if custom {
            // The application's rustls configuration decides roots and client certificates.
            if given.root_cert.is_some() || given.cert.is_some() || given.key.is_some() {
                return Err(Error::InvalidUrl {
                    reason: "sslrootcert, sslcert and sslkey cannot be combined with an application's own TLS \
                             configuration (StoreConfig::tls): put them into that configuration"
                        .to_owned(),
                });
            }
            return Ok(TlsSettings {
                mode: mode.unwrap_or(SslMode::Require),
                roots: Roots::None,
                client: None,
            });
        }
        let roots = match given.root_cert.as_deref() {
            Some("system") => Roots::System,
            Some(path) => Roots::File(PathBuf::from(path)),
            None => match default_file(env, "root.crt") {
                Some(path) if path.is_file() => Roots::File(path),
                _ => Roots::None,
            },
        };
        let mode = match (mode, &roots) {
            (None, Roots::System) => SslMode::VerifyFull,
            (Some(weak), Roots::System) if weak != SslMode::VerifyFull => {
                return Err(Error::InvalidUrl {
                    reason: format!(
                        "weak sslmode {weak} may not be used with sslrootcert=system (use verify-full)"
                    ),
                })
            }
            (mode, _) => mode.unwrap_or(SslMode::Prefer),
        };
        if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) && roots == Roots::None {
            return Err(Error::InvalidUrl {
                reason: format!(
                    "sslmode={mode} needs root certificates to verify the server against: set sslrootcert=/path/to/ca.pem \
                     (or PGSSLROOTCERT, or sslrootcert=system for the system's trust store)"
                ),
            });
        }
        let client = match (given.cert, given.key) {
            (Some(cert), key) => Some((
                PathBuf::from(cert),
                key.map(PathBuf::from)
                    .or_else(|| default_file(env, "postgresql.key"))
                    .ok_or_else(|| Error::InvalidUrl {
                        reason: "sslcert needs sslkey (no HOME for ~/.postgresql/postgresql.key)"
                            .to_owned(),
                    })?,
            )),
            (None, Some(_)) => {
                return Err(Error::InvalidUrl {
                    reason: "sslkey without sslcert".to_owned(),
                })
            }
            (None, None) => match (
                default_file(env, "postgresql.crt"),
                default_file(env, "postgresql.key"),
            ) {
                (Some(cert), Some(key)) if cert.is_file() => Some((cert, key)),
                _ => None,
            },
        };
        Ok(TlsSettings {
            mode,
            roots,
            client,
        })
    }

    /// What libpq-based tools (psql, pgbench) need in their environment to connect the same way.
    fn libpq_env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![("PGSSLMODE", self.mode.as_str().to_owned())];
        match &self.roots {
            Roots::None => {}
            Roots::File(path) => env.push(("PGSSLROOTCERT", path.display().to_string())),
            Roots::System => env.push(("PGSSLROOTCERT", "system".to_owned())),
        }
        if let Some((cert, key)) = &self.client {
            env.push(("PGSSLCERT", cert.display().to_string()));
            env.push(("PGSSLKEY", key.display().to_string()));
        }
        env
    }
}

/// The decrypted stream of a TLS connection opened by a [`Connector`], read through a [`WireStream`] for the
/// SQLSTATE of every error (a plaintext connection never uses it).
#[cfg(feature = "tls")]
pub type TlsStream = rustls_connect::Decrypted<tokio_postgres::Socket>;

/// The stream of a TLS connection opened by a [`Connector`] (built without the `tls` feature: plaintext only).
#[cfg(not(feature = "tls"))]
pub type TlsStream = tokio_postgres::tls::NoTlsStream;

/// A connection opened by [`Connector::connect`]: drive it (spawn it) for the [`tokio_postgres::Client`] to work,
/// or hand both to diesel-async (`AsyncPgConnection::try_from_client_and_connection`).
pub type Connection = tokio_postgres::Connection<tokio_postgres::Socket, TlsStream>;

/// The TLS stream of a connection of pgfence's own pool: decrypted bytes over a socket pgfence opened.
#[cfg(feature = "tls")]
pub(crate) type PoolTlsStream = rustls_connect::Decrypted<WireStream<Socket>>;
#[cfg(not(feature = "tls"))]
pub(crate) type PoolTlsStream = tokio_postgres::tls::NoTlsStream;

/// A connection of pgfence's own pool: every byte, plaintext or decrypted, passes through a [`WireStream`].
pub(crate) type PoolConnection = tokio_postgres::Connection<WireStream<Socket>, PoolTlsStream>;

/// A TCP or Unix-domain socket to one PostgreSQL server, opened by pgfence itself (with tokio-postgres's
/// settings: connect timeout, `TCP_NODELAY`, keepalives, `tcp_user_timeout`) so that its plaintext bytes too pass
/// through a [`WireStream`]. diesel-async accepts only tokio-postgres's own socket type for the connections it
/// drives, so these are used for pgfence's pool, whose connections pgfence drives itself.
#[derive(Debug)]
pub(crate) struct Socket(SocketKind);

#[derive(Debug)]
enum SocketKind {
    Tcp(tokio::net::TcpStream),
    #[cfg(unix)]
    Unix(tokio::net::UnixStream),
}

impl Socket {
    /// Opens a socket to `host` (a name, an address or, on Unix, a socket directory) and `port`, trying each
    /// address the name resolves to; `hostaddr` skips the lookup. Each attempt is bounded by the connect timeout.
    async fn open(
        config: &tokio_postgres::Config,
        host: &tokio_postgres::config::Host,
        hostaddr: Option<std::net::IpAddr>,
        port: u16,
    ) -> std::io::Result<Socket> {
        use tokio_postgres::config::Host;
        let timeout = config.get_connect_timeout().copied();
        let bounded =
            |what: String| move |_| std::io::Error::new(std::io::ErrorKind::TimedOut, what);
        let addresses: Vec<std::net::SocketAddr> =
            match (host, hostaddr) {
                (_, Some(ip)) => vec![(ip, port).into()],
                (Host::Tcp(name), None) => tokio::net::lookup_host((name.as_str(), port))
                    .await?
                    .collect(),
                #[cfg(unix)]
                (Host::Unix(dir), None) => {
                    let path = dir.join(format!(".s.PGSQL.{port}"));
                    let connecting = tokio::net::UnixStream::connect(&path);
                    let stream =
                        match timeout {
                            Some(limit) => tokio::time::timeout(limit, connecting).await.map_err(
                                bounded(format!("connecting to {} timed out", path.display())),
                            )??,
                            None => connecting.await?,
                        };
                    return Ok(Socket(SocketKind::Unix(stream)));
                }
            };
        let mut last = None;
        for address in addresses {
            let connecting = tokio::net::TcpStream::connect(address);
            let stream = match timeout {
                Some(limit) => match tokio::time::timeout(limit, connecting).await {
                    Ok(stream) => stream,
                    Err(elapsed) => Err(bounded(format!("connecting to {address} timed out"))(
                        elapsed,
                    )),
                },
                None => connecting.await,
            };
            match stream.and_then(|stream| Self::tune(config, stream)) {
                Ok(socket) => return Ok(socket),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "could not resolve any addresses",
            )
        }))
    }

    /// tokio-postgres's socket settings: no Nagle delay, keepalives as configured, `tcp_user_timeout`.
    fn tune(
        config: &tokio_postgres::Config,
        stream: tokio::net::TcpStream,
    ) -> std::io::Result<Socket> {
        stream.set_nodelay(true)?;
        let socket = socket2::SockRef::from(&stream);
        #[cfg(target_os = "linux")]
        if let Some(limit) = config.get_tcp_user_timeout() {
            socket.set_tcp_user_timeout(Some(*limit))?;
        }
        if config.get_keepalives() {
            #[allow(unused_mut)]
            let mut keepalive =
                socket2::TcpKeepalive::new().with_time(config.get_keepalives_idle());
            #[cfg(not(any(
                target_os = "aix",
                target_os = "redox",
                target_os = "solaris",
                target_os = "openbsd"
            )))]
            if let Some(interval) = config.get_keepalives_interval() {
                keepalive = keepalive.with_interval(interval);
            }
            #[cfg(not(any(
                target_os = "aix",
                target_os = "redox",
                target_os = "solaris",
                target_os = "windows",
                target_os = "openbsd"
            )))]
            if let Some(retries) = config.get_keepalives_retries() {
                keepalive = keepalive.with_retries(retries);
            }
            socket.set_tcp_keepalive(&keepalive)?;
        }
        Ok(Socket(SocketKind::Tcp(stream)))
    }
}

impl tokio::io::AsyncRead for Socket {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match &mut self.get_mut().0 {
            SocketKind::Tcp(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            #[cfg(unix)]
            SocketKind::Unix(s) => std::pin::Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for Socket {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match &mut self.get_mut().0 {
            SocketKind::Tcp(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            #[cfg(unix)]
            SocketKind::Unix(s) => std::pin::Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match &mut self.get_mut().0 {
            SocketKind::Tcp(s) => std::pin::Pin::new(s).poll_flush(cx),
            #[cfg(unix)]
            SocketKind::Unix(s) => std::pin::Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match &mut self.get_mut().0 {
            SocketKind::Tcp(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            #[cfg(unix)]
            SocketKind::Unix(s) => std::pin::Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// How pgfence opens a connection: the connection string with its TLS parameters resolved (connection string
/// first, then the libpq environment), and the TLS configuration they describe.
///
/// [`Store::connect`](crate::Store::connect) builds one from its [`StoreConfig`](crate::StoreConfig); it is public
/// for code that wants its own tokio-postgres client secured exactly like pgfence's connections (the `pgfence`
/// command's tools do).
///
/// ```no_run
/// # async fn example() -> pgfence::Result<()> {
/// let connector = pgfence::Connector::new(
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
    #[cfg(feature = "tls")]
    custom: Option<tokio_postgres_rustls::MakeRustlsConnect>,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("Connector");
        out.field("target", &self.target)
            .field("sslmode", &self.tls.mode)
            .field("roots", &self.tls.roots)
            .field(
                "client_certificate",
                &self.tls.client.as_ref().map(|c| &c.0),
            );
        #[cfg(feature = "tls")]
        out.field("application_tls", &self.custom.is_some());
        out.finish()
    }
}

/// The libpq environment of this process.
fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Takes the TLS parameters out of `url` (ignoring errors) so that the rest parses: for redaction.
pub(crate) fn without_tls_parameters(url: &str) -> String {
    split_tls_parameters(url).map_or_else(|_| url.to_owned(), |(rest, _)| rest)
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
        connector.custom = Some(tokio_postgres_rustls::MakeRustlsConnect::new(
            Arc::unwrap_or_clone(tls),
        ));
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
            #[cfg(feature = "tls")]
            custom: None,
        };
        if connector.tls.mode.requires_tls() && !cfg!(feature = "tls") {
            return Err(connector.tls_error(format!(
                "sslmode={} needs TLS, and pgfence was built without its `tls` feature",
                connector.tls.mode
            )));
        }
        if !custom {
            // Fail now, not at the first connection, on an unreadable certificate or key.
            #[cfg(feature = "tls")]
            connector.client_config()?;
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

    fn tls_error(&self, cause: String) -> Error {
        Error::Tls {
            target: self.target.clone(),
            cause,
        }
    }

    /// Opens a connection. `prefer` falls back to plaintext when the server offers no TLS or the handshake fails
    /// (logged at debug level).
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
        #[cfg(feature = "tls")]
        {
            self.with_prefer_fallback(|config, tls| async move { self.attempt(&config, tls).await })
                .await
        }
        #[cfg(not(feature = "tls"))]
        {
            if self.tls.mode == SslMode::Prefer {
                tracing::debug!(database = %self.target,
                    "sslmode=prefer: built without the `tls` feature, connecting in plaintext");
            }
            self.config
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(|e| Error::Connect {
                    target: self.target.clone(),
                    cause: crate::error::error_chain(&e),
                })
        }
    }

    /// Opens a connection for pgfence's own pool, over a socket pgfence opens (see [`Socket`]): the same hosts,
    /// TLS and errors as [`connect`](Self::connect), and `target_session_attrs` checked the same way.
    pub(crate) async fn connect_pooled(&self) -> Result<(tokio_postgres::Client, PoolConnection)> {
        let hosts = self.per_host();
        let mut last = None;
        for one in &hosts {
            match one.connect_host().await {
                Ok(connected) => return Ok(connected),
                Err(e) => {
                    if hosts.len() > 1 {
                        tracing::debug!(database = %one.target, error = %e, "host failed; trying the next");
                    }
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::Connect {
            target: self.target.clone(),
            cause: "the connection string names no host".to_owned(),
        }))
    }

    /// Opens a pool connection to this connector's single host.
    async fn connect_host(&self) -> Result<(tokio_postgres::Client, PoolConnection)> {
        #[cfg(feature = "tls")]
        {
            self.with_prefer_fallback(|config, tls| async move {
                self.attempt_pooled(&config, tls).await
            })
            .await
        }
        #[cfg(not(feature = "tls"))]
        {
            if self.tls.mode == SslMode::Prefer {
                tracing::debug!(database = %self.target,
                    "sslmode=prefer: built without the `tls` feature, connecting in plaintext");
            }
            let mut last = None;
            for (host, hostaddr, port) in self.addresses()? {
                let socket = match Socket::open(&self.config, &host, hostaddr, port).await {
                    Ok(socket) => socket,
                    Err(e) => {
                        last = Some(crate::error::error_chain(&e));
                        continue;
                    }
                };
                match self
                    .config
                    .connect_raw(WireStream::socket(socket), tokio_postgres::NoTls)
                    .await
                {
                    Ok(connected) => return self.check_session(connected).await,
                    Err(e) => last = Some(crate::error::error_chain(&e)),
                }
            }
            Err(Error::Connect {
                target: self.target.clone(),
                cause: last.unwrap_or_else(|| "no address to connect to".to_owned()),
            })
        }
    }

    /// The host this connector reaches (its first, for a multi-host string: see [`per_host`](Self::per_host)),
    /// with its `hostaddr` and port.
    fn addresses(
        &self,
    ) -> Result<Vec<(tokio_postgres::config::Host, Option<std::net::IpAddr>, u16)>> {
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
        Ok(vec![(
            host,
            addrs.first().copied(),
            ports.first().copied().unwrap_or(5432),
        )])
    }

    /// `target_session_attrs=read-write` (or `read-only`), checked as tokio-postgres does on a connection it opens:
    /// `SHOW transaction_read_only`, driving the connection meanwhile.
    async fn check_session(
        &self,
        (client, mut connection): (tokio_postgres::Client, PoolConnection),
    ) -> Result<(tokio_postgres::Client, PoolConnection)> {
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
                rows = show => rows.map_err(|e| fail(crate::error::error_chain(&e)))?,
                ended = &mut connection => {
                    return Err(fail(match ended {
                        Ok(()) => "the server closed the connection".to_owned(),
                        Err(e) => crate::error::error_chain(&e),
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

    /// Sends a cancel request for `token`'s running statement, secured like this connector's connections.
    ///
    /// The server does not answer a cancel request: success means it was delivered, not that a statement was
    /// running or stopped.
    ///
    /// # Errors
    ///
    /// [`Error::Connect`] when the server could not be reached, [`Error::Tls`] when the handshake failed.
    pub async fn cancel(&self, token: &tokio_postgres::CancelToken) -> Result<()> {
        let fail = |cause: String| Error::Connect {
            target: self.target.clone(),
            cause,
        };
        let (host, hostaddr, port) = self
            .addresses()?
            .into_iter()
            .next()
            .ok_or_else(|| fail("no address to connect to".to_owned()))?;
        let socket = Socket::open(&self.config, &host, hostaddr, port)
            .await
            .map_err(|e| fail(crate::error::error_chain(&e)))?;
        #[cfg(feature = "tls")]
        let tls = {
            let mut make = self.make_tls()?;
            let name = match &host {
                tokio_postgres::config::Host::Tcp(name) => name.as_str(),
                #[cfg(unix)]
                tokio_postgres::config::Host::Unix(_) => "",
            };
            tokio_postgres::tls::MakeTlsConnect::<Socket>::make_tls_connect(&mut make, name)
                .map_err(|e| self.tls_error(e.to_string()))?
        };
        #[cfg(not(feature = "tls"))]
        let tls = tokio_postgres::NoTls;
        token
            .cancel_query_raw(socket, tls)
            .await
            .map_err(|e| fail(crate::error::error_chain(&e)))
    }
}

/// Sends a cancel request for a connection of an application's pool, whose TLS settings pgfence does not know:
/// with TLS when the connection used it (the certificate is not verified: the request carries only the backend's
/// cancel key, which the same connection already sent in the clear or over TLS), else in plaintext.
pub(crate) async fn cancel_unknown(token: &tokio_postgres::CancelToken) -> Result<()> {
    #[cfg(feature = "tls")]
    let tls = rustls_connect::MakeTls::new(tokio_postgres_rustls::MakeRustlsConnect::new(
        rustls_connect::client_config(rustls_connect::Verify::Nothing, None)?,
    ));
    #[cfg(not(feature = "tls"))]
    let tls = tokio_postgres::NoTls;
    token.cancel_query(tls).await.map_err(|e| Error::Connect {
        target: "<application pool>".to_owned(),
        cause: crate::error::error_chain(&e),
    })
}

#[cfg(feature = "tls")]
enum Attempt {
    /// The TLS handshake started and failed: the cause, readable.
    Handshake(String),
    /// The server answered the TLS request with "no" and the mode demands TLS.
    NoServerTls,
    /// Anything else: the cause, readable.
    Other(String),
    /// The connection is up but its session is not what `target_session_attrs` asks for.
    Session(Error),
}

#[cfg(feature = "tls")]
impl Connector {
    /// Runs `attempt` with this connector's settings and TLS; under `sslmode=prefer`, a failed handshake is
    /// followed by one plaintext attempt (as libpq does), logged at debug level.
    #[cfg(feature = "tls")]
    async fn with_prefer_fallback<T, F>(
        &self,
        attempt: impl Fn(tokio_postgres::Config, rustls_connect::MakeTls) -> F,
    ) -> Result<T>
    where
        // A plain closure returning a future, not an async closure: the futures stay Send for tokio::spawn.
        F: std::future::Future<Output = std::result::Result<T, Attempt>>,
    {
        let tls = self.make_tls()?;
        match attempt(self.config.clone(), tls.clone()).await {
            Err(Attempt::Handshake(cause)) if self.tls.mode == SslMode::Prefer => {
                tracing::debug!(database = %self.target, %cause,
                    "TLS handshake failed; sslmode=prefer continues in plaintext");
                let mut plain = self.config.clone();
                plain.ssl_mode(tokio_postgres::config::SslMode::Disable);
                attempt(plain, tls).await.map_err(|e| self.attempt_error(e))
            }
            other => other.map_err(|e| self.attempt_error(e)),
        }
    }

    fn make_tls(&self) -> Result<rustls_connect::MakeTls> {
        Ok(rustls_connect::MakeTls::new(match &self.custom {
            Some(custom) => custom.clone(),
            None => tokio_postgres_rustls::MakeRustlsConnect::new(self.client_config()?),
        }))
    }

    fn client_config(&self) -> Result<rustls::ClientConfig> {
        use rustls_connect::Verify;
        let verify = match (self.tls.mode, &self.tls.roots) {
            (SslMode::VerifyFull, roots) => Verify::ChainAndName(self.root_store(roots)?),
            (_, Roots::None) => Verify::Nothing,
            (_, roots) => Verify::Chain(self.root_store(roots)?),
        };
        let client = match &self.tls.client {
            Some((cert, key)) => Some(self.client_identity(cert, key)?),
            None => None,
        };
        rustls_connect::client_config(verify, client).map_err(|e| match e {
            Error::Tls { cause, .. } => self.tls_error(cause),
            other => other,
        })
    }

    fn root_store(&self, roots: &Roots) -> Result<Arc<rustls::RootCertStore>> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::CertificateDer;
        let certs: Vec<CertificateDer<'static>> = match roots {
            Roots::None => Vec::new(),
            Roots::File(path) => CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|e| {
                    self.tls_error(format!(
                        "cannot read sslrootcert {}: {}",
                        path.display(),
                        pem_error(&e)
                    ))
                })?,
            Roots::System => {
                let found = rustls_native_certs::load_native_certs();
                if found.certs.is_empty() {
                    let why = found
                        .errors
                        .first()
                        .map_or_else(|| "none found".to_owned(), |e| e.to_string());
                    return Err(self.tls_error(format!(
                        "cannot read the system's trust store (sslrootcert=system): {why}"
                    )));
                }
                found.certs
            }
        };
        let mut store = rustls::RootCertStore::empty();
        let (added, _ignored) = store.add_parsable_certificates(certs);
        if added == 0 {
            return Err(self.tls_error(format!("{roots}: no usable CA certificate in it")));
        }
        Ok(Arc::new(store))
    }

    fn client_identity(
        &self,
        cert: &Path,
        key: &Path,
    ) -> Result<(
        Vec<rustls::pki_types::CertificateDer<'static>>,
        rustls::pki_types::PrivateKeyDer<'static>,
    )> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let chain = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
            .map_err(|e| {
                self.tls_error(format!(
                    "cannot read sslcert {}: {}",
                    cert.display(),
                    pem_error(&e)
                ))
            })?;
        if chain.is_empty() {
            return Err(self.tls_error(format!("sslcert {}: no certificate in it", cert.display())));
        }
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
            self.tls_error(format!(
                "cannot read sslkey {}: {}",
                key.display(),
                pem_error(&e)
            ))
        })?;
        Ok((chain, key))
    }

    async fn attempt(
        &self,
        config: &tokio_postgres::Config,
        tls: rustls_connect::MakeTls,
    ) -> std::result::Result<(tokio_postgres::Client, Connection), Attempt> {
        let progress = tls.progress();
        match config.connect(tls).await {
            Ok(connected) => {
                self.note_plaintext(&progress);
                Ok(connected)
            }
            Err(e) => Err(self.failed_attempt(config, &progress, &e)),
        }
    }

    /// Logs that `sslmode=prefer` went on in plaintext because the server offers no TLS.
    fn note_plaintext(&self, progress: &rustls_connect::Progress) {
        if self.tls.mode == SslMode::Prefer && !progress.started() {
            tracing::debug!(database = %self.target,
                "the server offers no TLS; sslmode=prefer continues in plaintext");
        }
    }

    /// What a failed connection attempt means: a failed TLS handshake, a server without TLS where it is
    /// required, or another failure.
    fn failed_attempt(
        &self,
        config: &tokio_postgres::Config,
        progress: &rustls_connect::Progress,
        e: &tokio_postgres::Error,
    ) -> Attempt {
        // An error the server sent (authentication, too many connections) came after any handshake.
        if e.as_db_error().is_some() {
            Attempt::Other(crate::error::error_chain(e))
        } else if progress.started() && !progress.finished() {
            Attempt::Handshake(handshake_cause(e, &self.tls.roots))
        } else if !progress.started()
            && config.get_ssl_mode() == tokio_postgres::config::SslMode::Require
            && !has_io_error(e)
        {
            // Refused TLS answers "N" to the request: tokio-postgres reports it without an I/O error, unlike a
            // refused or timed-out socket.
            Attempt::NoServerTls
        } else {
            Attempt::Other(crate::error::error_chain(e))
        }
    }

    async fn attempt_pooled(
        &self,
        config: &tokio_postgres::Config,
        mut tls: rustls_connect::MakeTls,
    ) -> std::result::Result<(tokio_postgres::Client, PoolConnection), Attempt> {
        use tokio_postgres::tls::MakeTlsConnect;
        let progress = tls.progress();
        let mut last = None;
        for (host, hostaddr, port) in self
            .addresses()
            .map_err(|e| Attempt::Other(e.to_string()))?
        {
            let socket = match Socket::open(config, &host, hostaddr, port).await {
                Ok(socket) => socket,
                Err(e) => {
                    last = Some(format!(
                        "error connecting to server: {}",
                        crate::error::error_chain(&e)
                    ));
                    continue;
                }
            };
            // The name the server's certificate must carry (verify-full); a Unix socket never uses TLS.
            let name = match &host {
                tokio_postgres::config::Host::Tcp(name) => name.as_str(),
                #[cfg(unix)]
                tokio_postgres::config::Host::Unix(_) => "",
            };
            let handshake = MakeTlsConnect::<WireStream<Socket>>::make_tls_connect(&mut tls, name)
                .map_err(|e| Attempt::Handshake(e.to_string()))?;
            return match config
                .connect_raw(WireStream::socket(socket), handshake)
                .await
            {
                Ok(connected) => {
                    self.note_plaintext(&progress);
                    self.check_session(connected)
                        .await
                        .map_err(Attempt::Session)
                }
                Err(e) => Err(self.failed_attempt(config, &progress, &e)),
            };
        }
        Err(Attempt::Other(
            last.unwrap_or_else(|| "no address to connect to".to_owned()),
        ))
    }

    fn attempt_error(&self, attempt: Attempt) -> Error {
        match attempt {
            Attempt::Handshake(cause) => self.tls_error(cause),
            Attempt::NoServerTls => self.tls_error(format!(
                "the server does not support TLS, and sslmode={} demands it",
                self.tls.mode
            )),
            Attempt::Other(cause) => Error::Connect {
                target: self.target.clone(),
                cause,
            },
            Attempt::Session(error) => error,
        }
    }
}

/// `config` with only its `i`-th host (and that host's `hostaddr` and port).
fn single_host(config: &tokio_postgres::Config, i: usize) -> tokio_postgres::Config {
    use tokio_postgres::config::Host;
    let mut one = tokio_postgres::Config::new();
    if let Some(user) = config.get_user() {
        one.user(user);
    }
    if let Some(password) = config.get_password() {
        one.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        one.dbname(dbname);
    }
    if let Some(options) = config.get_options() {
        one.options(options);
    }
    if let Some(name) = config.get_application_name() {
        one.application_name(name);
    }
    one.ssl_mode(config.get_ssl_mode());
    one.ssl_negotiation(config.get_ssl_negotiation());
    match &config.get_hosts()[i] {
        Host::Tcp(name) => one.host(name),
        #[cfg(unix)]
        Host::Unix(path) => one.host_path(path),
    };
    if let Some(addr) = config.get_hostaddrs().get(i) {
        one.hostaddr(*addr);
    }
    // libpq: one port for every host, or one per host.
    let ports = config.get_ports();
    if let Some(port) = if ports.len() == 1 {
        ports.first()
    } else {
        ports.get(i)
    } {
        one.port(*port);
    }
    if let Some(timeout) = config.get_connect_timeout() {
        one.connect_timeout(*timeout);
    }
    if let Some(timeout) = config.get_tcp_user_timeout() {
        one.tcp_user_timeout(*timeout);
    }
    one.keepalives(config.get_keepalives());
    one.keepalives_idle(config.get_keepalives_idle());
    if let Some(interval) = config.get_keepalives_interval() {
        one.keepalives_interval(interval);
    }
    if let Some(retries) = config.get_keepalives_retries() {
        one.keepalives_retries(retries);
    }
    one.target_session_attrs(config.get_target_session_attrs());
    one.channel_binding(config.get_channel_binding());
    one
}

#[cfg(feature = "tls")]
fn pem_error(err: &rustls::pki_types::pem::Error) -> String {
    match err {
        rustls::pki_types::pem::Error::Io(io) => io.to_string(),
        other => format!("{other:?}"),
    }
}

#[cfg(feature = "tls")]
fn has_io_error(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if e.is::<std::io::Error>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// The readable cause of a failed handshake: rustls's error (tokio-rustls wraps it in an `io::Error`), with
/// the two common verification failures spelled out.
#[cfg(feature = "tls")]
fn handshake_cause(err: &tokio_postgres::Error, roots: &Roots) -> String {
    use rustls::CertificateError;
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = next {
        let rustls_error = e.downcast_ref::<rustls::Error>().or_else(|| {
            e.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(rustls_error) = rustls_error {
            return match rustls_error {
                rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => format!(
                    "server certificate verification failed: unknown issuer (the certificate does not chain to \
                     a CA in {roots})"
                ),
                rustls::Error::InvalidCertificate(cause) => {
                    format!("server certificate verification failed: {cause}")
                }
                other => format!("TLS handshake failed: {other}"),
            };
        }
        next = e.source();
    }
    format!("TLS handshake failed: {}", crate::error::error_chain(err))
}

#[cfg(feature = "tls")]
mod rustls_connect;

/// Shows a connection string as `user@host:port/database`: never a password.
pub fn redact(url: &str) -> String {
    match tokio_postgres::Config::from_str(&without_tls_parameters(url)) {
        Ok(config) => describe(&config),
        Err(_) => "<unparsable connection string>".to_owned(),
    }
}

/// The endpoint a configuration names, as a holder reports it with its beliefs: every host with its port, then
/// the database (`db1:5432,db2:5432/control`), without user, password or any other parameter.
pub(crate) fn endpoint(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let host = match h {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            };
            // One port for all hosts, or one per host (tokio-postgres's rule).
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            format!("{host}:{port}")
        })
        .collect();
    let hosts = if hosts.is_empty() {
        "localhost:5432".to_owned()
    } else {
        hosts.join(",")
    };
    let db = config.get_dbname().or(config.get_user()).unwrap_or("?");
    format!("{hosts}/{db}")
}

pub(crate) fn describe(config: &tokio_postgres::Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".to_owned());
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("?");
    let db = config.get_dbname().unwrap_or(user);
    format!("{user}@{host}:{port}/{db}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn url_tls_parameters_are_taken_out_and_the_rest_kept_verbatim() {
        let (rest, given) = split_tls_parameters(
            "postgres://app:p%3Fw@db.example.com:6432/control?sslmode=verify-full&application_name=x&\
             sslrootcert=%2Fetc%2Fssl%2Fca%20bundle.pem&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(
            rest,
            "postgres://app:p%3Fw@db.example.com:6432/control?application_name=x&connect_timeout=3"
        );
        assert_eq!(given.mode.as_deref(), Some("verify-full"));
        assert_eq!(given.root_cert.as_deref(), Some("/etc/ssl/ca bundle.pem"));
        let (rest, _) =
            split_tls_parameters("postgresql://u@h/db?sslcert=/c.pem&sslkey=/k.pem").unwrap();
        assert_eq!(rest, "postgresql://u@h/db");
        // A `?` inside the credentials is not the query.
        let (rest, given) = split_tls_parameters("postgres://u:a?b@h/db").unwrap();
        assert_eq!(rest, "postgres://u:a?b@h/db");
        assert_eq!(given, Given::default());
    }

    #[test]
    fn keyword_tls_parameters_are_taken_out_and_the_rest_kept_verbatim() {
        let (rest, given) = split_tls_parameters(
            "host=db  password='it''s' sslmode = verify-ca user=app sslrootcert='/etc/my ca.pem' \
             dbname=x\\ y",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        // `''` is not an escape in this grammar: the quoted value ends at the second quote; it stays unparsable
        // for tokio-postgres to report, unchanged.
        assert!(rest.contains("password='it''s'"), "{rest}");
        assert_eq!(given.mode, None);

        let (rest, given) = split_tls_parameters(
            "host=db password='it\\'s' sslmode = verify-ca user=app sslrootcert='/etc/my ca.pem' dbname=x\\ y",
        )
        .unwrap();
        assert_eq!(rest, "host=db password='it\\'s' user=app dbname=x\\ y");
        assert_eq!(given.mode.as_deref(), Some("verify-ca"));
        assert_eq!(given.root_cert.as_deref(), Some("/etc/my ca.pem"));
        let config: tokio_postgres::Config = rest.parse().unwrap();
        assert_eq!(config.get_password(), Some(&b"it's"[..]));
        assert_eq!(config.get_dbname(), Some("x y"));
    }

    #[test]
    fn the_connection_string_wins_over_the_environment_and_prefer_is_the_default() {
        let env = env_of(&[("PGSSLMODE", "require"), ("PGSSLROOTCERT", "/env/ca.pem")]);
        let given = split_tls_parameters("postgres://h/db?sslmode=disable")
            .unwrap()
            .1
            .or_env(&env);
        assert_eq!(given.mode.as_deref(), Some("disable"));
        assert_eq!(given.root_cert.as_deref(), Some("/env/ca.pem"));
        let given = split_tls_parameters("host=h").unwrap().1.or_env(&env);
        assert_eq!(given.mode.as_deref(), Some("require"));

        let nothing = env_of(&[]);
        let settings = TlsSettings::resolve(Given::default(), &nothing, false).unwrap();
        assert_eq!(settings.mode, SslMode::Prefer);
        assert_eq!(settings.roots, Roots::None);
    }

    #[test]
    fn modes_that_verify_need_roots_and_system_roots_demand_verify_full() {
        let nothing = env_of(&[]);
        let given = |mode: &str, root: Option<&str>| Given {
            mode: Some(mode.to_owned()),
            root_cert: root.map(str::to_owned),
            ..Given::default()
        };
        let err = TlsSettings::resolve(given("verify-full", None), &nothing, false).unwrap_err();
        assert!(err.to_string().contains("sslrootcert"), "{err}");
        let err =
            TlsSettings::resolve(given("require", Some("system")), &nothing, false).unwrap_err();
        assert!(err.to_string().contains("verify-full"), "{err}");
        let system = Given {
            root_cert: Some("system".into()),
            ..Given::default()
        };
        assert_eq!(
            TlsSettings::resolve(system, &nothing, false).unwrap().mode,
            SslMode::VerifyFull
        );
        let err = TlsSettings::resolve(given("verify_full", None), &nothing, false).unwrap_err();
        assert!(
            err.to_string().contains("verify-ca or verify-full"),
            "{err}"
        );
        let err = TlsSettings::resolve(given("allow", None), &nothing, false).unwrap_err();
        assert!(err.to_string().contains("allow"), "{err}");
    }

    #[test]
    fn libpq_defaults_under_home_are_used_only_when_present() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().to_str().unwrap().to_owned();
        let env = move |name: &str| (name == "HOME").then(|| home.clone());
        let settings = TlsSettings::resolve(Given::default(), &env, false).unwrap();
        assert_eq!((settings.roots, settings.client), (Roots::None, None));
        std::fs::create_dir(dir.path().join(".postgresql")).unwrap();
        std::fs::write(dir.path().join(".postgresql/root.crt"), "").unwrap();
        let settings = TlsSettings::resolve(Given::default(), &env, false).unwrap();
        assert_eq!(
            settings.roots,
            Roots::File(dir.path().join(".postgresql/root.crt"))
        );
    }

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

    #[test]
    fn libpq_env_repeats_the_resolved_settings() {
        let settings = TlsSettings {
            mode: SslMode::VerifyCa,
            roots: Roots::File("/ca.pem".into()),
            client: Some(("/c.pem".into(), "/k.pem".into())),
        };
        assert_eq!(
            settings.libpq_env(),
            vec![
                ("PGSSLMODE", "verify-ca".to_owned()),
                ("PGSSLROOTCERT", "/ca.pem".to_owned()),
                ("PGSSLCERT", "/c.pem".to_owned()),
                ("PGSSLKEY", "/k.pem".to_owned()),
            ]
        );
    }
}
