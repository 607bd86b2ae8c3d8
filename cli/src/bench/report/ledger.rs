//! The effect ledger's cost in the report of `pgfence bench`: `effect-pair` (an intent and its outcome) beside
//! `event-pair` (two `append_event`s on the same task), per concurrency.

use super::super::workload::Workload;
use super::{rate, Measurement, Ratio};

/// The effect ledger's cost (`effect-pair` beside `event-pair`), per concurrency, when both ran.
pub(super) fn print_cost(all: &[Measurement]) {
    let pairs: Vec<(&Measurement, &Measurement, &Ratio)> = all
        .iter()
        .filter_map(|m| {
            let ratio = m.vs_events.as_ref()?;
            let events = all.iter().find(|e| {
                e.workload == Workload::EventPair.name()
                    && e.concurrency == m.concurrency
                    && e.batch == m.batch
            })?;
            Some((m, events, ratio))
        })
        .collect();
    if pairs.is_empty() {
        return;
    }
    println!();
    println!(
        "Effect ledger: an intent+outcome pair beside two append_events on the same task (medians over rounds; \
         ratios paired round by round)"
    );
    let table: Vec<Vec<String>> = pairs
        .iter()
        .map(|(m, e, r)| {
            vec![
                m.concurrency.to_string(),
                rate(m.tx_per_s),
                rate(e.tx_per_s),
                format!("{:.3}", m.latency_ms.p50),
                format!("{:.3}", e.latency_ms.p50),
                format!("{:.2}", r.value),
                format!("{:.2}", 1.0 / r.value),
            ]
        })
        .collect();
    crate::table::print(
        &[
            "C",
            "PAIRS/S",
            "EVENT PAIRS/S",
            "P50 MS",
            "EVENTS P50 MS",
            "THROUGHPUT ÷EVENTS",
            "COST ×EVENTS",
        ],
        &table,
    );
}
