//! The assignment's rules by example, the values pinned across versions, and (in `props`) the same rules over
//! random groups.

use super::hash::{
    fnv1a, pair_hash, pair_prefix, splitmix64, str_hash, weighted_score, FNV_OFFSET,
};
use super::*;

mod props;

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
    std::sync::Arc::make_mut(&mut members[1].names).insert("only-excluded".to_owned());
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
    "m0", "m0", "m1", "m1", "m2", "m1", "m2", "m2", "m1", "m0", "m2", "m0",
];

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
