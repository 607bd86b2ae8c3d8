#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! The core a controller needs is at the crate root: [`Store`] (connect, migrate, leases, guarded writes, tasks,
//! groups, the audit and the record), [`Lease`] and its [`Fence`], [`Error`]. Two subsystems have modules of
//! their own: [`effects`], the ledger of external calls a successor settles ([`Store::effects`]), and [`leader`],
//! the leadership runtime. `embedded` (feature `testing`, Unix) starts throwaway PostgreSQL servers. Which file
//! owns what, and which SQL each module calls, is the one table of files in the repository's
//! docs/architecture.md.
//!
//! # Errors
//!
//! Every fallible function returns [`Error`]; its `# Errors` section names the variants that belong to the
//! operation. Any call that reaches the database can also fail for reasons of its own, listed here once:
//!
//! - [`Error::Connect`], [`Error::Tls`], [`Error::PoolTimeout`]: no connection (a pool timeout names what it
//!   waited for: every connection checked out by others, or the last connection error the pool saw).
//!   Transient, except `Tls`.
//! - [`Error::NotPrimary`], [`Error::WrongDatabase`]: a connection pgfence opened reached a standby or another
//!   database than the store expects (every new connection is checked).
//! - [`Error::SchemaMissing`]: the pgfence schema is not installed in this database ([`Store::migrate`]).
//! - [`Error::Database`]: anything else the database or the driver reported, with its SQLSTATE when known — a
//!   lost connection (`08006`), a serialization failure or deadlock, a lock wait that timed out (`55P03`, or
//!   pgfence's `PF003`, which names the blockers), a missing privilege (`42501`).
//!
//! [`Error::is_transient`] tells which of them are worth retrying unchanged. A retry gets a live session: when a
//! statement's error says its session is over (the server terminated it or is shutting down, `57P0x`; it idled
//! in a transaction too long, `25P03`; the connection broke, `08xxx`), its connection is discarded, not returned
//! to the pool, even when the driver has not yet seen the closed socket.
//!
//! # Cancel safety
//!
//! Every future pgfence returns may be dropped at any await point (a `tokio::time::timeout`, the losing branch
//! of a `select!`, an aborted task) without harming the store: a lease, task or guarded-write statement still
//! in flight is cancelled on the server (a cancel request sent in the background, best effort) and its
//! connection is discarded, never handed on mid-statement or inside a transaction. What the dropped call did is
//! another matter: a statement the server already ran, or that commits before the cancel request arrives, stays
//! committed and only its answer is lost. Per call:
//!
//! | call | if its future is dropped midway |
//! |---|---|
//! | reads: [`Store::lease_status`], [`leases`](Store::leases), [`all_leases`](Store::all_leases), [`tenures`](Store::tenures), [`review`](Store::review), [`task`](Store::task), [`task_events`](Store::task_events), [`rejections`](Store::rejections), [`enforcement`](Store::enforcement), [`identity`](Store::identity), [`verify_identity`](Store::verify_identity), [`roster`](Store::roster), [`group_members`](Store::group_members), [`handover_gap`](Store::handover_gap) | nothing was written: drop and call again freely |
//! | [`Store::join_group`] (and [`Elector::join`](leader::Elector::join)) | the member may have joined with nobody holding its [`Member`]: the same name is refused ([`Error::MemberTaken`]) until its ttl runs out, and the others count it meanwhile (its share waits that long) |
//! | [`Store::heartbeat`] | the membership may or may not have been extended; its local deadline did not move: heartbeat again |
//! | [`Store::leave_group`], [`Membership::leave`](leader::Membership::leave) | the member may or may not have left; if not, it expires after its ttl. Leaving again answers false |
//! | [`Store::acquire`] (and an elector's acquisition, [`run_with_leadership`](leader::run_with_leadership) while campaigning) | **the tenure may have been granted with nobody holding its [`Lease`]**: other holders get [`Error::Held`] until its ttl runs out, so a successor waits up to one ttl (the same holder acquiring again gets a new epoch at once). Bound the ttl accordingly, and do not time out an acquisition more tightly than you must |
//! | [`Store::renew`] | the tenure may or may not have been extended; the lease's local deadline did not move (the safe side): renew again |
//! | [`Store::release`], [`HeldLease::release`](leader::HeldLease::release) | the tenure may or may not have ended; if not, it expires after its ttl. Releasing is idempotent: release again (a `HeldLease` is released locally at once either way) |
//! | [`Store::force_release`] | the tenure may or may not have ended; force-release again (it then answers `NotHeld`) |
//! | [`Store::fenced`] | the transaction rolls back, unless its COMMIT was already sent: then it may have committed. `work` is dropped at its current await |
//! | [`Store::guarded_write`], [`create_task`](Store::create_task), [`claim_task`](Store::claim_task), [`transition_task`](Store::transition_task), [`append_event`](Store::append_event) | the write may have committed (with its event). `create_task` is idempotent by key; after a commit, `claim_task` and `transition_task` answer [`Error::Conflict`] when retried (read the task); `append_event` appends a second event |
//! | [`Effects::intend`](effects::Effects::intend), [`record_outcome`](effects::Effects::record_outcome), [`settle`](effects::Effects::settle) | the ledger write may have committed (with its event): calling again with the same intent or outcome answers the recorded attempt (`created == false`); a settle called again answers [`EffectConflict::Settled`](effects::EffectConflict::Settled) by this epoch. [`in_doubt`](effects::Effects::in_doubt) only reads |
//! | [`set_enforcement`](Store::set_enforcement), [`prune_rejections`](Store::prune_rejections), [`grant_application`](Store::grant_application), [`grant_operator`](Store::grant_operator), [`revoke`](Store::revoke) | not cancelled: a statement already sent runs to completion on the server. Each is idempotent (pruning deletes whole batches only): call again |
//! | [`Store::report_belief_start`], [`Store::report_belief_end`] | the report may or may not have been recorded; reporting again is harmless (the first report of each kind stands) |
//! | [`Store::connect`], [`Store::from_pool`] | nothing persists: the connections opened so far are closed |
//! | [`Store::migrate`] | once the migrations started (on a blocking thread) they run to completion, each in its own transaction; a concurrent `migrate` waits for them |
//! | [`run_with_leadership`](leader::run_with_leadership) while leading, [`Supervisor::run`](leader::Supervisor::run) | the lease is released in the background, which cancels the callback's context token, and the callback is aborted at its next await point |
//! | [`HeldLease::lost`](leader::HeldLease::lost), [`LeaderContext::cancelled`](leader::LeaderContext::cancelled), [`Wakeups::wait`](leader::Wakeups::wait), [`Elector::health`](leader::Elector::health), [`SupervisorStatus::readiness`](leader::SupervisorStatus::readiness) | they only wait or read: drop freely |
//!
//! # Observability
//!
//! Metrics go through the [`metrics`](https://docs.rs/metrics) facade (install an exporter, then call
//! [`describe_metrics`] for units and help texts); tracing events and spans use the module path as their target
//! (`pgfence::lease`, `pgfence::leader::pg`, …). Every lease operation, guarded write and task write runs in a
//! span named after it (`acquire`, `renew`, `release`, `force_release`, `fenced`, `guarded_write`,
//! `create_task`, …) with the lease's name and the epoch it presents as fields (`acquire` with the lease and
//! holder, `force_release` with the lease: their events carry the epoch they issued or ended); the leadership
//! runtime adds `run_with_leadership`, `campaign` (one acquisition attempt), `leader` (the callback),
//! `controller` and `renewal` (one batched renewal) spans. No span or event records a tenure secret, a fence or
//! a connection string. With no subscriber installed a span costs a few branches on an atomic load, and its
//! fields are never computed.
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

mod admin;
mod audit;
mod connect;
pub mod effects;
#[cfg(all(unix, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(all(unix, feature = "testing"))))]
pub mod embedded;
mod error;
mod fence;
mod history;
pub mod leader;
mod lease;
mod membership;
mod reply;
mod store;
mod tasks;
mod types;
mod validate;

pub use admin::{Enforcement, Revoked};
pub use audit::{Rejection, RejectionFilter};
pub use connect::conninfo::{redact, with_database};
pub use connect::identity::{DatabaseIdentity, ExpectedIdentity};
pub use connect::pooler::PoolerMode;
pub use connect::sqlstate::code as sqlstate;
pub use connect::sqlstate::WireStream;
pub use connect::tls::SslMode;
pub use connect::{Connection, Connector, TlsStream};
pub use error::{error_chain, is_retryable_sqlstate, DenyReason, Error, Result};
pub use fence::outcome::METRIC_STALE_WRITES;
pub use fence::write::{
    fence_passed, guarded_write_sql, native_guarded_write_sql, Cached, FENCE_PASSED,
};
pub use fence::{Fence, MAX_OPERATION_LEN};
pub use history::{
    Belief, BeliefEnd, Interval, OffsetBounds, Overlap, ServerView, Successor, Tenure,
    TenureReview, CLOCK_DRIFT_PPM, WRITE_MARK_RESOLUTION,
};
pub use lease::{
    ForceReleased, Lease, LeaseState, LeaseStatus, Released, TenureSecret, SECRET_LEN,
};
pub use membership::{
    GroupMember, Member, MemberLoss, MemberSpec, Roster, RosterMember, MAX_GROUP_LEN,
    MAX_GROUP_NAMES, MAX_SHARDS, MAX_WEIGHT,
};
pub use store::config::{StoreConfig, DEFAULT_MIGRATION_LOCK_WAIT};
pub use store::migrate::{LayoutProblem, LayoutSeverity, ADVISORY_FUNCTIONS_NEEDED, MIGRATIONS};
pub use store::{Pool, PooledConnection, Store, NATIVE_GUARD_VERSION};
pub use tasks::{Task, TaskEvent, TaskWrite, MAX_KIND_LEN, MAX_PAYLOAD_BYTES, MAX_PAYLOAD_DEPTH};
pub use types::{
    Epoch, LossReason, TaskState, GUARD_LOCK_CLASS, MAX_CLUSTER_LEN, MAX_HOLDER_LEN, MAX_NAME_LEN,
    MAX_TTL, MIN_TTL,
};

/// The driver crates pgfence is built on, re-exported so that fenced-transaction code uses the same versions.
pub mod reexports {
    pub use diesel;
    pub use diesel_async;
    /// rustls, for [`StoreConfig::tls`](crate::StoreConfig::tls).
    #[cfg(feature = "tls")]
    pub use rustls;
    /// serde_json 1: task and event payloads are its [`Value`](serde_json::Value).
    pub use serde_json;
    pub use tokio_postgres;
    pub use tokio_util;
}

/// Describes every metric pgfence records — its unit and help text — to the `metrics` recorder installed now
/// (an exporter shows them, e.g. as Prometheus `# HELP` lines). Call it once after installing the recorder:
/// pgfence does not call it itself, because a description sent before the application installs its recorder
/// is lost. Calling it again is harmless.
///
/// | metric | type | unit | labels | what |
/// |---|---|---|---|---|
/// | `pgfence_leader` ([`METRIC_LEADER`](leader::METRIC_LEADER)) | gauge | count | `lease` | 1 while this process holds a tenure of the lease, else 0 |
/// | `pgfence_leader_transitions_total` ([`METRIC_TRANSITIONS`](leader::METRIC_TRANSITIONS)) | counter | count | `lease` | tenures this process began or ended |
/// | `pgfence_lease_losses_total` ([`METRIC_LOSSES`](leader::METRIC_LOSSES)) | counter | count | `lease`, `cause` | tenures lost: `definitive`, `deadline`, `injected` |
/// | `pgfence_renew_duration_seconds` ([`METRIC_RENEW_DURATION`](leader::METRIC_RENEW_DURATION)) | histogram | seconds | — | round trip of one batched renewal statement |
/// | `pgfence_callbacks_not_stopped_total` ([`METRIC_CALLBACKS_NOT_STOPPED`](leader::METRIC_CALLBACKS_NOT_STOPPED)) | counter | count | `lease` | leader callbacks aborted after the grace period |
/// | `pgfence_stale_writes_total` ([`METRIC_STALE_WRITES`]) | counter | count | `lease` | writes refused as stale (and audited) |
/// | `pgfence_group_members` ([`METRIC_GROUP_MEMBERS`](leader::METRIC_GROUP_MEMBERS)) | gauge | count | `group` | live members of the group at this replica's last roster read |
/// | `pgfence_group_names_assigned` ([`METRIC_GROUP_NAMES_ASSIGNED`](leader::METRIC_GROUP_NAMES_ASSIGNED)) | gauge | count | `group` | names the group's assignment gives this replica |
/// | `pgfence_group_names_led` ([`METRIC_GROUP_NAMES_LED`](leader::METRIC_GROUP_NAMES_LED)) | gauge | count | `group` | names of the group this replica leads now |
/// | `pgfence_handovers_total` ([`METRIC_HANDOVERS`](leader::METRIC_HANDOVERS)) | counter | count | `group` | tenures this replica ended to hand their name over |
/// | `pgfence_handover_gap_duration_seconds` ([`METRIC_HANDOVER_GAP`](leader::METRIC_HANDOVER_GAP)) | histogram | seconds | `group` | how long a name acquired after a handover had no holder (database clock) |
/// | `pgfence_belief_reports_failed_total` ([`METRIC_BELIEF_REPORTS_FAILED`](leader::METRIC_BELIEF_REPORTS_FAILED)) | counter | count | `lease` | belief reports that failed or timed out |
///
/// ```
/// // After installing the application's exporter (metrics-exporter-prometheus, …):
/// pgfence::describe_metrics();
/// ```
pub fn describe_metrics() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!(
        leader::METRIC_LEADER,
        Unit::Count,
        "1 while this process holds a tenure of the lease, else 0"
    );
    describe_counter!(
        leader::METRIC_TRANSITIONS,
        Unit::Count,
        "Tenures of the lease this process began or ended (acquired, lost or released)"
    );
    describe_counter!(
        leader::METRIC_LOSSES,
        Unit::Count,
        "Tenures this process lost, by cause: definitive (the database ended it), deadline (no renewal before \
         the local deadline), injected (test double)"
    );
    describe_histogram!(
        leader::METRIC_RENEW_DURATION,
        Unit::Seconds,
        "Round trip of one batched renewal statement (one observation per statement, however many leases)"
    );
    describe_counter!(
        leader::METRIC_CALLBACKS_NOT_STOPPED,
        Unit::Count,
        "Leader callbacks that did not return within the grace period after their tenure ended, and were aborted"
    );
    describe_gauge!(
        leader::METRIC_GROUP_MEMBERS,
        Unit::Count,
        "Live members of the replica group at this replica's last roster read"
    );
    describe_gauge!(
        leader::METRIC_GROUP_NAMES_ASSIGNED,
        Unit::Count,
        "Names the group's balanced assignment gives this replica (what it should lead)"
    );
    describe_gauge!(
        leader::METRIC_GROUP_NAMES_LED,
        Unit::Count,
        "Names of the replica group this replica leads now"
    );
    describe_counter!(
        leader::METRIC_HANDOVERS,
        Unit::Count,
        "Tenures this replica ended to hand their name over to the member the assignment gives it to"
    );
    describe_histogram!(
        leader::METRIC_HANDOVER_GAP,
        Unit::Seconds,
        "How long a name this replica acquired after a handover had no holder (predecessor's release to this \
         acquisition, database clock)"
    );
    describe_counter!(
        METRIC_STALE_WRITES,
        Unit::Count,
        "Writes of this process the database refused as stale (each also a row in pgfence.rejections)"
    );
    describe_counter!(
        leader::METRIC_BELIEF_REPORTS_FAILED,
        Unit::Count,
        "Reports of when this process started or stopped believing it led a tenure that failed or timed out \
         (the overlap review shows such a belief as unknown)"
    );
    describe_gauge!(
        effects::METRIC_EFFECTS_IN_DOUBT,
        Unit::Count,
        "Effects of the lease in doubt (an ended tenure's intent without an outcome, or an unknown outcome) at \
         this process's last listing"
    );
    describe_histogram!(
        effects::METRIC_EFFECT_SETTLE_SECONDS,
        Unit::Seconds,
        "How long each effect this process settled had been in doubt: from the end of the tenure that left it \
         (or its unknown outcome) to the settle, database clock"
    );
}
