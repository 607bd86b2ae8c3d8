//! Cancel requests: how a statement still running on a connection pgfence abandoned is stopped on the server.
//!
//! A cancel request is a connection of its own carrying only the backend's cancel key, secured like the
//! connection it is about; the server does not answer it.

use std::sync::Arc;

use tokio_postgres::tls::MakeTlsConnect;

use super::socket::Socket;
use super::{tls, Connector};
use crate::error::{error_chain, Error, Result};

impl Connector {
    /// Sends a cancel request for `token`'s running statement, secured like this connector's connections, to
    /// this connector's host — the first, for a multi-host connection string: a connection opened through
    /// one ([`connect`](Self::connect)) reached the host its tokio-postgres client names, and
    /// [`CancelToken::cancel_query`](tokio_postgres::CancelToken::cancel_query) goes there.
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
        let (host, hostaddr, port) = self.address()?;
        let socket = Socket::open(&self.config, &host, hostaddr, port)
            .await
            .map_err(|e| fail(error_chain(&e)))?;
        let mut make = self.tls.make_tls(self.custom.as_ref(), &self.target)?;
        let tls = MakeTlsConnect::<Socket>::make_tls_connect(&mut make, super::server_name(&host))
            .map_err(|e| tls::tls_error(&self.target, e.to_string()))?;
        token
            .cancel_query_raw(socket, tls)
            .await
            .map_err(|e| fail(error_chain(&e)))
    }
}

/// Sends a cancel request for a connection of an application's pool, whose TLS settings pgfence does not know:
/// with TLS when the connection used it (the certificate is not verified: the request carries only the backend's
/// cancel key, which the same connection already sent in the clear or over TLS), else in plaintext.
pub(crate) async fn cancel_unknown(token: &tokio_postgres::CancelToken) -> Result<()> {
    token
        .cancel_query(tls::unverified()?)
        .await
        .map_err(|e| Error::Connect {
            target: "<application pool>".to_owned(),
            cause: error_chain(&e),
        })
}

/// Cancels `token`'s running statement in the background (a statement whose caller gave up on it, `what`): through
/// `host`, the connector of the host its connection reached, or, for a connection of an application's pool
/// (`None`), as [`cancel_unknown`] does. A failure is logged at debug level (the connection is discarded either
/// way).
pub(crate) fn cancel_in_background(
    host: Option<Arc<Connector>>,
    token: tokio_postgres::CancelToken,
    what: &'static str,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let cancelled = match host {
            Some(host) => host.cancel(&token).await,
            None => cancel_unknown(&token).await,
        };
        if let Err(e) = cancelled {
            tracing::debug!(error = %e, "cancelling {what} failed");
        }
    });
}
