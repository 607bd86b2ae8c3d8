//! Replica groups: a process that spreads its controllers joins a named group as a member, with the names it can
//! lead, and keeps its membership live by heartbeats (database clock). The group's assignment is stored: after
//! each change of the group (a member settles, leaves or expires) one member claims the rebalance, computes the
//! balanced assignment ([`leader::assign`](crate::leader::assign)) from the stored one and the members that
//! count, and stores the names that move; every member reads only its own names. Membership is no fence: every
//! write stays fenced by its lease's epoch, so members that disagree for a moment about who should lead a name
//! can delay a handover, never produce a write the database should have refused.
//!
//! SQL: `migrations/2026-11-30-000005_membership/up.sql` (`pgfence.join_group`, `pgfence.heartbeat`,
//! `pgfence.leave_group`, `pgfence.claim_rebalance`, `pgfence.rebalance_inputs`, `pgfence.group_names`,
//! `pgfence.group_assignment`, `pgfence.assign_group`, `pgfence.assigned_names`, the view
//! `pgfence.group_members`).
//!
//! Which file of this module owns what: the table of files in docs/architecture.md.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::lease::TenureSecret;
use crate::limits::{MAX_GROUP_LEN, MAX_GROUP_NAMES, MAX_WEIGHT};
use crate::store::Store;
use crate::types::LossReason;
use crate::validate::{check_text, validate_name};

mod calls;
mod rows;

pub use calls::NameSets;

pub use rows::{GroupNews, Rebalance};
pub(crate) use rows::{MemberReply, MemberResultRow};

/// The replica groups of a [`Store`] ([`Store::groups`]): joining, heartbeats and leaving, the stored assignment
/// (claimed, read and written), and the gap a handover left.
#[derive(Debug, Clone, Copy)]
pub struct Groups<'a> {
    store: &'a Store,
}

impl Store {
    /// The replica groups of this store's cluster: a member's join, heartbeat and leave, the stored assignment,
    /// the members an operator reads (see [`Groups`]).
    pub fn groups(&self) -> Groups<'_> {
        Groups { store: self }
    }
}

/// What a member declares when it joins: the names it can lead, its weight, and the names it must or must never
/// lead.
///
/// ```
/// use pgfence::groups::MemberSpec;
///
/// let spec = MemberSpec::new(["scheduler", "rollout", "billing"])
///     .weight(2)
///     .exclude(["billing"]);
/// spec.validate()?;
/// # Ok::<(), pgfence::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MemberSpec {
    /// Capacity, 1..=[`MAX_WEIGHT`]: a member of weight 2 is assigned about twice the names of one of weight 1.
    pub weight: u32,
    /// The names this member can lead (its controllers, shards expanded).
    pub names: BTreeSet<String>,
    /// Names this member leads whenever it is live, whatever the balance (each must be one of `names`).
    pub pinned: BTreeSet<String>,
    /// Names this member must never lead.
    pub excluded: BTreeSet<String>,
}

impl MemberSpec {
    /// A member of weight 1 that can lead `names`, with no pins or exclusions.
    pub fn new(names: impl IntoIterator<Item = impl Into<String>>) -> MemberSpec {
        MemberSpec {
            weight: 1,
            names: names.into_iter().map(Into::into).collect(),
            pinned: BTreeSet::new(),
            excluded: BTreeSet::new(),
        }
    }

    /// Sets the weight.
    pub fn weight(mut self, weight: u32) -> MemberSpec {
        self.weight = weight;
        self
    }

    /// Adds pinned names.
    pub fn pin(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> MemberSpec {
        self.pinned.extend(names.into_iter().map(Into::into));
        self
    }

    /// Adds excluded names.
    pub fn exclude(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> MemberSpec {
        self.excluded.extend(names.into_iter().map(Into::into));
        self
    }

    /// Checks the spec as the database does (`pgfence._member_problem`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the field: a weight of 0 or above [`MAX_WEIGHT`]; no names; more than
    /// [`MAX_GROUP_NAMES`] names, pins and exclusions in all; a name that is not a valid lease name; a pin that is
    /// not one of the names, or is also excluded.
    pub fn validate(&self) -> Result<()> {
        if self.weight == 0 || self.weight > MAX_WEIGHT {
            return Err(Error::invalid(
                "weight",
                format!("must be between 1 and {MAX_WEIGHT}, got {}", self.weight),
            ));
        }
        if self.names.is_empty() {
            return Err(Error::invalid("names", "a member leads at least one name"));
        }
        let total = self.names.len() + self.pinned.len() + self.excluded.len();
        if total > MAX_GROUP_NAMES {
            return Err(Error::invalid(
                "names",
                format!("at most {MAX_GROUP_NAMES} names, pins and exclusions in all, got {total}"),
            ));
        }
        for name in self.names.iter().chain(&self.pinned).chain(&self.excluded) {
            validate_name(name)?;
        }
        if let Some(pin) = self.pinned.iter().find(|p| !self.names.contains(*p)) {
            return Err(Error::invalid(
                "pin",
                format!("{pin:?} is not one of the member's names"),
            ));
        }
        if let Some(pin) = self.pinned.iter().find(|p| self.excluded.contains(*p)) {
            return Err(Error::invalid("pin", format!("{pin:?} is also excluded")));
        }
        Ok(())
    }
}

/// Checks a group name (without its cluster): a lease name's rules.
pub(crate) fn validate_group(group: &str) -> Result<()> {
    check_text("group", group, MAX_GROUP_LEN)
}

/// A membership this process holds: the group, the member name, the incarnation the database issued, its secret
/// and the local deadline before which the database cannot have expired it.
///
/// Plain data, like [`Lease`](crate::Lease): it does not heartbeat by itself (the leadership runtime does:
/// [`Elector::join`](crate::leader::Elector::join)).
#[derive(Debug, Clone)]
pub struct Member {
    group: String,
    qualified: String,
    member: String,
    incarnation: i64,
    /// `Debug` redacts it.
    secret: TenureSecret,
    ttl: Duration,
    settled: bool,
    local_deadline: Instant,
    /// The group's notification channel (`pgfence._group_channel`).
    channel: String,
    /// What the join's answer said of the group's assignment.
    news: GroupNews,
}

impl Member {
    #[cfg(feature = "testing")]
    pub(crate) fn from_parts(
        group: &str,
        qualified: String,
        member: &str,
        incarnation: i64,
        secret: TenureSecret,
        local_deadline: Instant,
    ) -> Member {
        Member {
            group: group.to_owned(),
            qualified,
            member: member.to_owned(),
            incarnation,
            secret,
            ttl: crate::limits::MAX_TTL,
            settled: true,
            local_deadline,
            channel: String::new(),
            news: GroupNews::default(),
        }
    }

    /// The group name without its cluster prefix.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The cluster-qualified group name (`<cluster>/<group>`).
    pub fn qualified_group(&self) -> &str {
        &self.qualified
    }

    /// The member name.
    pub fn member(&self) -> &str {
        &self.member
    }

    /// How many times this member name has joined the group (this join included).
    pub fn incarnation(&self) -> i64 {
        self.incarnation
    }

    /// The ttl of the join or last heartbeat.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Whether the database counted the member as settled (it may acquire) at the join or last heartbeat.
    pub fn settled(&self) -> bool {
        self.settled
    }

    /// By the monotonic clock: the send time of the join or last heartbeat + ttl. The database cannot have
    /// expired the member before it.
    pub fn local_deadline(&self) -> Instant {
        self.local_deadline
    }

    pub(crate) fn secret(&self) -> &TenureSecret {
        &self.secret
    }

    /// The group's notification channel: `assigned <generation>` after each new assignment, `changed` when one
    /// becomes due. Empty for a membership of the in-memory elector.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// What the join's answer said of the group's assignment.
    pub fn news_at_join(&self) -> GroupNews {
        self.news
    }

    /// The membership after a heartbeat sent at `sent` answered `renewed`.
    pub(crate) fn renewed(&mut self, sent: Instant, settled: bool) {
        self.settled = settled;
        self.local_deadline = sent + self.ttl;
    }
}

/// One live member of a group as the assignment sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RosterMember {
    /// The member name.
    pub member: String,
    /// Capacity, 1..=[`MAX_WEIGHT`]. A member of weight 2 gets about twice the names of one of weight 1.
    pub weight: u32,
    /// Counted for acquisition: settled members may acquire; the assignment itself counts every live member,
    /// settled or not (so that nobody grabs a settling member's share meanwhile).
    pub settled: bool,
    /// Names this member can lead (its controllers, shards expanded): shared, since the members of a group
    /// usually declare the same set (it is stored once, and read once by a process).
    pub names: Arc<BTreeSet<String>>,
    /// Names this member must lead when it is live (they go to a pinning member whatever the balance).
    pub pinned: BTreeSet<String>,
    /// Names this member must never lead.
    pub excluded: BTreeSet<String>,
}

impl RosterMember {
    /// A member with weight 1, settled, no pins or exclusions.
    pub fn new(
        member: impl Into<String>,
        names: impl IntoIterator<Item = impl Into<String>>,
    ) -> RosterMember {
        RosterMember {
            member: member.into(),
            weight: 1,
            settled: true,
            names: Arc::new(names.into_iter().map(Into::into).collect()),
            pinned: BTreeSet::new(),
            excluded: BTreeSet::new(),
        }
    }

    /// The member with weight, pins and exclusions of `spec`.
    pub fn from_spec(member: impl Into<String>, spec: &MemberSpec, settled: bool) -> RosterMember {
        RosterMember {
            member: member.into(),
            weight: spec.weight,
            settled,
            names: Arc::new(spec.names.clone()),
            pinned: spec.pinned.clone(),
            excluded: spec.excluded.clone(),
        }
    }
}

/// A group's stored assignment (`pgfence.group_assignment`): which member each name is assigned to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GroupAssignment {
    /// The generation of the stored assignment (0 before the first).
    pub generation: i64,
    /// Name → the member it is assigned to.
    pub owners: BTreeMap<String, String>,
}

/// A member's own part of its group's stored assignment (`pgfence.assigned_names`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct OwnNames {
    /// The generation of the stored assignment (0 before the first).
    pub generation: i64,
    /// The names assigned to the member, sorted.
    pub names: Vec<String>,
    /// How many members the stored assignment counts.
    pub members: usize,
}

/// A row of `pgfence.group_members`: a member of a group as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GroupMember {
    /// The cluster-qualified group name.
    pub group: String,
    /// The member name.
    pub member: String,
    /// How many times the name has joined.
    pub incarnation: i64,
    /// Its weight.
    pub weight: u32,
    /// Whether it is live now (database clock).
    pub live: bool,
    /// Whether it is settled (counts for the assignment).
    pub settled: bool,
    /// Whether the stored assignment counts it (its expiry calls for a new one).
    pub counted: bool,
    /// Whether it left in order (a member that is neither live nor left expired).
    pub left: bool,
    /// Time left before it expires (database clock; zero when it has).
    pub expires_in: Duration,
    /// Consecutive incarnations that ended by expiry (the hysteresis counter).
    pub flaps: i32,
    /// How many names it can lead (the set it declared; `pgfence.group_members.names` has them).
    pub name_count: usize,
    /// Its pinned names.
    pub pinned: Vec<String>,
    /// Its excluded names.
    pub excluded: Vec<String>,
    /// The names the stored assignment gives it.
    pub assigned: Vec<String>,
    /// The names of `assigned` it leads now.
    pub leads: Vec<String>,
}

pub(crate) fn member_lost(member: &Member, reason: LossReason) -> Error {
    Error::MemberLost {
        group: member.qualified.clone(),
        member: member.member.clone(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bad input is refused before anything is sent, with the field named.
    #[test]
    fn member_specs_are_checked_as_the_database_checks_them() {
        let field = |spec: MemberSpec| match spec.validate() {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(MemberSpec::new(["a"]).weight(0)), "weight");
        assert_eq!(
            field(MemberSpec::new(["a"]).weight(MAX_WEIGHT + 1)),
            "weight"
        );
        assert_eq!(field(MemberSpec::new(Vec::<String>::new())), "names");
        assert_eq!(field(MemberSpec::new(["a"]).pin(["b"])), "pin");
        assert_eq!(
            field(MemberSpec::new(["a"]).pin(["a"]).exclude(["a"])),
            "pin"
        );
        assert_eq!(field(MemberSpec::new(["a\n"])), "lease name");
        assert_eq!(
            field(MemberSpec::new(
                (0..=MAX_GROUP_NAMES).map(|i| i.to_string())
            )),
            "names"
        );
        MemberSpec::new(["a", "b"])
            .weight(MAX_WEIGHT)
            .pin(["a"])
            .exclude(["c"])
            .validate()
            .unwrap();
    }
}
