//! TLS for every connection pgfence opens, with libpq's parameters and semantics.
//!
//! A connection string (URL query parameters or `key=value` pairs) may carry `sslmode`, `sslrootcert`, `sslcert`
//! and `sslkey`; what it leaves out is read from `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT` and `PGSSLKEY`, as libpq
//! does. tokio-postgres's own parser knows `disable`, `prefer` and `require` only, so [`Connector`](super::Connector) takes these
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

use super::conninfo::Given;
#[cfg(feature = "tls")]
use super::verify;
use crate::error::{Error, Result};

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

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Roots {
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
pub(super) struct TlsSettings {
    pub(super) mode: SslMode,
    pub(super) roots: Roots,
    /// Certificate chain and private key files.
    pub(super) client: Option<(PathBuf, PathBuf)>,
}

/// `~/.postgresql/NAME`, libpq's default place for certificates.
fn default_file(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<PathBuf> {
    env("HOME")
        .filter(|home| !home.is_empty())
        .map(|home| Path::new(&home).join(".postgresql").join(name))
}

impl TlsSettings {
    pub(super) fn resolve(
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
    pub(super) fn libpq_env(&self) -> Vec<(&'static str, String)> {
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

/// The TLS connector of one connection attempt: pgfence's rustls connector, recording how far the handshake got.
#[cfg(feature = "tls")]
pub(super) type MakeTls = verify::MakeTls;
/// The TLS connector of one connection attempt (built without the `tls` feature: plaintext only).
#[cfg(not(feature = "tls"))]
pub(super) type MakeTls = tokio_postgres::NoTls;

/// An application's own rustls configuration ([`Connector::with_tls`](super::Connector::with_tls)).
#[cfg(feature = "tls")]
pub(super) type Custom = tokio_postgres_rustls::MakeRustlsConnect;
/// An application's own TLS configuration: none without the `tls` feature.
#[cfg(not(feature = "tls"))]
pub(super) type Custom = std::convert::Infallible;

/// How far the handshake of an attempt got: shared with the [`MakeTls`] that records it.
#[cfg(feature = "tls")]
pub(super) type Progress = Arc<verify::Progress>;
/// How far the handshake of an attempt got: never started, without the `tls` feature.
#[cfg(not(feature = "tls"))]
#[derive(Debug)]
pub(super) struct Progress;

#[cfg(not(feature = "tls"))]
impl Progress {
    fn started(&self) -> bool {
        false
    }
}

/// The progress `tls` records for its latest attempt.
pub(super) fn progress(#[allow(unused_variables)] tls: &MakeTls) -> Progress {
    #[cfg(feature = "tls")]
    return tls.progress();
    #[cfg(not(feature = "tls"))]
    Progress
}

/// The error of a TLS setup or handshake that failed for `target`.
pub(super) fn tls_error(target: &str, cause: String) -> Error {
    Error::Tls {
        target: target.to_owned(),
        cause,
    }
}

/// How one connection attempt to one host failed.
pub(super) enum Attempt {
    /// The TLS handshake started and failed: the cause, readable.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    Handshake(String),
    /// The server answered the TLS request with "no" and the mode demands TLS.
    NoServerTls,
    /// Anything else: the cause, readable.
    Other(String),
    /// The connection is up but its session is not what `target_session_attrs` asks for.
    Session(Error),
}

/// A connector for cancel requests on connections whose TLS settings are not known: TLS without verifying the
/// server's certificate (see [`cancel_unknown`](super::cancel::cancel_unknown)).
pub(super) fn unverified() -> Result<MakeTls> {
    #[cfg(feature = "tls")]
    return Ok(verify::MakeTls::new(
        tokio_postgres_rustls::MakeRustlsConnect::new(verify::client_config(
            verify::Verify::Nothing,
            None,
        )?),
    ));
    #[cfg(not(feature = "tls"))]
    Ok(tokio_postgres::NoTls)
}

impl TlsSettings {
    /// Runs `attempt` with `config` and this TLS; under `sslmode=prefer`, a failed handshake is followed by one
    /// plaintext attempt (as libpq does), logged at debug level.
    // Without the `tls` feature the connector is `NoTls`, which is `Copy`.
    #[cfg_attr(not(feature = "tls"), allow(clippy::clone_on_copy))]
    pub(super) async fn with_prefer_fallback<T, F>(
        &self,
        config: &tokio_postgres::Config,
        target: &str,
        tls: MakeTls,
        attempt: impl Fn(tokio_postgres::Config, MakeTls) -> F,
    ) -> Result<T>
    where
        // A plain closure returning a future, not an async closure: the futures stay Send for tokio::spawn.
        F: std::future::Future<Output = std::result::Result<T, Attempt>>,
    {
        #[cfg(not(feature = "tls"))]
        if self.mode == SslMode::Prefer {
            tracing::debug!(database = %target,
                "sslmode=prefer: built without the `tls` feature, connecting in plaintext");
        }
        match attempt(config.clone(), tls.clone()).await {
            Err(Attempt::Handshake(cause)) if self.mode == SslMode::Prefer => {
                tracing::debug!(database = %target, %cause,
                    "TLS handshake failed; sslmode=prefer continues in plaintext");
                let mut plain = config.clone();
                plain.ssl_mode(tokio_postgres::config::SslMode::Disable);
                attempt(plain, tls)
                    .await
                    .map_err(|e| self.attempt_error(target, e))
            }
            other => other.map_err(|e| self.attempt_error(target, e)),
        }
    }

    /// The connector of one attempt: the application's configuration, or one built from these settings.
    pub(super) fn make_tls(
        &self,
        #[allow(unused_variables)] custom: Option<&Custom>,
        #[allow(unused_variables)] target: &str,
    ) -> Result<MakeTls> {
        #[cfg(feature = "tls")]
        return Ok(verify::MakeTls::new(match custom {
            Some(custom) => custom.clone(),
            None => tokio_postgres_rustls::MakeRustlsConnect::new(self.client_config(target)?),
        }));
        #[cfg(not(feature = "tls"))]
        Ok(tokio_postgres::NoTls)
    }

    /// Logs that `sslmode=prefer` went on in plaintext because the server offers no TLS.
    pub(super) fn note_plaintext(&self, target: &str, progress: &Progress) {
        if cfg!(feature = "tls") && self.mode == SslMode::Prefer && !progress.started() {
            tracing::debug!(database = %target,
                "the server offers no TLS; sslmode=prefer continues in plaintext");
        }
    }

    /// What a failed connection attempt means: a failed TLS handshake, a server without TLS where it is
    /// required, or another failure.
    pub(super) fn failed_attempt(
        &self,
        config: &tokio_postgres::Config,
        progress: &Progress,
        e: &tokio_postgres::Error,
    ) -> Attempt {
        // An error the server sent (authentication, too many connections) came after any handshake.
        if e.as_db_error().is_some() {
            return Attempt::Other(crate::error::error_chain(e));
        }
        #[cfg(feature = "tls")]
        if progress.started() && !progress.finished() {
            return Attempt::Handshake(handshake_cause(e, &self.roots));
        }
        if !progress.started()
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

    /// The error a failed attempt is reported as.
    pub(super) fn attempt_error(&self, target: &str, attempt: Attempt) -> Error {
        match attempt {
            Attempt::Handshake(cause) => tls_error(target, cause),
            Attempt::NoServerTls => tls_error(
                target,
                format!(
                    "the server does not support TLS, and sslmode={} demands it",
                    self.mode
                ),
            ),
            Attempt::Other(cause) => Error::Connect {
                target: target.to_owned(),
                cause,
            },
            Attempt::Session(error) => error,
        }
    }
}

#[cfg(feature = "tls")]
impl TlsSettings {
    /// The rustls configuration these settings describe: the roots to verify against, the client certificate.
    pub(super) fn client_config(&self, target: &str) -> Result<rustls::ClientConfig> {
        use verify::Verify;
        let verify = match (self.mode, &self.roots) {
            (SslMode::VerifyFull, roots) => Verify::ChainAndName(self.root_store(target, roots)?),
            (_, Roots::None) => Verify::Nothing,
            (_, roots) => Verify::Chain(self.root_store(target, roots)?),
        };
        let client = match &self.client {
            Some((cert, key)) => Some(self.client_identity(target, cert, key)?),
            None => None,
        };
        verify::client_config(verify, client).map_err(|e| match e {
            Error::Tls { cause, .. } => tls_error(target, cause),
            other => other,
        })
    }

    fn root_store(&self, target: &str, roots: &Roots) -> Result<Arc<rustls::RootCertStore>> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::CertificateDer;
        let certs: Vec<CertificateDer<'static>> = match roots {
            Roots::None => Vec::new(),
            Roots::File(path) => CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|e| {
                    tls_error(
                        target,
                        format!(
                            "cannot read sslrootcert {}: {}",
                            path.display(),
                            pem_error(&e)
                        ),
                    )
                })?,
            Roots::System => {
                let found = rustls_native_certs::load_native_certs();
                if found.certs.is_empty() {
                    let why = found
                        .errors
                        .first()
                        .map_or_else(|| "none found".to_owned(), |e| e.to_string());
                    return Err(tls_error(
                        target,
                        format!("cannot read the system's trust store (sslrootcert=system): {why}"),
                    ));
                }
                found.certs
            }
        };
        let mut store = rustls::RootCertStore::empty();
        let (added, _ignored) = store.add_parsable_certificates(certs);
        if added == 0 {
            return Err(tls_error(
                target,
                format!("{roots}: no usable CA certificate in it"),
            ));
        }
        Ok(Arc::new(store))
    }

    fn client_identity(
        &self,
        target: &str,
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
                tls_error(
                    target,
                    format!("cannot read sslcert {}: {}", cert.display(), pem_error(&e)),
                )
            })?;
        if chain.is_empty() {
            return Err(tls_error(
                target,
                format!("sslcert {}: no certificate in it", cert.display()),
            ));
        }
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
            tls_error(
                target,
                format!("cannot read sslkey {}: {}", key.display(), pem_error(&e)),
            )
        })?;
        Ok((chain, key))
    }
}

#[cfg(feature = "tls")]
fn pem_error(err: &rustls::pki_types::pem::Error) -> String {
    match err {
        rustls::pki_types::pem::Error::Io(io) => io.to_string(),
        other => format!("{other:?}"),
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::conninfo::{env_of, split_tls_parameters};

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
