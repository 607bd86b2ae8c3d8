//! The leadership runtime's belief reports, batched: the reports of one store that arrive while a batch is in
//! flight go out together in the next statement — each through `pgfence.report_belief`, called laterally over
//! arrays, so one round trip and one commit carry many (a replica a rebalance gave a hundred names reports a
//! hundred starts). A lone report is sent at once. A batch that fails as a whole is sent again report by report,
//! each with its own answer; one that gets no answer within [`REPORT_TIMEOUT`] is counted failed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::BeliefEnd;
use crate::error::Result;
use crate::lease::Lease;
use crate::metrics::METRIC_BELIEF_REPORTS_FAILED;
use crate::store::Store;

/// How long a belief report (or a batch of them) may take before it is given up (and counted as failed).
pub(crate) const REPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The most reports one statement carries (a batch holds one of the pool's connections while it runs).
const MAX_BATCH: usize = 32;

/// One report: the start of the belief in `lease` (its acquisition reply's arrival), or its end at `at` (this
/// process's wall clock).
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) lease: Lease,
    pub(crate) event: &'static str,
    pub(crate) at: DateTime<Utc>,
    pub(crate) end: Option<BeliefEnd>,
}

/// The reports of one store waiting to be sent, and whether a batch of them is in flight.
#[derive(Debug)]
pub(crate) struct BeliefQueue {
    store: Store,
    runtime: tokio::runtime::Handle,
    state: Mutex<(Vec<Report>, bool)>,
}

impl BeliefQueue {
    /// A queue for `store`, sending on the current runtime.
    pub(crate) fn new(store: Store) -> Arc<BeliefQueue> {
        Arc::new(BeliefQueue {
            store,
            runtime: tokio::runtime::Handle::current(),
            state: Mutex::default(),
        })
    }

    /// Queues `report`; it is sent with the next batch (at once when none is in flight).
    pub(crate) fn push(self: &Arc<Self>, report: Report) {
        let start = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.0.push(report);
            !std::mem::replace(&mut state.1, true)
        };
        if start {
            self.runtime.spawn(self.clone().send());
        }
    }

    /// Sends batches until none waits.
    async fn send(self: Arc<Self>) {
        loop {
            let batch: Vec<Report> = {
                let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                if state.0.is_empty() {
                    state.1 = false;
                    return;
                }
                let take = state.0.len().min(MAX_BATCH);
                state.0.drain(..take).collect()
            };
            let history = self.store.history();
            match tokio::time::timeout(REPORT_TIMEOUT, history.report_beliefs(&batch)).await {
                Ok(Ok(answers)) => {
                    for (report, answer) in batch.iter().zip(answers) {
                        outcome(report, Some(answer));
                    }
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, reports = batch.len(),
                        "a batch of belief reports failed as a whole; sending each alone");
                    for report in &batch {
                        let alone = history.report_belief(
                            &report.lease,
                            report.event,
                            report.at,
                            report.end,
                        );
                        outcome(
                            report,
                            tokio::time::timeout(REPORT_TIMEOUT, alone).await.ok(),
                        );
                    }
                }
                Err(_) => {
                    for report in &batch {
                        outcome(report, None);
                    }
                }
            }
        }
    }
}

/// Logs and counts a report that failed (`None`: no answer in time); a recorded one says nothing.
fn outcome(report: &Report, answer: Option<Result<()>>) {
    let error = match answer {
        Some(Ok(())) => return,
        Some(Err(e)) => e.to_string(),
        None => format!("no answer within {REPORT_TIMEOUT:?}"),
    };
    let lease = &report.lease;
    tracing::warn!(lease = %lease.qualified_name(), epoch = %lease.epoch(), event = report.event, %error,
        "belief report failed; the review shows this belief as unknown");
    metrics::counter!(METRIC_BELIEF_REPORTS_FAILED, "lease" => lease.qualified_name().to_owned())
        .increment(1);
}
