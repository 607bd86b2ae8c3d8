//! The steps of the stored-assignment model (`tests/model/assignment.rs`): what each action does to the database
//! and to the members.

use crate::assignment::{
    Action, Assignment, Epoch, Lease, Phase, Pid, Proc, Rebalance, State, StoreCall, Takeover,
    Weakening, Writer,
};

/// What `assign_group` answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    Assigned,
    NotClaimed,
    Stale,
    MemberGone,
    MemberBack,
}

impl Assignment {
    /// `assign_group` on the database: the claim, the generation CAS, the live-owners check, the check that no
    /// live member the stored assignment counts is left out, then the names that move, the counted flags, the next generation, and `assigned <gen>` to the members listening.
    pub fn store(&self, s: &mut State, call: &StoreCall, notify: bool) -> Stored {
        let cfg = self.cfg();
        let claimed = s
            .group
            .claim
            .is_some_and(|(by, until)| by == call.by && s.clock < until);
        if !claimed && !cfg.weak(Weakening::NoClaimCheck) {
            return Stored::NotClaimed;
        }
        if (s.group.generation != call.gen || call.version > s.group.version)
            && !cfg.weak(Weakening::NoGenerationCheck)
        {
            s.stale_refused = true;
            return Stored::Stale;
        }
        let named = call
            .moves
            .iter()
            .filter_map(|&(_, o)| o)
            .chain((0..cfg.members).filter(|p| call.counted & (1 << p) != 0));
        let gone = named.clone().any(|p| !s.counts(cfg, p));
        if gone && !cfg.weak(Weakening::NoLiveCheck) {
            s.gone_refused = true;
            return Stored::MemberGone;
        }
        let back = (0..cfg.members)
            .any(|p| s.rows[p as usize].counted && s.live(cfg, p) && call.counted & (1 << p) == 0);
        if back && !cfg.weak(Weakening::NoBackCheck) {
            s.back_refused = true;
            return Stored::MemberBack;
        }
        for &(n, o) in &call.moves {
            s.group.owners[n as usize] = o;
        }
        for p in 0..cfg.members {
            s.rows[p as usize].counted = call.counted & (1 << p) != 0;
        }
        // The property "assigned live": every owner of what is now stored is live at this instant.
        if s.group.owners.iter().flatten().any(|&p| !s.live(cfg, p)) {
            s.assigned_gone = true;
        }
        let g = &mut s.group;
        g.generation += 1;
        g.assigned_version = call.version;
        g.urgent = g.urgent && g.version > call.version;
        g.claim = None;
        let gen = g.generation;
        for m in s.members.iter_mut() {
            if notify && m.proc == Proc::Joined && m.up {
                m.told = m.told.max(gen);
            }
        }
        Stored::Assigned
    }

    /// The takeover on name `n` commits (no write past its check): an acquisition issues epoch + 1, a release
    /// ends the tenure.
    fn commit_takeover(&self, s: &mut State, n: u8) {
        let cfg = self.cfg();
        let t = s.takeovers[n as usize].take().expect("a takeover");
        let l = s.leases[n as usize];
        match t.release {
            None => {
                if l.held && l.expires > s.clock && l.holder != t.by {
                    s.forced = true;
                }
                if !l.held && l.holder != t.by {
                    s.graceful = true;
                }
                let epoch = l.epoch + 1;
                s.leases[n as usize] = Lease {
                    epoch,
                    holder: t.by,
                    held: true,
                    expires: s.clock + cfg.ttl,
                };
                let m = &mut s.members[t.by as usize];
                m.phases[n as usize] = Phase::Leading(epoch);
                m.known[n as usize] = Some(epoch);
                m.trust[n as usize] = (s.clock + cfg.ttl).saturating_sub(cfg.margin);
                m.kept = false;
            }
            Some(_) => {
                let l = &mut s.leases[n as usize];
                l.held = false;
                l.expires = l.expires.min(s.clock);
                let m = &mut s.members[t.by as usize];
                m.phases[n as usize] = Phase::Follower;
                m.kept = false;
            }
        }
    }

    fn begin_takeover(&self, s: &mut State, n: u8, by: Pid, release: Option<Epoch>) {
        s.takeovers[n as usize] = Some(Takeover { by, release });
        let no_wait = release.is_none() && self.cfg().weak(Weakening::AcquireWhileHeld);
        if no_wait || !s.passed(n) {
            self.commit_takeover(s, n);
        }
    }

    /// The clock moves: every running member heartbeats (settling at its first heartbeat after a join: a change
    /// of the group) and learns the stored generation from the answer; every running member renews the leases it
    /// holds; notifications not delivered are lost.
    fn tick(&self, s: &mut State) {
        let cfg = self.cfg();
        s.clock += 1;
        let generation = s.group.generation;
        for p in 0..cfg.members {
            let i = p as usize;
            if !s.members[i].up {
                continue;
            }
            if s.members[i].proc == Proc::Joined {
                s.rows[i].heartbeat = s.clock;
                if !s.rows[i].settled {
                    s.rows[i].settled = true;
                    s.changed(false);
                }
                let m = &mut s.members[i];
                m.trust_member = (s.clock + cfg.member_ttl).saturating_sub(cfg.margin);
                if !cfg.weak(Weakening::HeartbeatWithoutGeneration) && generation > m.told {
                    // Its notification was lost (or it has not read since a join: not a recovery).
                    let recovered = m.view.is_some_and(|(g, _)| g < generation);
                    m.told = generation;
                    s.recovered |= recovered;
                }
            }
            for n in 0..cfg.names as usize {
                let (Phase::Leading(e) | Phase::Draining { epoch: e, .. }) = s.members[i].phases[n]
                else {
                    continue;
                };
                if s.takeovers[n].is_some() {
                    continue;
                }
                let l = s.leases[n];
                if l.epoch == e && l.holder == p && l.held && l.expires > s.clock {
                    s.leases[n].expires = s.clock + cfg.ttl;
                    s.members[i].trust[n] = (s.clock + cfg.ttl).saturating_sub(cfg.margin);
                } else {
                    s.members[i].phases[n] = Phase::Follower;
                    s.members[i].kept = false;
                }
            }
        }
    }

    /// `p` comes back: past its local deadlines it drops its tenures (released in the background) and its
    /// membership (its view is unknown until it has joined again and read its names).
    fn resume(&self, s: &mut State, p: Pid) {
        let clock = s.clock;
        let m = &mut s.members[p as usize];
        m.up = true;
        for n in 0..m.phases.len() {
            if let Phase::Leading(e) | Phase::Draining { epoch: e, .. } = m.phases[n] {
                if clock >= m.trust[n] {
                    m.phases[n] = Phase::Dropping(e);
                }
            }
        }
        if m.proc == Proc::Joined && clock >= m.trust_member {
            m.proc = Proc::Lost;
            m.view = None;
            m.rebalance = Rebalance::Idle;
            m.kept = m.phases.iter().any(|ph| matches!(ph, Phase::Leading(_)));
        }
    }

    pub fn step(&self, last: &State, action: Action) -> Option<State> {
        let cfg = self.cfg();
        let mut s = last.clone();
        match action {
            Action::Tick => self.tick(&mut s),
            Action::Join(p) => {
                let (clock, generation) = (s.clock, s.group.generation);
                let r = &mut s.rows[p as usize];
                r.joined = true;
                r.left = false;
                r.heartbeat = clock;
                r.settled = false;
                let m = &mut s.members[p as usize];
                m.up = true;
                m.proc = Proc::Joined;
                m.trust_member = (clock + cfg.member_ttl).saturating_sub(cfg.margin);
                m.told = m.told.max(generation);
                m.view = None;
            }
            Action::Read(p) => {
                let gen = s.group.generation;
                let mine = self.mine(&s, p);
                let m = &mut s.members[p as usize];
                m.view = Some((gen, mine));
                m.told = m.told.max(gen);
                let kept = m.kept
                    && (0..cfg.names).any(|n| {
                        mine & (1 << n) != 0 && matches!(m.phases[n as usize], Phase::Leading(_))
                    });
                m.kept = false;
                s.kept_through_rejoin |= kept;
            }
            Action::Claim(p) => {
                s.group.claim = Some((p, s.clock + cfg.claim_ttl));
                let (version, gen) = (s.group.version, s.group.generation);
                s.members[p as usize].rebalance = {
                    let inputs = (0..cfg.members)
                        .filter(|&q| s.counts(cfg, q))
                        .fold(0u8, |acc, q| acc | (1 << q));
                    let next = assign(cfg.names, inputs, &s.group.owners);
                    let moves = (0..cfg.names)
                        .filter(|&n| next[n as usize] != s.group.owners[n as usize])
                        .map(|n| (n, next[n as usize]))
                        .collect();
                    Rebalance::Computed(StoreCall {
                        by: p,
                        version,
                        gen,
                        moves,
                        counted: inputs,
                    })
                };
            }
            Action::Store(p) | Action::StoreUnnoticed(p) | Action::StoreLost(p) => {
                let Rebalance::Computed(call) = s.members[p as usize].rebalance.clone() else {
                    return None;
                };
                s.members[p as usize].rebalance = Rebalance::Idle;
                if action == Action::StoreLost(p) {
                    s.lost_left -= 1;
                    s.inflight = Some(call);
                } else if self.store(&mut s, &call, action == Action::Store(p)) == Stored::Assigned
                {
                    if action == Action::StoreUnnoticed(p) {
                        s.notices_left -= 1;
                    }
                    let gen = s.group.generation;
                    s.members[p as usize].told = gen;
                }
            }
            Action::InflightRun => {
                let call = s.inflight.take()?;
                self.store(&mut s, &call, true);
            }
            Action::Leave(p) => {
                s.leaves_left -= 1;
                let r = s.rows[p as usize];
                s.rows[p as usize].left = true;
                if r.counted || r.settled {
                    s.changed(true);
                }
                let clock = s.clock;
                let m = &mut s.members[p as usize];
                m.proc = Proc::Gone;
                m.view = None;
                m.rebalance = Rebalance::Idle;
                for ph in m.phases.iter_mut() {
                    if let Phase::Leading(epoch) = *ph {
                        *ph = Phase::Draining {
                            epoch,
                            since: clock,
                        };
                    }
                }
            }
            Action::Pause(p) => {
                s.pauses_left -= 1;
                let m = &mut s.members[p as usize];
                m.up = false;
                m.pauses -= 1;
            }
            Action::Resume(p) => self.resume(&mut s, p),
            Action::Drain(p, n) => {
                let m = &mut s.members[p as usize];
                let Phase::Leading(epoch) = m.phases[n as usize] else {
                    return None;
                };
                let unknown = m.view.is_none();
                m.phases[n as usize] = Phase::Draining {
                    epoch,
                    since: s.clock,
                };
                s.unknown_handover |= unknown;
            }
            Action::ReleaseCall(p, n) => {
                let (Phase::Draining { epoch, .. } | Phase::Dropping(epoch)) =
                    s.members[p as usize].phases[n as usize]
                else {
                    return None;
                };
                let l = s.leases[n as usize];
                if l.epoch == epoch && l.holder == p && l.held {
                    s.members[p as usize].phases[n as usize] = Phase::Releasing(epoch);
                    self.begin_takeover(&mut s, n, p, Some(epoch));
                } else {
                    s.members[p as usize].phases[n as usize] = Phase::Follower;
                }
            }
            Action::AcquireCall(p, n) => {
                s.members[p as usize].phases[n as usize] = Phase::Acquiring;
                self.begin_takeover(&mut s, n, p, None);
            }
            Action::TakeoverCommit(n) => self.commit_takeover(&mut s, n),
            Action::WriteSend(p, n) => {
                let m = &mut s.members[p as usize];
                m.writes -= 1;
                m.writer = Writer::Checking {
                    name: n,
                    epoch: m.known[n as usize]?,
                };
            }
            Action::WriteCheck(p) => {
                let Writer::Checking { name, epoch } = s.members[p as usize].writer else {
                    return None;
                };
                let l = s.leases[name as usize];
                s.members[p as usize].writer = if l.epoch == epoch && l.held && l.expires > s.clock
                {
                    Writer::Passed { name, epoch }
                } else {
                    if epoch < l.epoch && l.holder != p {
                        s.inflight_refused = true;
                    }
                    Writer::Idle
                };
            }
            Action::WriteCommit(p) => {
                let Writer::Passed { name, epoch } = s.members[p as usize].writer else {
                    return None;
                };
                if epoch < s.leases[name as usize].epoch {
                    s.late_write = true;
                }
                s.members[p as usize].writer = Writer::Idle;
            }
        }
        Some(s)
    }
}

/// The next assignment of `names` names from the stored `base`, for the counted members `inputs` (a bit each):
/// quotas (⌊N/M⌋, one more for the first N mod M members by id), each member keeps the names it is assigned up
/// to its quota, and a free name goes to the member with room that has the smallest id (the runtime: the highest
/// rendezvous score).
pub fn assign(names: u8, inputs: u8, base: &[Option<Pid>]) -> Vec<Option<Pid>> {
    let ms: Vec<Pid> = (0..8).filter(|p| inputs & (1 << p) != 0).collect();
    if ms.is_empty() {
        return vec![None; names as usize];
    }
    let m = ms.len() as u8;
    let quota = |p: Pid| {
        let i = ms.iter().position(|&q| q == p).unwrap() as u8;
        names / m + u8::from(i < names % m)
    };
    let mut load = [0u8; 8];
    let mut next = vec![None; names as usize];
    for n in 0..names as usize {
        if let Some(o) = base[n] {
            if ms.contains(&o) && load[o as usize] < quota(o) {
                next[n] = Some(o);
                load[o as usize] += 1;
            }
        }
    }
    for slot in next.iter_mut() {
        if slot.is_none() {
            let p = *ms.iter().find(|&&p| load[p as usize] < quota(p)).unwrap();
            *slot = Some(p);
            load[p as usize] += 1;
        }
    }
    next
}
