//! The one statement that carries a write and its guard together: the caller's statement wrapped in a CTE
//! that calls the guard first and gates the write on its verdict ([`fence_passed`]), and [`Cached`] for the
//! statements of a fenced transaction.

use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Bool, Nullable, Text, Untyped};
use diesel::QueryableByName;

#[cfg(doc)]
use crate::store::Store;

/// The name of the guard's verdict in a one-statement guarded write ([`Store::guarded_write`]): a one-row CTE
/// with the column `passed` (boolean), true only when the fence is current and its guard lock held.
pub(super) const GUARD_CTE: &str = "pgfence_guard";

/// The guard's verdict as SQL text (what [`fence_passed`] writes).
pub(crate) const FENCE_PASSED: &str = "(SELECT passed FROM pgfence_guard)";

/// The guard's verdict, the gate every one-statement guarded write tests: for the filter of a diesel query
/// passed to [`Store::guarded_write`], `diesel::update(shards.filter(id.eq(7)).filter(pgfence::guard::fence_passed()))`.
/// It has a meaning only there. In SQL text (a `sql_query` statement, or [`guarded_write_sql`] for another
/// driver) the same gate is written `(SELECT passed FROM pgfence_guard)`:
/// `UPDATE shards SET owner = $1 WHERE id = $2 AND (SELECT passed FROM pgfence_guard)`.
pub fn fence_passed() -> diesel::expression::SqlLiteral<Bool> {
    diesel::dsl::sql::<Bool>(FENCE_PASSED)
}

/// The reply of a one-statement guarded write, read by column name: the guard's outcome and reason, the lease's
/// current epoch, and how many rows the statement changed.
#[derive(Debug, QueryableByName)]
pub(super) struct GuardedWriteRow {
    #[diesel(sql_type = Nullable<Text>)]
    pub(super) outcome: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(super) reason: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(super) current_epoch: Option<i64>,
    #[diesel(sql_type = BigInt)]
    pub(super) n: i64,
}

/// The statement [`Store::guarded_write`] sends (see there). `WITH RECURSIVE` lets the caller's statement come
/// first and name the guard's CTE defined after it: the caller's binds keep their numbers and the guard's four
/// follow them. The guard still runs first: the statement's gate reads its verdict before touching a row.
#[derive(Debug, Clone)]
pub(super) struct GuardedWrite<Q> {
    pub(super) write: Q,
    pub(super) lease: String,
    pub(super) epoch: i64,
    pub(super) secret: String,
    pub(super) operation: String,
    /// `pgfence_native.fence` instead of `pgfence.fence` (see [`Store::native_guard`]).
    pub(super) native: bool,
}

/// The text of a one-statement guarded write before the caller's statement, between it and the fence's four
/// parameters (lease, epoch, secret, operation, separated by commas), and after them.
const GUARDED_HEAD: &str = "WITH RECURSIVE pgfence_write AS (";
// (A line break first: the caller's statement may end in a `--` comment.)
macro_rules! guarded_mid {
    ($function:literal) => {
        concat!(
            "\n RETURNING 1), pgfence_guard AS MATERIALIZED (SELECT g.outcome = 'ok' AS passed, \
             g.outcome, g.reason, g.current_epoch, g.current_holder FROM ",
            $function,
            "("
        )
    };
}
const GUARDED_MID: &str = guarded_mid!("pgfence.fence");
const GUARDED_MID_NATIVE: &str = guarded_mid!("pgfence_native.fence");
const GUARDED_TAIL: &str =
    ", NULL, NULL) g) SELECT g.outcome, g.reason, g.current_epoch, g.current_holder, \
     CASE WHEN g.passed OR w.n = 0 THEN w.n ELSE pgfence.ungated_write(g.outcome, w.n) END AS n \
     FROM pgfence_guard g, (SELECT count(*) AS n FROM pgfence_write) w";

/// The SQL that [`Store::guarded_write`] sends for `statement`, for drivers other than diesel (tokio-postgres,
/// pgbench, psql): prepare it once and run it with `statement`'s `binds` parameters (`$1` … `$binds`, numbered as
/// in `statement`) followed by the fence's: lease (text), epoch (bigint), secret (text) and operation (text).
/// The reply is one row: `outcome` (`ok` or `refused`), `reason` (why it was refused), `current_epoch`,
/// `current_holder` and `n`, the rows the statement changed. `statement` must test the guard's verdict,
/// `(SELECT passed FROM pgfence_guard)` (see [`fence_passed`] and [`Store::guarded_write`]); run it autocommit
/// or in a READ COMMITTED transaction.
///
/// `native` picks the guard as [`Store::native_guard`] answers for the database: `pgfence_native.fence`, of the
/// `pgfence_native` extension, or the portable `pgfence.fence`. Both take the same parameters and give the same
/// reply.
///
/// ```
/// # async fn example(store: &pgfence::Store) -> pgfence::Result<()> {
/// let sql = pgfence::guard::guarded_write_sql(
///     "UPDATE shards SET owner = $1 WHERE id = $2 AND (SELECT passed FROM pgfence_guard)",
///     2,
///     store.native_guard().await?,
/// );
/// assert!(sql.contains(".fence($3, $4, $5, $6, NULL, NULL)"));
/// # Ok(()) }
/// ```
pub fn guarded_write_sql(statement: &str, binds: usize, native: bool) -> String {
    let mid = if native {
        GUARDED_MID_NATIVE
    } else {
        GUARDED_MID
    };
    let first = binds + 1;
    format!(
        "{GUARDED_HEAD}{statement}{mid}${}, ${}, ${}, ${}{GUARDED_TAIL}",
        first,
        first + 1,
        first + 2,
        first + 3
    )
}

impl<Q: QueryFragment<Pg>> QueryFragment<Pg> for GuardedWrite<Q> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> diesel::QueryResult<()> {
        out.push_sql(GUARDED_HEAD);
        self.write.walk_ast(out.reborrow())?;
        out.push_sql(if self.native {
            GUARDED_MID_NATIVE
        } else {
            GUARDED_MID
        });
        out.push_bind_param::<Text, _>(&self.lease)?;
        out.push_sql(", ");
        out.push_bind_param::<BigInt, _>(&self.epoch)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&self.secret)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&self.operation)?;
        out.push_sql(GUARDED_TAIL);
        Ok(())
    }

    // Cached per connection by its SQL text (its type has no static id): the text depends only on the caller's
    // statement, never on the fence, which is bound.
    fn is_safe_to_cache_prepared(&self, _backend: &Pg) -> diesel::QueryResult<bool> {
        Ok(true)
    }
}

impl<Q> QueryId for GuardedWrite<Q> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Q> Query for GuardedWrite<Q> {
    type SqlType = Untyped;
}

/// A query that diesel-async prepares once per connection and then reuses, keyed by its SQL text — for the
/// statements of a [`Store::fenced`] transaction (or any other) that diesel would otherwise prepare again on
/// every call: UPDATE statements built with diesel's DSL and `sql_query` texts. Wrap a statement whose SQL
/// text is built from constants, with its values as binds: every distinct text stays prepared on the
/// connection for the connection's life. (A cached statement whose tables change shape afterwards fails with
/// "cached plan must not change result type" until the connection is replaced, as diesel's own cached
/// statements do.)
///
/// ```no_run
/// # async fn example(conn: &mut diesel_async::AsyncPgConnection) -> diesel::QueryResult<()> {
/// use diesel::sql_types::Integer;
/// use diesel_async::RunQueryDsl;
/// pgfence::guard::Cached::new(diesel::sql_query("UPDATE shards SET moves = moves + 1 WHERE id = $1").bind::<Integer, _>(7))
///     .execute(conn)
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Cached<Q>(Q);

impl<Q> Cached<Q> {
    /// Wraps `query`.
    pub fn new(query: Q) -> Cached<Q> {
        Cached(query)
    }
}

impl<Q: QueryFragment<Pg>> QueryFragment<Pg> for Cached<Q> {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, Pg>) -> diesel::QueryResult<()> {
        self.0.walk_ast(out)
    }

    fn is_safe_to_cache_prepared(&self, _backend: &Pg) -> diesel::QueryResult<bool> {
        Ok(true)
    }
}

impl<Q> QueryId for Cached<Q> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Q: Query> Query for Cached<Q> {
    type SqlType = Q::SqlType;
}
