//! The group as the database shows it during the story: its view, the names each live member leads, the wait
//! until it converges, and each controller's epoch, whose change says which names moved.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use pgfence::Store;

use super::fleet::Fleet;
use super::NAMES;
use crate::groups::{self, GroupView};
use crate::Failure;

/// The group's view now (`None` before any member joined).
async fn group_view(admin: &Store, qualified: &str) -> Result<Option<GroupView>, Failure> {
    Ok(groups::read_group(admin, Some(qualified))
        .await?
        .into_iter()
        .next())
}

/// Names led by each live member.
pub(super) fn live_leads(view: Option<&GroupView>) -> BTreeMap<String, Vec<String>> {
    let Some(view) = view else {
        return BTreeMap::new();
    };
    let live = view.live();
    view.leads()
        .into_iter()
        .filter(|(m, _)| live.contains(m))
        .collect()
}

/// Waits (bounded) until exactly `members` are live and lead what the group's assignment gives them, every name
/// led; returns the last view and whether it converged. Stops early when a replica exited.
pub(super) async fn converge(
    admin: &Store,
    qualified: &str,
    fleet: &mut Fleet,
    members: &BTreeSet<String>,
    within: Duration,
) -> Result<(Option<GroupView>, bool), Failure> {
    let started = Instant::now();
    loop {
        let view = group_view(admin, qualified).await?;
        if let Some(v) = &view {
            if &v.live() == members && v.balanced && v.assignment.len() == NAMES {
                return Ok((view, true));
            }
        }
        if started.elapsed() > within || fleet.crashed().is_some() {
            return Ok((view, false));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Epoch of each controller's lease in the cluster.
pub(super) async fn epochs(admin: &Store, cluster: &str) -> Result<BTreeMap<String, i64>, Failure> {
    let prefix = format!("{cluster}/");
    Ok(admin
        .admin()
        .all_leases()
        .await?
        .into_iter()
        .filter_map(|l| {
            let name = l.name.strip_prefix(&prefix)?.to_owned();
            Some((name, l.epoch?.get()))
        })
        .collect())
}

pub(super) fn moved(before: &BTreeMap<String, i64>, after: &BTreeMap<String, i64>) -> Vec<String> {
    after
        .iter()
        .filter(|(name, epoch)| before.get(*name) != Some(epoch))
        .map(|(name, _)| name.clone())
        .collect()
}
