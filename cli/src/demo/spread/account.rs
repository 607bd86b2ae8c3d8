//! The closing account: the database's record of the run (the overlap review of every name, the audit of the
//! refused writes) beside the writes the replicas reported, and the checks on them.

use std::collections::BTreeMap;

use pgfence::admin::RejectionFilter;
use pgfence::Store;
use serde_json::Value;

use super::events::reported_writes;
use super::report::{NameReview, TenureRow, Writes};
use crate::demo::{scalar, Check};
use crate::Failure;

/// Reads the database's account of the run and checks it against the replicas' (`events`): no write of an old
/// epoch accepted after its successor's acquisition, the overrunning drains refused once r4 acquired, every
/// refused write audited. Returns the reviews of the names that moved (in the join or the kill) and the writes
/// counted.
pub(super) async fn check(
    admin: &Store,
    cluster: &str,
    events: &[Value],
    victim: &str,
    join_moved: &[String],
    kill_moved: &[String],
    checks: &mut Vec<Check>,
) -> Result<(Vec<NameReview>, Writes), Failure> {
    let writes = reported_writes(events);
    let mut filter = RejectionFilter::default();
    filter.limit = Some(100_000);
    let rejections = admin.admin().rejections(&filter).await?;
    let prefix = format!("{cluster}/");
    let mut audited: BTreeMap<(String, i64), i64> = BTreeMap::new();
    let mut unattributed = 0;
    for r in rejections.iter().filter(|r| r.operation == "create_task") {
        match (r.scope.as_str(), r.lease.strip_prefix(&prefix)) {
            ("tenure", Some(name)) => {
                *audited
                    .entry((name.to_owned(), r.presented_epoch))
                    .or_default() += r.count
            }
            _ => unattributed += r.count,
        }
    }
    let holders: BTreeMap<(String, i64), String> = events
        .iter()
        .filter(|e| e["event"] == "lead")
        .filter_map(|e| {
            Some((
                (e["name"].as_str()?.to_owned(), e["epoch"].as_i64()?),
                e["member"].as_str()?.to_owned(),
            ))
        })
        .collect();
    let mut totals = Writes::default();
    let mut audit_ok = unattributed == 0;
    let mut mismatches = Vec::new();
    for (key, (accepted, refused)) in &writes {
        totals.accepted += accepted;
        totals.refused += refused;
        let count = audited.get(key).copied().unwrap_or(0);
        // A killed replica may have been refused (and audited) without living to print it.
        let killed = holders.get(key).map(String::as_str) == Some(victim);
        if count != *refused as i64 && !(killed && count > *refused as i64) {
            audit_ok = false;
            mismatches.push(format!(
                "{} epoch {}: {refused} refused, {count} audited",
                key.0, key.1
            ));
        }
    }
    totals.audited = audited.values().sum::<i64>() + unattributed;
    let moved_in = |name: &str| {
        let mut steps = Vec::new();
        if join_moved.iter().any(|n| n == name) {
            steps.push("join");
        }
        if kill_moved.iter().any(|n| n == name) {
            steps.push("kill");
        }
        steps
    };
    let mut reviews = Vec::new();
    let mut overrun_refused = Vec::new();
    for name in super::names() {
        let review = admin.history().review(&name).await?;
        totals.accepted_after_successor += review
            .iter()
            .filter(|r| r.accepted_after_successor.is_some())
            .count();
        // The tenure r4's first tenure of a join-moved name succeeded: its drain wrote past the release.
        if join_moved.contains(&name) {
            let handed = review.iter().find(|r| {
                r.tenure.holder != "r4" && r.successor.as_ref().is_some_and(|s| s.holder == "r4")
            });
            overrun_refused.push((
                name.clone(),
                handed.map_or(0, |r| {
                    r.refusals_after_successor
                        .iter()
                        .map(|x| x.count)
                        .sum::<i64>()
                }),
            ));
        }
        let steps = moved_in(&name);
        if steps.is_empty() {
            continue;
        }
        let tenures = review
            .into_iter()
            .map(|review| {
                let key = (name.clone(), review.tenure.epoch.get());
                let (accepted, refused) = writes.get(&key).copied().unwrap_or_default();
                TenureRow {
                    writes_accepted: accepted,
                    writes_refused: refused,
                    audited: audited.get(&key).copied().unwrap_or(0),
                    review,
                }
            })
            .collect();
        reviews.push(NameReview {
            name,
            moved_in: steps,
            tenures,
        });
    }
    let late = scalar(
        admin,
        "SELECT count(*) AS n FROM pgfence.task_events e JOIN pgfence.tenures t \
           ON t.lease = e.lease AND t.epoch > e.epoch \
          WHERE split_part(e.lease, '/', 1) = $1 AND e.created_at >= t.acquired_at",
        cluster,
    )
    .await?;
    checks.push(Check {
        invariant: "no write of an old epoch accepted after its successor's acquisition",
        held: totals.accepted_after_successor == 0 && late == 0,
        detail: format!(
            "{} accepted writes, {} tenures with one after their successor's acquisition (review), {late} old-epoch \
             task events after a newer acquisition",
            totals.accepted, totals.accepted_after_successor
        ),
    });
    checks.push(Check {
        invariant: "the overrunning drains were refused once r4 acquired",
        held: !overrun_refused.is_empty() && overrun_refused.iter().all(|(_, n)| *n > 0),
        detail: overrun_refused
            .iter()
            .map(|(name, n)| format!("{name}: {n} refused after r4's acquisition"))
            .collect::<Vec<_>>()
            .join(", "),
    });
    checks.push(Check {
        invariant: "every refused write is audited",
        held: audit_ok && totals.refused > 0,
        detail: if mismatches.is_empty() {
            format!(
                "{} refused (as the replicas reported), {} counted in pgfence.rejections",
                totals.refused, totals.audited
            )
        } else {
            mismatches.join("; ")
        },
    });
    Ok((reviews, totals))
}
