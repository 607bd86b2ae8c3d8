//! What the model checks in every reachable state (`always`), and what it must be able to reach
//! (`sometimes`: proof that the interesting interleavings are explored at all).

use stateright::{Model, Property};

use crate::protocol::{Commit, ControlOp, Protocol, Stage, State};

pub const EPOCHS_INCREASE: &str =
    "epochs strictly increase per lease (every acquisition ever committed, lost ones included)";
pub const ONE_HOLDER_PER_EPOCH: &str = "at most one holder per epoch";
pub const FENCING: &str =
    "no write of epoch e commits after its tenure ended or an acquisition of a larger epoch committed (commit order)";
pub const FAILOVER_FENCE: &str = "no tenure granted before a promotion writes after it";
pub const REFUSALS_AUDITED: &str =
    "every refused write is audited, typed exactly (superseded only below the current epoch; no honest fence refused as forged)";
pub const ACKED_WRITES_SURVIVE: &str = "an acknowledged write is lost only by a promotion";
pub const BELIEF: &str =
    "a holder believes it leads only while the database could not grant a successor";
pub const TAKEOVER_BOUNDED: &str =
    "a takeover waits for the guard lock at most the grace, whatever writes arrive meanwhile";
pub const TAKEOVER_COMPLETES: &str =
    "a takeover never fails (PF003), of a live tenure or not, whatever writes arrive meanwhile";
pub const WRITES_HELD_OFF: &str =
    "no write whose intent probe comes while a takeover is under way (queued, timed out, ending holders, queued again) passes its check";
pub const LOCK_QUEUE: &str = "the guard lock queue is fair and loses no wakeup";

pub const S_TERMINATED: &str =
    "example: a takeover terminates a guarded transaction after the grace";
pub const S_REFUSED_AFTER_WAIT: &str =
    "example: a write superseded while it waited for the guard lock is refused and audited";
pub const S_FAILOVER_REFUSED: &str =
    "example: a tenure of an earlier timeline is refused ('failover')";
pub const S_ACKED_LOST: &str =
    "example: an acknowledged write is lost by an asynchronous promotion (by design)";
pub const S_REACQUIRED: &str =
    "example: a holder acquires again (its earlier tenure fenced by the new epoch), e.g. after a lost reply";
pub const S_WRITE_AFTER_TAKEOVER: &str = "example: the successor writes after a takeover";

pub fn all() -> Vec<Property<Protocol>> {
    vec![
        Property::always(EPOCHS_INCREASE, |_: &Protocol, s: &State| {
            let epochs: Vec<_> = acquisitions(s).map(|(_, e)| e).collect();
            epochs.windows(2).all(|w| w[0] < w[1])
        }),
        Property::always(ONE_HOLDER_PER_EPOCH, |m: &Protocol, s: &State| {
            let acq: Vec<_> = acquisitions(s).collect();
            let distinct_in_hist = acq
                .iter()
                .enumerate()
                .all(|(i, a)| acq[..i].iter().all(|b| b.1 != a.1));
            let known: Vec<_> = s.holders[..m.cfg.holders as usize]
                .iter()
                .filter_map(|h| h.tenure)
                .collect();
            let distinct_known = known
                .iter()
                .enumerate()
                .all(|(i, a)| known[..i].iter().all(|b| b.epoch != a.epoch));
            distinct_in_hist && distinct_known
        }),
        Property::always(FENCING, |_: &Protocol, s: &State| {
            s.hist.iter().enumerate().all(|(j, w)| match w.commit {
                Commit::Write { epoch, .. } => s.hist[..j].iter().all(|e| match e.commit {
                    Commit::Acquire { epoch: later, .. } => later <= epoch,
                    Commit::Release { epoch: ended, .. }
                    | Commit::ForceRelease { epoch: ended, .. } => ended != epoch,
                    _ => true,
                }),
                _ => true,
            })
        }),
        Property::always(FAILOVER_FENCE, |_: &Protocol, s: &State| {
            s.hist.iter().all(|e| match e.commit {
                Commit::Write {
                    tenure_timeline,
                    timeline,
                    ..
                } => tenure_timeline == timeline,
                _ => true,
            })
        }),
        Property::always(REFUSALS_AUDITED, |_: &Protocol, s: &State| {
            s.inexact_refusal.is_none()
        }),
        Property::always(ACKED_WRITES_SURVIVE, |_: &Protocol, s: &State| {
            s.hist
                .iter()
                .all(|e| !(e.acked && e.lost) || s.timeline > 1)
        }),
        Property::always(BELIEF, |m: &Protocol, s: &State| {
            let row = s.row();
            (0..m.cfg.holders).all(|p| {
                if !s.believes(p) {
                    return true;
                }
                let t = s.holders[p as usize].tenure.expect("believes a tenure");
                // Ended by design without the holder's knowledge: a promotion (every earlier tenure is refused
                // 'failover') or the operator's force_release.
                let overridden = t.timeline < s.timeline
                    || s.hist.iter().any(|e| {
                        !e.lost && matches!(e.commit, Commit::ForceRelease { epoch, .. } if epoch == t.epoch)
                    });
                overridden || (row.secret == Some(t.secret) && row.held && row.expires > s.clock)
            })
        }),
        Property::always(TAKEOVER_BOUNDED, |m: &Protocol, s: &State| {
            s.holders.iter().all(|h| match h.control {
                ControlOp::Call {
                    stage:
                        Stage::GuardWait { started, .. }
                        | Stage::GuardTimedOut { started, .. }
                        | Stage::GuardTerminated { started, .. },
                    ..
                } => s.clock <= started + m.takeover_bound(),
                _ => true,
            })
        }),
        Property::always(TAKEOVER_COMPLETES, |_: &Protocol, s: &State| {
            !s.expired_takeover_failed && !s.live_takeover_failed
        }),
        Property::always(WRITES_HELD_OFF, |_: &Protocol, s: &State| !s.let_in),
        Property::always(LOCK_QUEUE, |_: &Protocol, s: &State| {
            let q = &s.guard.queue;
            q.iter().enumerate().all(|(i, &(c, m))| {
                s.guard.granted.iter().any(|&(g, gm)| {
                    g != c
                        && (gm == crate::protocol::Mode::Exclusive
                            || m == crate::protocol::Mode::Exclusive)
                }) || q[..i].iter().any(|&(_, am)| {
                    am == crate::protocol::Mode::Exclusive || m == crate::protocol::Mode::Exclusive
                })
            })
        }),
        Property::sometimes(S_TERMINATED, |_: &Protocol, s: &State| s.terminated_writes),
        Property::sometimes(S_REFUSED_AFTER_WAIT, |_: &Protocol, s: &State| {
            s.superseded_after_lock
        }),
        Property::sometimes(S_FAILOVER_REFUSED, |_: &Protocol, s: &State| {
            s.failover_refused
        }),
        Property::sometimes(S_REACQUIRED, |m: &Protocol, s: &State| {
            (0..m.cfg.holders).any(|p| {
                s.hist
                    .iter()
                    .filter(|e| matches!(e.commit, Commit::Acquire { holder, .. } if holder == p))
                    .count()
                    >= 2
            })
        }),
        Property::sometimes(S_ACKED_LOST, |_: &Protocol, s: &State| {
            s.hist.iter().any(|e| e.acked && e.lost)
        }),
        Property::sometimes(S_WRITE_AFTER_TAKEOVER, |_: &Protocol, s: &State| {
            let mut seen_acq = 0;
            s.hist.iter().any(|e| match e.commit {
                Commit::Acquire { .. } => {
                    seen_acq += 1;
                    false
                }
                Commit::Write { .. } => seen_acq >= 2 && !e.lost,
                _ => false,
            })
        }),
    ]
}

/// (index, epoch) of every acquisition ever committed, in commit order.
fn acquisitions(s: &State) -> impl Iterator<Item = (usize, crate::protocol::Epoch)> + '_ {
    s.hist
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e.commit {
            Commit::Acquire { epoch, .. } => Some((i, epoch)),
            _ => None,
        })
}

/// The `always` properties (what a weakened model must break at least one of).
pub fn safety_names(m: &Protocol) -> Vec<&'static str> {
    m.properties()
        .into_iter()
        .filter(|p| p.expectation == stateright::Expectation::Always)
        .map(|p| p.name)
        .collect()
}
