//! One tenure as the runtime holds it: [`HeldLease`], its loss signal (a [`TenureEnd`] once it ends), the release
//! wakeups electors share, and [`Health`].

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::end::TenureEnd;
use super::BoxFuture;
use crate::error::Result;
use crate::fence::Fence;
use crate::history::queue::{BeliefQueue, Report};
use crate::history::BeliefEnd;
use crate::lease::{Lease, Released};
use crate::metrics::{METRIC_LEADER, METRIC_LOSSES, METRIC_TRANSITIONS};
use crate::types::{Epoch, LossReason};

/// What the acquisition itself already read for a new tenure (the PostgreSQL elector's batched acquisition
/// answers both in the statement that began it), so that the runtime does not read it again. `None`: not read.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct FirstReads {
    /// How many effects earlier tenures left in doubt as this one began.
    pub(super) in_doubt: Option<u32>,
    /// The handover gap before this tenure (`Some(None)`: the tenure before was not released, or there is none).
    pub(super) gap: Option<Option<Duration>>,
}

/// State shared by a [`HeldLease`], its renewal group and the elector.
pub(super) struct Shared {
    pub(super) lease: Lease,
    /// What the acquisition read for the tenure's start.
    pub(super) first: FirstReads,
    pub(super) margin: Duration,
    /// Send time of the last successful acquire or renew + ttl, by the monotonic clock.
    pub(super) deadline: Mutex<Instant>,
    /// The error of the last renewal attempt, `None` after a successful one: the detail of a deadline loss.
    pub(super) last_error: Mutex<Option<String>>,
    /// How the tenure ended; `None` while it is held.
    pub(super) ended: watch::Sender<Option<TenureEnd>>,
    pub(super) token: CancellationToken,
    /// Where the end of this process's belief is reported (a `PgElector` with `report_beliefs`); taken when
    /// it is reported, or by `abandon` (a frozen or killed process reports nothing).
    pub(super) reporter: Mutex<Option<BeliefReporter>>,
}

/// Reports a tenure's belief to the store it was acquired from, in the background (batched with the other
/// reports of the elector: [`BeliefQueue`]).
#[derive(Debug, Clone)]
pub(super) struct BeliefReporter {
    pub(super) queue: Arc<BeliefQueue>,
}

impl BeliefReporter {
    /// Reports the start of the belief in `lease` (its acquisition reply's arrival).
    pub(super) fn started(&self, lease: &Lease) {
        self.queue.push(Report {
            lease: lease.clone(),
            event: "start",
            at: lease.believed_from(),
            end: None,
        });
    }

    /// Reports the end of the belief in `lease` at `at` (this process's wall clock).
    fn ended(self, lease: &Lease, at: chrono::DateTime<chrono::Utc>, end: BeliefEnd) {
        self.queue.push(Report {
            lease: lease.clone(),
            event: "end",
            at,
            end: Some(end),
        });
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("lease", &self.lease.qualified_name())
            .field("epoch", &self.lease.epoch())
            .field("ended", &*self.ended.borrow())
            .finish()
    }
}

impl Shared {
    /// A held tenure; `reporter` reports the start of its belief now and its end when it ends.
    pub(super) fn new(
        lease: Lease,
        first: FirstReads,
        margin: Duration,
        deadline: Instant,
        reporter: Option<BeliefReporter>,
    ) -> Arc<Shared> {
        if let Some(reporter) = &reporter {
            reporter.started(&lease);
        }
        let shared = Arc::new(Shared {
            lease,
            first,
            margin,
            deadline: Mutex::new(deadline),
            last_error: Mutex::new(None),
            ended: watch::Sender::new(None),
            token: CancellationToken::new(),
            reporter: Mutex::new(reporter),
        });
        let name = shared.lease.qualified_name().to_owned();
        metrics::gauge!(METRIC_LEADER, "lease" => name.clone()).set(1.0);
        metrics::counter!(METRIC_TRANSITIONS, "lease" => name).increment(1);
        shared
    }

    /// Not ended (lost or released) yet, by the recorded end alone; see [`believed_held`](Self::believed_held) for
    /// the answer that also reads the clock.
    pub(super) fn is_current(&self) -> bool {
        self.ended.borrow().is_none()
    }

    /// How the tenure ended, `None` while it is held — after reading the clock: past the local deadline it is
    /// over even if no timer has said so yet.
    pub(super) fn end_cause(&self) -> Option<TenureEnd> {
        self.believed_held();
        self.ended.borrow().clone()
    }

    /// Whether this process may still believe it holds the tenure: not ended, and before the local deadline by
    /// the monotonic clock. Whoever first sees that deadline passed — the renewal task's timer or a caller asking
    /// here — declares the loss, so the belief ends once, at the deadline, even when a starved runtime runs that
    /// timer late; a renewal that completes afterwards does not revive it (safe: it only ends trust early).
    pub(super) fn believed_held(&self) -> bool {
        if !self.is_current() {
            return false;
        }
        if Instant::now() < self.trust_until() {
            return true;
        }
        let last_error = self
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        self.lose(TenureEnd::DeadlineExceeded { last_error });
        false
    }

    /// The instant after which this process must not trust the lease.
    pub(super) fn trust_until(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) - self.margin
    }

    pub(super) fn renewed(&self, sent: Instant) {
        if self.is_current() {
            *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) = sent + self.lease.ttl();
        }
    }

    /// Records the outcome of the last renewal attempt (`None`: it succeeded).
    pub(super) fn set_last_error(&self, error: Option<String>) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = error;
    }

    /// Held → `to`, once: a tenure ends a single time and is never resumed. On the change the leader gauge drops,
    /// a transition is counted and the token is cancelled.
    pub(super) fn end(&self, to: TenureEnd) -> bool {
        let changed = self.ended.send_if_modified(|s| {
            if s.is_none() {
                *s = Some(to.clone());
                true
            } else {
                false
            }
        });
        if changed {
            // This process stops believing now: its wall clock is the report's.
            let at = chrono::Utc::now();
            let name = self.lease.qualified_name().to_owned();
            metrics::gauge!(METRIC_LEADER, "lease" => name.clone()).set(0.0);
            metrics::counter!(METRIC_TRANSITIONS, "lease" => name).increment(1);
            self.token.cancel();
            let reporter = self
                .reporter
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(reporter) = reporter {
                reporter.ended(&self.lease, at, belief_end(&to));
            }
        }
        changed
    }

    /// Ends the tenure without reporting the end of the belief, as a frozen or killed process would.
    pub(super) fn end_unreported(&self, cause: TenureEnd) {
        self.reporter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        self.lose(cause);
    }

    /// Held → lost (`cause` is one of the losses, [`TenureEnd::is_loss`]); later calls change nothing (a loss is
    /// never undone).
    pub(super) fn lose(&self, cause: TenureEnd) -> bool {
        debug_assert!(cause.is_loss(), "{cause:?}");
        let changed = self.end(cause.clone());
        if let (true, Some(label)) = (changed, cause.loss_label()) {
            let name = self.lease.qualified_name().to_owned();
            tracing::warn!(lease = %name, epoch = %self.lease.epoch(), holder = self.lease.holder(),
                %cause, "leadership lost");
            metrics::counter!(METRIC_LOSSES, "lease" => name, "cause" => label).increment(1);
        }
        changed
    }

    /// Held → Released; returns whether it was held.
    pub(super) fn mark_released(&self) -> bool {
        self.end(TenureEnd::Released)
    }
}

/// What the end of a tenure means for the belief it ends.
fn belief_end(to: &TenureEnd) -> BeliefEnd {
    match to {
        TenureEnd::Released | TenureEnd::Handover => BeliefEnd::Released,
        TenureEnd::Shutdown => BeliefEnd::Shutdown,
        TenureEnd::Lost { reason } => BeliefEnd::Lost(*reason),
        TenureEnd::DeadlineExceeded { .. } => BeliefEnd::Deadline,
        TenureEnd::Injected => BeliefEnd::Lost(LossReason::Superseded),
    }
}

/// How a backend ends a tenure in its store.
pub(super) trait Releaser: Send + Sync + fmt::Debug {
    fn release(&self, lease: Lease) -> BoxFuture<Result<Released>>;
}

/// A lease this process holds, renewed in the background.
///
/// Exposes the fencing token ([`epoch`](Self::epoch), [`fence`](Self::fence)), whether it is still trusted
/// ([`is_held`](Self::is_held)) and a loss signal ([`lost`](Self::lost), [`cancellation_token`](Self::cancellation_token)).
/// Dropping it releases the lease promptly in the background; releasing after a loss never touches a successor's
/// tenure (the database ignores a release of an epoch that is not current).
///
/// What it does not guarantee: that a write already in flight when the loss is declared is refused — the
/// database decides that by epoch, which is why every write presents the fence.
#[derive(Debug)]
pub struct HeldLease {
    pub(super) shared: Arc<Shared>,
    pub(super) releaser: Arc<dyn Releaser>,
    pub(super) runtime: tokio::runtime::Handle,
    pub(super) done: bool,
}

impl HeldLease {
    pub(super) fn new(shared: Arc<Shared>, releaser: Arc<dyn Releaser>) -> HeldLease {
        HeldLease {
            shared,
            releaser,
            runtime: tokio::runtime::Handle::current(),
            done: false,
        }
    }

    /// The lease name without cluster.
    pub fn name(&self) -> &str {
        self.shared.lease.name()
    }

    /// The cluster-qualified name.
    pub fn qualified_name(&self) -> &str {
        self.shared.lease.qualified_name()
    }

    /// The fencing token of this tenure.
    pub fn epoch(&self) -> Epoch {
        self.shared.lease.epoch()
    }

    /// The fence every guarded write of this tenure presents.
    pub fn fence(&self) -> Fence {
        self.shared.lease.fence()
    }

    /// True until the lease is lost or released, and never at or past [`trust_until`](Self::trust_until).
    ///
    /// The clock is read here too: a starved runtime may run the renewal task's deadline timer late, but the
    /// answer is never "held" past the local deadline. The first call that sees the deadline passed declares the
    /// loss ([`TenureEnd::DeadlineExceeded`]) for everyone, so once this returns `false` it stays `false` and
    /// [`end_cause`](Self::end_cause) says why.
    pub fn is_held(&self) -> bool {
        self.shared.believed_held()
    }

    /// How the tenure ended — a loss ([`TenureEnd::Lost`], [`DeadlineExceeded`](TenureEnd::DeadlineExceeded),
    /// [`Injected`](TenureEnd::Injected)) or [`TenureEnd::Released`] — or `None` while it is held. Reads the clock
    /// as [`is_held`](Self::is_held) does: never `None` at or past [`trust_until`](Self::trust_until). What to do
    /// about it is [`TenureEnd::next`].
    pub fn end_cause(&self) -> Option<TenureEnd> {
        self.shared.end_cause()
    }

    /// Completes when the lease is no longer held, with how it ended (as [`end_cause`](Self::end_cause) then
    /// says). It only waits: dropping the future is safe.
    pub fn lost(&self) -> impl Future<Output = TenureEnd> + Send + 'static {
        let mut rx = self.shared.ended.subscribe();
        async move {
            match rx.wait_for(Option::is_some).await {
                Ok(end) => end.clone().unwrap_or(TenureEnd::Released),
                // The tenure's state is gone, and with it the tenure: its lease was dropped (released).
                Err(_) => TenureEnd::Released,
            }
        }
    }

    /// A token cancelled when the lease is lost or released: hand it to the work that must stop then.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.shared.token.clone()
    }

    /// By the monotonic clock, the instant until which this process trusts the lease (send time of the last
    /// successful renewal + ttl − `safety_margin`).
    pub fn trust_until(&self) -> Instant {
        self.shared.trust_until()
    }

    /// Releases now and waits for the database. After a loss this is a no-op.
    ///
    /// # Errors
    ///
    /// What [`Store::release`](crate::Store::release) returns (the elector retries a transient failure once):
    /// the tenure is released locally either way, and one the database did not end expires after its ttl.
    ///
    /// # Cancel safety
    ///
    /// The lease is released locally at once (its token cancelled, [`is_held`](Self::is_held) false); a dropped
    /// future may or may not have ended the tenure in the database, which otherwise expires after its ttl. See
    /// [cancel safety](crate#cancel-safety).
    pub async fn release(mut self) -> Result<Released> {
        self.done = true;
        if !self.shared.mark_released() {
            return Ok(Released::NotHeld(LossReason::Released));
        }
        let result = self.releaser.release(self.shared.lease.clone()).await;
        if let Ok(Released::Released) = result {
            tracing::info!(lease = %self.qualified_name(), epoch = %self.epoch(), "leadership released");
        }
        result
    }

    /// Stops renewing without releasing, as if the process had died or frozen: the lease stays held in the
    /// database until its ttl runs out. For demos and failure tests.
    #[doc(hidden)]
    pub fn abandon(mut self) {
        self.done = true;
        self.shared.end_unreported(TenureEnd::DeadlineExceeded {
            last_error: Some("abandoned".into()),
        });
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Released locally at once (the gauge drops, the token is cancelled); the database learns it in the
        // background. A lease lost by the local deadline may still be current in the database: release it too,
        // so a successor need not wait for the ttl. A definitively lost one needs nothing.
        let needs_release = matches!(
            &*self.shared.ended.borrow(),
            None | Some(TenureEnd::DeadlineExceeded { .. })
        );
        self.shared.mark_released();
        if needs_release {
            let (releaser, lease) = (self.releaser.clone(), self.shared.lease.clone());
            self.runtime.spawn(async move {
                if let Err(e) = releaser.release(lease.clone()).await {
                    tracing::warn!(lease = %lease.qualified_name(), error = %e,
                        "background release failed; the lease expires after its ttl");
                }
            });
        }
    }
}

/// What the release channel of an elector carries.
#[derive(Debug, Clone)]
pub(super) enum Wake {
    /// The lease with this qualified name was released.
    Free(String),
    /// The release listener LISTENs again after it lost its connection: releases in between were not heard,
    /// so every waiter should look again.
    Resumed,
    /// A member of some replica group of the in-memory elector joined, left or expired: its members read
    /// their names again.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    Members,
    /// A replica group's channel said something: a new assignment is due, or was stored.
    Group { channel: String, news: GroupWake },
}

/// What a replica group's channel said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupWake {
    /// `changed <ms>`: a new assignment is due, and may be claimed after this long (the quiet time, or another
    /// member's claim; zero: now): claim it then.
    Changed(Duration),
    /// `assigned <generation>`: a new assignment is stored.
    Assigned(i64),
}

/// What a spreading member's balancer hears ([`Wakeups::group_event`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupEvent {
    /// Its group's channel spoke.
    Group(GroupWake),
    /// The in-memory elector's groups changed, the listener reconnected, or this receiver lagged: something may
    /// have been missed; read again.
    Missed,
}

/// A turn to send one acquisition, from [`Elector::acquisition_turn`](super::Elector::acquisition_turn): held
/// until the acquisition answered, then dropped (which gives the turn to the next waiter).
#[derive(Debug)]
#[must_use = "the turn ends when it is dropped"]
pub struct AcquisitionTurn {
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl AcquisitionTurn {
    /// A turn that bounds nothing (an elector without a limit on its acquisitions in flight).
    pub fn unbounded() -> AcquisitionTurn {
        AcquisitionTurn { _permit: None }
    }

    /// A turn held as `permit` (of the elector's semaphore of turns).
    pub(super) fn of(permit: tokio::sync::OwnedSemaphorePermit) -> AcquisitionTurn {
        AcquisitionTurn {
            _permit: Some(permit),
        }
    }
}

/// Resolves when a lease may have become free (a release notification) — a hint, never a guarantee.
#[derive(Debug)]
pub struct Wakeups {
    pub(super) rx: Option<broadcast::Receiver<Wake>>,
}

impl Wakeups {
    /// Waits until `qualified` is announced free or `max_wait` passes, whichever is first. Also returns early
    /// when the elector's release listener reconnected (a release may have gone unheard while it was away).
    ///
    /// Cancel safe: dropping the future loses no announcement a later `wait` on the same `Wakeups` could see.
    pub async fn wait(&mut self, qualified: &str, max_wait: Duration) {
        let deadline = tokio::time::Instant::now() + max_wait;
        let Some(rx) = self.rx.as_mut() else {
            tokio::time::sleep_until(deadline).await;
            return;
        };
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Err(_) => return,
                Ok(Ok(Wake::Free(name))) if name == qualified => return,
                Ok(Ok(Wake::Resumed)) => return,
                Ok(Ok(Wake::Free(_) | Wake::Members | Wake::Group { .. })) => continue,
                // Missed messages: one of them may have been ours.
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => return,
                Ok(Err(broadcast::error::RecvError::Closed)) => {
                    tokio::time::sleep_until(deadline).await;
                    return;
                }
            }
        }
    }
}

impl Wakeups {
    /// Waits until the replica group of `channel` says something, something may have been missed (the
    /// listener reconnected, this receiver lagged, the in-memory elector's groups changed), or `deadline`
    /// passes (`None`). Releases and other groups' news are skipped. Cancel safe, as [`wait`](Self::wait).
    pub(crate) async fn group_event(
        &mut self,
        channel: &str,
        deadline: tokio::time::Instant,
    ) -> Option<GroupEvent> {
        let Some(rx) = self.rx.as_mut() else {
            tokio::time::sleep_until(deadline).await;
            return None;
        };
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Err(_) => return None,
                Ok(Ok(Wake::Group { channel: c, news })) if c == channel => {
                    return Some(GroupEvent::Group(news))
                }
                Ok(Ok(Wake::Free(_) | Wake::Group { .. })) => continue,
                Ok(Ok(Wake::Resumed | Wake::Members))
                | Ok(Err(broadcast::error::RecvError::Lagged(_))) => {
                    return Some(GroupEvent::Missed)
                }
                Ok(Err(broadcast::error::RecvError::Closed)) => {
                    tokio::time::sleep_until(deadline).await;
                    return None;
                }
            }
        }
    }
}

/// Health of an elector's backing store, in separate dimensions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Health {
    /// A query reached the database.
    pub database_reachable: bool,
    /// The server is a primary (`None` when unreachable).
    pub primary: Option<bool>,
    /// The identity matched the configured expectation (`None` when unreachable or not checked).
    pub identity_as_expected: Option<bool>,
    /// The error behind a `false`, if any.
    pub error: Option<String>,
}
