//! The effect ledger: the work *between* guarded writes. Before a leader calls an external system for a task (to
//! launch a workload, call a runtime, send a request) it records the **intent** under its fence; after the call,
//! the **outcome**. A tenure that ends between the two leaves the effect **in doubt**: the request may have been
//! applied and its reply lost, or still be on its way. Its successor does not guess by a timer: it lists what is
//! in doubt ([`Effects::in_doubt`], handed to a new tenure's callback by the leadership runtime as
//! [`LeaderContext::in_doubt`](crate::leader::LeaderContext::in_doubt)), asks the external system by the effect
//! key — the idempotency key that is stable across retries and successors — and **settles** each effect once
//! ([`Effects::settle`]): confirmed, retried under the same key, or abandoned.
//!
//! Every write is one guarded statement, like the task writes: refused and audited when the tenure has ended,
//! and appended to the task's event history with its epoch. An ended tenure's late outcome is refused as a write
//! *and* kept as the attempt's [`LateReport`], evidence for the successor that changes nothing by itself. A task
//! with an effect in doubt cannot move on ([`Error::InDoubt`] from [`claim_task`](crate::tasks::Tasks::claim) and
//! [`transition_task`](crate::tasks::Tasks::transition)) until it is settled.
//!
//! What it guarantees: an effect's intent is recorded before any call is made under a live tenure (a stale
//! leader is refused before it calls), no in-doubt attempt is forgotten, and each is settled exactly once. What it
//! does not: that the external system applies a key at most once — that is the external system's idempotency,
//! which the stable key lets it provide.
//!
//! SQL: `migrations/2026-11-30-000004_tasks/up.sql` (`pgfence.record_intent`, `record_outcome`, `settle_effect`,
//! `in_doubt_effects`); the tables `pgfence.effects` and `pgfence.effect_reports` (`000001_schema`). The operator's
//! reads ([`Effects::ledger`], [`Effects::task_ledger`], [`Effects::all_in_doubt`]) read those tables directly.

mod ledger;
mod rows;

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use crate::error::EffectConflict;
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::metrics::{METRIC_EFFECTS_IN_DOUBT, METRIC_EFFECT_SETTLE_SECONDS};
use crate::reply::RowsOf;
use crate::store::Store;
use crate::tasks::validate_payload;
use crate::types::Epoch;
use crate::validate::{validate_holder, validate_name};
pub use ledger::Attempt;
use rows::{sql, Answer, EffectResultRow, InDoubtRow};

/// The state of one attempt of an effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EffectState {
    /// The intent is recorded and no outcome yet: in flight while its tenure lasts, in doubt once it ended.
    Open,
    /// The external call succeeded (the outcome's detail is the external system's answer).
    Done,
    /// The external call failed; the key may be attempted again ([`Effects::intend`]).
    Failed,
    /// The call's fate is not known (no answer: a timeout). In doubt until settled.
    Unknown,
    /// Settled: the effect was found to have happened.
    Confirmed,
    /// Settled: attempted again under the same key (the next attempt is the effect now).
    Retried,
    /// Settled: given up, with a reason.
    Abandoned,
}

impl EffectState {
    fn from_sql(text: &str) -> Option<EffectState> {
        Some(match text {
            "open" => EffectState::Open,
            "done" => EffectState::Done,
            "failed" => EffectState::Failed,
            "unknown" => EffectState::Unknown,
            "confirmed" => EffectState::Confirmed,
            "retried" => EffectState::Retried,
            "abandoned" => EffectState::Abandoned,
            _ => return None,
        })
    }

    /// The name used in SQL (`pgfence.effect_result.state`).
    pub fn as_str(self) -> &'static str {
        match self {
            EffectState::Open => "open",
            EffectState::Done => "done",
            EffectState::Failed => "failed",
            EffectState::Unknown => "unknown",
            EffectState::Confirmed => "confirmed",
            EffectState::Retried => "retried",
            EffectState::Abandoned => "abandoned",
        }
    }

    /// Whether this is an outcome a tenure reports (`done`, `failed`, `unknown`).
    fn is_outcome(self) -> bool {
        matches!(
            self,
            EffectState::Done | EffectState::Failed | EffectState::Unknown
        )
    }
}

impl std::fmt::Display for EffectState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One attempt of an effect, as the ledger keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Effect {
    /// The attempt's id (`pgfence.effects.id`).
    pub id: i64,
    /// The task it belongs to.
    pub task_id: i64,
    /// The task's key.
    pub task_key: String,
    /// The cluster-qualified lease.
    pub lease: String,
    /// The effect key: the idempotency key the external system is asked about, the same for every attempt.
    pub key: String,
    /// The attempt's number, from 1.
    pub attempt: u32,
    /// The tenure that recorded the intent.
    pub epoch: Epoch,
    /// What the effect does, as the intent recorded it.
    pub intent: serde_json::Value,
    /// Where it stands.
    pub state: EffectState,
    /// The outcome's detail (the external system's answer), or the settlement's (what was observed, the reason).
    pub detail: Option<serde_json::Value>,
    /// The tenure that settled it, once settled.
    pub settled_by: Option<Epoch>,
}

/// The answer of a ledger write.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EffectWrite {
    /// The attempt after the write. For [`Settlement::Retry`], the new attempt (open, under the settling epoch):
    /// make the external call for it, then [`record_outcome`](Effects::record_outcome).
    pub effect: Effect,
    /// Whether this call wrote (false: a retry of the same call found it written, and wrote nothing).
    pub created: bool,
    /// The task event the write appended.
    pub event_id: Option<i64>,
    /// For a settle: how long the effect had been in doubt, from the end of its tenure (or its `unknown`
    /// outcome) to the settle, by the database clock.
    pub in_doubt_for: Option<Duration>,
}

/// What an external call came to, reported by the tenure that made it ([`Effects::record_outcome`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome", content = "detail")]
#[non_exhaustive]
pub enum Outcome {
    /// It succeeded; the external system's answer.
    Done(serde_json::Value),
    /// It failed (the external system said so); why.
    Failed(serde_json::Value),
    /// No answer (a timeout, a lost connection): the effect is in doubt until settled.
    Unknown(serde_json::Value),
}

impl Outcome {
    fn parts(&self) -> (&'static str, &serde_json::Value) {
        match self {
            Outcome::Done(detail) => ("done", detail),
            Outcome::Failed(detail) => ("failed", detail),
            Outcome::Unknown(detail) => ("unknown", detail),
        }
    }
}

/// How a tenure settles an effect in doubt, after asking the external system by the effect key
/// ([`Effects::settle`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Settlement {
    /// The effect happened: what the external system showed.
    Confirmed {
        /// What was observed.
        observed: serde_json::Value,
    },
    /// It did not happen: attempt it again under the same effect key (a new attempt under the settling epoch;
    /// the external system sees the same idempotency key).
    Retry {
        /// What was observed (e.g. the external system has no record of the key).
        observed: serde_json::Value,
    },
    /// Give it up. This records what was seen, not what will be: a request still in transit may yet be applied
    /// by the external system — abandon only an effect it will refuse from now on (its key cancelled there, or
    /// past the request's delivery deadline); otherwise retry under the same key.
    Abandon {
        /// Why (non-empty).
        reason: String,
    },
}

impl Settlement {
    fn parts(&self) -> (&'static str, serde_json::Value) {
        match self {
            Settlement::Confirmed { observed } => ("confirmed", observed.clone()),
            Settlement::Retry { observed } => ("retried", observed.clone()),
            Settlement::Abandon { reason } => {
                ("abandoned", serde_json::json!({ "reason": reason }))
            }
        }
    }
}

/// The tenure that left an effect in doubt, as the database tells it (its clock).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EndedTenure {
    /// Its holder.
    pub holder: Option<String>,
    /// How it ended: `released`, `expired`, `forced`, `reacquired`, `failover` (none yet: expired, not taken).
    pub end_reason: Option<String>,
    /// When it ended.
    pub ended_at: Option<DateTime<Utc>>,
    /// Its last accepted write.
    pub last_write_at: Option<DateTime<Utc>>,
    /// How its holder said it ended (`lost`, `deadline`, …), if it said so.
    pub belief_end_cause: Option<String>,
    /// When its last belief report arrived.
    pub last_belief_at: Option<DateTime<Utc>>,
}

/// An outcome the attempt's own tenure sent after it had ended: refused as a write, kept as evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LateReport {
    /// The outcome it reported ([`EffectState::Done`], [`Failed`](EffectState::Failed) or
    /// [`Unknown`](EffectState::Unknown)).
    pub state: EffectState,
    /// Its detail (the external system's answer).
    pub detail: serde_json::Value,
    /// When it last arrived (database clock).
    pub reported_at: DateTime<Utc>,
    /// How many times it was sent.
    pub count: u64,
}

/// An effect in doubt, with what a successor needs to settle it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct InDoubt {
    /// The attempt ([`EffectState::Open`] or [`Unknown`](EffectState::Unknown)).
    pub effect: Effect,
    /// When its intent was recorded (database clock).
    pub intended_at: DateTime<Utc>,
    /// The tenure that recorded it.
    pub tenure: EndedTenure,
    /// Its late report, if the old tenure sent one.
    pub late_report: Option<LateReport>,
}

/// The effect ledger of a [`Store`] ([`Store::effects`]).
#[derive(Debug, Clone, Copy)]
pub struct Effects<'a> {
    store: &'a Store,
}

impl Store {
    /// The effect ledger: intents, outcomes, what is in doubt, and settling it (see [`Effects`]).
    pub fn effects(&self) -> Effects<'_> {
        Effects { store: self }
    }
}

fn validate_effect_key(key: &str) -> Result<()> {
    validate_holder("effect key", key)
}

impl Effects<'_> {
    async fn write<Q>(
        &self,
        fence: &Fence,
        function: &'static str,
        effect_key: &str,
        query: impl Fn() -> Q,
    ) -> Result<EffectWrite>
    where
        Q: diesel_async::methods::LoadQuery<
                'static,
                diesel_async::AsyncPgConnection,
                EffectResultRow,
            > + Send
            + 'static,
    {
        let row: EffectResultRow = self.store.call_guarded(query).await?;
        match row.answer(function, fence, effect_key)? {
            Answer::Ok(write) => Ok(write),
            Answer::Err(error) => Err(error),
        }
    }

    /// Records, under `fence`, the intent of effect `effect_key` of task `task_key` **before** calling the
    /// external system: `intent` says what is about to be done. Call the external system only once this
    /// returned: a tenure that has ended is refused here (audited), before it calls anything.
    ///
    /// `effect_key` is the idempotency key the external system is given and can be asked about: stable across
    /// retries and successors (derive it from the task, never from the attempt or the epoch). A retry of this call
    /// by the same tenure with the same intent answers the recorded attempt (`created == false`); after a failed
    /// or abandoned attempt it records the next one.
    ///
    /// ```no_run
    /// # async fn example(store: pgfence::Store, lease: pgfence::Lease) -> pgfence::Result<()> {
    /// use pgfence::effects::Outcome;
    /// let fence = lease.fence();
    /// let intent = serde_json::json!({"launch": "api:1.7", "replicas": 3});
    /// store.effects().intend(&fence, "deploy-42", "deploy-42/launch", &intent).await?;
    /// // … call the workload engine with idempotency key "deploy-42/launch" …
    /// let answer = serde_json::json!({"workload": "w-981"});
    /// store.effects().record_outcome(&fence, "deploy-42/launch", &Outcome::Done(answer)).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// - [`Error::InDoubt`] when the task has an effect in doubt (an ended tenure's, or one whose outcome is
    ///   unknown): settle it first.
    /// - [`Error::EffectConflict`] when the key's effect is done ([`EffectConflict::Done`]), in flight with
    ///   another intent, or another task's.
    /// - [`Error::TaskNotFound`]; [`Error::Stale`] or [`Error::Denied`] when the fence is refused (audited).
    /// - [`Error::InvalidInput`] for a malformed key or a refused intent; nothing was sent.
    /// - The [errors of every database call](crate#errors).
    ///
    /// # Cancel safety
    ///
    /// A dropped call may have recorded the intent: call again (idempotent for the same intent).
    #[tracing::instrument(name = "record_intent", level = "debug", skip_all,
        fields(lease = fence.lease(), epoch = fence.epoch().get(), task = task_key, effect = effect_key))]
    pub async fn intend(
        &self,
        fence: &Fence,
        task_key: &str,
        effect_key: &str,
        intent: &serde_json::Value,
    ) -> Result<EffectWrite> {
        validate_holder("task key", task_key)?;
        validate_effect_key(effect_key)?;
        validate_payload(intent)?;
        let query = || {
            RowsOf(sql::record_intent(
                fence.lease().to_owned(),
                fence.epoch().get(),
                fence.secret().expose_secret().to_owned(),
                task_key.to_owned(),
                effect_key.to_owned(),
                intent.clone(),
            ))
        };
        self.write(fence, "record_intent", effect_key, query).await
    }

    /// Records, under `fence`, the outcome of this tenure's attempt of `effect_key` **after** the external call.
    /// [`Outcome::Unknown`] (no answer) leaves the effect in doubt: settle it, or report the final outcome once
    /// known. A final outcome stands (the same one again answers `created == false`).
    ///
    /// When the tenure has ended, the outcome is refused as a write (audited, [`Error::Stale`]) and kept as the
    /// attempt's [`LateReport`] for the successor — evidence, which changes nothing by itself.
    ///
    /// The outcome is recorded on the key's last attempt (which must be this tenure's): after this tenure
    /// retried its own `unknown` attempt, a late answer to the first attempt lands on the retry — the same key,
    /// so the same effect for an external system that deduplicates by key.
    ///
    /// # Errors
    ///
    /// - [`Error::Stale`] or [`Error::Denied`] when the fence is refused (audited).
    /// - [`Error::EffectConflict`]: the key's last attempt is another tenure's, settled, or has another outcome.
    /// - [`Error::EffectNotFound`]; [`Error::InvalidInput`] for a malformed key or detail (nothing sent).
    /// - The [errors of every database call](crate#errors).
    ///
    /// # Cancel safety
    ///
    /// A dropped call may have recorded the outcome: call again with the same outcome.
    #[tracing::instrument(name = "record_outcome", level = "debug", skip_all,
        fields(lease = fence.lease(), epoch = fence.epoch().get(), effect = effect_key))]
    pub async fn record_outcome(
        &self,
        fence: &Fence,
        effect_key: &str,
        outcome: &Outcome,
    ) -> Result<EffectWrite> {
        validate_effect_key(effect_key)?;
        let (name, detail) = outcome.parts();
        validate_payload(detail)?;
        let query = || {
            RowsOf(sql::record_outcome(
                fence.lease().to_owned(),
                fence.epoch().get(),
                fence.secret().expose_secret().to_owned(),
                effect_key.to_owned(),
                name.to_owned(),
                detail.clone(),
            ))
        };
        self.write(fence, "record_outcome", effect_key, query).await
    }

    /// Settles, under `fence`, the effect `effect_key`, which is in doubt — after asking the external system
    /// about the key. Exactly once: a second settle, by this tenure or any later one, is refused
    /// ([`EffectConflict::Settled`] naming who settled it), and a tenure that has ended is refused by the guard.
    /// The settle is an event in the task's history with this epoch.
    ///
    /// [`Settlement::Retry`] records the next attempt under this tenure and answers it: make the external call
    /// with the same key, then [`record_outcome`](Self::record_outcome).
    ///
    /// ```no_run
    /// # async fn example(store: pgfence::Store, ctx: pgfence::leader::LeaderContext) -> pgfence::Result<()> {
    /// use pgfence::effects::Settlement;
    /// for doubt in ctx.in_doubt() {
    ///     // Ask the engine by doubt.effect.key …
    ///     let found = serde_json::json!({"workload": "w-981", "state": "running"});
    ///     store.effects().settle(&ctx.fence(), &doubt.effect.key, &Settlement::Confirmed { observed: found }).await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// - [`Error::EffectConflict`]: settled already, not in doubt (a final outcome), or in flight (its tenure is
    ///   this one and has not reported).
    /// - [`Error::Stale`] or [`Error::Denied`] when the fence is refused (audited).
    /// - [`Error::EffectNotFound`]; [`Error::InvalidInput`] for a malformed key, detail, or an empty reason.
    /// - The [errors of every database call](crate#errors).
    ///
    /// # Cancel safety
    ///
    /// A dropped settle may have committed: settling again answers [`EffectConflict::Settled`] by this epoch.
    #[tracing::instrument(name = "settle_effect", level = "debug", skip_all,
        fields(lease = fence.lease(), epoch = fence.epoch().get(), effect = effect_key))]
    pub async fn settle(
        &self,
        fence: &Fence,
        effect_key: &str,
        settlement: &Settlement,
    ) -> Result<EffectWrite> {
        validate_effect_key(effect_key)?;
        let (resolution, detail) = settlement.parts();
        if let Settlement::Abandon { reason } = settlement {
            if reason.trim().is_empty() {
                return Err(Error::invalid(
                    "reason",
                    "abandoning an effect needs a reason",
                ));
            }
        }
        validate_payload(&detail)?;
        let query = || {
            RowsOf(sql::settle_effect(
                fence.lease().to_owned(),
                fence.epoch().get(),
                fence.secret().expose_secret().to_owned(),
                effect_key.to_owned(),
                resolution.to_owned(),
                detail.clone(),
            ))
        };
        let write = self
            .write(fence, "settle_effect", effect_key, query)
            .await?;
        if let Some(waited) = write.in_doubt_for {
            metrics::histogram!(METRIC_EFFECT_SETTLE_SECONDS,
                "lease" => fence.lease().to_owned(), "resolution" => resolution)
            .record(waited.as_secs_f64());
        }
        Ok(write)
    }

    /// The effects of lease `name` (this store's cluster) in doubt, oldest first: each attempt whose outcome is
    /// unknown, or that has none and whose tenure has ended — with the ended tenure (its holder, how and when it
    /// ended, its last accepted write and belief report) and its late report, if any. Sets the gauge
    /// [`METRIC_EFFECTS_IN_DOUBT`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a malformed `name`, and the [errors of every database call](crate#errors).
    /// Dropping the future is safe: it only reads.
    pub async fn in_doubt(&self, name: &str) -> Result<Vec<InDoubt>> {
        validate_name(name)?;
        self.in_doubt_of(&self.store.qualify(name)).await
    }

    /// [`in_doubt`](Self::in_doubt) by cluster-qualified lease name.
    pub(crate) async fn in_doubt_of(&self, lease: &str) -> Result<Vec<InDoubt>> {
        let rows: Vec<InDoubtRow> = self
            .store
            .load_all(RowsOf(sql::in_doubt_effects(lease.to_owned())))
            .await?;
        let listed = rows
            .into_iter()
            .map(|row| row.into_in_doubt(lease))
            .collect::<Result<Vec<_>>>()?;
        metrics::gauge!(METRIC_EFFECTS_IN_DOUBT, "lease" => lease.to_owned())
            .set(listed.len() as f64);
        Ok(listed)
    }
}
