//! The record's calls ([`History`], a [`Store`]'s): the holder's belief reports, the tenures of a lease, and its review.

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Nullable, Text, Timestamptz};
use diesel::QueryableByName;

use super::review::review;
use super::{Belief, BeliefEnd, History, ServerView, Tenure, TenureReview};
use crate::audit::{Rejection, REJECTION_COLUMNS};
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::types::Epoch;
use crate::validate::validate_name;

impl History<'_> {
    /// Reports, after the fact and best effort, that this process started believing it leads `lease`:
    /// [`Lease::believed_from`] (its wall clock when the acquisition's reply arrived) and the endpoint it
    /// used ([`Admin::endpoint`](crate::admin::Admin::endpoint)). The first start report of a tenure stands; a
    /// retry changes nothing. The leadership runtime reports by itself
    /// ([`LeaseOptions::report_beliefs`](crate::leader::LeaseOptions)); users of
    /// [`Store::acquire`](crate::Store::acquire) opt in by calling this.
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
    /// the offset bounds the reports give ([`History::review`](crate::history::History::review)). The first end report of a tenure stands.
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

    /// Several belief reports in one statement (`pgfence.report_belief` laterally over arrays: one round trip,
    /// one transaction): each one's answer, in order. The call fails as a whole (nothing recorded) when the
    /// statement does.
    pub(crate) async fn report_beliefs(
        &self,
        reports: &[super::queue::Report],
    ) -> Result<Vec<Result<()>>> {
        use diesel::sql_types::Array;
        use diesel_async::RunQueryDsl;

        #[derive(QueryableByName)]
        struct Outcome {
            #[diesel(sql_type = Text)]
            outcome: String,
            #[diesel(sql_type = Nullable<Text>)]
            reason: Option<String>,
        }

        let mut conn = self.store.conn().await?;
        let rows: Vec<Outcome> = diesel::sql_query(
            "SELECT r.outcome, r.reason \
               FROM unnest($1::text[], $2::int8[], $3::text[], $4::text[], $5::timestamptz[], $6::text[], \
                           $7::text[], $8::text[]) \
                    WITH ORDINALITY AS u(lease, epoch, secret, event, at, endpoint, cause, detail, ord) \
              CROSS JOIN LATERAL pgfence.report_belief(u.lease, u.epoch, u.secret, u.event, u.at, $9, \
                                                       u.endpoint, u.cause, u.detail) r \
              ORDER BY u.ord",
        )
        .bind::<Array<Text>, _>(reports.iter().map(|r| r.lease.qualified_name()).collect::<Vec<_>>())
        .bind::<Array<BigInt>, _>(reports.iter().map(|r| r.lease.epoch().get()).collect::<Vec<_>>())
        .bind::<Array<Text>, _>(
            reports
                .iter()
                .map(|r| r.lease.secret.expose_secret())
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Text>, _>(reports.iter().map(|r| r.event).collect::<Vec<_>>())
        .bind::<Array<Timestamptz>, _>(reports.iter().map(|r| r.at).collect::<Vec<_>>())
        .bind::<Array<Nullable<Text>>, _>(
            reports
                .iter()
                .map(|r| if r.end.is_none() { self.store.endpoint() } else { None })
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Nullable<Text>>, _>(
            reports
                .iter()
                .map(|r| r.end.map(BeliefEnd::cause))
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Nullable<Text>>, _>(
            reports
                .iter()
                .map(|r| r.end.and_then(BeliefEnd::detail))
                .collect::<Vec<_>>(),
        )
        .bind::<Timestamptz, _>(Utc::now())
        .load(&mut *conn)
        .await?;
        if rows.len() != reports.len() {
            return Err(crate::reply::unexpected(
                "report_belief",
                "a batch answered another number of rows",
            ));
        }
        Ok(rows
            .into_iter()
            .zip(reports)
            .map(|(row, report)| belief_answer(&report.lease, row.outcome, row.reason))
            .collect())
    }

    pub(crate) async fn report_belief(
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

        let mut conn = self.store.conn().await?;
        let row: Outcome = diesel::sql_query(
            "SELECT outcome, reason FROM pgfence.report_belief($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind::<Text, _>(lease.qualified_name())
        .bind::<BigInt, _>(lease.epoch().get())
        .bind::<Text, _>(lease.secret.expose_secret())
        .bind::<Text, _>(event)
        .bind::<Timestamptz, _>(at)
        .bind::<Timestamptz, _>(Utc::now())
        .bind::<Nullable<Text>, _>(if end.is_none() {
            self.store.endpoint()
        } else {
            None
        })
        .bind::<Nullable<Text>, _>(end.map(BeliefEnd::cause))
        .bind::<Nullable<Text>, _>(end.and_then(BeliefEnd::detail))
        .get_result(&mut *conn)
        .await?;
        belief_answer(lease, row.outcome, row.reason)
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
        let mut conn = self.store.conn().await?;
        let rows: Vec<TenureRow> = diesel::sql_query(
            "SELECT lease, epoch, holder, acquired_at, ended_at, end_reason, last_write_at, last_event_at, \
                    last_mark_at, timeline, system_identifier, instance_id::text AS instance_id, server_addr, \
                    client_addr, application_name, endpoint, believed_from, start_sent_at, start_received_at, \
                    believed_until, end_cause, end_detail, end_sent_at, end_received_at \
               FROM pgfence.tenure_history WHERE lease = $1 ORDER BY epoch",
        )
        .bind::<Text, _>(self.store.qualify(name))
        .load(&mut *conn)
        .await?;
        rows.into_iter().map(Tenure::try_from).collect()
    }

    /// The overlap review of `name`: every tenure ([`History::tenures`](crate::history::History::tenures)) with its successor, the clock bounds
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
        let mut conn = self.store.conn().await?;
        let refusals: Vec<Rejection> = diesel::sql_query(format!(
            "SELECT {REJECTION_COLUMNS} FROM pgfence.rejections \
              WHERE lease = $1 AND scope = 'tenure' ORDER BY id"
        ))
        .bind::<Text, _>(self.store.qualify(name))
        .load(&mut *conn)
        .await?;
        Ok(review(tenures, &refusals))
    }
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

/// What `pgfence.report_belief` answered for a report of `lease`.
fn belief_answer(lease: &Lease, outcome: String, reason: Option<String>) -> Result<()> {
    match outcome.as_str() {
        "recorded" | "kept" => Ok(()),
        "refused" => Err(Error::Denied {
            lease: lease.qualified_name().to_owned(),
            operation: "report_belief".to_owned(),
            reason: crate::reply::deny_reason("report_belief", reason.as_deref())?,
        }),
        other => Err(crate::reply::unexpected(
            "report_belief",
            &format!("outcome {other}"),
        )),
    }
}
