//! [`Supervisor`]: several controllers, each with its own lease, restarted with backoff — by default spread over
//! the replicas of a group ([`Spread`]): every replica joins the group, every member derives the same balanced
//! assignment of names from the group's roster ([`assign`](super::assign())), and each name is led by the member
//! it is assigned to, handed over cooperatively (drain, release, the successor acquires at once) when the
//! assignment moves it.

use std::collections::BTreeSet;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::backoff::Backoff;
use super::options::LeaseOptions;
use super::run::{LeaderContext, LeadershipOptions};
use super::Elector;
use crate::error::{Error, Result};
use crate::limits::MAX_SHARDS;
use crate::membership::{validate_group, MemberSpec};

mod campaign;
mod spread;
mod status;

pub use campaign::BoxError;
use campaign::{campaign, Controller};
use spread::{AbortOnDrop, Balancer, NameLoopParts, Names, View};
use status::{lock, Status};
pub use status::{GroupStatus, Readiness, SupervisorStatus};

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
    /// This replica's capacity, 1..=[`MAX_WEIGHT`](crate::limits::MAX_WEIGHT); default 1.
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
/// that overruns cannot double-write. [`no_spread`](Self::no_spread) turns spreading off: every replica
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
            generation: 0,
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
        let names = Names {
            template: NameLoopParts {
                elector: self.elector.clone(),
                holder: self.holder.clone(),
                backoff: self.backoff,
                status: self.status.clone(),
                group: spread.group.clone(),
                handovers,
            },
            controllers: self
                .controllers
                .into_iter()
                .map(|c| (c.name.clone(), c))
                .collect(),
        };
        // Aborted with `run`'s future like the balancer (its loops, in a `JoinSet`, with it).
        let mut names = AbortOnDrop(tokio::spawn(names.run(view_rx, names_stop)));
        let _ = (&mut names.0).await;
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
