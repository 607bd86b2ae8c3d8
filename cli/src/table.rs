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
use pgfence::{DatabaseIdentity, LeaseStatus, Rejection, Tenure};

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
}
