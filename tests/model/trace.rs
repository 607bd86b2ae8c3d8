//! Counterexamples as readable traces: one line per action (who, SQL function, lock), then what it left.

use std::fmt::Write as _;

use stateright::Path;

use crate::protocol::{Action, ControlOp, Protocol, State, WriteOp};

/// The trace of `path`: numbered actions, each followed by the clock, timeline, lease row, guard lock and the
/// commit it added, if any.
pub fn render(model: &Protocol, path: &Path<State, Action>) -> String {
    let steps = path.clone().into_vec();
    let mut out = String::new();
    let mut prev: Option<&State> = None;
    for (i, (state, action)) in steps.iter().enumerate() {
        if let Some(before) = prev {
            let _ = writeln!(out, "      {}", summary(model, before, state));
        } else {
            let slow: Vec<String> = state
                .holders
                .iter()
                .enumerate()
                .filter(|(_, h)| h.slow)
                .map(|(p, _)| name(model, p as u8))
                .collect();
            let _ = writeln!(
                out,
                "   0. start: clock 0, timeline 1; holders' clocks slow by {} tick(s): {}",
                model.cfg.drift,
                if slow.is_empty() {
                    "none".to_string()
                } else {
                    slow.join(", ")
                }
            );
        }
        if let Some(a) = action {
            let _ = writeln!(out, "  {:>2}. {}", i + 1, model.describe(a));
        }
        prev = Some(state);
    }
    out
}

fn name(model: &Protocol, p: u8) -> String {
    if p == model.cfg.holders {
        "operator".into()
    } else {
        ((b'A' + p) as char).to_string()
    }
}

fn summary(model: &Protocol, before: &State, s: &State) -> String {
    let row = s.row();
    let mut out = format!("-> clock {} tl {} | row: ", s.clock, s.timeline);
    if row.secret.is_none() {
        out.push_str("none");
    } else {
        let _ = write!(
            out,
            "epoch {} {} by {} until {} (tl {})",
            row.epoch,
            if row.held { "held" } else { "released" },
            row.holder.map(|p| name(model, p)).unwrap_or_default(),
            row.expires,
            row.timeline
        );
    }
    let locks: Vec<String> = s
        .guard
        .granted
        .iter()
        .map(|(c, m)| format!("{c:?}:{m:?}"))
        .chain(
            s.guard
                .queue
                .iter()
                .map(|(c, m)| format!("{c:?}:{m:?}(queued)")),
        )
        .collect();
    if !locks.is_empty() {
        let _ = write!(out, " | guard lock: {}", locks.join(" "));
    }
    if s.hist.len() > before.hist.len() {
        let _ = write!(out, " | COMMIT {:?}", s.hist[s.hist.len() - 1].commit);
    }
    let lost =
        s.hist.iter().filter(|e| e.lost).count() - before.hist.iter().filter(|e| e.lost).count();
    if lost > 0 {
        let _ = write!(out, " | {lost} commit(s) LOST");
    }
    for (p, (h, hb)) in s.holders.iter().zip(&before.holders).enumerate() {
        if h.tenure != hb.tenure || h.trust_until != hb.trust_until || h.ended != hb.ended {
            if let Some(t) = h.tenure {
                let _ = write!(
                    out,
                    " | {} knows epoch {}{} (trusts until {})",
                    name(model, p as u8),
                    t.epoch,
                    if h.ended { ", ended" } else { "" },
                    h.trust_until
                );
            }
        }
        if let (ControlOp::Reply { reply, .. }, false) = (h.control, h.control == hb.control) {
            let _ = write!(out, " | {} reply {:?}", name(model, p as u8), reply);
        }
        if let (WriteOp::Reply(r), false) = (h.writer, h.writer == hb.writer) {
            let _ = write!(out, " | {} write reply {:?}", name(model, p as u8), r);
        }
    }
    for p in 0..s.holders.len() {
        if s.believes(p as u8) {
            let _ = write!(out, " | {} believes", name(model, p as u8));
        }
    }
    out
}
