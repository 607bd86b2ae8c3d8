//! What the read commands print for people: tables and text lines, and the escaping that keeps stored text
//! from acting on the operator's terminal.
//!
//! Every string the CLI prints in human output that came from the database (lease names, holders, end reasons,
//! audit fields, identity fields, error messages that may quote stored values) goes through [`escape`]: a
//! role with table privileges, or a bug elsewhere, can store any text, and a raw ESC, OSC or CR in it would
//! let that text clear the screen, retitle the window, write to the clipboard or overwrite what the operator
//! reads. `--json` output applies the same rule ([`is_terminal_control`]) as JSON `\uXXXX` escapes, which
//! decode to the exact stored text (`TerminalJson` in the `output` module).

mod effects;
mod history;
mod terminal;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, Utc};
use pgfence::admin::Rejection;
use pgfence::history::Tenure;
use pgfence::{DatabaseIdentity, LeaseStatus};

pub(super) use self::effects::{in_doubt, ledger};
pub(super) use self::history::review;
pub(super) use self::terminal::{escape, is_terminal_control, value, MESSAGE_CHARS, VALUE_CHARS};

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
        let led_by = leaders(group);
        let differ: Vec<String> = group
            .mismatched
            .iter()
            .map(|name| differing(group, &led_by, name))
            .collect();
        let _ = writeln!(out, "differ: {}", value(&differ.join(", ")));
    }
    out
}

/// Name → the member of `group` that leads it now (any row, live or not): one pass over the rows, so that
/// naming the leader of every differing name costs O(names), not O(names × members).
pub(super) fn leaders(group: &crate::groups::GroupView) -> HashMap<&str, &str> {
    group
        .members
        .iter()
        .flat_map(|m| {
            m.row
                .leads
                .iter()
                .map(move |n| (n.as_str(), m.row.member.as_str()))
        })
        .collect()
}

/// A name that differs from the assignment, unescaped: `NAME (assigned to M, led by L)`.
pub(super) fn differing(
    group: &crate::groups::GroupView,
    led_by: &HashMap<&str, &str>,
    name: &str,
) -> String {
    format!(
        "{name} (assigned to {}, led by {})",
        group.assignment.owner(name).unwrap_or("nobody"),
        led_by.get(name).copied().unwrap_or("nobody")
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
    use super::terminal::is_terminal_control_but_newline;
    use super::*;

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
}
