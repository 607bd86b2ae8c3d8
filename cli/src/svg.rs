//! `pgfence history --svg FILE`: the overlap review as a timeline picture, one lane per tenure on the
//! database's time line (UTC).
//!
//! Each lane draws the database's interval as a solid bar and, below it, the holder's belief placed on the
//! database's clock through the review's clock-offset bounds: solid where every placement agrees, hatched
//! where the bounds leave it uncertain, dashed to the right edge when no end report arrived. The successor's
//! acquisition is a vertical line, refused writes are red ticks, the last accepted write a dot (with a
//! one-second whisker when only a write mark knows it), overlap windows are shaded.
//!
//! Written by hand (no fonts, no bitmaps, no dependency): every stored string (a lease, a holder, an
//! application name) is escaped for the terminal first ([`table::escape`]: no control character reaches the
//! file, and XML 1.0 allows none of them) and then for XML.

mod lane;

use std::fmt::Write as _;

use chrono::{DateTime, Duration, Utc};
use pgfence::history::{TenureReview, WRITE_MARK_RESOLUTION};

use crate::table;

const WIDTH: f64 = 1100.0;
/// The lane labels (epoch, holder) left of the plot.
const LEFT: f64 = 210.0;
/// The verdicts right of the plot.
const RIGHT: f64 = 170.0;
/// The title and the subtitle.
const TOP: f64 = 64.0;
const LANE: f64 = 56.0;
/// The axis below the lanes, then the legend.
const AXIS: f64 = 48.0;
const LEGEND: f64 = 56.0;
/// How many characters of a holder name a lane label shows.
const LABEL_CHARS: usize = 24;

const STYLE: &str = "\
text { font-family: sans-serif; font-size: 12px; fill: #222; }
.title { font-size: 16px; font-weight: bold; }
.note { font-size: 11px; fill: #555; }
.small { font-size: 10px; fill: #555; }
.axis { stroke: #444; stroke-width: 1; }
.grid { stroke: #ddd; stroke-width: 1; }
.database { fill: #4c78a8; }
.belief { fill: #2a9d8f; }
.belief-uncertain { fill: url(#hatch); stroke: #2a9d8f; stroke-width: 0.5; }
.belief-open { stroke: #2a9d8f; stroke-width: 2; stroke-dasharray: 4 3; }
.successor { stroke: #555; stroke-width: 1.5; stroke-dasharray: 5 3; }
.refusal { stroke: #d62728; stroke-width: 2; }
.refusal-first { stroke: #d62728; stroke-width: 1; stroke-opacity: 0.6; }
.write { fill: #111; }
.write-mark { stroke: #111; stroke-width: 1.5; }
.overlap-certain { fill: #d62728; fill-opacity: 0.16; }
.overlap-possible { fill: #ff9f1c; fill-opacity: 0.22; }
.broken { fill: none; stroke: #b00020; stroke-width: 3; }
.verdict-certain, .verdict-broken { fill: #b00020; font-weight: bold; }
.verdict-possible { fill: #c46a00; font-weight: bold; }
.verdict-unknown { fill: #777; }
.verdict-none { fill: #2e7d32; }
";

/// The timeline picture of `lease`'s review, as an SVG document.
pub(crate) fn timeline(lease: &str, reviews: &[TenureReview]) -> String {
    let lanes = reviews.len().max(1) as f64;
    let height = TOP + lanes * LANE + AXIS + LEGEND;
    let scale = Scale::of(reviews);
    let mut svg = String::new();
    let _ = writeln!(svg, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}">"#
    );
    let _ = writeln!(
        svg,
        "<title>pgfence history: {}</title>",
        text(lease, table::VALUE_CHARS)
    );
    let _ = writeln!(svg, "<style>\n{STYLE}</style>");
    svg.push_str(
        "<defs><pattern id=\"hatch\" patternUnits=\"userSpaceOnUse\" width=\"6\" height=\"6\" \
         patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#e6f4f2\"/>\
         <line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#2a9d8f\" stroke-width=\"2\"/></pattern></defs>\n",
    );
    let _ = writeln!(
        svg,
        r#"<rect width="{WIDTH}" height="{height}" fill="white"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text class="title" x="16" y="24">pgfence history: {}</text>"#,
        text(lease, 120)
    );
    let _ = writeln!(
        svg,
        "<text class=\"note\" x=\"16\" y=\"44\">Database clock, UTC. Thick bar: the tenure by the database; \
         thin bar: the holder's belief placed on the database clock (hatched: the clock bounds leave it \
         uncertain; dashed: no end report).</text>"
    );
    if reviews.is_empty() {
        let _ = writeln!(
            svg,
            r#"<text class="note" x="{LEFT}" y="{}">no tenures</text>"#,
            TOP + LANE / 2.0
        );
    }
    grid(&mut svg, &scale, TOP + lanes * LANE);
    for (i, review) in reviews.iter().enumerate() {
        lane::lane(&mut svg, &scale, TOP + i as f64 * LANE, review);
    }
    axis(&mut svg, &scale, TOP + lanes * LANE);
    legend(&mut svg, TOP + lanes * LANE + AXIS);
    svg.push_str("</svg>\n");
    svg
}

/// `s` as SVG text: escaped for the terminal (no control character left, cut at `max` characters), then
/// for XML; U+FFFE and U+FFFF, which XML forbids as well, as their Rust escapes.
fn text(s: &str, max: usize) -> String {
    let mut out = String::new();
    for c in table::escape(s, max).chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\u{fffe}' | '\u{ffff}' => out.extend(c.escape_unicode()),
            c => out.push(c),
        }
    }
    out
}

/// Database time to x: the span of every time the review names, with a margin on both sides.
struct Scale {
    start_us: i64,
    span_us: i64,
}

impl Scale {
    fn of(reviews: &[TenureReview]) -> Scale {
        let mut times: Vec<DateTime<Utc>> = Vec::new();
        for r in reviews {
            let t = &r.tenure;
            times.push(t.acquired_at);
            times.extend(t.ended_at);
            times.extend(t.last_write_at);
            times.extend(t.last_mark_at.map(|mark| mark + mark_resolution()));
            times.extend(r.successor.as_ref().map(|next| next.acquired_at));
            times.extend(r.accepted_after_successor);
            let placement = Placement::of(r);
            times.extend(placement.start.iter().flat_map(|(a, b)| [*a, *b]));
            if let Some((earliest, latest)) = placement.end {
                times.extend(earliest);
                times.push(latest);
            }
            for refusal in &r.refusals_after_successor {
                times.push(refusal.rejected_at);
                times.push(refusal.last_rejected_at);
            }
        }
        let us = |at: &DateTime<Utc>| at.timestamp_micros();
        let first = times.iter().map(us).min().unwrap_or(0);
        let last = times.iter().map(us).max().unwrap_or(0);
        let span = (last - first).max(1_000_000);
        let margin = span / 25;
        Scale {
            start_us: first - margin,
            span_us: span + 2 * margin,
        }
    }

    fn x(&self, at: DateTime<Utc>) -> f64 {
        let fraction = (at.timestamp_micros() - self.start_us) as f64 / self.span_us as f64;
        LEFT + fraction.clamp(0.0, 1.0) * (WIDTH - LEFT - RIGHT)
    }

    fn end_x(&self) -> f64 {
        WIDTH - RIGHT
    }
}

fn mark_resolution() -> Duration {
    Duration::from_std(WRITE_MARK_RESOLUTION).unwrap_or(Duration::seconds(1))
}

/// The holder's belief on the database's clock: its start between two times (the acquisition reply's
/// arrival, moved by the offset bounds), its end between two (no lower one without a start report).
struct Placement {
    start: Option<(DateTime<Utc>, DateTime<Utc>)>,
    end: Option<(Option<DateTime<Utc>>, DateTime<Utc>)>,
}

impl Placement {
    fn of(review: &TenureReview) -> Placement {
        let start = match (review.tenure.belief.from, review.clock_offset) {
            (Some(from), Some(offset)) => offset.min_us.map(|min| {
                (
                    from + Duration::microseconds(min),
                    from + Duration::microseconds(offset.max_us),
                )
            }),
            _ => None,
        };
        let end = review
            .believed_until_db
            .map(|interval| (interval.earliest, interval.latest));
        Placement { start, end }
    }
}

fn line(svg: &mut String, class: &str, (x1, y1): (f64, f64), (x2, y2): (f64, f64)) {
    let _ = writeln!(
        svg,
        r#"<line class="{class}" x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}"/>"#
    );
}

/// A rectangle from x0 to x1 (at least a pixel wide, so an instant stays visible).
fn bar(svg: &mut String, class: &str, x0: f64, x1: f64, y: f64, height: f64) {
    let width = (x1 - x0).max(1.0);
    let _ = writeln!(
        svg,
        r#"<rect class="{class}" x="{x0:.1}" y="{y:.1}" width="{width:.1}" height="{height:.1}"/>"#
    );
}

/// Faint vertical lines at the axis ticks, behind the lanes.
fn grid(svg: &mut String, scale: &Scale, bottom: f64) {
    for (x, _) in ticks(scale) {
        line(svg, "grid", (x, TOP), (x, bottom));
    }
}

fn axis(svg: &mut String, scale: &Scale, y: f64) {
    line(svg, "axis", (LEFT, y), (scale.end_x(), y));
    for (x, label) in ticks(scale) {
        line(svg, "axis", (x, y), (x, y + 5.0));
        let _ = writeln!(
            svg,
            r#"<text class="small" x="{x:.1}" y="{:.1}" text-anchor="middle">{label}</text>"#,
            y + 17.0
        );
    }
    let start = DateTime::<Utc>::from_timestamp_micros(scale.start_us);
    let end = DateTime::<Utc>::from_timestamp_micros(scale.start_us + scale.span_us);
    let _ = writeln!(
        svg,
        r#"<text class="note" x="{LEFT}" y="{:.1}">UTC, database clock: {} to {}</text>"#,
        y + 36.0,
        table::time(start),
        table::time(end)
    );
}

/// Tick positions and labels: the smallest round step that gives at most eight ticks, labelled as
/// precisely as the step needs.
fn ticks(scale: &Scale) -> Vec<(f64, String)> {
    const MS: i64 = 1_000;
    const S: i64 = 1_000_000;
    const MIN: i64 = 60 * S;
    const H: i64 = 60 * MIN;
    const D: i64 = 24 * H;
    let steps = [
        MS,
        2 * MS,
        5 * MS,
        10 * MS,
        20 * MS,
        50 * MS,
        100 * MS,
        200 * MS,
        500 * MS,
        S,
        2 * S,
        5 * S,
        10 * S,
        15 * S,
        30 * S,
        MIN,
        2 * MIN,
        5 * MIN,
        10 * MIN,
        15 * MIN,
        30 * MIN,
        H,
        2 * H,
        3 * H,
        6 * H,
        12 * H,
        D,
        2 * D,
        7 * D,
        30 * D,
        365 * D,
    ];
    let step = steps
        .into_iter()
        .find(|step| scale.span_us / step <= 8)
        .unwrap_or(scale.span_us / 8);
    let format = match step {
        s if s < S => "%H:%M:%S%.3f",
        s if s < MIN => "%H:%M:%S",
        s if s < D => "%m-%d %H:%M",
        _ => "%Y-%m-%d",
    };
    let end = scale.start_us + scale.span_us;
    let mut at = scale.start_us.div_euclid(step) * step + step;
    let mut ticks = Vec::new();
    while at < end {
        if let Some(time) = DateTime::<Utc>::from_timestamp_micros(at) {
            ticks.push((scale.x(time), time.format(format).to_string()));
        }
        at += step;
    }
    ticks
}

fn legend(svg: &mut String, top: f64) {
    let items: [(&str, &str); 10] = [
        ("database", "tenure (database clock)"),
        ("belief", "belief, placed for certain"),
        ("belief-uncertain", "belief, uncertain placement"),
        ("belief-open", "belief, unknown end"),
        ("successor", "successor's acquisition"),
        ("refusal", "refused write (last; thin: first)"),
        ("write", "last accepted write (whisker: mark)"),
        ("overlap-certain", "certain overlap"),
        ("overlap-possible", "possible overlap"),
        ("broken", "write accepted after successor"),
    ];
    for (i, (class, label)) in items.iter().enumerate() {
        let x = 16.0 + (i % 5) as f64 * 216.0;
        let y = top + (i / 5) as f64 * 22.0;
        match *class {
            "successor" | "refusal" => line(svg, class, (x + 9.0, y - 2.0), (x + 9.0, y + 12.0)),
            "belief-open" => line(svg, class, (x, y + 5.0), (x + 18.0, y + 5.0)),
            "write" | "broken" => {
                let _ = writeln!(
                    svg,
                    r#"<circle class="{class}" cx="{:.1}" cy="{:.1}" r="4"/>"#,
                    x + 9.0,
                    y + 5.0
                );
            }
            _ => bar(svg, class, x, x + 18.0, y, 10.0),
        }
        let _ = writeln!(
            svg,
            r#"<text class="small" x="{:.1}" y="{:.1}">{label}</text>"#,
            x + 24.0,
            y + 9.0
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    /// Checks what a viewer needs: one root element, every tag closed in order, attribute values quoted,
    /// no markup character or control outside an escape, every `&` an entity.
    fn assert_well_formed(svg: &str) {
        let body = svg
            .strip_prefix(r#"<?xml version="1.0" encoding="UTF-8"?>"#)
            .expect("the XML declaration comes first");
        assert!(
            !svg.chars()
                .any(|c| c != '\n' && table::is_terminal_control(c)),
            "a control character in the SVG"
        );
        let entity_ok = |text: &str| {
            text.match_indices('&').all(|(at, _)| {
                ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                    .iter()
                    .any(|entity| text[at..].starts_with(entity))
            })
        };
        let mut open: Vec<&str> = Vec::new();
        let mut roots = 0;
        let mut rest = body;
        while let Some(start) = rest.find('<') {
            let text = &rest[..start];
            assert!(!text.contains('>') && entity_ok(text), "text {text:?}");
            let end = rest[start..].find('>').expect("every tag ends") + start;
            let tag = &rest[start + 1..end];
            assert!(!tag.contains('<'), "tag {tag:?}");
            assert_eq!(tag.matches('"').count() % 2, 0, "quotes in tag {tag:?}");
            assert!(entity_ok(tag), "tag {tag:?}");
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(open.pop(), Some(name), "closing tag {tag:?}");
            } else {
                let name = tag.split_whitespace().next().expect("a tag name");
                if open.is_empty() {
                    roots += 1;
                }
                if !tag.ends_with('/') {
                    open.push(name);
                }
            }
            rest = &rest[end + 1..];
        }
        assert!(open.is_empty(), "unclosed {open:?}");
        assert_eq!(roots, 1);
        assert!(rest.trim().is_empty(), "text after the root: {rest:?}");
    }

    #[test]
    fn timeline_is_well_formed_with_one_lane_per_tenure() {
        let svg = timeline("demo/scheduler", &fixtures::review());
        assert_well_formed(&svg);
        assert_eq!(svg.matches(r#"<g class="tenure""#).count(), 4);
        assert!(svg.contains("<title>pgfence history: demo/scheduler</title>"));
        assert!(svg.contains(">UTC, database clock: "), "{svg}");
    }

    #[test]
    fn timeline_shades_overlaps_and_draws_an_unknown_end_open() {
        let svg = timeline("demo/scheduler", &fixtures::review());
        // Each class is drawn once more in the legend.
        assert_eq!(
            svg.matches(r#"<rect class="overlap-certain""#).count(),
            1 + 1
        );
        assert_eq!(
            svg.matches(r#"<rect class="overlap-possible""#).count(),
            1 + 1
        );
        assert!(svg.contains(">CERTAIN overlap</text>"));
        assert!(svg.contains(">POSSIBLE overlap</text>"));
        // Epoch 2 never reported its end: a dashed line to the edge, and the words.
        assert!(svg.contains(r#"<line class="belief-open""#));
        assert!(svg.contains(">unknown end (no report)</text>"));
        assert!(svg.contains(">unknown (no end report)</text>"));
        // Epoch 3's write after its successor's acquisition.
        assert_eq!(svg.matches(r#"<circle class="broken""#).count(), 1 + 1);
        assert!(svg.contains(">FENCE BROKEN</text>"));
        // Epoch 1's refusal: the first and the last one.
        assert_eq!(svg.matches(r#"<line class="refusal""#).count(), 1 + 1);
        assert_eq!(svg.matches(r#"<line class="refusal-first""#).count(), 1);
        // The last writes of epochs 2 and 3 are known from write marks (later than any task event): a
        // whisker one second long each; epoch 1's from a task event, exact.
        assert_eq!(svg.matches(r#"<line class="write-mark""#).count(), 2);
    }

    #[test]
    fn timeline_escapes_hostile_text() {
        let mut reviews = fixtures::review();
        reviews[0].refusals_after_successor[0].operation = "<script>op</script>".to_owned();
        let lease = "demo/\u{1b}[2J<script>&";
        let svg = timeline(lease, &reviews);
        assert_well_formed(&svg);
        assert!(!svg.contains("<script"), "{svg}");
        assert!(!svg.contains('\u{1b}') && !svg.contains('\u{ffff}') && !svg.contains('\u{202e}'));
        assert!(svg.contains("pgfence history: demo/\\u{1b}[2J&lt;script&gt;&amp;</title>"));
        // The holder's label: cut to its first characters, escaped; the lane's tooltip has it whole, and the
        // application name.
        assert!(
            svg.contains(">evil\\u{1b}]0;pwned\\u{7}&lt;…(+27 chars)</text>"),
            "{svg}"
        );
        assert!(svg.contains(
            "<title>epoch 2: holder evil\\u{1b}]0;pwned\\u{7}&lt;script&gt;alert(1)&lt;/script&gt;\\u{202e}\
             &amp;\\u{ffff}, application_name \\u{1b}[2J\\u{1b}[31m&lt;/text&gt;&lt;script&gt;x()\
             &lt;/script&gt;\\u{d}</title>"
        ), "{svg}");
        assert!(svg.contains("&lt;script&gt;op&lt;/script&gt;"));
    }

    #[test]
    fn an_empty_review_is_a_well_formed_picture() {
        let svg = timeline("demo/none", &[]);
        assert_well_formed(&svg);
        assert!(svg.contains(">no tenures</text>"));
    }
}
