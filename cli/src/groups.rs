//! Replica groups as an operator reads them (`pgfence status`, the spread demo): each group's member rows, the
//! group's stored assignment (which member each name is assigned to), and where the names led now differ from
//! it.
//!
//! The assignment is the one the group stored (`pgfence.group_members.assigned`), not recomputed here: what
//! `status` calls desired is what the members act on. A name assigned to a member that is no longer live counts
//! as not led as assigned until the group is assigned again.

use std::collections::{BTreeMap, BTreeSet};

use pgfence::groups::GroupMember;
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
    /// Name → the member the stored assignment gives it.
    pub(crate) assignment: Stored,
    /// Names where the desired and the actual leader differ, sorted.
    pub(crate) mismatched: Vec<String>,
    /// No name differs, and every live member is counted by the stored assignment (a member that joined and
    /// is not counted yet is waiting for the next assignment: the group is not balanced until then).
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

/// A group's stored assignment: name → member.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(transparent)]
pub(crate) struct Stored(BTreeMap<String, String>);

impl Stored {
    /// The member `name` is assigned to.
    pub(crate) fn owner(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// The names assigned to `member`, sorted.
    pub(crate) fn names_of(&self, member: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(_, owner)| *owner == member)
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// How many names are assigned.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

fn view(group: String, rows: Vec<GroupMember>) -> GroupView {
    let assignment = Stored(
        rows.iter()
            .flat_map(|r| r.assigned.iter().map(|n| (n.clone(), r.member.clone())))
            .collect(),
    );
    // A name is led as assigned when its member is live and leads it (`leads` holds assigned names only).
    let mismatched: Vec<String> = rows
        .iter()
        .flat_map(|r| {
            r.assigned
                .iter()
                .filter(move |n| !r.live || !r.leads.contains(n))
                .cloned()
        })
        .collect::<BTreeSet<String>>()
        .into_iter()
        .collect();
    let every_live_counted = rows.iter().all(|r| !r.live || r.counted);
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
            let assigned = row.assigned.clone();
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
        balanced: mismatched.is_empty() && every_live_counted,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(member: &str, live: bool, assigned: &[&str], leads: &[&str]) -> GroupMember {
        serde_json::from_value(serde_json::json!({
            "group": "c/g",
            "member": member,
            "incarnation": 1,
            "weight": 1,
            "live": live,
            "settled": live,
            "counted": true,
            "left": member == "quit",
            "expires_in": {"secs": if live { 10 } else { 0 }, "nanos": 0},
            "flaps": 0,
            "name_count": 4,
            "pinned": [],
            "excluded": [],
            "assigned": assigned,
            "leads": leads,
        }))
        .unwrap()
    }

    /// A group is balanced when each stored name is led by its live member, and not before.
    #[test]
    fn a_group_is_balanced_when_every_name_is_led_by_its_assigned_member() {
        let rows = vec![
            row("m1", true, &["a", "b"], &[]),
            row("m2", true, &["c", "d"], &["c"]),
        ];
        let unled = &views(rows)[0];
        assert_eq!(unled.mismatched, ["a", "b", "d"]);
        assert!(!unled.balanced);
        assert_eq!(unled.assignment.names_of("m1"), ["a", "b"]);
        let led = vec![
            row("m1", true, &["a", "b"], &["a", "b"]),
            row("m2", true, &["c", "d"], &["c", "d"]),
        ];
        let view = &views(led)[0];
        assert!(view.balanced, "{view:?}");
        assert_eq!(view.members[0].assigned, ["a", "b"]);
        assert_eq!(view.assignment.owner("d"), Some("m2"));
    }

    /// A name still assigned to a member that expired is not led as assigned, even if that member's lease is
    /// still live: the group has not been assigned again yet.
    #[test]
    fn a_member_that_is_not_live_is_left_or_expired_and_its_names_are_not_led() {
        let rows = vec![
            row("gone", false, &["a"], &["a"]),
            row("here", true, &["b"], &["b"]),
            row("quit", false, &[], &[]),
        ];
        let view = &views(rows)[0];
        let state: Vec<_> = view.members.iter().map(|m| m.state).collect();
        assert_eq!(
            state,
            [MemberState::Expired, MemberState::Live, MemberState::Left]
        );
        assert_eq!(view.mismatched, ["a"]);
    }
}
