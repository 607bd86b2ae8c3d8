//! The effect ledger as text: the effects in doubt (`pgfence tasks --in-doubt`), one task's ledger (`pgfence
//! tasks --task`) and the lines `pgfence history` adds to a tenure's block. Every stored value (lease, task and
//! effect keys, holders, end reasons, intents, details) is escaped ([`value`], or [`render`]'s cells).

use std::fmt::Write as _;

use pgfence::effects::{Attempt, EffectState, InDoubt, LateReport};
use pgfence::Epoch;

use super::{render, time, value};

/// The most characters of an intent's JSON a table cell shows before it is cut (and the cut marked); `--json`
/// has it whole.
pub(crate) const INTENT_CHARS: usize = 60;

/// Of the attempts of one tenure that need no attention (done, no late report), at most this many of the
/// latest are listed under the tenure in `pgfence history`; the rest are counted.
const QUIET_SHOWN: usize = 5;

/// The label width of a tenure's block (as in the history module).
const LABEL_WIDTH: usize = 14;

/// `text` cut after `max` characters, the cut marked as [`escape`](super::escape) marks it. The cell is escaped
/// afterwards, like every cell.
fn clip(text: &str, max: usize) -> String {
    let count = text.chars().count();
    if count <= max {
        return text.to_owned();
    }
    let kept: String = text.chars().take(max).collect();
    let left = count - max;
    format!("{kept}…(+{left} char{})", if left == 1 { "" } else { "s" })
}

/// An intent (or any detail) as a cell: compact JSON, cut at [`INTENT_CHARS`].
fn json_cell(value: &serde_json::Value) -> String {
    clip(&value.to_string(), INTENT_CHARS)
}

/// A late report as a cell: its outcome and how many times it came, e.g. `done ×2`.
fn late_cell(report: Option<&LateReport>) -> String {
    report.map_or_else(|| "-".to_owned(), |r| format!("{} ×{}", r.state, r.count))
}

/// `pgfence tasks --in-doubt`: one row per effect in doubt, oldest first per lease.
pub(crate) fn in_doubt(rows: &[InDoubt]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|d| {
            let e = &d.effect;
            let t = &d.tenure;
            let ended = match (&t.end_reason, t.ended_at) {
                (Some(reason), Some(at)) => format!("{reason} {}", time(Some(at))),
                (Some(reason), None) => reason.clone(),
                (None, Some(at)) => time(Some(at)),
                (None, None) => "-".to_owned(),
            };
            vec![
                e.lease.clone(),
                e.task_key.clone(),
                e.key.clone(),
                e.attempt.to_string(),
                e.epoch.to_string(),
                e.state.to_string(),
                t.holder.clone().unwrap_or_else(|| "-".to_owned()),
                ended,
                time(t.last_write_at),
                late_cell(d.late_report.as_ref()),
                json_cell(&e.intent),
            ]
        })
        .collect();
    render(
        &[
            "LEASE",
            "TASK",
            "EFFECT KEY",
            "ATTEMPT",
            "EPOCH",
            "STATE",
            "HOLDER",
            "ENDED (UTC)",
            "LAST WRITE (UTC)",
            "LATE REPORT",
            "INTENT",
        ],
        &rows,
    )
}

/// `pgfence tasks --lease L --task K`: every attempt of the task's effects, oldest first.
pub(crate) fn ledger(attempts: &[Attempt]) -> String {
    let rows: Vec<Vec<String>> = attempts
        .iter()
        .map(|a| {
            let e = &a.effect;
            vec![
                e.key.clone(),
                e.attempt.to_string(),
                e.epoch.to_string(),
                time(Some(a.intended_at)),
                a.outcome.map_or_else(|| "-".to_owned(), |o| o.to_string()),
                match (a.settlement, e.settled_by) {
                    (Some(s), Some(by)) => format!("{s} by epoch {by}"),
                    (Some(s), None) => s.to_string(),
                    (None, _) => "-".to_owned(),
                },
                if a.in_doubt { "IN DOUBT" } else { "no" }.to_owned(),
                late_cell(a.late_report.as_ref()),
                json_cell(&e.intent),
            ]
        })
        .collect();
    render(
        &[
            "EFFECT KEY",
            "ATTEMPT",
            "EPOCH",
            "INTENDED (UTC)",
            "OUTCOME",
            "SETTLED",
            "IN DOUBT",
            "LATE REPORT",
            "INTENT",
        ],
        &rows,
    )
}

/// Whether an attempt needs no attention: done by its own tenure, no late report.
fn quiet(a: &Attempt) -> bool {
    a.effect.state == EffectState::Done && a.late_report.is_none() && !a.in_doubt
}

/// One attempt as a line of a tenure's block.
fn attempt_line(a: &Attempt) -> String {
    let e = &a.effect;
    let mut line = format!(
        "{} #{} (task {}): {}",
        value(&e.key),
        e.attempt,
        value(&e.task_key),
        a.outcome
            .map_or_else(|| "no outcome".to_owned(), |o| o.to_string())
    );
    if let Some(settlement) = a.settlement {
        let by = e
            .settled_by
            .map_or_else(String::new, |by| format!(" by epoch {by}"));
        let _ = write!(line, "; {settlement}{by} at {}", time(a.settled_at));
    }
    if a.in_doubt {
        line.push_str(if a.outcome == Some(EffectState::Unknown) {
            "; IN DOUBT (outcome unknown, not settled)"
        } else {
            "; IN DOUBT (its tenure ended without an outcome, not settled)"
        });
    }
    line
}

/// The lines `pgfence history` adds to the block of tenure `epoch`, nothing when the ledger has nothing of it:
/// the attempts it intended (every one that needs attention; of the done ones the latest [`QUIET_SHOWN`], the
/// rest counted), each late report of them, and the attempts it settled.
pub(crate) fn tenure_lines(out: &mut String, epoch: Epoch, attempts: &[Attempt]) {
    let intended: Vec<&Attempt> = attempts
        .iter()
        .filter(|a| a.effect.epoch == epoch)
        .collect();
    let settled: Vec<&Attempt> = attempts
        .iter()
        .filter(|a| a.effect.settled_by == Some(epoch))
        .collect();
    if !intended.is_empty() {
        let in_doubt = intended.iter().filter(|a| a.in_doubt).count();
        let late = intended.iter().filter(|a| a.late_report.is_some()).count();
        let _ = writeln!(
            out,
            "  {:<LABEL_WIDTH$}{} attempt{} intended, {in_doubt} in doubt, {late} late report{}",
            "effects",
            intended.len(),
            if intended.len() == 1 { "" } else { "s" },
            if late == 1 { "" } else { "s" },
        );
        let quiet_total = intended.iter().filter(|a| quiet(a)).count();
        let mut quiet_skipped = quiet_total.saturating_sub(QUIET_SHOWN);
        let hidden = quiet_skipped;
        for a in &intended {
            if quiet(a) && quiet_skipped > 0 {
                quiet_skipped -= 1;
                continue;
            }
            let _ = writeln!(out, "    {}", attempt_line(a));
            if let Some(r) = &a.late_report {
                let _ = writeln!(
                    out,
                    "      late report: {} ×{}, last {} (refused as a write, kept as evidence): {}",
                    r.state,
                    r.count,
                    time(Some(r.reported_at)),
                    value(&json_cell(&r.detail)),
                );
            }
        }
        if hidden > 0 {
            let _ = writeln!(
                out,
                "    … and {hidden} earlier done attempt{} (--json, or `pgfence tasks --task`, lists every one)",
                if hidden == 1 { "" } else { "s" }
            );
        }
    }
    for a in settled {
        let e = &a.effect;
        let _ = writeln!(
            out,
            "  {:<LABEL_WIDTH$}{} #{} of epoch {}: {} at {}",
            "settled",
            value(&e.key),
            e.attempt,
            e.epoch,
            a.settlement
                .map_or_else(|| "-".to_owned(), |s| s.to_string()),
            time(a.settled_at),
        );
    }
}

/// The line after the review's summary when the lease has effects: attempts, in doubt, settled, late reports.
pub(crate) fn summary(lease: &str, attempts: &[Attempt]) -> String {
    if attempts.is_empty() {
        return String::new();
    }
    let count = |state: EffectState| {
        attempts
            .iter()
            .filter(|a| a.settlement == Some(state))
            .count()
    };
    format!(
        "{}: effects: {} attempt{}; {} in doubt; settled: {} confirmed, {} retried, {} abandoned; {} late \
         report{}\n",
        value(lease),
        attempts.len(),
        if attempts.len() == 1 { "" } else { "s" },
        attempts.iter().filter(|a| a.in_doubt).count(),
        count(EffectState::Confirmed),
        count(EffectState::Retried),
        count(EffectState::Abandoned),
        attempts.iter().filter(|a| a.late_report.is_some()).count(),
        if attempts.iter().filter(|a| a.late_report.is_some()).count() == 1 {
            ""
        } else {
            "s"
        },
    )
}

#[cfg(test)]
mod tests {
    use super::super::terminal::is_terminal_control_but_newline;
    use super::*;

    /// An intent cell is cut at its bound, and the cut says how much was left out.
    #[test]
    fn clip_cuts_long_text_and_marks_it() {
        assert_eq!(clip("abc", 3), "abc");
        assert_eq!(clip("abcd", 3), "abc…(+1 char)");
        assert_eq!(clip("abcdef", 3), "abc…(+3 chars)");
    }

    /// Hostile keys, tasks and intents in the ledger reach the text escaped, never raw.
    #[test]
    fn ledger_tables_escape_hostile_values() {
        let text = ledger(&crate::fixtures::attempts());
        assert!(!text.chars().any(is_terminal_control_but_newline), "{text}");
        assert!(text.contains("key\\u{1b}[2J"), "{text}");
        let mut block = String::new();
        tenure_lines(
            &mut block,
            Epoch::new(1).unwrap(),
            &crate::fixtures::attempts(),
        );
        assert!(
            !block.chars().any(is_terminal_control_but_newline),
            "{block}"
        );
        assert!(
            block.contains("key\\u{1b}[2J #1 (task job\\u{7}): unknown; retried by epoch 2 at ")
        );
        assert!(
            block.contains("      late report: done ×2, last "),
            "{block}"
        );
    }

    /// A tenure's block lists every attempt that needs attention and only the latest few plainly done ones, and
    /// counts the rest, so a busy tenure's history stays readable and nothing in doubt is hidden.
    #[test]
    fn tenure_lines_fold_plainly_done_attempts_but_never_one_in_doubt() {
        let fixture = crate::fixtures::attempts();
        let epoch = Epoch::new(1).unwrap();
        let mut attempts = vec![fixture[0].clone()];
        for i in 0..8 {
            let mut done = fixture[1].clone();
            done.effect.epoch = epoch;
            done.effect.key = format!("done-{i}");
            attempts.push(done);
        }
        let mut text = String::new();
        tenure_lines(&mut text, epoch, &attempts);
        assert!(
            text.starts_with("  effects       9 attempts intended, 0 in doubt, 1 late report\n"),
            "{text}"
        );
        assert!(
            text.contains(" #1 (task job\\u{7}): unknown; retried by epoch 2"),
            "{text}"
        );
        assert!(
            !text.contains("done-2 ") && text.contains("done-3 #2") && text.contains("done-7 #2"),
            "{text}"
        );
        assert!(text.contains("    … and 3 earlier done attempts (--json, or `pgfence tasks --task`, lists every one)\n"), "{text}");
    }
}
