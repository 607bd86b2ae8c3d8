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
//! SQL: `pgfence.fence`, `pgfence._guard`, `pgfence._wait_guard_lock`, `pgfence._reject` in `migrations/*/up.sql`.

use std::future::Future;
use std::pin::Pin;

use chrono::{DateTime, Utc};
use diesel::pg::sql_types::{Jsonb, Record};
use diesel::sql_types::{BigInt, Bool, Integer, Nullable, Text, Timestamptz};
use diesel::QueryableByName;
use diesel_async::AsyncPgConnection;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::lease::{validate_holder, validate_qualified, Epoch, LossReason};
use crate::store::{Store, TARGET};

/// What a guarded write presents: the cluster-qualified lease name and the epoch of the tenure that writes.
///
/// A `Fence` is plain, serializable data, so a leader can hand it to a downstream service that writes through
/// pgfence (or through SQL) on its behalf; the database decides whether it is still current.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "FenceParts")]
pub struct Fence {
    lease: String,
    epoch: Epoch,
}

/// The unchecked shape of a serialized [`Fence`]; deserializing validates it like [`Fence::new`].
#[derive(Deserialize)]
struct FenceParts {
    lease: String,
    epoch: Epoch,
}

impl TryFrom<FenceParts> for Fence {
    type Error = Error;
    fn try_from(parts: FenceParts) -> Result<Fence> {
        Fence::new(parts.lease, parts.epoch)
    }
}

impl Fence {
    /// A fence from a cluster-qualified lease name (`<cluster>/<name>`) and an epoch.
    pub fn new(lease: impl Into<String>, epoch: Epoch) -> Result<Fence> {
        let lease = lease.into();
        validate_qualified(&lease)?;
        Ok(Fence { lease, epoch })
    }

    pub(crate) fn from_parts(lease: String, epoch: Epoch) -> Fence {
        Fence { lease, epoch }
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

/// Counter of writes the database refused as stale (label `lease`).
pub const METRIC_STALE_WRITES: &str = "pgfence_stale_writes_total";

/// The future a [`Store::fenced`] callback returns: it borrows the transaction's connection.
pub type FencedFuture<'c, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'c>>;

pub(crate) mod sql {
    use super::*;

    /// `pgfence.write_result`.
    pub(crate) type WriteResult = Record<(
        Text,
        Nullable<Text>,
        Nullable<BigInt>,
        Nullable<Text>,
        Nullable<BigInt>,
        Nullable<Text>,
        Nullable<Text>,
        Nullable<Text>,
        Nullable<Jsonb>,
        Nullable<BigInt>,
        Nullable<BigInt>,
        Nullable<Bool>,
        Nullable<BigInt>,
    )>;

    pub(crate) type WriteRow = (
        String,
        Option<String>,
        Option<i64>,
        Option<String>,
        Option<i64>,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<serde_json::Value>,
        Option<i64>,
        Option<i64>,
        Option<bool>,
        Option<i64>,
    );

    diesel::define_sql_function! {
        #[sql_name = "pgfence.fence"]
        fn fence(lease: Text, epoch: BigInt, operation: Text, target_table: Nullable<Text>,
                 target_key: Nullable<Text>) -> WriteResult;
    }
}

/// One decoded `pgfence.write_result`.
#[derive(Debug)]
pub(crate) struct WriteOutcome {
    pub(crate) outcome: String,
    pub(crate) reason: Option<String>,
    pub(crate) current_epoch: Option<i64>,
    pub(crate) task_id: Option<i64>,
    pub(crate) task_key: Option<String>,
    pub(crate) task_state: Option<String>,
    pub(crate) assignee: Option<String>,
    pub(crate) payload: Option<serde_json::Value>,
    pub(crate) fence: Option<i64>,
    pub(crate) version: Option<i64>,
    pub(crate) created: Option<bool>,
    pub(crate) event_id: Option<i64>,
}

impl From<sql::WriteRow> for WriteOutcome {
    fn from(row: sql::WriteRow) -> Self {
        let (
            outcome,
            reason,
            current_epoch,
            _holder,
            task_id,
            task_key,
            task_state,
            assignee,
            payload,
            fence,
            version,
            created,
            event_id,
        ) = row;
        WriteOutcome {
            outcome,
            reason,
            current_epoch,
            task_id,
            task_key,
            task_state,
            assignee,
            payload,
            fence,
            version,
            created,
            event_id,
        }
    }
}

impl WriteOutcome {
    /// `Some(Error::Stale)` when the database refused the write as stale (and audited it).
    pub(crate) fn stale(&self, fence: &Fence, operation: &str) -> Option<Error> {
        (self.outcome == "stale").then(|| {
            let reason = LossReason::parse(self.reason.as_deref().unwrap_or("superseded"));
            tracing::warn!(target: TARGET, lease = %fence.lease, presented = %fence.epoch,
                current = ?self.current_epoch, %reason, operation, "stale write refused");
            metrics::counter!(METRIC_STALE_WRITES, "lease" => fence.lease.clone()).increment(1);
            Error::Stale {
                lease: fence.lease.clone(),
                presented: fence.epoch,
                current: Epoch::from_db(self.current_epoch),
                reason,
                operation: operation.to_owned(),
            }
        })
    }
}

/// A row of `pgfence.rejections`: one write the database refused as stale.
#[derive(Debug, Clone, Serialize, Deserialize, QueryableByName)]
pub struct Rejection {
    /// Row id (increasing in insertion order).
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    /// The cluster-qualified lease name.
    #[diesel(sql_type = Text)]
    pub lease: String,
    /// The epoch the refused write presented.
    #[diesel(sql_type = BigInt)]
    pub presented_epoch: i64,
    /// The lease's epoch at the time (the row's fence for `row_fence`).
    #[diesel(sql_type = Nullable<BigInt>)]
    pub current_epoch: Option<i64>,
    /// The lease's holder at the time.
    #[diesel(sql_type = Nullable<Text>)]
    pub current_holder: Option<String>,
    /// Why the epoch was stale (see [`LossReason::as_str`]).
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
    /// When the database first refused this (lease, presented epoch, operation) (database clock, UTC).
    #[diesel(sql_type = Timestamptz)]
    pub rejected_at: DateTime<Utc>,
    /// When it last refused it.
    #[diesel(sql_type = Timestamptz)]
    pub last_rejected_at: DateTime<Utc>,
    /// How many refusals this row aggregates (repeats of one lease, presented epoch and operation).
    #[diesel(sql_type = BigInt)]
    pub count: i64,
    /// The key of the latest refused write's target.
    #[diesel(sql_type = Nullable<Text>)]
    pub last_target_key: Option<String>,
    /// The writer's session role (`session_user`).
    #[diesel(sql_type = Nullable<Text>)]
    pub session_role: Option<String>,
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
pub enum Enforcement {
    /// Raw SQL is not checked (the default); privileges still apply.
    Off,
    /// Raw SQL without the current epoch fails with SQLSTATE `PF001`.
    Error,
    /// Raw SQL without the current epoch is skipped, recorded in `pgfence.rejections` and warned about.
    Audit,
}

/// Which rejections [`Store::rejections`] returns; newest first.
#[derive(Debug, Clone, Default)]
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
    /// Runs `work` in a transaction guarded by `fence`: the first statement locks the lease row and checks the
    /// epoch; if it is stale the transaction commits only the audit row and the result is [`Error::Stale`]
    /// (converted into `E`) without running `work`. Otherwise `work` runs on the same connection and the
    /// transaction commits when it returns `Ok` and rolls back when it returns `Err`.
    ///
    /// Until the transaction ends no takeover of the lease can commit: keep fenced transactions short, since
    /// a successor's acquisition waits for them — and never acquire, release or force-release the same lease
    /// from inside `work` (on another connection that would wait for this very transaction).
    ///
    /// The transaction runs at READ COMMITTED whatever the session default: the guard reads the lease in a
    /// snapshot taken after it was granted its lock, which REPEATABLE READ would not allow (the SQL guard
    /// refuses to decide there, with SQLSTATE `PF004`).
    /// Dropping the returned future rolls the transaction back on the server.
    ///
    /// ```no_run
    /// # async fn example(store: pgfence::Store, lease: pgfence::Lease) -> pgfence::Result<()> {
    /// use diesel_async::RunQueryDsl;
    /// let moved = store
    ///     .fenced(&lease.fence(), "rebalance", |conn| {
    ///         Box::pin(async move {
    ///             let n = diesel::sql_query("UPDATE shards SET owner = 'node-2' WHERE id = 7")
    ///                 .execute(conn)
    ///                 .await?;
    ///             Ok::<_, pgfence::Error>(n)
    ///         })
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn fenced<T, E, F>(&self, fence: &Fence, operation: &str, work: F) -> Result<T, E>
    where
        F: for<'c> FnOnce(&'c mut AsyncPgConnection) -> FencedFuture<'c, T, E> + Send,
        E: From<Error> + From<diesel::result::Error> + Send,
        T: Send,
    {
        use diesel_async::RunQueryDsl;
        check_operation(operation).map_err(E::from)?;
        let mut conn = self.checked().await.map_err(E::from)?;
        let fence = fence.clone();
        let op = operation.to_owned();
        // READ COMMITTED whatever the session default: the guard waits for a takeover in flight and then reads
        // the new epoch in a fresh snapshot, so a stale fence is refused *and audited*.
        let outcome: Result<Result<T, Error>, E> = (*conn)
            .build_transaction()
            .read_committed()
            .run(async move |conn: &mut AsyncPgConnection| {
                let check: sql::WriteRow = diesel::select(sql::fence(
                    &fence.lease,
                    fence.epoch.get(),
                    &op,
                    None::<String>,
                    None::<String>,
                ))
                .get_result(conn)
                .await?;
                if let Some(stale) = WriteOutcome::from(check).stale(&fence, &op) {
                    // Commit: the transaction holds only the audit row.
                    return Ok(Err(stale));
                }
                work(conn).await.map(Ok)
            })
            .await;
        conn.disarm();
        outcome?.map_err(E::from)
    }

    /// Rejections of this store's cluster, newest first.
    pub async fn rejections(&self, filter: &RejectionFilter) -> Result<Vec<Rejection>> {
        use diesel_async::RunQueryDsl;
        let pattern = match &filter.lease {
            _ if filter.all_clusters => String::new(),
            Some(name) => {
                crate::lease::validate_name(name)?;
                self.qualify(name)
            }
            None => format!("{}/", self.cluster()),
        };
        let limit = filter.limit.unwrap_or(100);
        if limit < 1 {
            return Err(Error::invalid("limit", "must be at least 1"));
        }
        let mut conn = self.conn().await?;
        let rows = diesel::sql_query(
            "SELECT id, lease, presented_epoch, current_epoch, current_holder, reason, operation, target_table, \
                    target_key, rejected_at, last_rejected_at, count, last_target_key, session_role, \
                    application_name, host(client_addr) AS client_addr, backend_pid \
               FROM pgfence.rejections \
              WHERE (CASE WHEN $4 THEN lease = $1 ELSE starts_with(lease, $1) END) \
                AND ($2::timestamptz IS NULL OR last_rejected_at >= $2) \
              ORDER BY last_rejected_at DESC, id DESC LIMIT $3",
        )
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
        tracing::info!(target: TARGET, ?enforcement, "raw-SQL enforcement switched");
        Ok(())
    }

    /// The raw-SQL enforcement in effect.
    pub async fn enforcement(&self) -> Result<Enforcement> {
        use diesel_async::RunQueryDsl;
        let mut conn = self.conn().await?;
        let mode: String = diesel::select(diesel::dsl::sql::<Text>("pgfence.enforcement()"))
            .get_result(&mut *conn)
            .await?;
        Ok(match mode.as_str() {
            "error" => Enforcement::Error,
            "audit" => Enforcement::Audit,
            _ => Enforcement::Off,
        })
    }

    /// Deletes audit rows last seen more than `older_than` ago (database clock), in batches of at most `batch`
    /// rows, each its own short transaction, so retention never holds long locks. Returns how many it deleted.
    /// Needs the owner or an operator role.
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
                tracing::info!(target: TARGET, deleted = total, ?older_than, "audit pruned");
                return Ok(total);
            }
        }
    }

    /// Grants `role` what an application needs: EXECUTE on the lease and guarded-write functions and SELECT on
    /// the tables — no direct INSERT, UPDATE or DELETE. Run as the owner (the role that migrated).
    pub async fn grant_application(&self, role: &str) -> Result<()> {
        self.grant("grant_application", role).await
    }

    /// Grants `role` the application rights plus force-release, enforcement and audit retention.
    pub async fn grant_operator(&self, role: &str) -> Result<()> {
        self.grant("grant_operator", role).await
    }

    async fn grant(&self, function: &str, role: &str) -> Result<()> {
        use diesel_async::RunQueryDsl;
        validate_holder("role", role)?;
        let mut conn = self.conn().await?;
        diesel::sql_query(format!("SELECT pgfence.{function}($1)"))
            .bind::<Text, _>(role)
            .execute(&mut *conn)
            .await?;
        tracing::info!(target: TARGET, role, function, "privileges granted");
        Ok(())
    }
}
