//! The leadership runtime: self-renewing leases with a loss signal, `run_with_leadership`, a supervisor that
//! re-campaigns with bounded backoff, fast handover through LISTEN/NOTIFY, batched renewal of many leases, and
//! an in-memory test double behind the same [`Elector`] trait.
//!
//! # Timing
//!
//! A [`HeldLease`] renews every `renew_every` (default ttl/3). It stops trusting itself by its **own monotonic
//! clock** at (send time of the last successful renewal + ttl − `safety_margin`): the database computed the
//! expiry from its clock when it *ran* that renewal, which was later than the send, so the holder gives up
//! before the database can grant a successor — even when the database is unreachable. Transient renewal errors
//! are retried every `retry_every` until that deadline; a definitive loss (another epoch or holder on the row) is
//! reported at once.
//!
//! # Outages
//!
//! Renewals go through a connection of their own, not through the pool (unless the store was built from an
//! application's pool): every retry really tries to connect, so a database back before the local deadline is
//! renewed at the next retry. A pool would hand out its connections only after its own reconnect backoff. A loss
//! at the deadline names the last real error ("connection refused" and the address).
//!
//! # Renewal cost
//!
//! All leases of one [`PgElector`] with the same holder and timing are renewed together by **one** statement
//! per tick (`pgfence.renew_many`), however many there are.
//!
//! # Files
//!
//! Which file of this module owns what: the table of files in docs/architecture.md.

use std::future::Future;
use std::pin::Pin;

use crate::error::Result;
use crate::membership::{MemberSpec, Rebalance};

pub mod assign;
mod backoff;
mod end;
mod group;
mod held;
#[cfg(feature = "testing")]
mod memory;
mod options;
pub(crate) mod pg;
mod run;
mod supervisor;

pub use assign::{assign, shard_of, Assignment};
pub use backoff::Backoff;
pub use end::TenureEnd;
pub use group::{Assigned, MemberState, Membership};
pub use held::{AcquisitionTurn, Health, HeldLease, Wakeups};
#[cfg(feature = "testing")]
pub use memory::MemoryElector;
pub use options::LeaseOptions;
pub use pg::PgElector;
pub use run::{run_with_leadership, Ended, LeaderContext, LeadershipOptions};
pub use supervisor::{
    BoxError, GroupStatus, Readiness, Shard, Spread, Supervisor, SupervisorStatus,
};

/// A boxed, sendable future: what the runtime's object-safe hooks (a held lease's release, a membership's leave,
/// a supervised controller's factory) return.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Something that grants leases: PostgreSQL ([`PgElector`]) or the in-memory double (`MemoryElector`, feature
/// `testing`).
///
/// Controllers are generic over it to run against either.
///
/// **Open for wrapping, closed to new backends — by design.** Code outside pgfence may implement it to *wrap* an
/// elector (instrumentation, fault injection, as the leader tests do to observe every campaign attempt), but not
/// to grant leases of its own: a [`HeldLease`] has no public constructor, because its renewal, loss signal and
/// release are wired into the runtime, and a lease that did not come from the database's compare-and-set would
/// carry no fencing token any guard accepts. So every implementation delegates its acquisitions to
/// [`PgElector`] or `MemoryElector`. No method has a default, so a wrapper forwards every one of them: one that
/// answered `in_doubt` itself would hand its callbacks no effects in doubt.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
///
/// use pgfence::groups::{MemberSpec, Rebalance};
/// use pgfence::leader::{
///     AcquisitionTurn, Assigned, Elector, Health, HeldLease, LeaseOptions, Membership, Wakeups,
/// };
///
/// /// Counts acquisition attempts; everything else is the inner elector's.
/// #[derive(Clone)]
/// struct Counted<E> {
///     inner: E,
///     attempts: Arc<AtomicU64>,
/// }
///
/// impl<E: Elector> Elector for Counted<E> {
///     fn qualify(&self, name: &str) -> String {
///         self.inner.qualify(name)
///     }
///     async fn acquire(&self, name: &str, holder: &str, options: &LeaseOptions) -> pgfence::Result<HeldLease> {
///         self.attempts.fetch_add(1, Ordering::Relaxed);
///         self.inner.acquire(name, holder, options).await
///     }
///     async fn acquisition_turn(&self) -> AcquisitionTurn {
///         self.inner.acquisition_turn().await
///     }
///     fn wakeups(&self) -> Wakeups {
///         self.inner.wakeups()
///     }
///     async fn health(&self) -> Health {
///         self.inner.health().await
///     }
///     async fn join(
///         &self,
///         group: &str,
///         member: &str,
///         spec: &MemberSpec,
///         options: &LeaseOptions,
///     ) -> pgfence::Result<Membership> {
///         self.inner.join(group, member, spec, options).await
///     }
///     async fn assigned(&self, membership: &Membership) -> pgfence::Result<Assigned> {
///         self.inner.assigned(membership).await
///     }
///     async fn rebalance(&self, membership: &Membership) -> pgfence::Result<Rebalance> {
///         self.inner.rebalance(membership).await
///     }
///     async fn in_doubt(&self, name: &str) -> pgfence::Result<Vec<pgfence::effects::InDoubt>> {
///         self.inner.in_doubt(name).await
///     }
///     async fn handover_gap(&self, name: &str, epoch: pgfence::Epoch) -> Option<std::time::Duration> {
///         self.inner.handover_gap(name, epoch).await
///     }
/// }
/// ```
pub trait Elector: Clone + Send + Sync + 'static {
    /// The name leases are stored under (`<cluster>/<name>` or `memory/<name>`).
    fn qualify(&self, name: &str) -> String;

    /// One acquisition attempt: on success the lease is held and renewed in the background until it is lost,
    /// released or dropped.
    ///
    /// # Errors
    ///
    /// [`Error::Held`](crate::Error::Held) when another holder's tenure is live; [`Error::InvalidInput`](crate::Error::InvalidInput)
    /// for invalid `options`, `name` or `holder`; for [`PgElector`], everything
    /// [`Store::acquire`](crate::Store::acquire) returns.
    ///
    /// # Cancel safety
    ///
    /// As [`Store::acquire`](crate::Store::acquire): a dropped attempt may have been granted with nobody holding
    /// it, and a successor then waits up to one ttl.
    fn acquire(
        &self,
        name: &str,
        holder: &str,
        options: &LeaseOptions,
    ) -> impl Future<Output = Result<HeldLease>> + Send;

    /// Waits for a turn to send one acquisition: the leadership runtime takes one before each attempt and holds
    /// it until the attempt answered, so that the names of a replica that campaign at once (a sharded
    /// controller given 100 names) queue here, first come, first served, instead of at the connection pool,
    /// whose checkout timeout would fail the ones at the back of the queue (a [`PgElector`] allows as many
    /// acquisitions in flight as its store's pool has connections; the in-memory elector answers at once,
    /// [`AcquisitionTurn::unbounded`]). A wrapping elector forwards it: a wrapper answering at once would send
    /// the queue back to the pool.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is sent while waiting, and a dropped wait gives up its place. The wait is bounded
    /// by the acquisitions ahead of it, each bounded by the store's checkout timeout and the statement's own
    /// bounded waits.
    fn acquisition_turn(&self) -> impl Future<Output = AcquisitionTurn> + Send;

    /// Subscribes to release announcements. Subscribe *before* an acquisition attempt so a release between
    /// the attempt and the wait is not missed.
    fn wakeups(&self) -> Wakeups;

    /// Health of the backing store. It only reads: dropping the future is safe.
    fn health(&self) -> impl Future<Output = Health> + Send;

    /// Joins replica group `group` as `member` with `spec`; the membership is heartbeated in the background
    /// with `options`' timing (a [`PgElector`] sends the heartbeat in the statement that renews the leases
    /// `member` holds with the same timing) until it is lost, left or dropped.
    ///
    /// # Errors
    ///
    /// As [`Groups::join`](crate::groups::Groups::join); [`Error::InvalidInput`](crate::Error::InvalidInput)
    /// for invalid `options`.
    fn join(
        &self,
        group: &str,
        member: &str,
        spec: &MemberSpec,
        options: &LeaseOptions,
    ) -> impl Future<Output = Result<Membership>> + Send;

    /// The names the stored assignment of `membership`'s group gives its member, and the assignment's
    /// generation. It only reads (O(the member's names)).
    ///
    /// # Errors
    ///
    /// As [`Groups::assigned_names`](crate::groups::Groups::assigned_names).
    fn assigned(&self, membership: &Membership) -> impl Future<Output = Result<Assigned>> + Send;

    /// Computes and stores the next assignment of `membership`'s group when one is due and no other member is
    /// at it: claims it, reads the members that count and the stored assignment, computes
    /// [`assign`](assign::assign) and stores the names that move. Otherwise answers how long to wait. An elector
    /// that assigns by itself (the in-memory one) answers [`Rebalance::NotDue`].
    ///
    /// # Errors
    ///
    /// As [`Groups::claim_rebalance`](crate::groups::Groups::claim_rebalance) and
    /// [`Groups::store_assignment`](crate::groups::Groups::store_assignment).
    fn rebalance(&self, membership: &Membership) -> impl Future<Output = Result<Rebalance>> + Send;

    /// The effects lease `name` has in doubt (see [`Effects::in_doubt`](crate::effects::Effects::in_doubt)):
    /// read by the leadership runtime when a tenure begins, before its callback runs, and handed to it as
    /// [`LeaderContext::in_doubt`]. It only reads. An elector with no effect ledger (the in-memory one) answers
    /// none.
    ///
    /// # Errors
    ///
    /// As [`Effects::in_doubt`](crate::effects::Effects::in_doubt).
    fn in_doubt(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Vec<crate::effects::InDoubt>>> + Send;

    /// How long `name` had no holder before tenure `epoch` began, when the tenure before it was released (a
    /// handover), by the store's clock; `None` otherwise or when unknown. It only reads.
    fn handover_gap(
        &self,
        name: &str,
        epoch: crate::Epoch,
    ) -> impl Future<Output = Option<std::time::Duration>> + Send;
}
