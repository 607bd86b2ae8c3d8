//! [`Supervisor`]: several controllers, each with its own lease, restarted with backoff — by default spread over
//! the replicas of a group ([`Spread`]): every replica joins the group, every member derives the same balanced
//! assignment of names from the group's roster ([`assign`](super::assign())), and each name is led by the member
//! it is assigned to, handed over cooperatively (drain, release, the successor acquires at once) when the
//! assignment moves it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::assign::{assign, Assignment};
use super::backoff::Backoff;
use super::held::Health;
use super::options::LeaseOptions;
use super::run::{run_leadership, Ended, LeaderContext, LeadershipOptions};
use super::{
    Elector, METRIC_GROUP_MEMBERS, METRIC_GROUP_NAMES_ASSIGNED, METRIC_GROUP_NAMES_LED,
    METRIC_HANDOVERS, METRIC_HANDOVER_GAP,
};
use crate::error::{Error, Result};
use crate::membership::{validate_group, MemberSpec, Roster, MAX_SHARDS};

/// The leadership module's boxed future, also reachable by this path for the elector modules that name it so.
pub(super) use super::BoxFuture;

/// The error type of supervised controllers.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

type Factory =
    Arc<dyn Fn(LeaderContext) -> BoxFuture<std::result::Result<(), BoxError>> + Send + Sync>;

struct Controller {
    name: String,
    options: LeadershipOptions,
    factory: Factory,
}

/// One shard of a sharded controller ([`Supervisor::sharded`]): its callback runs once per shard this replica
/// leads, with that shard's fence (the lease `<name>/<index>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shard {
    /// 0-based index, below `count`.
    pub index: u32,
    /// How many shards the controller has.
    pub count: u32,
}

impl Shard {
    /// Whether work keyed by `key` belongs to this shard ([`shard_of`](super::shard_of)).
    pub fn owns(&self, key: &str) -> bool {
        super::assign::shard_of(key, self.count) == self.index
    }
}

/// How a [`Supervisor`] spreads its controllers over the replicas of a group: the group's name and what this
/// replica declares as a member (its weight, names pinned to it, names it must never lead), and the timing of
/// its membership.
///
/// ```
/// use pgfence::leader::Spread;
///
/// let spread = Spread::new("controllers").weight(2).exclude(["billing"]);
/// # let _ = spread;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Spread {
    /// The group's name (without cluster; the store's cluster qualifies it). Default `default`.
    pub group: String,
    /// This replica's capacity, 1..=[`MAX_WEIGHT`](crate::MAX_WEIGHT); default 1.
    pub weight: u32,
    /// Names this replica leads whenever it is live.
    pub pinned: BTreeSet<String>,
    /// Names this replica never leads.
    pub excluded: BTreeSet<String>,
    /// The membership's timing; by default the first controller's lease options, so that its heartbeat goes
    /// in the statement that renews every lease of the same timing.
    pub membership: Option<LeaseOptions>,
}

impl Spread {
    /// Spreading over group `group`, weight 1, no pins or exclusions.
    pub fn new(group: impl Into<String>) -> Spread {
        Spread {
            group: group.into(),
            weight: 1,
            pinned: BTreeSet::new(),
            excluded: BTreeSet::new(),
            membership: None,
        }
    }

    /// Sets the weight.
    pub fn weight(mut self, weight: u32) -> Spread {
        self.weight = weight;
        self
    }

    /// Pins names to this replica.
    pub fn pin(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> Spread {
        self.pinned.extend(names.into_iter().map(Into::into));
        self
    }

    /// Excludes names from this replica.
    pub fn exclude(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> Spread {
        self.excluded.extend(names.into_iter().map(Into::into));
        self
    }
}

impl Default for Spread {
    fn default() -> Spread {
        Spread::new("default")
    }
}

/// Runs several controllers in one process, each with its own lease; after a loss or a failure a controller
/// re-campaigns after an exponential [`Backoff`] with equal jitter; shutdown stops every loop and releases what
/// is held.
///
/// **Spread by default.** Every supervisor joins the group of its [`Spread`] (`default` unless set) as a member
/// named after its holder, and leads only the names the group's balanced assignment gives it: 3 replicas with
/// 12 controllers lead 4 each, a 4th replica joining takes 3 (one from each), and the names of a replica that
/// stops are spread over the others. A name moves by a cooperative handover: its callback is cancelled
/// ([`TenureEnd::Handover`](super::TenureEnd::Handover)), gets its grace, the tenure is released, and the new
/// owner acquires at once with a larger epoch — every write of the old tenure after that is refused, so a drain
/// that overruns cannot double-write. [`no_spread`](Self::no_spread) gives the former behaviour: every replica
/// campaigns for every name, the first to start leads them all.
pub struct Supervisor<E: Elector> {
    elector: E,
    holder: String,
    backoff: Backoff,
    controllers: Vec<Controller>,
    spread: Option<Spread>,
    status: Arc<Mutex<Status>>,
}

impl<E: Elector> fmt::Debug for Supervisor<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Supervisor")
            .field("holder", &self.holder)
            .field("spread", &self.spread)
            .field(
                "controllers",
                &self.controllers.iter().map(|c| &c.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

#[derive(Debug, Default)]
struct Status {
    leading: BTreeMap<String, bool>,
    group: Option<GroupStatus>,
    /// Tenures handed over, counted by the names' loops.
    handovers: Arc<AtomicU64>,
}

/// Where a spreading supervisor stands in its group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GroupStatus {
    /// The group's name (without cluster).
    pub group: String,
    /// This replica's member name (its holder).
    pub member: String,
    /// Whether it is a live member now.
    pub is_member: bool,
    /// Whether it is settled (may acquire).
    pub settled: bool,
    /// The live members of the group at the last roster read.
    pub members: Vec<String>,
    /// The names the group's assignment gives this replica.
    pub assigned: BTreeSet<String>,
    /// The names this replica leads now.
    pub leading: BTreeSet<String>,
    /// Tenures this replica ended to hand their name over.
    pub handovers: u64,
}

/// Readiness in separate dimensions: the store, per controller whether this process leads it, and for a
/// spreading supervisor, where it stands in its group (which names it leads and which it should lead).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Readiness {
    /// The backing store's health.
    pub store: Health,
    /// Controller name → leading now.
    pub leading: BTreeMap<String, bool>,
    /// The group, when the supervisor spreads.
    pub group: Option<GroupStatus>,
}

/// A handle to a running supervisor's status.
#[derive(Debug, Clone)]
pub struct SupervisorStatus<E: Elector> {
    elector: E,
    status: Arc<Mutex<Status>>,
}

impl<E: Elector> SupervisorStatus<E> {
    /// Which controllers this process leads now.
    pub fn leading(&self) -> BTreeMap<String, bool> {
        lock(&self.status).leading.clone()
    }

    /// Where this replica stands in its group (`None` for a supervisor that does not spread, or before it first
    /// joined).
    pub fn group(&self) -> Option<GroupStatus> {
        let status = lock(&self.status);
        status.group.clone().map(|mut g| {
            g.handovers = status.handovers.load(Ordering::Relaxed);
            g.leading = status
                .leading
                .iter()
                .filter(|(_, led)| **led)
                .map(|(n, _)| n.clone())
                .collect();
            g
        })
    }

    /// Store health, leadership per controller, and the group. It only reads: dropping the future is safe.
    pub async fn readiness(&self) -> Readiness {
        Readiness {
            store: self.elector.health().await,
            leading: self.leading(),
            group: self.group(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<E: Elector> Supervisor<E> {
    /// A supervisor whose leases are held as `holder` (e.g. the pod name: unique per replica), spreading its
    /// controllers over the group `default` ([`spread`](Self::spread), [`no_spread`](Self::no_spread)).
    pub fn new(elector: E, holder: impl Into<String>) -> Supervisor<E> {
        Supervisor {
            elector,
            holder: holder.into(),
            backoff: Backoff::default(),
            controllers: Vec::new(),
            spread: Some(Spread::default()),
            status: Arc::new(Mutex::new(Status::default())),
        }
    }

    /// The re-campaign backoff.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Spreads the controllers over the replicas of `spread`'s group (the default is `Spread::new("default")`).
    pub fn spread(mut self, spread: Spread) -> Self {
        self.spread = Some(spread);
        self
    }

    /// Does not spread: every replica campaigns for every name, and whoever starts first leads them all until
    /// it stops (the behaviour of a plain [`run_with_leadership`](super::run_with_leadership) per name).
    pub fn no_spread(mut self) -> Self {
        self.spread = None;
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
        lock(&self.status).leading.insert(name.clone(), false);
        self.controllers.push(Controller {
            name,
            options,
            factory: Arc::new(move |ctx| Box::pin(run(ctx))),
        });
        self
    }

    /// Adds a controller of `shards` shards: the lease of shard `i` is `<name>/<i>`, each shard is a name of
    /// the group (spread like any other), and `run` is called once per tenure of each shard this replica leads,
    /// with the [`Shard`] and that shard's context — work partitioned by key
    /// ([`shard_of`](super::shard_of), [`Shard::owns`]) is spread over the replicas and fenced per shard.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] when `shards` is 0 or above [`MAX_SHARDS`], or `<name>/<i>` is not a valid lease
    /// name.
    pub fn sharded<F, Fut>(
        mut self,
        name: impl Into<String>,
        shards: u32,
        options: LeadershipOptions,
        run: F,
    ) -> Result<Self>
    where
        F: Fn(Shard, LeaderContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), BoxError>> + Send + 'static,
    {
        let name = name.into();
        if shards == 0 || shards > MAX_SHARDS {
            return Err(Error::invalid(
                "shards",
                format!("must be between 1 and {MAX_SHARDS}, got {shards}"),
            ));
        }
        crate::validate::validate_name(&format!("{name}/{}", shards - 1))?;
        let run = Arc::new(run);
        for index in 0..shards {
            let run = run.clone();
            let shard = Shard {
                index,
                count: shards,
            };
            self = self.controller(format!("{name}/{index}"), options, move |ctx| {
                run(shard, ctx)
            });
        }
        Ok(self)
    }

    /// A status handle usable while [`run`](Self::run) runs.
    pub fn status(&self) -> SupervisorStatus<E> {
        SupervisorStatus {
            elector: self.elector.clone(),
            status: self.status.clone(),
        }
    }

    /// Runs every controller until `shutdown` is cancelled, then returns once every controller stopped and
    /// released its lease (and a spreading supervisor left its group). Each controller's loop runs in a span
    /// `controller` with its name.
    ///
    /// # Errors
    ///
    /// Before anything runs: [`Error::InvalidInput`] for an invalid holder, two controllers of one name, or for a
    /// spreading
    /// supervisor an invalid group, weight, pin or exclusion ([`MemberSpec::validate`]), membership timing, or
    /// an elector that does not support groups. Everything after that is retried, never returned: a replica
    /// that cannot join (another process uses its member name, the database is down) keeps trying and leads
    /// nothing meanwhile.
    ///
    /// # Cancel safety
    ///
    /// Prefer cancelling `shutdown`: it gives every callback its grace period. Dropping the future instead aborts
    /// every campaign: each lease held is released in the background and each callback is aborted at its next
    /// await point, as when [`run_with_leadership`](super::run_with_leadership) is dropped; the membership is left in the
    /// background.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        // The holder is every lease's holder and the member name: refused here, not retried forever.
        crate::validate::validate_holder("holder", &self.holder)?;
        let mut seen = BTreeSet::new();
        if let Some(c) = self.controllers.iter().find(|c| !seen.insert(&c.name)) {
            return Err(Error::invalid(
                "controller",
                format!("{:?} is added twice", c.name),
            ));
        }
        let Some(spread) = self.spread.clone() else {
            self.run_unspread(shutdown).await;
            return Ok(());
        };
        validate_group(&spread.group)?;
        let spec = MemberSpec {
            weight: spread.weight,
            names: self.controllers.iter().map(|c| c.name.clone()).collect(),
            pinned: spread.pinned.clone(),
            excluded: spread.excluded.clone(),
        };
        if self.controllers.is_empty() {
            shutdown.cancelled().await;
            return Ok(());
        }
        spec.validate()?;
        let membership = spread
            .membership
            .unwrap_or(self.controllers[0].options.lease);
        membership.validate()?;
        // How often the roster is read again when nothing announced a change: the shortest poll.
        let poll = self
            .controllers
            .iter()
            .map(|c| c.options.poll_every)
            .min()
            .unwrap_or(Duration::from_secs(5));
        lock(&self.status).group = Some(GroupStatus {
            group: spread.group.clone(),
            member: self.holder.clone(),
            is_member: false,
            settled: false,
            members: Vec::new(),
            assigned: BTreeSet::new(),
            leading: BTreeSet::new(),
            handovers: 0,
        });

        let (view_tx, view_rx) = watch::channel(View::default());
        let handovers = lock(&self.status).handovers.clone();
        let balancer = Balancer {
            elector: self.elector.clone(),
            group: spread.group.clone(),
            holder: self.holder.clone(),
            spec,
            options: membership,
            poll,
            backoff: self.backoff,
            status: self.status.clone(),
        };
        // On shutdown the balancer leaves the group first, and only then stops the names' loops (`names_stop`):
        // the other members, notified of the leave, read the roster and campaign for the names while this
        // replica's callbacks drain, so each release finds its successor already waiting for it (measured: the
        // successor's acquisition then follows the release by a notification and one statement, instead of a
        // roster read and one statement after the leave's notification).
        let names_stop = CancellationToken::new();
        let mut balancer = AbortOnDrop(tokio::spawn(
            balancer
                .run(view_tx, shutdown.clone(), names_stop.clone())
                .instrument(tracing::info_span!("balancer", group = %spread.group)),
        ));
        let mut loops = tokio::task::JoinSet::new();
        for controller in self.controllers {
            let span = tracing::info_span!("controller", controller = %controller.name);
            let name_loop = NameLoop {
                elector: self.elector.clone(),
                holder: self.holder.clone(),
                backoff: self.backoff,
                status: self.status.clone(),
                group: spread.group.clone(),
                handovers: handovers.clone(),
                controller,
            };
            loops.spawn(
                name_loop
                    .run(view_rx.clone(), names_stop.clone())
                    .instrument(span),
            );
        }
        while loops.join_next().await.is_some() {}
        let _ = (&mut balancer.0).await;
        Ok(())
    }

    async fn run_unspread(self, shutdown: CancellationToken) {
        let mut loops = tokio::task::JoinSet::new();
        for controller in self.controllers {
            let (elector, holder, backoff, status, shutdown) = (
                self.elector.clone(),
                self.holder.clone(),
                self.backoff,
                self.status.clone(),
                shutdown.clone(),
            );
            let span = tracing::info_span!("controller", controller = %controller.name);
            loops.spawn(
                campaign(elector, holder, backoff, status, shutdown, controller).instrument(span),
            );
        }
        while loops.join_next().await.is_some() {}
    }
}

/// What the balancer publishes to the names' loops: whether this replica is a live, settled member, and the
/// group's assignment computed from the last roster.
#[derive(Debug, Clone, Default)]
struct View {
    member: bool,
    settled: bool,
    assignment: Assignment,
    settled_members: BTreeSet<String>,
    /// Names another live member holds now.
    held_by_others: BTreeSet<String>,
}

impl View {
    /// A name is campaigned for by `me` only when the assignment gives it to `me` and `me` is a live member that
    /// is settled — or, before it settles, when another member holds the name: that holder hands it over only
    /// once `me` is settled, and `me` is then already waiting for the release (its acquisition follows the
    /// release by a notification and one statement). A free name waits for the settle: replicas started together
    /// all count by then, and the first to start does not take every free name only to hand most of them over.
    fn may_lead(&self, name: &str, me: &str) -> bool {
        self.member
            && self.assignment.owner(name) == Some(me)
            && (self.settled || self.held_by_others.contains(name))
    }

    /// A name `me` leads is handed over when `me` is no longer a member, or the assignment gives it to a
    /// settled member (or to nobody: no live member may lead it). Never to a member that is not settled yet:
    /// the name stays led until its new owner may acquire it, so a handover's gap is the release and one
    /// acquisition, not a settling period.
    fn must_release(&self, name: &str, me: &str) -> bool {
        if !self.member {
            return true;
        }
        match self.assignment.owner(name) {
            Some(owner) if owner == me => false,
            Some(owner) => self.settled_members.contains(owner),
            None => true,
        }
    }
}

/// How long an orderly shutdown waits for the leave before it stops the names' loops anyway.
const LEAVE_WAIT: Duration = Duration::from_secs(5);

/// Keeps this replica a member of its group and publishes the assignment: joins (again after a loss), reads the
/// roster whenever it may have changed — the heartbeat's digest moved, a member joined, left or settled, a lease
/// was released — and at least every `poll`, and leaves the group on shutdown.
struct Balancer<E: Elector> {
    elector: E,
    group: String,
    holder: String,
    spec: MemberSpec,
    options: LeaseOptions,
    poll: Duration,
    backoff: Backoff,
    status: Arc<Mutex<Status>>,
}

impl<E: Elector> Balancer<E> {
    async fn run(
        self,
        view: watch::Sender<View>,
        shutdown: CancellationToken,
        names_stop: CancellationToken,
    ) {
        // However the balancer ends — in order, or aborted with `run`'s future — the names' loops stop too.
        let _stop_names = names_stop.drop_guard();
        // The releases that wake the balancer: of this replica's own names. Other releases in the cluster never
        // touch its share; in a group whose members declare different names, the release of a name this replica
        // cannot lead may shift the others' counts, and the heartbeat's roster digest brings that within a
        // renewal period.
        let own: BTreeSet<String> = self
            .spec
            .names
            .iter()
            .map(|n| self.elector.qualify(n))
            .collect();
        let mut failures = 0u32;
        while !shutdown.is_cancelled() {
            let mut wakeups = self.elector.wakeups();
            let joined = self
                .elector
                .join(&self.group, &self.holder, &self.spec, &self.options)
                .await;
            let mut membership = match joined {
                Ok(membership) => membership,
                Err(e) => {
                    let wait = match &e {
                        Error::MemberTaken { expires_in, .. } => {
                            tracing::warn!(error = %e, "member name in use; joining again when it expires");
                            (*expires_in).min(self.poll)
                        }
                        e if e.is_transient() => {
                            tracing::warn!(error = %e, "joining the group failed; retrying");
                            self.poll
                        }
                        e => {
                            tracing::error!(error = %e, "joining the group refused; retrying");
                            failures += 1;
                            self.backoff.delay(failures)
                        }
                    };
                    self.publish(&view, None, false, false);
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = wakeups.wait_group(&own, wait) => {}
                    }
                    continue;
                }
            };
            failures = 0;
            loop {
                let state = membership.state();
                if !state.live {
                    tracing::warn!(ended = ?state.ended, "membership ended; joining again");
                    self.publish(&view, None, false, false);
                    break;
                }
                match self.elector.roster(&self.group).await {
                    Ok(roster) => self.publish(&view, Some(roster), true, state.settled),
                    Err(e) => tracing::warn!(error = %e, "reading the group's roster failed"),
                }
                tokio::select! {
                    _ = shutdown.cancelled() => {
                        // Bounded: a database that does not answer must not hold the shutdown.
                        match tokio::time::timeout(LEAVE_WAIT, membership.leave()).await {
                            Ok(Ok(_)) => {}
                            Ok(Err(e)) => tracing::warn!(error = %e, "leaving the group failed; it expires after its ttl"),
                            Err(_) => tracing::warn!("leaving the group took longer than {LEAVE_WAIT:?}; it expires after its ttl"),
                        }
                        return;
                    }
                    _ = membership.changed() => {}
                    _ = wakeups.wait_group(&own, self.poll) => {}
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.backoff.delay(0)) => {}
            }
        }
    }

    /// Publishes the assignment computed from `roster` (none: this replica is not a member and leads nothing),
    /// and the status and metrics that go with it.
    fn publish(
        &self,
        view: &watch::Sender<View>,
        roster: Option<Roster>,
        member: bool,
        settled: bool,
    ) {
        let roster = roster.unwrap_or_default();
        let assignment = if member {
            assign(&roster.members, &roster.holders)
        } else {
            Assignment::default()
        };
        let assigned: BTreeSet<String> = assignment
            .names_of(&self.holder)
            .into_iter()
            .map(str::to_owned)
            .collect();
        let settled_members = roster
            .members
            .iter()
            .filter(|m| m.settled)
            .map(|m| m.member.clone())
            .collect();
        let held_by_others = roster
            .holders
            .iter()
            .filter(|(_, holder)| **holder != self.holder)
            .map(|(name, _)| name.clone())
            .collect();
        let group = self.group.clone();
        metrics::gauge!(METRIC_GROUP_MEMBERS, "group" => group.clone())
            .set(roster.members.len() as f64);
        metrics::gauge!(METRIC_GROUP_NAMES_ASSIGNED, "group" => group).set(assigned.len() as f64);
        if let Some(status) = lock(&self.status).group.as_mut() {
            status.is_member = member;
            status.settled = settled;
            status.members = roster.members.iter().map(|m| m.member.clone()).collect();
            status.assigned = assigned;
        }
        view.send_replace(View {
            member,
            settled,
            assignment,
            settled_members,
            held_by_others,
        });
    }
}

/// One name of a spreading supervisor: waits until the assignment gives it to this replica, campaigns, leads,
/// and hands it over when the assignment moves it.
struct NameLoop<E: Elector> {
    elector: E,
    holder: String,
    backoff: Backoff,
    status: Arc<Mutex<Status>>,
    group: String,
    handovers: Arc<AtomicU64>,
    controller: Controller,
}

impl<E: Elector> NameLoop<E> {
    async fn run(self, mut view: watch::Receiver<View>, shutdown: CancellationToken) {
        let name = self.controller.name.clone();
        let mut failures = 0u32;
        loop {
            // Until the assignment gives the name to this replica.
            loop {
                if shutdown.is_cancelled() {
                    return;
                }
                if view.borrow_and_update().may_lead(&name, &self.holder) {
                    break;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    changed = view.changed() => if changed.is_err() { return },
                }
            }
            let token = shutdown.child_token();
            let handover = Arc::new(AtomicBool::new(false));
            let leading = Arc::new(AtomicBool::new(false));
            // Stops the campaign as soon as the name is no longer this replica's to take, and the tenure once its
            // new owner may take it.
            let watcher = tokio::spawn({
                let (mut view, token, handover, leading) = (
                    view.clone(),
                    token.clone(),
                    handover.clone(),
                    leading.clone(),
                );
                let (name, holder, shutdown) =
                    (name.clone(), self.holder.clone(), shutdown.clone());
                async move {
                    loop {
                        if shutdown.is_cancelled() {
                            // An orderly stop, not a handover (the token is the shutdown's child).
                            return;
                        }
                        let stop = {
                            let v = view.borrow_and_update();
                            if leading.load(Ordering::SeqCst) {
                                v.must_release(&name, &holder)
                            } else {
                                !v.may_lead(&name, &holder)
                            }
                        };
                        if stop {
                            handover.store(true, Ordering::SeqCst);
                            token.cancel();
                            return;
                        }
                        if view.changed().await.is_err() {
                            return;
                        }
                    }
                }
            });
            let result = run_leadership(
                &self.elector,
                &name,
                &self.holder,
                &self.controller.options,
                &token,
                Some(handover.clone()),
                self.callback(leading.clone()),
            )
            .await;
            watcher.abort();
            self.set_leading(false);
            if shutdown.is_cancelled() {
                return;
            }
            if handover.load(Ordering::SeqCst) {
                if leading.load(Ordering::SeqCst) {
                    self.handovers.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!(METRIC_HANDOVERS, "group" => self.group.clone()).increment(1);
                    tracing::info!(controller = %name, "handed over");
                }
                failures = 0;
                continue;
            }
            let delay = match result {
                Ok(Ended::Cancelled { .. }) => continue,
                Ok(Ended::Returned) | Ok(Ended::Lost { .. }) => {
                    if let Ok(Ended::Lost { cause, .. }) = &result {
                        tracing::warn!(controller = %name, %cause, "re-campaigning after loss");
                    }
                    failures = 0;
                    self.backoff.delay(0)
                }
                Ok(Ended::Failed(e)) => {
                    tracing::error!(controller = %name, error = %e, "controller failed");
                    failures += 1;
                    self.backoff.delay(failures)
                }
                Ok(Ended::Panicked(message)) => {
                    tracing::error!(controller = %name, %message, "controller panicked");
                    failures += 1;
                    self.backoff.delay(failures)
                }
                Err(e) => {
                    tracing::error!(controller = %name, error = %e, "campaign failed");
                    failures += 1;
                    self.backoff.delay(failures)
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    fn set_leading(&self, value: bool) {
        set_leading(&self.status, &self.controller.name, value);
        let led = lock(&self.status).leading.values().filter(|l| **l).count();
        metrics::gauge!(METRIC_GROUP_NAMES_LED, "group" => self.group.clone()).set(led as f64);
    }

    /// The controller's callback, marking the name led from the tenure's start until its end, and recording how
    /// long the name had no holder when its previous tenure was handed over.
    fn callback(
        &self,
        leading: Arc<AtomicBool>,
    ) -> impl FnOnce(LeaderContext) -> BoxFuture<std::result::Result<(), BoxError>> {
        let (factory, status, name) = (
            self.controller.factory.clone(),
            self.status.clone(),
            self.controller.name.clone(),
        );
        let (elector, group) = (self.elector.clone(), self.group.clone());
        move |ctx: LeaderContext| {
            leading.store(true, Ordering::SeqCst);
            set_leading(&status, &name, true);
            let led = lock(&status).leading.values().filter(|l| **l).count();
            metrics::gauge!(METRIC_GROUP_NAMES_LED, "group" => group.clone()).set(led as f64);
            let token = ctx.cancellation_token();
            let epoch = ctx.epoch();
            tokio::spawn(async move {
                if let Some(gap) = elector.handover_gap(&name, epoch).await {
                    metrics::histogram!(METRIC_HANDOVER_GAP, "group" => group)
                        .record(gap.as_secs_f64());
                }
                token.cancelled().await;
                set_leading(&status, &name, false);
            });
            factory(ctx)
        }
    }
}

/// Aborts the balancer when `run` is dropped midway (the names' loops, in a `JoinSet`, are aborted with it): its
/// membership is then dropped, which leaves the group in the background.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn set_leading(status: &Mutex<Status>, name: &str, value: bool) {
    lock(status).leading.insert(name.to_owned(), value);
}

async fn campaign<E: Elector>(
    elector: E,
    holder: String,
    backoff: Backoff,
    status: Arc<Mutex<Status>>,
    shutdown: CancellationToken,
    controller: Controller,
) {
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        let factory = controller.factory.clone();
        let status_flag = status.clone();
        let name = controller.name.clone();
        let result = run_leadership(
            &elector,
            &controller.name,
            &holder,
            &controller.options,
            &shutdown,
            None,
            move |ctx| {
                set_leading(&status_flag, &name, true);
                // Not leading from the moment the tenure ends (loss or shutdown), not only once the callback
                // has returned.
                let token = ctx.cancellation_token();
                tokio::spawn(async move {
                    token.cancelled().await;
                    set_leading(&status_flag, &name, false);
                });
                factory(ctx)
            },
        )
        .await;
        set_leading(&status, &controller.name, false);
        let delay = match result {
            Ok(Ended::Cancelled { .. }) => break,
            Ok(Ended::Returned) => {
                failures = 0;
                backoff.delay(0)
            }
            Ok(Ended::Lost { cause, .. }) => {
                tracing::warn!(controller = %controller.name, %cause, "re-campaigning after loss");
                failures = 0;
                backoff.delay(0)
            }
            Ok(Ended::Failed(e)) => {
                tracing::error!(controller = %controller.name, error = %e, "controller failed");
                failures += 1;
                backoff.delay(failures)
            }
            Ok(Ended::Panicked(message)) => {
                tracing::error!(controller = %controller.name, %message, "controller panicked");
                failures += 1;
                backoff.delay(failures)
            }
            Err(e) => {
                tracing::error!(controller = %controller.name, error = %e, "campaign failed");
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
