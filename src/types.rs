//! The value types every layer shares — the [`Epoch`], the database's verdict on a tenure or a membership
//! ([`LossReason`]), where a task is ([`TaskState`]). The bottom of the module graph: it imports nothing
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

/// The database's verdict on a tenure or a membership that is not (or no longer) current: why a renewal lost it
/// ([`Error::Lost`](crate::Error::Lost)), a write was refused ([`Error::Stale`](crate::Error::Stale)), a call was
/// denied ([`Error::Denied`](crate::Error::Denied): [`NoGrant`](Self::NoGrant) or [`BadSecret`](Self::BadSecret)),
/// a membership ended ([`Error::MemberLost`](crate::Error::MemberLost)), or the leadership runtime ended a tenure
/// ([`TenureEnd::Lost`](crate::leader::TenureEnd::Lost)). Its name ([`as_str`](Self::as_str), `Display`, serde)
/// is the text the SQL functions answer and `pgfence.rejections.reason` records.
///
/// What to do about it is [`next`](Self::next) (in src/next.rs):
///
/// ```
/// use pgfence::{LossReason, Next};
///
/// assert_eq!(LossReason::Superseded.next(), Next::Recampaign);
/// assert_eq!(LossReason::NoGrant.next(), Next::Stop);
/// assert_eq!(LossReason::BadSecret.to_string(), "bad_secret");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LossReason {
    /// A newer epoch was issued (for a membership: a later incarnation of the name joined).
    Superseded,
    /// The tenure's (or membership's) ttl ran out by the database clock.
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
    /// The session's login role (and the roles it is a member of) has no grant on the lease's (or group's)
    /// cluster — or, for a force-release, no operator grant. The schema owner grants them (`pgfence grant`).
    /// Audited. A denial: [`Error::Denied`](crate::Error::Denied) for a direct call.
    NoGrant,
    /// The epoch (or membership incarnation) is current but the secret presented with it is not its own: the
    /// fence was forged or damaged. Only the acquisition's [`Fence`](crate::Fence) (or a serialized copy of it)
    /// can write. Audited. A denial: [`Error::Denied`](crate::Error::Denied) for a direct call.
    BadSecret,
    /// Memberships only: the group has no member of this name (or incarnation).
    UnknownMember,
    /// Memberships only: the member left.
    Left,
}

impl LossReason {
    /// The reason a tenure's SQL function (a lease call, the guard, a task write, `renew_many`) names `text`
    /// (`forced`: a release by an operator), or `None` for a text it never gives — the membership reasons among
    /// them.
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
            "no_grant" => LossReason::NoGrant,
            "bad_secret" => LossReason::BadSecret,
            _ => return None,
        })
    }

    /// The reason a membership function (`heartbeat`, `leave_group`, `join_group`) names `text`, or `None` for a
    /// text it never gives — the tenure reasons among them.
    pub(crate) fn from_member_sql(text: &str) -> Option<LossReason> {
        Some(match text {
            "unknown_member" => LossReason::UnknownMember,
            "superseded" => LossReason::Superseded,
            "bad_secret" => LossReason::BadSecret,
            "left" => LossReason::Left,
            "expired" => LossReason::Expired,
            "no_grant" => LossReason::NoGrant,
            _ => return None,
        })
    }

    /// Whether the database refused who asked ([`NoGrant`](Self::NoGrant), [`BadSecret`](Self::BadSecret)) rather
    /// than found the tenure or membership over: the reasons of [`Error::Denied`](crate::Error::Denied).
    pub(crate) fn is_denial(self) -> bool {
        matches!(self, LossReason::NoGrant | LossReason::BadSecret)
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
            LossReason::NoGrant => "no_grant",
            LossReason::BadSecret => "bad_secret",
            LossReason::UnknownMember => "unknown_member",
            LossReason::Left => "left",
        }
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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

/// Every reason, for tests that go through them all.
#[cfg(test)]
pub(crate) const ALL_REASONS: [LossReason; 12] = [
    LossReason::Superseded,
    LossReason::Expired,
    LossReason::Released,
    LossReason::UnknownLease,
    LossReason::FutureEpoch,
    LossReason::HolderMismatch,
    LossReason::RowFence,
    LossReason::Failover,
    LossReason::NoGrant,
    LossReason::BadSecret,
    LossReason::UnknownMember,
    LossReason::Left,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// A reason's name is one text everywhere: `as_str`, `Display` and its serialized form.
    #[test]
    fn a_reason_has_one_name() {
        for reason in ALL_REASONS {
            assert_eq!(reason.to_string(), reason.as_str());
            assert_eq!(
                serde_json::to_value(reason).unwrap(),
                serde_json::json!(reason.as_str())
            );
            let back: LossReason =
                serde_json::from_value(serde_json::json!(reason.as_str())).unwrap();
            assert_eq!(back, reason);
        }
    }

    /// Each parser reads exactly the texts its SQL functions give: a tenure's functions never answer a
    /// membership reason, nor the membership functions a tenure's, and a text no function gives (`denied`, the
    /// old name of a denial) is no reason at all.
    #[test]
    fn reasons_parse_only_from_the_texts_their_functions_give() {
        let tenure = |text| LossReason::from_sql(text);
        let member = |text| LossReason::from_member_sql(text);
        for reason in ALL_REASONS {
            let text = reason.as_str();
            let (of_tenure, of_member) = match reason {
                LossReason::UnknownMember | LossReason::Left => (None, Some(reason)),
                LossReason::Superseded
                | LossReason::Expired
                | LossReason::NoGrant
                | LossReason::BadSecret => (Some(reason), Some(reason)),
                _ => (Some(reason), None),
            };
            assert_eq!(tenure(text), of_tenure, "{text}");
            assert_eq!(member(text), of_member, "{text}");
        }
        assert_eq!(tenure("forced"), Some(LossReason::Released));
        assert_eq!(member("forced"), None);
        for text in [
            "",
            "denied",
            "member_taken",
            "NO_GRANT",
            "bad_secret ",
            "eclipsed",
        ] {
            assert_eq!(tenure(text), None, "{text:?}");
            assert_eq!(member(text), None, "{text:?}");
        }
    }
}
