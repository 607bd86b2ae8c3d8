//! The lease calls on a [`Store`]: acquire, renew and release, one SQL function call each, and a lease's status;
//! the operator's force-release and list of every lease ([`Admin`]).

use std::time::{Duration, Instant};

use chrono::Utc;
use diesel::sql_types::Text;

use super::rows::{sql, unexpected_reply, LeaseReply, LeaseResultRow, LeaseStatusRow, STATUS_SQL};
use super::{ForceReleased, Lease, LeaseStatus, Released};
use crate::admin::Admin;
use crate::error::{denial_text, Error, Result};
use crate::reply::RowsOf;
use crate::store::Store;
use crate::types::LossReason;
use crate::validate::{ttl_ms, validate_holder, validate_name};

impl Store {
    /// Acquires `name` for `holder` by compare-and-set: succeeds when the lease is new, released or expired by
    /// the database clock, and issues the previous epoch + 1 (more after a failover: epochs issued on a new WAL
    /// timeline start above every earlier one). When another holder's tenure is live the result
    /// is [`Error::Held`] with the time it has left.
    ///
    /// The same holder acquiring again while it holds also gets a new epoch, which fences its own earlier
    /// tenure: an acquisition always starts a new tenure (a restarted process that reuses its holder name must
    /// not inherit the writes still in flight from its previous life). Use [`renew`](Self::renew) to extend.
    ///
    /// ```no_run
    /// # async fn example(store: pgfence::Store) -> pgfence::Result<()> {
    /// use std::time::Duration;
    /// match store.acquire("scheduler", "pod-a", Duration::from_secs(15)).await {
    ///     Ok(lease) => println!("leading with epoch {}", lease.epoch()),
    ///     Err(pgfence::Error::Held { holder, expires_in, .. }) => {
    ///         println!("{holder} leads for another {expires_in:?}")
    ///     }
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// - [`Error::Held`] when another holder's tenure is live, with its holder, epoch and the time it has left.
    /// - [`Error::InvalidInput`] for a malformed `name` or `holder`, or a `ttl` outside
    ///   [`MIN_TTL`](crate::limits::MIN_TTL)..=[`MAX_TTL`](crate::limits::MAX_TTL); nothing was sent.
    /// - [`Error::Denied`] when the session's role has no grant on the store's cluster (audited).
    /// - The [errors of every database call](crate#errors).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped acquisition may have been granted with nobody holding its `Lease`. Other
    /// holders then get [`Error::Held`] until its ttl runs out — a successor waits up to one ttl. See
    /// [cancel safety](crate#cancel-safety).
    #[tracing::instrument(level = "info", skip_all, fields(lease = %self.qualify(name), holder = holder))]
    pub async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Lease> {
        validate_name(name)?;
        validate_holder("holder", holder)?;
        let ttl_ms = ttl_ms(ttl)?;
        // The database grants whole milliseconds; the local deadline must not be later than its expiry.
        let ttl = Duration::from_millis(ttl_ms as u64);
        let qualified = self.qualify(name);
        let (sent, row): (Instant, LeaseResultRow) = self
            .call_one(RowsOf(sql::acquire(
                qualified.clone(),
                holder.to_owned(),
                ttl_ms,
            )))
            .await?;
        acquisition(name, qualified, holder, ttl, sent, row)
    }

    /// Extends the tenure by its ttl, only while holder and epoch still match and the lease has not expired by
    /// the database clock; otherwise [`Error::Lost`] with the reason. On success the lease's
    /// [`local_deadline`](Lease::local_deadline) moves to (send time of this renewal + ttl).
    ///
    /// # Errors
    ///
    /// - [`Error::Lost`] when the tenure is no longer current, with the [`LossReason`](crate::LossReason) and the current epoch.
    /// - [`Error::Denied`] when the session's role lost its grant on the cluster, or the lease's secret is not
    ///   its tenure's (audited).
    /// - The [errors of every database call](crate#errors); a transient one leaves the local deadline where
    ///   it was: renew again before it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe for the caller: a dropped renewal may or may not have extended the tenure in the database,
    /// but the lease's local deadline did not move (the safe side). See [cancel safety](crate#cancel-safety).
    #[tracing::instrument(level = "debug", skip_all, fields(lease = %lease.qualified, epoch = lease.epoch.get()))]
    pub async fn renew(&self, lease: &mut Lease) -> Result<()> {
        let ttl_ms = ttl_ms(lease.ttl)?;
        let (sent, row): (Instant, LeaseResultRow) = self
            .call_one(RowsOf(sql::renew(
                lease.qualified.clone(),
                lease.epoch.get(),
                lease.secret.expose_secret().to_owned(),
                ttl_ms,
            )))
            .await?;
        match row.decode("renew")? {
            LeaseReply::Renewed => {
                lease.local_deadline = sent + lease.ttl;
                tracing::debug!(lease = %lease.qualified, epoch = %lease.epoch, "lease renewed");
                Ok(())
            }
            LeaseReply::Lost { reason, current } => {
                tracing::warn!(lease = %lease.qualified, epoch = %lease.epoch, %reason, "lease lost");
                Err(Error::Lost {
                    lease: lease.qualified.clone(),
                    epoch: lease.epoch,
                    reason,
                    current,
                })
            }
            LeaseReply::Denied(reason) => Err(denied(lease.qualified.clone(), "renew", reason)),
            other => Err(unexpected_reply("renew", &other)),
        }
    }

    /// Ends this tenure now so that a successor can acquire immediately. Idempotent, and it never touches a
    /// successor's tenure: releasing an epoch that is no longer current changes nothing and returns
    /// [`Released::NotHeld`]. After it returns, no write presenting this epoch can commit.
    ///
    /// # Errors
    ///
    /// - [`Error::Denied`] when the session's role has no grant on the cluster, or the lease's secret is not its
    ///   tenure's (audited).
    /// - The [errors of every database call](crate#errors): the tenure may or may not have ended; release again
    ///   (it is idempotent) or let it expire after its ttl.
    ///
    /// # Cancel safety
    ///
    /// A dropped release may or may not have ended the tenure; releasing again is safe. See
    /// [cancel safety](crate#cancel-safety).
    #[tracing::instrument(level = "info", skip_all, fields(lease = %lease.qualified, epoch = lease.epoch.get()))]
    pub async fn release(&self, lease: &Lease) -> Result<Released> {
        let (_, row): (Instant, LeaseResultRow) = self
            .call_one(RowsOf(sql::release(
                lease.qualified.clone(),
                lease.epoch.get(),
                lease.secret.expose_secret().to_owned(),
            )))
            .await?;
        match row.decode("release")? {
            LeaseReply::Released { .. } => {
                tracing::info!(lease = %lease.qualified, epoch = %lease.epoch, holder = %lease.holder, "lease released");
                Ok(Released::Released)
            }
            LeaseReply::NotHeld { reason, .. } => Ok(Released::NotHeld(reason)),
            LeaseReply::Denied(reason) => Err(denied(lease.qualified.clone(), "release", reason)),
            other => Err(unexpected_reply("release", &other)),
        }
    }

    /// The lease `name` of this store's cluster, if it was ever acquired.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a malformed `name`, and the [errors of every database call](crate#errors).
    /// Dropping the future is safe: it only reads ([cancel safety](crate#cancel-safety)).
    pub async fn lease_status(&self, name: &str) -> Result<Option<LeaseStatus>> {
        use diesel::OptionalExtension;
        use diesel_async::RunQueryDsl;
        validate_name(name)?;
        let mut conn = self.conn().await?;
        let row: Option<LeaseStatusRow> =
            diesel::sql_query(format!("{STATUS_SQL} WHERE name = $1"))
                .bind::<Text, _>(self.qualify(name))
                .get_result(&mut *conn)
                .await
                .optional()?;
        row.map(LeaseStatus::try_from).transpose()
    }
}

impl Admin<'_> {
    /// Operator override: ends whatever tenure of `name` is current, so its epoch can no longer write. The
    /// epoch is kept: the next acquisition issues a larger one.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidInput`] for a malformed `name`; nothing was sent.
    /// - [`Error::Denied`] when the session's role has no operator grant on the cluster (audited).
    /// - The [errors of every database call](crate#errors).
    ///
    /// # Cancel safety
    ///
    /// A dropped force-release may or may not have ended the tenure; calling it again is safe (it then answers
    /// [`ForceReleased::NotHeld`]). See [cancel safety](crate#cancel-safety).
    #[tracing::instrument(level = "info", skip_all, fields(lease = %self.store.qualify(name)))]
    pub async fn force_release(&self, name: &str) -> Result<ForceReleased> {
        validate_name(name)?;
        let qualified = self.store.qualify(name);
        let (_, row): (Instant, LeaseResultRow) = self
            .store
            .call_one(RowsOf(sql::force_release(qualified.clone())))
            .await?;
        match row.decode("force_release")? {
            LeaseReply::Released {
                epoch: Some(epoch),
                holder,
            } => {
                tracing::warn!(lease = %qualified, %epoch, holder = ?holder, "lease force-released");
                Ok(ForceReleased::Ended {
                    epoch,
                    holder: holder.unwrap_or_default(),
                })
            }
            LeaseReply::NotHeld { epoch: None, .. } => Ok(ForceReleased::Unknown),
            LeaseReply::NotHeld { .. } => Ok(ForceReleased::NotHeld),
            LeaseReply::Denied(reason) => Err(denied(qualified, "force_release", reason)),
            other => Err(unexpected_reply("force_release", &other)),
        }
    }

    /// Every lease of this store's cluster, by name.
    ///
    /// # Errors
    ///
    /// The [errors of every database call](crate#errors). Dropping the future is safe: it only reads
    /// ([cancel safety](crate#cancel-safety)).
    pub async fn leases(&self) -> Result<Vec<LeaseStatus>> {
        use diesel_async::RunQueryDsl;
        let mut conn = self.store.conn().await?;
        let rows: Vec<LeaseStatusRow> = diesel::sql_query(format!(
            "{STATUS_SQL} WHERE starts_with(name, $1) ORDER BY name"
        ))
        .bind::<Text, _>(format!("{}/", self.store.cluster()))
        .load(&mut *conn)
        .await?;
        rows.into_iter().map(LeaseStatus::try_from).collect()
    }

    /// Every lease of every cluster in this database, by name: the operator's view (row-level security shows a
    /// role only the clusters it has a grant on).
    ///
    /// # Errors
    ///
    /// The [errors of every database call](crate#errors). Dropping the future is safe: it only reads
    /// ([cancel safety](crate#cancel-safety)).
    pub async fn all_leases(&self) -> Result<Vec<LeaseStatus>> {
        use diesel_async::RunQueryDsl;
        let mut conn = self.store.conn().await?;
        let rows: Vec<LeaseStatusRow> = diesel::sql_query(format!("{STATUS_SQL} ORDER BY name"))
            .load(&mut *conn)
            .await?;
        rows.into_iter().map(LeaseStatus::try_from).collect()
    }
}

/// The [`Error::Denied`] of a lease call the database refused (and audited).
/// A tenure from what `pgfence.acquire` (or one row of `pgfence.acquire_many`) answered for `name`, sent at
/// `sent`: the lease, or why not.
pub(super) fn acquisition(
    name: &str,
    qualified: String,
    holder: &str,
    ttl: Duration,
    sent: Instant,
    row: LeaseResultRow,
) -> Result<Lease> {
    // Microseconds, as the database keeps it.
    let believed_from = chrono::SubsecRound::trunc_subsecs(Utc::now(), 6);
    match row.decode("acquire")? {
        LeaseReply::Acquired { epoch, secret } => {
            tracing::info!(lease = %qualified, %epoch, holder, "lease acquired");
            Ok(Lease {
                name: name.to_owned(),
                qualified,
                holder: holder.to_owned(),
                epoch,
                secret,
                ttl,
                local_deadline: sent + ttl,
                believed_from,
            })
        }
        LeaseReply::Denied(reason) => Err(denied(qualified, "acquire", reason)),
        LeaseReply::Held {
            holder,
            epoch,
            expires_in,
        } => Err(Error::Held {
            lease: qualified,
            holder,
            epoch,
            expires_in,
        }),
        other => Err(unexpected_reply("acquire", &other)),
    }
}

fn denied(lease: String, operation: &str, reason: LossReason) -> Error {
    tracing::warn!(%lease, operation, reason = %denial_text(reason), "lease call denied");
    Error::Denied {
        lease,
        operation: operation.to_owned(),
        reason,
    }
}
