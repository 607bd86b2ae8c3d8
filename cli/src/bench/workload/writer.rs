//! The writers: what one writer of a workload does, step after step, through the pool, the raw client or the
//! library's API, and the answer of one guarded attempt.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use diesel::pg::sql_types::Jsonb;
use diesel::sql_types::{BigInt, Text};
use pgfence::effects::Outcome;
use pgfence::tasks::TaskState;
use pgfence::{Fence, Lease, Store};
use serde_json::json;
use tokio_postgres::types::Json;

use super::super::{db_error, Failure};
use super::raw::RawClient;
use super::{append_key, claim_key, sql, Workload, HOLDER, OPERATION, TTL};

/// The outcome of a write function's row, by column name.
#[derive(diesel::QueryableByName)]
struct Verdict {
    #[diesel(sql_type = Text)]
    outcome: String,
}

/// A write's answer: accepted, refused by pgfence's guard (stale or denied), or a failure.
fn refused_or(result: Result<bool, pgfence::Error>) -> Result<bool, Failure> {
    match result {
        Ok(accepted) => Ok(accepted),
        Err(pgfence::Error::Stale { .. } | pgfence::Error::Denied { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The effect keys of `effect-pair`: a done key is never intended again, so every pair takes a new one.
static EFFECT_KEYS: AtomicU64 = AtomicU64::new(0);

/// The epoch `peer-for-share` reads under its share lock.
#[derive(diesel::QueryableByName)]
struct EpochRow {
    #[diesel(sql_type = BigInt)]
    epoch: i64,
}

/// What one writer does, step after step.
pub(in super::super) struct Writer {
    workload: Workload,
    index: usize,
    batch: i64,
    store: Store,
    fence: Fence,
    raw: Option<Arc<RawClient>>,
    /// `claim-transition`: whether the task is claimed now (the next step moves it back to pending).
    claimed: bool,
    /// `acquire`: how many leases there are to pick from.
    lease_rows: u32,
    /// `renew`: the lease to renew, taken before each round.
    lease: Option<Lease>,
}

impl Writer {
    #[allow(clippy::too_many_arguments)]
    pub(in super::super) fn new(
        workload: Workload,
        index: usize,
        batch: u32,
        store: Store,
        fence: Fence,
        raw: Option<Arc<RawClient>>,
        lease_rows: u32,
    ) -> Writer {
        Writer {
            workload,
            index,
            batch: i64::from(batch),
            store,
            fence,
            raw,
            claimed: false,
            lease_rows,
            lease: None,
        }
    }

    /// The fence the next write presents (the takeover measurement hands each tenure to its writers).
    pub(in super::super) fn set_fence(&mut self, fence: Fence) {
        self.fence = fence;
    }

    pub(in super::super) fn set_claimed(&mut self, claimed: bool) {
        self.claimed = claimed;
    }

    pub(in super::super) fn set_lease(&mut self, lease: Lease) {
        self.lease = Some(lease);
    }

    fn raw(&self) -> &RawClient {
        self.raw.as_deref().expect("raw workloads get a raw client")
    }

    fn stale(&self, outcome: &str) -> Result<(), Failure> {
        if outcome == "ok" {
            return Ok(());
        }
        Err(Failure::new(
            1,
            format!(
                "{}: the guard answered {outcome:?} for {} epoch {}",
                self.workload.name(),
                self.fence.lease(),
                self.fence.epoch()
            ),
        ))
    }

    /// The writer's rows of the user table: ids `[lo, hi)`.
    fn rows(&self) -> (i64, i64) {
        let lo = self.index as i64 * self.batch;
        (lo, lo + self.batch)
    }

    /// One write of the guard workloads (pgfence's `fenced` and `guarded-update`, and the peers): whether the
    /// guard accepted it. A refusal is an answer here, not a failure (the takeover measurement counts them).
    pub(in super::super) async fn attempt(&mut self) -> Result<bool, Failure> {
        use diesel_async::RunQueryDsl;
        let (lo, hi) = self.rows();
        let batch = self.batch;
        let update = move || {
            // Prepared once per connection, like the raw path's statements: the ratios isolate the guard.
            pgfence::guard::Cached::new(
                diesel::sql_query(sql::UPDATE)
                    .bind::<BigInt, _>(lo)
                    .bind::<BigInt, _>(hi),
            )
        };
        let lease = self.fence.lease().to_owned();
        let epoch = self.fence.epoch().get();
        match self.workload {
            Workload::Fenced | Workload::FencedNative => {
                let written = self
                    .store
                    .fenced(&self.fence, OPERATION, async move |conn| {
                        update().execute(conn).await?;
                        Ok::<_, pgfence::Error>(())
                    })
                    .await;
                refused_or(written.map(|()| true))
            }
            Workload::GuardedUpdate | Workload::GuardedUpdateNative => {
                let written = self
                    .store
                    .guarded_write(
                        &self.fence,
                        OPERATION,
                        diesel::sql_query(sql::GATED_UPDATE)
                            .bind::<BigInt, _>(lo)
                            .bind::<BigInt, _>(hi),
                    )
                    .await;
                refused_or(written.map(|n| n as i64 == batch))
            }
            Workload::PeerForShare => {
                use diesel_async::SimpleAsyncConnection;
                let conn = self.store.admin().conn().await?;
                let c: &diesel_async::AsyncPgConnection = &conn;
                let (mut begin_conn, mut check_conn) = (c, c);
                // BEGIN and the check pipelined, as Store::fenced does with its guard.
                let (begun, current) = tokio::join!(
                    begin_conn.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED"),
                    pgfence::guard::Cached::new(
                        diesel::sql_query(sql::FOR_SHARE).bind::<Text, _>(lease)
                    )
                    .get_result::<EpochRow>(&mut check_conn)
                );
                begun.map_err(pgfence::Error::from)?;
                let current = current.map_err(pgfence::Error::from)?.epoch;
                let mut conn_ref = c;
                if current == epoch {
                    update()
                        .execute(&mut conn_ref)
                        .await
                        .map_err(pgfence::Error::from)?;
                }
                conn_ref
                    .batch_execute("COMMIT")
                    .await
                    .map_err(pgfence::Error::from)?;
                Ok(current == epoch)
            }
            Workload::PeerForShareUpdate | Workload::PeerRowFence => {
                let mut conn = self.store.admin().conn().await?;
                let written = if self.workload == Workload::PeerForShareUpdate {
                    pgfence::guard::Cached::new(
                        diesel::sql_query(sql::FOR_SHARE_UPDATE)
                            .bind::<BigInt, _>(lo)
                            .bind::<BigInt, _>(hi)
                            .bind::<Text, _>(lease)
                            .bind::<BigInt, _>(epoch),
                    )
                    .execute(&mut *conn)
                    .await
                } else {
                    pgfence::guard::Cached::new(
                        diesel::sql_query(sql::ROW_FENCE_UPDATE)
                            .bind::<BigInt, _>(lo)
                            .bind::<BigInt, _>(hi)
                            .bind::<BigInt, _>(epoch),
                    )
                    .execute(&mut *conn)
                    .await
                }
                .map_err(pgfence::Error::from)?;
                Ok(written as i64 == batch)
            }
            other => unreachable!("{} is not a guard workload", other.name()),
        }
    }

    /// One round trip's worth of work (one transaction; for `claim-transition` one of its two writes).
    pub(in super::super) async fn step(&mut self) -> Result<(), Failure> {
        use diesel_async::RunQueryDsl;
        let (lo, hi) = self.rows();
        let update = move || {
            // Prepared once per connection, like the raw path's statements: the ratios isolate the guard.
            pgfence::guard::Cached::new(
                diesel::sql_query(sql::UPDATE)
                    .bind::<BigInt, _>(lo)
                    .bind::<BigInt, _>(hi),
            )
        };
        let lease = self.fence.lease().to_owned();
        let epoch = self.fence.epoch().get();
        let secret = self.fence.secret().expose_secret().to_owned();
        match self.workload {
            Workload::Update | Workload::UpdatePing => {
                let mut conn = self.store.admin().conn().await?;
                update()
                    .execute(&mut *conn)
                    .await
                    .map_err(pgfence::Error::from)?;
            }
            Workload::Tx => {
                let mut conn = self.store.admin().conn().await?;
                (*conn)
                    .build_transaction()
                    .read_committed()
                    .run(async move |conn: &mut diesel_async::AsyncPgConnection| {
                        update().execute(conn).await
                    })
                    .await
                    .map_err(pgfence::Error::from)?;
            }
            Workload::Fenced
            | Workload::FencedNative
            | Workload::GuardedUpdate
            | Workload::GuardedUpdateNative
            | Workload::PeerForShare
            | Workload::PeerForShareUpdate
            | Workload::PeerRowFence => {
                let accepted = self.attempt().await?;
                self.stale(if accepted { "ok" } else { "refused" })?;
            }
            Workload::RawFenced | Workload::RawPipelined => {
                let raw = self.raw();
                let c = &raw.client;
                let fence_params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                    [&lease, &epoch, &secret, &OPERATION];
                let verdict = if self.workload == Workload::RawPipelined {
                    // tokio-postgres pipelines requests that are in flight together on one connection.
                    let (_, row) = tokio::try_join!(
                        c.execute(&raw.begin, &[]),
                        c.query_one(&raw.fence, &fence_params)
                    )
                    .map_err(|e| db_error("raw fenced", e))?;
                    row
                } else {
                    c.execute(&raw.begin, &[])
                        .await
                        .map_err(|e| db_error("BEGIN", e))?;
                    c.query_one(&raw.fence, &fence_params)
                        .await
                        .map_err(|e| db_error("guard", e))?
                };
                let outcome: String = verdict
                    .try_get("outcome")
                    .map_err(|e| db_error("guard", e))?;
                if outcome == "ok" {
                    c.execute(&raw.update, &[&lo, &hi])
                        .await
                        .map_err(|e| db_error("UPDATE", e))?;
                }
                c.execute(&raw.commit, &[])
                    .await
                    .map_err(|e| db_error("COMMIT", e))?;
                self.stale(&outcome)?;
            }
            Workload::RawGuardedUpdate => {
                let raw = self.raw();
                let row = raw
                    .client
                    .query_one(
                        &raw.guarded_update,
                        &[&lo, &hi, &lease, &epoch, &secret, &OPERATION],
                    )
                    .await
                    .map_err(|e| db_error("guarded UPDATE", e))?;
                let outcome: String = row.try_get(0).map_err(|e| db_error("guard", e))?;
                self.stale(&outcome)?;
            }
            Workload::RawGuardedUpdateNative => {
                let raw = self.raw();
                let statement = raw
                    .guarded_update_native
                    .as_ref()
                    .expect("native workloads run only where pgfence_native is installed");
                let row = raw
                    .client
                    .query_one(statement, &[&lo, &hi, &lease, &epoch, &secret, &OPERATION])
                    .await
                    .map_err(|e| db_error("native guarded UPDATE", e))?;
                let outcome: String = row.try_get(0).map_err(|e| db_error("guard", e))?;
                self.stale(&outcome)?;
            }
            Workload::RawAdvisoryUpdate => {
                let raw = self.raw();
                let row = raw
                    .client
                    .query_one(&raw.advisory_update, &[&lo, &hi, &lease, &epoch])
                    .await
                    .map_err(|e| db_error("advisory guarded UPDATE", e))?;
                let outcome: String = row.try_get(0).map_err(|e| db_error("guard", e))?;
                self.stale(&outcome)?;
            }
            Workload::Append | Workload::AppendOwnLease => {
                self.store
                    .tasks()
                    .append_event(
                        &self.fence,
                        &append_key(if self.workload == Workload::Append {
                            self.index
                        } else {
                            0
                        }),
                        OPERATION,
                        &json!({}),
                    )
                    .await?;
            }
            Workload::EffectPair => {
                let task = append_key(self.index);
                let key = format!("e{}", EFFECT_KEYS.fetch_add(1, Ordering::Relaxed));
                let effects = self.store.effects();
                effects.intend(&self.fence, &task, &key, &json!({})).await?;
                effects
                    .record_outcome(&self.fence, &key, &Outcome::Done(json!({})))
                    .await?;
            }
            Workload::EventPair => {
                let task = append_key(self.index);
                for _ in 0..2 {
                    self.store
                        .tasks()
                        .append_event(&self.fence, &task, OPERATION, &json!({}))
                        .await?;
                }
            }
            Workload::AppendUnguarded => {
                let mut conn = self.store.admin().conn().await?;
                let row: Verdict = pgfence::guard::Cached::new(
                    diesel::sql_query(sql::APPEND_UNGUARDED)
                        .bind::<Text, _>(lease)
                        .bind::<BigInt, _>(epoch)
                        .bind::<Text, _>(append_key(self.index))
                        .bind::<Text, _>(OPERATION)
                        .bind::<Jsonb, _>(json!({})),
                )
                .get_result(&mut *conn)
                .await
                .map_err(pgfence::Error::from)?;
                self.stale(&row.outcome)?;
            }
            Workload::ClaimTransition => {
                let key = claim_key(self.index);
                if self.claimed {
                    self.store
                        .tasks()
                        .transition(
                            &self.fence,
                            &key,
                            TaskState::Claimed,
                            TaskState::Pending,
                            &json!({}),
                        )
                        .await?;
                } else {
                    self.store.tasks().claim(&self.fence, &key, HOLDER).await?;
                }
                self.claimed = !self.claimed;
            }
            Workload::RawAppend => {
                let raw = self.raw();
                let payload = Json(json!({}));
                let row = raw
                    .client
                    .query_one(
                        &raw.append,
                        &[
                            &lease,
                            &epoch,
                            &append_key(self.index),
                            &OPERATION,
                            &payload,
                            &secret,
                        ],
                    )
                    .await
                    .map_err(|e| db_error("append_event", e))?;
                let outcome: String = row
                    .try_get("outcome")
                    .map_err(|e| db_error("append_event", e))?;
                self.stale(&outcome)?;
            }
            Workload::Acquire => {
                let n = fastrand::u32(1..=self.lease_rows.max(1));
                self.store.acquire(&format!("l{n}"), HOLDER, TTL).await?;
            }
            Workload::Renew => {
                let lease = self
                    .lease
                    .as_mut()
                    .expect("renew writers get their lease before each round");
                self.store.renew(lease).await?;
            }
            Workload::PgbenchFenced | Workload::PgbenchAppend => {
                unreachable!("pgbench workloads run in pgbench")
            }
        }
        Ok(())
    }
}
