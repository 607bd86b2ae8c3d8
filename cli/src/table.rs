//! What the read commands print for people: tables and text lines, and the escaping that keeps stored text
//! from acting on the operator's terminal.
//!
//! Every string the CLI prints in human output that came from the database (lease names, holders, end reasons,
//! audit fields, identity fields, error messages that may quote stored values) goes through [`escape`]: a
//! role with table privileges, or a bug elsewhere, can store any text, and a raw ESC, OSC or CR in it would
//! let that text clear the screen, retitle the window, write to the clipboard or overwrite what the operator
//! reads. `--json` output applies the same rule ([`is_terminal_control`]) as JSON `\uXXXX` escapes, which
//! decode to the exact stored text (`TerminalJson` in the `cli` module).

use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, Utc};
use pgfence::{DatabaseIdentity, LeaseStatus, Overlap, Rejection, Tenure, TenureReview};

/// The most characters of escaped text a table cell or a value in a text line shows; longer values are cut
/// there and marked (see [`escape`]). Long enough for a full lease name (400 characters) with a few escapes
/// in it; short enough that one 70,000-character holder does not push every other column off the screen.
pub(super) const VALUE_CHARS: usize = 512;

/// The most characters of escaped text an error message shows (it may quote several values).
pub(super) const MESSAGE_CHARS: usize = 4096;

/// Whether `c` would act on a terminal instead of being shown: every Unicode control character (C0, DEL,
/// C1: `char::is_control`), the bidirectional controls that reorder the text around them (ALM U+061C, LRM
/// U+200E, RLM U+200F, LRE..RLO U+202A–U+202E, LRI..PDI U+2066–U+2069) and the line and paragraph
/// separators U+2028/U+2029, which some terminals break lines at.
pub(super) fn is_terminal_control(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}'
                | '\u{2029}'
        )
}

/// `text` as the CLI prints it: a backslash becomes `\\` and every terminal control (see
/// [`is_terminal_control`]) becomes its Rust escape `\u{…}` in lowercase hex (ESC is `\u{1b}`, CR `\u{d}`), so
/// the output holds no control and reads back unambiguously. When the escaped text would be longer than `max`
/// characters, the first `max` are kept (never half an escape) and `…(+N chars)` follows, N counting the
/// characters of `text` left out.
pub(super) fn escape(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max.saturating_mul(4)));
    let mut shown = 0;
    for (at, c) in text.char_indices() {
        let escaped = c == '\\' || is_terminal_control(c);
        let width = if c == '\\' {
            2
        } else if escaped {
            c.escape_unicode().len()
        } else {
            1
        };
        if shown + width > max {
            let left = text[at..].chars().count();
            let _ = write!(out, "…(+{left} char{})", if left == 1 { "" } else { "s" });
            return out;
        }
        if c == '\\' {
            out.push_str("\\\\");
        } else if escaped {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
        shown += width;
    }
    out
}

/// A stored value as a table cell or a text line shows it: [`escape`] with [`VALUE_CHARS`].
pub(super) fn value(text: &str) -> String {
    escape(text, VALUE_CHARS)
}

/// Renders rows under a header, each column as wide as its widest cell. Cells are escaped here (widths are
/// counted on the escaped text, in characters) and padded by hand, so no cell length can overflow a format
/// width.
pub(super) fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| value(cell)).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            text.push_str(cell);
            let pad = widths[i].saturating_sub(cell.chars().count());
            text.push_str(&" ".repeat(pad));
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&header.iter().map(|h| h.to_string()).collect::<Vec<_>>());
    line(&widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>());
    for row in &rows {
        line(row);
    }
    if rows.is_empty() {
        out.push_str("(none)\n");
    }
    out
}

/// Prints [`render`]'s table to standard output (for `pgfence bench`, whose report prints as it goes); a
/// reader that went away is ignored rather than a panic.
pub(super) fn print(header: &[&str], rows: &[Vec<String>]) {
    use std::io::Write as _;
    let _ = std::io::stdout().write_all(render(header, rows).as_bytes());
}

pub(super) fn time(at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(
        || "-".to_owned(),
        |t| t.format("%Y-%m-%d %H:%M:%S%.3fZ").to_string(),
    )
}

pub(super) fn duration(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_owned(), |d| format!("{:.1}s", d.as_secs_f64()))
}

pub(super) fn leases(leases: &[LeaseStatus]) -> String {
    let rows: Vec<Vec<String>> = leases
        .iter()
        .map(|l| {
            vec![
                l.name.clone(),
                l.holder.clone().unwrap_or_else(|| "-".into()),
                l.epoch.map_or_else(|| "-".into(), |e| e.to_string()),
                l.state.to_string(),
                duration(l.expires_in),
                l.transitions.to_string(),
                time(l.last_write_at),
            ]
        })
        .collect();
    render(
        &[
            "LEASE",
            "HOLDER",
            "EPOCH",
            "STATE",
            "EXPIRES IN",
            "TRANSITIONS",
            "LAST WRITE (UTC)",
        ],
        &rows,
    )
}

/// Names as a cell: comma-separated, `-` for none.
fn names(names: &[String]) -> String {
    if names.is_empty() {
        "-".to_owned()
    } else {
        names.join(", ")
    }
}

/// One replica group (`pgfence status`): a line with the group and whether the names led now are the ones the
/// group's assignment gives, then a row per member — its state, weight, time left, flaps, the names it leads and
/// the names assigned to it.
pub(super) fn group(group: &crate::groups::GroupView) -> String {
    let live = group.live().len();
    let differ = group.mismatched.len();
    let mut out = format!(
        "Group {}: {live} live member{}, {} name{} assigned; balanced: {} (desired vs actual differ on {differ} \
         name{})\n",
        value(&group.group),
        if live == 1 { "" } else { "s" },
        group.assignment.len(),
        if group.assignment.len() == 1 { "" } else { "s" },
        if group.balanced { "yes" } else { "no" },
        if differ == 1 { "" } else { "s" },
    );
    let rows: Vec<Vec<String>> = group
        .members
        .iter()
        .map(|m| {
            let r = &m.row;
            vec![
                r.member.clone(),
                m.state.as_str().to_owned(),
                if r.settled { "yes" } else { "no" }.to_owned(),
                r.weight.to_string(),
                if r.live {
                    duration(Some(r.expires_in))
                } else {
                    "-".to_owned()
                },
                r.flaps.to_string(),
                names(&r.leads),
                names(&m.assigned),
            ]
        })
        .collect();
    out.push_str(&render(
        &[
            "MEMBER",
            "STATE",
            "SETTLED",
            "WEIGHT",
            "EXPIRES IN",
            "FLAPS",
            "LEADS",
            "ASSIGNED",
        ],
        &rows,
    ));
    if !group.balanced {
        let leads = group.leads();
        let led_by = |name: &str| {
            leads
                .iter()
                .find(|(_, names)| names.iter().any(|n| n == name))
                .map_or("nobody", |(member, _)| member.as_str())
        };
        let differ: Vec<String> = group
            .mismatched
            .iter()
            .map(|name| {
                format!(
                    "{name} (assigned to {}, led by {})",
                    group.assignment.owner(name).unwrap_or("nobody"),
                    led_by(name)
                )
            })
            .collect();
        let _ = writeln!(out, "differ: {}", value(&differ.join(", ")));
    }
    out
}

pub(super) fn rejections(rows: &[Rejection]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                time(Some(r.last_rejected_at)),
                r.role.clone(),
                // A role-scope row aggregates refusals of many leases: the latest one is shown.
                if r.scope == "role" {
                    format!("{} (latest)", r.last_lease.as_deref().unwrap_or(&r.lease))
                } else {
                    r.lease.clone()
                },
                r.presented_epoch.to_string(),
                r.current_epoch
                    .map_or_else(|| "-".into(), |e| e.to_string()),
                r.reason.clone(),
                r.count.to_string(),
                r.operation.clone(),
                match (&r.target_table, &r.target_key) {
                    (Some(t), Some(k)) => format!("{t}:{k}"),
                    (Some(t), None) => t.clone(),
                    _ => "-".into(),
                },
                format!(
                    "{} pid {}",
                    r.application_name.clone().unwrap_or_default(),
                    r.backend_pid
                ),
            ]
        })
        .collect();
    render(
        &[
            "LAST REFUSED (UTC)",
            "ROLE",
            "LEASE",
            "PRESENTED",
            "CURRENT",
            "REASON",
            "COUNT",
            "OPERATION",
            "TARGET",
            "CLIENT",
        ],
        &rows,
    )
}

pub(super) fn tenures(tenures: &[Tenure]) -> String {
    let rows: Vec<Vec<String>> = tenures
        .iter()
        .map(|t| {
            vec![
                t.epoch.to_string(),
                t.holder.clone(),
                time(Some(t.acquired_at)),
                time(t.ended_at),
                t.end_reason.clone().unwrap_or_else(|| "current".into()),
                time(t.last_write_at),
            ]
        })
        .collect();
    render(
        &[
            "EPOCH",
            "HOLDER",
            "FROM (UTC)",
            "UNTIL (UTC)",
            "END",
            "LAST WRITE (UTC)",
        ],
        &rows,
    )
}

/// The width of the labels in a tenure's block of the overlap review.
const LABEL_WIDTH: usize = 14;

/// The most characters of a stored value in the database column of a tenure's block, so that a long one
/// does not push the holder's column off the screen (the holder's column is last, and shows [`VALUE_CHARS`]).
const COLUMN_CHARS: usize = 64;

/// The overlap review of one lease (`pgfence history`): a block per tenure, oldest first, then a summary.
///
/// Each block shows the database's interval (database clock) beside the holder's belief (its own clock,
/// "unknown" where no report arrived: a killed process never reports its end), the endpoint as each side saw
/// it, where the belief's end lies on the database's clock, the clock offset bounds, the last accepted write
/// and the verdict. An overlap (certain or possible) is flagged with `!!` lines: when the successor's
/// acquisition committed, the writes accepted in the window (none, or a loud FENCE BROKEN) and the refusals
/// the audit recorded. Every stored string is escaped ([`value`]).
pub(super) fn review(lease: &str, reviews: &[TenureReview]) -> String {
    let mut out = format!(
        "Overlap review of {}: times UTC, by the database clock unless marked (holder clock)\n",
        value(lease)
    );
    for review in reviews {
        out.push('\n');
        tenure_block(&mut out, review);
    }
    out.push('\n');
    out.push_str(&review_summary(lease, reviews));
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
/// [`pgfence::WRITE_MARK_RESOLUTION`] early.
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

/// The tenure's last write mark when it lies less than [`pgfence::WRITE_MARK_RESOLUTION`] before the
/// successor's acquisition: a session marks only its first accepted write in each second, so a write of that
/// session after the acquisition but within the mark's second would leave no trace the review can see.
fn window_mark(review: &TenureReview, acquired_at: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let resolution = chrono::Duration::from_std(pgfence::WRITE_MARK_RESOLUTION).ok()?;
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

/// The identity as text lines; every value read from the server is escaped.
pub(super) fn identity(identity: &DatabaseIdentity, target: &str) -> String {
    let unknown = || "unknown (no privilege)".to_owned();
    let lines = [
        ("server", value(target)),
        (
            "role",
            if identity.in_recovery {
                "standby"
            } else {
                "primary"
            }
            .to_owned(),
        ),
        (
            "system identifier",
            identity
                .system_identifier
                .as_deref()
                .map_or_else(unknown, value),
        ),
        ("database", value(&identity.database)),
        (
            "instance id",
            identity
                .instance_id
                .as_deref()
                .map_or_else(|| "none (run `pgfence migrate`)".into(), value),
        ),
        (
            "timeline",
            identity.timeline.map_or_else(unknown, |t| t.to_string()),
        ),
        ("server version", value(&identity.server_version)),
    ];
    lines
        .iter()
        .map(|(label, text)| format!("{label:<18} {text}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_writes_controls_and_backslashes_as_rust_escapes() {
        assert_eq!(escape("pod-a", 64), "pod-a");
        assert_eq!(escape("\u{1b}[2J", 64), "\\u{1b}[2J");
        assert_eq!(escape("a\rb\u{7}", 64), "a\\u{d}b\\u{7}");
        assert_eq!(escape("\u{9b}\u{7f}", 64), "\\u{9b}\\u{7f}");
        assert_eq!(escape("\u{202e}evil\u{2066}", 64), "\\u{202e}evil\\u{2066}");
        // The backslash is escaped too, so a stored `\u{1b}` reads differently from an escaped ESC.
        assert_eq!(escape("\\u{1b}", 64), "\\\\u{1b}");
        // Printable non-ASCII, combining marks included, is kept.
        assert_eq!(escape("e\u{301} ¥ Ѩ", 64), "e\u{301} ¥ Ѩ");
    }

    #[test]
    fn escape_cuts_long_text_whole_escapes_only_and_says_how_much_was_left_out() {
        let long = "x".repeat(70_000);
        assert_eq!(
            escape(&long, VALUE_CHARS),
            format!(
                "{}…(+{} chars)",
                "x".repeat(VALUE_CHARS),
                70_000 - VALUE_CHARS
            )
        );
        // The 6-character escape of ESC does not fit in 7 characters after `ab`, so it is left out whole.
        assert_eq!(escape("ab\u{1b}c", 7), "ab…(+2 chars)");
        assert_eq!(escape("ab\u{1b}c", 8), "ab\\u{1b}…(+1 char)");
        assert_eq!(escape("ab\u{1b}c", 9), "ab\\u{1b}c");
        assert_eq!(escape("", 0), "");
    }

    #[test]
    fn render_pads_by_hand_whatever_the_cell_length() {
        let huge = "\u{1b}".repeat(70_000);
        let text = render(&["A", "B"], &[vec![huge, "b".into()]]);
        assert!(!text.chars().any(is_terminal_control_but_newline), "{text}");
        let first = text.lines().nth(2).unwrap();
        let width = escape(&"\u{1b}".repeat(70_000), VALUE_CHARS)
            .chars()
            .count();
        assert_eq!(first.chars().count(), width + 2 + 1);
    }

    fn is_terminal_control_but_newline(c: char) -> bool {
        c != '\n' && is_terminal_control(c)
    }

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
        let text = review("demo/scheduler", &crate::fixtures::review());
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
        let text = review("demo/scheduler", &reviews);
        assert!(block(&text, 1).contains(
            "\n  !! accepted writes in the window: 0 recorded (the last write mark, 2026-11-30 04:41:50.949Z, is \
             less than 1 s before the acquisition: a later write of its session in that second leaves no mark)\n"
        ), "{text}");
    }

    #[test]
    fn review_says_an_unreported_end_is_unknown() {
        let text = review("demo/scheduler", &crate::fixtures::review());
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
        let text = review("demo/scheduler", &crate::fixtures::review());
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
        let text = review("demo/\u{1b}[2Jscheduler", &crate::fixtures::review());
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
