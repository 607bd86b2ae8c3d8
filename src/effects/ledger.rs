//! The operator's reads of the ledger: every attempt of a lease's effects as recorded ([`Effects::ledger`],
//! [`Effects::task_ledger`]) and what is in doubt on every lease the session may read
//! ([`Effects::all_in_doubt`]), through `pgfence.effect_attempts` and `pgfence.in_doubt_effects`, which ask the
//! one in-doubt rule (`pgfence._in_doubt`) and show only the clusters the session's role has a grant on.

use chrono::{DateTime, Utc};
use diesel::pg::sql_types::Jsonb;
use diesel::sql_types::{BigInt, Bool, Integer, Nullable, Text, Timestamptz};
use diesel::QueryableByName;
use serde::{Deserialize, Serialize};

use super::{Effect, EffectState, Effects, InDoubt, LateReport};
use crate::error::Result;
use crate::reply::unexpected;
use crate::types::Epoch;
use crate::validate::{validate_holder, validate_name};

/// One attempt of an effect as the ledger records it: the [`Effect`], and its history apart — the outcome its
/// tenure reported, the settlement, when each was written, whether it is in doubt now and its late report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Attempt {
    /// The attempt (its `state` is the settlement, else the outcome, else [`EffectState::Open`]).
    pub effect: Effect,
    /// When its intent was recorded (database clock).
    pub intended_at: DateTime<Utc>,
    /// The outcome its tenure reported ([`EffectState::Done`], [`Failed`](EffectState::Failed) or
    /// [`Unknown`](EffectState::Unknown)), if any.
    pub outcome: Option<EffectState>,
    /// The outcome's detail (the external system's answer; [`Effect::detail`] is the settlement's once settled).
    pub outcome_detail: Option<serde_json::Value>,
    /// When the outcome was recorded.
    pub outcome_at: Option<DateTime<Utc>>,
    /// How it was settled ([`EffectState::Confirmed`], [`Retried`](EffectState::Retried) or
    /// [`Abandoned`](EffectState::Abandoned)), if it was; [`Effect::settled_by`] is the tenure that did.
    pub settlement: Option<EffectState>,
    /// When it was settled.
    pub settled_at: Option<DateTime<Utc>>,
    /// Whether it is in doubt now, as [`Effects::in_doubt`] decides (unsettled, and its outcome unknown or none
    /// while its tenure has ended), by the database clock at the read.
    pub in_doubt: bool,
    /// Its late report, if its tenure sent an outcome after it had ended.
    pub late_report: Option<LateReport>,
}

/// The rows of [`AttemptRow`]: `$1` is the cluster-qualified lease, `$2` a task key or NULL for every task. In
/// doubt by the rule `pgfence.in_doubt_effects` asks too (`pgfence._in_doubt`, migrations/2026-11-30-000004_tasks).
const ATTEMPT_SQL: &str = "SELECT * FROM pgfence.effect_attempts($1, $2)";

impl Effects<'_> {
    /// Every attempt of every effect of lease `name` (this store's cluster), oldest first: what `pgfence
    /// history` shows beside each tenure. Nothing for a lease of a cluster the session's role may not read.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a malformed `name`, and the
    /// [errors of every database call](crate#errors). Dropping the future is safe: it only reads.
    pub async fn ledger(&self, name: &str) -> Result<Vec<Attempt>> {
        use diesel_async::RunQueryDsl;
        validate_name(name)?;
        let lease = self.store.qualify(name);
        let mut conn = self.store.conn().await?;
        let rows: Vec<AttemptRow> = diesel::sql_query(ATTEMPT_SQL)
            .bind::<Text, _>(&lease)
            .bind::<Nullable<Text>, _>(None::<&str>)
            .load(&mut *conn)
            .await?;
        rows.into_iter()
            .map(|row| row.into_attempt(&lease))
            .collect()
    }

    /// Every attempt of every effect of task `task_key` of lease `name`, oldest first (empty for an unknown
    /// task).
    ///
    /// # Errors
    ///
    /// As [`ledger`](Self::ledger), and [`Error::InvalidInput`](crate::Error::InvalidInput) for a malformed
    /// `task_key`.
    pub async fn task_ledger(&self, name: &str, task_key: &str) -> Result<Vec<Attempt>> {
        use diesel_async::RunQueryDsl;
        validate_name(name)?;
        validate_holder("task key", task_key)?;
        let lease = self.store.qualify(name);
        let mut conn = self.store.conn().await?;
        let rows: Vec<AttemptRow> = diesel::sql_query(ATTEMPT_SQL)
            .bind::<Text, _>(&lease)
            .bind::<Nullable<Text>, _>(Some(task_key))
            .load(&mut *conn)
            .await?;
        rows.into_iter()
            .map(|row| row.into_attempt(&lease))
            .collect()
    }

    /// The effects in doubt of every lease of every cluster the session's role may read, by lease name and then
    /// oldest first: [`in_doubt`](Self::in_doubt) of each lease that has an unsettled attempt without a final
    /// outcome (found through the ledger's partial index, so leases without open effects cost nothing). Sets the
    /// gauge [`METRIC_EFFECTS_IN_DOUBT`](crate::metrics::METRIC_EFFECTS_IN_DOUBT) of each of those leases.
    ///
    /// # Errors
    ///
    /// The [errors of every database call](crate#errors). Dropping the future is safe: it only reads.
    pub async fn all_in_doubt(&self) -> Result<Vec<InDoubt>> {
        use diesel_async::RunQueryDsl;

        #[derive(QueryableByName)]
        struct LeaseRow {
            #[diesel(sql_type = Text)]
            lease: String,
        }

        let leases: Vec<LeaseRow> = {
            let mut conn = self.store.conn().await?;
            // The predicate of effects_open_lease_idx (000001_schema), so that the index answers.
            diesel::sql_query(
                "SELECT DISTINCT lease FROM pgfence.effects \
                  WHERE settlement IS NULL AND (outcome IS NULL OR outcome = 'unknown') ORDER BY lease",
            )
            .load(&mut *conn)
            .await?
        };
        let mut all = Vec::new();
        for row in leases {
            all.extend(self.in_doubt_of(&row.lease).await?);
        }
        Ok(all)
    }
}

/// A row of [`ATTEMPT_SQL`], read by column name.
#[derive(Debug, QueryableByName)]
struct AttemptRow {
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
    #[diesel(sql_type = Nullable<Timestamptz>)]
    outcome_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Text>)]
    settlement: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    settled_epoch: Option<i64>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    settle_detail: Option<serde_json::Value>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    settled_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Text>)]
    late_outcome: Option<String>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    late_detail: Option<serde_json::Value>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    late_reported_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<BigInt>)]
    late_count: Option<i64>,
    #[diesel(sql_type = Bool)]
    in_doubt: bool,
}

impl AttemptRow {
    fn into_attempt(self, lease: &str) -> Result<Attempt> {
        const READ: &str = "effects (ledger read)";
        let state = |text: &str, pick: fn(EffectState) -> bool| {
            EffectState::from_sql(text)
                .filter(|s| pick(*s))
                .ok_or_else(|| unexpected(READ, &format!("state {text}")))
        };
        let outcome = self
            .outcome
            .as_deref()
            .map(|o| state(o, EffectState::is_outcome))
            .transpose()?;
        let settlement = self
            .settlement
            .as_deref()
            .map(|s| {
                state(s, |s| {
                    matches!(
                        s,
                        EffectState::Confirmed | EffectState::Retried | EffectState::Abandoned
                    )
                })
            })
            .transpose()?;
        let late_report = super::rows::late_report(
            READ,
            self.late_outcome,
            self.late_detail,
            self.late_reported_at,
            self.late_count,
        )?;
        Ok(Attempt {
            effect: Effect {
                id: self.effect_id,
                task_id: self.task_id,
                task_key: self.task_key,
                lease: lease.to_owned(),
                key: self.effect_key,
                attempt: u32::try_from(self.attempt)
                    .map_err(|_| unexpected(READ, "attempt below 1"))?,
                epoch: Epoch::new(self.epoch)?,
                intent: self.intent,
                state: settlement.or(outcome).unwrap_or(EffectState::Open),
                detail: self.settle_detail.or_else(|| self.outcome_detail.clone()),
                settled_by: Epoch::from_db(self.settled_epoch),
            },
            intended_at: self.intended_at,
            outcome,
            outcome_detail: self.outcome_detail,
            outcome_at: self.outcome_at,
            settlement,
            settled_at: self.settled_at,
            in_doubt: self.in_doubt,
            late_report,
        })
    }
}
