//! The effect ledger, as a state machine: one lease whose tenures succeed each other (epochs 1..=handovers + 1),
//! one or two tasks each with one logical effect, the leaders' steps around an external call (record the intent,
//! call the engine with the effect key, record the outcome), the successors' steps (list what is in doubt, ask
//! the engine by the key, settle once), and an external engine that dedupes by effect key. The engine's state is
//! the ground truth: which keys it applied, how many times each key was delivered.
//!
//! Every action's doc comment names the SQL function it stands for (`migrations/2026-11-30-000004_tasks/up.sql`:
//! `record_intent`, `record_outcome` with `_keep_late_report`, `settle_effect`, `in_doubt_effects`,
//! `_task_in_doubt`; the tables `pgfence.effects` and `pgfence.effect_reports` of `000001_schema`).
//!
//! The guard is abstracted to what `tests/model/protocol.rs` checks in detail: a guarded write of epoch e
//! commits only while e is the current tenure, and a takeover waits for the guarded writes past their check (or
//! ends them after the grace: they roll back). So a ledger write that is one statement is one step, judged
//! against the current epoch; `settle_effect`'s pre-checks (its guard and the read of the key's last attempt)
//! and its UPDATE are two steps, because two calls of one tenure may interleave between them — a second settle,
//! or the tenure's own final outcome reported by another of its workers (`SelfReport`) — and a takeover between
//! them rolls the settle back. The UPDATE re-checks on the row every condition the pre-checks decided on (in the
//! SQL the task's row lock is taken before the read that decides, so the second of two calls of one tenure
//! decides on what the first committed: the model's re-check at the commit is that read). A tenure
//! ends only by its successor's acquisition (`Supersede`), at any step; the ended tenure's process goes on (it
//! does not know), its writes refused, until its first refusal stops its callback (`Error::Stale`). The last
//! tenure is never superseded: it is the one that must finish the work.

use std::fmt::Write as _;

use stateright::{Model, Path, Property};

/// A lease epoch (tenure 1 is the first).
pub type Epoch = u8;
/// A task (0, 1).
pub type Task = u8;
/// An attempt's id (`pgfence.effects.id`: its index in `State::attempts`, increasing).
pub type Id = u8;

/// A deliberate weakening of the ledger: the model must find a counterexample for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Weakening {
    /// `settle_effect` without the guard (`_open_effect_write`'s `_admit`/`_guard`): a tenure that has ended
    /// settles, and a takeover does not end its settle in flight.
    SettleWithoutFence,
    /// `in_doubt_effects` omits the ended tenure's last intent (the in-doubt attempt with the largest id among
    /// those of the epoch just below the current one).
    InDoubtOmitsLast,
    /// `settle_effect` 'retried' records the next attempt under a new effect key (minted) instead of the same one.
    RetryMintsNewKey,
    /// `settle_effect`'s UPDATE without the row condition `settlement IS NULL`.
    SettleWithoutNullCheck,
    /// A refused `record_outcome` writes the late outcome on the attempt (when it has none) instead of keeping
    /// it in `effect_reports` only.
    LateReportWrites,
    /// `settle_effect` decides on the attempt as it read it before the task's row lock, its UPDATE re-checking
    /// the settlement only (the SQL before issue #43): a settle racing its own tenure's final outcome settles
    /// an attempt that is done.
    SettleRechecksOnlySettlement,
}

/// The bounds of one exploration, and the weakenings applied.
#[derive(Clone, Debug)]
pub struct Config {
    /// Tasks, each with one logical effect (its key: `Key { task, gen: 0 }`).
    pub tasks: u8,
    /// Successions of tenures (epochs 1..=handovers + 1; the last one is never superseded).
    pub handovers: u8,
    /// Faults in all: a request lost on the way, a reply lost, a timeout while the request is still on its
    /// way, a delivery the engine fails. (A timeout once no reply can come any more is no fault of its own.)
    pub faults: u8,
    /// Whether the engine may fail a delivery (not applied, answered 'failed').
    pub engine_fails: bool,
    /// Whether a successor told "not applied" may abandon the effect instead of retrying it.
    pub abandon: bool,
    /// Second settles (another worker of the same tenure settling the same effect 'confirmed' concurrently).
    pub double_settles: u8,
    /// Self-reports: another worker of the tenure records 'done' for the attempt the tenure reported 'unknown'
    /// and is settling (the reply of the timed-out call reached it after all), between the settle's pre-checks
    /// and its UPDATE.
    pub self_reports: u8,
    pub weakenings: Vec<Weakening>,
}

impl Config {
    /// One task, two handovers (epochs 1..3: two successors in a row), two faults, abandon allowed.
    pub fn one_task() -> Config {
        Config {
            tasks: 1,
            handovers: 2,
            faults: 2,
            engine_fails: true,
            abandon: true,
            double_settles: 0,
            self_reports: 0,
            weakenings: Vec::new(),
        }
    }

    /// Two tasks, one handover, one fault: the list, the intents and the settles of two effects interleaved.
    pub fn two_tasks() -> Config {
        Config {
            tasks: 2,
            handovers: 1,
            faults: 1,
            engine_fails: false,
            abandon: false,
            ..Config::one_task()
        }
    }

    /// `two_tasks` with two faults (3.5 M unique states, about 140 s on a loaded machine: not in every run).
    pub fn two_tasks_large() -> Config {
        Config {
            faults: 2,
            ..Config::two_tasks()
        }
    }

    /// One task, one handover, and a second worker of a tenure confirming the same effect concurrently.
    pub fn double_settle() -> Config {
        Config {
            handovers: 1,
            engine_fails: false,
            abandon: false,
            double_settles: 1,
            ..Config::one_task()
        }
    }

    /// One task, one handover, and a tenure racing itself: its settle of its own 'unknown' attempt and another
    /// worker's 'done' for it.
    pub fn self_race() -> Config {
        Config {
            handovers: 1,
            abandon: false,
            self_reports: 1,
            ..Config::one_task()
        }
    }

    pub fn with(mut self, weakenings: &[Weakening]) -> Config {
        self.weakenings = weakenings.to_vec();
        self
    }

    fn weak(&self, w: Weakening) -> bool {
        self.weakenings.contains(&w)
    }
}

/// An effect key: the task's own stable key is generation 0; only `RetryMintsNewKey` makes others.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub task: Task,
    pub gen: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Done,
    Failed,
    Unknown,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resolution {
    Confirmed,
    Retried,
    Abandoned,
}

/// One row of `pgfence.effects` (with its `effect_reports` row, and ghosts).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Attempt {
    pub task: Task,
    pub key: Key,
    pub n: u8,
    pub epoch: Epoch,
    pub outcome: Option<Outcome>,
    pub settlement: Option<(Resolution, Epoch)>,
    /// `pgfence.effect_reports.outcome`: the late report kept, if any.
    pub late: Option<Outcome>,
    /// Ghost: settles committed on this attempt.
    pub settles: u8,
    /// Ghost: recorded by a settle 'retried'.
    pub by_retry: bool,
    /// Ghost: the epochs whose `in_doubt_effects` listed it while they were current (bit e).
    pub listed_by: u8,
}

/// A settle in progress: `settle_effect` for `key`, its pre-checks passed (`checked`: the attempt they found).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Settle {
    pub key: Key,
    pub res: Resolution,
    pub checked: Option<Id>,
}

/// Where a tenure's program stands for one task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prog {
    /// The tenure has not listed yet (its first step: `in_doubt_effects`).
    Idle,
    /// The task's effect is still to do: `record_intent` next.
    Intend,
    /// The intent of attempt `Id` is accepted: the call to the engine next.
    Call(Id),
    /// The request is sent: a reply or a timeout next.
    Waiting(Id),
    /// `record_outcome` of this outcome next.
    Report(Id, Outcome),
    /// In doubt (listed, or its own 'unknown'): ask the engine by the attempt's key next.
    Ask(Id),
    Settle(Settle),
    /// Nothing more to do for the task.
    Done,
    /// `record_intent` answered 'in_doubt' (`Error::InDoubt`): the controller gives the task up.
    Stuck,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Proc {
    pub progs: Vec<Prog>,
    /// Stopped by a refusal or by the end of a transaction it had in flight (its callback cancelled).
    pub stopped: bool,
    /// A second worker's settle of the same effect ('confirmed'), in flight.
    pub second: Option<Settle>,
}

/// A request in flight to the engine (sent by tenure `from` for attempt `id`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Msg {
    pub key: Key,
    pub from: Epoch,
    pub id: Id,
}

/// What a delivery does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Delivery {
    /// Applied (or deduplicated: the key was applied before); the reply reaches the caller, or is lost.
    Applied { reply_lost: bool },
    /// The engine fails the request (not applied) and answers 'failed'.
    Fails,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The current tenure (`pgfence.leases.epoch`, held and live).
    pub current: Epoch,
    pub attempts: Vec<Attempt>,
    /// The tenures' processes, epoch e at index e − 1.
    pub procs: Vec<Proc>,
    /// Requests in flight (sorted).
    pub msgs: Vec<Msg>,
    /// The engine: keys applied (in order), deliveries per key.
    pub applied: Vec<Key>,
    pub delivered: Vec<(Key, u8)>,
    pub faults_left: u8,
    pub seconds_left: u8,
    pub self_reports_left: u8,
    /// Ghost: a ledger write committed from a tenure that had ended.
    pub stale_commit: bool,
    /// Ghost: a refused `record_outcome` changed an attempt (beyond its late report).
    pub late_changed: bool,
    /// Ghost: a late report was kept for an attempt already settled.
    pub late_after_settle: bool,
    /// Ghost: the engine applied a request after the tenure that sent it had ended.
    pub late_apply: bool,
    /// Ghost: the engine applied the request of an attempt recorded by a settle 'retried'.
    pub retry_applied: bool,
    /// Ghost: an effect that a successor abandoned (the engine had not applied it) was applied afterwards.
    pub abandoned_applied: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `pgfence.acquire` by the next tenure: the current one ends (its guarded writes past their check are
    /// waited for or ended: a settle between its pre-checks and its UPDATE rolls back).
    Supersede,
    /// `pgfence.in_doubt_effects(lease)` at the tenure's start (the list `LeaderContext::in_doubt` hands the
    /// callback), and the task rows: each listed effect is to be asked about and settled; each other task whose
    /// last attempt is not done, confirmed or abandoned is to be done.
    List(Epoch),
    /// `pgfence.record_intent(lease, epoch, secret, task, effect key, intent)`: guarded; 'in_doubt' when
    /// `_task_in_doubt` finds an unsettled attempt; 'conflict' 'done' when the key is done or confirmed; the
    /// same attempt again for this tenure's own open one; else the next attempt (1, or after failed/abandoned).
    Intend(Epoch, Task),
    /// The external call with the attempt's effect key (only after an accepted intent or a settle 'retried').
    Call(Epoch, Task),
    /// The caller's timeout: no reply (lost, or the request not delivered yet): the outcome is 'unknown'.
    Timeout(Epoch, Task),
    /// `pgfence.record_outcome(lease, epoch, secret, effect key, outcome, detail)`: guarded; refused when the
    /// tenure has ended, and then `_keep_late_report` keeps it in `effect_reports` for the key's last attempt
    /// of this epoch; accepted: written on the key's last attempt if it is this tenure's, unsettled, and has
    /// no final outcome ('unknown' may become final).
    Report(Epoch, Task),
    /// The successor asks the engine by the effect key and decides: confirmed if it has the key, retried (or
    /// abandoned, where allowed) if not.
    Ask(Epoch, Task, Resolution),
    /// `pgfence.settle_effect`, first part: the guard (`_open_effect_write`), then the key's last attempt
    /// (`_last_attempt`) must be in doubt: unsettled ('settled' else), no final outcome ('not_in_doubt'), and
    /// 'unknown' or of an earlier tenure ('in_flight').
    SettleCheck(Epoch, Task),
    /// `pgfence.settle_effect`, second part: `UPDATE effects SET settlement … WHERE id = … AND settlement IS
    /// NULL` (0 rows: 'conflict' 'settled'); for 'retried' the next attempt of the same key under this epoch
    /// (`INSERT`, unique on (lease, effect_key, attempt)); COMMIT.
    SettleCommit(Epoch, Task),
    /// A second worker of the tenure starts `settle_effect` 'confirmed' for the same key.
    SecondStart(Epoch, Task),
    SecondCheck(Epoch),
    SecondCommit(Epoch),
    /// Another worker of tenure e (a reply handler) records 'done' for task t's attempt that the tenure reported
    /// 'unknown' and is settling, between the settle's pre-checks and its UPDATE: `pgfence.record_outcome`
    /// 'done', one step (the engine has applied the key: that is the reply it got).
    SelfReport(Epoch, Task),
    /// The engine receives request i (dedupes by key).
    Deliver(usize, Delivery),
    /// Request i is lost on the way (never delivered).
    Drop(usize),
}

pub struct Effects {
    pub cfg: Config,
}

impl State {
    fn proc(&self, e: Epoch) -> &Proc {
        &self.procs[e as usize - 1]
    }

    fn proc_mut(&mut self, e: Epoch) -> &mut Proc {
        &mut self.procs[e as usize - 1]
    }

    fn prog(&self, e: Epoch, t: Task) -> Prog {
        self.proc(e).progs[t as usize]
    }

    fn set(&mut self, e: Epoch, t: Task, p: Prog) {
        self.proc_mut(e).progs[t as usize] = p;
    }

    /// A refusal (or a transaction ended by a takeover): the tenure's callback is cancelled.
    fn stop(&mut self, e: Epoch) {
        let p = self.proc_mut(e);
        p.stopped = true;
        p.second = None;
        for g in &mut p.progs {
            if *g != Prog::Stuck {
                *g = Prog::Done;
            }
        }
    }

    pub fn is_applied(&self, key: Key) -> bool {
        self.applied.contains(&key)
    }

    /// `_last_attempt(lease, key)`: the key's attempt with the largest number.
    fn last_of_key(&self, key: Key) -> Option<usize> {
        (0..self.attempts.len())
            .filter(|&i| self.attempts[i].key == key)
            .max_by_key(|&i| self.attempts[i].n)
    }

    /// The task's newest attempt (what a controller reads of the task).
    fn latest_of_task(&self, t: Task) -> Option<&Attempt> {
        self.attempts.iter().rev().find(|a| a.task == t)
    }

    /// `_task_in_doubt(lease, task, epoch)`: an unsettled attempt of the task whose outcome is 'unknown', or
    /// without outcome from an earlier tenure.
    fn task_in_doubt(&self, t: Task, e: Epoch) -> bool {
        self.attempts.iter().any(|a| {
            a.task == t
                && a.settlement.is_none()
                && (a.outcome == Some(Outcome::Unknown) || (a.outcome.is_none() && a.epoch < e))
        })
    }

    /// Whether attempt `a` is in doubt as `in_doubt_effects` judges it (the current tenure is held and live).
    fn in_doubt(&self, a: &Attempt) -> bool {
        a.settlement.is_none()
            && (a.outcome == Some(Outcome::Unknown)
                || (a.outcome.is_none() && a.epoch != self.current))
    }

    /// Every attempt has a final outcome or a settlement.
    pub fn nothing_open(&self) -> bool {
        self.attempts.iter().all(|a| {
            a.settlement.is_some() || matches!(a.outcome, Some(Outcome::Done | Outcome::Failed))
        })
    }

    /// Whether tenure e's request for attempt id is still on its way (a reply may still come).
    fn on_its_way(&self, e: Epoch, id: Id) -> bool {
        self.msgs.iter().any(|m| m.from == e && m.id == id)
    }

    /// The engine's keys applied for task t.
    pub fn applied_for(&self, t: Task) -> usize {
        self.applied.iter().filter(|k| k.task == t).count()
    }
}

impl Effects {
    fn epochs(&self, s: &State) -> impl Iterator<Item = Epoch> {
        1..=s.current
    }

    /// `in_doubt_effects` as the SQL computes it (weakened: without the ended tenure's last intent).
    fn listing(&self, s: &State) -> Vec<usize> {
        let mut ids: Vec<usize> = (0..s.attempts.len())
            .filter(|&i| s.in_doubt(&s.attempts[i]))
            .collect();
        if self.cfg.weak(Weakening::InDoubtOmitsLast) {
            let prev = s.current.wrapping_sub(1);
            if let Some(pos) = ids.iter().rposition(|&i| s.attempts[i].epoch == prev) {
                ids.remove(pos);
            }
        }
        ids
    }

    fn list(&self, s: &mut State, e: Epoch) {
        let listed = self.listing(s);
        if e == s.current {
            for &i in &listed {
                s.attempts[i].listed_by |= 1 << e;
            }
        }
        for t in 0..self.cfg.tasks {
            let mine = listed.iter().rev().find(|&&i| s.attempts[i].task == t);
            let prog = match (mine, s.latest_of_task(t)) {
                (Some(&i), _) => Prog::Ask(i as Id),
                (None, Some(a))
                    if a.outcome == Some(Outcome::Done)
                        || matches!(
                            a.settlement,
                            Some((Resolution::Confirmed | Resolution::Abandoned, _))
                        ) =>
                {
                    Prog::Done
                }
                _ => Prog::Intend,
            };
            s.set(e, t, prog);
        }
    }

    fn record_intent(&self, s: &mut State, e: Epoch, t: Task) {
        if e != s.current {
            s.stop(e); // refused by the guard, audited; nothing called
            return;
        }
        if s.task_in_doubt(t, e) {
            s.set(e, t, Prog::Stuck);
            return;
        }
        let key = Key { task: t, gen: 0 };
        let mut n = 1;
        if let Some(i) = s.last_of_key(key) {
            let a = &s.attempts[i];
            if a.outcome == Some(Outcome::Done)
                || matches!(a.settlement, Some((Resolution::Confirmed, _)))
            {
                s.set(e, t, Prog::Done); // 'conflict' 'done'
                return;
            }
            if a.outcome.is_none() && a.settlement.is_none() {
                s.set(e, t, Prog::Call(i as Id)); // this tenure's own attempt: a retry of the call
                return;
            }
            n = a.n + 1; // failed, or abandoned
        }
        let id = self.insert(s, t, key, n, e, false);
        s.set(e, t, Prog::Call(id));
    }

    fn insert(
        &self,
        s: &mut State,
        task: Task,
        key: Key,
        n: u8,
        epoch: Epoch,
        by_retry: bool,
    ) -> Id {
        s.attempts.push(Attempt {
            task,
            key,
            n,
            epoch,
            outcome: None,
            settlement: None,
            late: None,
            settles: 0,
            by_retry,
            listed_by: 0,
        });
        (s.attempts.len() - 1) as Id
    }

    fn record_outcome(&self, s: &mut State, e: Epoch, t: Task) {
        let Prog::Report(id, o) = s.prog(e, t) else {
            return;
        };
        let key = s.attempts[id as usize].key;
        if e != s.current {
            // Refused (audited); `_keep_late_report`: the key's last attempt of this epoch keeps the report.
            let before = s.attempts.clone();
            let mine = (0..s.attempts.len())
                .filter(|&i| s.attempts[i].key == key && s.attempts[i].epoch == e)
                .max_by_key(|&i| s.attempts[i].n);
            if let Some(i) = mine {
                let a = &mut s.attempts[i];
                if a.settlement.is_some() {
                    s.late_after_settle = true;
                }
                a.late = match a.late {
                    None | Some(Outcome::Unknown) => Some(o),
                    kept => kept,
                };
                if self.cfg.weak(Weakening::LateReportWrites) && a.outcome.is_none() {
                    a.outcome = Some(o);
                    s.stale_commit = true;
                }
            }
            let changed = before
                .iter()
                .zip(&s.attempts)
                .any(|(b, a)| (b.outcome, b.settlement) != (a.outcome, a.settlement));
            s.late_changed |= changed || before.len() != s.attempts.len();
            s.stop(e);
            return;
        }
        let Some(i) = s.last_of_key(key) else {
            s.set(e, t, Prog::Done);
            return;
        };
        let a = &s.attempts[i];
        let stands = matches!(a.outcome, Some(x) if x != Outcome::Unknown || o == Outcome::Unknown);
        if a.epoch != e || a.settlement.is_some() || stands {
            s.set(e, t, Prog::Done); // 'conflict': not_this_tenure, settled, outcome_recorded (or 'ok' again)
            return;
        }
        s.attempts[i].outcome = Some(o);
        let next = match o {
            Outcome::Done => Prog::Done,
            Outcome::Failed => Prog::Intend,
            Outcome::Unknown => Prog::Ask(i as Id),
        };
        s.set(e, t, next);
    }

    /// `settle_effect`'s guard and pre-checks: the attempt to settle, or None (refused or a conflict: the
    /// settle ends; `refused`: the tenure is told it has ended).
    fn settle_check(&self, s: &State, e: Epoch, key: Key) -> Result<Id, bool> {
        if e != s.current && !self.cfg.weak(Weakening::SettleWithoutFence) {
            return Err(true);
        }
        let Some(i) = s.last_of_key(key) else {
            return Err(false);
        };
        let a = &s.attempts[i];
        let in_doubt = a.settlement.is_none()
            && match a.outcome {
                None => a.epoch < e,
                Some(o) => o == Outcome::Unknown,
            };
        if in_doubt {
            Ok(i as Id)
        } else {
            Err(false)
        }
    }

    /// `settle_effect`'s UPDATE … WHERE settlement IS NULL, the retry's INSERT, COMMIT. The new attempt of a
    /// retry, if any; Err: nothing written.
    fn settle_commit(&self, s: &mut State, e: Epoch, st: Settle) -> Result<Option<Id>, ()> {
        let id = st.checked.expect("checked") as usize;
        let a = s.attempts[id].clone();
        if a.settlement.is_some() && !self.cfg.weak(Weakening::SettleWithoutNullCheck) {
            return Err(()); // 0 rows: 'conflict' 'settled'
        }
        let in_doubt = matches!(a.outcome, None | Some(Outcome::Unknown));
        if !in_doubt && !self.cfg.weak(Weakening::SettleRechecksOnlySettlement) {
            return Err(()); // a final outcome since the pre-checks: 'conflict' 'not_in_doubt'
        }
        let mint = self.cfg.weak(Weakening::RetryMintsNewKey);
        let (key, n) = if mint {
            (
                Key {
                    task: a.task,
                    gen: a.key.gen + 1,
                },
                1,
            )
        } else {
            (a.key, a.n + 1)
        };
        if st.res == Resolution::Retried && s.attempts.iter().any(|b| b.key == key && b.n == n) {
            return Err(()); // unique (lease, effect_key, attempt): the statement fails, nothing commits
        }
        if e != s.current {
            s.stale_commit = true;
        }
        let target = &mut s.attempts[id];
        target.settlement = Some((st.res, e));
        target.settles += 1;
        Ok(if st.res == Resolution::Retried {
            Some(self.insert(s, a.task, key, n, e, true))
        } else {
            None
        })
    }

    fn deliver(&self, s: &mut State, i: usize, d: Delivery) {
        let m = s.msgs.remove(i);
        if d != (Delivery::Applied { reply_lost: false }) {
            s.faults_left -= 1;
        }
        match s.delivered.iter_mut().find(|(k, _)| *k == m.key) {
            Some((_, c)) => *c += 1,
            None => {
                s.delivered.push((m.key, 1));
                s.delivered.sort();
            }
        }
        let reply = if s.is_applied(m.key) {
            Some(Outcome::Done)
        } else if d == Delivery::Fails {
            Some(Outcome::Failed)
        } else {
            s.applied.push(m.key);
            if m.from < s.current {
                s.late_apply = true;
            }
            if s.attempts[m.id as usize].by_retry {
                s.retry_applied = true;
            }
            let abandoned = s.attempts.iter().any(|a| {
                a.key == m.key && matches!(a.settlement, Some((Resolution::Abandoned, _)))
            });
            s.abandoned_applied |= abandoned;
            Some(Outcome::Done)
        };
        let lost = matches!(d, Delivery::Applied { reply_lost: true });
        if let (Some(o), false) = (reply, lost) {
            let t = s.attempts[m.id as usize].task;
            if s.prog(m.from, t) == Prog::Waiting(m.id) {
                s.set(m.from, t, Prog::Report(m.id, o));
            }
        }
    }

    fn step(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Supersede => {
                let ended = s.current;
                s.current += 1;
                s.procs.push(Proc {
                    progs: vec![Prog::Idle; self.cfg.tasks as usize],
                    stopped: false,
                    second: None,
                });
                if !self.cfg.weak(Weakening::SettleWithoutFence) {
                    // The takeover ends the ended tenure's settles past their guard (they roll back).
                    let p = s.proc(ended);
                    let in_flight = p.progs.iter().any(|g| {
                        matches!(
                            g,
                            Prog::Settle(Settle {
                                checked: Some(_),
                                ..
                            })
                        )
                    }) || matches!(
                        p.second,
                        Some(Settle {
                            checked: Some(_),
                            ..
                        })
                    );
                    if in_flight {
                        s.stop(ended);
                    }
                }
            }
            Action::List(e) => self.list(&mut s, e),
            Action::Intend(e, t) => self.record_intent(&mut s, e, t),
            Action::Call(e, t) => {
                let Prog::Call(id) = s.prog(e, t) else {
                    return None;
                };
                s.msgs.push(Msg {
                    key: s.attempts[id as usize].key,
                    from: e,
                    id,
                });
                s.msgs.sort();
                s.set(e, t, Prog::Waiting(id));
            }
            Action::Timeout(e, t) => {
                let Prog::Waiting(id) = s.prog(e, t) else {
                    return None;
                };
                if s.on_its_way(e, id) {
                    s.faults_left -= 1;
                }
                s.set(e, t, Prog::Report(id, Outcome::Unknown));
            }
            Action::Report(e, t) => self.record_outcome(&mut s, e, t),
            Action::Ask(e, t, res) => {
                let Prog::Ask(id) = s.prog(e, t) else {
                    return None;
                };
                let key = s.attempts[id as usize].key;
                s.set(
                    e,
                    t,
                    Prog::Settle(Settle {
                        key,
                        res,
                        checked: None,
                    }),
                );
            }
            Action::SettleCheck(e, t) => {
                let Prog::Settle(st) = s.prog(e, t) else {
                    return None;
                };
                match self.settle_check(&s, e, st.key) {
                    Ok(id) => s.set(
                        e,
                        t,
                        Prog::Settle(Settle {
                            checked: Some(id),
                            ..st
                        }),
                    ),
                    Err(true) => s.stop(e),
                    Err(false) => s.set(e, t, Prog::Done),
                }
            }
            Action::SettleCommit(e, t) => {
                let Prog::Settle(st) = s.prog(e, t) else {
                    return None;
                };
                let next = match self.settle_commit(&mut s, e, st) {
                    Ok(Some(id)) => Prog::Call(id),
                    Ok(None) | Err(()) => Prog::Done,
                };
                s.set(e, t, next);
            }
            Action::SecondStart(e, t) => {
                let Prog::Settle(st) = s.prog(e, t) else {
                    return None;
                };
                s.seconds_left -= 1;
                s.proc_mut(e).second = Some(Settle {
                    checked: None,
                    ..st
                });
            }
            Action::SecondCheck(e) => {
                let st = s.proc(e).second?;
                match self.settle_check(&s, e, st.key) {
                    Ok(id) => {
                        s.proc_mut(e).second = Some(Settle {
                            checked: Some(id),
                            ..st
                        })
                    }
                    Err(_) => s.proc_mut(e).second = None,
                }
            }
            Action::SecondCommit(e) => {
                let st = s.proc(e).second?;
                let _ = self.settle_commit(&mut s, e, st);
                s.proc_mut(e).second = None;
            }
            Action::SelfReport(e, t) => {
                let Prog::Settle(Settle {
                    checked: Some(id), ..
                }) = s.prog(e, t)
                else {
                    return None;
                };
                s.self_reports_left -= 1;
                // record_outcome 'done' by the current tenure on its own attempt: written while unsettled and
                // not final ('unknown' may become 'done'); else a conflict, nothing written.
                let a = &mut s.attempts[id as usize];
                if a.epoch == e && a.settlement.is_none() && a.outcome == Some(Outcome::Unknown) {
                    a.outcome = Some(Outcome::Done);
                }
            }
            Action::Deliver(i, d) => self.deliver(&mut s, i, d),
            Action::Drop(i) => {
                s.msgs.remove(i);
                s.faults_left -= 1;
            }
        }
        Some(s)
    }

    fn task_actions(&self, s: &State, e: Epoch, t: Task, out: &mut Vec<Action>) {
        match s.prog(e, t) {
            Prog::Idle | Prog::Done | Prog::Stuck => {}
            Prog::Intend => out.push(Action::Intend(e, t)),
            Prog::Call(_) => out.push(Action::Call(e, t)),
            Prog::Waiting(id) => {
                if s.faults_left > 0 || !s.on_its_way(e, id) {
                    out.push(Action::Timeout(e, t));
                }
            }
            Prog::Report(..) => out.push(Action::Report(e, t)),
            Prog::Ask(id) => {
                if s.is_applied(s.attempts[id as usize].key) {
                    out.push(Action::Ask(e, t, Resolution::Confirmed));
                } else {
                    out.push(Action::Ask(e, t, Resolution::Retried));
                    if self.cfg.abandon {
                        out.push(Action::Ask(e, t, Resolution::Abandoned));
                    }
                }
            }
            Prog::Settle(st) => {
                if let Some(id) = st.checked {
                    let a = &s.attempts[id as usize];
                    if s.self_reports_left > 0
                        && e == s.current
                        && a.epoch == e
                        && a.outcome == Some(Outcome::Unknown)
                        && s.is_applied(a.key)
                    {
                        out.push(Action::SelfReport(e, t));
                    }
                }
                out.push(match st.checked {
                    None => Action::SettleCheck(e, t),
                    Some(_) => Action::SettleCommit(e, t),
                });
                let p = s.proc(e);
                if st.res == Resolution::Confirmed && s.seconds_left > 0 && p.second.is_none() {
                    out.push(Action::SecondStart(e, t));
                }
            }
        }
    }
}

impl Model for Effects {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            current: 1,
            attempts: Vec::new(),
            procs: vec![Proc {
                progs: vec![Prog::Idle; self.cfg.tasks as usize],
                stopped: false,
                second: None,
            }],
            msgs: Vec::new(),
            applied: Vec::new(),
            delivered: Vec::new(),
            faults_left: self.cfg.faults,
            seconds_left: self.cfg.double_settles,
            self_reports_left: self.cfg.self_reports,
            stale_commit: false,
            late_changed: false,
            late_after_settle: false,
            late_apply: false,
            retry_applied: false,
            abandoned_applied: false,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        if s.current <= self.cfg.handovers {
            out.push(Action::Supersede);
        }
        for e in self.epochs(s) {
            let p = s.proc(e);
            if p.progs.iter().all(|g| *g == Prog::Idle) {
                out.push(Action::List(e));
                continue;
            }
            for t in 0..self.cfg.tasks {
                self.task_actions(s, e, t, out);
            }
            match p.second {
                Some(Settle { checked: None, .. }) => out.push(Action::SecondCheck(e)),
                Some(_) => out.push(Action::SecondCommit(e)),
                None => {}
            }
        }
        for (i, m) in s.msgs.iter().enumerate() {
            if i > 0 && s.msgs[i - 1] == *m {
                continue; // the same request twice: one choice
            }
            out.push(Action::Deliver(i, Delivery::Applied { reply_lost: false }));
            if s.faults_left == 0 {
                continue;
            }
            let t = s.attempts[m.id as usize].task;
            if s.prog(m.from, t) == Prog::Waiting(m.id) {
                out.push(Action::Deliver(i, Delivery::Applied { reply_lost: true }));
            }
            if self.cfg.engine_fails && !s.is_applied(m.key) {
                out.push(Action::Deliver(i, Delivery::Fails));
            }
            out.push(Action::Drop(i));
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        self.step(last, action)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties()
    }

    fn format_action(&self, action: &Action) -> String {
        describe(action)
    }
}

/// A final state: no action left (the last tenure has finished its work, every request is delivered or lost).
pub fn is_final(m: &Effects, s: &State) -> bool {
    let mut a = Vec::new();
    m.actions(s, &mut a);
    a.is_empty()
}

pub const SETTLED_ONCE: &str = "an attempt is settled at most once";
pub const FENCED: &str =
    "no ledger write (intent, outcome, settle) commits from a tenure that had ended";
pub const ONE_KEY: &str = "no task's effect is applied by the engine under two effect keys";
pub const LEDGER_TRUE: &str =
    "a 'done' outcome or a 'confirmed' settlement names a key the engine applied";
pub const LATE_INERT: &str =
    "a late report changes no attempt (outcome, settlement) and is kept only for its own tenure's attempt";
pub const NO_LOST_INTENT: &str =
    "in a final state every intent has a final outcome (done, failed) or a settlement";
pub const SETTLED_IN_DOUBT: &str =
    "an attempt is settled only in doubt: no attempt with a final outcome (done, failed) is settled";
pub const EXACTLY_ONCE: &str = "in a final state every task's effect was applied by the engine exactly once, under its one key, and its last attempt is done or confirmed — or abandoned while the engine had not applied it";

pub const S_LATE_AFTER_SETTLE: &str =
    "example: an ended tenure's late report arrives after its attempt was settled";
pub const S_RETRY_APPLIED: &str =
    "example: the attempt a settle 'retried' recorded is applied by the engine";
pub const S_TWO_SUCCESSORS: &str =
    "example: one successor lists an effect in doubt and ends before settling it; the next one settles it";
pub const S_LATE_APPLY: &str = "example: the engine applies a request after its tenure ended";
pub const S_DEDUPED: &str =
    "example: the engine receives a key twice (a retry and the ended tenure's request) and applies it once";
pub const S_CONFIRMED: &str =
    "example: a successor confirms an effect whose tenure ended without its outcome (the engine had applied it)";
pub const S_OWN_UNKNOWN: &str =
    "example: a tenure settles the attempt it recorded 'unknown' itself";
pub const S_SELF_REPORT: &str =
    "example: a tenure's own 'done' for its 'unknown' attempt commits between its settle's pre-checks and UPDATE";
pub const S_ABANDONED_APPLIED: &str =
    "example: an effect abandoned when the engine had not applied it is applied afterwards by a request in flight";

pub fn properties() -> Vec<Property<Effects>> {
    vec![
        Property::always(SETTLED_ONCE, |_: &Effects, s: &State| {
            s.attempts.iter().all(|a| a.settles <= 1)
        }),
        Property::always(FENCED, |_: &Effects, s: &State| !s.stale_commit),
        Property::always(SETTLED_IN_DOUBT, |_: &Effects, s: &State| {
            s.attempts.iter().all(|a| {
                a.settlement.is_none() || matches!(a.outcome, None | Some(Outcome::Unknown))
            })
        }),
        Property::always(ONE_KEY, |m: &Effects, s: &State| {
            (0..m.cfg.tasks).all(|t| s.applied_for(t) <= 1)
        }),
        Property::always(LEDGER_TRUE, |_: &Effects, s: &State| {
            s.attempts.iter().all(|a| {
                !(a.outcome == Some(Outcome::Done)
                    || matches!(a.settlement, Some((Resolution::Confirmed, _))))
                    || s.is_applied(a.key)
            })
        }),
        Property::always(LATE_INERT, |_: &Effects, s: &State| !s.late_changed),
        Property::always(NO_LOST_INTENT, |m: &Effects, s: &State| {
            !is_final(m, s) || s.nothing_open()
        }),
        Property::always(EXACTLY_ONCE, |m: &Effects, s: &State| {
            !is_final(m, s)
                || (0..m.cfg.tasks).all(|t| {
                    let Some(last) = s.latest_of_task(t) else {
                        return false;
                    };
                    let abandoned = matches!(last.settlement, Some((Resolution::Abandoned, _)));
                    let ok = last.outcome == Some(Outcome::Done)
                        || matches!(last.settlement, Some((Resolution::Confirmed, _)));
                    (abandoned && s.applied_for(t) <= 1) || (ok && s.applied_for(t) == 1)
                })
        }),
        Property::sometimes(S_LATE_AFTER_SETTLE, |_: &Effects, s: &State| {
            s.late_after_settle
        }),
        Property::sometimes(S_RETRY_APPLIED, |_: &Effects, s: &State| s.retry_applied),
        Property::sometimes(S_TWO_SUCCESSORS, |_: &Effects, s: &State| {
            s.attempts.iter().any(|a| match a.settlement {
                Some((_, by)) => (a.epoch + 1..by).any(|mid| a.listed_by & (1 << mid) != 0),
                None => false,
            })
        }),
        Property::sometimes(S_LATE_APPLY, |_: &Effects, s: &State| s.late_apply),
        Property::sometimes(S_DEDUPED, |_: &Effects, s: &State| {
            s.delivered.iter().any(|&(_, c)| c >= 2)
        }),
        Property::sometimes(S_CONFIRMED, |_: &Effects, s: &State| {
            s.attempts.iter().any(|a| {
                a.outcome.is_none() && matches!(a.settlement, Some((Resolution::Confirmed, _)))
            })
        }),
        Property::sometimes(S_OWN_UNKNOWN, |_: &Effects, s: &State| {
            s.attempts.iter().any(|a| {
                a.outcome == Some(Outcome::Unknown)
                    && matches!(a.settlement, Some((_, by)) if by == a.epoch)
            })
        }),
        Property::sometimes(S_SELF_REPORT, |_: &Effects, s: &State| {
            s.self_reports_left == 0
                && s.attempts
                    .iter()
                    .any(|a| a.outcome == Some(Outcome::Done) && a.epoch == s.current)
        }),
        Property::sometimes(S_ABANDONED_APPLIED, |_: &Effects, s: &State| {
            s.abandoned_applied
        }),
    ]
}

/// The always properties (what a weakened model must break at least one of).
pub fn safety_names(m: &Effects) -> Vec<&'static str> {
    m.properties()
        .into_iter()
        .filter(|p| p.expectation == stateright::Expectation::Always)
        .map(|p| p.name)
        .collect()
}

fn res(r: Resolution) -> &'static str {
    match r {
        Resolution::Confirmed => "confirmed",
        Resolution::Retried => "retried",
        Resolution::Abandoned => "abandoned",
    }
}

/// An action as a trace line.
pub fn describe(action: &Action) -> String {
    match *action {
        Action::Supersede => "pgfence.acquire: the next tenure starts, the current one ends (its settles past their guard roll back)".into(),
        Action::List(e) => format!("tenure {e}: pgfence.in_doubt_effects + the task rows (its work list)"),
        Action::Intend(e, t) => format!("tenure {e}: pgfence.record_intent task {t} (guarded)"),
        Action::Call(e, t) => format!("tenure {e}: calls the engine for task {t} with the attempt's effect key"),
        Action::Timeout(e, t) => format!("tenure {e}: no reply for task {t}: times out (outcome 'unknown')"),
        Action::Report(e, t) => format!("tenure {e}: pgfence.record_outcome task {t} (guarded; if refused: _keep_late_report)"),
        Action::Ask(e, t, r) => format!("tenure {e}: asks the engine by task {t}'s key: decides '{}'", res(r)),
        Action::SettleCheck(e, t) => format!("tenure {e}: pgfence.settle_effect task {t}: guard, _last_attempt, in doubt?"),
        Action::SettleCommit(e, t) => format!("tenure {e}: settle_effect task {t}: UPDATE … WHERE settlement IS NULL AND still in doubt (+ retry INSERT); COMMIT"),
        Action::SecondStart(e, t) => format!("tenure {e}: a second worker settles task {t} 'confirmed' too"),
        Action::SecondCheck(e) => format!("tenure {e}: the second worker's settle_effect: guard, _last_attempt, in doubt?"),
        Action::SelfReport(e, t) => format!("tenure {e}: another worker's pgfence.record_outcome 'done' for task {t}'s attempt (the timed-out call's reply came after all)"),
        Action::SecondCommit(e) => format!("tenure {e}: the second worker's UPDATE … WHERE settlement IS NULL; COMMIT"),
        Action::Deliver(i, Delivery::Applied { reply_lost }) => format!(
            "engine: receives request #{i}, applies its key (or dedupes){}",
            if reply_lost { "; the reply is LOST" } else { "; replies" }
        ),
        Action::Deliver(i, Delivery::Fails) => format!("engine: receives request #{i} and fails it (not applied)"),
        Action::Drop(i) => format!("request #{i} is lost on the way"),
    }
}

/// The steps of `path` up to the first state that breaks the property `name`.
pub fn until_broken(model: &Effects, path: &Path<State, Action>, name: &str) -> Steps {
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
pub fn render(steps: &Steps) -> String {
    let mut out = String::new();
    for (i, (state, action)) in steps.iter().enumerate() {
        if i == 0 {
            let _ = writeln!(out, "   0. start: {}", summary(state));
        }
        if let Some(a) = action {
            let _ = writeln!(out, "  {:>2}. {}", i + 1, describe(a));
            if let Some((next, _)) = steps.get(i + 1) {
                let _ = writeln!(out, "      -> {}", summary(next));
            }
        }
    }
    out
}

fn summary(s: &State) -> String {
    let attempts: Vec<String> = s
        .attempts
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let mut t = format!(
                "#{i} task {} key {}.{} attempt {} epoch {} {}",
                a.task,
                a.key.task,
                a.key.gen,
                a.n,
                a.epoch,
                a.outcome.map_or("open".into(), |o| format!("{o:?}"))
            );
            if let Some((r, by)) = a.settlement {
                let _ = write!(t, " {} by {by}", res(r));
            }
            if let Some(l) = a.late {
                let _ = write!(t, " late:{l:?}");
            }
            t
        })
        .collect();
    let procs: Vec<String> = s
        .procs
        .iter()
        .enumerate()
        .map(|(i, p)| {
            format!(
                "{}{}{:?}{}",
                i + 1,
                if p.stopped { " stopped " } else { " " },
                p.progs,
                p.second.map_or(String::new(), |x| format!(" second {x:?}"))
            )
        })
        .collect();
    format!(
        "current {} | effects: [{}] | engine applied {:?}, in flight {:?} | tenures: {}",
        s.current,
        attempts.join("; "),
        s.applied
            .iter()
            .map(|k| format!("{}.{}", k.task, k.gen))
            .collect::<Vec<_>>(),
        s.msgs
            .iter()
            .map(|m| format!("{}.{} from {}", m.key.task, m.key.gen, m.from))
            .collect::<Vec<_>>(),
        procs.join("; ")
    )
}
