//! The stored group assignment of the leadership runtime, as a state machine: members that join, heartbeat,
//! leave, pause and expire (database clock); the group's stored assignment with its generation
//! (`pgfence.groups`, `pgfence.assignments`); a change (a member settles, leaves, or a counted member expires)
//! that makes a rebalance due; the claim (`claim_rebalance`); a claimant that reads the counted members and the
//! stored assignment, computes the next one and stores it (`assign_group`: the claim, the generation CAS and the
//! live-owners check), possibly from a read that is stale by then, possibly with its reply lost (the statement
//! outlives the call); `assigned <gen>` notifications that may be lost, and heartbeats that tell the generation;
//! each member's view of its own names (unknown after a lost membership until read again); the holder that drains
//! and releases a name no longer its own, the owner that acquires only a free lease, and guarded writes.
//!
//! Under it the lease protocol is abstracted as in `tests/model/handover.rs`: an acquisition or a release waits
//! for the writes past their check (the guard lock EXCLUSIVE), and no write passes its check while one is under
//! way. The takeover grace and the ending of writes are left to the first two models: here a write past its check
//! always commits, and it commits before the clock moves. The quiet time is zero: a change is due at once.
//!
//! Time: `Tick` moves the database clock; every running member heartbeats (settling at its first one after a
//! join: a change) and renews the leases it holds. The clock does not move while a running member has a due step
//! (join again, read its names, claim, compute, store, drain, release, acquire) or a write is past its check.
//! Any member may instead pause at any instant (a crash, a freeze, an outage seen from it).

use stateright::{Model, Property};

pub type Tick = u8;
pub type Epoch = u8;
pub type Pid = u8;
pub type Gen = u8;

/// A deliberate weakening: the model must find a counterexample for each (but `NoClaimCheck`, see the tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Weakening {
    /// `assign_group` does not compare the stored generation (and version) with the computation's.
    NoGenerationCheck,
    /// `assign_group` does not check that every member it names still counts (live; settled or counted).
    NoLiveCheck,
    /// `assign_group` does not check that every live member the stored assignment counts is counted by the
    /// computation too (a member read as expired that has joined again since).
    NoBackCheck,
    /// A member whose view is unknown (its membership lost, not read since it joined again) acts on it as if it
    /// were assigned nothing: it drains what it holds (the runtime before the stored assignment).
    ActOnUnknownView,
    /// The owner does not wait for the lease to be free: it takes it from a live holder at once, without the
    /// guard lock's wait for writes past their check.
    AcquireWhileHeld,
    /// The expiry of a member the stored assignment counts does not make a rebalance due (only a settle or a
    /// leave does).
    ExpiryNotDue,
    /// The heartbeat's answer does not carry the stored generation: a member learns of a new assignment only
    /// from the group's notification.
    HeartbeatWithoutGeneration,
    /// `assign_group` does not check the claim (the claim is a courtesy: nothing is expected to break).
    NoClaimCheck,
}

/// The bounds of one exploration, and the weakenings applied.
#[derive(Clone, Debug)]
pub struct Config {
    /// Members 0..members; the last one is joined, settled, counted, assigned every name and leads each
    /// (epoch 1) at the start; the others have not started.
    pub members: u8,
    /// Names 0..names.
    pub names: u8,
    /// Membership ttl (a row is live while clock < last heartbeat + member_ttl).
    pub member_ttl: Tick,
    /// Lease ttl.
    pub ttl: Tick,
    /// A process trusts its membership and its tenures until (last heartbeat or renewal + ttl − margin).
    pub margin: Tick,
    pub drain_grace: Tick,
    /// How long a claim lasts.
    pub claim_ttl: Tick,
    /// Pauses per member (each may be followed by a resume, or not); `pauses_total` bounds them all.
    pub pauses: u8,
    pub pauses_total: u8,
    /// Orderly leaves (shutdowns), in all.
    pub leaves: u8,
    /// `assign_group` calls whose reply is lost (the statement runs later, or has run), in all.
    pub lost_replies: u8,
    /// Store whose `assigned <gen>` notifications are all lost (each member learns the generation from its next
    /// heartbeat), in all.
    pub lost_notices: u8,
    /// Guarded writes of the first holder (the others write none: a late write is the old holder's).
    pub writes: u8,
    pub max_clock: Tick,
    /// The convergence bound: see `CONVERGES`.
    pub bound: Tick,
    pub weakenings: Vec<Weakening>,
}

impl Config {
    /// One member and one name, through an outage of its own: its membership lapses (member ttl 2) while its
    /// lease is still trusted (ttl 3); clock 0..=6.
    pub fn lone() -> Config {
        Config {
            members: 1,
            names: 1,
            member_ttl: 2,
            ttl: 3,
            margin: 1,
            drain_grace: 1,
            claim_ttl: 2,
            pauses: 1,
            pauses_total: 1,
            leaves: 0,
            lost_replies: 1,
            lost_notices: 1,
            writes: 1,
            max_clock: 6,
            bound: 2,
            weakenings: Vec::new(),
        }
    }

    /// Two members, one name: B leads it; A joins at any time; one pause in all (either member, any instant,
    /// resumed or not); one orderly leave; one store's notifications lost; one write of B; clock 0..=5.
    pub fn two() -> Config {
        Config {
            members: 2,
            ttl: 2,
            leaves: 1,
            lost_replies: 0,
            max_clock: 5,
            ..Config::lone()
        }
    }

    /// `two` without the leave and the write, with one store's reply lost (the statement runs at any later
    /// instant) and a longer clock, 0..=7: a stale store, and a crash after a handover.
    pub fn two_lost() -> Config {
        Config {
            leaves: 0,
            lost_replies: 1,
            writes: 0,
            max_clock: 7,
            ..Config::two()
        }
    }

    /// Two members, two names (B leads both; A joins and takes one), no leave, clock 0..=4.
    pub fn two_names() -> Config {
        Config {
            names: 2,
            leaves: 0,
            max_clock: 4,
            ..Config::two()
        }
    }

    /// Three members, one name: C leads it, A and B join in any order; one pause in all; one lost reply; no
    /// leave; no writes; clock 0..=5 (about a minute: not in every run).
    pub fn three() -> Config {
        Config {
            members: 3,
            leaves: 0,
            lost_replies: 1,
            writes: 0,
            max_clock: 5,
            ..Config::two()
        }
    }

    pub fn with(mut self, weakenings: &[Weakening]) -> Config {
        self.weakenings = weakenings.to_vec();
        self
    }

    pub fn weak(&self, w: Weakening) -> bool {
        self.weakenings.contains(&w)
    }
}

/// A member's row in `pgfence.members`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    pub joined: bool,
    pub left: bool,
    pub heartbeat: Tick,
    pub settled: bool,
    /// Counted by the stored assignment.
    pub counted: bool,
}

/// The group's row in `pgfence.groups`, and its stored assignment.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Group {
    pub version: u8,
    pub assigned_version: u8,
    pub generation: Gen,
    pub urgent: bool,
    /// (claimant, until).
    pub claim: Option<(Pid, Tick)>,
    /// The owner of each name.
    pub owners: Vec<Option<Pid>>,
}

/// A lease row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lease {
    pub epoch: Epoch,
    pub holder: Pid,
    pub held: bool,
    pub expires: Tick,
}

/// An acquisition or a release waiting for the guard lock EXCLUSIVE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Takeover {
    pub by: Pid,
    /// `None`: an acquisition; `Some(e)`: the release of epoch e.
    pub release: Option<Epoch>,
}

/// An `assign_group` call: computed from generation `gen` for the inputs of `version`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StoreCall {
    pub by: Pid,
    pub version: u8,
    pub gen: Gen,
    /// (name, new owner or none: removed).
    pub moves: Vec<(u8, Option<Pid>)>,
    /// The members it counted (a bit each).
    pub counted: u8,
}

/// Where a member's process stands with the group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proc {
    NotStarted,
    /// Believes it is a member (its local deadline has not passed).
    Joined,
    /// Its membership was lost: it joins again once its row has expired (the name is taken until then).
    Lost,
    /// It left in order and is shutting down.
    Gone,
}

/// Its rebalance: the claim, the computation, the store.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Rebalance {
    Idle,
    /// Claimed, read and computed: the store comes next.
    Computed(StoreCall),
}

/// What a member's loop for one name does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Follower,
    Acquiring,
    Leading(Epoch),
    /// Handing over (or shutting down): the callback was cancelled at `since`; released after the grace.
    Draining {
        epoch: Epoch,
        since: Tick,
    },
    /// Past its local deadline: released in the background at once.
    Dropping(Epoch),
    Releasing(Epoch),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Writer {
    Idle,
    Checking { name: u8, epoch: Epoch },
    Passed { name: u8, epoch: Epoch },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Member {
    pub up: bool,
    pub proc: Proc,
    /// Its local deadline for the membership.
    pub trust_member: Tick,
    /// The newest generation it was told (heartbeat, notification, its own store).
    pub told: Gen,
    /// Its names as read since its last join: (generation, a bit per name); `None`: unknown.
    pub view: Option<(Gen, u8)>,
    pub rebalance: Rebalance,
    pub phases: Vec<Phase>,
    /// Per name: the last epoch an acquisition told it (its writer presents it).
    pub known: Vec<Option<Epoch>>,
    /// Per name: its local deadline for the tenure.
    pub trust: Vec<Tick>,
    pub writer: Writer,
    pub writes: u8,
    pub pauses: u8,
    /// Ghost: it lost its membership while leading and has led the same tenure since.
    pub kept: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub clock: Tick,
    pub rows: Vec<Row>,
    pub group: Group,
    pub leases: Vec<Lease>,
    pub takeovers: Vec<Option<Takeover>>,
    pub members: Vec<Member>,
    /// A store whose reply was lost, not yet run by the server.
    pub inflight: Option<StoreCall>,
    pub pauses_left: u8,
    pub leaves_left: u8,
    pub lost_left: u8,
    pub notices_left: u8,
    /// Ghost: the clock at the last change of the membership (rows live or counting, processes running).
    pub stable_since: Tick,
    /// Ghosts of the safety properties.
    pub late_write: bool,
    pub forced: bool,
    pub assigned_gone: bool,
    pub unknown_handover: bool,
    /// Ghosts of the examples.
    pub graceful: bool,
    pub stale_refused: bool,
    pub gone_refused: bool,
    pub back_refused: bool,
    pub recovered: bool,
    pub kept_through_rejoin: bool,
    pub inflight_refused: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Tick,
    /// `join_group` (the first, or again after a loss once the row expired): not settled; `counted` kept.
    Join(Pid),
    /// `assigned_names`: the member reads its own names (after a join, or when told a newer generation).
    Read(Pid),
    /// `claim_rebalance`, then `rebalance_inputs` and `group_assignment` and the computation (a claim from an
    /// older generation than the stored one is given up: the runtime's own check).
    Claim(Pid),
    /// `assign_group`, answered; the group's channel tells every member `assigned <gen>`.
    Store(Pid),
    /// `assign_group`, answered, its notifications lost: the members learn the generation from their heartbeats.
    StoreUnnoticed(Pid),
    /// `assign_group` sent, its reply lost: the client asks again; the statement runs later (`InflightRun`).
    StoreLost(Pid),
    InflightRun,
    /// `leave_group`, then the shutdown drains what it leads.
    Leave(Pid),
    Pause(Pid),
    Resume(Pid),
    Drain(Pid, u8),
    ReleaseCall(Pid, u8),
    AcquireCall(Pid, u8),
    TakeoverCommit(u8),
    WriteSend(Pid, u8),
    WriteCheck(Pid),
    WriteCommit(Pid),
}

pub struct Assignment {
    pub cfg: Config,
}

impl State {
    pub fn live(&self, cfg: &Config, p: Pid) -> bool {
        let r = &self.rows[p as usize];
        r.joined && !r.left && self.clock < r.heartbeat + cfg.member_ttl
    }

    /// Counts for the assignment (`rebalance_inputs`): live, and settled or counted by the stored assignment.
    pub fn counts(&self, cfg: &Config, p: Pid) -> bool {
        let r = &self.rows[p as usize];
        self.live(cfg, p) && (r.settled || r.counted)
    }

    /// `_rebalance_due` (the quiet time zero).
    pub fn due(&self, cfg: &Config) -> bool {
        let g = &self.group;
        let expired = !cfg.weak(Weakening::ExpiryNotDue)
            && (0..cfg.members).any(|p| self.rows[p as usize].counted && !self.live(cfg, p));
        g.urgent || expired || g.version > g.assigned_version
    }

    pub(crate) fn passed(&self, n: u8) -> bool {
        self.members
            .iter()
            .any(|m| matches!(m.writer, Writer::Passed { name, .. } if name == n))
    }

    /// `p` leads name `n`: its loop leads the tenure the row names, held and unexpired.
    pub fn leads(&self, p: Pid, n: u8) -> bool {
        let l = &self.leases[n as usize];
        self.members[p as usize].phases[n as usize] == Phase::Leading(l.epoch)
            && l.holder == p
            && l.held
            && l.expires > self.clock
    }

    fn membership(&self, cfg: &Config) -> Vec<(bool, bool, bool, Proc)> {
        (0..cfg.members)
            .map(|p| {
                let m = &self.members[p as usize];
                (self.live(cfg, p), self.counts(cfg, p), m.up, m.proc)
            })
            .collect()
    }

    /// `_group_changed`.
    pub(crate) fn changed(&mut self, urgent: bool) {
        self.group.version += 1;
        self.group.urgent |= urgent;
    }
}

impl Assignment {
    pub(crate) fn cfg(&self) -> &Config {
        &self.cfg
    }

    /// The names `p` is assigned in the stored assignment (a bit each).
    pub fn mine(&self, s: &State, p: Pid) -> u8 {
        (0..self.cfg.names)
            .filter(|&n| s.group.owners[n as usize] == Some(p))
            .fold(0, |acc, n| acc | (1 << n))
    }

    pub(crate) fn active(&self, s: &State, p: Pid) -> bool {
        let m = &s.members[p as usize];
        m.up && m.proc == Proc::Joined && s.live(self.cfg(), p)
    }

    fn can_read(&self, s: &State, p: Pid) -> bool {
        let m = &s.members[p as usize];
        self.active(s, p) && m.view.is_none_or(|(g, _)| m.told > g)
    }

    fn can_claim(&self, s: &State, p: Pid) -> bool {
        self.active(s, p)
            && s.members[p as usize].rebalance == Rebalance::Idle
            && s.due(self.cfg())
            && s.group
                .claim
                .is_none_or(|(by, until)| by == p || s.clock >= until)
    }

    fn can_drain(&self, s: &State, p: Pid, n: u8) -> bool {
        let m = &s.members[p as usize];
        let not_mine = match m.view {
            Some((_, mask)) => mask & (1 << n) == 0,
            None => self.cfg.weak(Weakening::ActOnUnknownView),
        };
        m.up && matches!(m.proc, Proc::Joined | Proc::Lost)
            && (m.proc == Proc::Joined || m.view.is_none())
            && matches!(m.phases[n as usize], Phase::Leading(_))
            && not_mine
    }

    fn can_release(&self, s: &State, p: Pid, n: u8) -> bool {
        let m = &s.members[p as usize];
        m.up && s.takeovers[n as usize].is_none()
            && match m.phases[n as usize] {
                Phase::Draining { since, .. } => s.clock >= since + self.cfg.drain_grace,
                Phase::Dropping(_) => true,
                _ => false,
            }
    }

    fn can_acquire(&self, s: &State, p: Pid, n: u8) -> bool {
        let m = &s.members[p as usize];
        let l = &s.leases[n as usize];
        let free = !l.held || l.expires <= s.clock || l.holder == p;
        self.active(s, p)
            && m.phases[n as usize] == Phase::Follower
            && s.takeovers[n as usize].is_none()
            && m.view.is_some_and(|(_, mask)| mask & (1 << n) != 0)
            && (free || self.cfg.weak(Weakening::AcquireWhileHeld))
    }

    fn can_rejoin(&self, s: &State, p: Pid) -> bool {
        let m = &s.members[p as usize];
        m.up && m.proc == Proc::Lost && !s.live(self.cfg(), p)
    }

    /// A step is due before the clock may move.
    fn due(&self, s: &State) -> bool {
        let names = self.cfg.names;
        (0..names).any(|n| s.takeovers[n as usize].is_some() && !s.passed(n))
            || s.members
                .iter()
                .any(|m| matches!(m.writer, Writer::Passed { .. }))
            || (0..self.cfg.members).any(|p| {
                let m = &s.members[p as usize];
                self.can_rejoin(s, p)
                    || self.can_read(s, p)
                    || self.can_claim(s, p)
                    || (m.up && m.rebalance != Rebalance::Idle)
                    || (0..names).any(|n| {
                        self.can_drain(s, p, n)
                            || self.can_release(s, p, n)
                            || self.can_acquire(s, p, n)
                    })
            })
    }
}

impl Model for Assignment {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let cfg = &self.cfg;
        let holder = cfg.members - 1;
        let k = cfg.names as usize;
        let all = ((1u16 << cfg.names) - 1) as u8;
        let members = (0..cfg.members)
            .map(|p| {
                let h = p == holder;
                Member {
                    up: h,
                    proc: if h { Proc::Joined } else { Proc::NotStarted },
                    trust_member: if h { cfg.member_ttl - cfg.margin } else { 0 },
                    told: u8::from(h),
                    view: h.then_some((1, all)),
                    rebalance: Rebalance::Idle,
                    phases: vec![
                        if h {
                            Phase::Leading(1)
                        } else {
                            Phase::Follower
                        };
                        k
                    ],
                    known: vec![h.then_some(1); k],
                    trust: vec![if h { cfg.ttl - cfg.margin } else { 0 }; k],
                    writer: Writer::Idle,
                    writes: if h { cfg.writes } else { 0 },
                    pauses: cfg.pauses,
                    kept: false,
                }
            })
            .collect();
        let rows = (0..cfg.members)
            .map(|p| {
                let h = p == holder;
                Row {
                    joined: h,
                    left: false,
                    heartbeat: 0,
                    settled: h,
                    counted: h,
                }
            })
            .collect();
        let lease = Lease {
            epoch: 1,
            holder,
            held: true,
            expires: cfg.ttl,
        };
        vec![State {
            clock: 0,
            rows,
            group: Group {
                version: 1,
                assigned_version: 1,
                generation: 1,
                urgent: false,
                claim: None,
                owners: vec![Some(holder); k],
            },
            leases: vec![lease; k],
            takeovers: vec![None; k],
            members,
            inflight: None,
            pauses_left: cfg.pauses_total,
            leaves_left: cfg.leaves,
            lost_left: cfg.lost_replies,
            notices_left: cfg.lost_notices,
            stable_since: 0,
            late_write: false,
            forced: false,
            assigned_gone: false,
            unknown_handover: false,
            graceful: false,
            stale_refused: false,
            gone_refused: false,
            back_refused: false,
            recovered: false,
            kept_through_rejoin: false,
            inflight_refused: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let cfg = &self.cfg;
        if s.clock < cfg.max_clock && !self.due(s) {
            actions.push(Action::Tick);
        }
        if s.inflight.is_some() {
            actions.push(Action::InflightRun);
        }
        for n in 0..cfg.names {
            if s.takeovers[n as usize].is_some() && !s.passed(n) {
                actions.push(Action::TakeoverCommit(n));
            }
        }
        for p in 0..cfg.members {
            let m = &s.members[p as usize];
            if m.proc == Proc::NotStarted {
                actions.push(Action::Join(p));
                continue;
            }
            if m.up && m.pauses > 0 && s.pauses_left > 0 {
                actions.push(Action::Pause(p));
            }
            if !m.up {
                actions.push(Action::Resume(p));
            }
            if self.can_rejoin(s, p) {
                actions.push(Action::Join(p));
            }
            if self.can_read(s, p) {
                actions.push(Action::Read(p));
            }
            if self.can_claim(s, p) {
                actions.push(Action::Claim(p));
            }
            if m.up {
                match m.rebalance {
                    Rebalance::Idle => {}
                    Rebalance::Computed(_) => {
                        actions.push(Action::Store(p));
                        if s.notices_left > 0 {
                            actions.push(Action::StoreUnnoticed(p));
                        }
                        if s.lost_left > 0 && s.inflight.is_none() {
                            actions.push(Action::StoreLost(p));
                        }
                    }
                }
            }
            if self.active(s, p) && s.leaves_left > 0 {
                actions.push(Action::Leave(p));
            }
            for n in 0..cfg.names {
                if self.can_drain(s, p, n) {
                    actions.push(Action::Drain(p, n));
                }
                if self.can_release(s, p, n) {
                    actions.push(Action::ReleaseCall(p, n));
                }
                if self.can_acquire(s, p, n) {
                    actions.push(Action::AcquireCall(p, n));
                }
            }
            match m.writer {
                Writer::Idle if m.up && m.writes > 0 => {
                    for n in 0..cfg.names {
                        if m.known[n as usize].is_some() {
                            actions.push(Action::WriteSend(p, n));
                        }
                    }
                }
                Writer::Idle => {}
                Writer::Checking { name, .. } => {
                    if s.takeovers[name as usize].is_none() {
                        actions.push(Action::WriteCheck(p));
                    }
                }
                Writer::Passed { .. } => actions.push(Action::WriteCommit(p)),
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
        crate::assignment_props::properties()
    }

    fn format_action(&self, action: &Action) -> String {
        crate::assignment_props::describe(action)
    }
}
