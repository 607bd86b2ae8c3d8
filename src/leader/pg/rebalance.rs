//! A group's rebalance by one of its members: claim it, read the members that count and the stored assignment,
//! compute the next one ([`assign`]) and store the names that move.

use std::collections::BTreeMap;

use crate::error::Result;
use crate::leader::assign::assign;
use crate::leader::group::Membership;
use crate::membership::{NameSets, Rebalance};
use crate::metrics::METRIC_GROUP_REBALANCES;
use crate::store::Store;

/// Rebalances `membership`'s group if this member gets the claim: [`Rebalance::Assigned`] with the new
/// generation (also recorded on the membership), or what the claim or the store answered instead.
///
/// The claim is a courtesy, not a lock: two members computing at once (one whose claim lapsed) cannot both
/// store, since the store compares the stored generation with the one the computation started from.
pub(super) async fn rebalance(
    store: &Store,
    name_sets: &NameSets,
    membership: &Membership,
) -> Result<Rebalance> {
    let member = membership.member_data();
    let groups = store.groups();
    let (version, generation) = match groups.claim_rebalance(&member).await? {
        Rebalance::Claim {
            version,
            generation,
            ..
        } => (version, generation),
        other => return Ok(other),
    };
    let inputs = groups.rebalance_inputs(member.group(), name_sets).await?;
    let stored = groups.assignment(member.group()).await?;
    if stored.generation != generation {
        // Stored by another member since the claim (its claim had lapsed): this computation would be refused.
        return Ok(Rebalance::Stale);
    }
    let next = assign(&inputs, &stored.owners);
    let mut moves = BTreeMap::new();
    for (name, owner) in next.iter() {
        if stored.owners.get(name).map(String::as_str) != Some(owner) {
            moves.insert(name.to_owned(), owner.to_owned());
        }
    }
    let removed: Vec<String> = stored
        .owners
        .keys()
        .filter(|name| next.owner(name).is_none())
        .cloned()
        .collect();
    let counted: Vec<String> = inputs.iter().map(|m| m.member.clone()).collect();
    tracing::info!(
        group = %member.qualified_group(),
        members = counted.len(),
        names = next.len(),
        moves = moves.len(),
        removed = removed.len(),
        "rebalancing the group"
    );
    let answer = groups
        .store_assignment(&member, version, generation, &moves, &removed, &counted)
        .await?;
    if let Rebalance::Assigned { generation } = answer {
        membership.note_generation(generation);
        metrics::counter!(METRIC_GROUP_REBALANCES, "group" => member.qualified_group().to_owned())
            .increment(1);
    }
    Ok(answer)
}
