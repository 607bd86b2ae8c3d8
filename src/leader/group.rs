//! A membership as the runtime holds it: [`Membership`], heartbeated in the background with the member's leases
//! (one statement per tick), and its state ([`MemberState`]) for the balancer.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::BoxFuture;
use crate::error::Result;
use crate::membership::{GroupNews, Member};

/// The end of a membership this process left in order ([`Membership::leave`]).
const LEFT: &str = "left";
/// The end of a membership this process dropped (it leaves the group in the background).
const DROPPED: &str = "dropped";

/// Where a membership stands, as this process sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemberState {
    /// Counted by the database as of the last heartbeat, and its local deadline has not passed.
    pub live: bool,
    /// Settled: the group's assignment counts it.
    pub settled: bool,
    /// The generation of the group's stored assignment, as the last heartbeat or notification told it: when it
    /// is newer than what the member read, the member reads its names again.
    pub generation: i64,
    /// By the monotonic clock: when the group's next assignment may be computed, as the last heartbeat told it
    /// (`None`: none pending).
    pub rebalance_at: Option<Instant>,
    /// Why the membership ended, once it has.
    pub ended: Option<String>,
}

/// How a backend ends a membership in its store.
pub(super) trait Leaver: Send + Sync + fmt::Debug {
    fn leave(&self, member: Member) -> BoxFuture<Result<bool>>;
}

/// State shared by a [`Membership`], its renewal group and the elector.
pub(super) struct MemberShared {
    pub(super) member: Mutex<Member>,
    pub(super) margin: Duration,
    pub(super) state: watch::Sender<MemberState>,
    /// The error of the last heartbeat attempt, the detail of a deadline loss.
    last_error: Mutex<Option<String>>,
}

impl fmt::Debug for MemberShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let member = self.member.lock().unwrap_or_else(|p| p.into_inner());
        f.debug_struct("MemberShared")
            .field("group", &member.qualified_group())
            .field("member", &member.member())
            .field("state", &*self.state.borrow())
            .finish()
    }
}

impl MemberShared {
    pub(super) fn new(member: Member, margin: Duration) -> Arc<MemberShared> {
        let settled = member.settled();
        let news = member.news_at_join();
        Arc::new(MemberShared {
            member: Mutex::new(member),
            margin,
            state: watch::channel(MemberState {
                live: true,
                settled,
                generation: news.generation,
                rebalance_at: news.rebalance_in.map(|wait| Instant::now() + wait),
                ended: None,
            })
            .0,
            last_error: Mutex::new(None),
        })
    }

    pub(super) fn member(&self) -> Member {
        self.member
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// By the monotonic clock: the instant this process stops counting itself a member (send time of the last
    /// good heartbeat + ttl − margin).
    pub(super) fn trust_until(&self) -> Instant {
        let deadline = self
            .member
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .local_deadline();
        deadline.checked_sub(self.margin).unwrap_or(deadline)
    }

    /// Live and before its local deadline; declares the end at the deadline.
    pub(super) fn is_current(&self) -> bool {
        if !self.state.borrow().live {
            return false;
        }
        if Instant::now() >= self.trust_until() {
            let detail = self
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            self.end(match detail {
                Some(e) => format!("no heartbeat before the local deadline (last error: {e})"),
                None => "no heartbeat before the local deadline".to_owned(),
            });
            return false;
        }
        true
    }

    pub(super) fn set_last_error(&self, error: Option<String>) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = error;
    }

    /// A heartbeat sent at `sent` answered `renewed` with the group's news.
    pub(super) fn renewed(&self, sent: Instant, settled: bool, news: GroupNews) {
        if !self.state.borrow().live {
            return;
        }
        self.member
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .renewed(sent, settled);
        self.set_last_error(None);
        // The database's duration placed on this process's clock from the send time: never later than the
        // database meant.
        let rebalance_at = news.rebalance_in.map(|wait| sent + wait);
        self.state.send_if_modified(|s| {
            let changed = s.settled != settled
                || news.generation > s.generation
                || s.rebalance_at.is_some() != rebalance_at.is_some();
            s.settled = settled;
            s.generation = s.generation.max(news.generation);
            s.rebalance_at = rebalance_at;
            changed
        });
    }

    /// The group announced (or this member stored) assignment `generation`.
    pub(crate) fn note_generation(&self, generation: i64) {
        self.state.send_if_modified(|s| {
            let newer = generation > s.generation;
            s.generation = s.generation.max(generation);
            newer
        });
    }

    /// The membership ended (refused, deadline, left); the first cause stands. Logged as a warning, but for
    /// this process's own leave or drop (an orderly stop), which is logged at info level.
    pub(super) fn end(&self, why: String) -> bool {
        self.state.send_if_modified(|s| {
            if !s.live {
                return false;
            }
            if why == LEFT || why == DROPPED {
                tracing::info!(why = %why, "membership ended");
            } else {
                tracing::warn!(why = %why, "membership ended");
            }
            s.live = false;
            s.settled = false;
            s.ended = Some(why);
            true
        })
    }
}

/// A membership of a replica group this process holds, heartbeated in the background (by a
/// [`PgElector`](super::PgElector), in the statement that renews the member's leases of the same timing).
///
/// It gives the membership's state ([`state`](Self::state), [`changed`](Self::changed)); dropping it leaves the
/// group in the background, [`leave`](Self::leave) does it in order.
pub struct Membership {
    pub(super) shared: Arc<MemberShared>,
    leaver: Option<Arc<dyn Leaver>>,
    watch: watch::Receiver<MemberState>,
}

impl fmt::Debug for Membership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Membership")
            .field("shared", &self.shared)
            .finish()
    }
}

impl Membership {
    pub(super) fn new(shared: Arc<MemberShared>, leaver: Arc<dyn Leaver>) -> Membership {
        let watch = shared.state.subscribe();
        Membership {
            shared,
            leaver: Some(leaver),
            watch,
        }
    }

    /// The member name.
    pub fn member(&self) -> String {
        self.shared.member().member().to_owned()
    }

    /// The cluster-qualified group name.
    pub fn qualified_group(&self) -> String {
        self.shared.member().qualified_group().to_owned()
    }

    /// The membership as data (group, member name, incarnation, secret): what the elector's group calls present.
    pub(crate) fn member_data(&self) -> Member {
        self.shared.member()
    }

    /// The group's notification channel ([`Member::channel`]).
    pub fn channel(&self) -> String {
        self.shared.member().channel().to_owned()
    }

    /// Records that the group's stored assignment is at `generation` (announced on its channel, or stored by
    /// this member): [`state`](Self::state)'s `generation` never goes back.
    pub fn note_generation(&self, generation: i64) {
        self.shared.note_generation(generation);
    }

    /// The incarnation the database issued at the join.
    pub fn incarnation(&self) -> i64 {
        self.shared.member().incarnation()
    }

    /// The state now; `live` is false from the local deadline on, even before a timer said so.
    pub fn state(&self) -> MemberState {
        self.shared.is_current();
        self.shared.state.borrow().clone()
    }

    /// Completes at the next change of [`state`](Self::state) (or at once when one happened since the last
    /// call). Cancel safe.
    pub async fn changed(&mut self) {
        if self.watch.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Leaves the group now (an orderly end: the other members rebalance at once, and the next join under the
    /// name is no flap). Returns false when the membership had already ended.
    ///
    /// # Errors
    ///
    /// As [`Groups::leave`](crate::groups::Groups::leave).
    pub async fn leave(mut self) -> Result<bool> {
        let Some(leaver) = self.leaver.take() else {
            return Ok(false);
        };
        let was_live = self.shared.state.borrow().live;
        self.shared.end(LEFT.to_owned());
        if !was_live {
            return Ok(false);
        }
        leaver.leave(self.shared.member()).await
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        let Some(leaver) = self.leaver.take() else {
            return;
        };
        let was_live = self.shared.state.borrow().live;
        self.shared.end(DROPPED.to_owned());
        if was_live {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let member = self.shared.member();
                runtime.spawn(async move {
                    if let Err(e) = leaver.leave(member).await {
                        tracing::debug!(error = %e, "leaving the group in the background failed");
                    }
                });
            }
        }
    }
}

/// A member's own part of its group's stored assignment ([`Elector::assigned`](super::Elector::assigned)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Assigned {
    /// The generation of the stored assignment read.
    pub generation: i64,
    /// The names it gives this member.
    pub names: std::collections::BTreeSet<String>,
    /// How many members it counts.
    pub members: usize,
}
