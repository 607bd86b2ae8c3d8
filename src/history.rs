//! The record of every tenure, from both sides, and the overlap review built on it.
//!
//! The database's side is exact and by its clock: when each tenure was granted and ended
//! (`pgfence.tenures`), the connection that acquired it as the server saw it, the last write it accepted under
//! the epoch (task events exactly, other guarded writes by the guard's write marks, at most one second early)
//! and every refused write (`pgfence.rejections`). The holder's side is what it reports, best effort
//! ([`Store::report_belief_start`], [`Store::report_belief_end`]; the leadership runtime does it by itself):
//! when it started and stopped believing it led, by its own wall clock, and the endpoint it used.
//!
//! The two clocks are never compared directly. Each report carries the holder's clock when it was sent and gets
//! the database's clock when it arrived; the acquisition reply went the other way. Messages take a non-negative
//! time to travel, so these bound the offset between the clocks from both sides (as NTP does), and a holder's
//! belief is placed on the database's time line as an interval, not a point: [`Store::review`] says an overlap
//! with the successor is [`Overlap::Certain`] only when even the earliest placement is after the successor's
//! acquisition, and a refused write after it is proof by the database's clock alone. SQL:
//! `migrations/2026-11-30-000002_lease_protocol` (`pgfence.report_belief`, `pgfence.tenure_history`), the write
//! marks in `000003_guard` (`pgfence._guard`).

use std::fmt;

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Nullable, Text, Timestamptz};
use diesel::QueryableByName;
use serde::{Deserialize, Serialize};

use crate::audit::{Rejection, REJECTION_COLUMNS};
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::store::Store;
use crate::types::{Epoch, LossReason};
use crate::validate::validate_name;

/// How far apart the holder's and the database's clocks may drift per second of a tenure, in parts per million,
/// when the clock offset measured at the acquisition is applied to the end of a belief: 200 ppm, well above the
/// rate error of an undisciplined quartz clock (tens of ppm).
pub const CLOCK_DRIFT_PPM: i64 = 200;

/// The resolution of the write marks: the last guarded write a tenure accepted is at most this long after its
/// latest mark ([`Tenure::last_mark_at`]). Task events are exact.
pub const WRITE_MARK_RESOLUTION: std::time::Duration = std::time::Duration::from_secs(1);

/// One issued epoch: how the database saw its tenure, what its holder reported believing, and its last
/// accepted write.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Tenure {
    /// The cluster-qualified name.
    pub lease: String,
    /// The epoch of this tenure.
    pub epoch: Epoch,
    /// Who held it.
    pub holder: String,
    /// When it began (database clock, UTC).
    pub acquired_at: DateTime<Utc>,
    /// When it ended (database clock); `None` while current.
    pub ended_at: Option<DateTime<Utc>>,
    /// `released`, `expired`, `forced`, `reacquired` or `failover` (granted before a promotion, ended after it);
    /// `None` while current.
    pub end_reason: Option<String>,
    /// The last write accepted under this epoch (database clock): the later of
    /// [`last_event_at`](Self::last_event_at) and [`last_mark_at`](Self::last_mark_at).
    pub last_write_at: Option<DateTime<Utc>>,
    /// The newest task event of this epoch (exact).
    pub last_event_at: Option<DateTime<Utc>>,
    /// The newest write mark of this epoch: the last guarded write of any kind (a fenced transaction, a
    /// one-statement guarded write, the SQL guard, a task write) it accepted is at most
    /// [`WRITE_MARK_RESOLUTION`] later.
    pub last_mark_at: Option<DateTime<Utc>>,
    /// The acquiring connection, as the server saw it.
    pub server: ServerView,
    /// What the holder reported believing.
    pub belief: Belief,
}

/// The connection that acquired a tenure, as the server saw it when it granted the tenure.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ServerView {
    /// The server's system identifier (`None` when the schema owner may not read it).
    pub system_identifier: Option<String>,
    /// The pgfence instance id (see [`DatabaseIdentity`](crate::DatabaseIdentity)).
    pub instance_id: Option<String>,
    /// The WAL timeline the tenure was granted on.
    pub timeline: Option<i64>,
    /// The server's address and port for that connection (`None` over a Unix socket).
    pub server_addr: Option<String>,
    /// The client's address and port (a pooler's, when one is in between; `None` over a Unix socket).
    pub client_addr: Option<String>,
    /// The session's `application_name`. Chosen by the client: escape it before printing.
    pub application_name: Option<String>,
}

/// What a holder reported believing about its tenure: every time is its own wall clock (UTC) except the
/// `*_received_at` ones (the database's clock when the report arrived). `None` where no report arrived — a
/// killed process never reports its end, and that stays unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Belief {
    /// The endpoint the holder used, as it saw it (`host:port[,host:port…]/dbname`, no credentials).
    pub endpoint: Option<String>,
    /// When it received the acquisition's reply (holder clock).
    pub from: Option<DateTime<Utc>>,
    /// When it sent the start report (holder clock).
    pub start_sent_at: Option<DateTime<Utc>>,
    /// When the start report arrived (database clock).
    pub start_received_at: Option<DateTime<Utc>>,
    /// When it stopped believing (holder clock).
    pub until: Option<DateTime<Utc>>,
    /// Why: `released`, `lost`, `deadline`, `write_refused` or `shutdown` ([`BeliefEnd::cause`]).
    pub end_cause: Option<String>,
    /// The detail of the cause (the loss reason, …).
    pub end_detail: Option<String>,
    /// When it sent the end report (holder clock).
    pub end_sent_at: Option<DateTime<Utc>>,
    /// When the end report arrived (database clock).
    pub end_received_at: Option<DateTime<Utc>>,
}

/// Why a holder stopped believing it led a tenure, as [`Store::report_belief_end`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "cause", content = "reason")]
#[non_exhaustive]
pub enum BeliefEnd {
    /// It released the tenure.
    Released,
    /// The database said the tenure was over (a renewal answered it).
    Lost(LossReason),
    /// Its local deadline passed without a renewal.
    Deadline,
    /// A guarded write of it was refused (the reason, when it was a stale epoch).
    WriteRefused(Option<LossReason>),
    /// It shut down while leading.
    Shutdown,
}

impl BeliefEnd {
    /// The cause as stored: `released`, `lost`, `deadline`, `write_refused` or `shutdown`.
    pub fn cause(self) -> &'static str {
        match self {
            BeliefEnd::Released => "released",
            BeliefEnd::Lost(_) => "lost",
            BeliefEnd::Deadline => "deadline",
            BeliefEnd::WriteRefused(_) => "write_refused",
            BeliefEnd::Shutdown => "shutdown",
        }
    }

    fn detail(self) -> Option<&'static str> {
        match self {
            BeliefEnd::Lost(reason) | BeliefEnd::WriteRefused(Some(reason)) => {
                Some(reason.as_str())
            }
            _ => None,
        }
    }
}

impl fmt::Display for BeliefEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.detail() {
            Some(detail) => write!(f, "{} ({detail})", self.cause()),
            None => f.write_str(self.cause()),
        }
    }
}

/// A tenure with what the review concludes about it: its successor, the clock offset its holder's reports
/// allow, where its belief's end lies on the database's time line, and whether its holder believed it led
/// after the successor's acquisition committed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TenureReview {
    /// The tenure.
    pub tenure: Tenure,
    /// The next tenure of the lease, if any.
    pub successor: Option<Successor>,
    /// The bounds on (database clock − holder clock) that the holder's reports allow; `None` without a report,
    /// or when the reports contradict each other (the holder's clock was stepped).
    pub clock_offset: Option<OffsetBounds>,
    /// The end of the holder's belief placed on the database's time line: the earliest and latest database
    /// time it can have been. `None` without an end report or an offset.
    pub believed_until_db: Option<Interval>,
    /// Whether the holder believed it led after the successor's acquisition committed.
    pub overlap: Overlap,
    /// A write of this epoch accepted at or after the successor's acquisition (database clock). The guard makes
    /// this impossible; `Some` is a broken fence, and the report says so.
    pub accepted_after_successor: Option<DateTime<Utc>>,
    /// The audit's refusals of this epoch's writes last seen at or after the successor's acquisition: what
    /// the holder tried while it (or a write in flight) still believed.
    pub refusals_after_successor: Vec<Rejection>,
}

/// The tenure that followed another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Successor {
    /// Its epoch.
    pub epoch: Epoch,
    /// Its holder.
    pub holder: String,
    /// When its acquisition committed (database clock).
    pub acquired_at: DateTime<Utc>,
}

/// Bounds on (database clock − holder clock), in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct OffsetBounds {
    /// At least this (from the acquisition reply: the database's clock when it granted, minus the holder's
    /// when the reply arrived). `None` without a start report.
    pub min_us: Option<i64>,
    /// At most this (from a report: the database's clock when it arrived, minus the holder's when it was sent).
    pub max_us: i64,
}

/// A closed interval of database time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Interval {
    /// The earliest it can have been (`None`: unbounded, no start report).
    pub earliest: Option<DateTime<Utc>>,
    /// The latest it can have been.
    pub latest: DateTime<Utc>,
}

/// Whether a holder believed it led after its successor's acquisition committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "overlap")]
#[non_exhaustive]
pub enum Overlap {
    /// The tenure has no successor (yet).
    NoSuccessor,
    /// Its belief ended before the successor's acquisition, even at the latest placement.
    None,
    /// The placements allow both: the clock bounds are too wide to tell.
    Possible,
    /// It did: the database's refusal of a write it sent after the successor's acquisition proves it by the
    /// database clock alone (`refused_write_at`), or its reported end lies after it at the earliest placement.
    Certain {
        /// The latest refusal of its writes (database clock), when that is the proof.
        refused_write_at: Option<DateTime<Utc>>,
    },
    /// No end report arrived (the process was killed, or reporting is off) and no refusal proves it.
    Unknown,
}

impl Store {
    /// Reports, after the fact and best effort, that this process started believing it leads `lease`:
    /// [`Lease::believed_from`] (its wall clock when the acquisition's reply arrived) and the endpoint it
    /// used ([`Store::endpoint`]). The first start report of a tenure stands; a retry changes nothing. The
    /// leadership runtime reports by itself ([`LeaseOptions::report_beliefs`](crate::leader::LeaseOptions));
    /// users of [`Store::acquire`] opt in by calling this.
    ///
    /// # Errors
    ///
    /// - [`Error::Denied`] when the session's role has no grant on the cluster, or the lease's secret is not
    ///   its tenure's (audited).
    /// - The [errors of every database call](crate#errors).
    ///
    /// # Cancel safety
    ///
    /// A dropped report may or may not have been recorded; reporting again is harmless.
    #[tracing::instrument(level = "debug", skip_all, fields(lease = %lease.qualified_name(), epoch = lease.epoch().get()))]
    pub async fn report_belief_start(&self, lease: &Lease) -> Result<()> {
        self.report_belief(lease, "start", lease.believed_from(), None)
            .await
    }

    /// Reports, after the fact and best effort, that this process stopped believing it leads `lease` at `at`
    /// (its wall clock), and why. Call it when the belief ended (a loss noticed, the local deadline, a
    /// release, a refused write, a shutdown), not later: `at` is compared with the database's clock through
    /// the offset bounds the reports give ([`Store::review`]). The first end report of a tenure stands.
    ///
    /// # Errors
    ///
    /// As [`report_belief_start`](Self::report_belief_start).
    ///
    /// # Cancel safety
    ///
    /// A dropped report may or may not have been recorded; reporting again is harmless.
    #[tracing::instrument(level = "debug", skip_all, fields(lease = %lease.qualified_name(), epoch = lease.epoch().get()))]
    pub async fn report_belief_end(
        &self,
        lease: &Lease,
        at: DateTime<Utc>,
        end: BeliefEnd,
    ) -> Result<()> {
        self.report_belief(lease, "end", at, Some(end)).await
    }

    async fn report_belief(
        &self,
        lease: &Lease,
        event: &'static str,
        at: DateTime<Utc>,
        end: Option<BeliefEnd>,
    ) -> Result<()> {
        use diesel_async::RunQueryDsl;

        #[derive(QueryableByName)]
        struct Outcome {
            #[diesel(sql_type = Text)]
            outcome: String,
            #[diesel(sql_type = Nullable<Text>)]
            reason: Option<String>,
        }

        let mut conn = self.conn().await?;
        let row: Outcome = diesel::sql_query(
            "SELECT outcome, reason FROM pgfence.report_belief($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind::<Text, _>(lease.qualified_name())
        .bind::<BigInt, _>(lease.epoch().get())
        .bind::<Text, _>(lease.secret.expose_secret())
        .bind::<Text, _>(event)
        .bind::<Timestamptz, _>(at)
        .bind::<Timestamptz, _>(Utc::now())
        .bind::<Nullable<Text>, _>(if end.is_none() { self.endpoint() } else { None })
        .bind::<Nullable<Text>, _>(end.map(BeliefEnd::cause))
        .bind::<Nullable<Text>, _>(end.and_then(BeliefEnd::detail))
        .get_result(&mut *conn)
        .await?;
        match row.outcome.as_str() {
            "recorded" | "kept" => Ok(()),
            "refused" => Err(Error::Denied {
                lease: lease.qualified_name().to_owned(),
                operation: "report_belief".to_owned(),
                reason: crate::reply::deny_reason("report_belief", row.reason.as_deref())?,
            }),
            other => Err(crate::reply::unexpected(
                "report_belief",
                &format!("outcome {other}"),
            )),
        }
    }

    /// Every tenure of `name`, oldest first: the database's interval, the server's view of the acquiring
    /// connection, the holder's reported belief and the last accepted write.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a malformed `name`, and the [errors of every database call](crate#errors).
    /// Dropping the future is safe: it only reads ([cancel safety](crate#cancel-safety)).
    pub async fn tenures(&self, name: &str) -> Result<Vec<Tenure>> {
        use diesel_async::RunQueryDsl;
        validate_name(name)?;
        let mut conn = self.conn().await?;
        let rows: Vec<TenureRow> = diesel::sql_query(
            "SELECT lease, epoch, holder, acquired_at, ended_at, end_reason, last_write_at, last_event_at, \
                    last_mark_at, timeline, system_identifier, instance_id::text AS instance_id, server_addr, \
                    client_addr, application_name, endpoint, believed_from, start_sent_at, start_received_at, \
                    believed_until, end_cause, end_detail, end_sent_at, end_received_at \
               FROM pgfence.tenure_history WHERE lease = $1 ORDER BY epoch",
        )
        .bind::<Text, _>(self.qualify(name))
        .load(&mut *conn)
        .await?;
        rows.into_iter().map(Tenure::try_from).collect()
    }

    /// The overlap review of `name`: every tenure ([`Store::tenures`]) with its successor, the clock bounds
    /// its holder's reports allow, whether the holder believed it led after the successor's acquisition
    /// committed, any write of its epoch accepted after that (never, unless the fence is broken) and the
    /// refusals the audit recorded meanwhile. `pgfence history` prints it.
    ///
    /// # Errors
    ///
    /// As [`tenures`](Self::tenures). Dropping the future is safe: it only reads.
    pub async fn review(&self, name: &str) -> Result<Vec<TenureReview>> {
        use diesel_async::RunQueryDsl;
        let tenures = self.tenures(name).await?;
        let mut conn = self.conn().await?;
        let refusals: Vec<Rejection> = diesel::sql_query(format!(
            "SELECT {REJECTION_COLUMNS} FROM pgfence.rejections \
              WHERE lease = $1 AND scope = 'tenure' ORDER BY id"
        ))
        .bind::<Text, _>(self.qualify(name))
        .load(&mut *conn)
        .await?;
        Ok(review(tenures, &refusals))
    }
}

/// The review of a lease's tenures (oldest first) against its tenure-scope refusals.
pub(crate) fn review(tenures: Vec<Tenure>, refusals: &[Rejection]) -> Vec<TenureReview> {
    let successors: Vec<Option<Successor>> = (0..tenures.len())
        .map(|i| {
            tenures.get(i + 1).map(|next| Successor {
                epoch: next.epoch,
                holder: next.holder.clone(),
                acquired_at: next.acquired_at,
            })
        })
        .collect();
    tenures
        .into_iter()
        .zip(successors)
        .map(|(tenure, successor)| review_one(tenure, successor, refusals))
        .collect()
}

fn review_one(
    tenure: Tenure,
    successor: Option<Successor>,
    refusals: &[Rejection],
) -> TenureReview {
    let clock_offset = offset_bounds(&tenure);
    let believed_until_db = match (tenure.belief.until, clock_offset) {
        (Some(until), Some(offset)) => {
            // The lower bound was measured at the acquisition: allow for drift over the belief's length.
            let span_us = tenure
                .belief
                .from
                .map(|from| (until - from).num_microseconds().unwrap_or(i64::MAX).max(0))
                .unwrap_or(0);
            let drift_us = span_us.saturating_mul(CLOCK_DRIFT_PPM) / 1_000_000;
            Some(Interval {
                earliest: offset
                    .min_us
                    .map(|min| until + chrono::Duration::microseconds(min - drift_us)),
                latest: until + chrono::Duration::microseconds(offset.max_us),
            })
        }
        _ => None,
    };
    let (overlap, accepted_after_successor, refusals_after_successor) = match &successor {
        None => (Overlap::NoSuccessor, None, Vec::new()),
        Some(next) => {
            let later: Vec<Rejection> = refusals
                .iter()
                .filter(|r| {
                    r.presented_epoch == tenure.epoch.get()
                        && r.last_rejected_at >= next.acquired_at
                })
                .cloned()
                .collect();
            let accepted = [tenure.last_event_at, tenure.last_mark_at]
                .into_iter()
                .flatten()
                .filter(|at| *at >= next.acquired_at)
                .max();
            let refused_write_at = later.iter().map(|r| r.last_rejected_at).max();
            let overlap = match (refused_write_at, believed_until_db) {
                (Some(at), _) => Overlap::Certain {
                    refused_write_at: Some(at),
                },
                (None, Some(end)) if end.earliest.is_some_and(|e| e > next.acquired_at) => {
                    Overlap::Certain {
                        refused_write_at: None,
                    }
                }
                (None, Some(end)) if end.latest > next.acquired_at => Overlap::Possible,
                (None, Some(_)) => Overlap::None,
                (None, None) => Overlap::Unknown,
            };
            (overlap, accepted, later)
        }
    };
    TenureReview {
        tenure,
        successor,
        clock_offset,
        believed_until_db,
        overlap,
        accepted_after_successor,
        refusals_after_successor,
    }
}

/// (database − holder) clock bounds from a tenure's reports; `None` without a report or when they contradict
/// each other.
fn offset_bounds(tenure: &Tenure) -> Option<OffsetBounds> {
    let b = &tenure.belief;
    let us = |d: chrono::Duration| d.num_microseconds().unwrap_or(i64::MAX);
    let max_us = [
        b.start_received_at.zip(b.start_sent_at),
        b.end_received_at.zip(b.end_sent_at),
    ]
    .into_iter()
    .flatten()
    .map(|(received, sent)| us(received - sent))
    .min()?;
    let min_us = b.from.map(|from| us(tenure.acquired_at - from));
    if min_us.is_some_and(|min| min > max_us) {
        return None;
    }
    Some(OffsetBounds { min_us, max_us })
}

#[derive(QueryableByName)]
struct TenureRow {
    #[diesel(sql_type = Text)]
    lease: String,
    #[diesel(sql_type = BigInt)]
    epoch: i64,
    #[diesel(sql_type = Text)]
    holder: String,
    #[diesel(sql_type = Timestamptz)]
    acquired_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    ended_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Text>)]
    end_reason: Option<String>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    last_write_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    last_event_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    last_mark_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<BigInt>)]
    timeline: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    system_identifier: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    instance_id: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    server_addr: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    client_addr: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    application_name: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    endpoint: Option<String>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    believed_from: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    start_sent_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    start_received_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    believed_until: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Text>)]
    end_cause: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    end_detail: Option<String>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    end_sent_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    end_received_at: Option<DateTime<Utc>>,
}

impl TryFrom<TenureRow> for Tenure {
    type Error = Error;

    fn try_from(r: TenureRow) -> Result<Tenure> {
        Ok(Tenure {
            epoch: Epoch::new(r.epoch)?,
            lease: r.lease,
            holder: r.holder,
            acquired_at: r.acquired_at,
            ended_at: r.ended_at,
            end_reason: r.end_reason,
            last_write_at: r.last_write_at,
            last_event_at: r.last_event_at,
            last_mark_at: r.last_mark_at,
            server: ServerView {
                system_identifier: r.system_identifier,
                instance_id: r.instance_id,
                timeline: r.timeline,
                server_addr: r.server_addr,
                client_addr: r.client_addr,
                application_name: r.application_name,
            },
            belief: Belief {
                endpoint: r.endpoint,
                from: r.believed_from,
                start_sent_at: r.start_sent_at,
                start_received_at: r.start_received_at,
                until: r.believed_until,
                end_cause: r.end_cause,
                end_detail: r.end_detail,
                end_sent_at: r.end_sent_at,
                end_received_at: r.end_received_at,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration as D;

    fn t0() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-30T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    /// A tenure acquired at `t0` (database clock) by a holder whose clock reads `skew` ahead of the database's,
    /// with 1 ms each way between them, that believed until `until_db` (database time) and reported it.
    fn tenure(epoch: i64, skew: D, until_db: Option<DateTime<Utc>>) -> Tenure {
        let one_way = D::milliseconds(1);
        let acquired_at = t0();
        let from = acquired_at + one_way + skew;
        Tenure {
            lease: "c/l".into(),
            epoch: Epoch::new(epoch).unwrap(),
            holder: format!("h{epoch}"),
            acquired_at,
            ended_at: None,
            end_reason: None,
            last_write_at: None,
            last_event_at: None,
            last_mark_at: None,
            server: ServerView::default(),
            belief: Belief {
                endpoint: Some("db:5432/x".into()),
                from: Some(from),
                start_sent_at: Some(from),
                start_received_at: Some(from - skew + one_way),
                until: until_db.map(|u| u + skew),
                end_cause: until_db.map(|_| "deadline".into()),
                end_detail: None,
                end_sent_at: until_db.map(|u| u + skew),
                end_received_at: until_db.map(|u| u + one_way),
            },
        }
    }

    fn successor_at(at: DateTime<Utc>) -> Tenure {
        let mut next = tenure(2, D::zero(), None);
        next.acquired_at = at;
        next
    }

    fn refusal(epoch: i64, at: DateTime<Utc>) -> Rejection {
        serde_json::from_value(serde_json::json!({
            "id": 1, "role": "app", "scope": "tenure", "lease": "c/l", "last_lease": null,
            "presented_epoch": epoch, "current_epoch": 2, "current_holder": "h2", "reason": "superseded",
            "operation": "fenced_transaction", "target_table": null, "target_key": null,
            "rejected_at": at, "last_rejected_at": at, "count": 1, "last_target_key": null,
            "application_name": "x", "client_addr": null, "backend_pid": 1
        }))
        .unwrap()
    }

    fn overlap_of(first: Tenure, successor: DateTime<Utc>, refusals: &[Rejection]) -> TenureReview {
        review(vec![first, successor_at(successor)], refusals).remove(0)
    }

    /// The verdicts by where the belief's end lies, with the two clocks an hour apart: a naive comparison of the
    /// holder's clock with the database's would call every one of these an overlap.
    #[test]
    fn beliefs_are_placed_on_the_database_time_line_through_the_offset_bounds() {
        let skew = D::hours(1);
        let a = t0() + D::seconds(10);
        let before = overlap_of(tenure(1, skew, Some(a - D::milliseconds(100))), a, &[]);
        assert_eq!(before.overlap, Overlap::None);
        let after = overlap_of(tenure(1, skew, Some(a + D::milliseconds(100))), a, &[]);
        assert_eq!(
            after.overlap,
            Overlap::Certain {
                refused_write_at: None
            }
        );
        // Within the ±1 ms the round trips leave open: either could be true.
        let close = overlap_of(tenure(1, skew, Some(a + D::microseconds(500))), a, &[]);
        assert_eq!(close.overlap, Overlap::Possible);
        let bounds = after.clock_offset.unwrap();
        assert!(bounds.min_us.unwrap() <= -3_600_000_000 && -3_600_000_000 <= bounds.max_us);
        // The end is bracketed around its true database time.
        let end = after.believed_until_db.unwrap();
        let truth = a + D::milliseconds(100);
        assert!(end.earliest.unwrap() <= truth && truth <= end.latest);
    }

    /// No end report: unknown, never invented — unless a refused write after the successor's acquisition proves
    /// the belief by the database's clock alone.
    #[test]
    fn a_missing_end_is_unknown_unless_a_refusal_proves_the_overlap() {
        let a = t0() + D::seconds(10);
        let silent = overlap_of(tenure(1, D::zero(), None), a, &[]);
        assert_eq!(silent.overlap, Overlap::Unknown);
        assert_eq!(silent.believed_until_db, None);
        let refused_at = a + D::seconds(3);
        let proved = overlap_of(
            tenure(1, D::zero(), None),
            a,
            &[
                refusal(1, refused_at),
                refusal(1, a - D::seconds(1)),
                refusal(2, a + D::seconds(5)),
            ],
        );
        assert_eq!(
            proved.overlap,
            Overlap::Certain {
                refused_write_at: Some(refused_at)
            }
        );
        assert_eq!(
            proved.refusals_after_successor.len(),
            1,
            "only this epoch's, after the acquisition"
        );
    }

    /// Reports that contradict each other (the holder's clock was stepped between them) give no offset, and
    /// a long belief widens the earliest placement by the allowed drift.
    #[test]
    fn contradicting_reports_give_no_offset_and_long_beliefs_allow_for_drift() {
        let a = t0() + D::seconds(10);
        let mut stepped = tenure(1, D::zero(), Some(a + D::seconds(1)));
        stepped.belief.end_sent_at = stepped.belief.end_sent_at.map(|t| t + D::seconds(30));
        let review = overlap_of(stepped, a, &[]);
        assert_eq!(review.clock_offset, None);
        assert_eq!(review.overlap, Overlap::Unknown);

        let long = D::seconds(10_000);
        let r = overlap_of(
            tenure(1, D::zero(), Some(t0() + long)),
            t0() + long + D::seconds(5),
            &[],
        );
        let end = r.believed_until_db.unwrap();
        let drift = end.latest - end.earliest.unwrap();
        assert!(drift >= D::seconds(2), "200 ppm of 10,000 s: {drift}");
        assert_eq!(r.overlap, Overlap::None);
    }

    /// A write of the epoch accepted at or after the successor's acquisition is reported (a broken fence);
    /// one before it is not; the last tenure has no successor.
    #[test]
    fn writes_accepted_after_the_successor_are_reported() {
        let a = t0() + D::seconds(10);
        let mut broken = tenure(1, D::zero(), None);
        broken.last_mark_at = Some(a + D::milliseconds(3));
        assert_eq!(
            overlap_of(broken, a, &[]).accepted_after_successor,
            Some(a + D::milliseconds(3))
        );
        let mut fine = tenure(1, D::zero(), None);
        fine.last_event_at = Some(a - D::milliseconds(3));
        assert_eq!(overlap_of(fine, a, &[]).accepted_after_successor, None);
        let last = review(vec![tenure(1, D::zero(), None)], &[]).remove(0);
        assert_eq!(last.overlap, Overlap::NoSuccessor);
    }
}
