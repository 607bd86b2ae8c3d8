//! The guarded writes: a transaction guarded by a fence ([`Store::fenced`]) and a one-statement guarded write
//! ([`Store::guarded_write`]), through `pgfence.fence` or the native guard.

use std::future::Future;

use diesel::pg::{Pg, PgQueryBuilder};
use diesel::query_builder::{QueryBuilder, QueryFragment};
use diesel_async::AsyncPgConnection;

use super::outcome::{sql, WriteOutcome, WriteResultRow};
use super::write::{GuardedWrite, GuardedWriteRow, FENCE_PASSED, GUARD_CTE};
use super::{check_operation, Fence};
use crate::error::{Error, Result};
use crate::reply::RowsOf;
use crate::sqlstate::SqlState;
use crate::store::Store;

/// Sends `BEGIN ISOLATION LEVEL READ COMMITTED` and the guard of `fence` pipelined: one round trip. BEGIN goes
/// out on its future's first poll (the simple-query protocol, nothing to prepare), before the guard's future is
/// even created, and the server runs a connection's requests in the order they were sent.
async fn begin_and_guard(
    conn: &AsyncPgConnection,
    fence: &Fence,
    operation: &str,
    native: bool,
) -> (diesel::QueryResult<()>, diesel::QueryResult<WriteResultRow>) {
    use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
    use std::task::Poll;
    let mut begin_conn = conn;
    let mut guard_conn = conn;
    let mut begin =
        std::pin::pin!(begin_conn.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED"));
    let first = std::future::poll_fn(|cx| Poll::Ready(begin.as_mut().poll(cx))).await;
    let (lease, epoch, secret) = (
        fence.lease.clone(),
        fence.epoch.get(),
        fence.secret.expose_secret().to_owned(),
    );
    let operation = operation.to_owned();
    let guard = if native {
        futures_util::future::Either::Left(
            RowsOf(sql::native_fence(
                lease,
                epoch,
                secret,
                operation,
                None::<String>,
                None::<String>,
            ))
            .get_result::<WriteResultRow>(&mut guard_conn),
        )
    } else {
        futures_util::future::Either::Right(
            RowsOf(sql::fence(
                lease,
                epoch,
                secret,
                operation,
                None::<String>,
                None::<String>,
            ))
            .get_result::<WriteResultRow>(&mut guard_conn),
        )
    };
    match first {
        // BEGIN already failed: the guard is not sent.
        Poll::Ready(Err(e)) => (Err(e), Err(diesel::result::Error::NotInTransaction)),
        Poll::Ready(Ok(())) => (Ok(()), guard.await),
        Poll::Pending => futures_util::future::join(begin, guard).await,
    }
}

/// Whether a statement failed because a function it names does not exist (SQLSTATE 42883).
fn is_undefined_function(e: &diesel::result::Error) -> bool {
    crate::error::diesel_sqlstate(e) == Some(SqlState::UndefinedFunction)
}

impl Store {
    /// Runs `work` in a transaction guarded by `fence`. `work` is an async closure, `async |conn| { … }` (or
    /// `async move`), as diesel-async's `AsyncConnection::transaction` takes: it gets the transaction's
    /// connection, and its error type `E` converts from pgfence's and diesel's errors ([`Error`] itself does).
    ///
    /// BEGIN and the guard travel in one round trip; the guard
    /// takes the lease's guard lock shared and checks the fence. If the fence is refused, the transaction commits
    /// only the audit row and the result is [`Error::Stale`] or [`Error::Denied`] (converted into `E`) without
    /// running `work`. Otherwise `work` runs on the same connection and the transaction commits when it returns
    /// `Ok` and rolls back when it returns `Err`; transactions `work` opens itself nest as savepoints. A fenced
    /// transaction of one statement costs three round trips (guard, statement, COMMIT), as many as an unguarded
    /// `BEGIN; statement; COMMIT`; a single INSERT, UPDATE or DELETE is cheaper still through
    /// [`Store::guarded_write`] (one).
    ///
    /// Until the transaction ends no takeover of the lease can commit: keep fenced transactions short, since
    /// a successor's acquisition waits for them (at most the takeover grace, after which it ends them) — and
    /// never acquire, release or force-release the same lease from inside `work` (on another connection that
    /// would wait for this very transaction).
    ///
    /// The transaction runs at READ COMMITTED whatever the session default: the guard reads the lease in a
    /// snapshot taken after it was granted its lock, which REPEATABLE READ would not allow (the SQL guard
    /// refuses to decide there, with SQLSTATE `PF004`).
    ///
    /// diesel prepares an UPDATE built with its DSL, and any `sql_query`, again on every call (a round trip of
    /// its own); wrap the statements of `work` in [`Cached`](crate::guard::Cached) to prepare them once per connection.
    ///
    /// ```no_run
    /// # async fn example(store: pgfence::Store, lease: pgfence::Lease) -> pgfence::Result<()> {
    /// use diesel::sql_types::{Integer, Text};
    /// use diesel_async::RunQueryDsl;
    /// let moved = store
    ///     .fenced(&lease.fence(), "rebalance", async |conn| {
    ///         let n = pgfence::guard::Cached::new(
    ///             diesel::sql_query("UPDATE shards SET owner = $1 WHERE id = $2")
    ///                 .bind::<Text, _>("node-2")
    ///                 .bind::<Integer, _>(7),
    ///         )
    ///         .execute(conn)
    ///         .await?;
    ///         Ok::<_, pgfence::Error>(n)
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Converted into `E`:
    /// - [`Error::Stale`] when the fence is not the lease's current, held, unexpired tenure, [`Error::Denied`]
    ///   when the session's role has no grant on the cluster or the fence's secret is not its tenure's: `work`
    ///   did not run, and the refusal is audited.
    /// - [`Error::InvalidInput`] for a malformed `operation`; nothing was sent.
    /// - The [errors of every database call](crate#errors), from BEGIN, the guard or COMMIT (a failed COMMIT
    ///   means nothing `work` wrote was kept).
    ///
    /// And `work`'s own error, after the transaction was rolled back.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future rolls the transaction back on the server (its connection is discarded, and the
    /// statement in flight cancelled), unless COMMIT was already sent: then it may have committed. See
    /// [cancel safety](crate#cancel-safety).
    #[tracing::instrument(level = "debug", skip_all, fields(lease = fence.lease(), epoch = fence.epoch().get(), operation = operation))]
    pub async fn fenced<T, E, F>(&self, fence: &Fence, operation: &str, work: F) -> Result<T, E>
    where
        F: for<'c> AsyncFnOnce(&'c mut AsyncPgConnection) -> Result<T, E> + Send,
        E: From<Error> + From<diesel::result::Error> + Send,
        T: Send,
    {
        use diesel::connection::TransactionDepthChange;
        use diesel_async::{AnsiTransactionManager, TransactionManager};
        type Tm = AnsiTransactionManager;
        check_operation(operation).map_err(E::from)?;
        let native = self.native_guard().await.map_err(E::from)?;
        let mut conn = self.checked().await.map_err(E::from)?;
        // BEGIN and the guard in one round trip. READ COMMITTED whatever the session default: the guard waits
        // for a takeover in flight and then reads the new epoch in a fresh snapshot, so a stale fence is refused
        // *and audited*.
        let (begun, check) = begin_and_guard(&conn, fence, operation, native).await;
        if native && check.as_ref().is_err_and(is_undefined_function) {
            self.forget_native_guard();
        }
        if let Err(e) = begun {
            // Nothing ran inside a transaction; a guard that ran anyway (autocommit) wrote at most its audit row.
            return Err(E::from(Error::from(e)));
        }
        // diesel's transaction manager learns of the transaction now, so that `work` nests its own transactions
        // as savepoints and the COMMIT or ROLLBACK below goes through it.
        let depth = Tm::transaction_manager_status_mut(&mut *conn)
            .transaction_state()
            .and_then(|s| s.change_transaction_depth(TransactionDepthChange::IncreaseDepth));
        if let Err(e) = depth {
            return Err(E::from(Error::from(e)));
        }
        let verdict = check
            .map_err(Error::from)
            .and_then(|row| row.outcome("fence"));
        match verdict {
            Ok(WriteOutcome::Ok) => {}
            Ok(refusal) if refusal.is_refusal() => {
                // Commit: the transaction holds only the audit row.
                Tm::commit_transaction(&mut *conn)
                    .await
                    .map_err(|e| E::from(Error::from(e)))?;
                conn.disarm();
                return Err(E::from(refusal.into_error(fence, operation, "fence")));
            }
            // The guard failed, or answered what it never answers: nothing of `work` runs.
            other => {
                let _ = Tm::rollback_transaction(&mut *conn).await;
                conn.disarm();
                let error = match other {
                    Ok(verdict) => verdict.into_error(fence, operation, "fence"),
                    Err(e) => e,
                };
                return Err(E::from(error));
            }
        }
        let outcome = match work(&mut *conn).await {
            Ok(value) => Tm::commit_transaction(&mut *conn)
                .await
                .map(|()| value)
                .map_err(E::from),
            Err(e) => {
                // The caller's error wins over a failed rollback (which leaves the connection broken: bb8 then
                // discards it).
                let _ = Tm::rollback_transaction(&mut *conn).await;
                Err(e)
            }
        };
        conn.disarm();
        outcome
    }

    /// Runs one INSERT, UPDATE or DELETE of your own tables *guarded by `fence` in the same statement*: one round
    /// trip checks the fence and writes, with exactly the guarantees of [`Store::fenced`] — the guard holds the
    /// lease's guard lock until the statement commits, so no takeover commits before it, and a refused fence
    /// writes nothing but its audit row. Returns how many rows the statement changed; a refusal is
    /// [`Error::Stale`] or [`Error::Denied`].
    ///
    /// The statement must test the guard's verdict: [`fence_passed()`](crate::guard::fence_passed) in a diesel query's filter, or the SQL
    /// text `(SELECT passed FROM pgfence_guard)` in its WHERE clause (an INSERT writes `INSERT … SELECT … WHERE` it). pgfence runs
    /// it as a data-modifying CTE beside the guard's, so that the guard runs first and its verdict gates every
    /// row:
    ///
    /// ```text
    /// WITH RECURSIVE pgfence_write AS (<your statement> RETURNING 1),
    ///      pgfence_guard AS MATERIALIZED (SELECT … FROM pgfence.fence(<fence>, <operation>))
    /// SELECT <verdict>, (SELECT count(*) FROM pgfence_write) FROM pgfence_guard
    /// ```
    ///
    /// A statement that does not mention the verdict is refused before it is sent ([`Error::InvalidInput`]).
    /// One that mentions it without being gated by it (say, in a comment) and changes rows under a refused fence
    /// fails as a whole with SQLSTATE `PF006`: a refused write never commits, but then its audit row does not
    /// either.
    ///
    /// The statement is prepared once per connection and reused (cached by its SQL text): build the text from
    /// constants and pass values as binds, as diesel does. Binds keep their numbers (`$1` is your first). It
    /// must not have a `RETURNING` clause of its own, nor a trailing semicolon. Use [`Store::fenced`] instead
    /// for several statements, for reads that decide what to write, or to get rows back.
    ///
    /// Autocommit: the write is acknowledged only once it committed (the reply is read to its end, which the
    /// server sends after the commit). The guard needs READ COMMITTED; under another session default the
    /// statement runs in an explicit READ COMMITTED transaction instead.
    ///
    /// ```no_run
    /// # async fn example(store: pgfence::Store, lease: pgfence::Lease) -> pgfence::Result<()> {
    /// use diesel::sql_types::{Integer, Text};
    /// // SQL text with binds:
    /// let moved = store
    ///     .guarded_write(
    ///         &lease.fence(),
    ///         "rebalance",
    ///         diesel::sql_query(
    ///             "UPDATE shards SET owner = $1 WHERE id = $2 AND (SELECT passed FROM pgfence_guard)",
    ///         )
    ///         .bind::<Text, _>("node-2")
    ///         .bind::<Integer, _>(7),
    ///     )
    ///     .await?;
    /// assert!(moved <= 1);
    /// # Ok(()) }
    /// ```
    ///
    /// The same with diesel's query builder:
    ///
    /// ```no_run
    /// # diesel::table! { shards (id) { id -> Integer, owner -> Text, } }
    /// # async fn example(store: pgfence::Store, lease: pgfence::Lease) -> pgfence::Result<()> {
    /// use diesel::prelude::*;
    /// let moved = store
    ///     .guarded_write(
    ///         &lease.fence(),
    ///         "rebalance",
    ///         diesel::update(shards::table.filter(shards::id.eq(7)).filter(pgfence::guard::fence_passed()))
    ///             .set(shards::owner.eq("node-2")),
    ///     )
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// - [`Error::Stale`] when the fence is not the lease's current, held, unexpired tenure, [`Error::Denied`]
    ///   when the session's role has no grant on the cluster or the fence's secret is not its tenure's: nothing
    ///   was written but the audit row.
    /// - [`Error::InvalidInput`] for a malformed `operation`, or a statement that does not test the guard's
    ///   verdict; nothing was sent.
    /// - [`Error::Database`] with SQLSTATE `PF006` when the statement changed rows without being gated by the
    ///   verdict under a refused fence (rolled back whole), or with your statement's own error.
    /// - The [errors of every database call](crate#errors).
    ///
    /// # Cancel safety
    ///
    /// A dropped write is cancelled on the server, but it may have committed already. See
    /// [cancel safety](crate#cancel-safety).
    #[tracing::instrument(level = "debug", skip_all, fields(lease = fence.lease(), epoch = fence.epoch().get(), operation = operation))]
    pub async fn guarded_write<Q>(&self, fence: &Fence, operation: &str, write: Q) -> Result<u64>
    where
        Q: QueryFragment<Pg> + Clone + Send + 'static,
    {
        check_operation(operation)?;
        let mut sql = PgQueryBuilder::default();
        write.to_sql(&mut sql, &Pg)?;
        if !sql.finish().contains(GUARD_CTE) {
            return Err(Error::invalid(
                "guarded write",
                format!("the statement must test the guard's verdict: {FENCE_PASSED} in its WHERE clause"),
            ));
        }
        let native = self.native_guard().await?;
        let statement = || GuardedWrite {
            write: write.clone(),
            lease: fence.lease.clone(),
            epoch: fence.epoch.get(),
            secret: fence.secret.expose_secret().to_owned(),
            operation: operation.to_owned(),
            native,
        };
        let row: GuardedWriteRow = match self.call_guarded(statement).await {
            Err(e) if native && e.sqlstate() == Some(SqlState::UndefinedFunction) => {
                self.forget_native_guard();
                return Err(e);
            }
            other => other?,
        };
        match WriteOutcome::decode(
            "fence",
            row.outcome.as_deref(),
            row.reason.as_deref(),
            row.current_epoch,
        )? {
            WriteOutcome::Ok => Ok(row.n.max(0) as u64),
            verdict => Err(verdict.into_error(fence, operation, "fence")),
        }
    }
}
