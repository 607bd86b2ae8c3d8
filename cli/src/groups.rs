//! Replica groups as an operator reads them (`pgfence status`, the spread demo): each group's member rows, the
//! assignment the group's members derive from its live rows, and where the names led now differ from it.
//!
//! The assignment is recomputed here with the library's own pure function ([`assign()`]) from the same inputs the
//! members read (`pgfence.roster` is `pgfence.group_members` filtered to live rows): so what `status` calls
//! desired is what every live member computes, not a second opinion.

use std::collections::{BTreeMap, BTreeSet};

use pgfence::groups::{GroupMember, RosterMember};
use pgfence::leader::{assign, Assignment};
use pgfence::Store;
use serde::Serialize;

use super::Failure;

/// Whether a member row counts now, and if not, how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum MemberState {
    /// Live by the database clock: it counts for the assignment.
    Live,
    /// Its ttl ran out without a heartbeat (killed, partitioned, stalled): its next join is a flap.
    Expired,
    /// It left the group in order.
    Left,
}

impl MemberState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            MemberState::Live => "live",
            MemberState::Expired => "expired",
            MemberState::Left => "left",
        }
    }
}

/// One member row with its state and the names the group's assignment gives it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct MemberView {
    #[serde(flatten)]
    pub(crate) row: GroupMember,
    pub(crate) state: MemberState,
    /// The names the assignment gives it (none unless it is live).
    pub(crate) assigned: Vec<String>,
}

/// One group: its rows, the assignment computed from its live rows, and the names whose leader now is not
/// the one the assignment wants (led by another member, or by nobody).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct GroupView {
    /// The cluster-qualified group name.
    pub(crate) group: String,
    pub(crate) members: Vec<MemberView>,
    /// Name → the member the assignment gives it.
    pub(crate) assignment: Assignment,
    /// Names where the desired and the actual leader differ, sorted.
    pub(crate) mismatched: Vec<String>,
    /// No name differs.
    pub(crate) balanced: bool,
}

impl GroupView {
    /// Names each member leads now, by member (every row, live or not: a member that just expired may still
    /// hold a lease until its own ttl runs out).
    pub(crate) fn leads(&self) -> BTreeMap<String, Vec<String>> {
        self.members
            .iter()
            .map(|m| (m.row.member.clone(), m.row.leads.clone()))
            .collect()
    }

    /// The live members' names.
    pub(crate) fn live(&self) -> BTreeSet<String> {
        self.members
            .iter()
            .filter(|m| m.state == MemberState::Live)
            .map(|m| m.row.member.clone())
            .collect()
    }
}

/// The groups of `rows` (in group and member order, as `Groups::members` returns them); `left` holds the
/// (group, member) pairs whose row records a leave.
pub(crate) fn views(rows: Vec<GroupMember>) -> Vec<GroupView> {
    let mut by_group: BTreeMap<String, Vec<GroupMember>> = BTreeMap::new();
    for row in rows {
        by_group.entry(row.group.clone()).or_default().push(row);
    }
    by_group
        .into_iter()
        .map(|(group, rows)| view(group, rows))
        .collect()
}

fn view(group: String, rows: Vec<GroupMember>) -> GroupView {
    // The roster: the live rows, as `pgfence.roster` gives them to the members.
    let roster: Vec<RosterMember> = rows
        .iter()
        .filter(|r| r.live)
        .map(|r| {
            let mut member = RosterMember::new(r.member.clone(), r.names.iter().cloned());
            member.weight = r.weight;
            member.settled = r.settled;
            member.pinned = r.pinned.iter().cloned().collect();
            member.excluded = r.excluded.iter().cloned().collect();
            member
        })
        .collect();
    let holders: BTreeMap<String, String> = rows
        .iter()
        .filter(|r| r.live)
        .flat_map(|r| r.leads.iter().map(|n| (n.clone(), r.member.clone())))
        .collect();
    let assignment = assign(&roster, &holders);
    // Who leads each name now, live member or not.
    let actual: BTreeMap<&str, &str> = rows
        .iter()
        .flat_map(|r| r.leads.iter().map(|n| (n.as_str(), r.member.as_str())))
        .collect();
    let names: BTreeSet<&str> = assignment
        .iter()
        .map(|(name, _)| name)
        .chain(actual.keys().copied())
        .collect();
    let mismatched: Vec<String> = names
        .into_iter()
        .filter(|n| assignment.owner(n) != actual.get(n).copied())
        .map(str::to_owned)
        .collect();
    let members = rows
        .into_iter()
        .map(|row| {
            let state = if row.live {
                MemberState::Live
            } else if row.left {
                MemberState::Left
            } else {
                MemberState::Expired
            };
            let assigned = assignment
                .names_of(&row.member)
                .into_iter()
                .map(str::to_owned)
                .collect();
            MemberView {
                row,
                state,
                assigned,
            }
        })
        .collect();
    GroupView {
        group,
        members,
        balanced: mismatched.is_empty(),
        assignment,
        mismatched,
    }
}

/// Every group the role can read, as [`views`] of `Groups::members`; `group` narrows it to one
/// (cluster-qualified) group.
pub(crate) async fn read_group(
    store: &Store,
    group: Option<&str>,
) -> Result<Vec<GroupView>, Failure> {
    let rows = store.groups().members(group).await?;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    Ok(views(rows))
}

/// Every group the role can read.
pub(crate) async fn read(store: &Store) -> Result<Vec<GroupView>, Failure> {
    read_group(store, None).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(member: &str, live: bool, names: &[&str], leads: &[&str]) -> GroupMember {
        serde_json::from_value(serde_json::json!({
            "group": "c/g",
            "member": member,
            "incarnation": 1,
            "weight": 1,
            "live": live,
            "settled": live,
            "left": member == "quit",
            "expires_in": {"secs": if live { 10 } else { 0 }, "nanos": 0},
            "flaps": 0,
            "names": names,
            "pinned": [],
            "excluded": [],
            "leads": leads,
        }))
        .unwrap()
    }

    #[test]
    fn a_group_is_balanced_when_every_name_is_led_by_its_assigned_member() {
        let names = ["a", "b", "c", "d"];
        let rows = vec![row("m1", true, &names, &[]), row("m2", true, &names, &[])];
        let unled = &views(rows.clone())[0];
        assert_eq!(unled.mismatched, names.to_vec());
        assert!(!unled.balanced);
        // Lead exactly what the assignment says: balanced.
        let m1: Vec<&str> = unled.assignment.names_of("m1");
        let m2: Vec<&str> = unled.assignment.names_of("m2");
        assert_eq!((m1.len(), m2.len()), (2, 2));
        let led = vec![row("m1", true, &names, &m1), row("m2", true, &names, &m2)];
        let view = &views(led)[0];
        assert!(view.balanced, "{view:?}");
        assert_eq!(view.members[0].assigned, m1);
    }

    #[test]
    fn a_member_that_is_not_live_is_left_or_expired_and_is_assigned_nothing() {
        let names = ["a", "b"];
        let rows = vec![
            row("gone", false, &names, &["a"]),
            row("here", true, &names, &["b"]),
            row("quit", false, &names, &[]),
        ];
        let view = &views(rows)[0];
        let state: Vec<_> = view.members.iter().map(|m| m.state).collect();
        assert_eq!(
            state,
            [MemberState::Expired, MemberState::Live, MemberState::Left]
        );
        assert!(view.members[0].assigned.is_empty());
        assert_eq!(view.members[1].assigned, ["a", "b"]);
        // "a" is still held by the expired member: the live one should lead it.
        assert_eq!(view.mismatched, ["a"]);
    }
}
