//! Connection poolers between pgfence and PostgreSQL (PgBouncer and the like): what pgfence needs of one, and the
//! check, at connect, that a transaction-mode pooler keeps the driver's named prepared statements.
//!
//! diesel-async runs every statement through tokio-postgres as a *named* prepared statement: one round trip
//! prepares it (`Parse` … `Sync`), the next runs it (`Bind`, `Execute`, `Sync`), and diesel-async keeps the ones
//! it caches for the connection's life. A pooler in transaction mode may hand each round trip outside a
//! transaction to another server session, which has no such statement. Turning diesel-async's statement cache
//! off does not help (the two round trips remain, and its connection setup prepares two statements of its own):
//! the pooler itself must keep prepared statements (PgBouncer ≥ 1.21 with `max_prepared_statements` > 0).

use std::time::Duration;

use diesel_async::AsyncPgConnection;

use crate::error::{Error, Result};

/// How pgfence's connections reach PostgreSQL; see [`StoreConfig::pooler`](crate::StoreConfig::pooler).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PoolerMode {
    /// Each pgfence connection has one server session for its whole life: PostgreSQL itself, or a pooler in
    /// session mode (PgBouncer's default `pool_mode = session`). Everything works, LISTEN and migrations included.
    #[default]
    Session,
    /// A pooler that lends a server session per transaction (PgBouncer's `pool_mode = transaction`). It must
    /// keep protocol-level named prepared statements (PgBouncer ≥ 1.21 with `max_prepared_statements` > 0);
    /// [`Store::connect`](crate::Store::connect) checks that it does and refuses it otherwise. No session
    /// outlives a transaction there, so pgfence neither LISTENs nor migrates through it: give it a
    /// [`direct_url`](crate::StoreConfig::direct_url) for those, or electors learn of released leases by
    /// polling and [`Store::migrate`](crate::Store::migrate) is refused.
    Transaction,
}

diesel::define_sql_function! {
    /// The server process of the session that runs the statement.
    fn pg_backend_pid() -> diesel::sql_types::Integer;
}

/// How long the check lets its first connection wait for a server session while the second holds one in an open
/// transaction: behind a pooler with a single server session for this database and role it waits for the
/// second's ROLLBACK.
const WAIT_FOR_A_SESSION: Duration = Duration::from_millis(200);

/// Rounds of the check before it concludes that nothing shares server sessions. One round usually shows a
/// transaction-mode pooler (PgBouncer lends the session released last first), but not always (3 rounds in 40
/// showed nothing on an idle PgBouncer 1.18 here).
const ROUNDS: u32 = 5;

/// Checks, on two fresh connections through a pooler declared as [`PoolerMode::Transaction`], that a statement
/// diesel-async prepared and cached on `a` still runs once the pooler has had to give `a` another server session
/// (`b` holds the one `a` used last, in an open transaction). Returns whether server sessions were seen shared
/// between client connections (never directly nor through a session-mode pooler).
///
/// Sound, not complete: a busy pooler may give `b` another session round after round while `a` keeps its own,
/// and then nothing is seen. A failure is never a false alarm: a session keeps its prepared statements. Bounded
/// by `limit` (plus the waits for a session); the connections are not to be used after an error.
pub(crate) async fn check_transaction_pooler(
    a: &mut AsyncPgConnection,
    b: &mut AsyncPgConnection,
    target: &str,
    limit: Duration,
) -> Result<bool> {
    let limit = limit + WAIT_FOR_A_SESSION * ROUNDS;
    let check = async {
        for _ in 0..ROUNDS {
            if check_once(a, b, target).await? {
                return Ok(true);
            }
        }
        Ok(false)
    };
    tokio::time::timeout(limit, check)
        .await
        .map_err(|_| Error::Connect {
            target: target.to_owned(),
            cause: format!("the transaction-mode pooler check did not finish within {limit:?}"),
        })?
}

/// One round of [`check_transaction_pooler`]: whether sessions were seen shared.
async fn check_once(
    a: &mut AsyncPgConnection,
    b: &mut AsyncPgConnection,
    target: &str,
) -> Result<bool> {
    use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
    let refused = |e: diesel::result::Error| {
        Error::Connect {
        target: target.to_owned(),
        cause: format!(
            "a named prepared statement did not survive the pooler ({e}): a transaction-mode pooler must keep \
             protocol-level prepared statements (PgBouncer 1.21 or later with max_prepared_statements > 0); \
             otherwise use session mode or connect directly"
        ),
    }
    };
    // Prepared and cached on `a` (in the first round); PgBouncer then lends the session it ran on first.
    let first: i32 = diesel::select(pg_backend_pid())
        .get_result(a)
        .await
        .map_err(refused)?;
    b.batch_execute("BEGIN").await?;
    let held: i32 = diesel::select(pg_backend_pid()).get_result(b).await?;
    let again = {
        let run = diesel::select(pg_backend_pid()).get_result::<i32>(a);
        tokio::pin!(run);
        match tokio::time::timeout(WAIT_FOR_A_SESSION, &mut run).await {
            Ok(result) => {
                b.batch_execute("ROLLBACK").await?;
                result
            }
            Err(_) => {
                b.batch_execute("ROLLBACK").await?;
                run.await
            }
        }
    };
    let again = again.map_err(refused)?;
    // A session never changes its backend; two client connections on one backend share sessions.
    Ok(held == first || again != first)
}
