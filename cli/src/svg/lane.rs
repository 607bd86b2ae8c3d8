//! One lane of the timeline picture: a tenure's bar by the database, the holder's belief below it, the
//! successor's acquisition, refused writes, the last accepted write, the overlap window and the verdict.

use std::fmt::Write as _;

use pgfence::history::{Overlap, TenureReview};

use super::{bar, line, mark_resolution, text, Placement, Scale, LABEL_CHARS, LANE, RIGHT, WIDTH};
use crate::table;

pub(super) fn lane(svg: &mut String, scale: &Scale, top: f64, review: &TenureReview) {
    let t = &review.tenure;
    let database_y = top + 10.0;
    let belief_y = top + 32.0;
    let _ = writeln!(
        svg,
        r#"<g class="tenure" data-epoch="{}"><title>epoch {}: holder {}, application_name {}</title>"#,
        t.epoch,
        t.epoch,
        text(&t.holder, table::VALUE_CHARS),
        t.server
            .application_name
            .as_deref()
            .map_or_else(|| "-".to_owned(), |name| text(name, table::VALUE_CHARS))
    );

    // The overlap window first, under everything else: from the successor's acquisition to the latest
    // moment the review places the belief, a refusal or an accepted write.
    if let Some(next) = &review.successor {
        let class = match review.overlap {
            Overlap::Certain { .. } => Some("overlap-certain"),
            Overlap::Possible => Some("overlap-possible"),
            _ => None,
        };
        if let Some(class) = class {
            let until = review
                .believed_until_db
                .map(|end| end.latest)
                .into_iter()
                .chain(
                    review
                        .refusals_after_successor
                        .iter()
                        .map(|r| r.last_rejected_at),
                )
                .chain(review.accepted_after_successor)
                .max()
                .unwrap_or(next.acquired_at);
            bar(
                svg,
                class,
                scale.x(next.acquired_at),
                scale.x(until),
                top + 2.0,
                LANE - 4.0,
            );
        }
    }

    let _ = writeln!(
        svg,
        r#"<text x="12" y="{:.1}">epoch {}</text>"#,
        top + 22.0,
        t.epoch
    );
    let _ = writeln!(
        svg,
        r#"<text class="note" x="12" y="{:.1}">{}</text>"#,
        top + 38.0,
        text(&t.holder, LABEL_CHARS)
    );

    // The tenure by the database; a current one runs to the right edge.
    let database_end = t.ended_at.map_or(scale.end_x(), |at| scale.x(at));
    bar(
        svg,
        "database",
        scale.x(t.acquired_at),
        database_end,
        database_y,
        16.0,
    );

    belief(svg, scale, belief_y, review);

    if let Some(next) = &review.successor {
        let x = scale.x(next.acquired_at);
        line(svg, "successor", (x, top + 2.0), (x, top + LANE - 2.0));
        let _ = writeln!(
            svg,
            r#"<text class="small" x="{:.1}" y="{:.1}">epoch {} acquired</text>"#,
            x + 3.0,
            top + 8.0,
            next.epoch
        );
    }

    for r in &review.refusals_after_successor {
        let last = scale.x(r.last_rejected_at);
        let _ = writeln!(
            svg,
            r#"<g><title>refused {} × {} {} (first {}, last {})</title>"#,
            r.count,
            text(&r.reason, 64),
            text(&r.operation, 64),
            table::time(Some(r.rejected_at)),
            table::time(Some(r.last_rejected_at))
        );
        if r.rejected_at != r.last_rejected_at {
            let first = scale.x(r.rejected_at);
            line(
                svg,
                "refusal-first",
                (first, top + 8.0),
                (first, top + LANE - 8.0),
            );
        }
        line(svg, "refusal", (last, top + 4.0), (last, top + LANE - 4.0));
        svg.push_str("</g>\n");
    }

    last_write(svg, scale, database_y + 8.0, review);

    if let Some(at) = review.accepted_after_successor {
        let x = scale.x(at);
        let _ = writeln!(
            svg,
            r#"<circle class="broken" cx="{x:.1}" cy="{:.1}" r="8"><title>FENCE BROKEN: write accepted at {}</title></circle>"#,
            database_y + 8.0,
            table::time(Some(at))
        );
    }

    let (class, verdict) = verdict(review);
    let _ = writeln!(
        svg,
        r#"<text class="{class}" x="{:.1}" y="{:.1}">{verdict}</text>"#,
        WIDTH - RIGHT + 10.0,
        top + 22.0
    );
    if review.accepted_after_successor.is_some() {
        let _ = writeln!(
            svg,
            r#"<text class="verdict-broken" x="{:.1}" y="{:.1}">FENCE BROKEN</text>"#,
            WIDTH - RIGHT + 10.0,
            top + 38.0
        );
    }
    svg.push_str("</g>\n");
}

/// The belief's bar: hatched over every placement, solid where all placements agree; without an end report
/// a dashed line to the right edge.
fn belief(svg: &mut String, scale: &Scale, y: f64, review: &TenureReview) {
    let placement = Placement::of(review);
    let belief = &review.tenure.belief;
    // Below the bar, clear of the dashed line.
    let note = |svg: &mut String, x: f64, what: &str| {
        let _ = writeln!(
            svg,
            r#"<text class="small" x="{:.1}" y="{:.1}">{what}</text>"#,
            x + 4.0,
            y + 18.0
        );
    };
    match (placement.start, placement.end) {
        (Some((earliest_start, latest_start)), Some((earliest_end, latest_end))) => {
            let earliest_end = earliest_end.unwrap_or(latest_end);
            bar(
                svg,
                "belief-uncertain",
                scale.x(earliest_start),
                scale.x(latest_end),
                y,
                8.0,
            );
            if latest_start < earliest_end {
                bar(
                    svg,
                    "belief",
                    scale.x(latest_start),
                    scale.x(earliest_end),
                    y,
                    8.0,
                );
            }
        }
        (Some((earliest_start, latest_start)), None) => {
            bar(
                svg,
                "belief-uncertain",
                scale.x(earliest_start),
                scale.x(latest_start),
                y,
                8.0,
            );
            let x = scale.x(latest_start);
            line(svg, "belief-open", (x, y + 4.0), (scale.end_x(), y + 4.0));
            note(svg, x, "unknown end (no report)");
        }
        // No start report: the belief began after the acquisition and ended by the latest placement.
        (None, Some((_, latest_end))) => bar(
            svg,
            "belief-uncertain",
            scale.x(review.tenure.acquired_at),
            scale.x(latest_end),
            y,
            8.0,
        ),
        (None, None) => {
            let x = scale.x(review.tenure.acquired_at);
            if belief.from.is_none() && belief.until.is_none() {
                note(svg, x, "no belief reports");
            } else {
                note(svg, x, "belief not placed (no clock bounds)");
            }
        }
    }
}

/// The last accepted write: a dot, exact for a task event; a write mark's dot has a whisker to one second
/// later, where the last guarded write can have been.
fn last_write(svg: &mut String, scale: &Scale, y: f64, review: &TenureReview) {
    let t = &review.tenure;
    let Some(at) = t.last_write_at else {
        return;
    };
    let from_mark = match (t.last_event_at, t.last_mark_at) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(event), Some(mark)) => mark > event,
    };
    let x = scale.x(at);
    if from_mark {
        line(
            svg,
            "write-mark",
            (x, y),
            (scale.x(at + mark_resolution()), y),
        );
    }
    let _ = writeln!(
        svg,
        r#"<circle class="write" cx="{x:.1}" cy="{y:.1}" r="4"><title>last accepted write {} ({})</title></circle>"#,
        table::time(Some(at)),
        if from_mark {
            "write mark: at most 1 s early"
        } else {
            "task event: exact"
        }
    );
}

/// The lane's verdict: its CSS class and its words.
fn verdict(review: &TenureReview) -> (&'static str, &'static str) {
    match (&review.successor, &review.overlap) {
        (None, _) if review.tenure.ended_at.is_none() => ("verdict-none", "current"),
        (None, _) => ("verdict-none", "no successor"),
        (Some(_), Overlap::Certain { .. }) => ("verdict-certain", "CERTAIN overlap"),
        (Some(_), Overlap::Possible) => ("verdict-possible", "POSSIBLE overlap"),
        (Some(_), Overlap::Unknown) => ("verdict-unknown", "unknown (no end report)"),
        (Some(_), Overlap::None) => ("verdict-none", "no overlap"),
        _ => ("verdict-unknown", "see --json"),
    }
}
