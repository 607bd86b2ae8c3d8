//! What the lease functions are and what they answer: their SQL declarations, the `pgfence.lease_result` row
//! every one of them returns, decoded in this one place into a [`LeaseReply`], and the rows of the status view.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Nullable, Text, Timestamptz};
use diesel::QueryableByName;

use super::{LeaseState, LeaseStatus, TenureSecret};
use crate::error::{Error, Result};
use crate::reply::{deny_reason, is_denial, loss_reason, unexpected};
use crate::types::{Epoch, LossReason};

/// The lease functions, each called as `SELECT * FROM pgfence.f(…)` ([`RowsOf`]) and answered by one
/// [`LeaseResultRow`].
pub(super) mod sql {
    use diesel::sql_types::{BigInt, Text};

    /// The composite type `pgfence.lease_result` (migrations/2026-11-30-000001_schema) that every lease function
    /// returns.
    #[derive(Debug, diesel::sql_types::SqlType, diesel::query_builder::QueryId)]
    #[diesel(postgres_type(name = "lease_result", schema = "pgfence"))]
    // `pub`: the types diesel generates for each function name it in their public interface.
    #[allow(unreachable_pub)]
    pub struct LeaseResult;

    diesel::define_sql_function! {
        #[sql_name = "pgfence.acquire"]
        fn acquire(lease: Text, holder: Text, ttl_ms: BigInt) -> LeaseResult;
    }
    diesel::define_sql_function! {
        #[sql_name = "pgfence.renew"]
        fn renew(lease: Text, epoch: BigInt, secret: Text, ttl_ms: BigInt) -> LeaseResult;
    }
    diesel::define_sql_function! {
        #[sql_name = "pgfence.release"]
        fn release(lease: Text, epoch: BigInt, secret: Text) -> LeaseResult;
    }
    diesel::define_sql_function! {
        #[sql_name = "pgfence.force_release"]
        fn force_release(lease: Text) -> LeaseResult;
    }
}

/// A `pgfence.lease_result`, read by column name.
#[derive(QueryableByName)]
pub(super) struct LeaseResultRow {
    #[diesel(sql_type = Nullable<Text>)]
    outcome: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    reason: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    epoch: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    holder: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    expires_in_ms: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    secret: Option<String>,
}

/// What a lease function answered: a [`LeaseResultRow`] decoded, in this one place, from its outcome and reason.
#[derive(Debug)]
pub(super) enum LeaseReply {
    /// `acquired`: a new tenure and its secret, given this once.
    Acquired { epoch: Epoch, secret: TenureSecret },
    /// `held`: another holder's live tenure, and the time it has left by the database clock.
    Held {
        holder: String,
        epoch: Epoch,
        expires_in: Duration,
    },
    /// `renewed`.
    Renewed,
    /// `released`: the tenure ended now (for force_release, the one that was current).
    Released {
        epoch: Option<Epoch>,
        holder: Option<String>,
    },
    /// `refused` with a loss reason: a renewal refused, the tenure is over.
    Lost {
        reason: LossReason,
        current: Option<Epoch>,
    },
    /// `not_held`: nothing to release (`epoch`: the lease's last, `None` when never acquired or unknown).
    NotHeld {
        reason: LossReason,
        epoch: Option<Epoch>,
    },
    /// `refused` with `no_grant` or `bad_secret`: refused and audited.
    Denied(LossReason),
}

impl LeaseReply {
    /// The outcome's name in SQL.
    fn outcome(&self) -> &'static str {
        match self {
            LeaseReply::Acquired { .. } => "acquired",
            LeaseReply::Held { .. } => "held",
            LeaseReply::Renewed => "renewed",
            LeaseReply::Released { .. } => "released",
            LeaseReply::Lost { .. } => "refused",
            LeaseReply::NotHeld { .. } => "not_held",
            LeaseReply::Denied(_) => "refused",
        }
    }
}

impl LeaseResultRow {
    /// `busy` (`acquire_many` only): another transaction held the lease's row or guard lock; nothing was done.
    pub(super) fn is_busy(&self) -> bool {
        self.outcome.as_deref() == Some("busy")
    }

    /// The reply of `pgfence.<function>`; an outcome or reason it never gives is an error.
    pub(super) fn decode(self, function: &str) -> Result<LeaseReply> {
        let missing = |what: &str| unexpected(function, &format!("{what} missing"));
        Ok(match self.outcome.as_deref() {
            Some("acquired") => LeaseReply::Acquired {
                epoch: Epoch::from_db(self.epoch).ok_or_else(|| missing("epoch"))?,
                secret: TenureSecret::parse(self.secret.ok_or_else(|| missing("tenure secret"))?)
                    .map_err(|_| unexpected(function, "malformed tenure secret"))?,
            },
            Some("held") => LeaseReply::Held {
                holder: self.holder.unwrap_or_default(),
                epoch: Epoch::from_db(self.epoch).ok_or_else(|| missing("epoch"))?,
                expires_in: ms(self.expires_in_ms),
            },
            Some("renewed") => LeaseReply::Renewed,
            Some("released") => LeaseReply::Released {
                epoch: Epoch::from_db(self.epoch),
                holder: self.holder,
            },
            Some("refused") if is_denial(self.reason.as_deref()) => {
                LeaseReply::Denied(deny_reason(function, self.reason.as_deref())?)
            }
            Some("refused") => LeaseReply::Lost {
                reason: loss_reason(function, self.reason.as_deref())?,
                current: Epoch::from_db(self.epoch),
            },
            Some("not_held") => LeaseReply::NotHeld {
                reason: loss_reason(function, self.reason.as_deref())?,
                epoch: Epoch::from_db(self.epoch),
            },
            Some(other) => return Err(unexpected(function, &format!("outcome {other}"))),
            None => return Err(missing("outcome")),
        })
    }
}

/// The error for a reply that `pgfence.<function>` gives, but not to this call.
pub(super) fn unexpected_reply(function: &str, reply: &LeaseReply) -> Error {
    unexpected(function, &format!("outcome {}", reply.outcome()))
}

pub(super) fn ms(value: Option<i64>) -> Duration {
    Duration::from_millis(value.unwrap_or(0).max(0) as u64)
}

#[derive(QueryableByName)]
pub(super) struct LeaseStatusRow {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Nullable<Text>)]
    holder: Option<String>,
    #[diesel(sql_type = BigInt)]
    epoch: i64,
    #[diesel(sql_type = Text)]
    state: String,
    #[diesel(sql_type = Nullable<BigInt>)]
    expires_in_ms: Option<i64>,
    #[diesel(sql_type = BigInt)]
    transitions: i64,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    acquired_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    renewed_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    last_write_at: Option<DateTime<Utc>>,
}

impl TryFrom<LeaseStatusRow> for LeaseStatus {
    type Error = Error;
    fn try_from(row: LeaseStatusRow) -> Result<Self> {
        let state = match row.state.as_str() {
            "held" => LeaseState::Held,
            "expired" => LeaseState::Expired,
            "released" => LeaseState::Released,
            other => return Err(unexpected("leases", &format!("state {other}"))),
        };
        Ok(LeaseStatus {
            name: row.name,
            holder: row.holder,
            epoch: Epoch::from_db(Some(row.epoch)),
            state,
            expires_in: (state == LeaseState::Held).then(|| ms(row.expires_in_ms)),
            transitions: row.transitions,
            acquired_at: row.acquired_at,
            renewed_at: row.renewed_at,
            last_write_at: row.last_write_at,
        })
    }
}

// Durations are computed by the database (`expires_at - clock_timestamp()`), never by comparing clocks.
pub(super) const STATUS_SQL: &str = "SELECT name, holder, epoch, \
        CASE WHEN state = 'held' AND expires_at > clock_timestamp() THEN 'held' \
             WHEN state = 'held' THEN 'expired' ELSE 'released' END AS state, \
        CASE WHEN state = 'held' AND expires_at > clock_timestamp() \
             THEN ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint END AS expires_in_ms, \
        transitions, acquired_at, renewed_at, \
        (SELECT e.created_at FROM pgfence.task_events e WHERE e.lease = leases.name \
          ORDER BY e.epoch DESC, e.id DESC LIMIT 1) AS last_write_at \
   FROM pgfence.leases";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::SECRET_LEN;

    fn row(outcome: Option<&str>, reason: Option<&str>, epoch: Option<i64>) -> LeaseResultRow {
        LeaseResultRow {
            outcome: outcome.map(str::to_owned),
            reason: reason.map(str::to_owned),
            epoch,
            holder: Some("pod-a".to_owned()),
            expires_in_ms: Some(1500),
            secret: None,
        }
    }

    /// A lease_result decodes by its outcome and reason into one reply; an outcome the functions never give, a
    /// loss or refusal without its reason, and an acquisition without its secret are errors, never defaults.
    #[test]
    fn lease_results_decode_exactly() {
        assert!(matches!(
            row(Some("held"), None, Some(3)).decode("acquire").unwrap(),
            LeaseReply::Held { epoch, expires_in, .. }
                if epoch.get() == 3 && expires_in == Duration::from_millis(1500)
        ));
        assert!(matches!(
            row(Some("refused"), Some("failover"), Some(4)).decode("renew").unwrap(),
            LeaseReply::Lost { reason: LossReason::Failover, current: Some(current) } if current.get() == 4
        ));
        assert!(matches!(
            row(Some("not_held"), Some("unknown_lease"), None)
                .decode("force_release")
                .unwrap(),
            LeaseReply::NotHeld {
                reason: LossReason::UnknownLease,
                epoch: None
            }
        ));
        assert!(matches!(
            row(Some("refused"), Some("bad_secret"), None)
                .decode("release")
                .unwrap(),
            LeaseReply::Denied(LossReason::BadSecret)
        ));
        let mut acquired = row(Some("acquired"), None, Some(1));
        acquired.secret = Some("ab".repeat(SECRET_LEN / 2));
        assert!(matches!(
            acquired.decode("acquire").unwrap(),
            LeaseReply::Acquired { .. }
        ));
        // A reply keeps its SQL name: the one an unexpected reply's error names.
        for (outcome, reason) in [
            ("held", None),
            ("renewed", None),
            ("released", None),
            ("refused", Some("expired")),
            ("not_held", Some("unknown_lease")),
            ("refused", Some("no_grant")),
        ] {
            let reply = row(Some(outcome), reason, Some(2)).decode("renew").unwrap();
            assert_eq!(reply.outcome(), outcome);
            assert!(
                unexpected_reply("renew", &reply)
                    .to_string()
                    .contains(&format!("outcome {outcome}")),
                "{outcome}"
            );
        }
        let mut acquired = row(Some("acquired"), None, Some(1));
        acquired.secret = Some("cd".repeat(SECRET_LEN / 2));
        assert_eq!(acquired.decode("acquire").unwrap().outcome(), "acquired");
        for (outcome, reason, epoch) in [
            (Some("granted"), None, Some(1)),
            (None, None, None),
            (Some("refused"), None, Some(2)),
            (Some("not_held"), Some("vanished"), Some(2)),
            // `lost` and `denied` are no outcomes: a refusal is always `refused`, told apart by its reason.
            (Some("lost"), Some("expired"), Some(2)),
            (Some("denied"), Some("bad_secret"), None),
            (Some("acquired"), None, Some(1)),
            (Some("held"), None, None),
        ] {
            let error = row(outcome, reason, epoch).decode("renew").unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains("unexpected result of pgfence.renew"),
                "{outcome:?} {reason:?}: {error}"
            );
        }
    }
}
