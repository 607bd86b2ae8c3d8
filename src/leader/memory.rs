//! The in-memory [`Elector`](super::Elector): a deterministic double for users' controller tests.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::broadcast;

use super::end::TenureEnd;
use super::group::{Assigned, Leaver, MemberShared, Membership};
use super::held::{
    AcquisitionTurn, FirstReads, Health, HeldLease, Releaser, Shared, Wake, Wakeups,
};
use super::options::LeaseOptions;
use super::BoxFuture;
use super::Elector;
use crate::error::{Error, Result};
use crate::lease::{Lease, Released, TenureSecret};
use crate::membership::{Member, MemberSpec, Rebalance, RosterMember};
use crate::types::{Epoch, LossReason};

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
    /// Qualified group → member name → its membership.
    groups: Mutex<HashMap<String, BTreeMap<String, MemoryMember>>>,
    /// Qualified group → its stored assignment.
    assignments: Mutex<HashMap<String, Stored>>,
}

/// A group's stored assignment: its generation, and name → member.
type Stored = (i64, BTreeMap<String, String>);

#[derive(Debug)]
struct MemoryMember {
    spec: MemberSpec,
    incarnation: i64,
    current: Weak<MemberShared>,
}

impl MemoryMember {
    fn is_live(&self) -> bool {
        self.current.upgrade().is_some_and(|m| m.is_current())
    }
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
    /// loss signal fires with [`TenureEnd::Injected`]. Returns whether a tenure was ended.
    pub fn lose(&self, name: &str) -> bool {
        self.end_tenure(name, TenureEnd::Injected)
    }

    /// Ends the current tenure of `name` the way the database would have answered its next renewal with
    /// `reason`: the holder's loss signal fires with [`TenureEnd::Lost`] and that reason. Use it to drive a controller
    /// through a specific loss, e.g. [`LossReason::Failover`]. Returns whether a tenure was ended.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> pgfence::Result<()> {
    /// use std::time::Duration;
    /// use pgfence::LossReason;
    /// use pgfence::leader::{Elector, LeaseOptions, MemoryElector, TenureEnd};
    ///
    /// let elector = MemoryElector::new();
    /// let lease = elector.acquire("scheduler", "pod-a", &LeaseOptions::new(Duration::from_secs(15))).await?;
    /// assert!(elector.lose_because("scheduler", LossReason::Failover));
    /// assert!(!lease.is_held());
    /// assert_eq!(lease.lost().await, TenureEnd::Lost { reason: LossReason::Failover });
    /// # Ok(()) }
    /// ```
    pub fn lose_because(&self, name: &str, reason: LossReason) -> bool {
        self.end_tenure(name, TenureEnd::Lost { reason })
    }

    fn end_tenure(&self, name: &str, cause: TenureEnd) -> bool {
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
    /// that a test can exercise "someone else leads".
    ///
    /// # Errors
    ///
    /// [`Error::Held`] when the lease is held already.
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

    /// Ends the membership of `member` in `group` as if its heartbeats had stopped (a crash, a partition): the
    /// other members rebalance. Returns false when it was not a live member.
    pub fn expire_member(&self, group: &str, member: &str) -> bool {
        let ended = {
            let mut groups = self.inner.groups.lock().unwrap_or_else(|p| p.into_inner());
            groups
                .get_mut(&self.qualify(group))
                .and_then(|members| members.remove(member))
                .and_then(|m| m.current.upgrade())
                .map(|m| m.end("expired (injected)".to_owned()))
                .unwrap_or(false)
        };
        let _ = self.sender().send(Wake::Members);
        ended
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

#[derive(Debug)]
struct MemoryLeaver {
    elector: MemoryElector,
}

impl Leaver for MemoryLeaver {
    fn leave(&self, member: Member) -> BoxFuture<Result<bool>> {
        let elector = self.elector.clone();
        Box::pin(async move {
            let left = {
                let mut groups = elector
                    .inner
                    .groups
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let members = groups
                    .entry(member.qualified_group().to_owned())
                    .or_default();
                match members.get(member.member()) {
                    Some(m) if m.incarnation == member.incarnation() => {
                        members.remove(member.member());
                        true
                    }
                    _ => false,
                }
            };
            let _ = elector.sender().send(Wake::Members);
            Ok(left)
        })
    }
}

impl Elector for MemoryElector {
    fn qualify(&self, name: &str) -> String {
        format!("memory/{name}")
    }

    async fn acquire(&self, name: &str, holder: &str, options: &LeaseOptions) -> Result<HeldLease> {
        options.validate()?;
        crate::validate::validate_name(name)?;
        crate::validate::validate_holder("holder", holder)?;
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
                    old.lose(TenureEnd::Lost {
                        reason: LossReason::Superseded,
                    });
                }
            }
            entry.epoch += 1;
            entry.holder = Some(holder.to_owned());
            // A test double: the secret is random but from a non-cryptographic generator (nothing checks it).
            let secret = TenureSecret::parse(
                (0..crate::limits::SECRET_LEN)
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
            let shared = Shared::new(
                lease,
                FirstReads::default(),
                Duration::ZERO,
                far_future(),
                None,
            );
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

    async fn acquisition_turn(&self) -> AcquisitionTurn {
        AcquisitionTurn::unbounded()
    }

    fn wakeups(&self) -> Wakeups {
        Wakeups {
            rx: Some(self.sender().subscribe()),
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
        crate::membership::validate_group(group)?;
        crate::validate::validate_holder("member", member)?;
        spec.validate()?;
        let qualified = self.qualify(group);
        let shared = {
            let mut groups = self.inner.groups.lock().unwrap_or_else(|p| p.into_inner());
            let members = groups.entry(qualified.clone()).or_default();
            let incarnation = match members.get(member) {
                Some(m) if m.is_live() => {
                    return Err(Error::MemberTaken {
                        group: qualified,
                        member: member.to_owned(),
                        expires_in: options.ttl,
                    })
                }
                Some(m) => m.incarnation + 1,
                None => 1,
            };
            let secret = TenureSecret::parse("0".repeat(crate::limits::SECRET_LEN))?;
            // Memory memberships do not expire by time: only leaving and `expire_member` end them.
            let joined =
                Member::from_parts(group, qualified, member, incarnation, secret, far_future());
            let shared = MemberShared::new(joined, Duration::ZERO);
            members.insert(
                member.to_owned(),
                MemoryMember {
                    spec: spec.clone(),
                    incarnation,
                    current: Arc::downgrade(&shared),
                },
            );
            shared
        };
        let _ = self.sender().send(Wake::Members);
        Ok(Membership::new(
            shared,
            Arc::new(MemoryLeaver {
                elector: self.clone(),
            }),
        ))
    }

    /// Assigns the group afresh from its live members and the stored assignment (as the database's claimant
    /// would: the same [`assign`](super::assign::assign)), stores it when it changed, and answers the member's
    /// names.
    async fn assigned(&self, membership: &Membership) -> Result<Assigned> {
        let member = membership.member_data();
        let qualified = member.qualified_group().to_owned();
        let members: Vec<RosterMember> = {
            let groups = self.inner.groups.lock().unwrap_or_else(|p| p.into_inner());
            groups
                .get(&qualified)
                .into_iter()
                .flatten()
                .filter(|(_, m)| m.is_live())
                .map(|(name, m)| RosterMember::from_spec(name.clone(), &m.spec, true))
                .collect()
        };
        let mut assignments = self
            .inner
            .assignments
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let (generation, owners) = assignments.entry(qualified).or_default();
        let next: BTreeMap<String, String> = super::assign::assign(&members, owners)
            .iter()
            .map(|(name, owner)| (name.to_owned(), owner.to_owned()))
            .collect();
        if next != *owners {
            *owners = next;
            *generation += 1;
        }
        Ok(Assigned {
            generation: *generation,
            members: members.len(),
            names: owners
                .iter()
                .filter(|(_, owner)| *owner == member.member())
                .map(|(name, _)| name.clone())
                .collect(),
        })
    }

    /// The in-memory elector assigns as its members read ([`assigned`](Self::assigned)): nothing is ever due.
    async fn rebalance(&self, _membership: &Membership) -> Result<Rebalance> {
        Ok(Rebalance::NotDue { wait: None })
    }

    /// The in-memory elector keeps no effect ledger: nothing is ever in doubt.
    async fn in_doubt(&self, _name: &str) -> Result<Vec<crate::effects::InDoubt>> {
        Ok(Vec::new())
    }

    /// It records no release times: the gap before a tenure is unknown.
    async fn handover_gap(&self, _name: &str, _epoch: crate::types::Epoch) -> Option<Duration> {
        None
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
