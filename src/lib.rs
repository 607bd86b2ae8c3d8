#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! The core a controller needs is on [`Store`]: connect and migrate, acquire, renew and release a [`Lease`],
//! its status, and write under its [`Fence`] ([`Store::guarded_write`], [`Store::fenced`]); with [`Error`] and
//! the value types, that is the crate root. The rest is reached through handles of the store and modules:
//!
//! - [`tasks`] ([`Store::tasks`]): guarded tasks and their events; [`effects`] ([`Store::effects`]): the ledger
//!   of external calls a successor settles;
//! - [`groups`] ([`Store::groups`]): replica groups; [`history`] ([`Store::history`]): the record of every tenure
//!   and the overlap review;
//! - [`admin`] ([`Store::admin`]): the operator's side — the database the store reaches, every lease, the audit,
//!   enforcement, grants, the layout;
//! - [`leader`]: the leadership runtime;
//! - [`limits`]: what every input may be; [`sqlstate`]: the SQLSTATEs pgfence tells apart; [`metrics`]: the
//!   metrics it records;
//! - [`guard`]: the guard as SQL, for statements pgfence does not build; [`schema`]: the migrations and the
//!   layout check; [`connection`]: the pool types, a [`Connector`](connection::Connector) for clients of one's
//!   own, connection-string helpers; [`reexports`]: the driver crates;
//! - `embedded` (feature `testing`, Unix): throwaway PostgreSQL servers.
//!
//! Which file owns what, and which SQL each module calls, is the one table of files in the repository's
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
//! # What to do next
//!
//! A controller decides what to do about any error, or about the end of a tenure, with one `match` on [`Next`]:
//! [`Error::next`] and [`TenureEnd::next`](leader::TenureEnd::next) (and [`LossReason::next`], the database's
//! verdict alone) answer it.
//!
//! | answer | when | what to do |
//! |---|---|---|
//! | [`Next::Retry`] | a transient error ([`Error::is_transient`]) | the same call again after a backoff; the tenure stands |
//! | [`Next::Recampaign`] | the tenure is over ([`Error::Lost`], [`Error::Stale`], a lost tenure or membership), or another holder's is live ([`Error::Held`], [`Error::MemberTaken`]) | stop writing with its fence; acquire (join) again and redo the work under the new epoch |
//! | [`Next::Stop`] | a denial ([`Error::Denied`], `no_grant`, `bad_secret`), bad input, a missing schema, a wrong database, the task's or ledger's own answer; an orderly end (released, shut down, handed over) | report it and stop: asking again, or campaigning, meets the same answer |
//!
//! ```
//! use pgfence::leader::TenureEnd;
//! use pgfence::{Error, LossReason, Next};
//!
//! fn decide(outcome: Result<(), Error>) -> &'static str {
//!     match outcome.map_err(|e| e.next()) {
//!         Ok(()) => "carry on",
//!         Err(Next::Retry) => "back off, then the same call again",
//!         Err(Next::Recampaign) => "campaign for a new tenure",
//!         Err(Next::Stop) => "give up",
//!     }
//! }
//!
//! assert_eq!(decide(Err(Error::SchemaMissing)), "give up");
//! let superseded = TenureEnd::Lost { reason: LossReason::Superseded };
//! assert_eq!(superseded.next(), Next::Recampaign);
//! assert_eq!(TenureEnd::Shutdown.next(), Next::Stop);
//! ```
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
//! | reads: [`Store::lease_status`]; [`Tasks::get`](tasks::Tasks::get), [`events`](tasks::Tasks::events); [`History::tenures`](history::History::tenures), [`review`](history::History::review); [`Groups::assignment`](groups::Groups::assignment), [`assigned_names`](groups::Groups::assigned_names), [`rebalance_inputs`](groups::Groups::rebalance_inputs), [`members`](groups::Groups::members), [`handover_gap`](groups::Groups::handover_gap); [`Admin::leases`](admin::Admin::leases), [`all_leases`](admin::Admin::all_leases), [`rejections`](admin::Admin::rejections), [`enforcement`](admin::Admin::enforcement), [`identity`](admin::Admin::identity), [`verify_identity`](admin::Admin::verify_identity) | nothing was written: drop and call again freely |
//! | [`Groups::join`](groups::Groups::join) (and [`Elector::join`](leader::Elector::join)) | the member may have joined with nobody holding its [`Member`](groups::Member): the same name is refused ([`Error::MemberTaken`]) until its ttl runs out (it never settles, so the group's assignment never counts it) |
//! | [`Groups::claim_rebalance`](groups::Groups::claim_rebalance), [`Groups::store_assignment`](groups::Groups::store_assignment) (and [`Elector::rebalance`](leader::Elector::rebalance)) | the claim may have been taken (it lapses after its time, and any member claims again) or the assignment stored (it is announced on the group's channel, and a second store of the same computation is refused): ask again |
//! | [`Groups::heartbeat`](groups::Groups::heartbeat) | the membership may or may not have been extended; its local deadline did not move: heartbeat again |
//! | [`Groups::leave`](groups::Groups::leave), [`Membership::leave`](leader::Membership::leave) | the member may or may not have left; if not, it expires after its ttl. Leaving again answers false |
//! | [`Store::acquire`] (and an elector's acquisition, [`run_with_leadership`](leader::run_with_leadership) while campaigning) | **the tenure may have been granted with nobody holding its [`Lease`]**: other holders get [`Error::Held`] until its ttl runs out, so a successor waits up to one ttl (the same holder acquiring again gets a new epoch at once). Bound the ttl accordingly, and do not time out an acquisition more tightly than you must |
//! | [`Store::renew`] | the tenure may or may not have been extended; the lease's local deadline did not move (the safe side): renew again |
//! | [`Store::release`], [`HeldLease::release`](leader::HeldLease::release) | the tenure may or may not have ended; if not, it expires after its ttl. Releasing is idempotent: release again (a `HeldLease` is released locally at once either way) |
//! | [`Admin::force_release`](admin::Admin::force_release) | the tenure may or may not have ended; force-release again (it then answers `NotHeld`) |
//! | [`Store::fenced`] | the transaction rolls back, unless its COMMIT was already sent: then it may have committed. `work` is dropped at its current await |
//! | [`Store::guarded_write`], [`Tasks::create`](tasks::Tasks::create), [`claim`](tasks::Tasks::claim), [`transition`](tasks::Tasks::transition), [`append_event`](tasks::Tasks::append_event) | the write may have committed (with its event). `create` is idempotent by key; after a commit, `claim` and `transition` answer [`Error::Conflict`] when retried (read the task); `append_event` appends a second event |
//! | [`Effects::intend`](effects::Effects::intend), [`record_outcome`](effects::Effects::record_outcome), [`settle`](effects::Effects::settle) | the ledger write may have committed (with its event): calling again with the same intent or outcome answers the recorded attempt (`created == false`); a settle called again answers [`EffectConflict::Settled`](effects::EffectConflict::Settled) by this epoch. [`in_doubt`](effects::Effects::in_doubt) only reads |
//! | [`Admin::set_enforcement`](admin::Admin::set_enforcement), [`prune_rejections`](admin::Admin::prune_rejections), [`grant_application`](admin::Admin::grant_application), [`grant_operator`](admin::Admin::grant_operator), [`revoke`](admin::Admin::revoke) | not cancelled: a statement already sent runs to completion on the server. Each is idempotent (pruning deletes whole batches only): call again |
//! | [`History::report_belief_start`](history::History::report_belief_start), [`History::report_belief_end`](history::History::report_belief_end) | the report may or may not have been recorded; reporting again is harmless (the first report of each kind stands) |
//! | [`Store::connect`], [`Store::from_pool`] | nothing persists: the connections opened so far are closed |
//! | [`Store::migrate`] | once the migrations started (on a blocking thread) they run to completion, each in its own transaction; a concurrent `migrate` waits for them |
//! | [`run_with_leadership`](leader::run_with_leadership) while leading, [`Supervisor::run`](leader::Supervisor::run) | the lease is released in the background, which cancels the callback's context token, and the callback is aborted at its next await point |
//! | [`HeldLease::lost`](leader::HeldLease::lost), [`LeaderContext::cancelled`](leader::LeaderContext::cancelled), [`Wakeups::wait`](leader::Wakeups::wait), [`Elector::health`](leader::Elector::health), [`SupervisorStatus::readiness`](leader::SupervisorStatus::readiness) | they only wait or read: drop freely |
//!
//! # Observability
//!
//! Metrics go through the [`metrics`](https://docs.rs/metrics) facade (install an exporter, then call
//! [`metrics::describe`] for units and help texts); tracing events and spans use the module path as their target
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

pub mod admin;
mod audit;
mod connect;
pub mod effects;
#[cfg(all(unix, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(all(unix, feature = "testing"))))]
pub mod embedded;
mod error;
mod fence;
pub mod history;
pub mod leader;
mod lease;
pub mod limits;
mod membership;
pub mod metrics;
mod next;
mod reply;
pub mod sqlstate;
mod store;
pub mod tasks;
mod types;
mod validate;

pub use connect::identity::{DatabaseIdentity, ExpectedIdentity};
pub use connect::pooler::PoolerMode;
pub use connect::tls::SslMode;
pub use error::{Error, Result};
pub use fence::Fence;
pub use lease::{ForceReleased, Lease, LeaseState, LeaseStatus, Released, TenureSecret};
pub use next::Next;
pub use store::config::StoreConfig;
pub use store::Store;
pub use types::{Epoch, LossReason};

pub mod connection {
    //! Connections outside a [`Store`](crate::Store)'s own use: the [`Pool`] type a store is built on
    //! ([`Store::from_pool`](crate::Store::from_pool), [`Admin::pool`](crate::admin::Admin::pool)) and its checkouts
    //! ([`PooledConnection`], [`Admin::conn`](crate::admin::Admin::conn)); a [`Connector`] that opens a
    //! tokio-postgres client secured exactly like pgfence's connections; connection strings without their
    //! credentials ([`redact`]) or for another database ([`with_database`]); a driver error with its causes
    //! ([`error_chain`]). The `pgfence` command's tools use them.

    pub use crate::connect::conninfo::{redact, with_database};
    pub use crate::connect::sqlstate::WireStream;
    pub use crate::connect::{Connection, Connector, TlsStream};
    pub use crate::error::error_chain;
    pub use crate::store::{Pool, PooledConnection};
}

pub mod groups {
    //! Replica groups ([`Store::groups`](crate::Store::groups), [`Groups`]): a member's declaration ([`MemberSpec`]), its membership ([`Member`]) and how it ends
    //! (the database's verdict, a [`LossReason`](crate::LossReason), in [`Error::MemberLost`](crate::Error::MemberLost)), the group's stored assignment ([`GroupAssignment`], [`Rebalance`],
    //! [`GroupNews`]; computed from [`RosterMember`]s whose [`NameSets`] a process reads once) and its members as an
    //! operator reads them ([`GroupMember`]). The leadership runtime spreads a group's names over its members
    //! ([`Spread`](crate::leader::Spread)).

    pub use crate::membership::{
        GroupAssignment, GroupMember, GroupNews, Groups, Member, MemberSpec, NameSets, OwnNames,
        Rebalance, RosterMember,
    };
}

pub mod guard {
    //! The guard as SQL, for writes pgfence does not build itself: the one-statement guarded write's text
    //! ([`guarded_write_sql`], for drivers other than diesel) and the verdict it is gated on ([`fence_passed`]),
    //! and [`Cached`] for the statements of a fenced transaction. docs/sql-clients.md shows them at work.

    pub use crate::fence::write::{fence_passed, guarded_write_sql, Cached};
}

pub mod schema {
    //! What pgfence installs in a database and how it checks it: the embedded [`MIGRATIONS`], the functions the
    //! schema owner must be able to run ([`ADVISORY_FUNCTIONS_NEEDED`]), the advisory layout check's findings
    //! ([`LayoutProblem`]), the native guard's version ([`NATIVE_GUARD_VERSION`]) and the class of the guard and
    //! intent locks ([`GUARD_LOCK_CLASS`]).

    pub use crate::store::migrate::{
        LayoutProblem, LayoutSeverity, ADVISORY_FUNCTIONS_NEEDED, MIGRATIONS,
    };
    pub use crate::store::NATIVE_GUARD_VERSION;
    pub use crate::types::GUARD_LOCK_CLASS;
}

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
