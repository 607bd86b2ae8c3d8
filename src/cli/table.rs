//! Human-readable tables for the read commands.

use std::time::Duration;

use chrono::{DateTime, Utc};
use pgfence::{DatabaseIdentity, LeaseState, LeaseStatus, Rejection, Tenure};

/// Prints rows under a header, each column as wide as its widest cell.
pub(super) fn print(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = widths[i]))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    line(widths.iter().map(|w| "-".repeat(*w)).collect());
    for row in rows {
        line(row.clone());
    }
    if rows.is_empty() {
        println!("(none)");
    }
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

pub(super) fn leases(leases: &[LeaseStatus]) {
    let rows: Vec<Vec<String>> = leases
        .iter()
        .map(|l| {
            vec![
                l.name.clone(),
                l.holder.clone().unwrap_or_else(|| "-".into()),
                l.epoch.map_or_else(|| "-".into(), |e| e.to_string()),
                match l.state {
                    LeaseState::Held => "held",
                    LeaseState::Expired => "expired",
                    LeaseState::Released => "released",
                }
                .to_owned(),
                duration(l.expires_in),
                l.transitions.to_string(),
                time(l.last_write_at),
            ]
        })
        .collect();
    print(
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
    );
}

pub(super) fn rejections(rows: &[Rejection]) {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                time(Some(r.last_rejected_at)),
                r.lease.clone(),
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
    print(
        &[
            "LAST REFUSED (UTC)",
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
    );
}

pub(super) fn tenures(tenures: &[Tenure]) {
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
    print(
        &[
            "EPOCH",
            "HOLDER",
            "FROM (UTC)",
            "UNTIL (UTC)",
            "END",
            "LAST WRITE (UTC)",
        ],
        &rows,
    );
}

pub(super) fn identity(identity: &DatabaseIdentity, target: &str) {
    let unknown = || "unknown (no privilege)".to_owned();
    println!("server             {target}");
    println!(
        "role               {}",
        if identity.in_recovery {
            "standby"
        } else {
            "primary"
        }
    );
    println!(
        "system identifier  {}",
        identity.system_identifier.clone().unwrap_or_else(unknown)
    );
    println!("database           {}", identity.database);
    println!(
        "instance id        {}",
        identity
            .instance_id
            .clone()
            .unwrap_or_else(|| "none (run `pgfence migrate`)".into())
    );
    println!(
        "timeline           {}",
        identity.timeline.map_or_else(unknown, |t| t.to_string())
    );
    println!("server version     {}", identity.server_version);
}
