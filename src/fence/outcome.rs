//! The guard's verdict: the row `pgfence.fence` and the task functions answer ([`WriteResultRow`]) and what it
//! means ([`WriteOutcome`]): written, refused (and why), or the task's own answer.

use diesel::pg::sql_types::Jsonb;
use diesel::sql_types::{BigInt, Bool, Nullable, Text};
use diesel::QueryableByName;

use super::Fence;
use crate::error::{Error, Result};
use crate::metrics::METRIC_STALE_WRITES;
use crate::reply::{deny_reason, is_denial, loss_reason, unexpected};
use crate::types::{Epoch, LossReason, TaskState};

/// The guard functions, each called as `SELECT * FROM pgfence.f(…)` ([`RowsOf`]) and answered by one
/// [`WriteResultRow`].
pub(crate) mod sql {
    use diesel::sql_types::{BigInt, Nullable, Text};

    /// The composite type `pgfence.write_result` (migrations/2026-11-30-000001_schema) that `pgfence.fence` and
    /// the task functions return.
    #[derive(Debug, diesel::sql_types::SqlType, diesel::query_builder::QueryId)]
    #[diesel(postgres_type(name = "write_result", schema = "pgfence"))]
    // `pub`: the types diesel generates for each function name it in their public interface.
    #[allow(unreachable_pub)]
    pub struct WriteResult;

    diesel::define_sql_function! {
        #[sql_name = "pgfence.fence"]
        fn fence(lease: Text, epoch: BigInt, secret: Text, operation: Text, target_table: Nullable<Text>,
                 target_key: Nullable<Text>) -> WriteResult;
    }

    diesel::define_sql_function! {
        /// The same guard from the `pgfence_native` extension (native/).
        #[sql_name = "pgfence_native.fence"]
        fn native_fence(lease: Text, epoch: BigInt, secret: Text, operation: Text, target_table: Nullable<Text>,
                        target_key: Nullable<Text>) -> WriteResult;
    }
}

/// A `pgfence.write_result`, read by column name: the guard's verdict and, for a task write, the task after it.
#[derive(Debug, QueryableByName)]
pub(crate) struct WriteResultRow {
    #[diesel(sql_type = Nullable<Text>)]
    outcome: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    reason: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    current_epoch: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) task_id: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) task_key: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) task_state: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) assignee: Option<String>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub(crate) payload: Option<serde_json::Value>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) fence: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) version: Option<i64>,
    #[diesel(sql_type = Nullable<Bool>)]
    pub(crate) created: Option<bool>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) event_id: Option<i64>,
}

impl WriteResultRow {
    /// The verdict of `pgfence.<function>` (see [`WriteOutcome::decode`]).
    pub(crate) fn outcome(&self, function: &str) -> Result<WriteOutcome> {
        WriteOutcome::decode(
            function,
            self.outcome.as_deref(),
            self.reason.as_deref(),
            self.current_epoch,
        )
    }
}

/// The verdict of a guarded write — the outcome and reason of a `pgfence.write_result`, or of a one-statement
/// guarded write — decoded in this one place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WriteOutcome {
    /// `ok`: the fence is current and the write went through.
    Ok,
    /// `refused` with a loss reason: refused and audited, the fence's tenure is over.
    Stale {
        reason: LossReason,
        current: Option<Epoch>,
    },
    /// `refused` with `no_grant` or `bad_secret`: refused and audited (no grant on the cluster, or not the
    /// tenure's secret).
    Denied(LossReason),
    /// `not_found`: no such task.
    NotFound,
    /// `conflict`: the task is not in the state the write requires.
    Conflict { actual: TaskState },
    /// `in_doubt` (claim_task, transition_task): the task has an effect in doubt — the effect key, and the epoch
    /// of the tenure that recorded it. Not written, not audited.
    InDoubt { effect_key: String, epoch: Epoch },
}

impl WriteOutcome {
    /// The verdict `pgfence.<function>` answered with `outcome` and `reason` (`current_epoch`: the lease's, or
    /// for `row_fence` the row's); an outcome or reason it never gives is an error.
    pub(crate) fn decode(
        function: &str,
        outcome: Option<&str>,
        reason: Option<&str>,
        current_epoch: Option<i64>,
    ) -> Result<WriteOutcome> {
        Ok(match outcome {
            Some("ok") => WriteOutcome::Ok,
            Some("refused") if is_denial(reason) => {
                WriteOutcome::Denied(deny_reason(function, reason)?)
            }
            Some("refused") => WriteOutcome::Stale {
                reason: loss_reason(function, reason)?,
                current: Epoch::from_db(current_epoch),
            },
            Some("not_found") => WriteOutcome::NotFound,
            Some("in_doubt") => WriteOutcome::InDoubt {
                effect_key: reason
                    .ok_or_else(|| unexpected(function, "in_doubt without its effect key"))?
                    .to_owned(),
                epoch: Epoch::from_db(current_epoch)
                    .ok_or_else(|| unexpected(function, "in_doubt without its epoch"))?,
            },
            Some("conflict") => WriteOutcome::Conflict {
                actual: reason.and_then(|state| state.parse().ok()).ok_or_else(|| {
                    unexpected(
                        function,
                        &format!("conflict with task state {}", reason.unwrap_or("NULL")),
                    )
                })?,
            },
            Some(other) => return Err(unexpected(function, &format!("outcome {other}"))),
            None => return Err(unexpected(function, "outcome missing")),
        })
    }

    /// Whether the database refused the write (and audited it).
    pub(crate) fn is_refusal(&self) -> bool {
        matches!(self, WriteOutcome::Stale { .. } | WriteOutcome::Denied(_))
    }

    /// The error of a verdict other than `ok`: [`Error::Stale`] or [`Error::Denied`] for a refusal (logged, and
    /// counted in [`METRIC_STALE_WRITES`] when stale); for an outcome `pgfence.<function>` gives to other writes
    /// only, an unexpected-reply error.
    pub(crate) fn into_error(self, fence: &Fence, operation: &str, function: &str) -> Error {
        match self {
            WriteOutcome::Denied(reason) => {
                tracing::warn!(lease = %fence.lease, presented = %fence.epoch,
                    reason = %crate::error::denial_text(reason), operation, "write denied");
                Error::Denied {
                    lease: fence.lease.clone(),
                    operation: operation.to_owned(),
                    reason,
                }
            }
            WriteOutcome::Stale { reason, current } => {
                tracing::warn!(lease = %fence.lease, presented = %fence.epoch,
                    current = ?current.map(Epoch::get), %reason, operation, "stale write refused");
                metrics::counter!(METRIC_STALE_WRITES, "lease" => fence.lease.clone()).increment(1);
                Error::Stale {
                    lease: fence.lease.clone(),
                    presented: fence.epoch,
                    current,
                    reason,
                    operation: operation.to_owned(),
                }
            }
            other => unexpected(function, &format!("outcome {}", other.as_str())),
        }
    }

    /// The outcome's name in SQL.
    fn as_str(&self) -> &'static str {
        match self {
            WriteOutcome::Ok => "ok",
            WriteOutcome::Stale { .. } => "refused",
            WriteOutcome::Denied(_) => "refused",
            WriteOutcome::NotFound => "not_found",
            WriteOutcome::Conflict { .. } => "conflict",
            WriteOutcome::InDoubt { .. } => "in_doubt",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::TenureSecret;

    /// A guarded write's verdict decodes by its outcome and reason; an outcome no function gives, a refusal
    /// without its reason and a conflict without a task state are errors, never defaults (an unknown verdict
    /// taken for `ok` would let a fenced transaction run).
    #[test]
    fn write_outcomes_decode_exactly() {
        let decode =
            |outcome, reason, current| WriteOutcome::decode("fence", outcome, reason, current);
        assert_eq!(decode(Some("ok"), None, Some(2)).unwrap(), WriteOutcome::Ok);
        assert_eq!(
            decode(Some("refused"), Some("row_fence"), Some(5)).unwrap(),
            WriteOutcome::Stale {
                reason: LossReason::RowFence,
                current: Some(Epoch(5))
            }
        );
        assert_eq!(
            decode(Some("refused"), Some("no_grant"), None).unwrap(),
            WriteOutcome::Denied(LossReason::NoGrant)
        );
        assert_eq!(
            decode(Some("conflict"), Some("running"), Some(1)).unwrap(),
            WriteOutcome::Conflict {
                actual: TaskState::Running
            }
        );
        assert_eq!(
            decode(Some("not_found"), None, Some(1)).unwrap(),
            WriteOutcome::NotFound
        );
        for (outcome, reason) in [
            (Some("okay"), None),
            (None, None),
            (Some("refused"), None),
            (Some("refused"), Some("paused")),
            // Outcome names the guard functions never give.
            (Some("stale"), Some("superseded")),
            (Some("denied"), Some("bad_secret")),
            (Some("conflict"), Some("paused")),
            (Some("conflict"), None),
        ] {
            assert!(
                decode(outcome, reason, None).is_err(),
                "{outcome:?} {reason:?}"
            );
        }
        assert!(WriteOutcome::Denied(LossReason::BadSecret).is_refusal());
        assert!(!WriteOutcome::NotFound.is_refusal());
    }

    /// Each verdict keeps its SQL name, and a verdict that is no refusal becomes an error naming it; the two
    /// refusals become `Stale` and `Denied` for the fence's lease and the caller's operation.
    #[test]
    fn write_outcomes_name_themselves_and_become_their_errors() {
        let fence = Fence::from_parts(
            "c/l".to_owned(),
            Epoch(3),
            TenureSecret::parse("a1".repeat(crate::limits::SECRET_LEN / 2)).unwrap(),
        );
        let verdicts = [
            (WriteOutcome::Ok, "ok", None, None),
            (
                WriteOutcome::Stale {
                    reason: LossReason::Superseded,
                    current: Some(Epoch(4)),
                },
                "refused",
                Some("superseded"),
                Some(4),
            ),
            (
                WriteOutcome::Denied(LossReason::NoGrant),
                "refused",
                Some("no_grant"),
                None,
            ),
            (WriteOutcome::NotFound, "not_found", None, None),
            (
                WriteOutcome::Conflict {
                    actual: TaskState::Succeeded,
                },
                "conflict",
                Some("succeeded"),
                None,
            ),
        ];
        for (verdict, name, reason, current) in verdicts {
            assert_eq!(verdict.as_str(), name);
            assert_eq!(
                WriteOutcome::decode("fence", Some(name), reason, current).unwrap(),
                verdict
            );
            let refusal = verdict.is_refusal();
            assert_eq!(refusal, name == "refused", "{name}");
            match verdict.into_error(&fence, "move", "fence") {
                Error::Stale {
                    lease,
                    presented,
                    current,
                    reason,
                    operation,
                } => {
                    assert_eq!((name, reason), ("refused", LossReason::Superseded));
                    assert_eq!(
                        (lease.as_str(), presented, operation.as_str()),
                        ("c/l", Epoch(3), "move")
                    );
                    assert_eq!((current, reason), (Some(Epoch(4)), LossReason::Superseded));
                }
                Error::Denied {
                    lease,
                    operation,
                    reason,
                } => {
                    assert_eq!((name, reason), ("refused", LossReason::NoGrant));
                    assert_eq!(
                        (lease.as_str(), operation.as_str(), reason),
                        ("c/l", "move", LossReason::NoGrant)
                    );
                }
                other => {
                    assert!(!refusal, "{name}: {other}");
                    assert!(
                        other.to_string().contains(&format!("outcome {name}")),
                        "{name}: {other}"
                    );
                }
            }
        }
    }
}
