//! The pgfence protocol as a state machine: one lease, its row, its guard lock, the database clock, the
//! WAL timeline, holder processes (a control connection for acquire/renew/release and a writer connection for
//! guarded writes each), an operator (force_release) and a promotion of an asynchronous standby.
//!
//! Every action names the SQL function and the lock it stands for (`migrations/…_lease_protocol/up.sql` and
//! `migrations/…_guard/up.sql`, and `src/lease/` / `src/leader/` for the holder side). A change to the guard or to the lease protocol changes
//! this file in the same commit.
//!
//! Granularity: one action is one SQL statement (or one indivisible part of a function between two lock
//! requests), so every interleaving of other sessions between two statements is explored. The database clock
//! (`clock_timestamp()`) is a counter that only moves forward by `Tick`; a holder's monotonic clock is the
//! database clock, possibly running slow by `drift` ticks over a ttl (the dangerous direction).

use std::fmt::Write as _;

use stateright::{Model, Property};

/// Database clock ticks (`clock_timestamp()`, discrete).
pub type Tick = u8;
/// A lease epoch (`pgfence.leases.epoch`).
pub type Epoch = u16;
/// A holder process (holder name and login role: every process has its own).
pub type Pid = u8;

/// A deliberate weakening of the protocol: the model must find a counterexample for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Weakening {
    /// `_guard` never takes the shared guard lock (`pg_try_advisory_xact_lock_shared` / `_await_takeover`).
    GuardWithoutLock,
    /// `_take_guard_lock` takes no intent lock (the previous protocol): a takeover whose wait for the guard lock
    /// runs out after the grace leaves the lock queue, and the writes queued behind it are granted.
    TakeoverWithoutIntentLock,
    /// `_guard`'s fast path takes the guard lock without probing the intent lock: a write arriving while a
    /// takeover ends the holders (not queued for the guard lock then) takes it.
    FastPathWithoutIntentProbe,
    /// `_admit` (the guard's fast path) reads the lease without taking the guard lock it remembers.
    AdmitWithoutLock,
    /// `_guard` re-checks the secret after the lock only when the pre-check did not match it (the previous
    /// condition `secret_ok IS NOT TRUE`, without `OR l.epoch IS DISTINCT FROM seen`): with
    /// `SupersededAcceptsPrevious`, a write that waited through a re-acquisition is judged by the epoch alone.
    SecretRecheckOnlyIfUnchecked,
    /// `_take_guard_lock` returns at once: acquire, release and force_release never take the guard lock
    /// EXCLUSIVE.
    TakeoverWithoutExclusiveLock,
    /// `_loss_reason`: `p_epoch < l.epoch - 1` (the epoch just below the current one is taken for current).
    SupersededAcceptsPrevious,
    /// `_loss_reason`: `p_epoch <= l.epoch` (the current epoch is refused as superseded).
    SupersededRefusesCurrent,
    /// `_secret_matches` accepts any secret (with `SupersededAcceptsPrevious`: the secret no longer backs the
    /// epoch comparison up).
    SecretNotChecked,
    /// `_loss_reason` forgets `l.timeline < p_timeline` ('failover') and `_held_by_other` forgets
    /// `l.timeline >= p_timeline`: tenures of older timelines are accepted after a promotion.
    FailoverBoundaryRemoved,
    /// `_take_guard_lock` waits for the guard holders without bound (no grace, nobody terminated).
    TakeoverWithoutGrace,
    /// `pgfence.acquire` issues `epoch + 1` without the jump to `(timeline - 1) * 2^32 + 1`.
    NoEpochJump,
    /// The holder trusts its lease until send time + ttl (`trust_until` without `- margin`).
    DeadlineWithoutMargin,
    /// The holder anchors its deadline at the time the reply arrived instead of the send time.
    DeadlineFromReceive,
}

/// The bounds of one exploration, and the weakenings applied.
#[derive(Clone, Debug)]
pub struct Config {
    /// Holder processes (each a control connection and a writer connection).
    pub holders: u8,
    /// Per holder: calls of pgfence.acquire (retries included).
    pub acquires: u8,
    /// Per holder: calls of pgfence.renew.
    pub renews: u8,
    /// Per holder: calls of pgfence.release.
    pub releases: u8,
    /// Per holder: guarded writes (pgfence.fence + a write + COMMIT; retries included).
    pub writes: u8,
    /// Calls of pgfence.force_release by the operator.
    pub force_releases: u8,
    /// Promotions of an asynchronous standby.
    pub promotions: u8,
    /// How many committed transactions a promotion may lose at most (the standby's lag).
    pub max_lag: u8,
    /// Lease ttl (`p_ttl_ms`), in ticks.
    pub ttl: Tick,
    /// The holder's safety margin (`LeaseOptions::margin`), in ticks.
    pub margin: Tick,
    /// How far a holder's monotonic clock may run slow over a ttl, in ticks (must be ≤ margin).
    pub drift: Tick,
    /// `instance.takeover_grace_ms`, in ticks.
    pub grace: Tick,
    /// The 1 s lock wait of each termination round of `_take_guard_lock`, in ticks.
    pub round: Tick,
    /// Termination rounds of `_take_guard_lock` (3) before it fails with PF003.
    pub rounds: u8,
    /// The database clock stops here (bounds the exploration).
    pub max_clock: Tick,
    /// The epoch jump per timeline (2^32 in the SQL; scaled down: more acquisitions than this per timeline
    /// would break the jump, as 2^32 would).
    pub epochs_per_timeline: Epoch,
    /// Weakenings applied (none: the protocol as built).
    pub weakenings: Vec<Weakening>,
}

impl Config {
    /// Everything at once: two holders that acquire, renew, release and write once each, an operator's
    /// force_release, a promotion losing up to two commits, clock 0..=4, ttl 2, margin = drift = grace = 1.
    /// Too large for every `cargo test`: the large configuration.
    pub fn large() -> Config {
        Config {
            holders: 2,
            acquires: 1,
            renews: 1,
            releases: 1,
            writes: 1,
            force_releases: 1,
            promotions: 1,
            max_lag: 2,
            ttl: 2,
            margin: 1,
            drift: 1,
            grace: 1,
            round: 1,
            rounds: 3,
            max_clock: 4,
            epochs_per_timeline: 8,
            weakenings: Vec::new(),
        }
    }

    /// Takeovers of an expired lease against guarded writes, renewals and local deadlines (no release, no
    /// force_release, no promotion).
    pub fn takeover() -> Config {
        Config {
            releases: 0,
            force_releases: 0,
            promotions: 0,
            ..Config::large()
        }
    }

    /// Lost replies and retries: a holder whose acquisition reply was lost acquires again (a new epoch), a
    /// writer whose acknowledgement was lost writes again (no release, force_release or promotion; clock 0..=3).
    pub fn retries() -> Config {
        Config {
            acquires: 2,
            writes: 2,
            renews: 0,
            releases: 0,
            force_releases: 0,
            promotions: 0,
            max_clock: 3,
            ..Config::large()
        }
    }

    /// The operator's force_release of a live tenure against guarded writes and a successor.
    pub fn force_release() -> Config {
        Config {
            renews: 0,
            releases: 0,
            promotions: 0,
            ..Config::large()
        }
    }

    /// A holder's release against its own guarded writes and a successor (clock 0..=3).
    pub fn release() -> Config {
        Config {
            renews: 0,
            force_releases: 0,
            promotions: 0,
            max_clock: 3,
            ..Config::large()
        }
    }

    /// A promotion losing up to two commits, with a force_release and a successor (clock 0..=3).
    pub fn promotion() -> Config {
        Config {
            renews: 0,
            releases: 0,
            max_clock: 3,
            ..Config::large()
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

/// One committed transaction. `hist` keeps every commit ever made, in commit order, lost ones included.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Commit {
    /// pgfence.acquire: the lease row now names `holder`, `epoch`, state 'held', `expires_at`, `timeline`.
    /// The tenure secret is the index of this entry in `hist` (unique per acquisition).
    Acquire {
        holder: Pid,
        epoch: Epoch,
        expires: Tick,
        timeline: u8,
    },
    /// pgfence.renew: `expires_at` moved.
    Renew { epoch: Epoch, expires: Tick },
    /// pgfence.release: state 'released', `expires_at = LEAST(expires_at, ts)`.
    Release { epoch: Epoch, at: Tick },
    /// pgfence.force_release: same as release, for whatever tenure is current.
    ForceRelease { epoch: Epoch, at: Tick },
    /// A guarded write presenting `epoch` (granted on `tenure_timeline`), committed on `timeline`.
    Write {
        epoch: Epoch,
        tenure_timeline: u8,
        timeline: u8,
    },
}

/// A commit and whether a promotion lost it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    pub commit: Commit,
    /// Lost with the old primary's tail by a promotion.
    pub lost: bool,
    /// Ghost: the client was told it committed (a write's reply arrived).
    pub acked: bool,
}

/// `_loss_reason` (and the secret check of `_guard`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    UnknownLease,
    Superseded,
    FutureEpoch,
    HolderMismatch,
    Released,
    Failover,
    Expired,
    BadSecret,
}

/// The lease row (`pgfence.leases` + `pgfence.tenure_secrets`) as the surviving history leaves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    pub epoch: Epoch,
    pub holder: Option<Pid>,
    pub held: bool,
    pub expires: Tick,
    pub timeline: u8,
    /// The current tenure's secret (index of its Acquire entry).
    pub secret: Option<usize>,
}

/// A session of the database, as the lock manager knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Conn {
    /// A holder's control connection (acquire, renew, release); the operator's is `Control(holders)`.
    Control(Pid),
    /// A holder's writer connection (guarded writes).
    Writer(Pid),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    Shared,
    Exclusive,
}

/// The lease's guard lock: the transaction-level advisory lock (`GUARD_LOCK_CLASS`, lock_key), with PostgreSQL's
/// heavyweight lock queue (a request waits if it conflicts with a granted lock or with an earlier waiter).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct GuardLock {
    pub granted: Vec<(Conn, Mode)>,
    pub queue: Vec<(Conn, Mode)>,
}

/// What a holder knows of a tenure it was granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tenure {
    pub epoch: Epoch,
    pub secret: usize,
    pub timeline: u8,
}

/// A change of who may write: the three functions that take the lease row lock and then the guard lock
/// EXCLUSIVE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Change {
    Acquire,
    Release(Tenure),
    ForceRelease,
}

/// Where a call of acquire / release / force_release is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Queued for the lease row lock (`_lock_lease_row`, FOR NO KEY UPDATE).
    RowLockWait,
    /// Holds the row lock; queued for the guard lock EXCLUSIVE since `since`, in termination round `round`.
    /// `live`: the tenure being ended was live when the row lock was granted.
    GuardWait {
        since: Tick,
        round: u8,
        live: bool,
        started: Tick,
    },
    /// The wait timed out (lock_not_available): the request has left the queue; the guard holders are read and
    /// terminated next.
    GuardTimedOut {
        round: u8,
        live: bool,
        started: Tick,
    },
    /// The guard holders were terminated; the request is queued again next.
    GuardTerminated {
        round: u8,
        live: bool,
        started: Tick,
    },
    /// Holds the row lock and the guard lock EXCLUSIVE: the change commits next.
    GuardGranted,
}

/// A reply on a control connection (in flight until delivered or lost).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ControlReply {
    Acquired(Tenure),
    Held,
    Renewed,
    Lost,
    Released,
    NotHeld,
    /// PF003, or the connection was terminated.
    Failed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ControlOp {
    Idle,
    Call {
        change: Change,
        sent: Tick,
        stage: Stage,
    },
    Reply {
        reply: ControlReply,
        sent: Tick,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteReply {
    /// Committed: `hist[entry]`.
    Ok(usize),
}

/// What `_guard`'s unlocked pre-check found, kept for the fresh read: whether it matched the secret
/// (`secret_ok`, decided only when tenure_secrets named the presented epoch) and the epoch it read (`seen`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pre {
    pub secret_ok: bool,
    pub seen: Epoch,
}

/// Where a guarded write is (pgfence.fence / the task functions, then the write, then COMMIT).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteOp {
    Idle,
    /// The unlocked pre-check passed; the intent probe and the shared lock request come next.
    PreChecked(Tenure, Pre),
    /// `_await_takeover`: waits for the intent lock (a takeover in flight) to be free, then tries the guard lock.
    AwaitTakeover(Tenure, Pre),
    /// `_await_takeover`: holds the guard lock SHARED; the intent probe comes next (taken: give the guard lock
    /// back and wait again).
    Probing(Tenure, Pre),
    /// Holds the guard lock SHARED; the fresh read comes next.
    Locked(Tenure, Pre),
    /// The fresh read passed (lock still held): the write and COMMIT come next.
    Passed(Tenure),
    Reply(WriteReply),
}

/// A holder process (or the operator).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Holder {
    /// Its monotonic clock runs `drift` slow.
    pub slow: bool,
    /// The last tenure an acquisition reply told it about.
    pub tenure: Option<Tenure>,
    /// The database-clock instant its local deadline (last good send + ttl − margin, on its own clock) stands
    /// for.
    pub trust_until: Tick,
    /// It learned that its tenure ended (renewal 'lost', or it released).
    pub ended: bool,
    pub control: ControlOp,
    pub writer: WriteOp,
    pub acquires: u8,
    pub renews: u8,
    pub releases: u8,
    pub writes: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub clock: Tick,
    pub timeline: u8,
    pub hist: Vec<Entry>,
    /// The session holding the lease row lock across statements (a takeover).
    pub row_lock: Option<Pid>,
    pub guard: GuardLock,
    /// The session holding the lease's intent lock EXCLUSIVE (a takeover, from its row lock to its end). Guards
    /// take it shared only for an instant (a probe, or `_await_takeover`'s wait given back at once), so only the
    /// exclusive holder is state.
    pub intent: Option<Pid>,
    /// Holders, then the operator.
    pub holders: Vec<Holder>,
    pub promotions_left: u8,
    /// Ghost: a takeover of a lease that was not live failed with PF003.
    pub expired_takeover_failed: bool,
    /// Ghost: a takeover of a live tenure (force_release, release) failed with PF003.
    pub live_takeover_failed: bool,
    /// Ghost: a guarded transaction was terminated by a takeover after the grace.
    pub terminated_writes: bool,
    /// Ghost: a refusal's audit row gave a reason that is not the true one.
    pub inexact_refusal: Option<Reason>,
    /// Ghost: a write was refused 'failover'.
    pub failover_refused: bool,
    /// Ghost: a write was refused 'superseded' on its fresh read, after waiting for the guard lock.
    pub superseded_after_lock: bool,
    /// Ghost: a write passed its check although its intent probe came while a takeover was under way (past its
    /// row lock and queued for the guard lock, timed out, or ending holders). The model runs a write's probe, its
    /// guard-lock try and its fresh read as one step, so the probe's instant is the check's.
    pub let_in: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `clock_timestamp()` moves forward one tick.
    Tick,
    /// The asynchronous standby is promoted with the first `keep` surviving commits; a new WAL timeline
    /// (`_timeline()`); every session of the old primary is gone.
    Promote { keep: u8 },
    /// pgfence.acquire: the unlocked read of the lease row and `_held_by_other` ('held' without a lock), else
    /// queue for the row lock.
    AcquireCall(Pid),
    /// pgfence.release: the unlocked read and `_loss_reason` ('not_held' without a lock), else queue for the
    /// row lock. The holder stops trusting its tenure when it sends this.
    ReleaseCall(Pid),
    /// pgfence.force_release (the operator): the unlocked read ('released' without a lock), else queue for the
    /// row lock.
    ForceReleaseCall,
    /// `_lock_lease_row` (FOR NO KEY UPDATE) granted, the re-check on the locked row (`_held_by_other` /
    /// `_loss_reason` / state), then `_take_guard_lock`: `pg_try_advisory_xact_lock` EXCLUSIVE, else queued
    /// with lock_timeout = grace.
    LockLeaseRow(Pid),
    /// `_take_guard_lock`: the lock wait timed out (the grace, or a round's 1 s; lock_not_available): the request
    /// leaves the lock queue (waiters behind it may be granted), or PF003 after the last round.
    GuardTimeout(Pid),
    /// `_take_guard_lock`: `_guard_lockers` (pg_locks) read, then `pg_terminate_backend` of each (their
    /// transactions abort).
    TerminateHolders(Pid),
    /// `_take_guard_lock`: `pg_advisory_xact_lock` EXCLUSIVE requested again after the terminations.
    RequeueGuard(Pid),
    /// The change commits: acquire (UPDATE leases: epoch, holder, expires_at, timeline; INSERT tenures), release
    /// or force_release (state 'released'); COMMIT releases the row lock and the guard lock.
    CommitChange(Pid),
    /// pgfence.renew: `_lock_lease_row` (FOR NO KEY UPDATE), `_loss_reason`, UPDATE expires_at, COMMIT (never
    /// the guard lock). The holder's send time is this instant.
    Renew(Pid),
    /// The reply of a control call arrives (the holder updates its deadline: send time + ttl).
    DeliverControl(Pid),
    /// The reply of a control call is lost (a timeout or a broken connection: the holder learns nothing).
    LoseControl(Pid),
    /// `_guard`: the unlocked pre-check (`_loss_reason` + `_secret_matches` on a fresh read, no lock); a stale
    /// or forged fence is refused and audited (`_reject`) without the lock, and its transaction commits.
    GuardPreCheck(Pid),
    /// `_admit`, the guard's fast path (a session that remembers the lease's lock key — legitimately or forged,
    /// so it is always possible): no pre-check; the intent probe and the guard lock SHARED at once, then the
    /// fresh read, which checks the secret too (nothing of a pre-check is known). Not both free: nothing held,
    /// and `_guard` runs — its unlocked pre-check now, in the same step.
    AdmitFast(Pid),
    /// `_guard`: the intent probe (`pg_try_advisory_lock_shared` + `pg_advisory_unlock_shared` of
    /// (`GUARD_LOCK_CLASS`, -lock_key)) and `pg_try_advisory_xact_lock_shared` of the guard lock, one expression; both
    /// free: the fresh read follows; else `_await_takeover`.
    GuardLockShared(Pid),
    /// `_await_takeover`: `pg_advisory_xact_lock_shared` of the intent lock granted (the takeover ended) and
    /// given back (the first block), then `pg_try_advisory_xact_lock_shared` of the guard lock (the second):
    /// granted, or the loop goes round (`pg_sleep(0.001)`: no state changes).
    AwaitTakeover(Pid),
    /// `_await_takeover`: the intent probe after the guard lock was granted: free, the fresh read follows;
    /// taken (another takeover began), the block is rolled back (guard lock given back) and the wait begins again.
    ProbeIntent(Pid),
    /// `_guard`: the fresh read of the lease row in a new statement after the lock is granted, `_loss_reason`
    /// and `_secret_check`; a refusal is audited (`_reject`) and commits, releasing the lock.
    GuardFreshRead(Pid),
    /// The guarded write (a task function's INSERT/UPDATE, or the caller's statements after pgfence.fence)
    /// and COMMIT, which releases the shared guard lock.
    WriteCommit(Pid),
    /// The reply of a guarded write arrives.
    DeliverWrite(Pid),
    /// The reply of a guarded write is lost (the writer may retry with a new guarded write).
    LoseWrite(Pid),
}

/// The model: a configuration.
pub struct Protocol {
    pub cfg: Config,
}

/// A reply in flight, or none when it teaches the caller nothing (held, not held, released, failed: delivering
/// or losing it leaves the holder as it was).
fn reply_op(reply: ControlReply, sent: Tick) -> ControlOp {
    match reply {
        ControlReply::Acquired(_) | ControlReply::Renewed | ControlReply::Lost => {
            ControlOp::Reply { reply, sent }
        }
        ControlReply::Held
        | ControlReply::Released
        | ControlReply::NotHeld
        | ControlReply::Failed => ControlOp::Idle,
    }
}

fn conflicts(a: Mode, b: Mode) -> bool {
    a == Mode::Exclusive || b == Mode::Exclusive
}

impl State {
    /// The lease row as the surviving history leaves it.
    pub fn row(&self) -> Row {
        let mut r = Row {
            epoch: 0,
            holder: None,
            held: false,
            expires: 0,
            timeline: 0,
            secret: None,
        };
        for (i, e) in self.hist.iter().enumerate().filter(|(_, e)| !e.lost) {
            match e.commit {
                Commit::Acquire {
                    holder,
                    epoch,
                    expires,
                    timeline,
                } => {
                    r = Row {
                        epoch,
                        holder: Some(holder),
                        held: true,
                        expires,
                        timeline,
                        secret: Some(i),
                    };
                }
                Commit::Renew { expires, .. } => r.expires = expires,
                Commit::Release { at, .. } | Commit::ForceRelease { at, .. } => {
                    r.held = false;
                    r.expires = r.expires.min(at);
                }
                Commit::Write { .. } => {}
            }
        }
        r
    }

    /// Whether the holder may still believe it holds its tenure (`HeldLease::believed_held`: not ended, before
    /// the local deadline).
    pub fn believes(&self, p: Pid) -> bool {
        let h = &self.holders[p as usize];
        h.tenure.is_some() && !h.ended && self.clock < h.trust_until
    }

    fn commit(&mut self, commit: Commit) -> usize {
        self.hist.push(Entry {
            commit,
            lost: false,
            acked: false,
        });
        self.hist.len() - 1
    }
}

impl Protocol {
    fn operator(&self) -> Pid {
        self.cfg.holders
    }

    /// `_loss_reason(l, p_holder, p_epoch, ts, p_timeline)`.
    fn loss_reason(
        &self,
        row: &Row,
        holder: Option<Pid>,
        epoch: Epoch,
        ts: Tick,
        tl: u8,
    ) -> Option<Reason> {
        let superseded = if self.cfg.weak(Weakening::SupersededAcceptsPrevious) {
            epoch + 1 < row.epoch
        } else if self.cfg.weak(Weakening::SupersededRefusesCurrent) {
            epoch <= row.epoch
        } else {
            epoch < row.epoch
        };
        if row.secret.is_none() {
            // No acquisition survives: no lease row.
            return Some(Reason::UnknownLease);
        }
        if superseded {
            Some(Reason::Superseded)
        } else if epoch > row.epoch {
            Some(Reason::FutureEpoch)
        } else if holder.is_some() && row.holder != holder {
            Some(Reason::HolderMismatch)
        } else if !row.held {
            Some(Reason::Released)
        } else if !self.cfg.weak(Weakening::FailoverBoundaryRemoved) && row.timeline < tl {
            Some(Reason::Failover)
        } else if row.expires <= ts {
            Some(Reason::Expired)
        } else {
            None
        }
    }

    /// `_held_by_other(l, p_holder, ts, p_timeline)`.
    fn held_by_other(&self, row: &Row, p: Pid, ts: Tick, tl: u8) -> bool {
        row.held
            && row.expires > ts
            && row.holder != Some(p)
            && (self.cfg.weak(Weakening::FailoverBoundaryRemoved) || row.timeline >= tl)
    }

    /// `_secret_check` / `_secret_matches`: the tenure_secrets row names the presented epoch and its hash is
    /// the presented secret's ('ok'); otherwise refused.
    fn secret_ok(&self, row: &Row, t: &Tenure) -> bool {
        if self.cfg.weak(Weakening::SecretNotChecked) {
            return true;
        }
        row.epoch == t.epoch && row.secret == Some(t.secret)
    }

    /// The guard's pre-check (`_guard`: `why := _loss_reason(l, NULL, p_epoch, …)`, then
    /// `IF why IS NULL AND pre.secret_epoch = p_epoch THEN secret_ok := _secret_matches(…)`): the secret is decided
    /// only when tenure_secrets names the presented epoch. Returns the refusal, or what the fresh read needs.
    fn pre_check(&self, s: &State, t: &Tenure) -> Result<Pre, Reason> {
        let row = s.row();
        if let Some(why) = self.loss_reason(&row, None, t.epoch, s.clock, s.timeline) {
            return Err(why);
        }
        let decided = row.epoch == t.epoch;
        let secret_ok = decided && self.secret_ok(&row, t);
        if decided && !secret_ok {
            return Err(Reason::BadSecret);
        }
        Ok(Pre {
            secret_ok,
            seen: row.epoch,
        })
    }

    /// The guard's fresh read after the lock (`_guard`: `why := _loss_reason(l, NULL, p_epoch, …)`, then
    /// `IF why IS NULL AND (secret_ok IS NOT TRUE OR l.epoch IS DISTINCT FROM seen) AND _secret_check(…) IS
    /// DISTINCT FROM 'ok' THEN why := 'bad_secret'`).
    fn fresh_read(&self, s: &State, t: &Tenure, pre: &Pre) -> Option<Reason> {
        let row = s.row();
        self.loss_reason(&row, None, t.epoch, s.clock, s.timeline)
            .or_else(|| {
                let recheck = !pre.secret_ok
                    || (!self.cfg.weak(Weakening::SecretRecheckOnlyIfUnchecked)
                        && row.epoch != pre.seen);
                (recheck && !self.secret_ok(&row, t)).then_some(Reason::BadSecret)
            })
    }

    /// Whether a takeover is under way: past its row lock (so holding the intent lock) and not yet holding the
    /// guard lock EXCLUSIVE.
    fn takeover_under_way(&self, s: &State) -> bool {
        s.holders.iter().any(|h| {
            matches!(
                h.control,
                ControlOp::Call {
                    stage: Stage::GuardWait { .. }
                        | Stage::GuardTimedOut { .. }
                        | Stage::GuardTerminated { .. },
                    ..
                }
            )
        })
    }

    /// The intent probe: free unless a takeover holds the intent lock (another session's; the caller's own
    /// never conflicts).
    fn intent_free(&self, s: &State) -> bool {
        s.intent.is_none()
    }

    fn grantable(&self, s: &State, conn: Conn, mode: Mode) -> bool {
        // PostgreSQL checks the waiters' modes too (LockAcquireExtended: conflictTab & waitMask), also for a
        // try-lock: a shared request never overtakes a waiting exclusive one.
        !s.guard
            .granted
            .iter()
            .any(|&(c, m)| c != conn && conflicts(m, mode))
            && !s.guard.queue.iter().any(|&(_, m)| conflicts(m, mode))
    }

    /// The lock manager's wakeup after a release (ProcLockWakeup): grant waiters in queue order that conflict
    /// neither with granted locks nor with earlier waiters still waiting.
    fn wakeup(&self, s: &mut State) {
        let mut ahead: Vec<Mode> = Vec::new();
        let mut i = 0;
        while i < s.guard.queue.len() {
            let (conn, mode) = s.guard.queue[i];
            let blocked = s
                .guard
                .granted
                .iter()
                .any(|&(c, m)| c != conn && conflicts(m, mode))
                || ahead.iter().any(|&m| conflicts(m, mode));
            if blocked {
                ahead.push(mode);
                i += 1;
            } else {
                s.guard.queue.remove(i);
                s.guard.granted.push((conn, mode));
                self.granted(s, conn);
            }
        }
    }

    /// A queued request was granted: its session goes on.
    fn granted(&self, s: &mut State, conn: Conn) {
        match conn {
            Conn::Control(p) => {
                if let ControlOp::Call { stage, .. } = &mut s.holders[p as usize].control {
                    *stage = Stage::GuardGranted;
                }
            }
            Conn::Writer(_) => {
                // A guard never queues for the guard lock: the fast path and `_await_takeover` only try it.
            }
        }
    }

    fn release_guard(&self, s: &mut State, conn: Conn) {
        s.guard.granted.retain(|&(c, _)| c != conn);
        s.guard.queue.retain(|&(c, _)| c != conn);
        self.wakeup(s);
    }

    /// `_take_guard_lock`'s first request, on behalf of the session holding the row lock.
    fn request_exclusive(
        &self,
        s: &mut State,
        p: Pid,
        round: u8,
        live: bool,
        started: Tick,
    ) -> Stage {
        let conn = Conn::Control(p);
        if self.cfg.weak(Weakening::TakeoverWithoutExclusiveLock)
            || self.grantable(s, conn, Mode::Exclusive)
        {
            if !self.cfg.weak(Weakening::TakeoverWithoutExclusiveLock) {
                s.guard.granted.push((conn, Mode::Exclusive));
            }
            Stage::GuardGranted
        } else {
            s.guard.queue.push((conn, Mode::Exclusive));
            Stage::GuardWait {
                since: s.clock,
                round,
                live,
                started,
            }
        }
    }

    /// Ends a control call with a reply, releasing what it holds.
    fn finish_control(&self, s: &mut State, p: Pid, reply: ControlReply, sent: Tick) {
        if s.row_lock == Some(p) {
            s.row_lock = None;
        }
        if s.intent == Some(p) {
            s.intent = None;
        }
        self.release_guard(s, Conn::Control(p));
        s.holders[p as usize].control = reply_op(reply, sent);
    }

    /// A guarded write is refused: `_reject` writes the audit row and the transaction commits (releasing the
    /// shared lock if held).
    fn refuse(&self, s: &mut State, p: Pid, t: &Tenure, reason: Reason) {
        let current = s.row().epoch;
        // The audit row commits with the refusal; what the checker keeps of it is whether its reason is exact
        // (every writer of the model presents the secret it was given, so 'bad_secret' is never exact).
        let exact = match reason {
            Reason::Superseded => t.epoch < current,
            Reason::BadSecret => false,
            _ => true,
        };
        if !exact {
            s.inexact_refusal = Some(reason);
        }
        if reason == Reason::Failover {
            s.failover_refused = true;
        }
        if reason == Reason::Superseded
            && matches!(s.holders[p as usize].writer, WriteOp::Locked(..))
        {
            s.superseded_after_lock = true;
        }
        self.release_guard(s, Conn::Writer(p));
        // The refusal's reply teaches the writer nothing the model uses.
        s.holders[p as usize].writer = WriteOp::Idle;
    }

    /// Whether a timeout is due: the clock cannot pass it (a lock_timeout fires on time, and the statements
    /// of a running function take no clock time between two lock waits).
    fn timeout_due(&self, s: &State) -> bool {
        if self.cfg.weak(Weakening::TakeoverWithoutGrace) {
            return false;
        }
        s.holders.iter().any(|h| match h.control {
            ControlOp::Call {
                stage: Stage::GuardWait { since, round, .. },
                ..
            } => s.clock >= since + self.wait_limit(round),
            ControlOp::Call {
                stage: Stage::GuardTimedOut { .. } | Stage::GuardTerminated { .. },
                ..
            } => true,
            _ => false,
        })
    }

    fn wait_limit(&self, round: u8) -> Tick {
        if round == 0 {
            self.cfg.grace
        } else {
            self.cfg.round
        }
    }

    /// The longest a takeover may wait for the guard lock once it holds the row lock: the grace. After it, the
    /// holders are ended once and no new one can appear (every guard finds the intent lock taken), so the next
    /// request is granted at once (the SQL's 1 s per round is the ended backends' exit, instant here).
    pub fn takeover_bound(&self) -> Tick {
        self.cfg.grace
    }

    /// The instant (database clock) at which a holder stops trusting its tenure: `HeldLease::trust_until`,
    /// anchor + ttl − margin on its own clock, which reads `drift` less than the database's when it runs slow.
    fn trust_until(&self, slow: bool, anchor: Tick) -> Tick {
        let margin = if self.cfg.weak(Weakening::DeadlineWithoutMargin) {
            0
        } else {
            self.cfg.margin
        };
        let drift = if slow { self.cfg.drift } else { 0 };
        (anchor + self.cfg.ttl + drift).saturating_sub(margin)
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        // Every holder's clock is exact or `drift` slow: the first holder may be either (the others exact, to
        // keep the state space small; holders are symmetric).
        let mut inits = Vec::new();
        for slow in [false, true] {
            if slow && self.cfg.drift == 0 {
                continue;
            }
            let mut holders: Vec<Holder> = (0..self.cfg.holders)
                .map(|i| Holder {
                    slow: slow && i == 0,
                    tenure: None,
                    trust_until: 0,
                    ended: false,
                    control: ControlOp::Idle,
                    writer: WriteOp::Idle,
                    acquires: self.cfg.acquires,
                    renews: self.cfg.renews,
                    releases: self.cfg.releases,
                    writes: self.cfg.writes,
                })
                .collect();
            holders.push(Holder {
                slow: false,
                tenure: None,
                trust_until: 0,
                ended: false,
                control: ControlOp::Idle,
                writer: WriteOp::Idle,
                acquires: 0,
                renews: 0,
                releases: self.cfg.force_releases,
                writes: 0,
            });
            inits.push(State {
                clock: 0,
                timeline: 1,
                hist: Vec::new(),
                row_lock: None,
                guard: GuardLock::default(),
                intent: None,
                holders,
                promotions_left: self.cfg.promotions,
                expired_takeover_failed: false,
                live_takeover_failed: false,
                terminated_writes: false,
                inexact_refusal: None,
                failover_refused: false,
                superseded_after_lock: false,
                let_in: false,
            });
        }
        inits
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.clock < self.cfg.max_clock && !self.timeout_due(s) {
            actions.push(Action::Tick);
        }
        if s.promotions_left > 0 {
            let surviving = s.hist.iter().filter(|e| !e.lost).count();
            let lo = surviving.saturating_sub(self.cfg.max_lag as usize);
            for keep in lo..=surviving {
                actions.push(Action::Promote { keep: keep as u8 });
            }
        }
        let op = self.operator();
        for (i, h) in s.holders.iter().enumerate() {
            let p = i as Pid;
            match h.control {
                ControlOp::Idle => {
                    if p == op {
                        if h.releases > 0 {
                            actions.push(Action::ForceReleaseCall);
                        }
                    } else {
                        let believes = s.believes(p);
                        if !believes && h.acquires > 0 {
                            actions.push(Action::AcquireCall(p));
                        }
                        if believes && h.renews > 0 && s.row_lock.is_none() {
                            actions.push(Action::Renew(p));
                        }
                        if h.tenure.is_some() && !h.ended && h.releases > 0 {
                            actions.push(Action::ReleaseCall(p));
                        }
                    }
                }
                ControlOp::Call { stage, .. } => match stage {
                    Stage::RowLockWait => {
                        if s.row_lock.is_none() {
                            actions.push(Action::LockLeaseRow(p));
                        }
                    }
                    Stage::GuardWait { since, round, .. } => {
                        if s.clock >= since + self.wait_limit(round)
                            && !self.cfg.weak(Weakening::TakeoverWithoutGrace)
                        {
                            actions.push(Action::GuardTimeout(p));
                        }
                    }
                    Stage::GuardTimedOut { .. } => actions.push(Action::TerminateHolders(p)),
                    Stage::GuardTerminated { .. } => actions.push(Action::RequeueGuard(p)),
                    Stage::GuardGranted => actions.push(Action::CommitChange(p)),
                },
                ControlOp::Reply { reply, .. } => {
                    actions.push(Action::DeliverControl(p));
                    // Losing a reply that teaches nothing is the same as delivering it.
                    if matches!(
                        reply,
                        ControlReply::Acquired(_) | ControlReply::Renewed | ControlReply::Lost
                    ) {
                        actions.push(Action::LoseControl(p));
                    }
                }
            }
            if p == op {
                continue;
            }
            match h.writer {
                WriteOp::Idle => {
                    if h.tenure.is_some() && h.writes > 0 {
                        actions.push(Action::GuardPreCheck(p));
                        actions.push(Action::AdmitFast(p));
                    }
                }
                WriteOp::PreChecked(..) => actions.push(Action::GuardLockShared(p)),
                WriteOp::AwaitTakeover(..) => {
                    if self.intent_free(s) {
                        actions.push(Action::AwaitTakeover(p));
                    }
                }
                WriteOp::Probing(..) => actions.push(Action::ProbeIntent(p)),
                WriteOp::Locked(..) => actions.push(Action::GuardFreshRead(p)),
                WriteOp::Passed(_) => actions.push(Action::WriteCommit(p)),
                WriteOp::Reply(reply) => {
                    actions.push(Action::DeliverWrite(p));
                    // Only an acknowledgement changes what the writer knows (and a refusal is audited either way).
                    if matches!(reply, WriteReply::Ok(_)) {
                        actions.push(Action::LoseWrite(p));
                    }
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let s = self.step(last, action)?;
        // A call whose row lock is free takes it in the same step: whatever runs between its unlocked read
        // and the lock is judged again by the re-check on the locked row.
        if let Action::AcquireCall(p) | Action::ReleaseCall(p) = action {
            if s.row_lock.is_none()
                && matches!(s.holders[p as usize].control, ControlOp::Call { .. })
            {
                return self.step(&s, Action::LockLeaseRow(p));
            }
        }
        if action == Action::ForceReleaseCall {
            let op = self.operator();
            if s.row_lock.is_none()
                && matches!(s.holders[op as usize].control, ControlOp::Call { .. })
            {
                return self.step(&s, Action::LockLeaseRow(op));
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        crate::properties::all()
    }

    fn format_action(&self, action: &Action) -> String {
        self.describe(action)
    }
}

impl Protocol {
    /// One action, as the SQL runs it.
    fn step(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => s.clock += 1,
            Action::Promote { keep } => {
                let mut kept = 0;
                for e in s.hist.iter_mut().filter(|e| !e.lost) {
                    if kept >= keep {
                        e.lost = true;
                    } else {
                        kept += 1;
                    }
                }
                s.timeline += 1;
                s.promotions_left -= 1;
                s.row_lock = None;
                s.guard = GuardLock::default();
                s.intent = None;
                // Every session of the old primary is gone; replies already sent may still arrive.
                for h in &mut s.holders {
                    if let ControlOp::Call { .. } = h.control {
                        h.control = ControlOp::Idle;
                    }
                    if !matches!(h.writer, WriteOp::Reply(_)) {
                        h.writer = WriteOp::Idle;
                    }
                }
            }
            Action::AcquireCall(p) => {
                let h = &mut s.holders[p as usize];
                h.acquires -= 1;
                let sent = s.clock;
                let row = s.row();
                if row.epoch > 0 && self.held_by_other(&row, p, s.clock, s.timeline) {
                    s.holders[p as usize].control = reply_op(ControlReply::Held, sent);
                } else {
                    s.holders[p as usize].control = ControlOp::Call {
                        change: Change::Acquire,
                        sent,
                        stage: Stage::RowLockWait,
                    };
                }
            }
            Action::ReleaseCall(p) => {
                let h = &mut s.holders[p as usize];
                h.releases -= 1;
                h.ended = true;
                let t = h.tenure.expect("release needs a tenure");
                let sent = s.clock;
                let row = s.row();
                match self.loss_reason(&row, Some(p), t.epoch, s.clock, s.timeline) {
                    Some(Reason::Expired) | Some(Reason::Failover) | None => {
                        s.holders[p as usize].control = ControlOp::Call {
                            change: Change::Release(t),
                            sent,
                            stage: Stage::RowLockWait,
                        };
                    }
                    Some(_) => {
                        s.holders[p as usize].control = reply_op(ControlReply::NotHeld, sent);
                    }
                }
            }
            Action::ForceReleaseCall => {
                let op = self.operator();
                s.holders[op as usize].releases -= 1;
                let sent = s.clock;
                let row = s.row();
                s.holders[op as usize].control = if row.epoch == 0 || !row.held {
                    reply_op(ControlReply::NotHeld, sent)
                } else {
                    ControlOp::Call {
                        change: Change::ForceRelease,
                        sent,
                        stage: Stage::RowLockWait,
                    }
                };
            }
            Action::LockLeaseRow(p) => {
                let ControlOp::Call {
                    change,
                    sent,
                    stage: Stage::RowLockWait,
                } = s.holders[p as usize].control
                else {
                    return None;
                };
                s.row_lock = Some(p);
                let row = s.row();
                let ts = s.clock;
                // The re-check on the locked row.
                let (refused, live) = match change {
                    Change::Acquire => (
                        row.epoch > 0 && self.held_by_other(&row, p, ts, s.timeline),
                        false,
                    ),
                    Change::Release(t) => {
                        let why = self.loss_reason(&row, Some(p), t.epoch, ts, s.timeline);
                        let refused =
                            !matches!(why, None | Some(Reason::Expired) | Some(Reason::Failover))
                                || !self.secret_ok(&row, &t);
                        (refused, why.is_none())
                    }
                    Change::ForceRelease => (
                        !row.held,
                        row.held && row.expires > ts && row.timeline >= s.timeline,
                    ),
                };
                if refused {
                    let reply = if change == Change::Acquire {
                        ControlReply::Held
                    } else {
                        ControlReply::NotHeld
                    };
                    self.finish_control(&mut s, p, reply, sent);
                } else {
                    // `_take_guard_lock`: the intent lock EXCLUSIVE first (`pg_try_advisory_xact_lock(GUARD_LOCK_CLASS,
                    // -lock_key)`: free, since takeovers hold the row lock first and guards only probe it).
                    if !self.cfg.weak(Weakening::TakeoverWithoutIntentLock) {
                        s.intent = Some(p);
                    }
                    let stage = self.request_exclusive(&mut s, p, 0, live, ts);
                    s.holders[p as usize].control = ControlOp::Call {
                        change,
                        sent,
                        stage,
                    };
                }
            }
            Action::GuardTimeout(p) => {
                let ControlOp::Call {
                    change,
                    sent,
                    stage:
                        Stage::GuardWait {
                            round,
                            live,
                            started,
                            ..
                        },
                } = s.holders[p as usize].control
                else {
                    return None;
                };
                // The request leaves the queue (lock_not_available): waiters behind it may be granted now.
                s.guard.queue.retain(|&(c, _)| c != Conn::Control(p));
                self.wakeup(&mut s);
                if round >= self.cfg.rounds {
                    // PF003: the takeover fails and rolls back.
                    if live {
                        s.live_takeover_failed = true;
                    } else {
                        s.expired_takeover_failed = true;
                    }
                    self.finish_control(&mut s, p, ControlReply::Failed, sent);
                } else {
                    s.holders[p as usize].control = ControlOp::Call {
                        change,
                        sent,
                        stage: Stage::GuardTimedOut {
                            round,
                            live,
                            started,
                        },
                    };
                }
            }
            Action::TerminateHolders(p) => {
                let ControlOp::Call {
                    change,
                    sent,
                    stage:
                        Stage::GuardTimedOut {
                            round,
                            live,
                            started,
                        },
                } = s.holders[p as usize].control
                else {
                    return None;
                };
                // pg_terminate_backend of every holder of the guard lock: their transactions abort.
                let victims: Vec<Conn> = s.guard.granted.iter().map(|&(c, _)| c).collect();
                for v in victims {
                    self.release_guard(&mut s, v);
                    match v {
                        Conn::Writer(w) => {
                            s.holders[w as usize].writer = WriteOp::Idle;
                            s.terminated_writes = true;
                        }
                        Conn::Control(c) => {
                            s.row_lock = s.row_lock.filter(|&r| r != c);
                            s.intent = s.intent.filter(|&i| i != c);
                            s.holders[c as usize].control = ControlOp::Idle;
                        }
                    }
                }
                s.holders[p as usize].control = ControlOp::Call {
                    change,
                    sent,
                    stage: Stage::GuardTerminated {
                        round: round + 1,
                        live,
                        started,
                    },
                };
            }
            Action::RequeueGuard(p) => {
                let ControlOp::Call {
                    change,
                    sent,
                    stage:
                        Stage::GuardTerminated {
                            round,
                            live,
                            started,
                        },
                } = s.holders[p as usize].control
                else {
                    return None;
                };
                let stage = self.request_exclusive(&mut s, p, round, live, started);
                s.holders[p as usize].control = ControlOp::Call {
                    change,
                    sent,
                    stage,
                };
            }
            Action::CommitChange(p) => {
                let ControlOp::Call { change, sent, .. } = s.holders[p as usize].control else {
                    return None;
                };
                let row = s.row();
                let ts = s.clock;
                let reply = match change {
                    Change::Acquire => {
                        let epoch = if self.cfg.weak(Weakening::NoEpochJump) {
                            row.epoch + 1
                        } else {
                            (row.epoch + 1)
                                .max((s.timeline as Epoch - 1) * self.cfg.epochs_per_timeline + 1)
                        };
                        let expires = ts + self.cfg.ttl;
                        let secret = s.commit(Commit::Acquire {
                            holder: p,
                            epoch,
                            expires,
                            timeline: s.timeline,
                        });
                        ControlReply::Acquired(Tenure {
                            epoch,
                            secret,
                            timeline: s.timeline,
                        })
                    }
                    Change::Release(t) => {
                        s.commit(Commit::Release {
                            epoch: t.epoch,
                            at: ts,
                        });
                        ControlReply::Released
                    }
                    Change::ForceRelease => {
                        s.commit(Commit::ForceRelease {
                            epoch: row.epoch,
                            at: ts,
                        });
                        ControlReply::Released
                    }
                };
                self.finish_control(&mut s, p, reply, sent);
            }
            Action::Renew(p) => {
                let h = &mut s.holders[p as usize];
                h.renews -= 1;
                let t = h.tenure.expect("renew needs a tenure");
                let sent = s.clock;
                let row = s.row();
                let reply = if self
                    .loss_reason(&row, Some(p), t.epoch, s.clock, s.timeline)
                    .is_some()
                    || !self.secret_ok(&row, &t)
                {
                    ControlReply::Lost
                } else {
                    s.commit(Commit::Renew {
                        epoch: t.epoch,
                        expires: s.clock + self.cfg.ttl,
                    });
                    ControlReply::Renewed
                };
                s.holders[p as usize].control = reply_op(reply, sent);
            }
            Action::DeliverControl(p) => {
                let ControlOp::Reply { reply, sent } = s.holders[p as usize].control else {
                    return None;
                };
                let anchor = if self.cfg.weak(Weakening::DeadlineFromReceive) {
                    s.clock
                } else {
                    sent
                };
                let until = self.trust_until(s.holders[p as usize].slow, anchor);
                let h = &mut s.holders[p as usize];
                match reply {
                    ControlReply::Acquired(t) => {
                        h.tenure = Some(t);
                        h.ended = false;
                        h.trust_until = until;
                    }
                    ControlReply::Renewed => {
                        if !h.ended {
                            h.trust_until = until;
                        }
                    }
                    ControlReply::Lost => h.ended = true,
                    ControlReply::Held
                    | ControlReply::Released
                    | ControlReply::NotHeld
                    | ControlReply::Failed => {}
                }
                h.control = ControlOp::Idle;
            }
            Action::LoseControl(p) => s.holders[p as usize].control = ControlOp::Idle,
            Action::GuardPreCheck(p) => {
                let h = &mut s.holders[p as usize];
                h.writes -= 1;
                let t = h.tenure.expect("a write needs a tenure");
                match self.pre_check(&s, &t) {
                    Err(reason) => self.refuse(&mut s, p, &t, reason),
                    Ok(pre) => s.holders[p as usize].writer = WriteOp::PreChecked(t, pre),
                }
            }
            Action::AdmitFast(p) => {
                if s.holders[p as usize].writer != WriteOp::Idle {
                    return None;
                }
                let t = s.holders[p as usize]
                    .tenure
                    .expect("a write needs a tenure");
                let conn = Conn::Writer(p);
                let unknown = Pre {
                    secret_ok: false,
                    seen: t.epoch,
                };
                if self.cfg.weak(Weakening::AdmitWithoutLock) {
                    s.holders[p as usize].writes -= 1;
                    s.holders[p as usize].writer = WriteOp::Locked(t, unknown);
                    return self.step(&s, Action::GuardFreshRead(p));
                }
                if self.intent_free(&s) && self.grantable(&s, conn, Mode::Shared) {
                    s.holders[p as usize].writes -= 1;
                    s.guard.granted.push((conn, Mode::Shared));
                    s.holders[p as usize].writer = WriteOp::Locked(t, unknown);
                    return self.step(&s, Action::GuardFreshRead(p));
                }
                return self.step(&s, Action::GuardPreCheck(p));
            }
            Action::GuardLockShared(p) => {
                let WriteOp::PreChecked(t, pre) = s.holders[p as usize].writer else {
                    return None;
                };
                let conn = Conn::Writer(p);
                let probe =
                    self.cfg.weak(Weakening::FastPathWithoutIntentProbe) || self.intent_free(&s);
                if self.cfg.weak(Weakening::GuardWithoutLock) {
                    s.holders[p as usize].writer = WriteOp::Locked(t, pre);
                } else if probe && self.grantable(&s, conn, Mode::Shared) {
                    // Granted at once: the fresh read follows in the same step (a takeover starting in between
                    // would wait for this holder, and the re-read sees every commit up to now).
                    s.guard.granted.push((conn, Mode::Shared));
                    s.holders[p as usize].writer = WriteOp::Locked(t, pre);
                    return self.step(&s, Action::GuardFreshRead(p));
                } else {
                    s.holders[p as usize].writer = WriteOp::AwaitTakeover(t, pre);
                }
            }
            Action::AwaitTakeover(p) => {
                let WriteOp::AwaitTakeover(t, pre) = s.holders[p as usize].writer else {
                    return None;
                };
                if !self.intent_free(&s) {
                    return None;
                }
                let conn = Conn::Writer(p);
                if !self.grantable(&s, conn, Mode::Shared) {
                    return None;
                }
                s.guard.granted.push((conn, Mode::Shared));
                s.holders[p as usize].writer = WriteOp::Probing(t, pre);
            }
            Action::ProbeIntent(p) => {
                let WriteOp::Probing(t, pre) = s.holders[p as usize].writer else {
                    return None;
                };
                if self.intent_free(&s) {
                    s.holders[p as usize].writer = WriteOp::Locked(t, pre);
                    return self.step(&s, Action::GuardFreshRead(p));
                }
                // Another takeover began: the block is rolled back, the guard lock given back.
                self.release_guard(&mut s, Conn::Writer(p));
                s.holders[p as usize].writer = WriteOp::AwaitTakeover(t, pre);
            }
            Action::GuardFreshRead(p) => {
                let WriteOp::Locked(t, pre) = s.holders[p as usize].writer else {
                    return None;
                };
                match self.fresh_read(&s, &t, &pre) {
                    Some(reason) => self.refuse(&mut s, p, &t, reason),
                    None => {
                        if self.takeover_under_way(&s) {
                            s.let_in = true;
                        }
                        s.holders[p as usize].writer = WriteOp::Passed(t);
                    }
                }
            }
            Action::WriteCommit(p) => {
                let WriteOp::Passed(t) = s.holders[p as usize].writer else {
                    return None;
                };
                let entry = s.commit(Commit::Write {
                    epoch: t.epoch,
                    tenure_timeline: t.timeline,
                    timeline: s.timeline,
                });
                self.release_guard(&mut s, Conn::Writer(p));
                // Without a promotion nothing can lose a commit: the acknowledgement teaches nothing.
                s.holders[p as usize].writer = if self.cfg.promotions > 0 {
                    WriteOp::Reply(WriteReply::Ok(entry))
                } else {
                    WriteOp::Idle
                };
            }
            Action::DeliverWrite(p) => {
                let WriteOp::Reply(reply) = s.holders[p as usize].writer else {
                    return None;
                };
                let WriteReply::Ok(entry) = reply;
                s.hist[entry].acked = true;
                s.holders[p as usize].writer = WriteOp::Idle;
            }
            Action::LoseWrite(p) => s.holders[p as usize].writer = WriteOp::Idle,
        }
        Some(s)
    }
}

impl Protocol {
    /// An action as a trace line: who, the SQL function, the lock.
    pub fn describe(&self, action: &Action) -> String {
        let holders = self.cfg.holders;
        let n = |p: &Pid| {
            if *p == holders {
                "operator".to_string()
            } else {
                ((b'A' + *p) as char).to_string()
            }
        };
        let mut out = String::new();
        let f = &mut out;
        let _ = match action {
            Action::Tick => write!(f, "clock_timestamp() +1"),
            Action::Promote { keep } => {
                write!(f, "PROMOTE async standby (keeps {keep} surviving commits; new timeline)")
            }
            Action::AcquireCall(p) => write!(f, "{}: pgfence.acquire — unlocked read, _held_by_other [+ _lock_lease_row, _take_guard_lock if the row is free]", n(p)),
            Action::ReleaseCall(p) => write!(f, "{}: pgfence.release — unlocked read, _loss_reason [+ _lock_lease_row, _take_guard_lock if the row is free]", n(p)),
            Action::ForceReleaseCall => write!(f, "operator: pgfence.force_release — unlocked read [+ _lock_lease_row, _take_guard_lock if the row is free]"),
            Action::LockLeaseRow(p) => write!(
                f,
                "{}: _lock_lease_row (FOR NO KEY UPDATE), re-check, _take_guard_lock (intent lock EXCLUSIVE; guard lock EXCLUSIVE: try, else queue)",
                n(p)
            ),
            Action::GuardTimeout(p) => write!(
                f,
                "{}: _take_guard_lock lock_timeout — the request leaves the guard lock's queue, or PF003 after the last round",
                n(p)
            ),
            Action::TerminateHolders(p) => write!(
                f,
                "{}: _take_guard_lock — _guard_lockers, pg_terminate_backend of each",
                n(p)
            ),
            Action::RequeueGuard(p) => {
                write!(f, "{}: _take_guard_lock — pg_advisory_xact_lock EXCLUSIVE again", n(p))
            }
            Action::CommitChange(p) => write!(
                f,
                "{}: UPDATE pgfence.leases (acquire/release/force_release); COMMIT (row lock + guard lock released)",
                n(p)
            ),
            Action::Renew(p) => write!(
                f,
                "{}: pgfence.renew — _lock_lease_row (FOR NO KEY UPDATE), _loss_reason, UPDATE expires_at; COMMIT",
                n(p)
            ),
            Action::DeliverControl(p) => write!(f, "{}: reply of its lease call arrives", n(p)),
            Action::LoseControl(p) => write!(f, "{}: reply of its lease call LOST", n(p)),
            Action::GuardPreCheck(p) => {
                write!(f, "{}: pgfence.fence/_guard — unlocked pre-check (_loss_reason, secret; no lock)", n(p))
            }
            Action::AdmitFast(p) => write!(
                f,
                "{}: _admit — remembered lock key: intent probe + guard SHARED, fresh read with the secret (else _guard's pre-check)",
                n(p)
            ),
            Action::GuardLockShared(p) => write!(
                f,
                "{}: _guard — intent probe + pg_try_advisory_xact_lock_shared (guard SHARED), else _await_takeover",
                n(p)
            ),
            Action::AwaitTakeover(p) => write!(
                f,
                "{}: _await_takeover — intent lock SHARED granted and given back; guard lock SHARED tried: granted",
                n(p)
            ),
            Action::ProbeIntent(p) => write!(
                f,
                "{}: _await_takeover — intent probe: free (go on), else give the guard lock back and wait again",
                n(p)
            ),
            Action::GuardFreshRead(p) => {
                write!(f, "{}: _guard — fresh read of the lease row (new snapshot), _loss_reason, secret again if the epoch moved or was unchecked", n(p))
            }
            Action::WriteCommit(p) => write!(f, "{}: guarded write; COMMIT (guard lock released)", n(p)),
            Action::DeliverWrite(p) => write!(f, "{}: reply of its guarded write arrives", n(p)),
            Action::LoseWrite(p) => write!(f, "{}: reply of its guarded write LOST", n(p)),
        };
        out
    }
}
