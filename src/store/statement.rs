//! How one statement runs on a pooled connection: armed while in flight ([`Checked`]: a dropped future cancels
//! the statement on the server and discards the connection), its reply read to the end of the implicit commit
//! (`call_one`, `call_guarded`), and the renewal connections the leader opens outside the pool.

use std::sync::Arc;

use diesel_async::AsyncPgConnection;

use super::{PooledConnection, Store};
use crate::connect::cancel::cancel_in_background;
use crate::connect::identity::ConnectSettings;
use crate::connect::sqlstate::sqlstate_of;
use crate::connect::{Connector, Kind};
use crate::error::{Error, Result};
use crate::sqlstate::SqlState;

/// A pooled connection that is *armed* while a statement is in flight: if it is dropped armed (the caller's
/// future was cancelled or timed out mid-statement), the statement still running on the server is cancelled and
/// the connection is discarded instead of going back to the pool with that statement still running. Disarm it
/// once the statement's result is in.
pub(crate) struct Checked<'a> {
    conn: PooledConnection<'a>,
    armed: bool,
    /// How the store reaches its database, for the host a cancel request goes to — looked up only when one is
    /// sent (`None`: an application's pool).
    settings: Option<&'a ConnectSettings>,
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
        let host = self.settings.map(ConnectSettings::pooled_host);
        cancel_in_background(host, token, "an abandoned statement");
    }
}

impl Store {
    /// A pooled connection armed for one statement (see [`Checked`]).
    pub(crate) async fn checked(&self) -> Result<Checked<'_>> {
        Ok(Checked {
            conn: self.conn().await?,
            armed: true,
            settings: self.inner.connect.as_ref(),
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
}

/// Whether a statement failed because its guard ran outside READ COMMITTED (`PF004`, raised before anything is
/// written: the statement can run again in a READ COMMITTED transaction).
pub(crate) fn is_isolation_refusal(error: &diesel::result::Error) -> bool {
    matches!(error, diesel::result::Error::DatabaseError(_, info)
        if sqlstate_of(info.message(), info.details(), info.hint())
            == Some(SqlState::NotReadCommitted))
}

/// The row of a statement that returns exactly one.
fn only_row<U>(rows: Vec<U>) -> Result<U> {
    rows.into_iter().next().ok_or_else(|| Error::Database {
        sqlstate: None,
        message: "a pgfence function returned no row".to_owned(),
        source: None,
    })
}

/// The connection a series of statements that must not queue behind the pool goes through: the leader's
/// renewals.
///
/// A store that opens connections of its own ([`Store::connect`]) keeps one, opened again — checked to be the
/// expected primary, as every pooled connection is — by the first statement after it broke, so every retry
/// really tries to connect. Through the pool a retry would only wait: after a failed connect, bb8 tries again
/// 0.4 s later, then 0.8 s, … (up to half the checkout timeout), and a checkout waits for that pending attempt
/// instead of starting one, so a database down for 0.8 s would cost a lease with a 2 s ttl (the next attempt
/// would come after the local deadline); it would also wait for an application that has every pooled connection
/// busy. A store built from an application's pool ([`Store::from_pool`]) goes through that pool.
pub(crate) struct KeptConnection {
    dedicated: bool,
    /// The kept connection, with the connector of the host it reached.
    conn: Option<(AsyncPgConnection, Arc<Connector>)>,
}

/// A connection lent to one statement by a [`KeptConnection`].
pub(crate) enum Lent<'a> {
    /// Armed (see [`Checked`]): dropped before the answer, its statement is cancelled and it is discarded.
    Pooled(Checked<'a>),
    /// The kept connection, or a new one, with the connector of the host it reached (where a cancel request
    /// for its statement goes).
    Dedicated(AsyncPgConnection, Arc<Connector>),
}

/// Why a [`KeptConnection`] lent no connection.
#[derive(Debug)]
pub(crate) enum Unavailable {
    /// Connecting, or the checkout, failed.
    Failed(Error),
    /// `until` came while `doing` was in progress.
    CutOff {
        /// What was in progress.
        doing: &'static str,
    },
}

impl Lent<'_> {
    /// The connection the statement runs on.
    pub(crate) fn conn(&mut self) -> &mut AsyncPgConnection {
        match self {
            Lent::Pooled(conn) => conn,
            Lent::Dedicated(conn, _) => conn,
        }
    }
}

impl KeptConnection {
    /// The way `store`'s renewals go: a connection of its own when it can open one that lasts, else its pool.
    pub(crate) fn new(store: &Store) -> KeptConnection {
        KeptConnection {
            dedicated: store.can_open_dedicated(),
            conn: None,
        }
    }

    /// A connection for one statement, by `until` at the latest: the kept one unless it broke, else a new one.
    pub(crate) async fn lend<'a>(
        &mut self,
        store: &'a Store,
        until: tokio::time::Instant,
    ) -> std::result::Result<Lent<'a>, Unavailable> {
        use diesel_async::pooled_connection::PoolableConnection;
        if !self.dedicated {
            return match tokio::time::timeout_at(until, store.checked()).await {
                Ok(Ok(conn)) => Ok(Lent::Pooled(conn)),
                Ok(Err(e)) => Err(Unavailable::Failed(e)),
                Err(_) => Err(Unavailable::CutOff {
                    doing: "waiting for a pooled connection",
                }),
            };
        }
        if let Some((mut conn, host)) = self.conn.take() {
            // Closed by the server (a restart, an idle-session timeout): a statement on it could only fail.
            if !conn.is_broken() {
                return Ok(Lent::Dedicated(conn, host));
            }
        }
        match tokio::time::timeout_at(until, store.open_dedicated_checked()).await {
            Ok(Ok((conn, host))) => Ok(Lent::Dedicated(conn, host)),
            Ok(Err(e)) => Err(Unavailable::Failed(e)),
            Err(_) => Err(Unavailable::CutOff {
                doing: "connecting",
            }),
        }
    }

    /// Takes `lent` back once its statement answered with `result`: a pooled connection is settled (see
    /// [`Checked::settle`]); the dedicated one is kept unless the error ended its session or broke it.
    pub(crate) fn settle<T>(
        &mut self,
        lent: Lent<'_>,
        result: &std::result::Result<T, diesel::result::Error>,
    ) {
        use diesel_async::pooled_connection::PoolableConnection;
        match lent {
            Lent::Pooled(mut conn) => conn.settle(result),
            Lent::Dedicated(mut conn, host) => {
                let ended = result.as_ref().is_err_and(crate::error::ends_the_session);
                if !ended && (result.is_ok() || !conn.is_broken()) {
                    self.conn = Some((conn, host));
                }
            }
        }
    }

    /// Gives up `lent`, whose statement did not answer in time. A pooled connection is dropped armed (its
    /// statement is cancelled and it is discarded). The dedicated one is closed, and its statement, which may
    /// still be queued on the server (behind a lock), is cancelled in the background, so that it cannot take
    /// effect after its caller gave up on it — at the host that connection reached.
    pub(crate) fn abandon(lent: Lent<'_>) {
        if let Lent::Dedicated(conn, host) = lent {
            let token = conn.cancel_token();
            drop(conn);
            cancel_in_background(Some(host), token, "a late statement");
        }
    }
}

impl Store {
    /// Whether this store can keep a connection LISTENing (see [`Store::listening_connection`]).
    pub(crate) fn can_listen(&self) -> bool {
        self.can_open_dedicated()
    }

    /// A new connection outside the pool, driven by tokio-postgres so that notifications arrive on it: for
    /// LISTEN. Through the direct URL when there is one.
    pub(crate) async fn listening_connection(&self) -> Result<AsyncPgConnection> {
        self.open_dedicated(Kind::Listening).await
    }

    /// Runs one statement on an armed connection and returns its rows (see [`Checked`]).
    pub(crate) async fn load_all<Q, U>(&self, query: Q) -> Result<Vec<U>>
    where
        Q: diesel_async::methods::LoadQuery<'static, AsyncPgConnection, U> + Send + 'static,
        U: Send + 'static,
    {
        use diesel_async::RunQueryDsl;
        let mut conn = self.checked().await?;
        let rows: std::result::Result<Vec<U>, diesel::result::Error> = query.load(&mut *conn).await;
        conn.settle(&rows);
        Ok(rows?)
    }
}
