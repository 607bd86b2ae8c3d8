//! The PostgreSQL [`Elector`](super::Elector): acquisition with a new tenure's first reads (`acquire`), batched
//! renewal on a connection of its own
//! (`renew`), release announcements and the groups' news through LISTEN/NOTIFY (`listen`), and the group's
//! rebalance (`rebalance`).
//!
//! SQL: `pgfence.acquire_many`, `pgfence.renew_many` and the `pgfence_lease_free` notification of `pgfence.release` and
//! `pgfence.force_release`, in `migrations/2026-11-30-000002_lease_protocol/up.sql`; the group calls of
//! `migrations/2026-11-30-000005_membership/up.sql`.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::broadcast;

use super::group::{Assigned, Leaver, MemberShared, Membership};
use super::held::{
    AcquisitionTurn, BeliefReporter, Health, HeldLease, Releaser, Shared, Wake, Wakeups,
};
use super::options::LeaseOptions;
use super::BoxFuture;
use super::Elector;
use crate::error::{Error, Result};
use crate::history::queue::BeliefQueue;
use crate::lease::{Lease, Released};
use crate::membership::{Member, MemberSpec, NameSets, Rebalance};
use crate::store::Store;
use listen::{listen, warm_lease_names, Channels, LeaseKeys, Reading};
use renew::{GroupKey, Renewals};

mod acquire;
mod listen;
mod rebalance;
mod renew;

/// The PostgreSQL [`Elector`]: leases in `pgfence.leases`, renewed in batches, woken by LISTEN/NOTIFY.
/// Create one per process and clone it.
#[derive(Clone, Debug)]
pub struct PgElector {
    inner: Arc<PgInner>,
}

#[derive(Debug)]
struct PgInner {
    store: Store,
    /// Belief reports, batched (made on the runtime of the first acquisition).
    beliefs: OnceLock<Arc<BeliefQueue>>,
    /// Lock key → lease name, for the release listener (a notification carries the key): warmed with the names
    /// a member is assigned and with each name an acquisition found held (`warm_lease_names`), so that a
    /// release is never waited on behind a lookup.
    lease_names: Arc<LeaseKeys>,
    renewals: Arc<Renewals>,
    notifications: OnceLock<broadcast::Sender<Wake>>,
    listener: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The channels of the groups this process joined, for the listener.
    channels: Arc<Channels>,
    /// The name sets read for rebalances (each once).
    name_sets: NameSets,
    /// Turns to send an acquisition: as many as the store's pool has connections (see
    /// [`Elector::acquisition_turn`]).
    turns: Arc<tokio::sync::Semaphore>,
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

impl PgElector {
    /// An elector on `store`.
    pub fn new(store: Store) -> PgElector {
        PgElector {
            inner: Arc::new(PgInner {
                renewals: Arc::new(Renewals::new(store.clone())),
                beliefs: OnceLock::new(),
                turns: Arc::new(tokio::sync::Semaphore::new(store.acquisition_turns())),
                store,
                lease_names: Arc::default(),
                notifications: OnceLock::new(),
                listener: Mutex::new(None),
                channels: Arc::default(),
                name_sets: NameSets::default(),
            }),
        }
    }

    /// The store behind it.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    fn join_group(&self, key: GroupKey, member: Arc<Shared>) {
        self.inner.renewals.join_group(key, member);
    }

    fn attach_membership(&self, key: GroupKey, membership: Arc<MemberShared>) -> Result<()> {
        self.inner.renewals.attach_membership(key, membership)
    }

    /// The caller will wait for `qualified`'s release: reads its lock key unless the listener knows it (once per
    /// name and process). `reading` (taken before the attempt that found the lease held) keeps the listener
    /// looking up unknown keys until the read is done.
    fn learn_key(&self, qualified: &str, reading: Reading) {
        let keys = self.inner.lease_names.clone();
        let store = self.inner.store.clone();
        let qualified = qualified.to_owned();
        tokio::spawn(
            async move { warm_lease_names(&store, &keys, vec![qualified], reading).await },
        );
    }

    fn notifications(&self) -> &broadcast::Sender<Wake> {
        self.inner.notifications.get_or_init(|| {
            let (tx, _) = broadcast::channel(1024);
            if self.inner.store.can_listen() {
                let task = tokio::spawn(listen(
                    self.inner.store.clone(),
                    self.inner.lease_names.clone(),
                    tx.clone(),
                    self.inner.channels.clone(),
                ));
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

#[derive(Debug)]
struct PgLeaver {
    store: Store,
}

impl Leaver for PgLeaver {
    fn leave(&self, member: Member) -> BoxFuture<Result<bool>> {
        let store = self.store.clone();
        Box::pin(async move {
            // Idempotent, like a release: retried once on a fresh connection; if that fails too, the membership
            // expires after its ttl.
            match store.groups().leave(&member).await {
                Err(e) if e.is_transient() => store.groups().leave(&member).await,
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
        // Counted from before the attempt: a release committed after the attempt's snapshot is heard while
        // this waiter's key may still be unknown, and must be looked up, not dropped.
        let keys = &self.inner.lease_names;
        let reading = (!keys.knows(&self.qualify(name))).then(|| keys.reading());
        let acquired = acquire::acquire(&self.inner.store, name, holder, options.ttl).await;
        let (lease, first) = match acquired {
            Ok(acquired) => acquired,
            Err(e) => {
                if let (Error::Held { lease, .. }, Some(reading)) = (&e, reading) {
                    self.learn_key(lease, reading);
                }
                return Err(e);
            }
        };
        let deadline = lease.local_deadline();
        let reporter = options.report_beliefs.then(|| BeliefReporter {
            queue: self
                .inner
                .beliefs
                .get_or_init(|| BeliefQueue::new(self.inner.store.clone()))
                .clone(),
        });
        let shared = Shared::new(lease, first, options.safety_margin, deadline, reporter);
        self.join_group(
            GroupKey {
                holder: holder.to_owned(),
                ttl: options.ttl,
                renew_every: options.renew_every,
                retry_every: options.retry_every,
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

    async fn acquisition_turn(&self) -> AcquisitionTurn {
        match self.inner.turns.clone().acquire_owned().await {
            Ok(permit) => AcquisitionTurn::of(permit),
            // Never closed; were it, the pool's own turns still bound the checkouts.
            Err(_) => AcquisitionTurn::unbounded(),
        }
    }

    fn wakeups(&self) -> Wakeups {
        Wakeups {
            rx: Some(self.notifications().subscribe()),
        }
    }

    async fn join(
        &self,
        group: &str,
        member: &str,
        spec: &MemberSpec,
        options: &LeaseOptions,
    ) -> Result<Membership> {
        options.validate()?;
        // The listener runs before the join; the group's channel is LISTENed to once the join named it, and
        // the listener then wakes every waiter (`Wake::Resumed`), so a balancer that subscribed before reads
        // the assignment again instead of missing what was said meanwhile.
        self.notifications();
        let joined = self
            .inner
            .store
            .groups()
            .join(group, member, spec, options.ttl)
            .await?;
        if !joined.channel().is_empty() {
            self.inner.channels.add(joined.channel());
        }
        let shared = MemberShared::new(joined, options.safety_margin);
        let key = GroupKey {
            holder: member.to_owned(),
            ttl: options.ttl,
            renew_every: options.renew_every,
            retry_every: options.retry_every,
        };
        let leaver = Arc::new(PgLeaver {
            store: self.inner.store.clone(),
        });
        if let Err(e) = self.attach_membership(key, shared.clone()) {
            // Not heartbeated: leave at once rather than leave a member the others would count for a ttl.
            let _ = leaver.leave(shared.member()).await;
            return Err(e);
        }
        Ok(Membership::new(shared, leaver))
    }

    async fn assigned(&self, membership: &Membership) -> Result<Assigned> {
        let member = membership.member_data();
        let own = self
            .inner
            .store
            .groups()
            .assigned_names(member.group(), member.member())
            .await?;
        let qualified: Vec<String> = own.names.iter().map(|n| self.qualify(n)).collect();
        // In the background: the names go to the balancer at once; their lock keys are cached before a release
        // of one of them must be resolved.
        // Counted before the spawn: the names' campaigns may start before the read.
        let store = self.inner.store.clone();
        let cache = self.inner.lease_names.clone();
        let reading = cache.reading();
        tokio::spawn(async move { warm_lease_names(&store, &cache, qualified, reading).await });
        Ok(Assigned {
            generation: own.generation,
            names: own.names.into_iter().collect(),
            members: own.members,
        })
    }

    async fn rebalance(&self, membership: &Membership) -> Result<Rebalance> {
        rebalance::rebalance(&self.inner.store, &self.inner.name_sets, membership).await
    }

    async fn in_doubt(&self, name: &str) -> Result<Vec<crate::effects::InDoubt>> {
        let store = &self.inner.store;
        store.effects().in_doubt_of(&store.qualify(name)).await
    }

    async fn handover_gap(&self, name: &str, epoch: crate::types::Epoch) -> Option<Duration> {
        self.inner
            .store
            .groups()
            .handover_gap(name, epoch)
            .await
            .unwrap_or_else(|e| {
                tracing::debug!(error = %e, "reading the handover gap failed");
                None
            })
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
