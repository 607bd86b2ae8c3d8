//! The properties of the stored-assignment model (`tests/model/assignment.rs`), each stated where it is
//! defined, and its counterexamples as readable traces.

use std::fmt::Write as _;

use stateright::{Expectation, Model, Path, Property};

use crate::assignment::{Action, Assignment, Phase, Pid, Proc, Rebalance, State, Writer};

/// No write of epoch e of a name commits after the acquisition of a larger epoch of it committed: two tenures
/// may both be believed for a while, but never both able to commit a write out of epoch order.
pub const FENCING: &str =
    "no write of epoch e commits after the acquisition of a larger epoch of its name committed";
/// An owner acquires only a free lease (released, or expired by the database clock): it never takes one from
/// another member's live tenure.
pub const NO_FORCED_TAKEOVER: &str =
    "no acquisition takes a lease from another member's live tenure (the owner waits for it to be free)";
/// At most one running member's callback leads a name at a time.
pub const ONE_CALLBACK: &str = "at most one running member's callback leads each name at a time";
/// The stored assignment never names a member that was gone (not live: expired or left) when it was stored.
pub const ASSIGNED_LIVE: &str =
    "the stored assignment never names a member that was gone when it was stored";
/// Every member the stored assignment names is counted by it, so that its expiry makes a rebalance due (an
/// owner that is not counted would keep its names through its expiry, led by nobody).
pub const OWNERS_COUNTED: &str =
    "every member the stored assignment names is counted by it (its expiry makes a rebalance due)";
/// A member whose view is unknown — its membership lost and its names not read since it joined again — never
/// hands over a name it holds: after an outage it would hand it to nobody.
pub const NO_HANDOVER_ON_UNKNOWN: &str =
    "a member never hands over (drains) a name while its view is unknown (no handover to nobody after an outage)";
/// Let t₀ be the clock at the last change of the membership (a row's liveness or counting, a process paused,
/// resumed, lost or joined). If some member is live and every live member runs and is joined, then in every
/// state with clock > t₀ + bound each name's stored owner is a live member that leads it: the group converges
/// within the bound, and — checked in every later state too — nothing moves after.
pub const CONVERGES: &str =
    "under stable membership every name is led by its stored owner within the bound, and nothing moves after";

pub const S_HANDOVER: &str =
    "example: a graceful handover (a release, then the new owner acquires)";
pub const S_STALE_REFUSED: &str = "example: a store from an older generation is refused (stale)";
pub const S_GONE_REFUSED: &str =
    "example: a store naming a member that is gone is refused (member_gone)";
pub const S_BACK_REFUSED: &str =
    "example: a store leaving out a counted member that joined again is refused (member_back)";
pub const S_RECOVERED: &str =
    "example: a member whose notification was lost learns the generation from its heartbeat";
pub const S_KEPT: &str =
    "example: a member that lost its membership while leading joins again and keeps leading (no new tenure)";
pub const S_INFLIGHT_REFUSED: &str =
    "example: the old holder's write is refused after the new owner's acquisition";

pub fn properties() -> Vec<Property<Assignment>> {
    vec![
        Property::always(FENCING, |_: &Assignment, s: &State| !s.late_write),
        Property::always(NO_FORCED_TAKEOVER, |_: &Assignment, s: &State| !s.forced),
        Property::always(ONE_CALLBACK, |m: &Assignment, s: &State| {
            (0..m.cfg.names as usize).all(|n| {
                s.members
                    .iter()
                    .filter(|x| x.up && matches!(x.phases[n], Phase::Leading(_)))
                    .count()
                    <= 1
            })
        }),
        Property::always(ASSIGNED_LIVE, |_: &Assignment, s: &State| !s.assigned_gone),
        Property::always(OWNERS_COUNTED, |_: &Assignment, s: &State| {
            s.group
                .owners
                .iter()
                .flatten()
                .all(|&p| s.rows[p as usize].counted)
        }),
        Property::always(NO_HANDOVER_ON_UNKNOWN, |_: &Assignment, s: &State| {
            !s.unknown_handover
        }),
        Property::always(CONVERGES, |m: &Assignment, s: &State| {
            let cfg = &m.cfg;
            let live: Vec<Pid> = (0..cfg.members).filter(|&p| s.live(cfg, p)).collect();
            let applies = s.clock > s.stable_since + cfg.bound
                && !live.is_empty()
                && live.iter().all(|&p| {
                    let x = &s.members[p as usize];
                    x.up && x.proc == Proc::Joined
                });
            !applies
                || (0..cfg.names).all(|n| {
                    s.group.owners[n as usize].is_some_and(|p| s.live(cfg, p) && s.leads(p, n))
                })
        }),
        Property::sometimes(S_HANDOVER, |_: &Assignment, s: &State| s.graceful),
        Property::sometimes(S_STALE_REFUSED, |_: &Assignment, s: &State| s.stale_refused),
        Property::sometimes(S_GONE_REFUSED, |_: &Assignment, s: &State| s.gone_refused),
        Property::sometimes(S_BACK_REFUSED, |_: &Assignment, s: &State| s.back_refused),
        Property::sometimes(S_RECOVERED, |_: &Assignment, s: &State| s.recovered),
        Property::sometimes(S_KEPT, |_: &Assignment, s: &State| s.kept_through_rejoin),
        Property::sometimes(S_INFLIGHT_REFUSED, |_: &Assignment, s: &State| {
            s.inflight_refused
        }),
    ]
}

/// The always properties (what a weakened model must break at least one of).
pub fn safety_names(m: &Assignment) -> Vec<&'static str> {
    m.properties()
        .into_iter()
        .filter(|p| p.expectation == Expectation::Always)
        .map(|p| p.name)
        .collect()
}

fn name(p: Pid) -> char {
    (b'A' + p) as char
}

/// An action as a trace line.
pub fn describe(action: &Action) -> String {
    match *action {
        Action::Tick => {
            "clock +1: running members heartbeat (settle; learn the generation) and renew".into()
        }
        Action::Join(p) => format!(
            "{}: join_group (not settled; view unknown until read)",
            name(p)
        ),
        Action::Read(p) => format!("{}: assigned_names (reads its own names)", name(p)),
        Action::Claim(p) => format!(
            "{}: claim_rebalance; reads the counted members and the stored assignment; computes",
            name(p)
        ),
        Action::Store(p) => format!(
            "{}: assign_group (claim, generation CAS, live owners); 'assigned <gen>' told",
            name(p)
        ),
        Action::StoreUnnoticed(p) => format!("{}: assign_group; its notifications LOST", name(p)),
        Action::StoreLost(p) => format!(
            "{}: assign_group sent, its reply LOST (the statement runs later)",
            name(p)
        ),
        Action::InflightRun => "the server runs the store whose reply was lost".into(),
        Action::Leave(p) => format!("{}: leave_group (shutdown: drains what it leads)", name(p)),
        Action::Pause(p) => format!("{}: PAUSES (crash, freeze, outage)", name(p)),
        Action::Resume(p) => format!("{}: resumes (checks its local deadlines)", name(p)),
        Action::Drain(p, n) => format!("{}: L{n} not its own in its view: DRAINS", name(p)),
        Action::ReleaseCall(p, n) => format!("{}: pgfence.release of L{n}", name(p)),
        Action::AcquireCall(p, n) => {
            format!("{}: L{n} assigned to it and free: pgfence.acquire", name(p))
        }
        Action::TakeoverCommit(n) => format!("L{n}: guard lock EXCLUSIVE granted: COMMIT"),
        Action::WriteSend(p, n) => format!(
            "{}: sends a guarded write of L{n} (last epoch told)",
            name(p)
        ),
        Action::WriteCheck(p) => format!("{}: _guard checks its write", name(p)),
        Action::WriteCommit(p) => format!("{}: guarded write COMMIT", name(p)),
    }
}

/// A path as (state, the action taken from it).
pub type Steps = Vec<(State, Option<Action>)>;

/// The steps of `path` up to the first state that breaks the property `name`.
pub fn until_broken(model: &Assignment, path: &Path<State, Action>, name: &str) -> Steps {
    let mut steps = path.clone().into_vec();
    let property = model.properties().into_iter().find(|p| p.name == name);
    if let Some(p) = property.filter(|p| p.expectation == Expectation::Always) {
        if let Some(i) = steps.iter().position(|(s, _)| !(p.condition)(model, s)) {
            steps.truncate(i + 1);
            steps[i].1 = None;
        }
    }
    steps
}

/// The trace of `steps`: numbered actions, each followed by what it left.
pub fn render(model: &Assignment, steps: &Steps) -> String {
    let mut out = String::new();
    for (i, (state, action)) in steps.iter().enumerate() {
        if i == 0 {
            let _ = writeln!(out, "   0. start: {}", summary(model, state));
        }
        if let Some(a) = action {
            let _ = writeln!(out, "  {:>2}. {}", i + 1, describe(a));
            if let Some((next, _)) = steps.get(i + 1) {
                let _ = writeln!(out, "      -> {}", summary(model, next));
            }
        }
    }
    out
}

fn summary(model: &Assignment, s: &State) -> String {
    let cfg = &model.cfg;
    let g = &s.group;
    let owners: Vec<String> = g
        .owners
        .iter()
        .map(|o| o.map_or('-', name).to_string())
        .collect();
    let mut out = format!(
        "clock {} | gen {} owners [{}] version {}/{}{}{}",
        s.clock,
        g.generation,
        owners.join(" "),
        g.assigned_version,
        g.version,
        if s.due(cfg) { " DUE" } else { "" },
        g.claim
            .map(|(p, until)| format!(" claim {} until {until}", name(p)))
            .unwrap_or_default(),
    );
    for (n, l) in s.leases.iter().enumerate() {
        let _ = write!(
            out,
            " | L{n}: epoch {} {} {} until {}",
            l.epoch,
            if l.held { "held by" } else { "released by" },
            name(l.holder),
            l.expires
        );
    }
    if let Some(call) = &s.inflight {
        let _ = write!(
            out,
            " | in flight: store by {} from gen {}",
            name(call.by),
            call.gen
        );
    }
    for p in 0..cfg.members {
        let m = &s.members[p as usize];
        if m.proc == Proc::NotStarted {
            continue;
        }
        let r = &s.rows[p as usize];
        let _ = write!(
            out,
            " | {}: {:?}{}{}{}{} view {} {:?}{}{}",
            name(p),
            m.proc,
            if s.live(cfg, p) { " live" } else { " expired" },
            if r.settled { " settled" } else { "" },
            if r.counted { " counted" } else { "" },
            if m.up { "" } else { " PAUSED" },
            m.view
                .map(|(g, mask)| format!("gen {g} mask {mask:b}"))
                .unwrap_or_else(|| "UNKNOWN".into()),
            m.phases,
            match &m.rebalance {
                Rebalance::Idle => String::new(),
                r => format!(" {r:?}"),
            },
            match m.writer {
                Writer::Idle => String::new(),
                w => format!(" write {w:?}"),
            }
        );
    }
    out
}
