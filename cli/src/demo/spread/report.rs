//! The closing report of the story: its steps, the reviews of the moved names and the writes counted, as JSON or
//! as tables, and the short forms the narration uses for who leads what.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use pgfence::history::{Overlap, TenureReview};
use serde::Serialize;

use crate::demo::Check;
use crate::table;

/// One step of the story: names led per replica before and after, what moved, and how it moved.
#[derive(Debug, Serialize)]
pub(super) struct Step {
    pub(super) step: &'static str,
    /// Names led by each live member when the step began.
    pub(super) before: BTreeMap<String, Vec<String>>,
    /// Names led by each live member once the group converged (or when the wait for it ended).
    pub(super) after: BTreeMap<String, Vec<String>>,
    /// Names whose tenure changed during the step.
    pub(super) moved: Vec<String>,
    /// The fewest moves the step allows (the newcomer's share; the killed replica's names).
    pub(super) minimum_moves: Option<usize>,
    /// Tenures handed over during the step (`stop` events with cause `handover`).
    pub(super) handovers: usize,
    /// Whether the group converged (every live member leads what the assignment gives it, every name led).
    pub(super) converged: bool,
    pub(super) took_ms: u64,
}

/// A tenure of a moved name: the library's review of it, and the writes of its epoch as its holder reported
/// them and as the database audited the refused ones.
#[derive(Debug, Serialize)]
pub(super) struct TenureRow {
    #[serde(flatten)]
    pub(super) review: TenureReview,
    pub(super) writes_accepted: u64,
    pub(super) writes_refused: u64,
    pub(super) audited: i64,
}

#[derive(Debug, Serialize)]
pub(super) struct NameReview {
    pub(super) name: String,
    /// The steps that moved it (`join`, `kill`).
    pub(super) moved_in: Vec<&'static str>,
    pub(super) tenures: Vec<TenureRow>,
}

#[derive(Debug, Default, Serialize)]
pub(super) struct Writes {
    pub(super) accepted: u64,
    pub(super) refused: u64,
    pub(super) audited: i64,
    /// Writes of an epoch accepted after its successor's acquisition (the review, every name).
    pub(super) accepted_after_successor: usize,
}

#[derive(Debug, Serialize)]
pub(super) struct Report {
    pub(super) scenario: &'static str,
    pub(super) cluster: String,
    pub(super) group: String,
    pub(super) names: usize,
    pub(super) ttl_ms: u64,
    pub(super) grace_ms: u64,
    pub(super) write_every_ms: u64,
    pub(super) drain_ms: u64,
    pub(super) steps: Vec<Step>,
    pub(super) reviews: Vec<NameReview>,
    pub(super) writes: Writes,
    /// Exit codes of the replicas stopped with SIGTERM (`null`: did not exit within 10 s).
    pub(super) exits: BTreeMap<String, Option<i32>>,
    pub(super) checks: Vec<Check>,
    pub(super) verdict: bool,
}

/// "r1 2, r2 2, r3 2"
pub(super) fn counts(leads: &BTreeMap<String, Vec<String>>) -> String {
    if leads.is_empty() {
        return "-".to_owned();
    }
    leads
        .iter()
        .map(|(m, n)| format!("{m} {}", n.len()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// "r1: controller-00, controller-03; r2: …"
pub(super) fn listing(leads: &BTreeMap<String, Vec<String>>) -> String {
    leads
        .iter()
        .map(|(m, n)| format!("{m}: {}", n.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// A time of day with milliseconds: every time of one run is within a minute of the others.
fn clock(at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(|| "-".to_owned(), |t| t.format("%H:%M:%S%.3f").to_string())
}

fn overlap(review: &TenureReview) -> &'static str {
    match review.overlap {
        Overlap::NoSuccessor => "- (no successor)",
        Overlap::None => "none",
        Overlap::Possible => "POSSIBLE",
        Overlap::Certain {
            refused_write_at: Some(_),
        } => "CERTAIN (refused write)",
        Overlap::Certain { .. } => "CERTAIN",
        Overlap::Unknown => "UNKNOWN (no end report)",
        _ => "see --json",
    }
}

pub(super) fn report_text(report: &Report) -> String {
    let mut text = String::from("\nNames led per replica, by step (pgfence.group_members):\n");
    let rows: Vec<Vec<String>> = report
        .steps
        .iter()
        .map(|s| {
            vec![
                s.step.to_owned(),
                counts(&s.before),
                counts(&s.after),
                if s.moved.is_empty() {
                    "-".to_owned()
                } else {
                    s.moved.join(", ")
                },
                s.minimum_moves.map_or("-".to_owned(), |m| m.to_string()),
                s.handovers.to_string(),
                format!("{:.1}s", s.took_ms as f64 / 1000.0),
            ]
        })
        .collect();
    text.push_str(&table::render(
        &[
            "STEP",
            "BEFORE",
            "AFTER",
            "MOVED",
            "MINIMUM",
            "HANDOVERS",
            "TOOK",
        ],
        &rows,
    ));
    text.push_str(
        "\nOverlap review of the moved names (as `pgfence history --lease` shows it), UTC: the database's \
         record (database clock) beside what each holder reported believing (holder clock); writes of each \
         epoch as its holder reported them, refusals as the database audited them\n",
    );
    let mut rows = Vec::new();
    for name in &report.reviews {
        for t in &name.tenures {
            let r = &t.review;
            let b = &r.tenure.belief;
            rows.push(vec![
                format!("{} ({})", name.name, name.moved_in.join(", ")),
                r.tenure.epoch.to_string(),
                r.tenure.holder.clone(),
                clock(Some(r.tenure.acquired_at)),
                clock(r.tenure.ended_at),
                r.tenure
                    .end_reason
                    .clone()
                    .unwrap_or_else(|| "current".to_owned()),
                b.from
                    .map_or_else(|| "unknown".to_owned(), |t| clock(Some(t))),
                b.until
                    .map_or_else(|| "unknown".to_owned(), |t| clock(Some(t))),
                match (&b.end_cause, &b.end_detail) {
                    (Some(c), Some(d)) => format!("{c} ({d})"),
                    (Some(c), None) => c.clone(),
                    _ => "unknown".to_owned(),
                },
                overlap(r).to_owned(),
                t.writes_accepted.to_string(),
                t.writes_refused.to_string(),
                t.audited.to_string(),
                if r.accepted_after_successor.is_some() {
                    "FENCE BROKEN".to_owned()
                } else {
                    "0".to_owned()
                },
            ]);
        }
    }
    text.push_str(&table::render(
        &[
            "NAME",
            "EPOCH",
            "HOLDER",
            "DB FROM",
            "DB UNTIL",
            "DB END",
            "BELIEVED FROM",
            "BELIEVED UNTIL",
            "BELIEF END",
            "OVERLAP",
            "WRITES OK",
            "REFUSED",
            "AUDITED",
            "OK AFTER SUCCESSOR",
        ],
        &rows,
    ));
    let w = &report.writes;
    text.push_str(&format!(
        "\nWrites: {} accepted, {} refused as the replicas reported them, {} audited in pgfence.rejections; {} \
         of an old epoch accepted after its successor's acquisition\n\nVerdict:\n",
        w.accepted, w.refused, w.audited, w.accepted_after_successor
    ));
    text.push_str(&crate::demo::verdict(&report.checks, report.verdict));
    text
}
