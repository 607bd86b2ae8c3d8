//! `pgfence status`, readable at any size: every lease and every replica group in detail on a small deployment,
//! summaries on a fleet, and flags to go deeper (`--group`, `--lease`, `--all`).
//!
//! Above [`DETAIL_LIMIT`] leases the leases are summed up per cluster (held, expired, released, distinct holders
//! and the few holding the most); a group with more than [`DETAIL_LIMIT`] names or member rows gets one line per
//! member with counts instead of its name lists. `--json` prints every row whatever the size (the filters
//! apply). Every stored string goes through the table's escaping.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use clap::Args;
use pgfence::{LeaseState, LeaseStatus, Store};

use crate::groups::{self, GroupView, MemberState};
use crate::output::{emit, print_json};
use crate::{split_lease, table, CliResult, Failure, Global};

/// Above this many leases shown, or this many names or member rows in a group, `status` prints a summary
/// instead of every row (`--all` prints every row whatever the size).
pub(crate) const DETAIL_LIMIT: usize = 50;
/// How many holders a cluster's summary names (those holding the most leases).
const TOP_HOLDERS: usize = 3;
/// How many of the names that differ from the assignment a group's summary names.
const DIFFER_SHOWN: usize = 5;

/// `pgfence status`'s options.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Print JSON instead of text: every lease and every group with every member's names, whatever the size
    /// (--group and --lease narrow it as they narrow the text).
    #[arg(long)]
    json: bool,
    /// Every lease and every member's names as rows, whatever the size (by default a summary replaces the
    /// lease rows above 50 leases, and a group's name lists above 50 names or members).
    #[arg(long)]
    all: bool,
    /// Only this replica group (`CLUSTER/GROUP`, or `GROUP` in --cluster), in detail: each member with the
    /// names it leads and is assigned. Leases are then shown only with --lease.
    #[arg(long, value_name = "GROUP")]
    group: Option<String>,
    /// Only the leases whose name matches (`CLUSTER/NAME`, or `NAME` in --cluster; `*` matches any run of
    /// characters: `prod/shard-1*`, `*/scheduler`). Groups are then shown only with --group.
    #[arg(long, value_name = "PATTERN")]
    lease: Option<String>,
}

/// `pgfence status --json`: every lease, then every replica group the role can read.
#[derive(serde::Serialize)]
struct StatusReport {
    leases: Vec<LeaseStatus>,
    groups: Vec<GroupView>,
}

pub(crate) async fn status(global: &Global, args: StatusArgs) -> CliResult {
    let qualify = |text: &str| {
        let (cluster, name) = split_lease(text, &global.cluster);
        format!("{cluster}/{name}")
    };
    let pattern = args.lease.as_deref().map(qualify);
    let only_group = args.group.as_deref().map(qualify);
    let want_leases = only_group.is_none() || pattern.is_some();
    let want_groups = pattern.is_none() || only_group.is_some();
    let store = global.store(&global.cluster).await?;
    // The two reads at once, on the pool's two connections.
    let (mut leases, groups) = tokio::try_join!(
        async {
            if want_leases {
                Ok(store.admin().all_leases().await?)
            } else {
                Ok(Vec::new())
            }
        },
        async {
            if want_groups {
                groups::read_group(&store, only_group.as_deref()).await
            } else {
                Ok(Vec::new())
            }
        },
    )?;
    if let (Some(group), true) = (&only_group, groups.is_empty()) {
        return Err(Failure::new(
            6,
            format!("no replica group {group} (or none this role may read)"),
        ));
    }
    if let Some(pattern) = &pattern {
        leases.retain(|l| matches(pattern, &l.name));
    }
    if args.json {
        return print_json(&StatusReport { leases, groups });
    }
    let mut text = String::new();
    if want_leases {
        if args.all || leases.len() <= DETAIL_LIMIT {
            text.push_str(&table::leases(&leases));
        } else {
            text.push_str(&lease_summary(&leases, pattern.is_some()));
        }
    }
    let detailed = |g: &GroupView| args.all || only_group.is_some() || is_small(g);
    let generations = if groups.iter().all(detailed) {
        HashMap::new()
    } else {
        generations(&store, &groups).await
    };
    for group in &groups {
        if !text.is_empty() {
            text.push('\n');
        }
        if detailed(group) {
            text.push_str(&table::group(group));
        } else {
            text.push_str(&group_summary(
                group,
                generations.get(&group.group).copied(),
            ));
        }
    }
    emit(&text)
}

/// Whether `name` matches `pattern`, where `*` matches any run of characters and every other character itself.
pub(crate) fn matches(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // Greedy with backtracking to the last star: O(|pattern| × |name|) at worst.
    let (mut i, mut j, mut star, mut resume) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && p[i] == '*' {
            star = Some(i);
            resume = j;
            i += 1;
        } else if i < p.len() && p[i] == n[j] {
            i += 1;
            j += 1;
        } else if let Some(s) = star {
            i = s + 1;
            resume += 1;
            j = resume;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

/// Whether a group is small enough to list each member's names.
fn is_small(group: &GroupView) -> bool {
    let names = group
        .members
        .iter()
        .map(|m| m.row.name_count)
        .chain([group.assignment.len()])
        .max()
        .unwrap_or(0);
    names <= DETAIL_LIMIT && group.members.len() <= DETAIL_LIMIT
}

/// Per cluster: the leases held, expired and released, the distinct holders of the held ones and the few
/// holding the most.
pub(crate) fn lease_summary(leases: &[LeaseStatus], filtered: bool) -> String {
    #[derive(Default)]
    struct Counts<'a> {
        leases: usize,
        held: usize,
        expired: usize,
        released: usize,
        holders: HashMap<&'a str, usize>,
    }
    let mut clusters: BTreeMap<&str, Counts> = BTreeMap::new();
    for lease in leases {
        let cluster = lease.name.split_once('/').map_or("", |(c, _)| c);
        let counts = clusters.entry(cluster).or_default();
        counts.leases += 1;
        match lease.state {
            LeaseState::Held => {
                counts.held += 1;
                if let Some(holder) = &lease.holder {
                    *counts.holders.entry(holder.as_str()).or_default() += 1;
                }
            }
            LeaseState::Expired => counts.expired += 1,
            _ => counts.released += 1,
        }
    }
    let rows: Vec<Vec<String>> = clusters
        .iter()
        .map(|(cluster, c)| {
            let mut top: Vec<(&str, usize)> = c.holders.iter().map(|(h, n)| (*h, *n)).collect();
            top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
            let mut most: Vec<String> = top
                .iter()
                .take(TOP_HOLDERS)
                .map(|(h, n)| format!("{h} ({n})"))
                .collect();
            if top.len() > TOP_HOLDERS {
                most.push("…".to_owned());
            }
            vec![
                (*cluster).to_owned(),
                c.leases.to_string(),
                c.held.to_string(),
                c.expired.to_string(),
                c.released.to_string(),
                c.holders.len().to_string(),
                if most.is_empty() {
                    "-".to_owned()
                } else {
                    most.join(", ")
                },
            ]
        })
        .collect();
    let mut out = format!(
        "{} lease{}{} in {} cluster{}: more than {DETAIL_LIMIT}, summed up (--all lists each, --lease PATTERN \
         narrows)\n",
        leases.len(),
        if leases.len() == 1 { "" } else { "s" },
        if filtered { " matching" } else { "" },
        clusters.len(),
        if clusters.len() == 1 { "" } else { "s" },
    );
    out.push_str(&table::render(
        &[
            "CLUSTER",
            "LEASES",
            "HELD",
            "EXPIRED",
            "RELEASED",
            "HOLDERS",
            "HOLDING THE MOST",
        ],
        &rows,
    ));
    out
}

/// One group summed up: a line with its live members, names, generation, whether it is balanced and whether
/// an assignment is due, the spread of names over live members; then one row of counts per member, and the
/// first names that differ from the assignment.
pub(crate) fn group_summary(group: &GroupView, generation: Option<i64>) -> String {
    let names = group.assignment.len();
    let live: Vec<_> = group
        .members
        .iter()
        .filter(|m| m.state == MemberState::Live)
        .collect();
    // Due: a settled live member the stored assignment does not count, or a counted one that is gone.
    let due = group
        .members
        .iter()
        .any(|m| (m.row.live && m.row.settled && !m.row.counted) || (!m.row.live && m.row.counted));
    let (least, most) = live.iter().fold((usize::MAX, 0), |(lo, hi), m| {
        (lo.min(m.assigned.len()), hi.max(m.assigned.len()))
    });
    let spread = if live.is_empty() {
        "no live member".to_owned()
    } else if live.iter().all(|m| m.row.weight == live[0].row.weight) {
        let (floor, ceil) = (names / live.len(), names.div_ceil(live.len()));
        let even = floor <= least && most <= ceil;
        format!(
            "{least}..{most} names per live member ({} ⌊S/M⌋..⌈S/M⌉ = {floor}..{ceil})",
            if even { "within" } else { "outside" }
        )
    } else {
        format!("{least}..{most} names per live member (weighted)")
    };
    let differ = group.mismatched.len();
    let mut out = format!(
        "Group {}: {} live of {} member{}, {names} name{} assigned, generation {}; balanced: {} (desired vs \
         actual differ on {differ} name{}); assignment due: {}; spread: {spread}\n",
        table::value(&group.group),
        live.len(),
        group.members.len(),
        if group.members.len() == 1 { "" } else { "s" },
        if names == 1 { "" } else { "s" },
        generation.map_or_else(|| "-".to_owned(), |g| g.to_string()),
        if group.balanced { "yes" } else { "no" },
        if differ == 1 { "" } else { "s" },
        if due { "yes" } else { "no" },
    );
    let rows: Vec<Vec<String>> = group
        .members
        .iter()
        .map(|m| {
            let r = &m.row;
            let led = if r.live { r.leads.len() } else { 0 };
            vec![
                r.member.clone(),
                m.state.as_str().to_owned(),
                if r.settled { "yes" } else { "no" }.to_owned(),
                if r.counted { "yes" } else { "no" }.to_owned(),
                r.weight.to_string(),
                if r.live {
                    table::duration(Some(r.expires_in))
                } else {
                    "-".to_owned()
                },
                r.flaps.to_string(),
                m.assigned.len().to_string(),
                r.leads.len().to_string(),
                m.assigned.len().saturating_sub(led).to_string(),
            ]
        })
        .collect();
    out.push_str(&table::render(
        &[
            "MEMBER",
            "STATE",
            "SETTLED",
            "COUNTED",
            "WEIGHT",
            "EXPIRES IN",
            "FLAPS",
            "ASSIGNED",
            "LEADS",
            "NOT LED",
        ],
        &rows,
    ));
    if differ > 0 {
        let led_by = table::leaders(group);
        let shown: Vec<String> = group
            .mismatched
            .iter()
            .take(DIFFER_SHOWN)
            .map(|name| table::differing(group, &led_by, name))
            .collect();
        let more = differ.saturating_sub(DIFFER_SHOWN);
        let _ = write!(out, "differ: {}", table::value(&shown.join(", ")));
        if more > 0 {
            let _ = write!(
                out,
                " and {more} more (`pgfence status --group {}` lists them)",
                table::value(&group.group)
            );
        }
        out.push('\n');
    }
    out
}

/// Each summed-up group's generation (the stored assignment's; 0 before the first), read in one statement
/// through `pgfence.assigned_names` (O(one member's names) each). A group whose generation cannot be read is
/// left out: its summary shows `-`.
async fn generations(store: &Store, groups: &[GroupView]) -> HashMap<String, i64> {
    use diesel::sql_types::{Array, BigInt, Text};
    use diesel_async::RunQueryDsl;
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        grp: String,
        #[diesel(sql_type = BigInt)]
        generation: i64,
    }
    let (names, members): (Vec<&str>, Vec<&str>) = groups
        .iter()
        .filter_map(|g| {
            Some((
                g.group.as_str(),
                <[_]>::first(&g.members)?.row.member.as_str(),
            ))
        })
        .unzip();
    let read = async {
        let mut conn = store.admin().conn().await?;
        diesel::sql_query(
            "SELECT t.g AS grp, (pgfence.assigned_names(t.g, t.m)).generation \
             FROM unnest($1::text[], $2::text[]) AS t(g, m)",
        )
        .bind::<Array<Text>, _>(names)
        .bind::<Array<Text>, _>(members)
        .load::<Row>(&mut *conn)
        .await
        .map_err(pgfence::Error::from)
    };
    match read.await {
        Ok(rows) => rows.into_iter().map(|r| (r.grp, r.generation)).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the groups' generations");
            HashMap::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::matches;

    /// A pattern's `*` matches any run of characters (none too), and nothing else is special.
    #[test]
    fn a_star_matches_any_run_and_the_rest_matches_itself() {
        for (pattern, name) in [
            ("c/n1*", "c/n1"),
            ("c/n1*", "c/n123"),
            ("*/sched", "prod/sched"),
            ("c/*a*b", "c/xaab"),
            ("c/n?", "c/n?"),
            ("*", ""),
        ] {
            assert!(matches(pattern, name), "{pattern} {name}");
        }
        for (pattern, name) in [
            ("c/n1*", "c/n2"),
            ("c/n1", "c/n12"),
            ("*/sched", "prod/sched2"),
            ("c/*a*b", "c/xaabc"),
            ("c/n?", "c/n1"),
        ] {
            assert!(!matches(pattern, name), "{pattern} {name}");
        }
    }
}
