//! The value types every layer shares — the [`Epoch`], why a tenure ended ([`LossReason`]) or a membership
//! did ([`MemberLoss`]), where a task is ([`TaskState`]). The bottom of the module graph: it imports nothing
//! from pgfence. Fallible constructors (`Epoch::new`, `TaskState::from_str`) return
//! [`Error`](crate::Error) and live with the other input checks in `validate`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A fencing token: the number of the tenure that wrote. Each acquisition of a lease issues the previous epoch + 1
/// (or more, after a failover to a new WAL timeline), so epochs per lease name strictly increase forever. Serializes as a plain number so it can travel
/// to downstream services.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct Epoch(pub(crate) i64);

impl Epoch {
    /// The number.
    pub fn get(self) -> i64 {
        self.0
    }

    /// Epoch from a database value that may be 0 ("never acquired") or NULL.
    pub(crate) fn from_db(value: Option<i64>) -> Option<Epoch> {
        value.filter(|v| *v >= 1).map(Epoch)
    }
}

impl From<Epoch> for i64 {
    fn from(epoch: Epoch) -> i64 {
        epoch.0
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Why a tenure is not (or no longer) current: the reason of a [`Error::Lost`](crate::Error::Lost) renewal and of a
/// [`Error::Stale`](crate::Error::Stale) write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LossReason {
    /// A newer epoch was issued.
    Superseded,
    /// The tenure's ttl ran out by the database clock.
    Expired,
    /// The tenure was released (by its holder or by an operator's force-release).
    Released,
    /// No lease has this name.
    UnknownLease,
    /// The presented epoch was never issued.
    FutureEpoch,
    /// The epoch matches but the holder does not. No pgfence function gives it: a renewal or release presents
    /// the tenure's secret, which identifies the tenure and so its holder. It stays in the enum for code that
    /// matches on it.
    HolderMismatch,
    /// The target row was already written by a newer epoch (its fence is higher).
    RowFence,
    /// The tenure was granted before the server's last promotion (or point-in-time recovery): a failover is a
    /// fencing boundary, and no tenure current before it may write or renew after it. Re-acquire.
    Failover,
    /// The database refused the session's role (its grant on the lease's cluster was revoked: `no_grant`) or the
    /// tenure's secret (`bad_secret`) — reported by the leadership runtime, whose renewals end the tenure then.
    /// Calls made directly get [`Error::Denied`](crate::Error::Denied) instead.
    Denied,
}

impl LossReason {
    /// The reason a pgfence SQL function names `text` (`forced`: a release by an operator; `no_grant` and
    /// `bad_secret`: refusals of the role), or `None` for a text it never gives.
    pub(crate) fn from_sql(text: &str) -> Option<LossReason> {
        Some(match text {
            "superseded" => LossReason::Superseded,
            "expired" => LossReason::Expired,
            "released" | "forced" => LossReason::Released,
            "unknown_lease" => LossReason::UnknownLease,
            "future_epoch" => LossReason::FutureEpoch,
            "holder_mismatch" => LossReason::HolderMismatch,
            "row_fence" => LossReason::RowFence,
            "failover" => LossReason::Failover,
            "no_grant" | "bad_secret" | "denied" => LossReason::Denied,
            _ => return None,
        })
    }

    /// The name used in SQL and in `pgfence.rejections.reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            LossReason::Superseded => "superseded",
            LossReason::Expired => "expired",
            LossReason::Released => "released",
            LossReason::UnknownLease => "unknown_lease",
            LossReason::FutureEpoch => "future_epoch",
            LossReason::HolderMismatch => "holder_mismatch",
            LossReason::RowFence => "row_fence",
            LossReason::Failover => "failover",
            LossReason::Denied => "denied",
        }
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the database no longer counts a membership (a heartbeat's refusal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MemberLoss {
    /// The group has no member of this name.
    UnknownMember,
    /// A later incarnation of the name joined (this one had expired).
    Superseded,
    /// The secret presented is not the incarnation's (audited).
    BadSecret,
    /// The member left.
    Left,
    /// Its ttl ran out by the database clock: join again.
    Expired,
    /// The session's role has no grant on the group's cluster (audited).
    NoGrant,
}

impl MemberLoss {
    /// The reason a membership function names `text`, or `None` for a text it never gives.
    pub(crate) fn from_sql(text: &str) -> Option<MemberLoss> {
        Some(match text {
            "unknown_member" => MemberLoss::UnknownMember,
            "superseded" => MemberLoss::Superseded,
            "bad_secret" => MemberLoss::BadSecret,
            "left" => MemberLoss::Left,
            "expired" => MemberLoss::Expired,
            "no_grant" => MemberLoss::NoGrant,
            _ => return None,
        })
    }
}

impl fmt::Display for MemberLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemberLoss::UnknownMember => "unknown member",
            MemberLoss::Superseded => "superseded by a later incarnation",
            MemberLoss::BadSecret => "wrong secret",
            MemberLoss::Left => "left",
            MemberLoss::Expired => "expired",
            MemberLoss::NoGrant => "no grant on the group's cluster",
        })
    }
}

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Created, waiting to be claimed.
    Pending,
    /// Claimed by an assignee.
    Claimed,
    /// Being worked on.
    Running,
    /// Finished successfully.
    Succeeded,
    /// Finished with a failure.
    Failed,
    /// Abandoned.
    Cancelled,
}

impl TaskState {
    /// The state's name in SQL.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Claimed => "claimed",
            TaskState::Running => "running",
            TaskState::Succeeded => "succeeded",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The first key of every guard lock's two-integer advisory key: a lease's guard lock is
/// `(GUARD_LOCK_CLASS, lock_key)` and its intent lock `(GUARD_LOCK_CLASS, -lock_key)` (0x70676665, "pgfe").
/// Operators see it as `classid` in `pg_locks` (`locktype = 'advisory'`, the lock key as `objid`, `objsubid` 2);
/// applications must not take advisory locks with this first key. The schema names it
/// `pgfence._guard_lock_class()`, the native guard `PGFENCE_LOCK_CLASS`.
pub const GUARD_LOCK_CLASS: i32 = 1_885_824_613;
