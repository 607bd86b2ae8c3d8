//! The rows the effect ledger's SQL answers: `pgfence.effect_result` ([`EffectResultRow`]) and a row of
//! `pgfence.in_doubt_effects` ([`InDoubtRow`]), and how each is read into the public types.

use chrono::{DateTime, Utc};
use diesel::pg::sql_types::Jsonb;
use diesel::sql_types::{BigInt, Bool, Integer, Nullable, Text, Timestamptz};
use diesel::QueryableByName;

use super::{EffectConflict, EffectState, EndedTenure, InDoubt, LateReport};
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::reply::unexpected;
use crate::types::Epoch;

/// The ledger's functions, each called as `SELECT * FROM pgfence.f(…)` ([`RowsOf`](crate::reply::RowsOf)).
pub(super) mod sql {
    use diesel::pg::sql_types::Jsonb;
    use diesel::sql_types::{BigInt, Text};

    /// The composite type `pgfence.effect_result` (migrations/2026-11-30-000001_schema).
    #[derive(Debug, diesel::sql_types::SqlType, diesel::query_builder::QueryId)]
    #[diesel(postgres_type(name = "effect_result", schema = "pgfence"))]
    // `pub`: the types diesel generates for each function name it in their public interface.
    #[allow(unreachable_pub)]
    pub struct EffectResult;

    /// A row of the table `pgfence.in_doubt_effects` returns.
    #[derive(Debug, diesel::sql_types::SqlType, diesel::query_builder::QueryId)]
    #[allow(unreachable_pub)]
    pub struct InDoubtRows;

    diesel::define_sql_function! {
        #[sql_name = "pgfence.record_intent"]
        fn record_intent(lease: Text, epoch: BigInt, secret: Text, task_key: Text, effect_key: Text, intent: Jsonb)
            -> EffectResult;
    }
    diesel::define_sql_function! {
        #[sql_name = "pgfence.record_outcome"]
        fn record_outcome(lease: Text, epoch: BigInt, secret: Text, effect_key: Text, outcome: Text, detail: Jsonb)
            -> EffectResult;
    }
    diesel::define_sql_function! {
        #[sql_name = "pgfence.settle_effect"]
        fn settle_effect(lease: Text, epoch: BigInt, secret: Text, effect_key: Text, resolution: Text,
                         detail: Jsonb) -> EffectResult;
    }
    diesel::define_sql_function! {
        #[sql_name = "pgfence.in_doubt_effects"]
        fn in_doubt_effects(lease: Text) -> InDoubtRows;
    }
}

/// A `pgfence.effect_result`, read by column name.
#[derive(Debug, QueryableByName)]
pub(super) struct EffectResultRow {
    #[diesel(sql_type = Nullable<Text>)]
    outcome: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    reason: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    current_epoch: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    effect_id: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    task_id: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    task_key: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    effect_key: Option<String>,
    #[diesel(sql_type = Nullable<Integer>)]
    attempt: Option<i32>,
    #[diesel(sql_type = Nullable<BigInt>)]
    epoch: Option<i64>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    intent: Option<serde_json::Value>,
    #[diesel(sql_type = Nullable<Text>)]
    state: Option<String>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    detail: Option<serde_json::Value>,
    #[diesel(sql_type = Nullable<BigInt>)]
    settled_epoch: Option<i64>,
    #[diesel(sql_type = Nullable<Bool>)]
    created: Option<bool>,
    #[diesel(sql_type = Nullable<BigInt>)]
    event_id: Option<i64>,
    #[diesel(sql_type = Nullable<Bool>)]
    late_report: Option<bool>,
    #[diesel(sql_type = Nullable<BigInt>)]
    waited_ms: Option<i64>,
}

/// What a ledger write answered.
pub(super) enum Answer {
    /// Written (or, `created == false`, found already written by a retry).
    Ok(super::EffectWrite),
    /// Anything else, as the error it is.
    Err(Error),
}

impl EffectResultRow {
    /// The effect this row describes (an `ok`, a conflict or an `in_doubt` answer carry one).
    fn effect(&self, function: &str, fence: &Fence) -> Result<super::Effect> {
        let missing = |what: &str| unexpected(function, &format!("answer without {what}"));
        let state = self.state.as_deref().ok_or_else(|| missing("state"))?;
        Ok(super::Effect {
            id: self.effect_id.ok_or_else(|| missing("effect id"))?,
            task_id: self.task_id.ok_or_else(|| missing("task id"))?,
            task_key: self.task_key.clone().ok_or_else(|| missing("task key"))?,
            lease: fence.lease().to_owned(),
            key: self
                .effect_key
                .clone()
                .ok_or_else(|| missing("effect key"))?,
            attempt: self
                .attempt
                .and_then(|a| u32::try_from(a).ok())
                .ok_or_else(|| missing("attempt"))?,
            epoch: Epoch::from_db(self.epoch).ok_or_else(|| missing("epoch"))?,
            intent: self.intent.clone().ok_or_else(|| missing("intent"))?,
            state: EffectState::from_sql(state)
                .ok_or_else(|| unexpected(function, &format!("effect state {state}")))?,
            detail: self.detail.clone(),
            settled_by: Epoch::from_db(self.settled_epoch),
        })
    }

    /// The answer of `pgfence.<function>` called with `fence` for `effect_key`.
    pub(super) fn answer(self, function: &str, fence: &Fence, effect_key: &str) -> Result<Answer> {
        let lease = || fence.lease().to_owned();
        let key = || effect_key.to_owned();
        Ok(match self.outcome.as_deref() {
            Some("ok") => Answer::Ok(super::EffectWrite {
                effect: self.effect(function, fence)?,
                created: self.created.unwrap_or(false),
                event_id: self.event_id,
                in_doubt_for: self
                    .waited_ms
                    .map(|ms| std::time::Duration::from_millis(ms.max(0).unsigned_abs())),
            }),
            Some("refused") => {
                let outcome = crate::fence::outcome::WriteOutcome::decode(
                    function,
                    self.outcome.as_deref(),
                    self.reason.as_deref(),
                    self.current_epoch,
                )?;
                if self.late_report == Some(true) {
                    tracing::info!(lease = %fence.lease(), presented = %fence.epoch(), effect_key,
                        "the refused outcome was kept as the attempt's late report");
                }
                Answer::Err(outcome.into_error(fence, function, function))
            }
            Some("not_found") => match self.task_key {
                Some(task_key) if function == "record_intent" => Answer::Err(Error::TaskNotFound {
                    lease: lease(),
                    key: task_key,
                }),
                _ => Answer::Err(Error::EffectNotFound {
                    lease: lease(),
                    effect_key: key(),
                }),
            },
            Some("in_doubt") => {
                let blocking = self.effect(function, fence)?;
                Answer::Err(Error::InDoubt {
                    lease: lease(),
                    task_key: blocking.task_key,
                    effect_key: blocking.key,
                    epoch: blocking.epoch,
                })
            }
            Some("conflict") => {
                let reason = self.reason.as_deref().unwrap_or("NULL");
                let conflict = EffectConflict::from_sql(reason, Epoch::from_db(self.settled_epoch))
                    .ok_or_else(|| unexpected(function, &format!("conflict {reason}")))?;
                Answer::Err(Error::EffectConflict {
                    lease: lease(),
                    effect_key: key(),
                    reason: conflict,
                })
            }
            Some(other) => return Err(unexpected(function, &format!("outcome {other}"))),
            None => return Err(unexpected(function, "outcome missing")),
        })
    }
}

/// A row of `pgfence.in_doubt_effects`, read by column name.
#[derive(Debug, QueryableByName)]
pub(super) struct InDoubtRow {
    #[diesel(sql_type = BigInt)]
    effect_id: i64,
    #[diesel(sql_type = BigInt)]
    task_id: i64,
    #[diesel(sql_type = Text)]
    task_key: String,
    #[diesel(sql_type = Text)]
    effect_key: String,
    #[diesel(sql_type = Integer)]
    attempt: i32,
    #[diesel(sql_type = BigInt)]
    epoch: i64,
    #[diesel(sql_type = Jsonb)]
    intent: serde_json::Value,
    #[diesel(sql_type = Timestamptz)]
    intended_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Text>)]
    outcome: Option<String>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    outcome_detail: Option<serde_json::Value>,
    #[diesel(sql_type = Nullable<Text>)]
    holder: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    end_reason: Option<String>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    ended_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    last_write_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Text>)]
    belief_end_cause: Option<String>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    last_belief_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Text>)]
    late_outcome: Option<String>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    late_detail: Option<serde_json::Value>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    late_reported_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<BigInt>)]
    late_count: Option<i64>,
}

impl InDoubtRow {
    pub(super) fn into_in_doubt(self, lease: &str) -> Result<InDoubt> {
        const FUNCTION: &str = "in_doubt_effects";
        let late_report = late_report(
            FUNCTION,
            self.late_outcome,
            self.late_detail,
            self.late_reported_at,
            self.late_count,
        )?;
        let state = match self.outcome.as_deref() {
            None => EffectState::Open,
            Some("unknown") => EffectState::Unknown,
            Some(other) => return Err(unexpected(FUNCTION, &format!("outcome {other} in doubt"))),
        };
        Ok(InDoubt {
            effect: super::Effect {
                id: self.effect_id,
                task_id: self.task_id,
                task_key: self.task_key,
                lease: lease.to_owned(),
                key: self.effect_key,
                attempt: u32::try_from(self.attempt)
                    .map_err(|_| unexpected(FUNCTION, "attempt below 1"))?,
                epoch: Epoch::new(self.epoch)?,
                intent: self.intent,
                state,
                detail: self.outcome_detail,
                settled_by: None,
            },
            intended_at: self.intended_at,
            tenure: EndedTenure {
                holder: self.holder,
                end_reason: self.end_reason,
                ended_at: self.ended_at,
                last_write_at: self.last_write_at,
                belief_end_cause: self.belief_end_cause,
                last_belief_at: self.last_belief_at,
            },
            late_report,
        })
    }
}

/// The late report a read of `function` gave in its four `late_*` columns: all of them, or none (no report).
pub(super) fn late_report(
    function: &str,
    outcome: Option<String>,
    detail: Option<serde_json::Value>,
    reported_at: Option<DateTime<Utc>>,
    count: Option<i64>,
) -> Result<Option<LateReport>> {
    Ok(match (outcome, detail, reported_at) {
        (Some(outcome), Some(detail), Some(at)) => Some(LateReport {
            state: EffectState::from_sql(&outcome)
                .filter(|s| s.is_outcome())
                .ok_or_else(|| unexpected(function, &format!("late outcome {outcome}")))?,
            detail,
            reported_at: at,
            count: count.unwrap_or(1).max(1).unsigned_abs(),
        }),
        (None, None, None) => None,
        _ => return Err(unexpected(function, "a late report without all its fields")),
    })
}
