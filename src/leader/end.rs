//! How a tenure of this process ended ([`TenureEnd`]) — lost, released, shut down or handed over — and what the
//! caller does next ([`TenureEnd::next`]).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::next::Next;
use crate::types::LossReason;

/// How this process's tenure ended (or, for [`Shutdown`](Self::Shutdown) and [`Handover`](Self::Handover), is
/// ending): what a [`HeldLease`](super::HeldLease) says once it is no longer held
/// ([`end_cause`](super::HeldLease::end_cause), [`lost`](super::HeldLease::lost)), what a
/// [`LeaderContext`](super::LeaderContext) says once leadership ends
/// ([`end_cause`](super::LeaderContext::end_cause)), and what [`Ended::Lost`](super::Ended::Lost) carries.
///
/// The first three variants are losses ([`is_loss`](Self::is_loss)): writes with the tenure's fence are refused
/// (or soon will be) and the runtime campaigns again. What the caller does about any of them is
/// [`next`](Self::next).
///
/// ```
/// use pgfence::leader::TenureEnd;
/// use pgfence::{LossReason, Next};
///
/// let end = TenureEnd::Lost { reason: LossReason::Failover };
/// assert!(end.is_loss());
/// assert_eq!(end.next(), Next::Recampaign);
/// assert_eq!(end.to_string(), "failover");
/// assert_eq!(TenureEnd::Shutdown.next(), Next::Stop);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "end")]
#[non_exhaustive]
pub enum TenureEnd {
    /// The database said the tenure is over (a renewal answered it: superseded, expired, released by an
    /// operator, a failover, no grant, …).
    Lost {
        /// Why, as the database reported it.
        reason: LossReason,
    },
    /// No renewal succeeded before the local deadline (send time of the last good renewal + ttl − margin): this
    /// process stopped trusting the tenure, which the database may still count until its ttl runs out.
    DeadlineExceeded {
        /// The last renewal error, if one was seen (connection refused, timeout, …).
        last_error: Option<String>,
    },
    /// The loss was injected by a test double (`MemoryElector::lose`, feature `testing`).
    Injected,
    /// Released by this process: [`HeldLease::release`](super::HeldLease::release) or a drop — for a
    /// [`LeaderContext`](super::LeaderContext), the callback returned (or failed) and the tenure was released,
    /// which only work the callback left running with a clone of the context can see.
    Released,
    /// The caller asked leadership to stop (the parent token of
    /// [`run_with_leadership`](super::run_with_leadership) or the supervisor's shutdown was cancelled). The tenure
    /// stays held until the callback returns and is then released, so work in flight may finish with the fence;
    /// start nothing new.
    Shutdown,
    /// A spreading [`Supervisor`](super::Supervisor) hands the name over to the replica the group's assignment
    /// now gives it to: as for [`Shutdown`](Self::Shutdown), the tenure stays held until the callback returns
    /// (or its grace runs out) and is then released, and the successor acquires with a larger epoch at once.
    /// Writes of this tenure after the successor's acquisition are refused.
    Handover,
}

impl TenureEnd {
    /// Whether the tenure was lost ([`Lost`](Self::Lost), [`DeadlineExceeded`](Self::DeadlineExceeded),
    /// [`Injected`](Self::Injected)) rather than ended in order.
    pub fn is_loss(&self) -> bool {
        matches!(
            self,
            TenureEnd::Lost { .. } | TenureEnd::DeadlineExceeded { .. } | TenureEnd::Injected
        )
    }

    /// What the caller does next:
    ///
    /// | end | next |
    /// |---|---|
    /// | [`Lost`](Self::Lost) | its reason's [`LossReason::next`]: [`Next::Recampaign`], or [`Next::Stop`] when the database denied the role or the secret (`no_grant`, `bad_secret`: a new tenure would be refused the same way) |
    /// | [`DeadlineExceeded`](Self::DeadlineExceeded), [`Injected`](Self::Injected) | [`Next::Recampaign`] |
    /// | [`Released`](Self::Released), [`Shutdown`](Self::Shutdown), [`Handover`](Self::Handover): ended in order | [`Next::Stop`] |
    ///
    /// Never [`Next::Retry`]: a tenure that ended does not come back.
    pub fn next(&self) -> Next {
        match self {
            TenureEnd::Lost { reason } => reason.next(),
            TenureEnd::DeadlineExceeded { .. } | TenureEnd::Injected => Next::Recampaign,
            TenureEnd::Released | TenureEnd::Shutdown | TenureEnd::Handover => Next::Stop,
        }
    }

    /// The `cause` label of a loss in the losses metric (`pgfence_lease_losses_total`): `definitive` (the
    /// database ended it), `deadline` or `injected`; `None` for an end in order.
    pub(super) fn loss_label(&self) -> Option<&'static str> {
        match self {
            TenureEnd::Lost { .. } => Some("definitive"),
            TenureEnd::DeadlineExceeded { .. } => Some("deadline"),
            TenureEnd::Injected => Some("injected"),
            TenureEnd::Released | TenureEnd::Shutdown | TenureEnd::Handover => None,
        }
    }
}

/// A loss reads as what happened (the database's reason, or the deadline with its last error); an end in order
/// as what ended it.
impl fmt::Display for TenureEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TenureEnd::Lost { reason } => write!(f, "{reason}"),
            TenureEnd::DeadlineExceeded {
                last_error: Some(e),
            } => write!(f, "no renewal before the local deadline (last error: {e})"),
            TenureEnd::DeadlineExceeded { last_error: None } => {
                f.write_str("no renewal before the local deadline")
            }
            TenureEnd::Injected => f.write_str("loss injected"),
            TenureEnd::Released => f.write_str("released by this process"),
            TenureEnd::Shutdown => f.write_str("shut down"),
            TenureEnd::Handover => f.write_str("handed over to another replica"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every end reads as what happened (the text of the loss signal and of the runtime's log), a loss is
    /// labelled for the losses metric as before (`definitive`, `deadline`, `injected`) and an end in order is
    /// not, each says what to do next, and each serializes tagged by its kind.
    #[test]
    fn tenure_ends_say_what_happened_and_what_to_do() {
        let deadline = |e: Option<&str>| TenureEnd::DeadlineExceeded {
            last_error: e.map(str::to_owned),
        };
        let cases = [
            (
                TenureEnd::Lost {
                    reason: LossReason::Superseded,
                },
                "superseded",
                Some("definitive"),
                Next::Recampaign,
                serde_json::json!({"end": "lost", "reason": "superseded"}),
            ),
            (
                TenureEnd::Lost {
                    reason: LossReason::NoGrant,
                },
                "no_grant",
                Some("definitive"),
                Next::Stop,
                serde_json::json!({"end": "lost", "reason": "no_grant"}),
            ),
            (
                deadline(None),
                "no renewal before the local deadline",
                Some("deadline"),
                Next::Recampaign,
                serde_json::json!({"end": "deadline_exceeded", "last_error": null}),
            ),
            (
                deadline(Some("connection refused")),
                "no renewal before the local deadline (last error: connection refused)",
                Some("deadline"),
                Next::Recampaign,
                serde_json::json!({"end": "deadline_exceeded", "last_error": "connection refused"}),
            ),
            (
                TenureEnd::Injected,
                "loss injected",
                Some("injected"),
                Next::Recampaign,
                serde_json::json!({"end": "injected"}),
            ),
            (
                TenureEnd::Released,
                "released by this process",
                None,
                Next::Stop,
                serde_json::json!({"end": "released"}),
            ),
            (
                TenureEnd::Shutdown,
                "shut down",
                None,
                Next::Stop,
                serde_json::json!({"end": "shutdown"}),
            ),
            (
                TenureEnd::Handover,
                "handed over to another replica",
                None,
                Next::Stop,
                serde_json::json!({"end": "handover"}),
            ),
        ];
        for (end, text, label, next, json) in cases {
            assert_eq!(end.to_string(), text);
            assert_eq!(end.loss_label(), label, "{end:?}");
            assert_eq!(end.is_loss(), label.is_some(), "{end:?}");
            assert_eq!(end.next(), next, "{end:?}");
            assert_eq!(serde_json::to_value(&end).unwrap(), json);
            assert_eq!(serde_json::from_value::<TenureEnd>(json).unwrap(), end);
        }
    }

    /// A loss the database reported says what its reason says: campaign again, unless the role or the secret
    /// was denied.
    #[test]
    fn a_definitive_loss_follows_its_reason() {
        for reason in crate::types::ALL_REASONS {
            assert_eq!(TenureEnd::Lost { reason }.next(), reason.next(), "{reason}");
        }
    }
}
