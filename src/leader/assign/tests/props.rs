//! Property tests over random groups: every rule of [`assign`] holds for any roster and any holders.

use proptest::prelude::*;

use super::*;

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
                            std::sync::Arc::make_mut(&mut m.names).insert(name.clone());
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
