//! Several acquisitions for one holder in one statement (`pgfence.acquire_many`): what the PostgreSQL elector
//! sends when a rebalance gives its replica many names at once. Each lease is acquired exactly as
//! [`Store::acquire`] acquires it; the batch saves the round trips, the per-statement checks and commits, and the
//! first reads of each new tenure (its effects in doubt, its handover gap), which come back in the same row.

use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use diesel::QueryableByName;

use super::calls::acquisition;
use super::rows::LeaseResultRow;
use super::Lease;
use crate::error::{Error, Result};
use crate::reply::{unexpected, RowsOf};
use crate::store::Store;
use crate::validate::{ttl_ms, validate_holder, validate_name};

/// The most leases one `pgfence.acquire_many` call takes (`pgfence._max_acquire_batch()`).
const MAX_ACQUIRE_BATCH: usize = 256;

mod sql {
    use diesel::sql_types::{Array, BigInt, Text};

    /// A row of the table `pgfence.acquire_many` returns.
    #[derive(Debug, diesel::sql_types::SqlType, diesel::query_builder::QueryId)]
    // `pub`: the types diesel generates for each function name it in their public interface.
    #[allow(unreachable_pub)]
    pub struct AcquireManyResult;

    diesel::define_sql_function! {
        #[sql_name = "pgfence.acquire_many"]
        fn acquire_many(leases: Array<Text>, holder: Text, ttl_ms: BigInt) -> AcquireManyResult;
    }
}

/// A row of `pgfence.acquire_many`, read by column name: the lease, its `lease_result`, and for a lease acquired
/// the new tenure's first reads.
#[derive(QueryableByName)]
struct AcquireManyRow {
    #[diesel(sql_type = Text)]
    lease: String,
    #[diesel(embed)]
    result: LeaseResultRow,
    #[diesel(sql_type = Nullable<Integer>)]
    in_doubt: Option<i32>,
    #[diesel(sql_type = Nullable<BigInt>)]
    gap_us: Option<i64>,
}

/// A tenure begun by [`Store::acquire_many`], with what its successor-side reads found in the same statement.
#[derive(Debug)]
pub(crate) struct Begun {
    /// The new tenure.
    pub(crate) lease: Lease,
    /// How many effects earlier tenures of the lease left in doubt (`pgfence.in_doubt_effects`), as the tenure
    /// began (`None`: not answered; read the list). Only a count: the list is read when it is not 0.
    pub(crate) in_doubt: Option<u32>,
    /// How long the lease had no holder before this tenure, when the one before was released (a handover).
    pub(crate) gap: Option<Duration>,
}

impl Store {
    /// Acquires each of `names` (at most [`MAX_ACQUIRE_BATCH`], none twice) for `holder`, as
    /// [`acquire`](Self::acquire) would one by one, in one statement: the answer for each name, in the order given,
    /// `None` for a name whose lease row or guard lock another transaction held (the batch waits for no lock:
    /// acquire that one alone). The call as a whole fails (nothing acquired) on bad input or when the connection
    /// fails; each name's own refusal ([`Error::Held`], [`Error::Denied`]) is its answer.
    ///
    /// Not cancel safe, as `acquire`: a dropped call may have begun tenures nobody holds.
    pub(crate) async fn acquire_many(
        &self,
        names: &[String],
        holder: &str,
        ttl: Duration,
    ) -> Result<Vec<Option<Result<Begun>>>> {
        use diesel_async::RunQueryDsl;
        if names.is_empty() || names.len() > MAX_ACQUIRE_BATCH {
            return Err(Error::invalid(
                "leases",
                format!("acquire_many takes 1 to {MAX_ACQUIRE_BATCH} leases"),
            ));
        }
        for name in names {
            validate_name(name)?;
        }
        validate_holder("holder", holder)?;
        let ttl_ms = ttl_ms(ttl)?;
        // The database grants whole milliseconds; the local deadline must not be later than its expiry.
        let ttl = Duration::from_millis(ttl_ms as u64);
        let qualified: Vec<String> = names.iter().map(|n| self.qualify(n)).collect();
        let mut conn = self.checked().await?;
        let sent = Instant::now();
        let rows: std::result::Result<Vec<AcquireManyRow>, diesel::result::Error> = RowsOf(
            sql::acquire_many(qualified.clone(), holder.to_owned(), ttl_ms),
        )
        .load(&mut *conn)
        .await;
        conn.settle(&rows);
        let mut by_lease: std::collections::HashMap<String, AcquireManyRow> = rows?
            .into_iter()
            .map(|row| (row.lease.clone(), row))
            .collect();
        Ok(names
            .iter()
            .zip(qualified)
            .map(|(name, qualified)| {
                let Some(row) = by_lease.remove(&qualified) else {
                    return Some(Err(unexpected("acquire_many", "a lease without its row")));
                };
                if row.result.is_busy() {
                    return None;
                }
                let (in_doubt, gap_us) = (row.in_doubt, row.gap_us);
                Some(
                    acquisition(name, qualified, holder, ttl, sent, row.result).map(|lease| {
                        Begun {
                            lease,
                            in_doubt: in_doubt.and_then(|n| u32::try_from(n).ok()),
                            gap: gap_us.map(|us| Duration::from_micros(us.max(0) as u64)),
                        }
                    }),
                )
            })
            .collect())
    }
}
