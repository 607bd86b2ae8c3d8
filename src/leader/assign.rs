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

use crate::membership::{RosterMember, MAX_WEIGHT};

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
///    3. the remaining (name, eligible member) pairs by descending score: a name goes to the member if it is
///       still free and the member is under its quota;
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
/// `O(P log P + M·N)` for `P` (name, eligible member) pairs, `M` members and `N` names, and `O(P)` memory:
/// 10,000 names × 100 members take about a tenth of a second optimized (a second in an unoptimized build).
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
/// (sorted). 32 bits keep a (score, member, name) pair at 16 bytes for the sort of step 4.3; a group never has
/// 2^32 members or names.
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
    /// Per name, the eligible members (ascending index): after pins narrowed them.
    eligible: Vec<Vec<Ix>>,
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

        // Linear merges rather than a set or a binary search per pair: every member's names are already sorted,
        // and with 100 members offering the same 10,000 names the lookups would dominate the whole computation.
        let mut names: Vec<&str> = Vec::new();
        for member in &unique {
            names = union(&names, &member.names);
        }
        let mut eligible = vec![Vec::new(); names.len()];
        let mut pinners = vec![Vec::new(); names.len()];
        for (m, member) in unique.iter().enumerate() {
            let mut n = 0;
            for name in &member.names {
                // Always found, in order: `names` is the sorted union of every member's names.
                while names[n] < name.as_str() {
                    n += 1;
                }
                if member.excluded.contains(name) {
                    continue;
                }
                eligible[n].push(ix(m));
                if member.pinned.contains(name) {
                    pinners[n].push(ix(m));
                }
            }
        }
        let mut pinned = vec![false; names.len()];
        for ((eligible, pinners), pinned) in eligible.iter_mut().zip(pinners).zip(&mut pinned) {
            if !pinners.is_empty() {
                *eligible = pinners;
                *pinned = true;
            }
        }

        let members: Vec<Candidate<'a>> = unique
            .iter()
            .map(|m| Candidate {
                name: &m.member,
                weight: u64::from(m.weight.clamp(1, MAX_WEIGHT)),
                prefix: pair_prefix(&m.member),
            })
            .collect();
        let assignable = eligible.iter().filter(|e| !e.is_empty()).count();
        let quota = quotas(&members, assignable);
        Group {
            members,
            names,
            eligible,
            pinned,
            quota,
        }
    }

    /// Per name, its current holder as a member index, if that holder is a member eligible for the name.
    fn holders(&self, holders: &BTreeMap<String, String>) -> Vec<Option<Ix>> {
        self.names
            .iter()
            .zip(&self.eligible)
            .map(|(name, eligible)| {
                let holder = holders.get(*name)?;
                let m = self.members.binary_search_by(|c| c.name.cmp(holder)).ok()?;
                eligible.binary_search(&ix(m)).ok().map(|_| ix(m))
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

    /// The eligible member of `n` with the highest score (the first in name order among equal scores).
    fn best(&self, n: usize) -> Ix {
        let mut best: Option<(f64, Ix)> = None;
        for &m in &self.eligible[n] {
            let score = self.score(m, ix(n));
            // `eligible` is in name order: a later member must score strictly higher to win.
            if best.is_none_or(|(top, _)| score.total_cmp(&top) == Ordering::Greater) {
                best = Some((score, m));
            }
        }
        best.map(|(_, m)| m)
            .expect("called only for a name with an eligible member")
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

        // 4.3 Greedy by descending score over what is left. A member already full cannot take anything in this
        // step (counts only grow), so its pairs are not even listed.
        let mut pairs: Vec<(f64, Ix, Ix)> = Vec::new();
        for (n, eligible) in self.eligible.iter().enumerate() {
            if owner[n].is_some() {
                continue;
            }
            for &m in eligible {
                if count[m as usize] < self.quota[m as usize] {
                    pairs.push((self.score(m, ix(n)), m, ix(n)));
                }
            }
        }
        pairs.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        for (_, m, n) in pairs {
            if owner[n as usize].is_none() && count[m as usize] < self.quota[m as usize] {
                owner[n as usize] = Some(m);
                count[m as usize] += 1;
            }
        }

        // 4.4 Overflow, only with pins and exclusions: every eligible member is full. The holder keeps the name
        // if it may (moving it would put another member over quota just the same), which is also what makes
        // the second round of `assign` settle: the names a member sheds there and nobody can take come back.
        for n in 0..self.names.len() {
            if owner[n].is_none() && !self.eligible[n].is_empty() {
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

// The hash. Every member of a group must compute the same scores, whatever its platform, Rust version or process
// (std's `DefaultHasher` is keyed at random per process and may change between releases), so it is spelled out
// here: FNV-1a 64 over the bytes, then the splitmix64 finalizer, because FNV-1a alone mixes its last bytes
// poorly into the high bits the score uses. Changing any of it moves names between replicas running different
// versions: the tests pin its values.

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
/// Between the member and the name in a pair hash. 0xff never occurs in UTF-8, so ("ab", "c") and ("a", "bc")
/// hash different byte strings.
const SEPARATOR: u8 = 0xff;

fn fnv1a(mut state: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        state ^= u64::from(byte);
        state = state.wrapping_mul(FNV_PRIME);
    }
    state
}

fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The FNV-1a state after `member bytes, 0xff`: where every pair hash of the member starts.
fn pair_prefix(member: &str) -> u64 {
    fnv1a(fnv1a(FNV_OFFSET, member.as_bytes()), &[SEPARATOR])
}

/// The hash of a (member, name) pair from the member's [`pair_prefix`]: FNV-1a over `member bytes, 0xff,
/// name bytes`, then splitmix64.
fn pair_hash(prefix: u64, name: &str) -> u64 {
    splitmix64(fnv1a(prefix, name.as_bytes()))
}

/// The hash of one string alone: a member name for the quota tie-break, a work key for [`shard_of`].
fn str_hash(text: &str) -> u64 {
    splitmix64(fnv1a(FNV_OFFSET, text.as_bytes()))
}

/// The shard, in `0..count`, that work keyed by `key` belongs to: every replica computes the same, whatever its
/// platform, Rust version or process. A `count` of 0 is read as 1.
///
/// Jump consistent hashing (Lamping and Veach, 2014) over a stable hash of the key: the keys spread evenly over
/// the shards, and when `count` grows from `n` to `n + 1` only about `1/(n + 1)` of them move, all to the new
/// shard `n` (a key never moves between two shards that exist in both configurations).
///
/// ```
/// use pgfence::leader::shard_of;
///
/// let shard = shard_of("customer-42", 8);
/// assert!(shard < 8);
/// // One more shard: the key stays, or moves to the new one.
/// assert!([shard, 8].contains(&shard_of("customer-42", 9)));
/// ```
pub fn shard_of(key: &str, count: u32) -> u32 {
    let buckets = i64::from(count.max(1));
    let mut state = str_hash(key);
    let (mut bucket, mut next) = (0i64, 0i64);
    // Each step draws the next bucket at which the key would jump; the arithmetic is exact integer-to-float
    // conversions, one IEEE division and one multiplication (correctly rounded everywhere) and a truncation.
    while next < buckets {
        bucket = next;
        state = state
            .wrapping_mul(2_862_933_555_777_941_757)
            .wrapping_add(1);
        next = ((bucket + 1) as f64 * ((1u64 << 31) as f64 / ((state >> 33) + 1) as f64)) as i64;
    }
    // Below `count`, so it fits.
    bucket as u32
}

/// `-weight / ln(u)` with `u = ((hash >> 11) + 0.5) / 2^53`: with `u` uniform on (0, 1), `-ln(u) / weight` is
/// exponential with rate `weight`, the smallest of such independent variables is a given member's with
/// probability proportional to its weight, and the score is its inverse: the highest score wins a name in
/// proportion to the weight. The 53 high bits fill an f64 mantissa exactly; the half keeps `u` off 0, and the
/// only value at which the sum rounds up to 2^53 (u = 1) gives −∞, the lowest score, never NaN.
fn weighted_score(weight: u64, hash: u64) -> f64 {
    const TWO_POW_53: f64 = 9_007_199_254_740_992.0;
    let u = ((hash >> 11) as f64 + 0.5) / TWO_POW_53;
    -(weight as f64) / ln(u)
}

/// The natural logarithm of a positive normal `x`, computed with additions, multiplications and divisions only
/// (fdlibm's `log`, as in FreeBSD and musl): each of those is correctly rounded by IEEE 754 on every platform,
/// whereas `f64::ln` calls the platform's math library, whose last bit is documented to vary. A difference of one
/// bit could reorder two close scores and make two members disagree about an owner. Accurate to under 1 ulp.
fn ln(x: f64) -> f64 {
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    const LG1: f64 = f64::from_bits(0x3fe5_5555_5555_5593);
    const LG2: f64 = f64::from_bits(0x3fd9_9999_9997_fa04);
    const LG3: f64 = f64::from_bits(0x3fd2_4924_9422_9359);
    const LG4: f64 = f64::from_bits(0x3fcc_71c5_1d8e_78af);
    const LG5: f64 = f64::from_bits(0x3fc7_4664_96cb_03de);
    const LG6: f64 = f64::from_bits(0x3fc3_9a09_d078_c69f);
    const LG7: f64 = f64::from_bits(0x3fc2_f112_df3e_5244);
    debug_assert!(x.is_normal() && x > 0.0, "ln of {x}");
    if x == 1.0 {
        return 0.0;
    }
    let bits = x.to_bits();
    // Reduce x to 2^k · (1 + f) with 1 + f in [sqrt(2)/2, sqrt(2)).
    let mut high = (bits >> 32) as u32;
    high = high.wrapping_add(0x3ff0_0000 - 0x3fe6_a09e);
    let k = (high >> 20) as i32 - 0x3ff;
    high = (high & 0x000f_ffff) + 0x3fe6_a09e;
    let reduced = f64::from_bits((u64::from(high) << 32) | (bits & 0xffff_ffff));
    let f = reduced - 1.0;
    let hfsq = 0.5 * f * f;
    let s = f / (2.0 + f);
    let z = s * s;
    let w = z * z;
    let t1 = w * (LG2 + w * (LG4 + w * LG6));
    let t2 = z * (LG1 + w * (LG3 + w * (LG5 + w * LG7)));
    let r = t2 + t1;
    let dk = f64::from(k);
    s * (hfsq + r) + dk * LN2_LO - hfsq + f + dk * LN2_HI
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn names(count: usize) -> Vec<String> {
        (0..count).map(|i| format!("n{i:03}")).collect()
    }

    /// `count` members `m0`, `m1`, … eligible for every name, weight 1.
    fn uniform(count: usize, names: &[String]) -> Vec<RosterMember> {
        (0..count)
            .map(|i| RosterMember::new(format!("m{i}"), names.iter().cloned()))
            .collect()
    }

    fn holders_of(assignment: &Assignment) -> BTreeMap<String, String> {
        assignment
            .iter()
            .map(|(name, owner)| (name.to_owned(), owner.to_owned()))
            .collect()
    }

    /// The pair hash of `member` and `name`.
    fn hash(member: &str, name: &str) -> u64 {
        pair_hash(pair_prefix(member), name)
    }

    fn none() -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    /// Names whose owner differs between `before` and `after` (including names that appear in one only).
    fn moved<'a>(before: &'a Assignment, after: &'a Assignment) -> Vec<&'a str> {
        let all: BTreeSet<&str> = before.iter().chain(after.iter()).map(|(n, _)| n).collect();
        all.into_iter()
            .filter(|n| before.owner(n) != after.owner(n))
            .collect()
    }

    /// The quotas `assign` uses for `members`, by member name.
    fn quota_of(members: &[RosterMember]) -> BTreeMap<String, usize> {
        let group = Group::new(members);
        group
            .members
            .iter()
            .zip(&group.quota)
            .map(|(m, q)| (m.name.to_owned(), *q))
            .collect()
    }

    fn count_of(assignment: &Assignment, member: &str) -> usize {
        assignment.counts().get(member).copied().unwrap_or(0)
    }

    /// Whether `member` (the first entry of that name) may lead `name` under rule 1.
    fn eligible(members: &[RosterMember], member: &str, name: &str) -> bool {
        let first = |who: &str| members.iter().find(|m| m.member == who);
        let may = |m: &RosterMember| m.names.contains(name) && !m.excluded.contains(name);
        let mut seen = BTreeSet::new();
        let unique: Vec<&RosterMember> = members
            .iter()
            .filter(|m| seen.insert(m.member.as_str()))
            .collect();
        let pinned = unique.iter().any(|m| may(m) && m.pinned.contains(name));
        first(member).is_some_and(|m| may(m) && (!pinned || m.pinned.contains(name)))
    }

    /// Rule 1 in full: owners are eligible, every name with an eligible member is assigned, no other name is.
    fn assert_eligibility(members: &[RosterMember], assignment: &Assignment) {
        let all: BTreeSet<&str> = members
            .iter()
            .flat_map(|m| m.names.iter().map(String::as_str))
            .collect();
        for name in all {
            let can = members.iter().any(|m| eligible(members, &m.member, name));
            match assignment.owner(name) {
                Some(owner) => assert!(eligible(members, owner, name), "{name} -> {owner}"),
                None => assert!(!can, "{name} has an eligible member but no owner"),
            }
        }
        for (name, _) in assignment.iter() {
            assert!(members.iter().any(|m| m.names.contains(name)));
        }
    }

    #[test]
    fn twelve_names_over_three_members_then_a_fourth_joins_moves_exactly_three() {
        // Invariant: balance (4 each) and minimal movement on a join (3 names move, all to the newcomer).
        let names = names(12);
        let three = uniform(3, &names);
        let before = assign(&three, &none());
        assert_eq!(before.len(), 12);
        assert!(
            before.counts().values().all(|&c| c == 4),
            "{:?}",
            before.counts()
        );

        let four = uniform(4, &names);
        let after = assign(&four, &holders_of(&before));
        assert!(
            after.counts().values().all(|&c| c == 3),
            "{:?}",
            after.counts()
        );
        assert_eq!(after.counts().len(), 4);
        let moved = moved(&before, &after);
        assert_eq!(moved.len(), 3, "{moved:?}");
        assert!(moved.iter().all(|n| after.owner(n) == Some("m3")));
        // Each old member gave up exactly one name.
        for member in ["m0", "m1", "m2"] {
            assert!(after
                .names_of(member)
                .iter()
                .all(|n| before.owner(n) == Some(member)));
        }
    }

    #[test]
    fn a_hundred_names_over_five_members_gives_twenty_each() {
        // Invariant: equal weights and no restrictions give every member exactly N/M when M divides N.
        let names = names(100);
        let assignment = assign(&uniform(5, &names), &none());
        assert_eq!(assignment.len(), 100);
        let counts = assignment.counts();
        assert_eq!(counts.len(), 5);
        assert!(counts.values().all(|&c| c == 20), "{counts:?}");
    }

    #[test]
    fn plain_greedy_without_stickiness_moves_more_than_the_minimum_on_a_join() {
        // Invariant: minimal movement needs step 4.2 — plain greedy (holders ignored) moves more on this join.
        let names = names(12);
        let before = assign(&uniform(3, &names), &none());
        let four = uniform(4, &names);
        let sticky = assign(&four, &holders_of(&before));
        let plain = assign(&four, &none());
        assert_eq!(moved(&before, &sticky).len(), 3);
        assert!(
            moved(&before, &plain).len() > 3,
            "plain greedy moved only {:?}",
            moved(&before, &plain)
        );
        // Both are balanced: the difference is movement alone.
        assert_eq!(plain.counts(), sticky.counts());
    }

    #[test]
    fn four_members_less_one_keep_their_names_and_get_ten_each() {
        // Invariant: on a leave every remaining member keeps all its names and the result is balanced again.
        let names = names(30);
        let before = assign(&uniform(4, &names), &none());
        let mut three = uniform(4, &names);
        let gone = three.remove(1);
        let after = assign(&three, &holders_of(&before));
        for (name, owner) in before.iter() {
            if owner != gone.member {
                assert_eq!(after.owner(name), Some(owner), "{name} moved");
            }
        }
        assert!(
            after.counts().values().all(|&c| c == 10),
            "{:?}",
            after.counts()
        );
        assert_eq!(after.len(), 30);
    }

    #[test]
    fn weights_scale_the_share() {
        // Invariant: a member of weight w gets within 1 of N·w/W names.
        let names = names(70);
        let mut members = uniform(3, &names);
        members[0].weight = 1;
        members[1].weight = 2;
        members[2].weight = 4;
        let assignment = assign(&members, &none());
        assert_eq!(count_of(&assignment, "m0"), 10);
        assert_eq!(count_of(&assignment, "m1"), 20);
        assert_eq!(count_of(&assignment, "m2"), 40);
    }

    #[test]
    fn weights_outside_the_range_are_clamped() {
        // Invariant: weight 0 counts as 1 and a weight above MAX_WEIGHT as MAX_WEIGHT.
        let names = names(20);
        let mut odd = uniform(2, &names);
        odd[0].weight = 0;
        odd[1].weight = u32::MAX;
        let mut clamped = uniform(2, &names);
        clamped[0].weight = 1;
        clamped[1].weight = MAX_WEIGHT;
        assert_eq!(assign(&odd, &none()), assign(&clamped, &none()));
        assert_eq!(quota_of(&odd)["m0"], 0);
        assert_eq!(quota_of(&odd)["m1"], 20);
    }

    #[test]
    fn pinned_names_go_to_a_pinning_member_even_over_quota() {
        // Invariant: a pin wins over the balance, and only a pinning member can own a pinned name.
        let names = names(10);
        let mut members = uniform(2, &names);
        members[0].pinned = names[..8].iter().cloned().collect();
        let assignment = assign(&members, &none());
        for name in &names[..8] {
            assert_eq!(assignment.owner(name), Some("m0"));
        }
        // The pins count against m0's quota of 5: the rest go to m1.
        for name in &names[8..] {
            assert_eq!(assignment.owner(name), Some("m1"));
        }
        // Someone else holding a pinned name does not keep it.
        let mut holders = holders_of(&assignment);
        holders.insert(names[0].clone(), "m1".to_owned());
        assert_eq!(assign(&members, &holders), assignment);
    }

    #[test]
    fn a_pinned_name_stays_with_its_holder_among_several_pinners() {
        // Invariant: among pinning members the holder keeps a pinned name; without one the best pinner gets it.
        let names = names(1);
        let mut members = uniform(3, &names);
        members[1].pinned = names.iter().cloned().collect();
        members[2].pinned = names.iter().cloned().collect();
        let fresh = assign(&members, &none());
        let winner = fresh.owner("n000").expect("assigned").to_owned();
        assert!(winner == "m1" || winner == "m2");
        let other = if winner == "m1" { "m2" } else { "m1" };
        let held = BTreeMap::from([("n000".to_owned(), other.to_owned())]);
        assert_eq!(assign(&members, &held).owner("n000"), Some(other));
        // A holder that does not pin it loses it to the best pinner.
        let held = BTreeMap::from([("n000".to_owned(), "m0".to_owned())]);
        assert_eq!(assign(&members, &held).owner("n000"), Some(winner.as_str()));
    }

    #[test]
    fn excluded_names_never_go_to_the_excluding_member() {
        // Invariant: an exclusion is absolute — over balance, over holding, and over the member's own pin.
        let names = names(10);
        let mut members = uniform(2, &names);
        members[0].excluded = names[..6].iter().cloned().collect();
        members[0].pinned = BTreeSet::from([names[0].clone()]);
        let holders: BTreeMap<String, String> =
            names.iter().map(|n| (n.clone(), "m0".to_owned())).collect();
        let assignment = assign(&members, &holders);
        for name in &names[..6] {
            assert_eq!(assignment.owner(name), Some("m1"), "{name}");
        }
        // m1 is over its quota of 5 (step 4.4): the four names m0 may lead stay with m0.
        for name in &names[6..] {
            assert_eq!(assignment.owner(name), Some("m0"), "{name}");
        }
        assert_eq!(assign(&members, &holders_of(&assignment)), assignment);
    }

    #[test]
    fn a_name_nobody_has_room_for_stays_with_its_holder() {
        // Invariant: when every eligible member is full, the holder keeps the name (step 4.4 moves nothing).
        let names = names(4);
        let mut members = uniform(2, &names);
        // A heavy member that offers nothing takes most of the quota: m0 and m1 share one slot.
        let mut heavy = RosterMember::new("heavy", Vec::<String>::new());
        heavy.weight = 8;
        members.push(heavy);
        assert_eq!(quota_of(&members)["m0"] + quota_of(&members)["m1"], 1);
        for holder in ["m0", "m1"] {
            let holders: BTreeMap<String, String> = names
                .iter()
                .map(|n| (n.clone(), holder.to_owned()))
                .collect();
            let assignment = assign(&members, &holders);
            assert_eq!(assignment.len(), 4);
            // The holder keeps all four, except the one name the other needs if the slot is the other's.
            let kept = assignment.names_of(holder).len();
            let slot_is_the_holders = quota_of(&members)[holder] == 1;
            assert_eq!(
                kept,
                if slot_is_the_holders { 4 } else { 3 },
                "{holder}: {assignment:?}"
            );
            assert_eq!(assign(&members, &holders_of(&assignment)), assignment);
        }
    }

    #[test]
    fn quota_ties_go_by_the_member_hash() {
        // Invariant: remainder ties go to the members first by member hash (pinned), not alphabetically first.
        let members = uniform(5, &names(7));
        let quota = quota_of(&members);
        let extra: Vec<&str> = quota
            .iter()
            .filter(|&(_, &q)| q == 2)
            .map(|(m, _)| m.as_str())
            .collect();
        let mut by_hash: Vec<&str> = quota.keys().map(String::as_str).collect();
        by_hash.sort_by_key(|m| std::cmp::Reverse(str_hash(m)));
        let mut first_by_hash = by_hash[..2].to_vec();
        first_by_hash.sort_unstable();
        assert_eq!(extra, first_by_hash);
        assert_eq!(extra, ["m1", "m3"]);
    }

    #[test]
    fn names_without_an_eligible_member_are_left_out() {
        // Invariant: a name without an eligible member gets no owner and does not count towards the quotas.
        let mut members = uniform(2, &names(4));
        members[0].excluded = BTreeSet::from(["n000".to_owned()]);
        members[1].excluded = BTreeSet::from(["n000".to_owned()]);
        members[1].names.insert("only-excluded".to_owned());
        members[1].excluded.insert("only-excluded".to_owned());
        let assignment = assign(&members, &none());
        assert_eq!(assignment.owner("n000"), None);
        assert_eq!(assignment.owner("only-excluded"), None);
        assert_eq!(assignment.len(), 3);
        assert_eq!(quota_of(&members).values().sum::<usize>(), 3);
        assert_eq!(assign(&[], &none()), Assignment::default());
        assert!(assign(&[], &none()).is_empty());
    }

    #[test]
    fn a_pin_without_the_name_or_with_an_exclusion_does_not_count() {
        // Invariant: a pin only narrows eligibility when the pinning member is itself eligible for the name.
        let names = names(6);
        let plain = uniform(2, &names);
        let mut members = plain.clone();
        members[0].pinned = BTreeSet::from(["elsewhere".to_owned(), names[0].clone()]);
        members[0].excluded = BTreeSet::from([names[0].clone()]);
        let assignment = assign(&members, &none());
        assert_eq!(assignment.owner("elsewhere"), None);
        assert_eq!(assignment.owner(&names[0]), Some("m1"));
        assert_eq!(assignment.len(), 6);
    }

    #[test]
    fn holders_that_are_not_members_or_not_eligible_are_ignored() {
        // Invariant: only a member eligible for a name can make it sticky.
        let names = names(9);
        let mut members = uniform(3, &names);
        members[2].excluded = names[..3].iter().cloned().collect();
        let fresh = assign(&members, &none());
        let mut holders: BTreeMap<String, String> = names
            .iter()
            .map(|n| (n.clone(), "ghost".to_owned()))
            .collect();
        for name in &names[..3] {
            holders.insert(name.clone(), "m2".to_owned());
        }
        // A holder of a name no member has heard of is ignored too.
        holders.insert("unknown".to_owned(), "m0".to_owned());
        assert_eq!(assign(&members, &holders), fresh);
        assert_eq!(fresh.owner("unknown"), None);
    }

    #[test]
    fn a_duplicate_member_entry_is_ignored_after_the_first() {
        // Invariant: with a member listed twice, the first entry alone counts (its weight, names and pins).
        let names = names(8);
        let mut members = uniform(2, &names);
        let mut twin = RosterMember::new("m0", ["other"]);
        twin.weight = 7;
        members.push(twin);
        let assignment = assign(&members, &none());
        assert_eq!(assignment, assign(&uniform(2, &names), &none()));
        assert_eq!(assignment.owner("other"), None);
    }

    #[test]
    fn the_member_order_and_the_holders_order_do_not_matter() {
        // Invariant: determinism — the same inputs in any order give the same assignment.
        let names = names(40);
        let mut members = uniform(5, &names);
        members[3].weight = 3;
        members[1].excluded = names[..10].iter().cloned().collect();
        members[4].pinned = names[30..33].iter().cloned().collect();
        let holders: Vec<(String, String)> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), format!("m{}", i % 6)))
            .collect();
        let forward: BTreeMap<String, String> = holders.iter().cloned().collect();
        let backward: BTreeMap<String, String> = holders.iter().rev().cloned().collect();
        let expected = assign(&members, &forward);
        let mut reversed = members.clone();
        reversed.reverse();
        assert_eq!(assign(&reversed, &backward), expected);
        reversed.rotate_left(2);
        assert_eq!(assign(&reversed, &forward), expected);
    }

    #[test]
    fn the_hash_and_the_scores_are_pinned() {
        // Invariant: the hashes and scores never change (a change would move names between versions).
        assert_eq!(fnv1a(FNV_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(hash("m0", "n000"), PINNED_PAIR[0]);
        assert_eq!(hash("controller-7", "shard/12"), PINNED_PAIR[1]);
        assert_eq!(hash("", ""), PINNED_PAIR[2]);
        assert_eq!(hash("ab", "c"), PINNED_PAIR[3]);
        assert_ne!(hash("ab", "c"), hash("a", "bc"));
        assert_eq!(str_hash("m0"), PINNED_MEMBER[0]);
        assert_eq!(str_hash("replica-b"), PINNED_MEMBER[1]);
        assert_eq!(
            weighted_score(1, hash("m0", "n000")).to_bits(),
            PINNED_SCORE[0]
        );
        assert_eq!(
            weighted_score(3, hash("controller-7", "shard/12")).to_bits(),
            PINNED_SCORE[1]
        );
        // And the assignment they produce.
        let assignment = assign(&uniform(3, &names(12)), &none());
        let owners: Vec<&str> = assignment.iter().map(|(_, m)| m).collect();
        assert_eq!(owners, PINNED_OWNERS);
    }

    const PINNED_PAIR: [u64; 4] = [
        0x3efd_7f61_8f80_4d7e,
        0x0cbe_099d_208f_0dd2,
        0x4f2d_b50f_1240_40cd,
        0x0a52_c632_fce1_f7d1,
    ];
    const PINNED_MEMBER: [u64; 2] = [0x1e59_307a_6fb6_99bb, 0xc6a0_dd46_17a3_228a];
    const PINNED_SCORE: [u64; 2] = [0x3fe6_d241_b648_af2d, 0x3fef_ff52_ef1a_a9ca];
    const PINNED_OWNERS: [&str; 12] = [
        "m0", "m0", "m0", "m1", "m2", "m2", "m2", "m2", "m1", "m0", "m1", "m1",
    ];

    #[test]
    fn the_score_is_finite_positive_and_ordered_by_weight() {
        // Invariant: no NaN, and a heavier member scores a name higher than a lighter one with the same hash.
        for hash in [0, 1, 1 << 11, u64::MAX >> 1, u64::MAX - (1 << 11), u64::MAX] {
            let light = weighted_score(1, hash);
            let heavy = weighted_score(2, hash);
            assert!(!light.is_nan() && !heavy.is_nan());
            if light.is_finite() {
                assert!(light > 0.0 && heavy > light, "{hash:#x}");
            }
        }
        // The one hash whose u rounds to 1 gets the lowest score, not NaN.
        assert_eq!(weighted_score(1, u64::MAX), f64::NEG_INFINITY);
    }

    #[test]
    fn the_portable_logarithm_agrees_with_the_platform_one() {
        // Invariant: `ln` is the natural logarithm (within 1 ulp of the platform's) over the scores' domain.
        let mut state = 0x1234_5678_9abc_def0_u64;
        let ulp = |x: f64| f64::from_bits(x.abs().to_bits() + 1) - x.abs();
        for _ in 0..20_000 {
            state = splitmix64(state.wrapping_add(0x9e37_79b9_7f4a_7c15));
            let u = ((state >> 11) as f64 + 0.5) / 9_007_199_254_740_992.0;
            let (ours, std) = (ln(u), u.ln());
            assert!(
                (ours - std).abs() <= ulp(std),
                "ln({u:e}) = {ours:e}, std {std:e}"
            );
        }
        assert_eq!(ln(1.0), 0.0);
        assert_eq!(ln(0.5), -std::f64::consts::LN_2);
        assert_eq!(ln(0.25), -2.0 * std::f64::consts::LN_2);
        assert_eq!(ln(f64::MIN_POSITIVE), -708.3964185322641);
    }

    #[test]
    fn one_round_alone_is_not_a_fixed_point() {
        // Invariant: the fixed point needs the second round — one round alone can leave a name about to move.
        // m1 may lead only n000; m0 holds it and may lead both. Quotas are 1 and 1.
        let mut members = vec![
            RosterMember::new("m0", ["n000", "n001"]),
            RosterMember::new("m1", ["n000"]),
        ];
        let holders = BTreeMap::from([("n000".to_owned(), "m0".to_owned())]);
        let group = Group::new(&members);
        let first = group.solve(&group.holders(&holders));
        // One round: m0 keeps n000 (sticky), and n001, which only m0 may lead, goes to m0 over its quota.
        assert_eq!(group.assignment(&first).names_of("m0"), ["n000", "n001"]);
        assert!(group.sheds(&first));
        // The next round from that result would move n000: m0 keeps n001, its better score, and sheds n000.
        let second = group.solve(&first);
        assert_ne!(first, second);
        assert!(!group.sheds(&second));
        // `assign` returns the settled result at once.
        let assignment = assign(&members, &holders);
        assert_eq!(assignment, group.assignment(&second));
        assert_eq!(assignment.owner("n000"), Some("m1"));
        assert_eq!(assignment.owner("n001"), Some("m0"));
        assert_eq!(assign(&members, &holders_of(&assignment)), assignment);
        // Without the overflow (m1 absent), one round is already settled.
        members.pop();
        let group = Group::new(&members);
        assert!(!group.sheds(&group.solve(&group.holders(&holders))));
    }

    #[test]
    fn the_assignment_accessors_agree() {
        // Invariant: owner, names_of, iter, counts, len and is_empty describe the same map.
        let names = names(7);
        let assignment = assign(&uniform(3, &names), &none());
        assert_eq!(assignment.len(), 7);
        assert!(!assignment.is_empty());
        let mut total = 0;
        for (member, count) in assignment.counts() {
            let mine = assignment.names_of(member);
            assert_eq!(mine.len(), count);
            assert!(mine.windows(2).all(|w| w[0] < w[1]));
            assert!(mine.iter().all(|n| assignment.owner(n) == Some(member)));
            total += count;
        }
        assert_eq!(total, 7);
        assert!(assignment.names_of("nobody").is_empty());
        assert_eq!(assignment.owner("nothing"), None);
        let listed: Vec<&str> = assignment.iter().map(|(n, _)| n).collect();
        assert_eq!(listed, names.iter().map(String::as_str).collect::<Vec<_>>());
    }

    #[test]
    fn an_assignment_serializes_as_a_map_of_names_to_members() {
        // Invariant: serde round-trips an Assignment through a plain {name: member} object.
        let assignment = assign(&uniform(2, &names(2)), &none());
        let json = serde_json::to_value(&assignment).expect("serializes");
        let expected: serde_json::Map<String, serde_json::Value> = assignment
            .iter()
            .map(|(n, m)| (n.to_owned(), serde_json::Value::from(m)))
            .collect();
        assert_eq!(json, serde_json::Value::Object(expected));
        let back: Assignment = serde_json::from_value(json).expect("deserializes");
        assert_eq!(back, assignment);
    }

    #[test]
    fn shard_of_is_stable_in_range_and_pinned() {
        // Invariant: shard_of stays in 0..count (0 read as 1) and never changes (pinned values).
        for key in ["", "a", "customer-42", "ünïcödé"] {
            assert_eq!(shard_of(key, 0), 0);
            assert_eq!(shard_of(key, 1), 0);
            for count in [2, 3, 7, 64, 1024, u32::MAX] {
                assert!(shard_of(key, count) < count);
            }
        }
        let pinned: Vec<u32> = ["", "a", "customer-42", "order/7"]
            .iter()
            .map(|k| shard_of(k, 1024))
            .collect();
        assert_eq!(pinned, PINNED_SHARDS);
        assert_eq!(str_hash("customer-42"), PINNED_KEY_HASH);
    }

    const PINNED_SHARDS: [u32; 4] = [978, 572, 882, 674];
    const PINNED_KEY_HASH: u64 = 0xe02a_9217_8bcc_fd76;

    #[test]
    fn shard_of_spreads_keys_evenly_and_moves_them_only_to_a_new_shard() {
        // Invariant: keys spread evenly, and one more shard moves only about 1/(n + 1) of them, all to it.
        let keys: Vec<String> = (0..8000).map(|i| format!("key-{i}")).collect();
        for count in 1..=12u32 {
            let mut per_shard = vec![0usize; count as usize];
            let mut moved = 0usize;
            for key in &keys {
                let before = shard_of(key, count);
                per_shard[before as usize] += 1;
                let after = shard_of(key, count + 1);
                if after != before {
                    assert_eq!(after, count, "{key} moved from {before} to {after}");
                    moved += 1;
                }
            }
            let even = keys.len() / count as usize;
            assert!(
                per_shard.iter().all(|&c| c.abs_diff(even) < even / 5 + 50),
                "{per_shard:?}"
            );
            let expected = keys.len() / (count as usize + 1);
            assert!(
                moved.abs_diff(expected) < expected / 5 + 50,
                "{count}: {moved} moved"
            );
        }
    }

    #[test]
    fn ten_thousand_names_over_a_hundred_members_is_fast_enough() {
        // Invariant: 10,000 names × 100 members take about a second unoptimized, balanced and settled.
        let names = names(10_000);
        let members = uniform(100, &names);
        let started = std::time::Instant::now();
        let first = assign(&members, &none());
        let again = assign(&members, &holders_of(&first));
        let elapsed = started.elapsed();
        assert_eq!(first, again);
        assert!(first.counts().values().all(|&c| c == 100));
        assert!(elapsed < std::time::Duration::from_secs(20), "{elapsed:?}");
    }

    // Property tests over random groups.

    /// What a member does with one name of the universe.
    #[derive(Debug, Clone, Copy)]
    enum Stance {
        Absent,
        Offers,
        Pins,
        Excludes,
        PinsExcluded,
    }

    fn stance() -> impl Strategy<Value = Stance> {
        prop_oneof![
            2 => Just(Stance::Absent),
            10 => Just(Stance::Offers),
            1 => Just(Stance::Pins),
            1 => Just(Stance::Excludes),
            1 => Just(Stance::PinsExcluded),
        ]
    }

    /// A group with weights, pins and exclusions, and random holders (some not members: `ghost`).
    fn restricted() -> impl Strategy<Value = (Vec<RosterMember>, BTreeMap<String, String>)> {
        (1usize..=6, 0usize..=24).prop_flat_map(|(count, width)| {
            let member = (1u32..=4, prop::collection::vec(stance(), width));
            let holders = prop::collection::vec(prop::option::of(0..=count), width);
            (prop::collection::vec(member, count), holders).prop_map(move |(specs, holders)| {
                let names = names(width);
                let members: Vec<RosterMember> = specs
                    .into_iter()
                    .enumerate()
                    .map(|(i, (weight, stances))| {
                        let mut m = RosterMember::new(format!("m{i}"), Vec::<String>::new());
                        m.weight = weight;
                        for (name, stance) in names.iter().zip(stances) {
                            let (offers, pins, excludes) = match stance {
                                Stance::Absent => (false, false, false),
                                Stance::Offers => (true, false, false),
                                Stance::Pins => (true, true, false),
                                Stance::Excludes => (true, false, true),
                                Stance::PinsExcluded => (true, true, true),
                            };
                            if offers {
                                m.names.insert(name.clone());
                            }
                            if pins {
                                m.pinned.insert(name.clone());
                            }
                            if excludes {
                                m.excluded.insert(name.clone());
                            }
                        }
                        m
                    })
                    .collect();
                let holders = names
                    .iter()
                    .zip(holders)
                    .filter_map(|(name, h)| {
                        h.map(|h| {
                            let who = if h == count {
                                "ghost".to_owned()
                            } else {
                                format!("m{h}")
                            };
                            (name.clone(), who)
                        })
                    })
                    .collect();
                (members, holders)
            })
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn any_order_of_the_members_gives_the_same_assignment(
            (members, holders) in restricted(),
            seed in any::<u64>(),
        ) {
            // Invariant: determinism — a shuffled roster or a differently built holders map changes nothing.
            let expected = assign(&members, &holders);
            let mut shuffled = members.clone();
            let mut state = seed;
            for i in (1..shuffled.len()).rev() {
                state = splitmix64(state.wrapping_add(1));
                shuffled.swap(i, (state % (i as u64 + 1)) as usize);
            }
            let reversed: BTreeMap<String, String> =
                holders.iter().rev().map(|(n, m)| (n.clone(), m.clone())).collect();
            prop_assert_eq!(assign(&shuffled, &reversed), expected);
        }

        #[test]
        fn every_result_is_a_fixed_point(
            (members, holders) in restricted(),
        ) {
            // Invariant: stability — recomputing from the result as the holders moves nothing (a fixed point).
            let from_holders = assign(&members, &holders);
            prop_assert_eq!(&assign(&members, &holders_of(&from_holders)), &from_holders);
            let fresh = assign(&members, &none());
            prop_assert_eq!(&assign(&members, &holders_of(&fresh)), &fresh);
        }

        #[test]
        fn pins_exclusions_and_eligibility_are_honoured(
            (members, holders) in restricted(),
        ) {
            // Invariant: owners are eligible, eligible names are assigned, ineligible and unknown holders ignored.
            let assignment = assign(&members, &holders);
            assert_eligibility(&members, &assignment);
            let honest: BTreeMap<String, String> = holders
                .iter()
                .filter(|(name, holder)| eligible(&members, holder, name))
                .map(|(n, m)| (n.clone(), m.clone()))
                .collect();
            prop_assert_eq!(assign(&members, &honest), assignment);
        }

        #[test]
        fn equal_weights_without_restrictions_are_balanced(
            count in 1usize..=8,
            width in 0usize..=80,
            held in prop::collection::vec(prop::option::of(0usize..=8), 80),
        ) {
            // Invariant: balance — every member gets ⌊N/M⌋ or ⌈N/M⌉ names, whatever the holders.
            let names = names(width);
            let members = uniform(count, &names);
            let holders: BTreeMap<String, String> = names
                .iter()
                .zip(&held)
                .filter_map(|(n, h)| h.map(|h| (n.clone(), format!("m{h}"))))
                .collect();
            let assignment = assign(&members, &holders);
            prop_assert_eq!(assignment.len(), width);
            for member in &members {
                let got = count_of(&assignment, &member.member);
                prop_assert!(
                    got == width / count || got == width.div_ceil(count),
                    "{} got {}", member.member, got
                );
            }
        }

        #[test]
        fn weighted_shares_are_within_one_of_the_ideal(
            weights in prop::collection::vec(1u32..=MAX_WEIGHT, 1..=6),
            width in 0usize..=80,
        ) {
            // Invariant: balance by weight — each member gets within 1 of N·w/W names.
            let names = names(width);
            let mut members = uniform(weights.len(), &names);
            for (member, weight) in members.iter_mut().zip(&weights) {
                member.weight = *weight;
            }
            let assignment = assign(&members, &none());
            let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
            for member in &members {
                let got = count_of(&assignment, &member.member) as u64;
                let ideal_times_total = width as u64 * u64::from(member.weight);
                // |got − N·w/W| < 1, multiplied by W.
                prop_assert!(
                    got * total + total > ideal_times_total && got * total < ideal_times_total + total,
                    "{} (weight {}) got {} of {}", member.member, member.weight, got, width
                );
            }
        }

        #[test]
        fn a_join_moves_the_minimum_and_only_to_the_newcomer(
            count in 1usize..=6,
            width in 0usize..=80,
            held in prop::collection::vec(prop::option::of(0usize..=6), 80),
        ) {
            // Invariant: minimal movement — a join moves Σ max(0, old count − new quota) names, all to the newcomer.
            let names = names(width);
            let old = uniform(count, &names);
            let holders: BTreeMap<String, String> = names
                .iter()
                .zip(&held)
                .filter_map(|(n, h)| h.map(|h| (n.clone(), format!("m{h}"))))
                .collect();
            let before = assign(&old, &holders);
            let new = uniform(count + 1, &names);
            let newcomer = format!("m{count}");
            let after = assign(&new, &holders_of(&before));
            let quota = quota_of(&new);
            let minimum: usize = old
                .iter()
                .map(|m| count_of(&before, &m.member).saturating_sub(quota[&m.member]))
                .sum();
            let moved = moved(&before, &after);
            prop_assert_eq!(moved.len(), minimum);
            for name in moved {
                prop_assert_eq!(after.owner(name), Some(newcomer.as_str()));
            }
        }

        #[test]
        fn a_weighted_join_moves_the_minimum(
            weights in prop::collection::vec(1u32..=5, 2..=7),
            width in 0usize..=80,
        ) {
            // Invariant: minimal movement with weights — a join moves exactly Σ max(0, old count − new quota).
            let names = names(width);
            let mut all = uniform(weights.len(), &names);
            for (member, weight) in all.iter_mut().zip(&weights) {
                member.weight = *weight;
            }
            let old = &all[..all.len() - 1];
            let before = assign(old, &none());
            let after = assign(&all, &holders_of(&before));
            let quota = quota_of(&all);
            let minimum: usize = old
                .iter()
                .map(|m| count_of(&before, &m.member).saturating_sub(quota[&m.member]))
                .sum();
            prop_assert_eq!(moved(&before, &after).len(), minimum);
        }

        #[test]
        fn a_leave_moves_only_the_leavers_names(
            count in 2usize..=7,
            width in 0usize..=80,
            leaver in 0usize..7,
        ) {
            // Invariant: on a leave (equal weights) the others keep their names and the result is balanced again.
            let names = names(width);
            let all = uniform(count, &names);
            let before = assign(&all, &none());
            let mut rest = all.clone();
            let gone = rest.remove(leaver % count);
            let after = assign(&rest, &holders_of(&before));
            for (name, owner) in before.iter() {
                if owner != gone.member {
                    prop_assert_eq!(after.owner(name), Some(owner));
                }
            }
            let left = count - 1;
            for member in &rest {
                let got = count_of(&after, &member.member);
                prop_assert!(got == width / left || got == width.div_ceil(left));
            }
        }
    }
}
