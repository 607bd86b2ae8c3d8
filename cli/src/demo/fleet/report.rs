//! The fleet scenario's report: the table on stdout, and the names led over time as a picture.

use super::{Fleet, FleetReport, START_EVERY};
use crate::Failure;

/// Every statement since the last reset of `pg_stat_statements`: (calls, total server ms, the statements with the
/// most server time: calls, total server ms, the statement's first 100 characters).
pub(super) async fn statement_profile(
    fleet: &Fleet,
) -> Result<(f64, f64, Vec<(f64, f64, String)>), Failure> {
    let total = fleet
        .query(
            "SELECT coalesce(sum(calls), 0)::float8, coalesce(sum(total_exec_time), 0)::float8 \
               FROM pg_stat_statements",
        )
        .await?;
    let top = fleet
        .query(
            "SELECT calls::float8, total_exec_time, left(regexp_replace(query, '\\s+', ' ', 'g'), 100) \
               FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 8",
        )
        .await?;
    Ok((
        total[0].get(0),
        total[0].get(1),
        top.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect(),
    ))
}

/// The convergence's timeline from the database (its clock only): the group's stored assignments until now and
/// the fleet's tenures begun since `first_start`, in seconds after `last_start`.
pub(super) async fn timeline(
    fleet: &Fleet,
    report: &mut FleetReport,
    first_start: &str,
    last_start: &str,
) -> Result<(), Failure> {
    let since =
        |column: &str| format!("extract(epoch FROM {column} - $1::text::timestamptz)::float8");
    let group = fleet
        .admin
        .query(
            &format!(
                "SELECT generation, {} FROM pgfence.groups WHERE grp = $2",
                since("assigned_at")
            ),
            &[&last_start, &fleet.qualified_group],
        )
        .await
        .map_err(|e| Failure::new(1, format!("fleet: {e}")))?;
    if let Some(row) = group.first() {
        report.assignments_stored = row.get(0);
        report.last_assignment_s = row.get(1);
    }
    let prefix = format!("{}/{}/", fleet.cluster, super::SHARDED);
    let tenures = fleet
        .admin
        .query(
            &format!(
                "SELECT count(*), percentile_disc(ARRAY[0, 0.5, 0.9, 1]) WITHIN GROUP (ORDER BY {}) \
                   FROM pgfence.tenures WHERE starts_with(lease, $2) AND acquired_at >= $3::text::timestamptz",
                since("acquired_at")
            ),
            &[&last_start, &prefix, &first_start],
        )
        .await
        .map_err(|e| Failure::new(1, format!("fleet: {e}")))?;
    report.tenures_until_balanced = tenures[0].get(0);
    report.tenure_starts_s = tenures[0].get::<_, Option<Vec<f64>>>(1).unwrap_or_default();
    Ok(())
}

/// Counts the warnings and errors in the replicas' logs under `dir`, and the most frequent message (its level,
/// target and text, without the time or the spans' fields).
pub(super) fn count_logs(dir: &std::path::Path, report: &mut FleetReport) {
    let mut messages: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        // Plain text: the replicas (this binary) colour their log only on a terminal.
        for line in text.lines() {
            let (warn, error) = (line.contains(" WARN "), line.contains(" ERROR "));
            report.replica_warnings += u64::from(warn);
            report.replica_errors += u64::from(error);
            if warn || error {
                *messages.entry(message_of(line)).or_default() += 1;
            }
        }
    }
    report.most_logged = messages
        .into_iter()
        .max_by_key(|(text, n)| (*n, std::cmp::Reverse(text.clone())))
        .map(|(text, n)| (n, text));
}

/// A log line's level, target and message, without its time and spans, and with digits folded (so that one
/// message about many shards counts as one).
fn message_of(line: &str) -> String {
    let level = if line.contains(" ERROR ") {
        "ERROR"
    } else {
        "WARN"
    };
    let rest = line.rsplit_once("}: ").map_or(line, |(_, rest)| rest);
    let rest = rest
        .split_once(&format!("{level} "))
        .map_or(rest, |(_, r)| r);
    let mut folded = String::new();
    for c in rest.chars().take(160) {
        if c.is_ascii_digit() {
            if !folded.ends_with('#') {
                folded.push('#');
            }
        } else {
            folded.push(c);
        }
    }
    format!("{level} {}", folded.trim())
}

pub(super) fn print_report(r: &FleetReport) {
    let ms = |v: Option<u128>| {
        v.map_or("never".to_owned(), |v| {
            format!("{:.1} s", v as f64 / 1000.0)
        })
    };
    let f = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
    println!(
        "fleet: {} replicas x {} names, ttl {:.0} s (rolling start, one every {} ms)",
        r.replicas,
        r.names,
        r.ttl_ms as f64 / 1000.0,
        START_EVERY.as_millis()
    );
    println!("  balanced after the last start     {}", ms(r.converged_ms));
    let secs = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:+.1} s"));
    println!(
        "  assignments stored until balanced {} (the first seen {}, the last stored {} after the last start)",
        r.assignments_stored,
        secs(r.first_assignment_s),
        secs(r.last_assignment_s)
    );
    if let [first, p50, p90, last] = r.tenure_starts_s[..] {
        println!(
            "  tenures begun until balanced      {} for {} names: first {first:+.1} s, p50 {p50:+.1} s, \
             p90 {p90:+.1} s, last {last:+.1} s after the last start",
            r.tenures_until_balanced, r.names
        );
    }
    if r.converging_calls > 0.0 {
        println!(
            "  statements until balanced         {:.0} ({:.0} ms server time)",
            r.converging_calls, r.converging_server_ms
        );
        for (calls, total, statement) in &r.converging_statements {
            println!("      {calls:>8.0} {total:>9.0} ms  {statement}");
        }
    }
    println!(
        "  tenures begun while stable        {} (in {:.0} s)",
        r.moved_while_stable,
        r.stable_ms as f64 / 1000.0
    );
    println!(
        "  statements per second             {:.1}",
        r.statements_per_s
    );
    println!(
        "  renewal statement (per tick)      {} ms mean server time ({} calls)",
        f(r.renewal_ms),
        r.renewal_calls
    );
    println!(
        "  server time per second            {:.1} ms",
        r.server_ms_per_s
    );
    for (per_s, mean, statement) in &r.top_statements {
        println!("      {per_s:>8.1}/s {mean:>7.2} ms  {statement}");
    }
    println!(
        "  client connections                {} (at most {} per replica)",
        r.connections, r.connections_max_per_replica
    );
    println!(
        "  memory per replica                {:.1} MiB median, {:.1} MiB max",
        r.rss_median_mib, r.rss_max_mib
    );
    println!(
        "  SIGKILL of one ({} names)         led again after {}; {} other names moved",
        r.killed_names,
        ms(r.killed_releds_ms),
        r.moved_by_kill
    );
    println!(
        "  SIGTERM of one ({} names)         handover gap p50 {} ms, p99 {} ms, max {} ms",
        r.stopped_names,
        f(r.handover_p50_ms),
        f(r.handover_p99_ms),
        f(r.handover_max_ms)
    );
    println!(
        "  a replica joins                   leads {} after {}; {} tenures began",
        r.join_led,
        ms(r.join_ms),
        r.moved_by_join
    );
    println!(
        "  replicas' log                     {} warnings, {} errors",
        r.replica_warnings, r.replica_errors
    );
    if let Some((n, text)) = &r.most_logged {
        println!(
            "      {n:>8} × {}",
            crate::table::escape(text, crate::table::VALUE_CHARS)
        );
    }
}

/// The names led over the run, as an SVG line.
pub(super) fn plot(path: &std::path::Path, samples: &[(f64, u64)]) -> Result<(), Failure> {
    use plotters::prelude::*;
    let fail = |e: &dyn std::fmt::Display| Failure::new(1, format!("fleet plot: {e}"));
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let x_max = samples.last().map_or(1.0, |s| s.0).max(1.0);
    let y_max = samples.iter().map(|s| s.1).max().unwrap_or(1).max(1) as f64 * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption("names led over time", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc("seconds since the first replica started")
        .y_desc("names led")
        .draw()
        .map_err(|e| fail(&e))?;
    chart
        .draw_series(LineSeries::new(
            samples.iter().map(|&(t, n)| (t, n as f64)),
            &BLUE,
        ))
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replica's log line becomes its level, target and message, spans and time left out, and the digits of
    /// a shard folded, so that one message about many shards is counted as one.
    #[test]
    fn log_lines_are_folded_into_their_message() {
        let warn = "2026-12-08T00:34:47.685413Z  WARN controller{controller=shard/887}:run_with_leadership{lease=fleet/shard/887 holder=\"r050\"}: pgfence::leader::run: acquisition failed; retrying lease=fleet/shard/887";
        assert_eq!(
            message_of(warn),
            "WARN pgfence::leader::run: acquisition failed; retrying lease=fleet/shard/#"
        );
        let error = "2026-12-08T00:34:36.437562Z ERROR pgfence::leader::run: leader callback did not stop within the grace period after cancellation; aborting it lease=fleet/shard/1198 grace=1s";
        assert_eq!(
            message_of(error),
            "ERROR pgfence::leader::run: leader callback did not stop within the grace period after \
             cancellation; aborting it lease=fleet/shard/# grace=#s"
        );
    }
}
