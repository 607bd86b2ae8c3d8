//! A spreading supervisor's two kinds of task: the [`Balancer`], which keeps this replica a member of its group
//! and publishes the group's assignment ([`View`]), and one [`NameLoop`] per controller, which leads its name
//! while the assignment gives it to this replica and hands it over when the assignment moves it.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::campaign::{BoxError, Controller};
use super::status::{lock, set_leading, Status};
use crate::error::Error;
use crate::leader::assign::{assign, Assignment};
use crate::leader::backoff::Backoff;
use crate::leader::options::LeaseOptions;
use crate::leader::run::{run_leadership, Ended, LeaderContext};
use crate::leader::{BoxFuture, Elector};
use crate::membership::{MemberSpec, Roster};
use crate::metrics::{
    METRIC_GROUP_MEMBERS, METRIC_GROUP_NAMES_ASSIGNED, METRIC_GROUP_NAMES_LED, METRIC_HANDOVERS,
    METRIC_HANDOVER_GAP,
};

/// What the balancer publishes to the names' loops: whether this replica is a live, settled member, and the
/// group's assignment computed from the last roster.
#[derive(Debug, Clone, Default)]
pub(super) struct View {
    pub(super) member: bool,
    pub(super) settled: bool,
    pub(super) assignment: Assignment,
    pub(super) settled_members: BTreeSet<String>,
    /// Names another live member holds now.
    pub(super) held_by_others: BTreeSet<String>,
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

impl<E: Elector> Balancer<E> {
    pub(super) async fn run(
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
pub(super) struct AbortOnDrop(pub(super) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
