//! `pgfence tasks`: the effect ledger for operators — the effects in doubt that a successor has to settle
//! (`--in-doubt`, of one lease or of every lease the role may read), or every attempt of one task's effects
//! (`--lease L --task K`) — and the ledger beside the tenures in `pgfence history --json`.

use pgfence::effects::{Attempt, EffectState};
use pgfence::history::TenureReview;
use pgfence::Epoch;
use serde::Serialize;

use crate::output::{emit, print_json};
use crate::{require_lease, split_lease};
use crate::{table, CliResult, Global};

/// What `pgfence tasks` lists (clap has checked that exactly one was asked for, and that `--task` has a lease).
pub(crate) enum Listing {
    /// The effects in doubt: of this lease, or of every lease the role may read.
    InDoubt { lease: Option<String> },
    /// Every attempt of the effects of task `task` of `lease`.
    Task { lease: String, task: String },
}

pub(crate) async fn tasks(global: &Global, listing: Listing, json: bool) -> CliResult {
    match listing {
        Listing::InDoubt { lease: None } => {
            let store = global.store(&global.cluster).await?;
            let rows = store.effects().all_in_doubt().await?;
            if json {
                return print_json(&rows);
            }
            emit(&table::in_doubt(&rows))
        }
        Listing::InDoubt { lease: Some(lease) } => {
            let (cluster, name) = split_lease(&lease, &global.cluster);
            let store = global.store(&cluster).await?;
            require_lease(&store, &name).await?;
            let rows = store.effects().in_doubt(&name).await?;
            if json {
                return print_json(&rows);
            }
            emit(&table::in_doubt(&rows))
        }
        Listing::Task { lease, task } => {
            let (cluster, name) = split_lease(&lease, &global.cluster);
            let store = global.store(&cluster).await?;
            require_lease(&store, &name).await?;
            let attempts = store.effects().task_ledger(&name, &task).await?;
            if json {
                return print_json(&attempts);
            }
            let mut text = format!(
                "Effect ledger of task {} of {}/{}: every attempt, oldest first; times UTC, database clock\n",
                table::value(&task),
                table::value(&cluster),
                table::value(&name)
            );
            text.push_str(&table::ledger(&attempts));
            emit(&text)
        }
    }
}

/// An attempt a tenure settled, as `pgfence history --json` lists it under the settling tenure (the attempt
/// itself is under the tenure that intended it).
#[derive(Debug, Serialize)]
pub(crate) struct Settled {
    /// The effect key.
    key: String,
    /// The attempt's number.
    attempt: u32,
    /// The tenure that intended it.
    epoch: Epoch,
    /// How it was settled.
    settlement: Option<EffectState>,
    /// When.
    settled_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// One element of `pgfence history --json`: the tenure's review as before (its fields unchanged, at the same
/// level), with the attempts it intended (`effects`) and the attempts it settled (`settled`).
#[derive(Debug, Serialize)]
pub(crate) struct HistoryEntry<'a> {
    #[serde(flatten)]
    review: &'a TenureReview,
    effects: Vec<&'a Attempt>,
    settled: Vec<Settled>,
}

/// The elements of `pgfence history --json`, one per tenure, oldest first.
pub(crate) fn history_entries<'a>(
    reviews: &'a [TenureReview],
    attempts: &'a [Attempt],
) -> Vec<HistoryEntry<'a>> {
    reviews
        .iter()
        .map(|review| {
            let epoch = review.tenure.epoch;
            HistoryEntry {
                review,
                effects: attempts
                    .iter()
                    .filter(|a| a.effect.epoch == epoch)
                    .collect(),
                settled: attempts
                    .iter()
                    .filter(|a| a.effect.settled_by == Some(epoch))
                    .map(|a| Settled {
                        key: a.effect.key.clone(),
                        attempt: a.effect.attempt,
                        epoch: a.effect.epoch,
                        settlement: a.settlement,
                        settled_at: a.settled_at,
                    })
                    .collect(),
            }
        })
        .collect()
}
