//! The cooperative balanced handover of the leadership runtime, as a state machine: a group of members that
//! heartbeat membership rows (a ttl on the database clock), one lease L whose desired owner every member computes
//! from the live member set, the holder that drains and releases when it is no longer the desired owner, the
//! desired owner that acquires only a free lease, pauses and crashes, and guarded writes in flight.
//!
//! The lease protocol under it is abstracted to what `tests/model/protocol.rs` checks in detail: an acquisition
//! or a release (a takeover) takes the lease row lock and the intent lock, then waits for the writes past their
//! check (holding the guard lock SHARED) at most the takeover grace and ends them; no write passes its check while
//! a takeover is under way ("writes held off", "takeover bounded", "takeover completes" there). Here a write's check
//! (`_guard`'s probe, shared lock and fresh read) is one step, its COMMIT another.
//!
//! Time: the database clock is a counter moved by `Tick`. At every tick each running member heartbeats its
//! membership row and renews the lease it holds (one statement in the runtime; on time: a late heartbeat or
//! renewal is a pause). A running member's runtime reacts within the tick: the clock does not move while a running
//! member has a due step (start a drain, release after the drain grace, acquire a free lease it is the desired
//! owner of) or while a takeover's database step is due (commit once granted, end the writes after the grace).
//! Any member may instead pause at any instant (a crash, a freeze, a long GC): it then takes no step at all until
//! it resumes, if ever, while the database goes on (its calls under way complete, its rows expire).

use std::fmt::Write as _;

use stateright::{Model, Path, Property};

/// Database clock ticks.
pub type Tick = u8;
/// A lease epoch.
pub type Epoch = u8;
/// A member (its id orders the preference: the smallest live id is the desired owner).
pub type Pid = u8;

/// A deliberate weakening of the handover: the model must find a counterexample for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Weakening {
    /// The successor does not wait for the lease to be free: once it is the settled desired owner it takes the
    /// lease at once, while the old holder still holds it, and without the guard lock's wait for writes past
    /// their check.
    AcquireWhileHeld,
    /// The release does not take the guard lock EXCLUSIVE: it commits at once, whatever writes are past their
    /// check.
    ReleaseWithoutGuard,
    /// No hysteresis: a member acquires as soon as it is the desired owner, before it is settled, and a holder
    /// drains for a desired owner that is not settled.
    AcquireUnsettled,
    /// The assignment depends on something that changes at every heartbeat (the desired owner is the live
    /// member at index `clock mod n`, as a hash over the rows' heartbeat times would be), not on the set alone.
    AssignmentFlips,
    /// The successor acquires only a released lease (it waits for the release's NOTIFY) and never one that
    /// expired: a holder that stops leaves L without a leader.
    AcquireOnlyReleased,
}

/// The bounds of one exploration, and the weakenings applied.
#[derive(Clone, Debug)]
pub struct Config {
    /// Members 0..members; the last one holds L (epoch 1) at the start, the others have not joined yet.
    pub members: u8,
    /// Membership row ttl, in ticks (a row is live while clock < last heartbeat + member_ttl).
    pub member_ttl: Tick,
    /// Lease ttl, in ticks.
    pub ttl: Tick,
    /// The holder's safety margin: it trusts its tenure until (last renewal + ttl − margin).
    pub margin: Tick,
    /// The drain grace: a draining holder's cancelled callback gets this long before the release.
    pub drain_grace: Tick,
    /// `instance.takeover_grace_ms`: a release or acquisition waits this long for writes past their check.
    pub takeover_grace: Tick,
    /// Per member: guarded writes (the initial holder's budget; the others get `joiner_writes`).
    pub holder_writes: u8,
    pub joiner_writes: u8,
    /// Per member: pauses (each may be followed by a resume, or not: a crash).
    pub pauses: u8,
    /// The database clock stops here (bounds the exploration).
    pub max_clock: Tick,
    pub weakenings: Vec<Weakening>,
}

impl Config {
    /// Two members: B holds L, A (the preferred one) joins at any time; each may pause or crash once at any
    /// instant and resume (or not); one guarded write each; clock 0..=8.
    pub fn two() -> Config {
        Config {
            members: 2,
            member_ttl: 2,
            ttl: 2,
            margin: 1,
            drain_grace: 1,
            takeover_grace: 1,
            holder_writes: 1,
            joiner_writes: 1,
            pauses: 1,
            max_clock: 8,
            weakenings: Vec::new(),
        }
    }

    /// Three members: C holds L, A and B join in any order and at any time (a handover C → B → A, or C → A);
    /// any one member may pause or crash (one pause in all); one guarded write each; clock 0..=6.
    pub fn three() -> Config {
        Config {
            members: 3,
            max_clock: 6,
            ..Config::two()
        }
    }

    /// `two` with a second write of the old holder (one in flight during the drain, one after it resumes) and
    /// clock 0..=9 (about 45 s: not in every run).
    pub fn two_large() -> Config {
        Config {
            holder_writes: 2,
            max_clock: 9,
            ..Config::two()
        }
    }

    /// `three` with a second write of the first holder and clock 0..=7 (about 25 s: not in every run).
    pub fn three_large() -> Config {
        Config {
            holder_writes: 2,
            max_clock: 7,
            ..Config::three()
        }
    }

    pub fn with(mut self, weakenings: &[Weakening]) -> Config {
        self.weakenings = weakenings.to_vec();
        self
    }

    fn weak(&self, w: Weakening) -> bool {
        self.weakenings.contains(&w)
    }

    /// The convergence bound: once membership is stable and the desired owner is running and settled, it leads
    /// L before the clock passes (the last change + this). A running holder drains for the drain grace; a holder
    /// that stopped let its lease expire by the time its membership row expired, or at most `ttl − member_ttl`
    /// later (one statement heartbeats and renews, so both count from the same instant) — and the row's expiry
    /// is itself a change; then the release or the acquisition waits the takeover grace at most for writes past
    /// their check.
    pub fn convergence_bound(&self) -> Tick {
        self.drain_grace
            .max(self.ttl.saturating_sub(self.member_ttl))
            + self.takeover_grace
    }
}

/// The lease row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    pub epoch: Epoch,
    pub holder: Pid,
    pub held: bool,
    pub expires: Tick,
}

/// One committed transaction; `hist` keeps them in commit order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Commit {
    Acquire { by: Pid, epoch: Epoch },
    Release { by: Pid, epoch: Epoch },
    Write { by: Pid, epoch: Epoch },
}

/// What the member's runtime does about L.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not holding: campaigns when it is the desired owner (and settled) and the lease is free.
    Follower,
    /// Its acquisition is under way (the takeover below).
    Acquiring,
    /// Holds `epoch`; its callback runs.
    Leading(Epoch),
    /// No longer the desired owner: its callback was cancelled at `since`; it releases after the drain grace.
    Draining { epoch: Epoch, since: Tick },
    /// It stopped trusting `epoch` at its local deadline (it resumed past it): the callback is cancelled and the
    /// dropped lease is released in the background, at once.
    Dropping(Epoch),
    /// Its release is under way (the takeover below).
    Releasing(Epoch),
}

/// A guarded write of a member (presenting the last epoch it was told).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Writer {
    Idle,
    /// Sent; its check (`_guard`) has not run yet, or waits for a takeover to end. `current`: the epoch it
    /// presents was the lease's current one, held, when it was sent.
    Checking {
        epoch: Epoch,
        current: bool,
    },
    /// Past its check, holding the guard lock SHARED; its COMMIT comes next.
    Passed(Epoch),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Member {
    /// It has joined the group (a membership row exists).
    pub joined: bool,
    /// Its process runs (not paused or crashed).
    pub up: bool,
    /// Its last heartbeat (database clock).
    pub heartbeat: Tick,
    /// It has heartbeaten since it (re)joined.
    pub settled: bool,
    pub phase: Phase,
    /// The last epoch an acquisition told it (its writer presents it, whatever the runtime believes).
    pub known: Option<Epoch>,
    /// Its local deadline for the tenure it holds (database-clock instant).
    pub trust_until: Tick,
    pub writer: Writer,
    pub writes: u8,
    pub pauses: u8,
}

/// An acquisition or a release holding the lease row lock and the intent lock, waiting for the guard lock
/// EXCLUSIVE (granted when no write is past its check).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Takeover {
    pub by: Pid,
    /// `None`: an acquisition; `Some(e)`: the release of epoch e.
    pub release: Option<Epoch>,
    pub since: Tick,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub clock: Tick,
    pub row: Row,
    pub takeover: Option<Takeover>,
    pub members: Vec<Member>,
    pub hist: Vec<Commit>,
    /// Ghost: the clock when the membership (each member's row live or not, settled or not, process running or
    /// not) last changed.
    pub stable_since: Tick,
    /// Ghost: an acquisition committed while the row named another member's live tenure.
    pub forced: bool,
    /// Ghost: a member acquired a lease another member had released (a graceful handover).
    pub graceful: bool,
    /// Ghost: a write sent while its epoch was current and held was refused 'superseded' after another member's
    /// acquisition.
    pub inflight_refused: bool,
    /// Ghost: a member acquired a lease whose holder had stopped mid-drain and let it expire.
    pub expired_mid_drain: bool,
    /// Ghost: a takeover ended writes past their check after the grace.
    pub terminated: bool,
    /// Ghost: a member that had paused and resumed wrote with its old epoch and was refused.
    pub resumed_refused: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The database clock moves; every running member heartbeats (settling if it joined since its last one)
    /// and renews the lease it holds (a refused renewal: the tenure is lost, the callback cancelled).
    Tick,
    /// A member starts: its first heartbeat inserts its row (it counts for the assignment at once).
    Join(Pid),
    /// A member stops (crash, freeze): no heartbeat, renewal or step of its own until it resumes.
    Pause(Pid),
    /// A paused member goes on: its local deadline is checked first (past it, the tenure is dropped and
    /// released in the background); a row that expired meanwhile is inserted again (a new join: not settled).
    Resume(Pid),
    /// The holder is no longer the desired owner, and the desired owner is settled: its callback is cancelled.
    Drain(Pid),
    /// After the drain grace (or at once for a tenure dropped at the local deadline): `pgfence.release` — row
    /// lock, the re-check (still its tenure, live or expired; else not held), intent lock, guard lock EXCLUSIVE
    /// (granted at once unless writes are past their check).
    ReleaseCall(Pid),
    /// The desired owner, settled, finds the lease free (released, expired by the database clock, or its own):
    /// `pgfence.acquire` — compare-and-set on the locked row, intent lock, guard lock EXCLUSIVE.
    AcquireCall(Pid),
    /// The takeover's guard lock was granted (no write past its check): UPDATE leases; COMMIT.
    TakeoverCommit,
    /// The takeover's wait ran out after the grace: `pg_terminate_backend` of the writes past their check, then
    /// the guard lock is granted: UPDATE leases; COMMIT.
    TakeoverEnds,
    /// A member's writer sends a guarded write presenting the last epoch it was told.
    WriteSend(Pid),
    /// `_guard` (database side): intent probe, guard lock SHARED and fresh read (waits while a takeover is under
    /// way): passes or is refused (and audited).
    WriteCheck(Pid),
    /// The guarded write's COMMIT (releases the shared guard lock).
    WriteCommit(Pid),
}

pub struct Handover {
    pub cfg: Config,
}

impl State {
    fn live(&self, cfg: &Config, p: Pid) -> bool {
        let m = &self.members[p as usize];
        m.joined && self.clock < m.heartbeat + cfg.member_ttl
    }

    /// What the membership looks like (the ghost `stable_since` follows its changes).
    fn membership(&self, cfg: &Config) -> Vec<(bool, bool, bool)> {
        (0..cfg.members)
            .map(|p| {
                let m = &self.members[p as usize];
                (self.live(cfg, p), m.settled, m.up)
            })
            .collect()
    }

    fn passed_writes(&self) -> bool {
        self.members
            .iter()
            .any(|m| matches!(m.writer, Writer::Passed(_)))
    }

    /// Free for `p` (the compare-and-set's condition): released, expired by the database clock, or its own.
    fn free_for(&self, p: Pid) -> bool {
        !self.row.held || self.row.expires <= self.clock || self.row.holder == p
    }

    /// `p` leads L: its callback runs with the tenure the row names, held and unexpired.
    pub fn leads(&self, p: Pid) -> bool {
        let r = &self.row;
        self.members[p as usize].phase == Phase::Leading(r.epoch)
            && r.holder == p
            && r.held
            && r.expires > self.clock
    }
}

impl Handover {
    /// The desired owner of L, computed by every member from the live rows: the smallest live id (weakened: the
    /// live member at index clock mod n, changing at every heartbeat).
    pub fn desired(&self, s: &State) -> Option<Pid> {
        let live: Vec<Pid> = (0..self.cfg.members)
            .filter(|&p| s.live(&self.cfg, p))
            .collect();
        if live.is_empty() {
            return None;
        }
        if self.cfg.weak(Weakening::AssignmentFlips) {
            Some(live[s.clock as usize % live.len()])
        } else {
            Some(live[0])
        }
    }

    fn settled_enough(&self, s: &State, p: Pid) -> bool {
        s.members[p as usize].settled || self.cfg.weak(Weakening::AcquireUnsettled)
    }

    fn can_drain(&self, s: &State, p: Pid) -> bool {
        let m = &s.members[p as usize];
        m.up && matches!(m.phase, Phase::Leading(_))
            && matches!(self.desired(s), Some(d) if d != p && self.settled_enough(s, d))
    }

    fn can_release(&self, s: &State, p: Pid) -> bool {
        let m = &s.members[p as usize];
        m.up && s.takeover.is_none()
            && match m.phase {
                Phase::Draining { since, .. } => s.clock >= since + self.cfg.drain_grace,
                Phase::Dropping(_) => true,
                _ => false,
            }
    }

    fn can_acquire(&self, s: &State, p: Pid) -> bool {
        let m = &s.members[p as usize];
        m.up && m.phase == Phase::Follower
            && s.takeover.is_none()
            && self.desired(s) == Some(p)
            && self.settled_enough(s, p)
            && if self.cfg.weak(Weakening::AcquireWhileHeld) {
                true
            } else if self.cfg.weak(Weakening::AcquireOnlyReleased) {
                !s.row.held || s.row.holder == p
            } else {
                s.free_for(p)
            }
    }

    fn takeover_due(&self, s: &State) -> bool {
        match s.takeover {
            None => false,
            Some(t) => !s.passed_writes() || s.clock >= t.since + self.cfg.takeover_grace,
        }
    }

    /// Whether a step is due before the clock may move.
    fn due(&self, s: &State) -> bool {
        self.takeover_due(s)
            || (0..self.cfg.members)
                .any(|p| self.can_drain(s, p) || self.can_release(s, p) || self.can_acquire(s, p))
    }

    /// The takeover commits (its guard lock granted): the acquisition issues epoch + 1, the release ends the
    /// tenure; the caller is answered at once (replies are not lost in this model).
    fn commit_takeover(&self, s: &mut State) {
        let t = s.takeover.take().expect("a takeover");
        match t.release {
            None => {
                let before = s.row;
                let epoch = before.epoch + 1;
                if before.held && before.expires > s.clock && before.holder != t.by {
                    s.forced = true;
                }
                if !before.held && before.holder != t.by {
                    s.graceful = true;
                }
                if before.held
                    && before.expires <= s.clock
                    && before.holder != t.by
                    && !s.members[before.holder as usize].up
                    && matches!(
                        s.members[before.holder as usize].phase,
                        Phase::Draining { epoch, .. } if epoch == before.epoch
                    )
                {
                    s.expired_mid_drain = true;
                }
                s.row = Row {
                    epoch,
                    holder: t.by,
                    held: true,
                    expires: s.clock + self.cfg.ttl,
                };
                s.hist.push(Commit::Acquire { by: t.by, epoch });
                let m = &mut s.members[t.by as usize];
                m.phase = Phase::Leading(epoch);
                m.known = Some(epoch);
                // The local deadline counts from the send time of the call.
                m.trust_until = (t.since + self.cfg.ttl).saturating_sub(self.cfg.margin);
            }
            Some(epoch) => {
                s.row.held = false;
                s.row.expires = s.row.expires.min(s.clock);
                s.hist.push(Commit::Release { by: t.by, epoch });
                s.members[t.by as usize].phase = Phase::Follower;
            }
        }
    }

    fn begin_takeover(&self, s: &mut State, by: Pid, release: Option<Epoch>) {
        s.takeover = Some(Takeover {
            by,
            release,
            since: s.clock,
        });
        let without_wait = match release {
            None => self.cfg.weak(Weakening::AcquireWhileHeld),
            Some(_) => self.cfg.weak(Weakening::ReleaseWithoutGuard),
        };
        if without_wait || !s.passed_writes() {
            self.commit_takeover(s);
        }
    }

    fn step(&self, last: &State, action: Action) -> Option<State> {
        let cfg = &self.cfg;
        let mut s = last.clone();
        match action {
            Action::Tick => {
                s.clock += 1;
                for p in 0..cfg.members {
                    let i = p as usize;
                    if !s.members[i].up {
                        continue;
                    }
                    // The heartbeat: upsert the row; the first one after joining settles the member.
                    s.members[i].heartbeat = s.clock;
                    s.members[i].settled = true;
                    // The renewal of the tenure it holds (not while its own release holds the row; while another
                    // member's takeover holds it, the renewal waits for it: judged at the next tick).
                    if let Phase::Leading(e) | Phase::Draining { epoch: e, .. } = s.members[i].phase
                    {
                        if s.takeover.is_some() {
                            continue;
                        }
                        let r = s.row;
                        if r.epoch == e && r.holder == p && r.held && r.expires > s.clock {
                            s.row.expires = s.clock + cfg.ttl;
                            s.members[i].trust_until =
                                (s.clock + cfg.ttl).saturating_sub(cfg.margin);
                        } else {
                            // Lost: the callback is cancelled; the runtime campaigns again.
                            s.members[i].phase = Phase::Follower;
                        }
                    }
                }
            }
            Action::Join(p) => {
                let m = &mut s.members[p as usize];
                m.joined = true;
                m.up = true;
                m.heartbeat = s.clock;
                m.settled = false;
            }
            Action::Pause(p) => {
                let m = &mut s.members[p as usize];
                m.up = false;
                m.pauses -= 1;
            }
            Action::Resume(p) => {
                let clock = s.clock;
                let expired = !s.live(cfg, p);
                let m = &mut s.members[p as usize];
                m.up = true;
                if let Phase::Leading(e) | Phase::Draining { epoch: e, .. } = m.phase {
                    if clock >= m.trust_until {
                        // Past its local deadline: it no longer trusts the tenure (the callback is cancelled)
                        // and releases it in the background.
                        m.phase = Phase::Dropping(e);
                    }
                }
                if expired {
                    m.heartbeat = clock;
                    m.settled = false;
                }
            }
            Action::Drain(p) => {
                let Phase::Leading(epoch) = s.members[p as usize].phase else {
                    return None;
                };
                s.members[p as usize].phase = Phase::Draining {
                    epoch,
                    since: s.clock,
                };
            }
            Action::ReleaseCall(p) => {
                let (Phase::Draining { epoch, .. } | Phase::Dropping(epoch)) =
                    s.members[p as usize].phase
                else {
                    return None;
                };
                // The locked re-check: its tenure is still the current one (live or expired).
                if s.row.epoch == epoch && s.row.holder == p && s.row.held {
                    s.members[p as usize].phase = Phase::Releasing(epoch);
                    self.begin_takeover(&mut s, p, Some(epoch));
                } else {
                    s.members[p as usize].phase = Phase::Follower;
                }
            }
            Action::AcquireCall(p) => {
                s.members[p as usize].phase = Phase::Acquiring;
                self.begin_takeover(&mut s, p, None);
            }
            Action::TakeoverCommit => self.commit_takeover(&mut s),
            Action::TakeoverEnds => {
                for m in &mut s.members {
                    if let Writer::Passed(_) = m.writer {
                        m.writer = Writer::Idle;
                        s.terminated = true;
                    }
                }
                self.commit_takeover(&mut s);
            }
            Action::WriteSend(p) => {
                let row = s.row;
                let m = &mut s.members[p as usize];
                let epoch = m.known.expect("a write needs an epoch");
                m.writes -= 1;
                m.writer = Writer::Checking {
                    epoch,
                    current: epoch == row.epoch && row.held,
                };
            }
            Action::WriteCheck(p) => {
                let Writer::Checking { epoch, current } = s.members[p as usize].writer else {
                    return None;
                };
                let r = s.row;
                if r.epoch == epoch && r.held && r.expires > s.clock {
                    s.members[p as usize].writer = Writer::Passed(epoch);
                } else {
                    // Refused and audited ('superseded', 'released' or 'expired').
                    if epoch < r.epoch && current && r.holder != p {
                        s.inflight_refused = true;
                    }
                    let m = &s.members[p as usize];
                    if epoch < r.epoch && r.holder != p && m.pauses < cfg.pauses && m.up {
                        s.resumed_refused = true;
                    }
                    s.members[p as usize].writer = Writer::Idle;
                }
            }
            Action::WriteCommit(p) => {
                let Writer::Passed(epoch) = s.members[p as usize].writer else {
                    return None;
                };
                s.hist.push(Commit::Write { by: p, epoch });
                s.members[p as usize].writer = Writer::Idle;
            }
        }
        Some(s)
    }
}

impl Model for Handover {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let cfg = &self.cfg;
        let holder = cfg.members - 1;
        let members = (0..cfg.members)
            .map(|p| {
                let h = p == holder;
                Member {
                    joined: h,
                    up: h,
                    heartbeat: 0,
                    settled: h,
                    phase: if h {
                        Phase::Leading(1)
                    } else {
                        Phase::Follower
                    },
                    known: h.then_some(1),
                    trust_until: if h { cfg.ttl - cfg.margin } else { 0 },
                    writer: Writer::Idle,
                    writes: if h {
                        cfg.holder_writes
                    } else {
                        cfg.joiner_writes
                    },
                    pauses: cfg.pauses,
                }
            })
            .collect();
        vec![State {
            clock: 0,
            row: Row {
                epoch: 1,
                holder,
                held: true,
                expires: cfg.ttl,
            },
            takeover: None,
            members,
            hist: vec![Commit::Acquire {
                by: holder,
                epoch: 1,
            }],
            stable_since: 0,
            forced: false,
            graceful: false,
            inflight_refused: false,
            expired_mid_drain: false,
            terminated: false,
            resumed_refused: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let cfg = &self.cfg;
        if s.clock < cfg.max_clock && !self.due(s) {
            actions.push(Action::Tick);
        }
        if let Some(t) = s.takeover {
            if !s.passed_writes() {
                actions.push(Action::TakeoverCommit);
            } else if s.clock >= t.since + cfg.takeover_grace {
                actions.push(Action::TakeoverEnds);
            }
        }
        // With three members, one pause in all (the state space of one each is too large for every run).
        let pauses_left = cfg.members < 3 || s.members.iter().all(|m| m.pauses == cfg.pauses);
        for p in 0..cfg.members {
            let m = &s.members[p as usize];
            if !m.joined {
                actions.push(Action::Join(p));
                continue;
            }
            if m.up {
                if m.pauses > 0 && pauses_left {
                    actions.push(Action::Pause(p));
                }
            } else {
                actions.push(Action::Resume(p));
            }
            if self.can_drain(s, p) {
                actions.push(Action::Drain(p));
            }
            if self.can_release(s, p) {
                actions.push(Action::ReleaseCall(p));
            }
            if self.can_acquire(s, p) {
                actions.push(Action::AcquireCall(p));
            }
            match m.writer {
                Writer::Idle => {
                    if m.up && m.known.is_some() && m.writes > 0 {
                        actions.push(Action::WriteSend(p));
                    }
                }
                Writer::Checking { .. } => {
                    if s.takeover.is_none() {
                        actions.push(Action::WriteCheck(p));
                    }
                }
                Writer::Passed(_) => {
                    if m.up {
                        actions.push(Action::WriteCommit(p));
                    }
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = self.step(last, action)?;
        if s.membership(&self.cfg) != last.membership(&self.cfg) {
            s.stable_since = s.clock;
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties()
    }

    fn format_action(&self, action: &Action) -> String {
        describe(action)
    }
}

pub const FENCING: &str =
    "no write of epoch e commits after the acquisition of a larger epoch committed (commit order)";
pub const RELEASE_FENCE: &str =
    "no write of epoch e commits after the release of epoch e committed";
pub const ONE_HOLDER_PER_EPOCH: &str = "at most one holder per epoch";
pub const EPOCHS_INCREASE: &str = "epochs strictly increase";
pub const NO_FORCED_TAKEOVER: &str =
    "no acquisition takes the lease from another member's live tenure (the successor waits for it to be free)";
pub const ONE_CALLBACK: &str = "at most one running member's callback leads at a time";
pub const CONVERGES: &str =
    "once membership is stable and the desired owner runs and is settled, it leads L before the clock passes the bound";

pub const S_GRACEFUL: &str =
    "example: a graceful handover completes (release, then the successor acquires)";
pub const S_INFLIGHT_REFUSED: &str =
    "example: the old holder's write in flight is refused after the successor's acquisition";
pub const S_EXPIRED_MID_DRAIN: &str =
    "example: a holder stops mid-drain, its lease expires, the successor acquires after expiry";
pub const S_TERMINATED: &str = "example: a write past its check is ended after the grace";
pub const S_RESUMED_REFUSED: &str =
    "example: a paused old holder resumes and its write with the old epoch is refused";
pub const S_HANDBACK: &str =
    "example: a holder stops, another member takes L after expiry, the first comes back and L is handed back to it";

pub fn properties() -> Vec<Property<Handover>> {
    vec![
        Property::always(FENCING, |_: &Handover, s: &State| {
            s.hist.iter().enumerate().all(|(j, c)| match *c {
                Commit::Write { epoch, .. } => s.hist[..j].iter().all(|e| match *e {
                    Commit::Acquire { epoch: later, .. } => later <= epoch,
                    _ => true,
                }),
                _ => true,
            })
        }),
        Property::always(RELEASE_FENCE, |_: &Handover, s: &State| {
            s.hist.iter().enumerate().all(|(j, c)| match *c {
                Commit::Write { epoch, .. } => s.hist[..j]
                    .iter()
                    .all(|e| !matches!(*e, Commit::Release { epoch: ended, .. } if ended == epoch)),
                _ => true,
            })
        }),
        Property::always(ONE_HOLDER_PER_EPOCH, |_: &Handover, s: &State| {
            let acq: Vec<Epoch> = acquisitions(s).collect();
            let known: Vec<Epoch> = s.members.iter().filter_map(|m| m.known).collect();
            distinct(&acq) && distinct(&known)
        }),
        Property::always(EPOCHS_INCREASE, |_: &Handover, s: &State| {
            let acq: Vec<Epoch> = acquisitions(s).collect();
            acq.windows(2).all(|w| w[0] < w[1])
        }),
        Property::always(NO_FORCED_TAKEOVER, |_: &Handover, s: &State| !s.forced),
        Property::always(ONE_CALLBACK, |_: &Handover, s: &State| {
            s.members
                .iter()
                .filter(|m| m.up && matches!(m.phase, Phase::Leading(_)))
                .count()
                <= 1
        }),
        Property::always(CONVERGES, |m: &Handover, s: &State| {
            let Some(d) = m.desired(s) else {
                return true;
            };
            let dm = &s.members[d as usize];
            !(dm.up && dm.settled && s.clock > s.stable_since + m.cfg.convergence_bound())
                || s.leads(d)
        }),
        Property::sometimes(S_GRACEFUL, |_: &Handover, s: &State| s.graceful),
        Property::sometimes(S_INFLIGHT_REFUSED, |_: &Handover, s: &State| {
            s.inflight_refused
        }),
        Property::sometimes(S_EXPIRED_MID_DRAIN, |_: &Handover, s: &State| {
            s.expired_mid_drain
        }),
        Property::sometimes(S_TERMINATED, |_: &Handover, s: &State| s.terminated),
        Property::sometimes(S_RESUMED_REFUSED, |_: &Handover, s: &State| {
            s.resumed_refused
        }),
        Property::sometimes(S_HANDBACK, |_: &Handover, s: &State| {
            // Consecutive acquisitions by p, q ≠ p, p: p's tenure was never released (it expired), q's was (a
            // graceful handover back to p).
            let acq: Vec<(Pid, Epoch)> = s
                .hist
                .iter()
                .filter_map(|c| match *c {
                    Commit::Acquire { by, epoch } => Some((by, epoch)),
                    _ => None,
                })
                .collect();
            let released = |e: Epoch| {
                s.hist
                    .iter()
                    .any(|c| matches!(*c, Commit::Release { epoch, .. } if epoch == e))
            };
            acq.windows(3).any(|w| {
                w[0].0 == w[2].0 && w[0].0 != w[1].0 && !released(w[0].1) && released(w[1].1)
            })
        }),
    ]
}

fn acquisitions(s: &State) -> impl Iterator<Item = Epoch> + '_ {
    s.hist.iter().filter_map(|c| match *c {
        Commit::Acquire { epoch, .. } => Some(epoch),
        _ => None,
    })
}

fn distinct(v: &[Epoch]) -> bool {
    v.iter().enumerate().all(|(i, a)| !v[..i].contains(a))
}

/// The always properties (what a weakened model must break at least one of).
pub fn safety_names(m: &Handover) -> Vec<&'static str> {
    m.properties()
        .into_iter()
        .filter(|p| p.expectation == stateright::Expectation::Always)
        .map(|p| p.name)
        .collect()
}

fn name(p: Pid) -> char {
    (b'A' + p) as char
}

/// An action as a trace line.
pub fn describe(action: &Action) -> String {
    match *action {
        Action::Tick => "clock +1: every running member heartbeats (settles) and renews what it holds".into(),
        Action::Join(p) => format!("{}: joins (first heartbeat: counts for the assignment at once)", name(p)),
        Action::Pause(p) => format!("{}: PAUSES (crash or freeze: no heartbeat, no renewal, no step)", name(p)),
        Action::Resume(p) => format!("{}: resumes (checks its local deadline; rejoins if its row expired)", name(p)),
        Action::Drain(p) => format!("{}: no longer the desired owner, which is settled: DRAINS (callback cancelled)", name(p)),
        Action::ReleaseCall(p) => format!(
            "{}: drain grace over (or tenure dropped): pgfence.release — row lock, intent lock, guard lock EXCLUSIVE (commits at once if no write is past its check)",
            name(p)
        ),
        Action::AcquireCall(p) => format!(
            "{}: desired owner, lease free: pgfence.acquire — compare-and-set, intent lock, guard lock EXCLUSIVE (commits at once if no write is past its check)",
            name(p)
        ),
        Action::TakeoverCommit => "guard lock EXCLUSIVE granted (the writes past their check committed): UPDATE leases; COMMIT".into(),
        Action::TakeoverEnds => "takeover grace over: pg_terminate_backend of the writes past their check; UPDATE leases; COMMIT".into(),
        Action::WriteSend(p) => format!("{}: sends a guarded write presenting the last epoch it was told", name(p)),
        Action::WriteCheck(p) => format!("{}: _guard — intent probe, guard lock SHARED, fresh read (after any takeover)", name(p)),
        Action::WriteCommit(p) => format!("{}: guarded write COMMIT (guard lock released)", name(p)),
    }
}

/// The steps of `path` up to the first state that breaks the property `name` (the whole path if none does:
/// the checker may record a longer path than the first violating state).
pub fn until_broken(model: &Handover, path: &Path<State, Action>, name: &str) -> Steps {
    let mut steps = path.clone().into_vec();
    let property = model.properties().into_iter().find(|p| p.name == name);
    if let Some(p) = property.filter(|p| p.expectation == stateright::Expectation::Always) {
        if let Some(i) = steps.iter().position(|(s, _)| !(p.condition)(model, s)) {
            steps.truncate(i + 1);
            steps[i].1 = None;
        }
    }
    steps
}

/// A path as (state, the action taken from it).
pub type Steps = Vec<(State, Option<Action>)>;

/// The trace of `steps`: numbered actions, each followed by what it left.
pub fn render(model: &Handover, steps: &Steps) -> String {
    let mut out = String::new();
    let mut prev: Option<&State> = None;
    for (i, (state, action)) in steps.iter().enumerate() {
        match prev {
            Some(before) => {
                let _ = writeln!(out, "      {}", summary(model, before, state));
            }
            None => {
                let _ = writeln!(out, "   0. start: {}", summary(model, state, state));
            }
        }
        if let Some(a) = action {
            let _ = writeln!(out, "  {:>2}. {}", i + 1, describe(a));
        }
        prev = Some(state);
    }
    out
}

fn summary(model: &Handover, before: &State, s: &State) -> String {
    let r = s.row;
    let mut out = format!(
        "-> clock {} | row: epoch {} {} by {} until {}",
        s.clock,
        r.epoch,
        if r.held { "held" } else { "released" },
        name(r.holder),
        r.expires
    );
    if let Some(t) = s.takeover {
        let _ = write!(
            out,
            " | {} by {} waits for the guard lock since {}",
            if t.release.is_some() {
                "release"
            } else {
                "acquisition"
            },
            name(t.by),
            t.since
        );
    }
    if s.hist.len() > before.hist.len() {
        let _ = write!(out, " | COMMIT {:?}", s.hist[s.hist.len() - 1]);
    }
    let members: Vec<String> = (0..model.cfg.members)
        .map(|p| {
            let m = &s.members[p as usize];
            if !m.joined {
                return format!("{}: not joined", name(p));
            }
            format!(
                "{}: {}{}{} {:?}{}",
                name(p),
                if s.live(&model.cfg, p) {
                    "live"
                } else {
                    "expired"
                },
                if m.settled { " settled" } else { " unsettled" },
                if m.up { "" } else { " PAUSED" },
                m.phase,
                match m.writer {
                    Writer::Idle => String::new(),
                    w => format!(", write {w:?}"),
                }
            )
        })
        .collect();
    let _ = write!(
        out,
        " | desired {} | {}",
        model.desired(s).map(name).unwrap_or('-'),
        members.join("; ")
    );
    out
}
