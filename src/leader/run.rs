//! [`run_with_leadership`]: one controller callback per tenure, cancelled when the tenure ends.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::end::TenureEnd;
use super::held::Shared;
use super::options::LeaseOptions;
use super::Elector;
use crate::effects::InDoubt;
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::metrics::{METRIC_ACQUISITION_TURN_WAIT, METRIC_CALLBACKS_NOT_STOPPED};
use crate::types::{Epoch, LossReason};

/// What the callback of [`run_with_leadership`] gets for one tenure: the fence to present on every write,
/// whether the tenure is still believed held ([`is_held`](Self::is_held)), a token cancelled when leadership
/// ends, and why it ended ([`end_cause`](Self::end_cause)).
///
/// Clones share one tenure: work the callback hands a clone to sees the same answers.
///
/// What it does not guarantee: that a write already in flight when the tenure ends is refused — the database
/// decides that by epoch, which is why every write presents [`fence`](Self::fence).
#[derive(Debug, Clone)]
pub struct LeaderContext {
    fence: Fence,
    token: CancellationToken,
    /// The tenure's state, shared with its [`HeldLease`] and renewal task.
    tenure: Arc<Shared>,
    /// Set by [`run_with_leadership`] before it cancels the token because its parent was cancelled.
    shutdown: Arc<AtomicBool>,
    /// Set by a spreading [`Supervisor`](super::Supervisor) before it cancels the parent to hand the name over.
    handover: Option<Arc<AtomicBool>>,
    /// What earlier tenures left in doubt when this one began.
    in_doubt: Arc<[InDoubt]>,
}

impl LeaderContext {
    /// The fence every guarded write of this tenure presents (it carries the tenure's secret): an owned copy, as
    /// [`Lease::fence`](crate::Lease::fence) and [`HeldLease::fence`](super::HeldLease::fence) return.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// The epoch of this tenure.
    pub fn epoch(&self) -> Epoch {
        self.fence.epoch()
    }

    /// The effects earlier tenures of this lease left in doubt, as they stood when this tenure began (read before
    /// the callback started; see [`Effects::in_doubt`](crate::effects::Effects::in_doubt)): intents whose tenure
    /// ended without an outcome, and unknown outcomes. Settle each — after asking the external system by its
    /// effect key — before repeating its work: a task with an effect in doubt refuses to move on
    /// ([`Error::InDoubt`](crate::Error::InDoubt)). Empty for an elector without an effect ledger.
    pub fn in_doubt(&self) -> &[InDoubt] {
        &self.in_doubt
    }

    /// Whether this process still believes it holds the tenure — the same answer as [`HeldLease::is_held`](super::HeldLease::is_held) for
    /// the lease behind this context: false once the lease is lost or released, and never true at or past
    /// [`trust_until`](Self::trust_until), even when a starved runtime has not yet run the timer that would
    /// declare the loss (the first caller to see the deadline passed declares it). Once false it stays false, and
    /// [`end_cause`](Self::end_cause) says why.
    ///
    /// Check it before each write: the token tells a waiting callback promptly, this tells a busy one truthfully.
    /// It stays true during an orderly [`Shutdown`](TenureEnd::Shutdown) until the tenure is released.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> pgfence::Result<()> {
    /// use std::time::Duration;
    /// use pgfence::leader::{run_with_leadership, LeadershipOptions, MemoryElector, TenureEnd};
    /// use tokio_util::sync::CancellationToken;
    ///
    /// let elector = MemoryElector::new();
    /// let (ctx_tx, ctx_rx) = tokio::sync::oneshot::channel();
    /// let run = tokio::spawn({
    ///     let elector = elector.clone();
    ///     async move {
    ///         let options = LeadershipOptions::new(Duration::from_secs(15));
    ///         run_with_leadership(&elector, "scheduler", "pod-a", &options, &CancellationToken::new(),
    ///             move |ctx| async move {
    ///                 ctx_tx.send(ctx.clone()).unwrap();
    ///                 ctx.cancelled().await;
    ///                 Ok::<_, pgfence::Error>(())
    ///             }).await
    ///     }
    /// });
    /// let ctx = ctx_rx.await.unwrap();
    /// assert!(ctx.is_held());
    /// elector.lose("scheduler"); // as if the database had granted the lease to someone else
    /// assert!(!ctx.is_held());
    /// assert_eq!(ctx.end_cause(), Some(TenureEnd::Injected));
    /// run.await.unwrap()?;
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        self.tenure.believed_held()
    }

    /// What the acquisition read for this tenure's start.
    pub(super) fn first_reads(&self) -> super::held::FirstReads {
        self.tenure.first
    }

    /// By the monotonic clock, the instant until which this process trusts the tenure (send time of the last
    /// successful renewal + ttl − `safety_margin`); see [`HeldLease::trust_until`](super::HeldLease::trust_until). Useful to bound a write's
    /// timeout.
    pub fn trust_until(&self) -> Instant {
        self.tenure.trust_until()
    }

    /// Why leadership ended, or `None` while it goes on. `Some` from the moment the
    /// [`cancellation token`](Self::cancellation_token) is cancelled, and whenever [`is_held`](Self::is_held) is
    /// false. A loss ([`TenureEnd::Lost`], [`DeadlineExceeded`](TenureEnd::DeadlineExceeded),
    /// [`Injected`](TenureEnd::Injected)) is reported as such even when it happens during an orderly shutdown (the
    /// tenure was then not released in order); otherwise an orderly stop is [`TenureEnd::Shutdown`] (or
    /// [`Handover`](TenureEnd::Handover)). What to do about it is [`TenureEnd::next`].
    ///
    /// ```
    /// use pgfence::leader::{LeaderContext, TenureEnd};
    /// use pgfence::{LossReason, Next};
    ///
    /// fn report(ctx: &LeaderContext) {
    ///     let Some(end) = ctx.end_cause() else {
    ///         return println!("still leading at epoch {}", ctx.epoch());
    ///     };
    ///     match &end {
    ///         TenureEnd::Lost { reason: LossReason::Failover } => {
    ///             println!("the database failed over; campaigning again")
    ///         }
    ///         _ if end.next() == Next::Recampaign => {
    ///             println!("lost epoch {}: {end}; campaigning again", ctx.epoch())
    ///         }
    ///         _ => println!("stopped: {end}"),
    ///     }
    /// }
    /// ```
    pub fn end_cause(&self) -> Option<TenureEnd> {
        // Read the clock first: past the local deadline the tenure is over even if no timer has said so yet.
        match self.tenure.end_cause() {
            Some(end) if end.is_loss() => Some(end),
            _ if self.shutdown.load(Ordering::SeqCst) => Some(
                if self
                    .handover
                    .as_ref()
                    .is_some_and(|h| h.load(Ordering::SeqCst))
                {
                    TenureEnd::Handover
                } else {
                    TenureEnd::Shutdown
                },
            ),
            end => end,
        }
    }

    /// Cancelled when leadership ends (loss or shutdown): stop working then. [`end_cause`](Self::end_cause)
    /// says why.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Completes when leadership ends (loss or shutdown); [`end_cause`](Self::end_cause) is `Some` from then on.
    /// It only waits: dropping the future is safe.
    pub async fn cancelled(&self) {
        self.token.cancelled().await
    }
}

/// Timing of a leadership run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeadershipOptions {
    /// The lease timing.
    pub lease: LeaseOptions,
    /// How long to wait for the callback to return after cancelling it (default 5 s).
    pub grace: Duration,
    /// Longest wait between acquisition attempts while another holder leads (default ttl / 2); a release
    /// notification wakes the candidate earlier.
    pub poll_every: Duration,
}

impl LeadershipOptions {
    /// Options with `ttl` and defaults for the rest.
    pub fn new(ttl: Duration) -> LeadershipOptions {
        LeadershipOptions {
            lease: LeaseOptions::new(ttl),
            grace: Duration::from_secs(5),
            poll_every: ttl / 2,
        }
    }
}

/// Why a [`run_with_leadership`] ended.
#[derive(Debug)]
#[non_exhaustive]
pub enum Ended<E> {
    /// The callback returned `Ok`; the lease was released.
    Returned,
    /// The callback returned an error; the lease was released.
    Failed(E),
    /// The callback panicked; the lease was released.
    Panicked(String),
    /// The lease was lost; the callback was cancelled.
    Lost {
        /// How: always a loss ([`TenureEnd::is_loss`]) — [`TenureEnd::Lost`] with the database's reason,
        /// [`TenureEnd::DeadlineExceeded`] or [`TenureEnd::Injected`]. What to do next is [`TenureEnd::next`].
        end: TenureEnd,
        /// Whether the callback returned within the grace period (if not, it was aborted at its next await and
        /// reported through tracing and the `pgfence_callbacks_not_stopped_total` metric).
        callback_stopped: bool,
    },
    /// The parent token was cancelled (before or during leadership); the lease, if held, was released.
    Cancelled {
        /// Whether the callback returned within the grace period (`true` when it never started).
        callback_stopped: bool,
    },
}

fn jittered(base: Duration) -> Duration {
    // Up to 10 % jitter so that candidates woken together do not stampede.
    base + base.mul_f64(fastrand::f64() * 0.1)
}

/// Campaigns for `name` until acquired (or `parent` is cancelled), then runs `callback` with a
/// [`LeaderContext`]. When the lease is lost or `parent` is cancelled, the context's token is cancelled and the
/// callback gets `options.grace` to return; one that does not is aborted at its next await point and reported
/// (an error event and the `pgfence_callbacks_not_stopped_total` metric) — never silently left running.
///
/// While another holder leads, the candidate waits for the database-computed remaining time (at most
/// `poll_every`) or a release notification, whichever comes first. Transient acquisition errors are retried
/// every `poll_every`.
///
/// # Errors
///
/// - [`Error::InvalidInput`] when `poll_every` or `grace` is zero, or the lease options, `name` or `holder` are
///   invalid.
/// - A definitive acquisition error ([`Error::Denied`], [`Error::SchemaMissing`], [`Error::NotPrimary`],
///   [`Error::WrongDatabase`], [`Error::Tls`], …; see [`Elector::acquire`]): the campaign stops.
/// - The error of the release after the callback returned or the parent was cancelled.
///
/// The callback's own error is not one of them: it ends the run with `Ok(`[`Ended::Failed`]`)`.
///
/// # Cancel safety
///
/// Dropped while campaigning, as [`Store::acquire`](crate::Store::acquire): an attempt in flight may have been
/// granted with nobody holding it (a successor waits up to one ttl). Dropped while leading: the lease is
/// released in the background, which cancels the context's token, and the callback's task is aborted at its
/// next await point. See [cancel safety](crate#cancel-safety).
///
/// ```no_run
/// # async fn example(store: pgfence::Store) -> pgfence::Result<()> {
/// use std::time::Duration;
/// use pgfence::leader::{run_with_leadership, LeadershipOptions, PgElector, TenureEnd};
/// use tokio_util::sync::CancellationToken;
///
/// let elector = PgElector::new(store.clone());
/// let shutdown = CancellationToken::new();
/// let ended = run_with_leadership(&elector, "scheduler", "pod-a", &LeadershipOptions::new(Duration::from_secs(15)),
///     &shutdown, move |ctx| async move {
///         // `is_held` reads the monotonic clock: false at the local deadline even if the loss signal is late.
///         while ctx.is_held() && !ctx.cancellation_token().is_cancelled() {
///             store.tasks().create(&ctx.fence(), "tick", &serde_json::json!({})).await?;
///             tokio::select! {
///                 _ = ctx.cancelled() => {}
///                 _ = tokio::time::sleep(Duration::from_secs(1)) => {}
///             }
///         }
///         match ctx.end_cause() {
///             Some(end) if end.is_loss() => eprintln!("lost epoch {}: {end}", ctx.epoch()),
///             other => eprintln!("stopped leading: {other:?}"),
///         }
///         Ok::<_, pgfence::Error>(())
///     }).await?;
/// println!("{ended:?}");
/// # Ok(()) }
/// ```
pub async fn run_with_leadership<E, F, Fut, Err>(
    elector: &E,
    name: &str,
    holder: &str,
    options: &LeadershipOptions,
    parent: &CancellationToken,
    callback: F,
) -> Result<Ended<Err>>
where
    E: Elector,
    F: FnOnce(LeaderContext) -> Fut,
    Fut: Future<Output = std::result::Result<(), Err>> + Send + 'static,
    Err: Send + 'static,
{
    run_leadership(elector, name, holder, options, parent, None, callback).await
}

/// [`run_with_leadership`], with the flag a spreading supervisor sets before it cancels `parent` to hand the
/// name over (the callback then sees [`TenureEnd::Handover`]).
#[tracing::instrument(name = "run_with_leadership", level = "info", skip_all, fields(lease = %elector.qualify(name), holder = holder, epoch))]
pub(super) async fn run_leadership<E, F, Fut, Err>(
    elector: &E,
    name: &str,
    holder: &str,
    options: &LeadershipOptions,
    parent: &CancellationToken,
    handover: Option<Arc<AtomicBool>>,
    callback: F,
) -> Result<Ended<Err>>
where
    E: Elector,
    F: FnOnce(LeaderContext) -> Fut,
    Fut: Future<Output = std::result::Result<(), Err>> + Send + 'static,
    Err: Send + 'static,
{
    if options.poll_every.is_zero() || options.grace.is_zero() {
        return Err(Error::invalid(
            "leadership options",
            "poll_every and grace must be positive",
        ));
    }
    let qualified = elector.qualify(name);
    let mut attempt = 0u64;
    let lease = loop {
        attempt += 1;
        // Queued for a turn (cancel safe) rather than at the pool, whose checkout timeout would fail the
        // names at the back of a replica's queue.
        let queued = Instant::now();
        let turn = tokio::select! {
            _ = parent.cancelled() => return Ok(Ended::Cancelled { callback_stopped: true }),
            turn = elector.acquisition_turn() => turn,
        };
        metrics::histogram!(METRIC_ACQUISITION_TURN_WAIT).record(queued.elapsed().as_secs_f64());
        let mut wakeups = elector.wakeups();
        let acquired = elector
            .acquire(name, holder, &options.lease)
            .instrument(tracing::debug_span!("campaign", attempt))
            .await;
        drop(turn);
        let wait = match acquired {
            Ok(lease) => break lease,
            Err(Error::Held { expires_in, .. }) => expires_in.min(options.poll_every),
            Err(e) if e.is_transient() => {
                tracing::warn!(lease = %qualified, error = %e, "acquisition failed; retrying");
                options.poll_every
            }
            Err(e) => return Err(e),
        };
        tokio::select! {
            _ = parent.cancelled() => return Ok(Ended::Cancelled { callback_stopped: true }),
            _ = wakeups.wait(&qualified, jittered(wait)) => {}
        }
    };
    tracing::Span::current().record("epoch", lease.epoch().get());
    tracing::info!(lease = %qualified, epoch = %lease.epoch(), holder, "leading");

    // What the tenures before this one left in doubt, read before the callback runs, so that a controller
    // settles it before its first write instead of remembering to look. A transient failure is retried while
    // the tenure lasts; any other ends the run with the error (the tenure released).
    // (Not read again when the acquisition answered it: none in doubt.)
    let in_doubt = loop {
        if lease.shared.first.in_doubt == Some(0) {
            break Vec::new();
        }
        match elector.in_doubt(name).await {
            Ok(list) => break list,
            Err(e) if e.is_transient() => {
                tracing::warn!(lease = %qualified, error = %e, "listing the effects in doubt failed; retrying");
                tokio::select! {
                    end = lease.lost() => return Ok(Ended::Lost {
                        end: as_loss(end),
                        callback_stopped: true,
                    }),
                    _ = parent.cancelled() => {
                        lease.release().await?;
                        return Ok(Ended::Cancelled { callback_stopped: true });
                    }
                    _ = tokio::time::sleep(jittered(options.poll_every)) => {}
                }
            }
            Err(e) => {
                if let Err(release) = lease.release().await {
                    tracing::warn!(lease = %qualified, error = %release, "releasing after a failed listing failed");
                }
                return Err(e);
            }
        }
    };
    if !in_doubt.is_empty() {
        tracing::info!(lease = %qualified, epoch = %lease.epoch(), count = in_doubt.len(),
            "effects in doubt left by earlier tenures");
    }

    let token = lease.cancellation_token().child_token();
    let shutdown = Arc::new(AtomicBool::new(false));
    let context = LeaderContext {
        fence: lease.fence(),
        token: token.clone(),
        tenure: lease.shared.clone(),
        shutdown: shutdown.clone(),
        handover,
        in_doubt: in_doubt.into(),
    };
    // The callback's events carry the tenure: its task runs in a span of its own, a child of this one.
    let mut task = tokio::spawn(callback(context).instrument(tracing::info_span!("leader")));
    // A run dropped midway (a `select!`, an aborted task) stops its callback too: never left running unseen.
    // (Dropped before `lease`, whose drop then releases the tenure and cancels the context's token.)
    let _abort_on_drop = AbortOnDrop(task.abort_handle());
    let lost = lease.lost();
    tokio::pin!(lost);

    enum Stop {
        Lost(TenureEnd),
        Cancelled,
    }
    let stop = tokio::select! {
        // Biased: a callback that returns *because* it saw the loss or the shutdown must be reported as such,
        // and by then the loss (or the parent's cancellation) is already observable.
        biased;
        end = &mut lost => Stop::Lost(as_loss(end)),
        _ = parent.cancelled() => Stop::Cancelled,
        joined = &mut task => {
            // Re-check: the callback may have returned on the loss signal between the polls above.
            let ended = lease.shared.ended.borrow().clone();
            if let Some(end) = ended.filter(TenureEnd::is_loss) {
                return Ok(Ended::Lost { end, callback_stopped: true });
            }
            if parent.is_cancelled() {
                // Seen by work the callback left running with a clone of the context.
                shutdown.store(true, Ordering::SeqCst);
            }
            let ended = match joined {
                Ok(Ok(())) if parent.is_cancelled() => Ended::Cancelled { callback_stopped: true },
                Ok(Ok(())) => Ended::Returned,
                Ok(Err(e)) => Ended::Failed(e),
                Err(join) => Ended::Panicked(panic_message(join)),
            };
            lease.release().await?;
            return Ok(ended);
        }
    };
    if let Stop::Cancelled = stop {
        // Before the token: a callback woken by it must find the cause already set.
        shutdown.store(true, Ordering::SeqCst);
    }
    token.cancel();
    let callback_stopped = match tokio::time::timeout(options.grace, &mut task).await {
        Ok(_) => true,
        Err(_) => {
            tracing::error!(lease = %qualified, grace = ?options.grace,
                "leader callback did not stop within the grace period after cancellation; aborting it");
            metrics::counter!(METRIC_CALLBACKS_NOT_STOPPED, "lease" => qualified.clone())
                .increment(1);
            task.abort();
            false
        }
    };
    match stop {
        Stop::Lost(end) => {
            drop(lease); // releases in the background if the database may still think we hold it
            Ok(Ended::Lost {
                end,
                callback_stopped,
            })
        }
        Stop::Cancelled => {
            lease.release().await?;
            Ok(Ended::Cancelled { callback_stopped })
        }
    }
}

/// The end of a tenure that ended while the run waited on it, as a loss: the run releases its tenures itself, so
/// an end it did not make is read as the database's (`released`).
fn as_loss(end: TenureEnd) -> TenureEnd {
    if end.is_loss() {
        end
    } else {
        TenureEnd::Lost {
            reason: LossReason::Released,
        }
    }
}

/// Aborts the callback's task when dropped. Every return of [`run_with_leadership`] has the task finished
/// already, so this matters only when its future is dropped midway.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn panic_message(join: tokio::task::JoinError) -> String {
    match join.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".to_owned()),
        Err(e) => e.to_string(),
    }
}
