//! What a caller does next ([`Next`]): the one answer a controller matches on, given by an error
//! ([`Error::next`]), the database's verdict ([`LossReason::next`]) and the end of a tenure
//! ([`TenureEnd::next`](crate::leader::TenureEnd::next), in src/leader/end.rs). The answers of the first two are
//! here, beside the table they follow; which errors are transient stays [`Error::is_transient`]'s.

use crate::error::Error;
use crate::types::LossReason;

/// What a caller does next — the one answer a controller matches on, from an error
/// ([`Error::next`](crate::Error::next)), the end of a tenure ([`TenureEnd::next`](crate::leader::TenureEnd::next))
/// or the database's verdict ([`LossReason::next`]). Deliberately exhaustive: a `match` on it needs no catch-all.
///
/// ```
/// use pgfence::{Error, Next};
///
/// fn after(error: &Error) -> &'static str {
///     match error.next() {
///         Next::Retry => "back off, then make the same call again",
///         Next::Recampaign => "stop writing with this fence; acquire a new tenure, then redo the work",
///         Next::Stop => "report it and stop: asking again gets the same answer",
///     }
/// }
///
/// assert_eq!(after(&Error::SchemaMissing), "report it and stop: asking again gets the same answer");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Next {
    /// Make the same call again, unchanged, after a backoff: the failure was transient
    /// ([`Error::is_transient`](crate::Error::is_transient): connection trouble, a pool timeout, a serialization
    /// failure or deadlock, a lock wait that timed out). The tenure, if there is one, stands — but a write's
    /// outcome may be unknown (see `is_transient`).
    Retry,
    /// The tenure (or group membership) the call presented is over, or another holder's tenure is live: stop
    /// writing with its fence, acquire (or join) again — after the holder's ttl — and redo the work under the new
    /// epoch. The leadership runtime does this on its own ([`run_with_leadership`](crate::leader::run_with_leadership),
    /// [`Supervisor`](crate::leader::Supervisor)).
    Recampaign,
    /// Neither helps: the same call, or a new campaign, meets the same answer until something outside changes —
    /// the input, the configuration, a grant, the schema, an effect to settle, the task's state — or the caller
    /// asked to stop (a shutdown, a handover). Report it and stop this work.
    Stop,
}

impl Error {
    /// What the caller does next — the one question a controller's error handling asks:
    ///
    /// | error | next |
    /// |---|---|
    /// | transient ([`is_transient`](Self::is_transient): [`Connect`](Self::Connect), [`PoolTimeout`](Self::PoolTimeout), a retryable [`Database`](Self::Database) SQLSTATE) | [`Next::Retry`] |
    /// | [`Lost`](Self::Lost), [`Stale`](Self::Stale): the tenure is over | [`Next::Recampaign`] |
    /// | [`Held`](Self::Held), [`MemberTaken`](Self::MemberTaken): another holder's tenure (or member) is live | [`Next::Recampaign`] (after its `expires_in`) |
    /// | [`MemberLost`](Self::MemberLost) | its reason's [`LossReason::next`]: [`Next::Recampaign`] (join again), [`Next::Stop`] for `no_grant` and `bad_secret` |
    /// | [`Denied`](Self::Denied) | [`Next::Stop`] |
    /// | everything else: bad input ([`InvalidInput`](Self::InvalidInput), [`InvalidUrl`](Self::InvalidUrl)), [`Tls`](Self::Tls), [`NotPrimary`](Self::NotPrimary), [`WrongDatabase`](Self::WrongDatabase), [`SchemaMissing`](Self::SchemaMissing), [`Migration`](Self::Migration), the task's and the ledger's own answers ([`TaskNotFound`](Self::TaskNotFound), [`Conflict`](Self::Conflict), [`InDoubt`](Self::InDoubt), [`EffectConflict`](Self::EffectConflict), [`EffectNotFound`](Self::EffectNotFound)), a [`Database`](Self::Database) error that is not transient | [`Next::Stop`] |
    ///
    /// ```
    /// use pgfence::{Error, Next};
    ///
    /// let timeout = Error::PoolTimeout { target: "app@db:5432/app".into(), waited: std::time::Duration::from_secs(5), cause: None };
    /// assert_eq!(timeout.next(), Next::Retry);
    /// assert_eq!(Error::SchemaMissing.next(), Next::Stop);
    /// ```
    pub fn next(&self) -> Next {
        match self {
            _ if self.is_transient() => Next::Retry,
            Error::Lost { reason, .. }
            | Error::Stale { reason, .. }
            | Error::MemberLost { reason, .. } => reason.next(),
            Error::Held { .. } | Error::MemberTaken { .. } => Next::Recampaign,
            Error::Denied { .. } => Next::Stop,
            _ => Next::Stop,
        }
    }
}

impl LossReason {
    /// What the caller does next: [`Next::Stop`] for a denial ([`NoGrant`](Self::NoGrant),
    /// [`BadSecret`](Self::BadSecret): a new tenure or membership is refused the same way until the grant or the
    /// fence is fixed), [`Next::Recampaign`] for every other reason (the tenure or membership is over: acquire or
    /// join again). Never [`Next::Retry`]: the database's verdict does not change by asking again.
    pub fn next(self) -> Next {
        if self.is_denial() {
            Next::Stop
        } else {
            Next::Recampaign
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::error::EffectConflict;
    use crate::sqlstate::SqlState;
    use crate::types::{Epoch, TaskState};

    fn database(sqlstate: Option<&str>) -> Error {
        Error::Database {
            sqlstate: sqlstate.map(SqlState::from_code),
            message: "m".to_owned(),
            source: None,
        }
    }

    fn lost(reason: LossReason) -> Error {
        Error::Lost {
            lease: "c/l".to_owned(),
            epoch: Epoch(3),
            reason,
            current: Some(Epoch(4)),
        }
    }

    fn stale(reason: LossReason) -> Error {
        Error::Stale {
            lease: "c/l".to_owned(),
            presented: Epoch(3),
            current: Some(Epoch(4)),
            reason,
            operation: "create_task".to_owned(),
        }
    }

    fn denied(reason: LossReason) -> Error {
        Error::Denied {
            lease: "c/l".to_owned(),
            operation: "renew".to_owned(),
            reason,
        }
    }

    fn member_lost(reason: LossReason) -> Error {
        Error::MemberLost {
            group: "c/g".to_owned(),
            member: "m".to_owned(),
            reason,
        }
    }

    /// Row "transient": every error `is_transient` calls worth retrying unchanged says retry — and only those.
    #[test]
    fn transient_errors_say_retry() {
        let target = || "app@db:5432/app".to_owned();
        for error in [
            Error::Connect {
                target: target(),
                cause: "connection refused".to_owned(),
            },
            Error::PoolTimeout {
                target: target(),
                waited: Duration::from_secs(1),
                cause: None,
            },
            database(Some("40001")),
            database(Some("40P01")),
            database(Some("08006")),
        ] {
            assert!(error.is_transient(), "{error:?}");
            assert_eq!(error.next(), Next::Retry, "{error:?}");
        }
    }

    /// Row "the tenure is over": a lost renewal and a stale write say campaign again, whatever the reason.
    #[test]
    fn an_ended_tenure_says_recampaign() {
        for reason in [
            LossReason::Superseded,
            LossReason::Expired,
            LossReason::Released,
            LossReason::UnknownLease,
            LossReason::FutureEpoch,
            LossReason::HolderMismatch,
            LossReason::Failover,
        ] {
            assert_eq!(lost(reason).next(), Next::Recampaign, "{reason}");
            assert_eq!(stale(reason).next(), Next::Recampaign, "{reason}");
        }
        assert_eq!(stale(LossReason::RowFence).next(), Next::Recampaign);
    }

    /// Row "another holder is live": a held lease or a taken member name says campaign (join) again later.
    #[test]
    fn a_live_holder_says_recampaign() {
        let held = Error::Held {
            lease: "c/l".to_owned(),
            holder: "pod-b".to_owned(),
            epoch: Epoch(4),
            expires_in: Duration::from_secs(3),
        };
        let taken = Error::MemberTaken {
            group: "c/g".to_owned(),
            member: "m".to_owned(),
            expires_in: Duration::from_secs(3),
        };
        assert_eq!(held.next(), Next::Recampaign);
        assert_eq!(taken.next(), Next::Recampaign);
    }

    /// Row "membership lost": join again, unless the database refused the role or the secret.
    #[test]
    fn a_lost_membership_says_join_again_unless_denied() {
        for reason in [
            LossReason::UnknownMember,
            LossReason::Superseded,
            LossReason::Left,
            LossReason::Expired,
        ] {
            assert_eq!(member_lost(reason).next(), Next::Recampaign, "{reason}");
        }
        for reason in [LossReason::NoGrant, LossReason::BadSecret] {
            assert_eq!(member_lost(reason).next(), Next::Stop, "{reason}");
        }
    }

    /// Row "denied": a refusal of the role or of the secret says stop, and the message says what it means.
    #[test]
    fn a_denial_says_stop() {
        for (reason, text) in [
            (
                LossReason::NoGrant,
                "renew on c/l denied: no_grant (the session's role has no grant on the lease's cluster)",
            ),
            (
                LossReason::BadSecret,
                "renew on c/l denied: bad_secret (the fence does not carry its tenure's secret)",
            ),
        ] {
            assert_eq!(denied(reason).next(), Next::Stop);
            assert_eq!(denied(reason).to_string(), text);
        }
        assert_eq!(
            member_lost(LossReason::Superseded).to_string(),
            "membership of m in group c/g lost: superseded by a later incarnation"
        );
    }

    /// Row "everything else": bad input, a wrong or missing setup, the task's and the ledger's own answers, and
    /// database errors that are not transient say stop.
    #[test]
    fn everything_else_says_stop() {
        let text = || "x".to_owned();
        for error in [
            Error::invalid("lease name", "empty"),
            Error::InvalidUrl { reason: text() },
            Error::Tls {
                target: text(),
                cause: text(),
            },
            Error::NotPrimary { target: text() },
            Error::WrongDatabase {
                what: "database",
                expected: text(),
                actual: text(),
            },
            Error::SchemaMissing,
            Error::Migration {
                reason: text(),
                source: None,
            },
            Error::TaskNotFound {
                lease: text(),
                key: text(),
            },
            Error::Conflict {
                lease: text(),
                key: text(),
                expected: TaskState::Claimed,
                actual: TaskState::Succeeded,
            },
            Error::InDoubt {
                lease: text(),
                task_key: text(),
                effect_key: text(),
                epoch: Epoch(2),
            },
            Error::EffectConflict {
                lease: text(),
                effect_key: text(),
                reason: EffectConflict::Done,
            },
            Error::EffectNotFound {
                lease: text(),
                effect_key: text(),
            },
            database(Some("42501")),
            database(None),
        ] {
            assert_eq!(error.next(), Next::Stop, "{error:?}");
        }
    }

    /// A denial says stop; every other verdict says campaign (or join) again; none says retry.
    #[test]
    fn a_denial_stops_and_every_other_verdict_recampaigns() {
        for reason in crate::types::ALL_REASONS {
            let expected = match reason {
                LossReason::NoGrant | LossReason::BadSecret => Next::Stop,
                _ => Next::Recampaign,
            };
            assert_eq!(reason.next(), expected, "{reason}");
            assert_eq!(reason.is_denial(), expected == Next::Stop, "{reason}");
        }
    }
}
