//! The overlap review as text (`pgfence history`): a block per tenure, the database's record beside the holder's
//! belief, the verdict and the `!!` flags, then a summary line.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use pgfence::effects::Attempt;
use pgfence::history::{Overlap, Tenure, TenureReview};

use super::{effects, escape, time, value};

/// The width of the labels in a tenure's block of the overlap review.
const LABEL_WIDTH: usize = 14;

/// The most characters of a stored value in the database column of a tenure's block, so that a long one
/// does not push the holder's column off the screen (the holder's column is last, and shows
/// [`VALUE_CHARS`](super::VALUE_CHARS)).
const COLUMN_CHARS: usize = 64;

/// The overlap review of one lease (`pgfence history`): a block per tenure, oldest first, then a summary.
///
/// Each block shows the database's interval (database clock) beside the holder's belief (its own clock,
/// "unknown" where no report arrived: a killed process never reports its end), the endpoint as each side saw
/// it, where the belief's end lies on the database's clock, the clock offset bounds, the last accepted write
/// and the verdict. An overlap (certain or possible) is flagged with `!!` lines: when the successor's
/// acquisition committed, the writes accepted in the window (none, or a loud FENCE BROKEN) and the refusals
/// the audit recorded. Then, from the lease's effect ledger (`attempts`), the effects each tenure intended
/// (outcome, settlement, in doubt, late reports) and those it settled, and a second summary line — nothing of
/// either where the ledger has nothing. Every stored string is escaped ([`value`]).
pub(crate) fn review(lease: &str, reviews: &[TenureReview], attempts: &[Attempt]) -> String {
    let mut out = format!(
        "Overlap review of {}: times UTC, by the database clock unless marked (holder clock)\n",
        value(lease)
    );
    for review in reviews {
        out.push('\n');
        tenure_block(&mut out, review);
        effects::tenure_lines(&mut out, review.tenure.epoch, attempts);
    }
    out.push('\n');
    out.push_str(&review_summary(lease, reviews));
    out.push_str(&effects::summary(lease, attempts));
    out
}

fn tenure_block(out: &mut String, review: &TenureReview) {
    let t = &review.tenure;
    let b = &t.belief;
    let _ = writeln!(out, "epoch {}  holder {}", t.epoch, value(&t.holder));
    let column = |text: &str| escape(text, COLUMN_CHARS);
    let rows = [
        (
            "",
            "database (database clock)".to_owned(),
            "holder's belief (holder clock)".to_owned(),
        ),
        (
            "from",
            time(Some(t.acquired_at)),
            b.from.map_or_else(
                || "unknown start (no report)".to_owned(),
                |at| time(Some(at)),
            ),
        ),
        (
            "until",
            t.ended_at
                .map_or_else(|| "current".to_owned(), |at| time(Some(at))),
            b.until
                .map_or_else(|| "unknown end (no report)".to_owned(), |at| time(Some(at))),
        ),
        (
            "end",
            t.end_reason
                .as_deref()
                .map_or_else(|| "current".to_owned(), column),
            match (&b.end_cause, &b.end_detail) {
                (Some(cause), Some(detail)) => format!("{} ({})", value(cause), value(detail)),
                (Some(cause), None) => value(cause),
                _ => "unknown (no report)".to_owned(),
            },
        ),
        (
            "endpoint",
            t.server
                .server_addr
                .as_deref()
                .map_or_else(|| "- (Unix socket)".to_owned(), column),
            match (&b.endpoint, b.start_received_at) {
                (Some(endpoint), _) => value(endpoint),
                (None, Some(_)) => "- (not in the report)".to_owned(),
                (None, None) => "unknown (no report)".to_owned(),
            },
        ),
    ];
    let width = rows
        .iter()
        .map(|(_, database, _)| database.chars().count())
        .max()
        .unwrap_or(0);
    for (label, database, holder) in &rows {
        let pad = " ".repeat(width - database.chars().count());
        let line = format!("  {label:<LABEL_WIDTH$}{database}{pad}  {holder}");
        out.push_str(line.trim_end());
        out.push('\n');
    }

    let field = |text: &Option<String>| text.as_deref().map_or_else(|| "-".to_owned(), value);
    let s = &t.server;
    let label = |out: &mut String, label: &str, text: &str| {
        let _ = writeln!(out, "  {label:<LABEL_WIDTH$}{text}");
    };
    label(
        out,
        "client",
        &s.client_addr
            .as_deref()
            .map_or_else(|| "- (Unix socket)".to_owned(), value),
    );
    label(
        out,
        "server",
        &format!(
            "system id {}, instance id {}, timeline {}",
            field(&s.system_identifier),
            field(&s.instance_id),
            s.timeline.map_or_else(|| "-".to_owned(), |t| t.to_string()),
        ),
    );
    label(out, "application", &field(&s.application_name));
    label(out, "belief end", &belief_end_on_database_clock(review));
    label(out, "clock offset", &clock_offset(review));
    label(out, "last write", &last_write(t));
    label(
        out,
        "successor",
        &review.successor.as_ref().map_or_else(
            || "none".to_owned(),
            |next| {
                format!(
                    "epoch {} (holder {}) acquired at {}",
                    next.epoch,
                    value(&next.holder),
                    time(Some(next.acquired_at))
                )
            },
        ),
    );
    label(out, "overlap", &verdict(review));
    for flag in flags(review) {
        let _ = writeln!(out, "  !! {flag}");
    }
}

/// Where the end of the holder's belief lies on the database's clock.
fn belief_end_on_database_clock(review: &TenureReview) -> String {
    match (&review.believed_until_db, review.tenure.belief.until) {
        (Some(end), _) => match end.earliest {
            Some(earliest) => format!(
                "between {} and {} (database clock)",
                time(Some(earliest)),
                time(Some(end.latest))
            ),
            None => format!(
                "no later than {} (database clock; no start report bounds it from below)",
                time(Some(end.latest))
            ),
        },
        (None, None) => "unknown end (no report)".to_owned(),
        (None, Some(_)) => "not placed: no clock offset bounds".to_owned(),
    }
}

/// The bounds on (database clock − holder clock), in milliseconds.
fn clock_offset(review: &TenureReview) -> String {
    let ms = |us: i64| format!("{:+.3} ms", us as f64 / 1000.0);
    let b = &review.tenure.belief;
    match review.clock_offset {
        Some(bounds) => match bounds.min_us {
            Some(min) => format!(
                "database − holder between {} and {}",
                ms(min),
                ms(bounds.max_us)
            ),
            None => format!(
                "database − holder at most {} (no start report: no lower bound)",
                ms(bounds.max_us)
            ),
        },
        None if b.start_sent_at.is_none() && b.end_sent_at.is_none() => {
            "unknown (no report)".to_owned()
        }
        None => {
            "unknown: the reports contradict each other (the holder's clock was stepped)".to_owned()
        }
    }
}

/// The last write accepted under the epoch: task events are exact, write marks at most
/// [`pgfence::history::WRITE_MARK_RESOLUTION`] early.
fn last_write(t: &Tenure) -> String {
    let mark_note = "write mark: the last guarded write was at most 1 s later";
    match (t.last_event_at, t.last_mark_at) {
        (None, None) => "none recorded".to_owned(),
        (Some(event), None) => format!("{} (task event, exact)", time(Some(event))),
        (None, Some(mark)) => format!("{} ({mark_note})", time(Some(mark))),
        (Some(event), Some(mark)) if event >= mark => format!(
            "{} (task event, exact; latest write mark {}, at most 1 s early)",
            time(Some(event)),
            time(Some(mark))
        ),
        (Some(event), Some(mark)) => format!(
            "{} ({mark_note}; latest task event {}, exact)",
            time(Some(mark)),
            time(Some(event))
        ),
    }
}

/// The review's verdict on whether the holder believed it led after its successor's acquisition.
fn verdict(review: &TenureReview) -> String {
    let Some(next) = &review.successor else {
        return "none: no successor (yet)".to_owned();
    };
    let epoch = next.epoch;
    match &review.overlap {
        Overlap::NoSuccessor => "none: no successor (yet)".to_owned(),
        Overlap::None => format!(
            "none: the belief ended before epoch {epoch}'s acquisition, even at its latest placement"
        ),
        Overlap::Possible => format!(
            "POSSIBLE: the clock bounds allow the belief to have ended before or after epoch {epoch}'s \
             acquisition"
        ),
        Overlap::Certain {
            refused_write_at: Some(at),
        } => format!(
            "CERTAIN: the database refused a write of epoch {} at {}, after epoch {epoch}'s acquisition",
            review.tenure.epoch,
            time(Some(*at))
        ),
        Overlap::Certain {
            refused_write_at: None,
        } => format!(
            "CERTAIN: the belief ended after epoch {epoch}'s acquisition, even at its earliest placement"
        ),
        Overlap::Unknown => {
            "UNKNOWN: no end report, and no refused write proves an overlap".to_owned()
        }
        _ => "unrecognized verdict (see --json)".to_owned(),
    }
}

/// The `!!` lines of a tenure: an overlap's window and what the database did in it, and a broken fence
/// whatever the verdict.
fn flags(review: &TenureReview) -> Vec<String> {
    let Some(next) = &review.successor else {
        return Vec::new();
    };
    let epoch = review.tenure.epoch;
    let committed = time(Some(next.acquired_at));
    let mut flags = Vec::new();
    let overlapping = match review.overlap {
        Overlap::Certain { .. } => Some("believed"),
        Overlap::Possible => Some("may have believed"),
        _ => None,
    };
    if let Some(believed) = overlapping {
        flags.push(format!(
            "the holder {believed} it led after epoch {}'s acquisition committed at {committed}",
            next.epoch
        ));
    }
    match review.accepted_after_successor {
        Some(at) => flags.push(format!(
            "FENCE BROKEN: a write of epoch {epoch} was accepted at {} after the successor's acquisition \
             (epoch {}, committed at {committed})",
            time(Some(at)),
            next.epoch
        )),
        None if overlapping.is_some() => flags.push(match window_mark(review, next.acquired_at) {
            None => "accepted writes in the window: 0".to_owned(),
            Some(mark) => format!(
                "accepted writes in the window: 0 recorded (the last write mark, {}, is less than 1 s before \
                 the acquisition: a later write of its session in that second leaves no mark)",
                time(Some(mark))
            ),
        }),
        None => {}
    }
    for r in &review.refusals_after_successor {
        let target = match (&r.target_table, &r.target_key) {
            (Some(table), Some(key)) => format!(" on {}:{}", value(table), value(key)),
            (Some(table), None) => format!(" on {}", value(table)),
            _ => String::new(),
        };
        let before = if r.rejected_at < next.acquired_at {
            " (before the acquisition)"
        } else {
            ""
        };
        flags.push(format!(
            "refused: {} × {} {}{target}, first {}{before}, last {}",
            r.count,
            value(&r.reason),
            value(&r.operation),
            time(Some(r.rejected_at)),
            time(Some(r.last_rejected_at)),
        ));
    }
    flags
}

/// The tenure's last write mark when it lies less than [`pgfence::history::WRITE_MARK_RESOLUTION`] before the
/// successor's acquisition: a session marks only its first accepted write in each second, so a write of that
/// session after the acquisition but within the mark's second would leave no trace the review can see.
fn window_mark(review: &TenureReview, acquired_at: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let resolution = chrono::Duration::from_std(pgfence::history::WRITE_MARK_RESOLUTION).ok()?;
    review
        .tenure
        .last_mark_at
        .filter(|mark| *mark < acquired_at && *mark + resolution > acquired_at)
}

/// One line per lease: tenures, overlap verdicts, writes accepted after a successor's acquisition.
fn review_summary(lease: &str, reviews: &[TenureReview]) -> String {
    let count = |pick: fn(&Overlap) -> bool| reviews.iter().filter(|r| pick(&r.overlap)).count();
    let broken: Vec<String> = reviews
        .iter()
        .filter(|r| r.accepted_after_successor.is_some())
        .map(|r| r.tenure.epoch.to_string())
        .collect();
    format!(
        "{}: {} tenure{}; overlaps: {} certain, {} possible, {} unknown; accepted writes after a successor's \
         acquisition: {}\n",
        value(lease),
        reviews.len(),
        if reviews.len() == 1 { "" } else { "s" },
        count(|o| matches!(o, Overlap::Certain { .. })),
        count(|o| matches!(o, Overlap::Possible)),
        count(|o| matches!(o, Overlap::Unknown)),
        if broken.is_empty() {
            "0".to_owned()
        } else {
            format!("FENCE BROKEN in epoch {}", broken.join(", "))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::super::terminal::is_terminal_control_but_newline;
    use super::*;

    /// The block of one epoch in the review's text.
    fn block(text: &str, epoch: i64) -> &str {
        let start = text
            .find(&format!("\nepoch {epoch}  "))
            .expect("a block per tenure");
        let end = text[start + 1..]
            .find("\n\n")
            .map_or(text.len(), |end| start + 1 + end);
        &text[start + 1..end]
    }

    #[test]
    fn review_flags_a_certain_overlap_with_its_window_and_refusals() {
        let text = review("demo/scheduler", &crate::fixtures::review(), &[]);
        let first = block(&text, 1);
        assert!(first.contains(
            "  overlap       CERTAIN: the database refused a write of epoch 1 at 2026-11-30 04:41:52.490Z, \
             after epoch 2's acquisition"
        ), "{first}");
        assert!(first.contains(
            "\n  !! the holder believed it led after epoch 2's acquisition committed at 2026-11-30 04:41:51.249Z\n  \
             !! accepted writes in the window: 0\n  \
             !! refused: 2 × superseded transition_task on tasks:job-2, first 2026-11-30 04:41:52.480Z, \
             last 2026-11-30 04:41:52.490Z"
        ), "{first}");
        // The two clocks side by side, labelled.
        assert!(first.contains("database (database clock)"));
        assert!(first.contains("holder's belief (holder clock)"));
        assert!(
            first.contains("  until         2026-11-30 04:41:51.224Z   2026-11-30 04:41:52.100Z"),
            "{first}"
        );
        assert!(first.contains("database − holder between +5.000 ms and +10.000 ms"));
        assert!(first.contains(
            "between 2026-11-30 04:41:52.104Z and 2026-11-30 04:41:52.110Z (database clock)"
        ));
        assert!(first.contains("2026-11-30 04:41:48.813Z (task event, exact; latest write mark"));
    }

    #[test]
    fn review_says_when_a_write_mark_cannot_rule_out_a_write_in_the_window() {
        let mut reviews = crate::fixtures::review();
        // Epoch 1's session marked a write 0.3 s before epoch 2's acquisition committed.
        reviews[0].tenure.last_mark_at = Some("2026-11-30T04:41:50.949Z".parse().unwrap());
        let text = review("demo/scheduler", &reviews, &[]);
        assert!(block(&text, 1).contains(
            "\n  !! accepted writes in the window: 0 recorded (the last write mark, 2026-11-30 04:41:50.949Z, is \
             less than 1 s before the acquisition: a later write of its session in that second leaves no mark)\n"
        ), "{text}");
    }

    #[test]
    fn review_says_an_unreported_end_is_unknown() {
        let text = review("demo/scheduler", &crate::fixtures::review(), &[]);
        let second = block(&text, 2);
        assert!(second.contains("unknown end (no report)"), "{second}");
        assert!(
            second.contains("  belief end    unknown end (no report)"),
            "{second}"
        );
        assert!(
            second.contains(
                "  overlap       UNKNOWN: no end report, and no refused write proves an overlap"
            ),
            "{second}"
        );
        assert!(!second.contains("!!"), "{second}");
        assert!(second.contains(
            "  last write    2026-11-30 04:41:54.000Z (write mark: the last guarded write was at most 1 s later)"
        ), "{second}");
        // The current tenure has no end either, and no verdict beyond that.
        let fourth = block(&text, 4);
        assert!(fourth.contains("unknown end (no report)"), "{fourth}");
        assert!(
            fourth.contains("  overlap       none: no successor (yet)"),
            "{fourth}"
        );
    }

    #[test]
    fn review_shouts_a_broken_fence() {
        let text = review("demo/scheduler", &crate::fixtures::review(), &[]);
        let third = block(&text, 3);
        assert!(third.contains("  overlap       POSSIBLE: "), "{third}");
        assert!(third.contains(
            "\n  !! the holder may have believed it led after epoch 4's acquisition committed at \
             2026-11-30 04:41:58.050Z\n  \
             !! FENCE BROKEN: a write of epoch 3 was accepted at 2026-11-30 04:41:58.100Z after the successor's \
             acquisition (epoch 4, committed at 2026-11-30 04:41:58.050Z)"
        ), "{third}");
        assert!(!third.contains("accepted writes in the window: 0"));
        assert!(text.ends_with(
            "\ndemo/scheduler: 4 tenures; overlaps: 1 certain, 1 possible, 1 unknown; accepted writes after a \
             successor's acquisition: FENCE BROKEN in epoch 3\n"
        ), "{text}");
    }

    #[test]
    fn review_escapes_hostile_text() {
        let text = review("demo/\u{1b}[2Jscheduler", &crate::fixtures::review(), &[]);
        assert!(!text.chars().any(is_terminal_control_but_newline), "{text}");
        assert!(text.contains("Overlap review of demo/\\u{1b}[2Jscheduler:"));
        let second = block(&text, 2);
        assert!(second.starts_with(
            "epoch 2  holder evil\\u{1b}]0;pwned\\u{7}<script>alert(1)</script>\\u{202e}&\u{ffff}\n"
        ), "{second}");
        assert!(
            second.contains(
                "  application   \\u{1b}[2J\\u{1b}[31m</text><script>x()</script>\\u{d}\n"
            ),
            "{second}"
        );
        assert!(second.contains("db1:5432/control\\u{1b}[8m"), "{second}");
        // The successor's holder, in epoch 1's block.
        assert!(block(&text, 1).contains("epoch 2 (holder evil\\u{1b}]0;pwned"));
    }
}
