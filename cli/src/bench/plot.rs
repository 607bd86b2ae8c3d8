//! `--plot`: the message first. The top row shows what fencing costs — guarded ÷ unguarded throughput per write
//! path, and the library's path ÷ the same statement sent raw through tokio-postgres — against concurrency,
//! with the targets drawn as dashed lines. Below them: single-row throughput of the main workloads, the gain of
//! batching, and the lease operations. SVG only (no fonts or bitmaps to bundle); browsers and GitHub render it.
//! Measurements of several runs (`--plot-from`, e.g. fsync off and on) are drawn in one chart: each line once per
//! run, the same colour, the first run solid and the others dashed, the run named in the legend.

use std::path::Path;

use plotters::prelude::*;

use super::report::{Measurement, Ratio};

/// A line: its label (without the run), the run it comes from (`Measurement::variant`), its points.
type Series = (String, Option<String>, Vec<(u32, f64)>);

/// One panel: a caption, the y axis label, its lines, dashed horizontal target lines, and whether the y axis
/// starts at 0 with a fixed top (ratios) or scales to the data (throughput).
struct Panel {
    caption: String,
    unit: &'static str,
    series: Vec<Series>,
    targets: Vec<(f64, &'static str)>,
    y_max: Option<f64>,
}

/// The ratio lines of a panel: (label, workload, which ratio of it).
type RatioLine = (
    &'static str,
    &'static str,
    fn(&Measurement) -> Option<&Ratio>,
);

/// The runs among `all`, in order of appearance (`None`: a single run).
fn variants(all: &[Measurement]) -> Vec<Option<String>> {
    let mut out: Vec<Option<String>> = Vec::new();
    for m in all {
        if !out.contains(&m.variant) {
            out.push(m.variant.clone());
        }
    }
    out
}

fn ratio_series(all: &[Measurement], batch: u32, lines: &[RatioLine]) -> Vec<Series> {
    let mut out = Vec::new();
    for (label, workload, pick) in lines {
        for variant in variants(all) {
            let mut points: Vec<(u32, f64)> = all
                .iter()
                .filter(|m| {
                    m.lease_rows.is_none()
                        && m.batch == batch
                        && m.workload == *workload
                        && m.variant == variant
                })
                .filter_map(|m| pick(m).map(|r| (m.concurrency, r.value)))
                .collect();
            points.sort_by_key(|p| p.0);
            if !points.is_empty() {
                out.push(((*label).to_owned(), variant, points));
            }
        }
    }
    out
}

fn throughput_series(
    all: &[Measurement],
    keep: impl Fn(&Measurement) -> bool,
    name: impl Fn(&Measurement) -> String,
    value: impl Fn(&Measurement) -> f64,
) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for m in all.iter().filter(|m| keep(m)) {
        let label = name(m);
        let point = (m.concurrency, value(m));
        match out
            .iter_mut()
            .find(|(n, v, _)| *n == label && *v == m.variant)
        {
            Some((_, _, points)) => points.push(point),
            None => out.push((label, m.variant.clone(), vec![point])),
        }
    }
    for (_, _, points) in &mut out {
        points.sort_by_key(|p| p.0);
    }
    out
}

fn panels(all: &[Measurement]) -> Vec<Panel> {
    let mut panels = Vec::new();
    let guard_cost: [RatioLine; 6] = [
        (
            "guarded-update ÷ update (one statement, portable guard)",
            "guarded-update",
            |m| m.vs_unguarded.as_ref(),
        ),
        (
            "guarded-update-native ÷ update (native guard)",
            "guarded-update-native",
            |m| m.vs_unguarded.as_ref(),
        ),
        (
            "fenced ÷ tx (BEGIN+guard, UPDATE, COMMIT)",
            "fenced",
            |m| m.vs_unguarded.as_ref(),
        ),
        ("fenced-native ÷ tx", "fenced-native", |m| {
            m.vs_unguarded.as_ref()
        }),
        ("append ÷ append-unguarded", "append", |m| {
            m.vs_unguarded.as_ref()
        }),
        (
            "peer-for-share-update ÷ update (a share lock, for comparison)",
            "peer-for-share-update",
            |m| m.vs_unguarded.as_ref(),
        ),
    ];
    let series = ratio_series(all, 1, &guard_cost);
    if !series.is_empty() {
        panels.push(Panel {
            caption: "what the guard costs: guarded ÷ unguarded, same pool, same rows".to_owned(),
            unit: "throughput ratio",
            series,
            targets: vec![(0.6, "0.6 portable"), (0.90, "0.90 native, fenced, append")],
            y_max: Some(1.3),
        });
    }
    let client_path: [RatioLine; 4] = [
        (
            "guarded-update ÷ raw-guarded-update",
            "guarded-update",
            |m| m.vs_raw.as_ref(),
        ),
        (
            "guarded-update-native ÷ raw-guarded-update-native",
            "guarded-update-native",
            |m| m.vs_raw.as_ref(),
        ),
        ("fenced ÷ raw-fenced", "fenced", |m| m.vs_raw.as_ref()),
        ("append ÷ raw-append", "append", |m| m.vs_raw.as_ref()),
    ];
    let series = ratio_series(all, 1, &client_path);
    if !series.is_empty() {
        panels.push(Panel {
            caption: "what the library's client path costs: pool ÷ raw tokio-postgres".to_owned(),
            unit: "throughput ratio",
            series,
            targets: vec![(0.90, "0.90")],
            y_max: Some(1.3),
        });
    }
    const MAIN: [&str; 8] = [
        "update",
        "guarded-update",
        "guarded-update-native",
        "peer-for-share-update",
        "tx",
        "fenced",
        "fenced-native",
        "append",
    ];
    let series = throughput_series(
        all,
        |m| m.lease_rows.is_none() && m.batch == 1 && MAIN.contains(&m.workload.as_str()),
        |m| m.workload.clone(),
        |m| m.tx_per_s,
    );
    if !series.is_empty() {
        panels.push(Panel {
            caption: "single-row writes, transactions per second".to_owned(),
            unit: "tx/s",
            series,
            targets: Vec::new(),
            y_max: None,
        });
    }
    let series = throughput_series(
        all,
        |m| {
            m.lease_rows.is_none()
                && m.batch > 1
                && m.vs_batch1.is_some()
                && ["fenced", "guarded-update", "guarded-update-native"]
                    .contains(&m.workload.as_str())
        },
        |m| format!("{} ({} rows)", m.workload, m.batch),
        |m| m.vs_batch1.as_ref().map_or(0.0, |r| r.value),
    );
    if !series.is_empty() {
        panels.push(Panel {
            caption: "batching: rows/s ÷ single-row rows/s".to_owned(),
            unit: "× single-row",
            series,
            targets: vec![(30.0, "30× (100 rows)")],
            y_max: None,
        });
    }
    let series = throughput_series(
        all,
        |m| m.lease_rows.is_some(),
        |m| format!("{} ({} leases)", m.workload, m.lease_rows.unwrap_or(0)),
        |m| m.tx_per_s,
    );
    if !series.is_empty() {
        panels.push(Panel {
            caption: "acquire and renew".to_owned(),
            unit: "ops/s",
            series,
            targets: Vec::new(),
            y_max: None,
        });
    }
    panels
}

pub(super) fn write_svg(path: &Path, all: &[Measurement], title: &str) -> Result<(), String> {
    let panels = panels(all);
    if panels.is_empty() {
        return Err("nothing was measured".to_owned());
    }
    let max_c = all.iter().map(|m| m.concurrency).max().unwrap_or(1).max(2);
    let columns = if panels.len() > 1 { 2 } else { 1 };
    let rows = panels.len().div_ceil(columns);
    let size = (760 * columns as u32, 520 * rows as u32 + 40);
    let root = SVGBackend::new(path, size).into_drawing_area();
    let err = |e: DrawingAreaErrorKind<_>| e.to_string();
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, ("sans-serif", 22)).map_err(err)?;
    let areas = root.split_evenly((rows, columns));
    for (panel, area) in panels.iter().zip(areas.iter()) {
        let data_max = panel
            .series
            .iter()
            .flat_map(|(_, _, points)| points.iter().map(|p| p.1))
            .chain(panel.targets.iter().map(|t| t.0))
            .fold(1.0f64, f64::max)
            * 1.1;
        let y_max = panel.y_max.map_or(data_max, |top| top.max(data_max));
        let x_range = (1u32..max_c * 2).log_scale();
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.caption, ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(x_range, 0f64..y_max)
            .map_err(err)?;
        let ratio = panel.y_max.is_some();
        chart
            .configure_mesh()
            .x_desc("concurrent writers")
            .y_desc(panel.unit)
            .x_label_formatter(&|c| c.to_string())
            .y_label_formatter(&|v| {
                if ratio {
                    format!("{v:.2}")
                } else {
                    format!("{v:.0}")
                }
            })
            .draw()
            .map_err(err)?;
        for (value, label) in &panel.targets {
            let grey = RGBColor(90, 90, 90);
            let dashed = DashedLineSeries::new(
                [(1u32, *value), (max_c * 2 - 1, *value)],
                6,
                4,
                grey.stroke_width(1),
            );
            chart.draw_series(dashed).map_err(err)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    format!("target {label}"),
                    (1u32, *value),
                    ("sans-serif", 12).into_font().color(&grey),
                )))
                .map_err(err)?;
        }
        let runs = variants(all);
        let mut names: Vec<&String> = Vec::new();
        for (name, variant, points) in &panel.series {
            // One colour per line, whatever the run; the first run solid, the others dashed.
            let i = names.iter().position(|n| *n == name).unwrap_or_else(|| {
                names.push(name);
                names.len() - 1
            });
            let color = Palette99::pick(i).to_rgba();
            let label = match variant {
                Some(v) => format!("{name} ({v})"),
                None => name.clone(),
            };
            let solid = runs.first() == Some(variant);
            let drawn = if solid {
                chart.draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))
            } else {
                chart.draw_series(DashedLineSeries::new(
                    points.iter().copied(),
                    7,
                    4,
                    color.stroke_width(2),
                ))
            };
            drawn.map_err(err)?.label(label).legend(move |(x, y)| {
                if solid {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                } else {
                    PathElement::new(vec![(x, y), (x + 6, y)], color.stroke_width(2))
                }
            });
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(if ratio {
                SeriesLabelPosition::LowerRight
            } else {
                SeriesLabelPosition::UpperLeft
            })
            .border_style(BLACK.mix(0.3))
            .background_style(WHITE.mix(0.85))
            .label_font(("sans-serif", 12))
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}
