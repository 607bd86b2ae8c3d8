//! `--plot`: throughput against concurrency, one panel per batch size and one for the lease workloads, one line
//! per workload. SVG only (no fonts or bitmaps to bundle); browsers and GitHub render it.

use std::path::Path;

use plotters::prelude::*;

use super::report::Measurement;

type Series = (String, Vec<(u32, f64)>);

pub(super) fn write_svg(path: &Path, all: &[Measurement], title: &str) -> Result<(), String> {
    let mut batches: Vec<u32> = all
        .iter()
        .filter(|m| m.lease_rows.is_none())
        .map(|m| m.batch)
        .collect();
    batches.sort_unstable();
    batches.dedup();
    let mut panels: Vec<(String, &str, Vec<Series>)> = batches
        .iter()
        .map(|&b| {
            let series = series(
                all.iter()
                    .filter(|m| m.lease_rows.is_none() && m.batch == b),
                |m| m.workload.to_owned(),
            );
            (
                format!(
                    "writes, {b} row{} per round trip",
                    if b == 1 { "" } else { "s" }
                ),
                "rows/s",
                series,
            )
        })
        .collect();
    let leases = series(all.iter().filter(|m| m.lease_rows.is_some()), |m| {
        format!("{} ({} leases)", m.workload, m.lease_rows.unwrap_or(0))
    });
    if !leases.is_empty() {
        panels.push(("acquire and renew".to_owned(), "ops/s", leases));
    }
    if panels.is_empty() {
        return Err("nothing was measured".to_owned());
    }
    let max_c = all.iter().map(|m| m.concurrency).max().unwrap_or(1).max(2);
    let columns = if panels.len() > 1 { 2 } else { 1 };
    let rows = panels.len().div_ceil(columns);
    let size = (760 * columns as u32, 560 * rows as u32 + 40);
    let root = SVGBackend::new(path, size).into_drawing_area();
    let err = |e: DrawingAreaErrorKind<_>| e.to_string();
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, ("sans-serif", 22)).map_err(err)?;
    let areas = root.split_evenly((rows, columns));
    for ((caption, unit, series), area) in panels.iter().zip(areas.iter()) {
        let y_max = series
            .iter()
            .flat_map(|(_, points)| points.iter().map(|p| p.1))
            .fold(1.0f64, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d((1u32..max_c * 2).log_scale(), 0f64..y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("concurrent writers")
            .y_desc(*unit)
            .x_label_formatter(&|c| c.to_string())
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()
            .map_err(err)?;
        for (i, (name, points)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(err)?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .border_style(BLACK.mix(0.3))
            .background_style(WHITE.mix(0.85))
            .label_font(("sans-serif", 12))
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// One line per name, points sorted by concurrency; rows/s for writes, ops/s for leases.
fn series<'a>(
    measurements: impl Iterator<Item = &'a Measurement>,
    name: impl Fn(&Measurement) -> String,
) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for m in measurements {
        let label = name(m);
        let point = (m.concurrency, m.rows_per_s);
        match out.iter_mut().find(|(n, _)| *n == label) {
            Some((_, points)) => points.push(point),
            None => out.push((label, vec![point])),
        }
    }
    for (_, points) in &mut out {
        points.sort_by_key(|p| p.0);
    }
    out
}
