//! [`assign`]: the deterministic, balanced assignment of lease names to the live members of a replica group.
//!
//! Every member of a group reads the same two things from the database — the roster of live members and the
//! current holder of each lease — and computes the assignment from them alone. The function is pure (no I/O, no
//! clock, no randomness, no platform-dependent arithmetic), so every member derives the same desired owner of
//! each name without talking to the others; a member then campaigns only for the names assigned to it and hands
//! over the ones that are not.
//!
//! # How
//!
//! - **Preference**: weighted rendezvous (highest random weight) hashing. Each (member, name) pair gets a score
//!   from a hash of both; a name prefers the members that score it highest. Adding or removing a member changes
//!   no other pair's score, so preferences stay put.
//! - **Balance**: quotas. The names with an eligible member are divided among all live members in proportion to
//!   their weights (largest remainders, in integers), so nobody holds much more than its share whatever the hash
//!   does.
//! - **Stability**: the current holders. A member keeps the names it holds, up to its quota, before anything is
//!   handed out afresh: while the membership does not change nothing moves, and when it changes only the names
//!   that must move for the new quotas do (on a join, exactly the ones the newcomer needs).
//!
//! The exact rules are on [`assign`]. [`shard_of`] maps a work key to a shard of a sharded controller, with the
//! same kind of hash.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::limits::MAX_WEIGHT;
use crate::membership::RosterMember;

mod hash;
#[cfg(test)]
mod tests;

pub use hash::shard_of;
use hash::{pair_hash, pair_prefix, str_hash, weighted_score};

/// The desired owner of each name, as computed by [`assign`].
///
/// A name no live member may lead is absent. Serialized as a map from name to member.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Assignment {
    /// name -> member.
    owners: BTreeMap<String, String>,
}

impl Assignment {
    /// The member assigned `name`, if any.
    pub fn owner(&self, name: &str) -> Option<&str> {
        self.owners.get(name).map(String::as_str)
    }

    /// Names assigned to `member`, sorted.
    pub fn names_of(&self, member: &str) -> Vec<&str> {
        self.iter()
            .filter(|&(_, owner)| owner == member)
            .map(|(name, _)| name)
            .collect()
    }

    /// (name, owner) pairs in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.owners
            .iter()
            .map(|(name, owner)| (name.as_str(), owner.as_str()))
    }

    /// How many names each owner is assigned. A member that is assigned nothing does not appear.
    pub fn counts(&self) -> BTreeMap<&str, usize> {
        let mut counts = BTreeMap::new();
        for (_, owner) in self.iter() {
            *counts.entry(owner).or_insert(0) += 1;
        }
        counts
    }

    /// How many names are assigned.
    pub fn len(&self) -> usize {
        self.owners.len()
    }

    /// Whether no name is assigned.
    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }
}

/// Computes the assignment. `holders` maps a name to the member that holds its lease now (live tenure); a
/// holder that is not in `members`, or not eligible for that name, is ignored.
///
/// The result depends only on the set of members (not on their order in the slice) and on `holders`. If
/// `members` names the same member twice, the first entry wins and the later ones are ignored (so with
/// duplicates the order does matter: which entry is first). A weight outside 1..=[`MAX_WEIGHT`] (which a
/// member's registration refuses) is read as the nearest bound; [`settled`](RosterMember::settled) is not read.
///
/// # Rules
///
/// 1. **Eligibility.** The names are the union of every member's [`names`](RosterMember::names). A member is
///    eligible for a name in its `names` unless it [`excluded`](RosterMember::excluded) it; if some eligible
///    members [pin](RosterMember::pinned) the name, only they are eligible. A name without an eligible member is
///    left out.
/// 2. **Score.** Weighted rendezvous hashing: `score(m, n) = -weight(m) / ln(u)`, with `u ∈ (0, 1)` taken from
///    a 64-bit hash of the member and the name that is the same on every platform, Rust version and run. Higher
///    is preferred; equal scores fall back to the member name, then the name (a total order).
/// 3. **Quotas.** With `N` names to assign and `W` the total weight of the members, member `m` gets
///    `floor(N · w_m / W)`, and the `N − Σ floor` members with the largest remainders (`N · w_m mod W`; ties to
///    the higher stable hash of the member name, then the lower name) one more: the quotas add up to `N`, and
///    with equal weights they are `⌊N/M⌋` or `⌈N/M⌉`. Every live member counts, whether or not it may lead any
///    name.
/// 4. **Assignment**, in this order:
///    1. each pinned name to its holder if that is a pinning member, else to the pinning member with the
///       highest score, even beyond its quota;
///    2. each member keeps the names it holds, best scores first, while it is under its quota (a member over
///       its quota sheds the names it scores lowest);
///    3. each name still free, those with a restricted set of eligible members (pins, exclusions, names not
///       every member declares) first, then the others, each group in name order: to its eligible member with
///       the highest score among those still under their quota;
///    4. a name still free (all its eligible members are full — only possible with pins and exclusions) goes
///       beyond quota to its holder if eligible, else to its eligible member with the highest score.
///
/// When step 4 leaves some member holding more than its quota of unpinned names, the computation runs once more
/// with its own result as the holders, and that second result is returned: it is a fixed point. Without the
/// second round, a member that received a name in step 4.4 could shed a lower-scoring name it kept in step 4.2
/// the next time the group computes the assignment, and a name would move although the membership did not
/// change.
///
/// Guarantees: `assign(members, &assign(members, h))` equals `assign(members, h)` for any holders `h` (nothing
/// moves while the membership is stable). With equal weights and no pins or exclusions, from a settled
/// assignment: a join moves only the names the newcomer's quota requires, all of them to the newcomer, and a
/// leave moves only the leaver's names. (With weights, a join still moves only the names over the new quotas,
/// but a quota can round up by one, so some may go to an existing member.)
///
/// # Cost
///
/// Members that declare the same set (one `Arc`, as the store hands them out) share it. Time
/// `O(N log N + F·M + R·M)` and memory `O(N + M + R·M)` for `N` names, `M` members, `F` names that are free
/// once every member kept what it may (the names that must move: about `N/M` on a join or a leave, `N` only
/// the first time a group is assigned) and `R` names with a restricted set of eligible members (pins,
/// exclusions, names only some members declare; none in a homogeneous group). Measured (`cargo bench --bench
/// operations -- assign`, docs/performance.md): a first assignment of 10,000 names over 100 members in a few
/// tens of milliseconds optimized, a join or a leave in a few milliseconds.
pub fn assign(members: &[RosterMember], holders: &BTreeMap<String, String>) -> Assignment {
    let group = Group::new(members);
    let current = group.holders(holders);
    let first = group.solve(&current);
    let owner = if group.sheds(&first) {
        group.solve(&first)
    } else {
        first
    };
    group.assignment(&owner)
}

/// An index into `Group::members` (sorted by member name, so index order is name order) or `Group::names`
/// (sorted). 32 bits: a group never has 2^32 members or names.
type Ix = u32;

/// A member as the computation sees it: deduplicated, weight clamped, and the hash state of its name prefix.
#[derive(Debug)]
struct Candidate<'a> {
    name: &'a str,
    weight: u64,
    /// FNV-1a state after the member's bytes and the separator: the pair hash of every name continues from it,
    /// so a member's bytes are hashed once, not once per name.
    prefix: u64,
}

/// The inputs of [`assign`] indexed: who may lead what, and how much each member should lead.
#[derive(Debug)]
struct Group<'a> {
    members: Vec<Candidate<'a>>,
    names: Vec<&'a str>,
    /// Per name, its eligible members (ascending index) after pins narrowed them, or `None` when every member
    /// is eligible (the name of a homogeneous group: no list is kept for it).
    eligible: Vec<Option<Vec<Ix>>>,
    /// Per name, whether some eligible member pins it (then `eligible` holds only pinning members).
    pinned: Vec<bool>,
    /// Per member, its quota (they add up to the number of names with an eligible member).
    quota: Vec<usize>,
}

fn ix(index: usize) -> Ix {
    Ix::try_from(index).expect("fewer than 2^32 members and names")
}

impl<'a> Group<'a> {
    fn new(roster: &'a [RosterMember]) -> Group<'a> {
        // First entry wins: a duplicate must not add its weight or its names twice.
        let mut seen = BTreeSet::new();
        let mut unique: Vec<&RosterMember> = roster
            .iter()
            .filter(|m| seen.insert(m.member.as_str()))
            .collect();
        // Index order is name order, so that every tie-break on the member name is an index comparison and the
        // order of the slice cannot matter.
        unique.sort_by(|a, b| a.member.cmp(&b.member));

        // The distinct sets (members of a homogeneous group share one `Arc`): the names are their union, merged
        // once per set rather than once per member.
        let mut sets: Vec<&'a BTreeSet<String>> = Vec::new();
        let mut users: Vec<usize> = Vec::new();
        for member in &unique {
            // By identity only: telling equal copies apart costs nothing but a few more lookups below.
            match sets.iter().position(|s| std::ptr::eq(*s, &*member.names)) {
                Some(d) => users[d] += 1,
                None => {
                    sets.push(&member.names);
                    users.push(1);
                }
            }
        }
        let mut names: Vec<&str> = Vec::new();
        for set in &sets {
            names = union(&names, set);
        }
        // A name is restricted when not every member declares it, or some member pins or excludes it: only then
        // is its list of eligible members built.
        let special: BTreeSet<&str> = unique
            .iter()
            .flat_map(|m| m.pinned.iter().chain(&m.excluded))
            .map(String::as_str)
            .collect();
        let mut eligible: Vec<Option<Vec<Ix>>> = Vec::with_capacity(names.len());
        let mut pinned = vec![false; names.len()];
        for (n, name) in names.iter().enumerate() {
            let declared: usize = sets
                .iter()
                .zip(&users)
                .filter(|(set, _)| set.contains(*name))
                .map(|(_, count)| count)
                .sum();
            if declared == unique.len() && !special.contains(name) {
                eligible.push(None);
                continue;
            }
            let mut list = Vec::new();
            let mut pinners = Vec::new();
            for (m, member) in unique.iter().enumerate() {
                if !member.names.contains(*name) || member.excluded.contains(*name) {
                    continue;
                }
                list.push(ix(m));
                if member.pinned.contains(*name) {
                    pinners.push(ix(m));
                }
            }
            if !pinners.is_empty() {
                list = pinners;
                pinned[n] = true;
            }
            eligible.push(Some(list));
        }

        let members: Vec<Candidate<'a>> = unique
            .iter()
            .map(|m| Candidate {
                name: &m.member,
                weight: u64::from(m.weight.clamp(1, MAX_WEIGHT)),
                prefix: pair_prefix(&m.member),
            })
            .collect();
        let assignable = eligible
            .iter()
            .filter(|e| e.as_ref().is_none_or(|list| !list.is_empty()))
            .count();
        let quota = quotas(&members, assignable);
        Group {
            members,
            names,
            eligible,
            pinned,
            quota,
        }
    }

    /// Whether member `m` may lead name `n`.
    fn may_lead(&self, m: Ix, n: usize) -> bool {
        match &self.eligible[n] {
            None => (m as usize) < self.members.len(),
            Some(list) => list.binary_search(&m).is_ok(),
        }
    }

    /// Whether name `n` has an eligible member.
    fn assignable(&self, n: usize) -> bool {
        self.eligible[n]
            .as_ref()
            .is_none_or(|list| !list.is_empty())
    }

    /// Per name, its current holder as a member index, if that holder is a member eligible for the name.
    fn holders(&self, holders: &BTreeMap<String, String>) -> Vec<Option<Ix>> {
        self.names
            .iter()
            .enumerate()
            .map(|(n, name)| {
                let holder = holders.get(*name)?;
                let m = self.members.binary_search_by(|c| c.name.cmp(holder)).ok()?;
                self.may_lead(ix(m), n).then_some(ix(m))
            })
            .collect()
    }

    fn score(&self, m: Ix, n: Ix) -> f64 {
        let member = &self.members[m as usize];
        weighted_score(
            member.weight,
            pair_hash(member.prefix, self.names[n as usize]),
        )
    }

    /// Of `candidates` (any order), the one with the highest score for `n` (the first in name order among equal
    /// scores).
    fn best_of(&self, n: usize, candidates: impl Iterator<Item = Ix>) -> Option<Ix> {
        let mut best: Option<(f64, Ix)> = None;
        for m in candidates {
            let score = self.score(m, ix(n));
            let better = match best {
                None => true,
                Some((top, at)) => match score.total_cmp(&top) {
                    Ordering::Greater => true,
                    Ordering::Equal => m < at,
                    Ordering::Less => false,
                },
            };
            if better {
                best = Some((score, m));
            }
        }
        best.map(|(_, m)| m)
    }

    /// The eligible member of `n` with the highest score.
    fn best(&self, n: usize) -> Ix {
        let found = match &self.eligible[n] {
            None => self.best_of(n, 0..ix(self.members.len())),
            Some(list) => self.best_of(n, list.iter().copied()),
        };
        found.expect("called only for a name with an eligible member")
    }

    /// One round of step 4 from the holders `holder` (already filtered: members eligible for the name).
    fn solve(&self, holder: &[Option<Ix>]) -> Vec<Option<Ix>> {
        let mut owner: Vec<Option<Ix>> = vec![None; self.names.len()];
        let mut count = vec![0usize; self.members.len()];

        // 4.1 Pins come first and ignore the quota: a pin is an operator's order, the balance is only a wish.
        // They still count, so that the pinning member takes fewer of the other names.
        for n in 0..self.names.len() {
            if self.pinned[n] {
                let m = holder[n].unwrap_or_else(|| self.best(n));
                owner[n] = Some(m);
                count[m as usize] += 1;
            }
        }

        // 4.2 Stickiness: a holder keeps what it holds up to its quota, so a stable membership moves nothing and
        // a join moves only what the new quotas require. Shedding the lowest scores (not, say, the last
        // acquired) keeps the choice a function of the inputs alone. Each name has one holder, so the members
        // can be taken in any order.
        let mut held: Vec<Vec<(f64, Ix)>> = vec![Vec::new(); self.members.len()];
        for (n, h) in holder.iter().enumerate() {
            if let (Some(m), None) = (*h, owner[n]) {
                held[m as usize].push((self.score(m, ix(n)), ix(n)));
            }
        }
        for (m, names) in held.iter_mut().enumerate() {
            names.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            for &(_, n) in names.iter() {
                if count[m] >= self.quota[m] {
                    break;
                }
                owner[n as usize] = Some(ix(m));
                count[m] += 1;
            }
        }

        // 4.3 The free names, restricted ones first (they have fewer places to go), each to its best-scoring
        // eligible member still under quota. Only the members with room are scored: after a join or a leave
        // that is the names that must move times the members with room, not every (name, member) pair.
        let mut open: Vec<Ix> = (0..self.members.len())
            .filter(|&m| count[m] < self.quota[m])
            .map(ix)
            .collect();
        let restricted = (0..self.names.len()).filter(|&n| self.eligible[n].is_some());
        let everyone = (0..self.names.len()).filter(|&n| self.eligible[n].is_none());
        for n in restricted.chain(everyone) {
            if owner[n].is_some() || open.is_empty() {
                continue;
            }
            let found = match &self.eligible[n] {
                None => self.best_of(n, open.iter().copied()),
                Some(list) => self.best_of(
                    n,
                    list.iter()
                        .copied()
                        .filter(|&m| count[m as usize] < self.quota[m as usize]),
                ),
            };
            if let Some(m) = found {
                owner[n] = Some(m);
                count[m as usize] += 1;
                if count[m as usize] >= self.quota[m as usize] {
                    open.retain(|&o| o != m);
                }
            }
        }

        // 4.4 Overflow, only with pins and exclusions: every eligible member is full. The holder keeps the name
        // if it may (moving it would put another member over quota just the same), which is also what makes
        // the second round of `assign` settle: the names a member sheds there and nobody can take come back.
        for n in 0..self.names.len() {
            if owner[n].is_none() && self.assignable(n) {
                owner[n] = Some(holder[n].unwrap_or_else(|| self.best(n)));
            }
        }
        owner
    }

    /// Whether some member holds more unpinned names than its quota leaves room for. If none does, another round
    /// from `owner` would keep every name where it is (each member keeps all it holds), so `owner` is a fixed
    /// point; if one does, it would shed some of them.
    fn sheds(&self, owner: &[Option<Ix>]) -> bool {
        let mut total = vec![0usize; self.members.len()];
        let mut pinned = vec![0usize; self.members.len()];
        for (n, m) in owner.iter().enumerate() {
            if let Some(m) = *m {
                total[m as usize] += 1;
                if self.pinned[n] {
                    pinned[m as usize] += 1;
                }
            }
        }
        (0..self.members.len()).any(|m| total[m] > self.quota[m].max(pinned[m]))
    }

    fn assignment(&self, owner: &[Option<Ix>]) -> Assignment {
        let owners = owner
            .iter()
            .enumerate()
            .filter_map(|(n, m)| {
                m.map(|m| {
                    (
                        self.names[n].to_owned(),
                        self.members[m as usize].name.to_owned(),
                    )
                })
            })
            .collect();
        Assignment { owners }
    }
}

/// The sorted union of the sorted `names` and `more`, in one linear pass.
fn union<'a>(names: &[&'a str], more: &'a BTreeSet<String>) -> Vec<&'a str> {
    let mut merged = Vec::with_capacity(names.len().max(more.len()));
    let mut i = 0;
    for name in more {
        while i < names.len() && names[i] < name.as_str() {
            merged.push(names[i]);
            i += 1;
        }
        if i < names.len() && names[i] == name.as_str() {
            i += 1;
        }
        merged.push(name.as_str());
    }
    merged.extend_from_slice(&names[i..]);
    merged
}

/// Step 3: the largest-remainder apportionment of `names` among `members` by weight, in integers (no rounding
/// of floats that could differ between members), so the quotas add up to `names` exactly.
fn quotas(members: &[Candidate<'_>], names: usize) -> Vec<usize> {
    let total: u128 = members.iter().map(|m| u128::from(m.weight)).sum();
    if total == 0 {
        return Vec::new();
    }
    let names_wide = names as u128;
    let mut quota: Vec<usize> = Vec::with_capacity(members.len());
    let mut fraction: Vec<u128> = Vec::with_capacity(members.len());
    for m in members {
        let share = names_wide * u128::from(m.weight);
        // At most `names`: the share of one member never exceeds the whole.
        quota.push(usize::try_from(share / total).unwrap_or(names));
        fraction.push(share % total);
    }
    let remainder = names - quota.iter().sum::<usize>();
    // Ties (all of them, with equal weights) go by a hash of the member name rather than the name itself, so
    // the extra names do not always land on the alphabetically first members. The hash ranks members the same
    // way whoever else is live, which is what keeps a join from raising an existing member's quota (with equal
    // weights): the one-more members among M + 1 are then among the one-more members among M.
    let mut order: Vec<usize> = (0..members.len()).collect();
    order.sort_by(|&a, &b| {
        fraction[b]
            .cmp(&fraction[a])
            .then_with(|| str_hash(members[b].name).cmp(&str_hash(members[a].name)))
            .then(a.cmp(&b))
    });
    for &m in order.iter().take(remainder) {
        quota[m] += 1;
    }
    quota
}
