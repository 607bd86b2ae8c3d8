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
