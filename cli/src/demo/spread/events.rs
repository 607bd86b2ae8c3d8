//! What the replicas' own event lines say: the handovers of a step, the drains still running, the names each
//! replica believes it leads, the writes of a drain and every write as the replicas reported it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::fleet::Fleet;
use super::DRAIN;

pub(super) fn handovers(events: &[Value]) -> usize {
    events
        .iter()
        .filter(|e| e["event"] == "stop" && e["cause"] == "handover")
        .count()
}

/// Waits (bounded by the drain and a second) until every callback cancelled since `from` returned, so that a
/// step's drains end before the next step.
pub(super) async fn drained(fleet: &Fleet, from: usize) {
    let deadline = Instant::now() + DRAIN + Duration::from_secs(1);
    while Instant::now() < deadline {
        let events = fleet.events();
        let key = |e: &Value| {
            (
                e["member"].to_string(),
                e["name"].to_string(),
                e["epoch"].as_i64(),
            )
        };
        let stops: BTreeSet<_> = events[from.min(events.len())..]
            .iter()
            .filter(|e| e["event"] == "stop")
            .map(key)
            .collect();
        let returned: BTreeSet<_> = events
            .iter()
            .filter(|e| e["event"] == "returned")
            .map(key)
            .collect();
        if stops.is_subset(&returned) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Names each replica leads by its own events (`lead` adds, `stop` removes), leaving out `gone` replicas.
pub(super) fn believed(
    events: &[Value],
    gone: &BTreeSet<String>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut leading: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in events {
        let (Some(member), Some(name)) = (e["member"].as_str(), e["name"].as_str()) else {
            continue;
        };
        if gone.contains(member) {
            continue;
        }
        match e["event"].as_str() {
            Some("lead") => {
                leading
                    .entry(member.to_owned())
                    .or_default()
                    .insert(name.to_owned());
            }
            Some("stop") => {
                leading.entry(member.to_owned()).or_default().remove(name);
            }
            _ => {}
        }
    }
    leading.retain(|_, names| !names.is_empty());
    leading
}

/// The writes of a drain: those of tenure `epoch` of `name` after its holder's `stop`.
#[derive(Debug, Default)]
pub(super) struct Drain {
    pub(super) accepted: u64,
    /// Refused writes by reason.
    pub(super) refused: BTreeMap<String, u64>,
}

pub(super) fn drain_writes(events: &[Value], name: &str, epoch: i64) -> Drain {
    let of = |e: &&Value| e["name"] == name && e["epoch"].as_i64() == Some(epoch);
    let mut drain = Drain::default();
    let Some(stop) = events.iter().filter(of).position(|e| e["event"] == "stop") else {
        return drain;
    };
    for e in events
        .iter()
        .filter(of)
        .skip(stop)
        .filter(|e| e["event"] == "write")
    {
        if e["ok"] == true {
            drain.accepted += 1;
        } else {
            let reason = e["reason"].as_str().unwrap_or("unknown").to_owned();
            *drain.refused.entry(reason).or_default() += 1;
        }
    }
    drain
}

/// Writes per (name, epoch) as the replicas reported them: (accepted, refused).
pub(super) fn reported_writes(events: &[Value]) -> BTreeMap<(String, i64), (u64, u64)> {
    let mut writes: BTreeMap<(String, i64), (u64, u64)> = BTreeMap::new();
    for e in events.iter().filter(|e| e["event"] == "write") {
        let (Some(name), Some(epoch)) = (e["name"].as_str(), e["epoch"].as_i64()) else {
            continue;
        };
        let entry = writes.entry((name.to_owned(), epoch)).or_default();
        if e["ok"] == true {
            entry.0 += 1;
        } else {
            entry.1 += 1;
        }
    }
    writes
}
