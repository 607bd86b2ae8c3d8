//! Guarded writes: the [`Fence`] a write presents, the generic fenced transaction, the audit of rejected
//! writes and the raw-SQL enforcement switch.
//!
//! The guard runs in the database, in the same statement as the write (or as the first statement of the
//! caller's transaction): it takes the lease's *guard lock* (a transaction-level advisory lock) shared, then
//! reads the lease row in a fresh snapshot and compares the presented epoch with the current, held, unexpired
//! one granted on the current WAL timeline. Every change of who may write (acquire, release, force-release, and
//! a direct UPDATE of the row through a trigger) takes the guard lock exclusive, so a takeover waits for guarded
//! writes already past their check, and a guarded write arriving during a takeover waits and then reads the new
//! epoch. PostgreSQL queues lock requests fairly, so writes that start after a takeover began never hold it off,
//! and a takeover waits for a stalled guarded transaction at most the takeover grace (then ends it). Renewals
//! never take the guard lock, so they never queue behind writes.
//!
//! SQL: `migrations/2026-11-30-000003_guard/up.sql` (`pgfence.fence`, `pgfence._guard`, `pgfence._await_takeover`,
//! `pgfence.ungated_write`, the raw-SQL enforcement, `pgfence.prune_rejections`); the audit's writer
//! `pgfence._reject` and its table in `migrations/2026-11-30-000001_schema/up.sql`; `pgfence.grant_application`,
//! `pgfence.grant_operator` and `pgfence.revoke` in `migrations/2026-11-30-000006_roles/up.sql`.

use std::future::Future;

use chrono::{DateTime, Utc};
use diesel::pg::sql_types::Jsonb;
use diesel::pg::{Pg, PgQueryBuilder};
use diesel::query_builder::{AstPass, Query, QueryBuilder, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Bool, Integer, Nullable, Text, Timestamptz, Untyped};
use diesel::QueryableByName;
use diesel_async::AsyncPgConnection;
use serde::{Deserialize, Serialize};

use crate::error::{DenyReason, Error, Result};
use crate::lease::{Lease, TenureSecret};
use crate::reply::{deny_reason, is_denial, loss_reason, unexpected, RowsOf};
use crate::store::migrate::LayoutSeverity;
use crate::store::Store;
use crate::types::{Epoch, LossReason, TaskState};
use crate::validate::{validate_holder, validate_qualified};

/// What a guarded write presents: the cluster-qualified lease name, the epoch of the tenure that writes, and
/// that tenure's [`TenureSecret`].
///
/// A `Fence` is plain, serializable data, so a leader can hand it to a worker that writes through pgfence (or
/// through SQL) on its behalf; the database decides whether it is still current. Its serialized form carries
/// the secret: hand it only to processes that may write for the leader. `Debug` redacts the secret.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "FenceParts")]
pub struct Fence {
    lease: String,
    epoch: Epoch,
    secret: TenureSecret,
}

/// The unchecked shape of a serialized [`Fence`]; deserializing validates it like [`Fence::new`].
#[derive(Deserialize)]
struct FenceParts {
    lease: String,
    epoch: Epoch,
    secret: TenureSecret,
}

impl TryFrom<FenceParts> for Fence {
    type Error = Error;
    fn try_from(parts: FenceParts) -> Result<Fence> {
        Fence::new(parts.lease, parts.epoch, parts.secret)
    }
}

impl Fence {
    /// A fence from a cluster-qualified lease name (`<cluster>/<name>`), an epoch and its tenure's secret.
    /// Usually you get one from [`Lease::fence`](crate::Lease::fence) instead.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] when `lease` is not a valid cluster-qualified lease name.
    pub fn new(lease: impl Into<String>, epoch: Epoch, secret: TenureSecret) -> Result<Fence> {
        let lease = lease.into();
        validate_qualified(&lease)?;
        Ok(Fence {
            lease,
            epoch,
            secret,
        })
    }

    pub(crate) fn from_parts(lease: String, epoch: Epoch, secret: TenureSecret) -> Fence {
        Fence {
            lease,
            epoch,
            secret,
        }
    }

    /// The tenure's secret.
    pub fn secret(&self) -> &TenureSecret {
        &self.secret
    }

    /// The cluster-qualified lease name.
    pub fn lease(&self) -> &str {
        &self.lease
    }

    /// The epoch presented.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }
}

/// The longest accepted operation label (as in `pgfence.rejections.operation`).
pub const MAX_OPERATION_LEN: usize = 64;

fn check_operation(operation: &str) -> Result<()> {
    validate_holder("operation", operation)?;
    if operation.chars().count() > MAX_OPERATION_LEN {
        return Err(Error::invalid(
            "operation",
            format!("must be at most {MAX_OPERATION_LEN} characters"),
        ));
    }
    Ok(())
}

/// Counter `pgfence_stale_writes_total{lease}`: writes of this process the database refused as stale (and
/// audited). Described by [`describe_metrics`](crate::describe_metrics).
pub const METRIC_STALE_WRITES: &str = "pgfence_stale_writes_total";

/// The name of the guard's verdict in a one-statement guarded write ([`Store::guarded_write`]): a one-row CTE
/// with the column `passed` (boolean), true only when the fence is current and its guard lock held.
const GUARD_CTE: &str = "pgfence_guard";

/// The guard's verdict as SQL text, for the WHERE clause of a statement passed to [`Store::guarded_write`]:
/// `UPDATE shards SET owner = $1 WHERE id = $2 AND (SELECT passed FROM pgfence_guard)`.
pub const FENCE_PASSED: &str = "(SELECT passed FROM pgfence_guard)";

/// The guard's verdict as a diesel expression ([`FENCE_PASSED`]), for the filter of a query passed to
/// [`Store::guarded_write`]: `diesel::update(shards.filter(id.eq(7)).filter(pgfence::fence_passed()))`. It has a
/// meaning only there.
pub fn fence_passed() -> diesel::expression::SqlLiteral<Bool> {
    diesel::dsl::sql::<Bool>(FENCE_PASSED)
}

/// The reply of a one-statement guarded write, read by column name: the guard's outcome and reason, the lease's
/// current epoch, and how many rows the statement changed.
#[derive(Debug, QueryableByName)]
struct GuardedWriteRow {
    #[diesel(sql_type = Nullable<Text>)]
    outcome: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    reason: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    current_epoch: Option<i64>,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// The statement [`Store::guarded_write`] sends (see there). `WITH RECURSIVE` lets the caller's statement come
/// first and name the guard's CTE defined after it: the caller's binds keep their numbers and the guard's four
/// follow them. The guard still runs first: the statement's gate reads its verdict before touching a row.
#[derive(Debug, Clone)]
struct GuardedWrite<Q> {
    write: Q,
    lease: String,
    epoch: i64,
    secret: String,
    operation: String,
    /// `pgfence_native.fence` instead of `pgfence.fence` (see [`Store::native_guard`]).
    native: bool,
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
/// `current_holder` and `n`, the rows the statement changed. `statement` must test [`FENCE_PASSED`] (see
/// [`Store::guarded_write`]); run it autocommit or in a READ COMMITTED transaction.
///
/// ```
/// let sql = pgfence::guarded_write_sql(
///     "UPDATE shards SET owner = $1 WHERE id = $2 AND (SELECT passed FROM pgfence_guard)",
///     2,
/// );
/// assert!(sql.contains("pgfence.fence($3, $4, $5, $6, NULL, NULL)"));
/// ```
pub fn guarded_write_sql(statement: &str, binds: usize) -> String {
    guarded_write_sql_for(statement, binds, GUARDED_MID)
}

/// [`guarded_write_sql`] with the guard of the `pgfence_native` extension, `pgfence_native.fence` (see
/// [`Store::native_guard`]): the same statement, the same parameters and reply, for a database that has it.
///
/// ```
/// let sql = pgfence::native_guarded_write_sql(
///     "UPDATE shards SET owner = $1 WHERE id = $2 AND (SELECT passed FROM pgfence_guard)",
///     2,
/// );
/// assert!(sql.contains("pgfence_native.fence($3, $4, $5, $6, NULL, NULL)"));
/// ```
pub fn native_guarded_write_sql(statement: &str, binds: usize) -> String {
    guarded_write_sql_for(statement, binds, GUARDED_MID_NATIVE)
}

fn guarded_write_sql_for(statement: &str, binds: usize, mid: &str) -> String {
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
/// pgfence::Cached::new(diesel::sql_query("UPDATE shards SET moves = moves + 1 WHERE id = $1").bind::<Integer, _>(7))
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
    crate::error::diesel_sqlstate(e).as_deref() == Some("42883")
}

/// The guard functions, each called as `SELECT * FROM pgfence.f(…)` ([`RowsOf`]) and answered by one
/// [`WriteResultRow`].
pub(crate) mod sql {
    use diesel::sql_types::{BigInt, Nullable, Text};

    /// The composite type `pgfence.write_result` (migrations/2026-11-30-000001_schema) that `pgfence.fence` and
    /// the task functions return.
    #[derive(Debug, diesel::sql_types::SqlType, diesel::query_builder::QueryId)]
    #[diesel(postgres_type(name = "write_result", schema = "pgfence"))]
    // `pub`: the types diesel generates for each function name it in their public interface.
    #[allow(unreachable_pub)]
    pub struct WriteResult;

    diesel::define_sql_function! {
        #[sql_name = "pgfence.fence"]
        fn fence(lease: Text, epoch: BigInt, secret: Text, operation: Text, target_table: Nullable<Text>,
                 target_key: Nullable<Text>) -> WriteResult;
    }

    diesel::define_sql_function! {
        /// The same guard from the `pgfence_native` extension (native/).
        #[sql_name = "pgfence_native.fence"]
        fn native_fence(lease: Text, epoch: BigInt, secret: Text, operation: Text, target_table: Nullable<Text>,
                        target_key: Nullable<Text>) -> WriteResult;
    }
}

/// A `pgfence.write_result`, read by column name: the guard's verdict and, for a task write, the task after it.
#[derive(Debug, QueryableByName)]
pub(crate) struct WriteResultRow {
    #[diesel(sql_type = Nullable<Text>)]
    outcome: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    reason: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    current_epoch: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) task_id: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) task_key: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) task_state: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) assignee: Option<String>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub(crate) payload: Option<serde_json::Value>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) fence: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) version: Option<i64>,
    #[diesel(sql_type = Nullable<Bool>)]
    pub(crate) created: Option<bool>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) event_id: Option<i64>,
}

impl WriteResultRow {
    /// The verdict of `pgfence.<function>` (see [`WriteOutcome::decode`]).
    pub(crate) fn outcome(&self, function: &str) -> Result<WriteOutcome> {
        WriteOutcome::decode(
            function,
            self.outcome.as_deref(),
            self.reason.as_deref(),
            self.current_epoch,
        )
    }
}

/// The verdict of a guarded write — the outcome and reason of a `pgfence.write_result`, or of a one-statement
/// guarded write — decoded in this one place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WriteOutcome {
    /// `ok`: the fence is current and the write went through.
    Ok,
    /// `refused` with a loss reason: refused and audited, the fence's tenure is over.
    Stale {
        reason: LossReason,
        current: Option<Epoch>,
    },
    /// `refused` with `no_grant` or `bad_secret`: refused and audited (no grant on the cluster, or not the
    /// tenure's secret).
    Denied(DenyReason),
    /// `not_found`: no such task.
    NotFound,
    /// `conflict`: the task is not in the state the write requires.
    Conflict { actual: TaskState },
}

impl WriteOutcome {
    /// The verdict `pgfence.<function>` answered with `outcome` and `reason` (`current_epoch`: the lease's, or
    /// for `row_fence` the row's); an outcome or reason it never gives is an error.
    fn decode(
        function: &str,
        outcome: Option<&str>,
        reason: Option<&str>,
        current_epoch: Option<i64>,
    ) -> Result<WriteOutcome> {
        Ok(match outcome {
            Some("ok") => WriteOutcome::Ok,
            Some("refused") if is_denial(reason) => {
                WriteOutcome::Denied(deny_reason(function, reason)?)
            }
            Some("refused") => WriteOutcome::Stale {
                reason: loss_reason(function, reason)?,
                current: Epoch::from_db(current_epoch),
            },
            Some("not_found") => WriteOutcome::NotFound,
            Some("conflict") => WriteOutcome::Conflict {
                actual: reason.and_then(|state| state.parse().ok()).ok_or_else(|| {
                    unexpected(
                        function,
                        &format!("conflict with task state {}", reason.unwrap_or("NULL")),
                    )
                })?,
            },
            Some(other) => return Err(unexpected(function, &format!("outcome {other}"))),
            None => return Err(unexpected(function, "outcome missing")),
        })
    }

    /// Whether the database refused the write (and audited it).
    pub(crate) fn is_refusal(&self) -> bool {
        matches!(self, WriteOutcome::Stale { .. } | WriteOutcome::Denied(_))
    }

    /// The error of a verdict other than `ok`: [`Error::Stale`] or [`Error::Denied`] for a refusal (logged, and
    /// counted in [`METRIC_STALE_WRITES`] when stale); for an outcome `pgfence.<function>` gives to other writes
    /// only, an unexpected-reply error.
    pub(crate) fn into_error(self, fence: &Fence, operation: &str, function: &str) -> Error {
        match self {
            WriteOutcome::Denied(reason) => {
                tracing::warn!(lease = %fence.lease, presented = %fence.epoch, %reason, operation,
                    "write denied");
                Error::Denied {
                    lease: fence.lease.clone(),
                    operation: operation.to_owned(),
                    reason,
                }
            }
            WriteOutcome::Stale { reason, current } => {
                tracing::warn!(lease = %fence.lease, presented = %fence.epoch,
                    current = ?current.map(Epoch::get), %reason, operation, "stale write refused");
                metrics::counter!(METRIC_STALE_WRITES, "lease" => fence.lease.clone()).increment(1);
                Error::Stale {
                    lease: fence.lease.clone(),
                    presented: fence.epoch,
                    current,
                    reason,
                    operation: operation.to_owned(),
                }
            }
            other => unexpected(function, &format!("outcome {}", other.as_str())),
        }
    }

    /// The outcome's name in SQL.
    fn as_str(&self) -> &'static str {
        match self {
            WriteOutcome::Ok => "ok",
            WriteOutcome::Stale { .. } => "refused",
            WriteOutcome::Denied(_) => "refused",
            WriteOutcome::NotFound => "not_found",
            WriteOutcome::Conflict { .. } => "conflict",
        }
    }
}

/// A row of `pgfence.rejections`: refusals the database aggregated under one refused role — per (lease,
/// presented epoch, operation, reason) for scope `tenure` (beyond 16 (operation, reason) pairs of a tenure, per
/// reason under the operation `other`), per reason for scope `role` (see the table's comment in the migration).
/// Either way one row counts one reason only.
#[derive(Debug, Clone, Serialize, Deserialize, QueryableByName)]
#[non_exhaustive]
pub struct Rejection {
    /// Row id (increasing in insertion order).
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    /// The refused login role (`session_user`).
    #[diesel(sql_type = Text)]
    pub role: String,
    /// `tenure` (a tenure explains the refusal) or `role` (no tenure does: `no_grant`, `unknown_lease`,
    /// `future_epoch`; aggregated per role and reason).
    #[diesel(sql_type = Text)]
    pub scope: String,
    /// The cluster-qualified lease name (for scope `role`: of the first refusal).
    #[diesel(sql_type = Text)]
    pub lease: String,
    /// For scope `role`: the lease of the latest refusal.
    #[diesel(sql_type = Nullable<Text>)]
    pub last_lease: Option<String>,
    /// The epoch the refused write presented.
    #[diesel(sql_type = BigInt)]
    pub presented_epoch: i64,
    /// The lease's epoch at the time (the row's fence for `row_fence`).
    #[diesel(sql_type = Nullable<BigInt>)]
    pub current_epoch: Option<i64>,
    /// The lease's holder at the time.
    #[diesel(sql_type = Nullable<Text>)]
    pub current_holder: Option<String>,
    /// Why: a stale epoch's [`LossReason::as_str`], or a denial's [`DenyReason::as_str`].
    #[diesel(sql_type = Text)]
    pub reason: String,
    /// The refused operation.
    #[diesel(sql_type = Text)]
    pub operation: String,
    /// The table the write targeted, when known.
    #[diesel(sql_type = Nullable<Text>)]
    pub target_table: Option<String>,
    /// The key of the targeted row, when known.
    #[diesel(sql_type = Nullable<Text>)]
    pub target_key: Option<String>,
    /// When the database first refused this (lease, presented epoch, operation, reason) (database clock, UTC).
    #[diesel(sql_type = Timestamptz)]
    pub rejected_at: DateTime<Utc>,
    /// When it last refused it.
    #[diesel(sql_type = Timestamptz)]
    pub last_rejected_at: DateTime<Utc>,
    /// How many refusals this row aggregates (repeats of one lease, presented epoch, operation and reason).
    #[diesel(sql_type = BigInt)]
    pub count: i64,
    /// The key of the latest refused write's target.
    #[diesel(sql_type = Nullable<Text>)]
    pub last_target_key: Option<String>,
    /// The writer's `application_name`.
    #[diesel(sql_type = Nullable<Text>)]
    pub application_name: Option<String>,
    /// The writer's address (`NULL` over a Unix socket).
    #[diesel(sql_type = Nullable<Text>)]
    pub client_addr: Option<String>,
    /// The writer's backend process id.
    #[diesel(sql_type = Integer)]
    pub backend_pid: i32,
}

/// Raw-SQL enforcement on pgfence's task tables (see [`Store::set_enforcement`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Enforcement {
    /// Raw SQL is not checked (the default); privileges still apply.
    Off,
    /// Raw SQL without the current epoch fails with SQLSTATE `PF001`.
    Error,
    /// Raw SQL without the current epoch is skipped, recorded in `pgfence.rejections` and warned about.
    Audit,
}

/// The columns of `pgfence.rejections` a [`Rejection`] reads.
pub(crate) const REJECTION_COLUMNS: &str = "id, role::text AS role, scope, lease, last_lease, presented_epoch, \
    current_epoch, current_holder, reason, operation, target_table, target_key, rejected_at, last_rejected_at, \
    count, last_target_key, application_name, host(client_addr) AS client_addr, backend_pid";

/// Which rejections [`Store::rejections`] returns; newest first. Start from the default (every lease of the
/// store's cluster, at most 100 rows) and set what you need:
///
/// ```
/// let mut filter = pgfence::RejectionFilter::default();
/// filter.lease = Some("scheduler".into());
/// filter.limit = Some(20);
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RejectionFilter {
    /// Only this lease (name without cluster); `None` for every lease of the store's cluster.
    pub lease: Option<String>,
    /// Only rejections at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// At most this many rows (default 100).
    pub limit: Option<i64>,
    /// Every cluster in the database instead of the store's own (`lease` is then ignored).
    pub all_clusters: bool,
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
    /// its own); wrap the statements of `work` in [`Cached`] to prepare them once per connection.
    ///
    /// ```no_run
    /// # async fn example(store: pgfence::Store, lease: pgfence::Lease) -> pgfence::Result<()> {
    /// use diesel::sql_types::{Integer, Text};
    /// use diesel_async::RunQueryDsl;
    /// let moved = store
    ///     .fenced(&lease.fence(), "rebalance", async |conn| {
    ///         let n = pgfence::Cached::new(
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
    /// The statement must test the guard's verdict: [`fence_passed()`] in a diesel query's filter, or the SQL
    /// text [`FENCE_PASSED`] in its WHERE clause (an INSERT writes `INSERT … SELECT … WHERE` it). pgfence runs
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
    ///         diesel::update(shards::table.filter(shards::id.eq(7)).filter(pgfence::fence_passed()))
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
            Err(e) if native && e.sqlstate() == Some("42883") => {
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

    /// Rejections of this store's cluster (or as `filter` says), newest first.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a malformed lease name or a limit under 1, and the
    /// [errors of every database call](crate#errors). Dropping the future is safe: it only reads
    /// ([cancel safety](crate#cancel-safety)).
    pub async fn rejections(&self, filter: &RejectionFilter) -> Result<Vec<Rejection>> {
        use diesel_async::RunQueryDsl;
        let pattern = match &filter.lease {
            _ if filter.all_clusters => String::new(),
            Some(name) => {
                crate::validate::validate_name(name)?;
                self.qualify(name)
            }
            None => format!("{}/", self.cluster()),
        };
        let limit = filter.limit.unwrap_or(100);
        if limit < 1 {
            return Err(Error::invalid("limit", "must be at least 1"));
        }
        let mut conn = self.conn().await?;
        let rows = diesel::sql_query(format!(
            "SELECT {REJECTION_COLUMNS} FROM pgfence.rejections \
              WHERE (CASE WHEN $4 THEN lease = $1 ELSE starts_with(lease, $1) END) \
                AND ($2::timestamptz IS NULL OR last_rejected_at >= $2) \
              ORDER BY last_rejected_at DESC, id DESC LIMIT $3"
        ))
        .bind::<Text, _>(pattern)
        .bind::<Nullable<Timestamptz>, _>(filter.since)
        .bind::<BigInt, _>(limit)
        .bind::<Bool, _>(filter.lease.is_some() && !filter.all_clusters)
        .load(&mut *conn)
        .await?;
        Ok(rows)
    }

    /// Sets raw-SQL enforcement. While on, the database checks raw SQL on its tables as it checks pgfence's own
    /// writes: any INSERT or UPDATE of `pgfence.tasks` whose `fence` is not the lease's current, held, unexpired
    /// epoch, any INSERT into `pgfence.task_events` whose `epoch` is not (or that names another lease than its
    /// task's), and any DELETE, TRUNCATE or lease change of tasks is refused — with SQLSTATE `PF001`
    /// ([`Enforcement::Error`]) or by skipping the row, recording it in `pgfence.rejections` and warning the
    /// client ([`Enforcement::Audit`]). pgfence's own writes satisfy it by construction. Needs the owner or an
    /// operator role.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] with SQLSTATE `42501` without the owner or an every-cluster operator grant, and the
    /// [errors of every database call](crate#errors).
    ///
    /// # Cancel safety
    ///
    /// A statement already sent takes effect even if the future is dropped; setting it again is harmless. See
    /// [cancel safety](crate#cancel-safety).
    pub async fn set_enforcement(&self, enforcement: Enforcement) -> Result<()> {
        use diesel_async::RunQueryDsl;
        let (on, mode) = match enforcement {
            Enforcement::Off => (false, "error"),
            Enforcement::Error => (true, "error"),
            Enforcement::Audit => (true, "audit"),
        };
        let mut conn = self.conn().await?;
        diesel::sql_query("SELECT pgfence.set_enforcement($1, $2)")
            .bind::<Bool, _>(on)
            .bind::<Text, _>(mode)
            .execute(&mut *conn)
            .await?;
        tracing::info!(?enforcement, "raw-SQL enforcement switched");
        Ok(())
    }

    /// The raw-SQL enforcement in effect.
    ///
    /// # Errors
    ///
    /// The [errors of every database call](crate#errors). Dropping the future is safe: it only reads
    /// ([cancel safety](crate#cancel-safety)).
    pub async fn enforcement(&self) -> Result<Enforcement> {
        use diesel_async::RunQueryDsl;
        let mut conn = self.conn().await?;
        let mode: String = diesel::select(diesel::dsl::sql::<Text>("pgfence.enforcement()"))
            .get_result(&mut *conn)
            .await?;
        match mode.as_str() {
            "off" => Ok(Enforcement::Off),
            "error" => Ok(Enforcement::Error),
            "audit" => Ok(Enforcement::Audit),
            other => Err(unexpected("enforcement", other)),
        }
    }

    /// Deletes audit rows last seen more than `older_than` ago (database clock), in batches of at most `batch`
    /// rows, each its own short transaction, so retention never holds long locks. Returns how many it deleted.
    /// Needs the owner or an operator role.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] when `batch` is not 1 to 1,000,000; [`Error::Database`] with SQLSTATE `42501`
    /// without the owner or an every-cluster operator grant; the [errors of every database call](crate#errors).
    /// Batches deleted before an error stay deleted.
    ///
    /// # Cancel safety
    ///
    /// A dropped prune keeps the batches it deleted (and a batch already sent may still complete); pruning
    /// again is safe. See [cancel safety](crate#cancel-safety).
    pub async fn prune_rejections(
        &self,
        older_than: std::time::Duration,
        batch: u32,
    ) -> Result<u64> {
        use diesel_async::RunQueryDsl;
        if batch == 0 || batch > 1_000_000 {
            return Err(Error::invalid("batch", "must be 1 to 1000000 rows"));
        }
        let seconds = older_than.as_secs_f64();
        let mut total = 0u64;
        loop {
            let mut conn = self.conn().await?;
            let deleted: i32 = diesel::select(
                diesel::dsl::sql::<Integer>("pgfence.prune_rejections(")
                    .bind::<diesel::sql_types::Double, _>(seconds)
                    .sql(" * interval '1 second', ")
                    .bind::<Integer, _>(batch as i32)
                    .sql(")"),
            )
            .get_result(&mut *conn)
            .await?;
            total += deleted as u64;
            if (deleted as u32) < batch {
                tracing::info!(deleted = total, ?older_than, "audit pruned");
                return Ok(total);
            }
        }
    }

    /// Grants `role` the application rights on `cluster` (`None`: every cluster): acquire, renew, release and
    /// guarded writes of that cluster's leases, and reading its rows (row-level security hides the others).
    /// The database gives it EXECUTE on the lease and guarded-write functions and SELECT on the tables — no
    /// direct INSERT, UPDATE or DELETE. Run as the owner (the role that migrated). Refused, granting nothing
    /// ([`Error::InvalidInput`], SQLSTATE `22023` from SQL): PUBLIC, pseudo-roles (`current_user`, …),
    /// predefined `pg_*` roles, superusers, BYPASSRLS roles, and the owner and its members.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a refused or malformed `role` or `cluster`: PUBLIC, pseudo-roles, `pg_*` roles
    /// and malformed text before anything is sent, superusers, BYPASSRLS roles and the owner (or its members) by
    /// the database; [`Error::Database`] with SQLSTATE `42704` when no such role exists, `42501` when the session
    /// is not the owner or when the owner may not execute an advisory-lock function pgfence calls (the message
    /// names them and the GRANT to run; nothing was granted); the [errors of every database call](crate#errors).
    /// The rest of [`Store::layout_problems`] is logged as warnings.
    ///
    /// # Cancel safety
    ///
    /// A statement already sent takes effect even if the future is dropped; granting again is harmless. See
    /// [cancel safety](crate#cancel-safety).
    pub async fn grant_application(&self, role: &str, cluster: Option<&str>) -> Result<()> {
        self.grant("grant_application", role, cluster).await
    }

    /// Grants `role` the application rights plus force-release on `cluster`; with `None` (every cluster) also
    /// the instance settings (enforcement, takeover grace) and audit retention.
    ///
    /// # Errors
    ///
    /// As [`grant_application`](Self::grant_application).
    ///
    /// # Cancel safety
    ///
    /// As [`grant_application`](Self::grant_application).
    pub async fn grant_operator(&self, role: &str, cluster: Option<&str>) -> Result<()> {
        self.grant("grant_operator", role, cluster).await
    }

    /// Removes `role`'s grant of `cluster` (`None`: its every-cluster grant); once it has none left, also its
    /// privileges on pgfence's objects. Returns whether a grant was removed. Refuses the roles
    /// [`grant_application`](Self::grant_application) refuses, revoking nothing: in particular the owner, whose
    /// own privileges a revoke would take (every pgfence call would then fail `42501`).
    ///
    /// # Errors
    ///
    /// As [`grant_application`](Self::grant_application).
    ///
    /// # Cancel safety
    ///
    /// A statement already sent takes effect even if the future is dropped; revoking again is harmless (it then
    /// returns `false`). See [cancel safety](crate#cancel-safety).
    pub async fn revoke(&self, role: &str, cluster: Option<&str>) -> Result<bool> {
        use diesel_async::RunQueryDsl;
        check_role(role)?;
        if let Some(cluster) = cluster {
            crate::validate::validate_cluster(cluster)?;
        }
        let mut conn = self.conn().await?;
        let removed: i32 = diesel::select(
            diesel::dsl::sql::<Integer>("pgfence.revoke(")
                .bind::<Text, _>(role)
                .sql(", ")
                .bind::<Nullable<Text>, _>(cluster)
                .sql(")"),
        )
        .get_result(&mut *conn)
        .await?;
        tracing::info!(
            role,
            cluster = cluster.unwrap_or("*"),
            removed,
            "grant revoked"
        );
        Ok(removed > 0)
    }

    async fn grant(&self, function: &str, role: &str, cluster: Option<&str>) -> Result<()> {
        use diesel_async::RunQueryDsl;
        check_role(role)?;
        if let Some(cluster) = cluster {
            crate::validate::validate_cluster(cluster)?;
        }
        // The layout first: a grant is of no use while the owner may not take the guard lock (nothing is
        // changed then), and the rest is worth a warning.
        for problem in self.layout_problems().await? {
            if problem.severity == LayoutSeverity::Error {
                return Err(Error::Database {
                    sqlstate: Some("42501".to_owned()),
                    message: format!(
                        "pgfence: refusing to grant: {}. To fix: {}",
                        problem.problem, problem.fix
                    ),
                    source: None,
                });
            }
            tracing::warn!(problem = %problem.problem, fix = %problem.fix,
                "the database's role layout leaves a gap (docs/security.md)");
        }
        let mut conn = self.conn().await?;
        diesel::sql_query(format!("SELECT pgfence.{function}($1, $2)"))
            .bind::<Text, _>(role)
            .bind::<Nullable<Text>, _>(cluster)
            .execute(&mut *conn)
            .await?;
        tracing::info!(
            role,
            cluster = cluster.unwrap_or("*"),
            function,
            "grant recorded"
        );
        Ok(())
    }
}

/// Roles a grant refuses before asking the database (which refuses them too): PUBLIC and the pseudo-roles stand
/// for many roles, and predefined `pg_*` roles are held by roles nobody listed.
fn check_role(role: &str) -> Result<()> {
    validate_holder("role", role)?;
    if role.chars().count() > 63 {
        return Err(Error::invalid("role", "must be at most 63 characters"));
    }
    let lower = role.to_lowercase();
    if matches!(
        lower.as_str(),
        "public" | "current_user" | "current_role" | "session_user" | "user" | "none"
    ) || role.starts_with("pg_")
    {
        return Err(Error::invalid(
            "role",
            "PUBLIC, pseudo-roles and predefined pg_* roles stand for many roles: grant to a role of the \
             application",
        ));
    }
    Ok(())
}

impl Lease {
    /// The fence every guarded write of this tenure presents (it carries the tenure's secret).
    pub fn fence(&self) -> Fence {
        Fence::from_parts(self.qualified.clone(), self.epoch, self.secret.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guarded write's verdict decodes by its outcome and reason; an outcome no function gives, a refusal
    /// without its reason and a conflict without a task state are errors, never defaults (an unknown verdict
    /// taken for `ok` would let a fenced transaction run).
    #[test]
    fn write_outcomes_decode_exactly() {
        let decode =
            |outcome, reason, current| WriteOutcome::decode("fence", outcome, reason, current);
        assert_eq!(decode(Some("ok"), None, Some(2)).unwrap(), WriteOutcome::Ok);
        assert_eq!(
            decode(Some("refused"), Some("row_fence"), Some(5)).unwrap(),
            WriteOutcome::Stale {
                reason: LossReason::RowFence,
                current: Some(Epoch(5))
            }
        );
        assert_eq!(
            decode(Some("refused"), Some("no_grant"), None).unwrap(),
            WriteOutcome::Denied(DenyReason::NoGrant)
        );
        assert_eq!(
            decode(Some("conflict"), Some("running"), Some(1)).unwrap(),
            WriteOutcome::Conflict {
                actual: TaskState::Running
            }
        );
        assert_eq!(
            decode(Some("not_found"), None, Some(1)).unwrap(),
            WriteOutcome::NotFound
        );
        for (outcome, reason) in [
            (Some("okay"), None),
            (None, None),
            (Some("refused"), None),
            (Some("refused"), Some("paused")),
            // The outcomes of the surface before refusals had one name are unknown now.
            (Some("stale"), Some("superseded")),
            (Some("denied"), Some("bad_secret")),
            (Some("conflict"), Some("paused")),
            (Some("conflict"), None),
        ] {
            assert!(
                decode(outcome, reason, None).is_err(),
                "{outcome:?} {reason:?}"
            );
        }
        assert!(WriteOutcome::Denied(DenyReason::BadSecret).is_refusal());
        assert!(!WriteOutcome::NotFound.is_refusal());
    }

    /// Each verdict keeps its SQL name, and a verdict that is no refusal becomes an error naming it; the two
    /// refusals become `Stale` and `Denied` for the fence's lease and the caller's operation.
    #[test]
    fn write_outcomes_name_themselves_and_become_their_errors() {
        let fence = Fence::from_parts(
            "c/l".to_owned(),
            Epoch(3),
            TenureSecret::parse("a1".repeat(crate::SECRET_LEN / 2)).unwrap(),
        );
        let verdicts = [
            (WriteOutcome::Ok, "ok", None, None),
            (
                WriteOutcome::Stale {
                    reason: LossReason::Superseded,
                    current: Some(Epoch(4)),
                },
                "refused",
                Some("superseded"),
                Some(4),
            ),
            (
                WriteOutcome::Denied(DenyReason::NoGrant),
                "refused",
                Some("no_grant"),
                None,
            ),
            (WriteOutcome::NotFound, "not_found", None, None),
            (
                WriteOutcome::Conflict {
                    actual: TaskState::Succeeded,
                },
                "conflict",
                Some("succeeded"),
                None,
            ),
        ];
        for (verdict, name, reason, current) in verdicts {
            assert_eq!(verdict.as_str(), name);
            assert_eq!(
                WriteOutcome::decode("fence", Some(name), reason, current).unwrap(),
                verdict
            );
            let refusal = verdict.is_refusal();
            assert_eq!(refusal, name == "refused", "{name}");
            match verdict.into_error(&fence, "move", "fence") {
                Error::Stale {
                    lease,
                    presented,
                    current,
                    reason,
                    operation,
                } => {
                    assert_eq!((name, reason), ("refused", LossReason::Superseded));
                    assert_eq!(
                        (lease.as_str(), presented, operation.as_str()),
                        ("c/l", Epoch(3), "move")
                    );
                    assert_eq!((current, reason), (Some(Epoch(4)), LossReason::Superseded));
                }
                Error::Denied {
                    lease,
                    operation,
                    reason,
                } => {
                    assert_eq!((name, reason), ("refused", DenyReason::NoGrant));
                    assert_eq!(
                        (lease.as_str(), operation.as_str(), reason),
                        ("c/l", "move", DenyReason::NoGrant)
                    );
                }
                other => {
                    assert!(!refusal, "{name}: {other}");
                    assert!(
                        other.to_string().contains(&format!("outcome {name}")),
                        "{name}: {other}"
                    );
                }
            }
        }
    }
}
