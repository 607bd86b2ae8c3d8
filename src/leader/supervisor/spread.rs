//! A spreading supervisor's three kinds of task: the [`Balancer`], which keeps this replica a member of its
//! group, rebalances the group when its turn comes, and publishes this replica's names of the stored assignment
//! ([`View`]); the [`Names`] manager, which runs a [`NameLoop`] for each name this replica is assigned or still
//! leads (not one per name the group has: a fleet's replica declares thousands); and the loops themselves, each
//! leading its name while the assignment gives it to this replica and handing it over when it moves.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::campaign::{BoxError, Controller};
use super::status::{lock, set_leading, Status};
use crate::error::Error;
use crate::leader::backoff::Backoff;
use crate::leader::group::{Assigned, Membership};
use crate::leader::held::{GroupEvent, GroupWake};
use crate::leader::options::LeaseOptions;
use crate::leader::run::{run_leadership, Ended, LeaderContext};
use crate::leader::{BoxFuture, Elector};
use crate::membership::{MemberSpec, Rebalance};
use crate::metrics::{
    METRIC_GROUP_ASSIGNED_TO_LED, METRIC_GROUP_MEMBERS, METRIC_GROUP_NAMES_ASSIGNED,
    METRIC_GROUP_NAMES_LED, METRIC_HANDOVERS, METRIC_HANDOVER_GAP,
};

/// What the balancer publishes to the names: this replica's part of the group's stored assignment.
#[derive(Debug, Clone, Default)]
pub(super) struct View {
    /// Read since the last (re)join: the names below are the group's word. While it is not — the membership
    /// was lost and is being joined again —, a name this replica leads stays led (its lease still fences it;
    /// handing it over would hand it to nobody) and no other is taken.
    pub(super) known: bool,
    /// The names the stored assignment gives this replica.
    pub(super) assigned: BTreeSet<String>,
}

impl View {
    /// A name is campaigned for only when the stored assignment, as read since the last join, gives it to this
    /// replica. The assignment counts only settled members (or ones that kept their names across a rejoin), so
    /// the names of replicas started together are assigned once, after the quiet time.
    fn may_lead(&self, name: &str) -> bool {
        self.known && self.assigned.contains(name)
    }

    /// A name this replica leads is handed over when the stored assignment, as read since the last join, no
    /// longer gives it to this replica: its new owner has been told on the group's channel and is waiting for
    /// the release.
    fn must_release(&self, name: &str) -> bool {
        self.known && !self.assigned.contains(name)
    }
}

/// How long an orderly shutdown waits for the leave before it stops the names' loops anyway.
const LEAVE_WAIT: Duration = Duration::from_secs(5);

/// How long an orderly shutdown, once it left, waits for the group's assignment without it before it stops the
/// names' loops anyway (the leave makes the assignment due at once: a claim, one computation, one write).
const SUCCESSOR_WAIT: Duration = Duration::from_secs(2);

/// The longest random delay before a member asks for a claim that just became due: members that learn of it
/// together (from the group's channel, or heartbeats of one moment) do not all ask at once. Short next to the
/// quiet time, and one ask costs one indexed read when another member got the claim.
const CLAIM_SPREAD: Duration = Duration::from_millis(200);

/// Keeps this replica a member of its group and publishes its names: joins (again after a loss), reads its names
/// whenever the stored assignment is newer than its last read (the group's channel says `assigned`, a heartbeat
/// tells the generation), asks for the rebalance when one is due (the channel says `changed`, a heartbeat says
/// when), and leaves the group on shutdown.
pub(super) struct Balancer<E: Elector> {
    pub(super) elector: E,
    pub(super) group: String,
    pub(super) holder: String,
    pub(super) spec: MemberSpec,
    pub(super) options: LeaseOptions,
    pub(super) poll: Duration,
    pub(super) backoff: Backoff,
    pub(super) status: Arc<Mutex<Status>>,
}

/// Where the balancer's loop stands with the group, between two events.
#[derive(Debug, Default)]
struct Progress {
    /// The generation of the last read of this replica's names (`None`: read again).
    read: Option<i64>,
    /// When to ask for the rebalance next (`None`: nothing pending that this replica knows of).
    ask_at: Option<tokio::time::Instant>,
    /// The last rebalance time a heartbeat told, so that a repeat of it does not re-arm the ask.
    told: Option<std::time::Instant>,
}

impl<E: Elector> Balancer<E> {
    pub(super) async fn run(
        self,
        view: watch::Sender<View>,
        shutdown: CancellationToken,
        names_stop: CancellationToken,
    ) {
        // However the balancer ends — in order, or aborted with `run`'s future — the names' loops stop too.
        let _stop_names = names_stop.drop_guard();
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
                    self.unknown(&view);
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    continue;
                }
            };
            failures = 0;
            self.set_member(true, membership.state().settled);
            if self
                .member_loop(&mut membership, &mut wakeups, &view, &shutdown)
                .await
            {
                let (channel, generation) = (membership.channel(), membership.state().generation);
                // Bounded: a database that does not answer must not hold the shutdown.
                match tokio::time::timeout(LEAVE_WAIT, membership.leave()).await {
                    Ok(Ok(_)) => self.await_successors(&mut wakeups, &channel, generation).await,
                    Ok(Err(e)) => tracing::warn!(error = %e, "leaving the group failed; it expires after its ttl"),
                    Err(_) => tracing::warn!("leaving the group took longer than {LEAVE_WAIT:?}; it expires after its ttl"),
                }
                return;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.backoff.delay(0)) => {}
            }
        }
    }

    /// While `membership` is live: reads this replica's names when they may have changed, asks for the
    /// rebalance when it is due, and reacts to the group's channel. Returns true on shutdown (the caller
    /// leaves), false when the membership ended (join again).
    async fn member_loop(
        &self,
        membership: &mut Membership,
        wakeups: &mut crate::leader::Wakeups,
        view: &watch::Sender<View>,
        shutdown: &CancellationToken,
    ) -> bool {
        let channel = membership.channel();
        let mut at = Progress::default();
        loop {
            let state = membership.state();
            if !state.live {
                tracing::warn!(ended = ?state.ended, "membership ended; joining again");
                self.unknown(view);
                return false;
            }
            self.set_member(true, state.settled);
            if state.rebalance_at != at.told {
                at.told = state.rebalance_at;
                if let Some(when) = state.rebalance_at {
                    at.ask_at = Some(tokio::time::Instant::from_std(when) + spread());
                }
            }
            if at.read.is_none_or(|read| state.generation > read) {
                match self.elector.assigned(membership).await {
                    Ok(assigned) => {
                        at.read = Some(assigned.generation);
                        self.publish(view, assigned);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "reading this member's names failed; retrying");
                        at.ask_at = Some(
                            tokio::time::Instant::now() + self.poll.min(Duration::from_secs(1)),
                        );
                    }
                }
            }
            if at.ask_at.is_some_and(|t| t <= tokio::time::Instant::now()) {
                at.ask_at = self.ask(membership).await;
            }
            let wake_at = at
                .ask_at
                .unwrap_or_else(|| tokio::time::Instant::now() + self.poll);
            tokio::select! {
                _ = shutdown.cancelled() => return true,
                _ = membership.changed() => {}
                event = wakeups.group_event(&channel, wake_at) => match event {
                    Some(GroupEvent::Group(GroupWake::Assigned(generation))) => membership.note_generation(generation),
                    // Asked when it may be claimed, not now: a rolling start's every join would otherwise wake
                    // every member to ask. (At most a poll period later: the payload only tells when.)
                    Some(GroupEvent::Group(GroupWake::Changed(due_in))) => {
                        at.ask_at = Some(tokio::time::Instant::now() + due_in.min(self.poll) + spread());
                    }
                    Some(GroupEvent::Missed) => {
                        at.read = None;
                        at.ask_at.get_or_insert_with(|| tokio::time::Instant::now() + spread());
                    }
                    None => {}
                },
            }
        }
    }

    /// After an orderly leave, before the names' loops stop: waits (at most [`SUCCESSOR_WAIT`]) until the group
    /// stored the assignment without this replica, so that each of its names has a successor campaigning — having
    /// read its names — when the release comes, and the handover costs a notification, not a rebalance. Not when
    /// this replica was the only member counted (nobody is there to take over).
    async fn await_successors(
        &self,
        wakeups: &mut crate::leader::Wakeups,
        channel: &str,
        generation: i64,
    ) {
        if lock(&self.status).counted <= 1 {
            return;
        }
        let until = tokio::time::Instant::now() + SUCCESSOR_WAIT;
        loop {
            match wakeups.group_event(channel, until).await {
                Some(GroupEvent::Group(GroupWake::Assigned(g))) if g > generation => return,
                Some(GroupEvent::Group(_)) => {}
                // Something may have been missed, or the wait ran out: stop waiting.
                Some(GroupEvent::Missed) | None => return,
            }
        }
    }

    /// Asks for the group's rebalance (and does it when this member gets the claim); answers when to ask again.
    async fn ask(&self, membership: &Membership) -> Option<tokio::time::Instant> {
        let now = tokio::time::Instant::now();
        match self.elector.rebalance(membership).await {
            Ok(Rebalance::Assigned { generation }) => {
                tracing::debug!(generation, "stored the group's next assignment");
                None
            }
            Ok(Rebalance::NotDue { wait }) => wait.map(|w| now + w + spread()),
            Ok(Rebalance::Claimed { wait }) => Some(now + wait + spread()),
            // Another member stored meanwhile, or the inputs moved under the computation: ask again soon (the
            // answer then says whether anything is still due).
            Ok(Rebalance::Stale | Rebalance::NotClaimed | Rebalance::Claim { .. }) => {
                Some(now + spread())
            }
            Err(e) => {
                tracing::warn!(error = %e, "rebalancing the group failed; asking again");
                Some(now + self.poll.min(Duration::from_secs(1)))
            }
        }
    }

    /// The membership was lost or not joined yet: this replica's names are not known; it holds what it leads
    /// and takes nothing new until it has read them again.
    fn unknown(&self, view: &watch::Sender<View>) {
        self.set_member(false, false);
        view.send_modify(|v| v.known = false);
    }

    fn set_member(&self, member: bool, settled: bool) {
        let mut status = lock(&self.status);
        if let Some(group) = status.group.as_mut() {
            group.is_member = member;
            group.settled = settled;
            status.member.send_if_modified(|was| {
                let changed = *was != Some(member);
                *was = Some(member);
                changed
            });
        }
    }

    /// Publishes this replica's names, and the status and metrics that go with them.
    fn publish(&self, view: &watch::Sender<View>, assigned: Assigned) {
        let group = self.group.clone();
        metrics::gauge!(METRIC_GROUP_MEMBERS, "group" => group.clone())
            .set(assigned.members as f64);
        metrics::gauge!(METRIC_GROUP_NAMES_ASSIGNED, "group" => group)
            .set(assigned.names.len() as f64);
        let mut status = lock(&self.status);
        status.counted = assigned.members;
        if let Some(group) = status.group.as_mut() {
            group.generation = assigned.generation;
            group.assigned = assigned.names.clone();
        }
        drop(status);
        view.send_replace(View {
            known: true,
            assigned: assigned.names,
        });
    }
}

/// A uniformly random delay in `0..CLAIM_SPREAD`.
fn spread() -> Duration {
    CLAIM_SPREAD.mul_f64(fastrand::f64())
}

/// Runs a [`NameLoop`] for each name this replica is assigned, and keeps the loop of a name it still leads until
/// that loop hands the name over: so a replica runs as many loops as it has names, not as many as the group.
pub(super) struct Names<E: Elector> {
    pub(super) template: NameLoopParts<E>,
    pub(super) controllers: HashMap<String, Controller>,
}

/// What every name's loop shares.
pub(super) struct NameLoopParts<E: Elector> {
    pub(super) elector: E,
    pub(super) holder: String,
    pub(super) backoff: Backoff,
    pub(super) status: Arc<Mutex<Status>>,
    pub(super) group: String,
    pub(super) handovers: Arc<AtomicU64>,
}

impl<E: Elector> Names<E> {
    pub(super) async fn run(self, mut view: watch::Receiver<View>, stop: CancellationToken) {
        let mut loops = tokio::task::JoinSet::new();
        let mut running: HashMap<tokio::task::Id, String> = HashMap::new();
        let mut names: BTreeSet<String> = BTreeSet::new();
        loop {
            if stop.is_cancelled() {
                break;
            }
            let assigned = view.borrow_and_update().assigned.clone();
            for name in assigned {
                if names.contains(&name) {
                    continue;
                }
                let Some(controller) = self.controllers.get(&name) else {
                    // Assigned a name this replica did not declare: the group's other members declared it; a
                    // member's assignment only ever holds names it declared, but never trust it blindly.
                    continue;
                };
                let name_loop = NameLoop {
                    elector: self.template.elector.clone(),
                    holder: self.template.holder.clone(),
                    backoff: self.template.backoff,
                    status: self.template.status.clone(),
                    group: self.template.group.clone(),
                    handovers: self.template.handovers.clone(),
                    controller: controller.clone(),
                };
                let span = tracing::info_span!("controller", controller = %name);
                let handle = loops.spawn(tracing::Instrument::instrument(
                    name_loop.run(view.clone(), stop.clone()),
                    span,
                ));
                running.insert(handle.id(), name.clone());
                names.insert(name);
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                changed = view.changed() => if changed.is_err() { break },
                Some(done) = loops.join_next_with_id() => {
                    let id = match done {
                        Ok((id, ())) => id,
                        Err(e) => e.id(),
                    };
                    if let Some(name) = running.remove(&id) {
                        names.remove(&name);
                    }
                }
            }
        }
        while loops.join_next().await.is_some() {}
    }
}

/// One name of a spreading supervisor: while the assignment gives it to this replica, campaigns and leads; hands
/// it over when the assignment moves it; ends when the name is neither assigned nor led.
pub(super) struct NameLoop<E: Elector> {
    pub(super) elector: E,
    pub(super) holder: String,
    pub(super) backoff: Backoff,
    pub(super) status: Arc<Mutex<Status>>,
    pub(super) group: String,
    pub(super) handovers: Arc<AtomicU64>,
    pub(super) controller: Controller,
}

impl<E: Elector> NameLoop<E> {
    pub(super) async fn run(self, mut view: watch::Receiver<View>, shutdown: CancellationToken) {
        let name = self.controller.name.clone();
        let mut failures = 0u32;
        // The name arrived in this replica's assignment now: its first tenure records how long it took.
        let mut assigned_at = Some(std::time::Instant::now());
        loop {
            // Only while the assignment gives the name to this replica: otherwise the loop ends (the manager
            // starts another when the name comes back).
            if shutdown.is_cancelled() || !view.borrow_and_update().may_lead(&name) {
                return;
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
                let (name, shutdown) = (name.clone(), shutdown.clone());
                async move {
                    loop {
                        if shutdown.is_cancelled() {
                            // An orderly stop, not a handover (the token is the shutdown's child).
                            return;
                        }
                        let stop = {
                            let v = view.borrow_and_update();
                            if leading.load(Ordering::SeqCst) {
                                v.must_release(&name)
                            } else {
                                !v.may_lead(&name)
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
                self.callback(leading.clone(), assigned_at.take()),
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
                    if let Ok(Ended::Lost { end, .. }) = &result {
                        tracing::warn!(controller = %name, cause = %end, "re-campaigning after loss");
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
    ///
    /// `assigned_at`: when the name arrived in this replica's assignment, for the loop's first campaign only.
    fn callback(
        &self,
        leading: Arc<AtomicBool>,
        assigned_at: Option<std::time::Instant>,
    ) -> impl FnOnce(LeaderContext) -> BoxFuture<std::result::Result<(), BoxError>> {
        let (factory, status, name) = (
            self.controller.factory.clone(),
            self.status.clone(),
            self.controller.name.clone(),
        );
        let (elector, group) = (self.elector.clone(), self.group.clone());
        move |ctx: LeaderContext| {
            if let Some(assigned_at) = assigned_at {
                metrics::histogram!(METRIC_GROUP_ASSIGNED_TO_LED, "group" => group.clone())
                    .record(assigned_at.elapsed().as_secs_f64());
            }
            leading.store(true, Ordering::SeqCst);
            set_leading(&status, &name, true);
            let led = lock(&status).leading.values().filter(|l| **l).count();
            metrics::gauge!(METRIC_GROUP_NAMES_LED, "group" => group.clone()).set(led as f64);
            let token = ctx.cancellation_token();
            let epoch = ctx.epoch();
            let known_gap = ctx.first_reads().gap;
            tokio::spawn(async move {
                let gap = match known_gap {
                    Some(gap) => gap,
                    None => elector.handover_gap(&name, epoch).await,
                };
                if let Some(gap) = gap {
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
pub(super) struct AbortOnDrop(pub(super) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
