//! The audit of refused writes: [`Rejection`], the rows of `pgfence.rejections` (written by the database alone,
//! `pgfence._reject` in `migrations/2026-11-30-000001_schema/up.sql`), and what selects them
//! ([`RejectionFilter`]). Reading and pruning them is administration
//! ([`Admin::rejections`](crate::admin::Admin::rejections), [`Admin::prune_rejections`](crate::admin::Admin::prune_rejections)).

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Integer, Nullable, Text, Timestamptz};
use diesel::QueryableByName;
use serde::{Deserialize, Serialize};

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
    /// Why: the refusal's [`LossReason::as_str`](crate::LossReason::as_str) (a stale epoch's reason, or a denial's:
    /// `no_grant`, `bad_secret`), or a reason of the raw-SQL enforcement (`delete_refused`, `lease_change`,
    /// `lease_mismatch`).
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

/// The columns of `pgfence.rejections` a [`Rejection`] reads.
pub(crate) const REJECTION_COLUMNS: &str = "id, role::text AS role, scope, lease, last_lease, presented_epoch, \
    current_epoch, current_holder, reason, operation, target_table, target_key, rejected_at, last_rejected_at, \
    count, last_target_key, application_name, host(client_addr) AS client_addr, backend_pid";

/// Which rejections [`Admin::rejections`](crate::admin::Admin::rejections) returns; newest first. Start from the default (every lease of the
/// store's cluster, at most 100 rows) and set what you need:
///
/// ```
/// let mut filter = pgfence::admin::RejectionFilter::default();
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
