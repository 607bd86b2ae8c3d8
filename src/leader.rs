//! The leadership runtime: self-renewing leases with a loss signal, `run_with_leadership`, a supervisor that
//! re-campaigns with bounded backoff, fast handover through LISTEN/NOTIFY, batched renewal of many leases, and
//! an in-memory test double behind the same [`Elector`] trait.
//!
//! # Timing
//!
//! A [`HeldLease`] renews every `renew_every` (default ttl/3). It stops trusting itself by its **own monotonic
//! clock** at (send time of the last successful renewal + ttl − safety margin): the database computed the
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

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use diesel_async::AsyncPgConnection;
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::fence::{Fence, TenureSecret};
use crate::lease::{Epoch, Lease, LossReason, Released};
use crate::store::{Checked, Store, TARGET};

/// Gauge, 1 while this process leads the lease (label `lease`), else 0.
pub const METRIC_LEADER: &str = "pgfence_leader";
/// Counter of leadership gains and losses of this process (label `lease`).
pub const METRIC_TRANSITIONS: &str = "pgfence_leader_transitions_total";
/// Counter of losses by cause (labels `lease`, `cause`).
pub const METRIC_LOSSES: &str = "pgfence_lease_losses_total";
/// Histogram of renewal round-trip seconds (one observation per renewal statement, however many leases).
pub const METRIC_RENEW_SECONDS: &str = "pgfence_renew_seconds";
/// Counter of callbacks that did not return within the grace period after cancellation (label `lease`).
pub const METRIC_CALLBACKS_NOT_STOPPED: &str = "pgfence_callbacks_not_stopped_total";

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// How a held lease is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseOptions {
    /// Lease duration granted by each acquisition and renewal (database clock).
    pub ttl: Duration,
    /// Renewal period; default ttl/3.
    pub renew_every: Option<Duration>,
    /// How long before (send time of the last good renewal + ttl) the holder declares itself lost; covers
    /// clock-rate drift and scheduling delay. Default max(ttl/10, 50 ms).
    pub safety_margin: Option<Duration>,
    /// Delay between retries after a transient renewal error; default ttl/10.
    pub retry_every: Option<Duration>,
}

impl LeaseOptions {
    /// Options with `ttl` and the default renewal timing.
    pub fn new(ttl: Duration) -> LeaseOptions {
        LeaseOptions {
            ttl,
            renew_every: None,
            safety_margin: None,
            retry_every: None,
        }
    }

    /// The renewal period in effect.
    pub fn renew_period(&self) -> Duration {
        self.renew_every.unwrap_or(self.ttl / 3)
    }

    /// The safety margin in effect.
    pub fn margin(&self) -> Duration {
        self.safety_margin
            .unwrap_or_else(|| (self.ttl / 10).max(Duration::from_millis(50)))
    }

    /// The retry delay in effect.
    pub fn retry_period(&self) -> Duration {
        self.retry_every
            .unwrap_or(self.ttl / 10)
            .max(Duration::from_millis(10))
    }

    /// Checks that a renewal can happen before the holder's deadline.
    pub fn validate(&self) -> Result<()> {
        if self.ttl < crate::lease::MIN_TTL || self.ttl > crate::lease::MAX_TTL {
            return Err(Error::invalid(
                "ttl",
                format!(
                    "must be between {:?} and {:?}",
                    crate::lease::MIN_TTL,
                    crate::lease::MAX_TTL
                ),
            ));
        }
        if self.margin() >= self.ttl {
            return Err(Error::invalid(
                "safety margin",
                "must be shorter than the ttl",
            ));
        }
        if self.renew_period().is_zero() || self.renew_period() >= self.ttl - self.margin() {
            return Err(Error::invalid(
                "renew interval",
                format!(
                    "must be positive and shorter than ttl - safety margin ({:?})",
                    self.ttl - self.margin()
                ),
            ));
        }
        Ok(())
    }
}

/// Why a held lease stopped being held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "cause")]
pub enum LossCause {
    /// The database says the tenure is over (superseded, expired, released by an operator, …).
    Definitive {
        /// Why, as the database reported it.
        reason: LossReason,
    },
    /// No renewal succeeded before the local deadline (send time of the last good renewal + ttl − margin).
    DeadlineExceeded {
        /// The last renewal error, if one was seen (connection refused, timeout, …).
        last_error: Option<String>,
    },
    /// Injected through [`MemoryElector::lose`].
    Injected,
}

impl LossCause {
    fn label(&self) -> &'static str {
        match self {
            LossCause::Definitive { .. } => "definitive",
            LossCause::DeadlineExceeded { .. } => "deadline",
            LossCause::Injected => "injected",
        }
    }
}

impl fmt::Display for LossCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossCause::Definitive { reason } => write!(f, "{reason}"),
            LossCause::DeadlineExceeded {
                last_error: Some(e),
            } => {
                write!(f, "no renewal before the local deadline (last error: {e})")
            }
            LossCause::DeadlineExceeded { last_error: None } => {
                f.write_str("no renewal before the local deadline")
            }
            LossCause::Injected => f.write_str("loss injected"),
        }
    }
}

/// Where a held lease stands, as seen by this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// Held: writes with its fence are expected to be accepted.
    Held,
    /// Lost: stop writing; the cause says why.
    Lost(LossCause),
    /// Released by this process.
    Released,
}

/// State shared by a [`HeldLease`], its renewal group and the elector.
struct Shared {
    lease: Lease,
    margin: Duration,
    /// Send time of the last successful acquire or renew + ttl, by the monotonic clock.
    deadline: Mutex<Instant>,
    /// The error of the last renewal attempt, `None` after a successful one: the detail of a deadline loss.
    last_error: Mutex<Option<String>>,
    standing: watch::Sender<Standing>,
    token: CancellationToken,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("lease", &self.lease.qualified_name())
            .field("epoch", &self.lease.epoch())
            .field("standing", &*self.standing.borrow())
            .finish()
    }
}

impl Shared {
    fn new(lease: Lease, margin: Duration, deadline: Instant) -> Arc<Shared> {
        let shared = Arc::new(Shared {
            lease,
            margin,
            deadline: Mutex::new(deadline),
            last_error: Mutex::new(None),
            standing: watch::Sender::new(Standing::Held),
            token: CancellationToken::new(),
        });
        let name = shared.lease.qualified_name().to_owned();
        metrics::gauge!(METRIC_LEADER, "lease" => name.clone()).set(1.0);
        metrics::counter!(METRIC_TRANSITIONS, "lease" => name).increment(1);
        shared
    }

    /// Not ended (lost or released) yet, by the standing alone; see [`believed_held`](Self::believed_held) for the
    /// answer that also reads the clock.
    fn is_current(&self) -> bool {
        matches!(*self.standing.borrow(), Standing::Held)
    }

    /// Whether this process may still believe it holds the tenure: not ended, and before the local deadline by
    /// the monotonic clock. Whoever first sees that deadline passed — the renewal task's timer or a caller asking
    /// here — declares the loss, so the belief ends once, at the deadline, even when a starved runtime runs that
    /// timer late; a renewal that completes afterwards does not revive it (safe: it only ends trust early).
    fn believed_held(&self) -> bool {
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
        self.lose(LossCause::DeadlineExceeded { last_error });
        false
    }

    /// The instant after which this process must not trust the lease.
    fn trust_until(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) - self.margin
    }

    fn renewed(&self, sent: Instant) {
        if self.is_current() {
            *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) = sent + self.lease.ttl();
        }
    }

    /// Records the outcome of the last renewal attempt (`None`: it succeeded).
    fn set_last_error(&self, error: Option<String>) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = error;
    }

    /// Held → `to`, once: a tenure ends a single time and is never resumed. On the change the leader gauge drops,
    /// a transition is counted and the token is cancelled.
    fn end(&self, to: Standing) -> bool {
        let changed = self.standing.send_if_modified(|s| {
            if *s == Standing::Held {
                *s = to.clone();
                true
            } else {
                false
            }
        });
        if changed {
            let name = self.lease.qualified_name().to_owned();
            metrics::gauge!(METRIC_LEADER, "lease" => name.clone()).set(0.0);
            metrics::counter!(METRIC_TRANSITIONS, "lease" => name).increment(1);
            self.token.cancel();
        }
        changed
    }

    /// Held → Lost; later calls change nothing (a loss is never undone).
    fn lose(&self, cause: LossCause) -> bool {
        let changed = self.end(Standing::Lost(cause.clone()));
        if changed {
            let name = self.lease.qualified_name().to_owned();
            tracing::warn!(target: TARGET, lease = %name, epoch = %self.lease.epoch(), holder = self.lease.holder(),
                %cause, "leadership lost");
            metrics::counter!(METRIC_LOSSES, "lease" => name, "cause" => cause.label())
                .increment(1);
        }
        changed
    }

    /// Held → Released; returns whether it was held.
    fn mark_released(&self) -> bool {
        self.end(Standing::Released)
    }
}

/// How a backend ends a tenure in its store.
trait Releaser: Send + Sync + fmt::Debug {
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
    shared: Arc<Shared>,
    releaser: Arc<dyn Releaser>,
    runtime: tokio::runtime::Handle,
    done: bool,
}

impl HeldLease {
    fn new(shared: Arc<Shared>, releaser: Arc<dyn Releaser>) -> HeldLease {
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
    /// loss ([`LossCause::DeadlineExceeded`]) for everyone, so once this returns `false` it stays `false` and
    /// [`standing`](Self::standing) says why.
    pub fn is_held(&self) -> bool {
        self.shared.believed_held()
    }

    /// The current standing.
    pub fn standing(&self) -> Standing {
        self.shared.standing.borrow().clone()
    }

    /// Completes when the lease is no longer held, with the cause (or `None` when it was released).
    pub fn lost(&self) -> impl Future<Output = Option<LossCause>> + Send + 'static {
        let mut rx = self.shared.standing.subscribe();
        async move {
            let standing = match rx.wait_for(|s| *s != Standing::Held).await {
                Ok(s) => s.clone(),
                Err(_) => return None,
            };
            match standing {
                Standing::Lost(cause) => Some(cause),
                _ => None,
            }
        }
    }

    /// A token cancelled when the lease is lost or released: hand it to the work that must stop then.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.shared.token.clone()
    }

    /// By the monotonic clock, the instant until which this process trusts the lease (send time of the last
    /// successful renewal + ttl − safety margin).
    pub fn trust_until(&self) -> Instant {
        self.shared.trust_until()
    }

    /// Releases now and waits for the database. After a loss this is a no-op.
    pub async fn release(mut self) -> Result<Released> {
        self.done = true;
        if !self.shared.mark_released() {
            return Ok(Released::NotHeld(LossReason::Released));
        }
        let result = self.releaser.release(self.shared.lease.clone()).await;
        if let Ok(Released::Released) = result {
            tracing::info!(target: TARGET, lease = %self.qualified_name(), epoch = %self.epoch(), "leadership released");
        }
        result
    }

    /// Stops renewing without releasing, as if the process had died or frozen: the lease stays held in the
    /// database until its ttl runs out. For demos and failure tests.
    #[doc(hidden)]
    pub fn abandon(mut self) {
        self.done = true;
        self.shared.lose(LossCause::DeadlineExceeded {
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
            &*self.shared.standing.borrow(),
            Standing::Held | Standing::Lost(LossCause::DeadlineExceeded { .. })
        );
        self.shared.mark_released();
        if needs_release {
            let (releaser, lease) = (self.releaser.clone(), self.shared.lease.clone());
            self.runtime.spawn(async move {
                if let Err(e) = releaser.release(lease.clone()).await {
                    tracing::warn!(target: TARGET, lease = %lease.qualified_name(), error = %e,
                        "background release failed; the lease expires after its ttl");
                }
            });
        }
    }
}

/// What the release channel of an elector carries.
#[derive(Debug, Clone)]
enum Wake {
    /// The lease with this qualified name was released.
    Free(String),
    /// The release listener LISTENs again after it lost its connection: releases in between were not heard,
    /// so every waiter should look again.
    Resumed,
}

/// Resolves when a lease may have become free (a release notification) — a hint, never a guarantee.
#[derive(Debug)]
pub struct Wakeups {
    rx: Option<broadcast::Receiver<Wake>>,
}

impl Wakeups {
    /// Waits until `qualified` is announced free or `max_wait` passes, whichever is first. Also returns early
    /// when the elector's release listener reconnected (a release may have gone unheard while it was away).
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
                Ok(Ok(Wake::Free(_))) => continue,
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

/// Health of an elector's backing store, in separate dimensions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// Something that grants leases: PostgreSQL ([`PgElector`]) or the in-memory double ([`MemoryElector`]).
pub trait Elector: Clone + Send + Sync + 'static {
    /// The name leases are stored under (`<cluster>/<name>` or `memory/<name>`).
    fn qualify(&self, name: &str) -> String;

    /// One acquisition attempt; `Error::Held` when another holder's tenure is live.
    fn acquire(
        &self,
        name: &str,
        holder: &str,
        options: &LeaseOptions,
    ) -> impl Future<Output = Result<HeldLease>> + Send;

    /// Subscribes to release announcements. Subscribe *before* an acquisition attempt so a release between
    /// the attempt and the wait is not missed.
    fn wakeups(&self) -> Wakeups;

    /// Health of the backing store.
    fn health(&self) -> impl Future<Output = Health> + Send;
}

// ------------------------------------------------------------------------------------------------------------
// PostgreSQL elector.

/// The PostgreSQL [`Elector`]: leases in `pgfence.leases`, renewed in batches, woken by LISTEN/NOTIFY.
/// Create one per process and clone it.
#[derive(Clone, Debug)]
pub struct PgElector {
    inner: Arc<PgInner>,
}

#[derive(Debug)]
struct PgInner {
    store: Store,
    groups: Mutex<HashMap<GroupKey, Arc<Group>>>,
    notifications: OnceLock<broadcast::Sender<Wake>>,
    listener: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for PgInner {
    fn drop(&mut self) {
        if let Some(task) = self
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            task.abort();
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GroupKey {
    holder: String,
    ttl: Duration,
    renew_every: Duration,
    retry_every: Duration,
}

/// Leases renewed together by one statement per tick.
#[derive(Debug)]
struct Group {
    key: GroupKey,
    members: Mutex<Vec<Arc<Shared>>>,
    wake: Notify,
}

impl PgElector {
    /// An elector on `store`.
    pub fn new(store: Store) -> PgElector {
        PgElector {
            inner: Arc::new(PgInner {
                store,
                groups: Mutex::new(HashMap::new()),
                notifications: OnceLock::new(),
                listener: Mutex::new(None),
            }),
        }
    }

    /// The store behind it.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    fn join_group(&self, key: GroupKey, member: Arc<Shared>) {
        let mut groups = self.inner.groups.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(group) = groups.get(&key) {
            group
                .members
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(member);
            group.wake.notify_one();
            return;
        }
        let group = Arc::new(Group {
            key: key.clone(),
            members: Mutex::new(vec![member]),
            wake: Notify::new(),
        });
        groups.insert(key, group.clone());
        tokio::spawn(renew_loop(Arc::downgrade(&self.inner), group));
    }

    fn notifications(&self) -> &broadcast::Sender<Wake> {
        self.inner.notifications.get_or_init(|| {
            let (tx, _) = broadcast::channel(1024);
            if self.inner.store.can_open_dedicated() {
                let task = tokio::spawn(listen(self.inner.store.clone(), tx.clone()));
                *self
                    .inner
                    .listener
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(task);
            }
            tx
        })
    }
}

/// First delay before the release listener reconnects; it doubles up to [`LISTEN_RETRY_MAX`].
const LISTEN_RETRY_MIN: Duration = Duration::from_millis(100);
/// Longest delay between the release listener's connection attempts. Short: while it is away, releases go unheard
/// (waiters sleep out their timers, up to `poll_every`), and an attempt against a server that is down costs it
/// nothing. With the former cap of 5 s the attempts came 0.1, 0.3, 0.7, 1.5, 3.1 and 6.3 s after the connection
/// was lost: a server back after 3.2 s was listened to again only 3.1 s later.
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(1);

/// Keeps one dedicated connection LISTENing for released leases and fans the names out. Reconnects after
/// 100 ms, doubling up to 1 s; while it is down, waiters fall back to their timeouts, and once it LISTENs again
/// every waiter is woken ([`Wake::Resumed`]) to look for a release it did not hear.
///
/// A notification carries the released lease's lock key, not its name (any role may LISTEN): the name is
/// looked up in `pgfence.leases`, which shows only leases of clusters this role has a grant on, and cached
/// (lock keys are never reused and names never change). Keys of leases this role cannot see are ignored.
async fn listen(store: Store, tx: broadcast::Sender<Wake>) {
    use diesel_async::SimpleAsyncConnection;
    use futures_util::StreamExt;
    let mut names: HashMap<i32, String> = HashMap::new();
    let mut delay = LISTEN_RETRY_MIN;
    let mut listened_before = false;
    loop {
        match store.open_dedicated().await {
            Ok(mut conn) => match conn.batch_execute("LISTEN pgfence_lease_free").await {
                Ok(()) => {
                    delay = LISTEN_RETRY_MIN;
                    if listened_before {
                        let _ = tx.send(Wake::Resumed);
                    }
                    listened_before = true;
                    loop {
                        // The stream only reads the connection's notification queue: dropping it between
                        // notifications loses none, and frees the connection for the name lookup.
                        let next = std::pin::pin!(conn.notifications_stream()).next().await;
                        match next {
                            Some(Ok(n)) => {
                                let Ok(key) = n.payload.parse::<i32>() else {
                                    continue;
                                };
                                if let Some(name) = lease_name(&mut conn, &mut names, key).await {
                                    let _ = tx.send(Wake::Free(name));
                                }
                            }
                            Some(Err(e)) => {
                                tracing::debug!(target: TARGET, error = %e, "release listener connection failed");
                                break;
                            }
                            None => break,
                        }
                    }
                }
                Err(e) => tracing::debug!(target: TARGET, error = %e, "LISTEN failed"),
            },
            Err(e) => {
                tracing::debug!(target: TARGET, error = %e, "release listener cannot connect")
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(LISTEN_RETRY_MAX);
    }
}

/// The name of the lease with lock key `key`, if this role can see it (cached). Looked up on the listener's own
/// connection, the one that just proved alive: right after an outage the pool may still hand out connections
/// that died with the server, or none at all during its reconnect backoff, and the notification would be lost.
async fn lease_name(
    conn: &mut AsyncPgConnection,
    names: &mut HashMap<i32, String>,
    key: i32,
) -> Option<String> {
    use diesel::OptionalExtension;
    use diesel_async::RunQueryDsl;
    if let Some(name) = names.get(&key) {
        return Some(name.clone());
    }
    let name: Option<String> = diesel::select(
        diesel::dsl::sql::<diesel::sql_types::Nullable<diesel::sql_types::Text>>(
            "(SELECT name FROM pgfence.leases WHERE lock_key = ",
        )
        .bind::<diesel::sql_types::Integer, _>(key)
        .sql(")"),
    )
    .get_result::<Option<String>>(conn)
    .await
    .optional()
    .ok()
    .flatten()
    .flatten();
    if let Some(name) = &name {
        names.insert(key, name.clone());
    }
    name
}

pub(crate) mod sql {
    use diesel::pg::sql_types::Record;
    use diesel::sql_types::{Array, BigInt, Nullable, Text};

    pub(crate) type RenewRow = Record<(Text, Text, Nullable<Text>, Nullable<BigInt>)>;
    /// (lease, outcome, reason, current epoch)
    pub(crate) type RenewOutcome = (String, String, Option<String>, Option<i64>);

    diesel::define_sql_function! {
        #[sql_name = "pgfence.renew_many"]
        fn renew_many(leases: Array<Text>, epochs: Array<BigInt>, secrets: Array<Text>, holder: Text,
                      ttl_ms: BigInt) -> RenewRow;
    }
}

/// The connection a group's renewals go through.
///
/// A store that opens connections of its own ([`Store::connect`]) keeps one for the group's renewals, opened
/// again — checked to be the expected primary, as every pooled connection is — by the first attempt after it
/// broke. Every retry then really tries to connect. Through the pool a retry would only wait: after a failed
/// connect, bb8 tries again 0.4 s later, then 0.8 s, … (up to half the checkout timeout), and a checkout waits
/// for that pending attempt instead of starting one. A database down for 0.8 s cost a lease with a 2 s ttl that
/// way (the next attempt came after the local deadline). Renewals also no longer wait for an application that
/// has every pooled connection busy. A store built from an application's pool ([`Store::from_pool`]) renews
/// through that pool.
struct RenewalConnection {
    dedicated: bool,
    conn: Option<AsyncPgConnection>,
}

/// A connection lent to one renewal attempt.
enum Lent<'a> {
    /// Armed (see [`Checked`]): dropped before the answer, its statement is cancelled and it is discarded.
    Pooled(Checked<'a>),
    Dedicated(AsyncPgConnection),
}

/// How one renewal attempt ended.
enum Attempt {
    /// The database answered: one row per member, in the order sent, and when the statement was sent.
    Answered {
        sent: Instant,
        rows: Vec<sql::RenewOutcome>,
    },
    /// Connecting or the statement failed.
    Failed(Error),
    /// The local deadline came while `doing` was in progress.
    CutOff { doing: &'static str },
}

impl RenewalConnection {
    fn new(store: &Store) -> RenewalConnection {
        RenewalConnection {
            dedicated: store.can_open_dedicated(),
            conn: None,
        }
    }

    /// A connection for one attempt, by `until` at the latest: the kept one unless it broke, else a new one.
    async fn lend<'a>(
        &mut self,
        store: &'a Store,
        until: tokio::time::Instant,
    ) -> std::result::Result<Lent<'a>, Attempt> {
        use diesel_async::pooled_connection::PoolableConnection;
        if !self.dedicated {
            return match tokio::time::timeout_at(until, store.checked()).await {
                Ok(Ok(conn)) => Ok(Lent::Pooled(conn)),
                Ok(Err(e)) => Err(Attempt::Failed(e)),
                Err(_) => Err(Attempt::CutOff {
                    doing: "waiting for a pooled connection",
                }),
            };
        }
        if let Some(mut conn) = self.conn.take() {
            // Closed by the server (a restart, an idle-session timeout): a statement on it could only fail.
            if !conn.is_broken() {
                return Ok(Lent::Dedicated(conn));
            }
        }
        match tokio::time::timeout_at(until, store.open_dedicated_checked()).await {
            Ok(Ok(conn)) => Ok(Lent::Dedicated(conn)),
            Ok(Err(e)) => Err(Attempt::Failed(e)),
            Err(_) => Err(Attempt::CutOff {
                doing: "connecting",
            }),
        }
    }

    /// One attempt: one renewal statement for every held member of the group, all of it — connecting
    /// included — by `until` (the earliest local deadline of the members).
    async fn renew(
        &mut self,
        store: &Store,
        key: &GroupKey,
        members: &[Arc<Shared>],
        until: tokio::time::Instant,
    ) -> Attempt {
        use diesel_async::pooled_connection::PoolableConnection;
        use diesel_async::RunQueryDsl;
        let mut lent = match self.lend(store, until).await {
            Ok(lent) => lent,
            Err(attempt) => return attempt,
        };
        let names: Vec<String> = members
            .iter()
            .map(|m| m.lease.qualified_name().to_owned())
            .collect();
        let epochs: Vec<i64> = members.iter().map(|m| m.lease.epoch().get()).collect();
        let secrets: Vec<String> = members
            .iter()
            .map(|m| m.lease.fence().secret().expose_secret().to_owned())
            .collect();
        let query = diesel::select(sql::renew_many(
            names,
            epochs,
            secrets,
            key.holder.clone(),
            key.ttl.as_millis() as i64,
        ));
        let conn: &mut AsyncPgConnection = match &mut lent {
            Lent::Pooled(conn) => conn,
            Lent::Dedicated(conn) => conn,
        };
        let cancel = conn.cancel_token();
        let sent = Instant::now();
        let result = tokio::time::timeout_at(until, query.load::<sql::RenewOutcome>(conn)).await;
        let result = match (result, lent) {
            (Ok(result), Lent::Pooled(mut conn)) => {
                conn.disarm();
                result
            }
            (Ok(result), Lent::Dedicated(mut conn)) => {
                if result.is_ok() || !conn.is_broken() {
                    self.conn = Some(conn);
                }
                result
            }
            // Dropped armed: the statement is cancelled and the connection discarded.
            (Err(_), Lent::Pooled(_)) => {
                return Attempt::CutOff {
                    doing: "the renewal statement",
                }
            }
            (Err(_), Lent::Dedicated(conn)) => {
                // The statement may still be queued on the server (behind a lock): cancel it, so that it cannot
                // renew a tenure this process has given up, and close the connection.
                drop(conn);
                let store = store.clone();
                tokio::spawn(async move {
                    // Over TLS like the connection itself, when it used TLS.
                    if let Err(e) = store.cancel(&cancel).await {
                        tracing::debug!(target: TARGET, error = %e, "cancelling a late renewal failed");
                    }
                });
                return Attempt::CutOff {
                    doing: "the renewal statement",
                };
            }
        };
        match result {
            Ok(rows) => Attempt::Answered { sent, rows },
            Err(e) => Attempt::Failed(e.into()),
        }
    }
}

/// The renewal loop of one group: renews all held members with one statement per tick, retries transient
/// errors every `retry_every` until each member's local deadline, and declares members lost at that deadline
/// even while an attempt is still in flight.
async fn renew_loop(elector: Weak<PgInner>, group: Arc<Group>) {
    let key = group.key.clone();
    let mut next = tokio::time::Instant::now() + key.renew_every;
    let mut last_error: Option<String> = None;
    let mut connection = match elector.upgrade() {
        Some(inner) => RenewalConnection::new(&inner.store),
        None => return,
    };
    loop {
        let Some(inner) = elector.upgrade() else {
            return;
        };
        let members: Vec<Arc<Shared>> = {
            let mut members = group.members.lock().unwrap_or_else(|p| p.into_inner());
            members.retain(|m| m.is_current());
            members.clone()
        };
        if members.is_empty() {
            let mut groups = inner.groups.lock().unwrap_or_else(|p| p.into_inner());
            // Re-check under the registry lock: a member may have joined since.
            if group
                .members
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
            {
                groups.remove(&key);
                return;
            }
            continue;
        }
        let trust_until = members
            .iter()
            .map(|m| m.trust_until())
            .min()
            .expect("members is not empty");
        let trust_until = tokio::time::Instant::from_std(trust_until);
        tokio::select! {
            _ = tokio::time::sleep_until(next.min(trust_until)) => {}
            _ = group.wake.notified() => continue,
        }
        let now = tokio::time::Instant::now();
        if now < next {
            // Woken by a deadline, not by the tick: declare the members whose deadline passed.
            expire_members(&members, &last_error);
            continue;
        }

        // Members may have ended while we slept (released, abandoned, or lost through `is_held`): renewing them
        // would extend a tenure nobody holds and delay its successor by up to a period.
        let members: Vec<Arc<Shared>> = members.into_iter().filter(|m| m.is_current()).collect();
        if members.is_empty() {
            continue;
        }
        let attempt = connection
            .renew(&inner.store, &key, &members, trust_until)
            .await;
        drop(inner);
        match attempt {
            Attempt::Answered { sent, rows } => {
                metrics::histogram!(METRIC_RENEW_SECONDS).record(sent.elapsed().as_secs_f64());
                // One row per member, in the order sent (two tenures of one lease may be in the group: the
                // names alone would not tell them apart).
                for (member, (lease, outcome, reason, _)) in members.iter().zip(&rows) {
                    debug_assert_eq!(member.lease.qualified_name(), lease);
                    match renewal_verdict(outcome, reason.as_deref()) {
                        None => member.renewed(sent),
                        Some(cause) => {
                            member.lose(cause);
                        }
                    }
                }
                last_error = None;
                next = tokio::time::Instant::from_std(sent) + key.renew_every;
                tracing::debug!(target: TARGET, holder = %key.holder, leases = rows.len(), "leases renewed");
            }
            Attempt::Failed(err) if !err.is_transient() => {
                // The statement itself was refused: nothing will make the next try different.
                last_error = Some(err.to_string());
                tracing::error!(target: TARGET, holder = %key.holder, error = %err, "renewal refused");
                next = tokio::time::Instant::now() + key.retry_every;
            }
            Attempt::Failed(err) => {
                tracing::warn!(target: TARGET, holder = %key.holder, error = %err, "renewal failed; retrying");
                last_error = Some(err.to_string());
                next = tokio::time::Instant::now() + key.retry_every;
            }
            Attempt::CutOff { doing } => {
                // An attempt in flight at the deadline says nothing about the database that the one before it
                // did not: keep that one's error (e.g. the refused connection) as the cause.
                tracing::warn!(target: TARGET, holder = %key.holder, doing,
                    "renewal did not complete before the local deadline");
                last_error.get_or_insert_with(|| {
                    format!("{doing} did not complete before the local deadline")
                });
                next = tokio::time::Instant::now() + key.retry_every;
            }
        }
        expire_members(&members, &last_error);
    }
}

/// What one row of `pgfence.renew_many` means for its tenure: `None` when it was renewed, otherwise a definitive
/// loss. Every refusal is definitive, whatever its reason — superseded, expired, released, or `failover` (the
/// tenure was granted before the server's last promotion): asking again gets the same answer, and only a new
/// acquisition (a new epoch) can help, which the runtime's campaign loop does on its own.
fn renewal_verdict(outcome: &str, reason: Option<&str>) -> Option<LossCause> {
    (outcome != "renewed").then(|| LossCause::Definitive {
        reason: LossReason::parse(reason.unwrap_or("expired")),
    })
}

/// Records the last renewal outcome on every member and declares the loss of those whose local deadline passed.
fn expire_members(members: &[Arc<Shared>], last_error: &Option<String>) {
    for member in members {
        member.set_last_error(last_error.clone());
        // Declares the loss (with that error) when the deadline has passed.
        member.believed_held();
    }
}

#[derive(Debug)]
struct PgReleaser {
    store: Store,
}

impl Releaser for PgReleaser {
    fn release(&self, lease: Lease) -> BoxFuture<Result<Released>> {
        let store = self.store.clone();
        Box::pin(async move {
            // Release is idempotent, so a transient failure (a connection that died under us) is retried once on
            // a fresh connection; if that fails too, the lease simply expires after its ttl.
            match store.release(&lease).await {
                Err(e) if e.is_transient() => store.release(&lease).await,
                other => other,
            }
        })
    }
}

impl Elector for PgElector {
    fn qualify(&self, name: &str) -> String {
        self.inner.store.qualify(name)
    }

    async fn acquire(&self, name: &str, holder: &str, options: &LeaseOptions) -> Result<HeldLease> {
        options.validate()?;
        let lease = self.inner.store.acquire(name, holder, options.ttl).await?;
        let deadline = lease.local_deadline();
        let shared = Shared::new(lease, options.margin(), deadline);
        self.join_group(
            GroupKey {
                holder: holder.to_owned(),
                ttl: options.ttl,
                renew_every: options.renew_period(),
                retry_every: options.retry_period(),
            },
            shared.clone(),
        );
        Ok(HeldLease::new(
            shared,
            Arc::new(PgReleaser {
                store: self.inner.store.clone(),
            }),
        ))
    }

    fn wakeups(&self) -> Wakeups {
        Wakeups {
            rx: Some(self.notifications().subscribe()),
        }
    }

    async fn health(&self) -> Health {
        match self.inner.store.verify_identity().await {
            Ok(_) => Health {
                database_reachable: true,
                primary: Some(true),
                identity_as_expected: Some(true),
                error: None,
            },
            Err(e @ Error::NotPrimary { .. }) => Health {
                database_reachable: true,
                primary: Some(false),
                identity_as_expected: None,
                error: Some(e.to_string()),
            },
            Err(e @ Error::WrongDatabase { .. }) => Health {
                database_reachable: true,
                primary: Some(true),
                identity_as_expected: Some(false),
                error: Some(e.to_string()),
            },
            Err(e) => Health {
                database_reachable: false,
                primary: None,
                identity_as_expected: None,
                error: Some(e.to_string()),
            },
        }
    }
}

// ------------------------------------------------------------------------------------------------------------
// In-memory test double.

/// A deterministic, in-memory [`Elector`] for unit-testing controller code without a database.
///
/// State is shared only by clones of one instance (never across processes), leases never expire by time, and
/// its fences are not accepted by a real pgfence database. Inject a loss with [`lose`](Self::lose).
#[derive(Clone, Debug, Default)]
pub struct MemoryElector {
    inner: Arc<MemoryInner>,
}

#[derive(Debug, Default)]
struct MemoryInner {
    leases: Mutex<HashMap<String, MemoryLease>>,
    wake: OnceLock<broadcast::Sender<Wake>>,
}

#[derive(Debug, Default)]
struct MemoryLease {
    epoch: i64,
    holder: Option<String>,
    current: Option<Weak<Shared>>,
}

impl MemoryElector {
    /// A new, empty elector.
    pub fn new() -> MemoryElector {
        MemoryElector::default()
    }

    /// Ends the current tenure of `name` as if the database had granted it to someone else: the holder's
    /// loss signal fires with [`LossCause::Injected`]. Returns whether a tenure was ended.
    pub fn lose(&self, name: &str) -> bool {
        self.end_tenure(name, LossCause::Injected)
    }

    /// Ends the current tenure of `name` the way the database would have answered its next renewal with
    /// `reason`: the holder's loss signal fires with [`LossCause::Definitive`]. Use it to drive a controller
    /// through a specific loss, e.g. [`LossReason::Failover`]. Returns whether a tenure was ended.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> pgfence::Result<()> {
    /// use std::time::Duration;
    /// use pgfence::LossReason;
    /// use pgfence::leader::{Elector, LeaseOptions, LossCause, MemoryElector};
    ///
    /// let elector = MemoryElector::new();
    /// let lease = elector.acquire("scheduler", "pod-a", &LeaseOptions::new(Duration::from_secs(15))).await?;
    /// assert!(elector.lose_because("scheduler", LossReason::Failover));
    /// assert!(!lease.is_held());
    /// assert_eq!(lease.lost().await, Some(LossCause::Definitive { reason: LossReason::Failover }));
    /// # Ok(()) }
    /// ```
    pub fn lose_because(&self, name: &str, reason: LossReason) -> bool {
        self.end_tenure(name, LossCause::Definitive { reason })
    }

    fn end_tenure(&self, name: &str, cause: LossCause) -> bool {
        let qualified = self.qualify(name);
        let current = {
            let mut leases = self.inner.leases.lock().unwrap_or_else(|p| p.into_inner());
            match leases.get_mut(&qualified) {
                Some(lease) if lease.holder.is_some() => {
                    lease.holder = None;
                    lease.current.take().and_then(|w| w.upgrade())
                }
                _ => None,
            }
        };
        let ended = current.map(|s| s.lose(cause)).unwrap_or(false);
        let _ = self.sender().send(Wake::Free(qualified));
        ended
    }

    /// Makes `name` held by `holder` as if another process had acquired it (without a [`HeldLease`] here), so
    /// that a test can exercise "someone else leads". Fails with [`Error::Held`] when it is held already.
    pub fn occupy(&self, name: &str, holder: &str) -> Result<Epoch> {
        let qualified = self.qualify(name);
        let mut leases = self.inner.leases.lock().unwrap_or_else(|p| p.into_inner());
        let entry = leases.entry(qualified.clone()).or_default();
        if let Some(current) = &entry.holder {
            return Err(Error::Held {
                lease: qualified,
                holder: current.clone(),
                epoch: Epoch::new(entry.epoch)?,
                expires_in: Duration::MAX,
            });
        }
        entry.epoch += 1;
        entry.holder = Some(holder.to_owned());
        entry.current = None;
        Epoch::new(entry.epoch)
    }

    /// The current holder and epoch of `name`, if held.
    pub fn holder(&self, name: &str) -> Option<(String, Epoch)> {
        let leases = self.inner.leases.lock().unwrap_or_else(|p| p.into_inner());
        let lease = leases.get(&self.qualify(name))?;
        Some((lease.holder.clone()?, Epoch::new(lease.epoch).ok()?))
    }

    fn sender(&self) -> &broadcast::Sender<Wake> {
        self.inner.wake.get_or_init(|| broadcast::channel(1024).0)
    }
}

#[derive(Debug)]
struct MemoryReleaser {
    elector: MemoryElector,
}

impl Releaser for MemoryReleaser {
    fn release(&self, lease: Lease) -> BoxFuture<Result<Released>> {
        let elector = self.elector.clone();
        Box::pin(async move {
            let released = {
                let mut leases = elector
                    .inner
                    .leases
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                match leases.get_mut(lease.qualified_name()) {
                    Some(l) if l.epoch == lease.epoch().get() && l.holder.is_some() => {
                        l.holder = None;
                        l.current = None;
                        true
                    }
                    _ => false,
                }
            };
            if released {
                let _ = elector
                    .sender()
                    .send(Wake::Free(lease.qualified_name().to_owned()));
                Ok(Released::Released)
            } else {
                Ok(Released::NotHeld(LossReason::Superseded))
            }
        })
    }
}

impl Elector for MemoryElector {
    fn qualify(&self, name: &str) -> String {
        format!("memory/{name}")
    }

    async fn acquire(&self, name: &str, holder: &str, options: &LeaseOptions) -> Result<HeldLease> {
        options.validate()?;
        crate::lease::validate_name(name)?;
        crate::lease::validate_holder("holder", holder)?;
        let qualified = self.qualify(name);
        let shared = {
            let mut leases = self.inner.leases.lock().unwrap_or_else(|p| p.into_inner());
            let entry = leases.entry(qualified.clone()).or_default();
            if let Some(current) = &entry.holder {
                if current != holder {
                    return Err(Error::Held {
                        lease: qualified,
                        holder: current.clone(),
                        epoch: Epoch::new(entry.epoch)?,
                        expires_in: options.ttl,
                    });
                }
                // Same holder again: a new tenure fences the earlier one, as in PostgreSQL.
                if let Some(old) = entry.current.take().and_then(|w| w.upgrade()) {
                    old.lose(LossCause::Definitive {
                        reason: LossReason::Superseded,
                    });
                }
            }
            entry.epoch += 1;
            entry.holder = Some(holder.to_owned());
            // A test double: the secret is random but from a non-cryptographic generator (nothing checks it).
            let secret = TenureSecret::parse(
                (0..crate::fence::SECRET_LEN)
                    .map(|_| char::from_digit(fastrand::u32(0..16), 16).unwrap_or('0'))
                    .collect::<String>(),
            )?;
            let lease = Lease::from_parts(
                name,
                qualified,
                holder,
                (Epoch::new(entry.epoch)?, secret),
                options.ttl,
                Instant::now(),
            );
            // Memory leases do not expire by time: only release and `lose` end them.
            let shared = Shared::new(lease, Duration::ZERO, far_future());
            entry.current = Some(Arc::downgrade(&shared));
            shared
        };
        Ok(HeldLease::new(
            shared,
            Arc::new(MemoryReleaser {
                elector: self.clone(),
            }),
        ))
    }

    fn wakeups(&self) -> Wakeups {
        Wakeups {
            rx: Some(self.sender().subscribe()),
        }
    }

    async fn health(&self) -> Health {
        Health {
            database_reachable: true,
            primary: Some(true),
            identity_as_expected: Some(true),
            error: None,
        }
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}

// ------------------------------------------------------------------------------------------------------------
// run_with_leadership and the supervisor.

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
}

/// Why the leadership a [`LeaderContext`] stands for ended (or, for [`Shutdown`](Self::Shutdown), is ending).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TenureEnd {
    /// The tenure was lost: the database ended it ([`LossCause::Definitive`]), the local deadline passed without
    /// a renewal ([`LossCause::DeadlineExceeded`]), or a test double injected the loss. Writes with its fence are
    /// refused (or soon will be); the runtime re-campaigns for a new tenure.
    Lost(LossCause),
    /// The caller asked leadership to stop (the parent token of [`run_with_leadership`] or the supervisor's
    /// shutdown was cancelled). The tenure stays held until the callback returns and is then released, so work in
    /// flight may finish with the fence; start nothing new.
    Shutdown,
    /// The callback returned (or failed) and the tenure was released: only work the callback left running with a
    /// clone of the context can see this.
    Released,
}

impl fmt::Display for TenureEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TenureEnd::Lost(cause) => write!(f, "lost: {cause}"),
            TenureEnd::Shutdown => f.write_str("shut down"),
            TenureEnd::Released => f.write_str("released after the callback returned"),
        }
    }
}

impl LeaderContext {
    /// The fence of this tenure.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// The epoch of this tenure.
    pub fn epoch(&self) -> Epoch {
        self.fence.epoch()
    }

    /// Whether this process still believes it holds the tenure — the same answer as [`HeldLease::is_held`] for
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
    /// use pgfence::leader::{run_with_leadership, LeadershipOptions, LossCause, MemoryElector, TenureEnd};
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
    /// assert_eq!(ctx.end_cause(), Some(TenureEnd::Lost(LossCause::Injected)));
    /// run.await.unwrap()?;
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        self.tenure.believed_held()
    }

    /// By the monotonic clock, the instant until which this process trusts the tenure (send time of the last
    /// successful renewal + ttl − safety margin); see [`HeldLease::trust_until`]. Useful to bound a write's
    /// timeout.
    pub fn trust_until(&self) -> Instant {
        self.tenure.trust_until()
    }

    /// Why leadership ended, or `None` while it goes on. `Some` from the moment the
    /// [`cancellation token`](Self::cancellation_token) is cancelled, and whenever [`is_held`](Self::is_held) is
    /// false. A loss is reported as [`TenureEnd::Lost`] with its cause even when it happens during an orderly
    /// shutdown (the tenure was then not released in order); otherwise an orderly stop is
    /// [`TenureEnd::Shutdown`].
    ///
    /// ```
    /// use pgfence::leader::{LeaderContext, LossCause, TenureEnd};
    /// use pgfence::LossReason;
    ///
    /// fn report(ctx: &LeaderContext) {
    ///     match ctx.end_cause() {
    ///         None => println!("still leading at epoch {}", ctx.epoch()),
    ///         Some(TenureEnd::Lost(LossCause::Definitive { reason: LossReason::Failover })) => {
    ///             println!("the database failed over; campaigning again")
    ///         }
    ///         Some(TenureEnd::Lost(cause)) => println!("lost epoch {}: {cause}", ctx.epoch()),
    ///         Some(end) => println!("stopped: {end}"),
    ///     }
    /// }
    /// ```
    pub fn end_cause(&self) -> Option<TenureEnd> {
        // Read the clock first: past the local deadline the tenure is over even if no timer has said so yet.
        self.tenure.believed_held();
        match &*self.tenure.standing.borrow() {
            Standing::Lost(cause) => Some(TenureEnd::Lost(cause.clone())),
            _ if self.shutdown.load(Ordering::SeqCst) => Some(TenureEnd::Shutdown),
            Standing::Released => Some(TenureEnd::Released),
            Standing::Held => None,
        }
    }

    /// Cancelled when leadership ends (loss or shutdown): stop working then. [`end_cause`](Self::end_cause)
    /// says why.
    pub fn cancellation_token(&self) -> &CancellationToken {
        &self.token
    }

    /// Completes when leadership ends (loss or shutdown); [`end_cause`](Self::end_cause) is `Some` from then on.
    pub async fn cancelled(&self) {
        self.token.cancelled().await
    }
}

/// Timing of a leadership run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
pub enum Ended<E> {
    /// The callback returned `Ok`; the lease was released.
    Returned,
    /// The callback returned an error; the lease was released.
    Failed(E),
    /// The callback panicked; the lease was released.
    Panicked(String),
    /// The lease was lost; the callback was cancelled.
    Lost {
        /// Why the lease was lost.
        cause: LossCause,
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
/// `poll_every`) or a release notification, whichever comes first.
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
///             store.create_task(ctx.fence(), "tick", &serde_json::json!({})).await?;
///             tokio::select! {
///                 _ = ctx.cancelled() => {}
///                 _ = tokio::time::sleep(Duration::from_secs(1)) => {}
///             }
///         }
///         match ctx.end_cause() {
///             Some(TenureEnd::Lost(cause)) => eprintln!("lost epoch {}: {cause}", ctx.epoch()),
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
    if options.poll_every.is_zero() || options.grace.is_zero() {
        return Err(Error::invalid(
            "leadership options",
            "poll_every and grace must be positive",
        ));
    }
    let qualified = elector.qualify(name);
    let lease = loop {
        let mut wakeups = elector.wakeups();
        let wait = match elector.acquire(name, holder, &options.lease).await {
            Ok(lease) => break lease,
            Err(Error::Held { expires_in, .. }) => expires_in.min(options.poll_every),
            Err(e) if e.is_transient() => {
                tracing::warn!(target: TARGET, lease = %qualified, error = %e, "acquisition failed; retrying");
                options.poll_every
            }
            Err(e) => return Err(e),
        };
        tokio::select! {
            _ = parent.cancelled() => return Ok(Ended::Cancelled { callback_stopped: true }),
            _ = wakeups.wait(&qualified, jittered(wait)) => {}
        }
    };
    tracing::info!(target: TARGET, lease = %qualified, epoch = %lease.epoch(), holder, "leading");

    let token = lease.cancellation_token().child_token();
    let shutdown = Arc::new(AtomicBool::new(false));
    let context = LeaderContext {
        fence: lease.fence(),
        token: token.clone(),
        tenure: lease.shared.clone(),
        shutdown: shutdown.clone(),
    };
    let mut task = tokio::spawn(callback(context));
    let lost = lease.lost();
    tokio::pin!(lost);

    enum Stop {
        Lost(LossCause),
        Cancelled,
    }
    let stop = tokio::select! {
        // Biased: a callback that returns *because* it saw the loss or the shutdown must be reported as such,
        // and by then the loss (or the parent's cancellation) is already observable.
        biased;
        cause = &mut lost => Stop::Lost(cause.unwrap_or(LossCause::Definitive { reason: LossReason::Released })),
        _ = parent.cancelled() => Stop::Cancelled,
        joined = &mut task => {
            // Re-check: the callback may have returned on the loss signal between the polls above.
            if let Standing::Lost(cause) = lease.standing() {
                return Ok(Ended::Lost { cause, callback_stopped: true });
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
            tracing::error!(target: TARGET, lease = %qualified, grace = ?options.grace,
                "leader callback did not stop within the grace period after cancellation; aborting it");
            metrics::counter!(METRIC_CALLBACKS_NOT_STOPPED, "lease" => qualified.clone())
                .increment(1);
            task.abort();
            false
        }
    };
    match stop {
        Stop::Lost(cause) => {
            drop(lease); // releases in the background if the database may still think we hold it
            Ok(Ended::Lost {
                cause,
                callback_stopped,
            })
        }
        Stop::Cancelled => {
            lease.release().await?;
            Ok(Ended::Cancelled { callback_stopped })
        }
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

/// Exponential backoff with jitter and a cap, for re-campaigning after a loss or an error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// First delay (default 100 ms).
    pub initial: Duration,
    /// Cap (default 10 s).
    pub max: Duration,
    /// Growth factor per consecutive failure (default 2).
    pub multiplier: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
            multiplier: 2.0,
        }
    }
}

impl Backoff {
    /// The delay before attempt `failures + 1`: "equal jitter" — uniformly between half and all of the capped
    /// exponential (`initial × multiplier^failures`, at most `max`), so it is never less than half of it.
    pub fn delay(&self, failures: u32) -> Duration {
        // Never zero and never shrinking, whatever the configuration: a controller that fails at once must not
        // spin on the database.
        let initial = self.initial.max(Duration::from_millis(1)).as_secs_f64();
        let exp = initial * self.multiplier.max(1.0).powi(failures.min(64) as i32);
        let capped = exp.min(self.max.as_secs_f64().max(initial));
        Duration::from_secs_f64(capped * (0.5 + fastrand::f64() * 0.5))
    }
}

/// The error type of supervised controllers.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

type Factory =
    Arc<dyn Fn(LeaderContext) -> BoxFuture<std::result::Result<(), BoxError>> + Send + Sync>;

struct Controller {
    name: String,
    options: LeadershipOptions,
    factory: Factory,
}

/// Runs several controllers in one process, each with its own lease and campaign loop: the leadership of each
/// name is independent (this process may lead `scheduler` while another leads `rollout`). After a loss or a
/// failure a controller re-campaigns after an exponential backoff with jitter; shutdown stops every loop and
/// releases what is held.
pub struct Supervisor<E: Elector> {
    elector: E,
    holder: String,
    backoff: Backoff,
    controllers: Vec<Controller>,
    leading: Arc<Mutex<BTreeMap<String, bool>>>,
}

impl<E: Elector> fmt::Debug for Supervisor<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Supervisor")
            .field("holder", &self.holder)
            .field(
                "controllers",
                &self.controllers.iter().map(|c| &c.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Readiness in separate dimensions: the store, and per controller whether this process leads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    /// The backing store's health.
    pub store: Health,
    /// Controller name → leading now.
    pub leading: BTreeMap<String, bool>,
}

/// A handle to a running supervisor's status.
#[derive(Debug, Clone)]
pub struct SupervisorStatus<E: Elector> {
    elector: E,
    leading: Arc<Mutex<BTreeMap<String, bool>>>,
}

impl<E: Elector> SupervisorStatus<E> {
    /// Which controllers this process leads now.
    pub fn leading(&self) -> BTreeMap<String, bool> {
        self.leading
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Store health plus leadership per controller.
    pub async fn readiness(&self) -> Readiness {
        Readiness {
            store: self.elector.health().await,
            leading: self.leading(),
        }
    }
}

impl<E: Elector> Supervisor<E> {
    /// A supervisor whose leases are held as `holder` (e.g. the pod name).
    pub fn new(elector: E, holder: impl Into<String>) -> Supervisor<E> {
        Supervisor {
            elector,
            holder: holder.into(),
            backoff: Backoff::default(),
            controllers: Vec::new(),
            leading: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    /// The re-campaign backoff.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Adds a controller: `run` is called once per tenure with that tenure's context and should return when the
    /// context is cancelled.
    pub fn controller<F, Fut>(
        mut self,
        name: impl Into<String>,
        options: LeadershipOptions,
        run: F,
    ) -> Self
    where
        F: Fn(LeaderContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), BoxError>> + Send + 'static,
    {
        let name = name.into();
        self.leading
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone(), false);
        self.controllers.push(Controller {
            name,
            options,
            factory: Arc::new(move |ctx| Box::pin(run(ctx))),
        });
        self
    }

    /// A status handle usable while [`run`](Self::run) runs.
    pub fn status(&self) -> SupervisorStatus<E> {
        SupervisorStatus {
            elector: self.elector.clone(),
            leading: self.leading.clone(),
        }
    }

    /// Runs every controller's campaign loop until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut loops = tokio::task::JoinSet::new();
        for controller in self.controllers {
            let (elector, holder, backoff, leading, shutdown) = (
                self.elector.clone(),
                self.holder.clone(),
                self.backoff,
                self.leading.clone(),
                shutdown.clone(),
            );
            loops.spawn(async move {
                campaign(elector, holder, backoff, leading, shutdown, controller).await;
            });
        }
        while loops.join_next().await.is_some() {}
    }
}

async fn campaign<E: Elector>(
    elector: E,
    holder: String,
    backoff: Backoff,
    leading: Arc<Mutex<BTreeMap<String, bool>>>,
    shutdown: CancellationToken,
    controller: Controller,
) {
    let set_leading = |value: bool| {
        leading
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(controller.name.clone(), value);
    };
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        let factory = controller.factory.clone();
        let leading_flag = leading.clone();
        let name = controller.name.clone();
        let result = run_with_leadership(
            &elector,
            &controller.name,
            &holder,
            &controller.options,
            &shutdown,
            move |ctx| {
                leading_flag
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(name.clone(), true);
                // Not leading from the moment the tenure ends (loss or shutdown), not only once the callback
                // has returned.
                let token = ctx.cancellation_token().clone();
                tokio::spawn(async move {
                    token.cancelled().await;
                    leading_flag
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(name, false);
                });
                factory(ctx)
            },
        )
        .await;
        set_leading(false);
        let delay = match result {
            Ok(Ended::Cancelled { .. }) => break,
            Ok(Ended::Returned) => {
                failures = 0;
                backoff.delay(0)
            }
            Ok(Ended::Lost { cause, .. }) => {
                tracing::warn!(target: TARGET, controller = %controller.name, %cause, "re-campaigning after loss");
                failures = 0;
                backoff.delay(0)
            }
            Ok(Ended::Failed(e)) => {
                tracing::error!(target: TARGET, controller = %controller.name, error = %e, "controller failed");
                failures += 1;
                backoff.delay(failures)
            }
            Ok(Ended::Panicked(message)) => {
                tracing::error!(target: TARGET, controller = %controller.name, %message, "controller panicked");
                failures += 1;
                backoff.delay(failures)
            }
            Err(e) => {
                tracing::error!(target: TARGET, controller = %controller.name, error = %e, "campaign failed");
                failures += 1;
                backoff.delay(failures)
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A renewal refused with `failover` (the tenure predates the server's last promotion) is a definitive loss
    /// with that reason — never a transient error retried until the deadline — so the campaign loop starts a new
    /// tenure at once. Every other refusal is definitive too; only `renewed` keeps the tenure.
    #[test]
    fn every_refused_renewal_is_a_definitive_loss_with_its_reason() {
        assert_eq!(renewal_verdict("renewed", None), None);
        assert_eq!(
            renewal_verdict("lost", Some("failover")),
            Some(LossCause::Definitive {
                reason: LossReason::Failover
            })
        );
        for reason in [
            LossReason::Superseded,
            LossReason::Expired,
            LossReason::Released,
            LossReason::UnknownLease,
            LossReason::HolderMismatch,
        ] {
            assert_eq!(
                renewal_verdict("lost", Some(reason.as_str())),
                Some(LossCause::Definitive { reason })
            );
        }
        assert_eq!(
            renewal_verdict("lost", None),
            Some(LossCause::Definitive {
                reason: LossReason::Expired
            })
        );
    }
}
