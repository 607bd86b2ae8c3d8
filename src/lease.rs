//! Leases: acquire, renew, release and force-release, each one call of a SQL function, timed only by the
//! database clock; and the [`Epoch`], the fencing token every acquisition issues.
//!
//! SQL: `migrations/2026-11-30-000002_lease_protocol/up.sql` (`pgfence.acquire`, `pgfence.renew`,
//! `pgfence.release`, `pgfence.force_release`, the view `pgfence.tenure_history`).

use std::fmt;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Nullable, Text, Timestamptz};
use diesel::QueryableByName;
use serde::{Deserialize, Serialize};

use crate::error::{DenyReason, Error, Result};
use crate::reply::{deny_reason, is_denial, loss_reason, unexpected, RowsOf};
use crate::store::Store;
use crate::types::{Epoch, LossReason, MAX_TTL, MIN_TTL};
use crate::validate::{validate_holder, validate_name};

/// A tenure this process holds: the lease name, the holder, the epoch the database issued and the local
/// deadline before which the database cannot grant a successor.
///
/// This is plain data: it does not renew itself. Call [`Store::renew`] before [`Lease::local_deadline`].
#[derive(Debug, Clone)]
pub struct Lease {
    name: String,
    pub(crate) qualified: String,
    holder: String,
    pub(crate) epoch: Epoch,
    /// `Debug` redacts it.
    pub(crate) secret: TenureSecret,
    ttl: Duration,
    local_deadline: Instant,
    believed_from: DateTime<Utc>,
}

impl Lease {
    #[cfg(feature = "testing")]
    pub(crate) fn from_parts(
        name: &str,
        qualified: String,
        holder: &str,
        (epoch, secret): (Epoch, TenureSecret),
        ttl: Duration,
        local_deadline: Instant,
    ) -> Lease {
        Lease {
            name: name.to_owned(),
            qualified,
            holder: holder.to_owned(),
            epoch,
            secret,
            ttl,
            local_deadline,
            believed_from: Utc::now(),
        }
    }

    /// The lease name without its cluster prefix.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cluster-qualified name (`<cluster>/<name>`), as stored in the database.
    pub fn qualified_name(&self) -> &str {
        &self.qualified
    }

    /// Who holds it.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The fencing token of this tenure.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The ttl of the last acquisition or renewal.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// By this process's monotonic clock: when the last successful acquire or renew statement was *sent*, plus
    /// the ttl. The database computed the expiry from its own clock when it *ran* the statement, which was
    /// later, so it cannot grant a successor before this instant (up to clock-rate drift, which a holder covers
    /// with a safety margin). No wall clock is involved.
    pub fn local_deadline(&self) -> Instant {
        self.local_deadline
    }

    /// When this process received the acquisition's reply, by its own wall clock (UTC): the start of its belief
    /// that it leads, as [`Store::report_belief_start`] reports it. Only for the record of an investigation —
    /// no decision of pgfence compares it with another clock.
    pub fn believed_from(&self) -> DateTime<Utc> {
        self.believed_from
    }

    /// Time left until [`local_deadline`](Self::local_deadline) (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.local_deadline
            .saturating_duration_since(Instant::now())
    }
}

/// What [`Store::release`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome", content = "reason")]
#[non_exhaustive]
pub enum Released {
    /// The tenure ended now; a successor can acquire immediately.
    Released,
    /// The tenure had already ended (released before, expired and taken over, …); nothing was changed.
    NotHeld(LossReason),
}

/// What [`Store::force_release`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
#[non_exhaustive]
pub enum ForceReleased {
    /// The current tenure was ended: its epoch can no longer write.
    Ended {
        /// The epoch that was ended.
        epoch: Epoch,
        /// Who held it.
        holder: String,
    },
    /// Nobody holds the lease (released or expired already).
    NotHeld,
    /// No lease has this name.
    Unknown,
}

/// The state of a lease as the database sees it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LeaseState {
    /// Held and unexpired.
    Held,
    /// Held, but the ttl ran out (by the database clock); anyone may acquire.
    Expired,
    /// Released by its holder or an operator, or never acquired.
    Released,
}

impl LeaseState {
    /// The state's name, as serialized: `held`, `expired` or `released`.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Held => "held",
            LeaseState::Expired => "expired",
            LeaseState::Released => "released",
        }
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One lease row, read with durations computed by the database.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LeaseStatus {
    /// The cluster-qualified name.
    pub name: String,
    /// The last holder (current holder when `state` is `Held`).
    pub holder: Option<String>,
    /// The last issued epoch (`None` when never acquired).
    pub epoch: Option<Epoch>,
    /// Held, expired or released.
    pub state: LeaseState,
    /// Time left when held, by the database clock.
    pub expires_in: Option<Duration>,
    /// How many times the holder identity changed.
    pub transitions: i64,
    /// When the current tenure began.
    pub acquired_at: Option<DateTime<Utc>>,
    /// When it was last renewed.
    pub renewed_at: Option<DateTime<Utc>>,
    /// The last accepted task write (any epoch).
    pub last_write_at: Option<DateTime<Utc>>,
}

/// The lease functions, each called as `SELECT * FROM pgfence.f(…)` ([`RowsOf`]) and answered by one
/// [`LeaseResultRow`].
mod sql {
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
struct LeaseResultRow {
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
enum LeaseReply {
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
    Denied(DenyReason),
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
    /// The reply of `pgfence.<function>`; an outcome or reason it never gives is an error.
    fn decode(self, function: &str) -> Result<LeaseReply> {
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
fn unexpected_reply(function: &str, reply: &LeaseReply) -> Error {
    unexpected(function, &format!("outcome {}", reply.outcome()))
}

fn ttl_ms(ttl: Duration) -> Result<i64> {
    if ttl < MIN_TTL || ttl > MAX_TTL {
        return Err(Error::invalid(
            "ttl",
            format!("must be between {MIN_TTL:?} and {MAX_TTL:?}, got {ttl:?}"),
        ));
    }
    Ok(ttl.as_millis() as i64)
}

fn ms(value: Option<i64>) -> Duration {
    Duration::from_millis(value.unwrap_or(0).max(0) as u64)
}

#[derive(QueryableByName)]
struct LeaseStatusRow {
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
const STATUS_SQL: &str = "SELECT name, holder, epoch, \
        CASE WHEN state = 'held' AND expires_at > clock_timestamp() THEN 'held' \
             WHEN state = 'held' THEN 'expired' ELSE 'released' END AS state, \
        CASE WHEN state = 'held' AND expires_at > clock_timestamp() \
             THEN ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint END AS expires_in_ms, \
        transitions, acquired_at, renewed_at, \
        (SELECT e.created_at FROM pgfence.task_events e WHERE e.lease = leases.name \
          ORDER BY e.epoch DESC, e.id DESC LIMIT 1) AS last_write_at \
   FROM pgfence.leases";

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
    ///   [`MIN_TTL`](crate::MIN_TTL)..=[`MAX_TTL`](crate::MAX_TTL); nothing was sent.
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

    /// Extends the tenure by its ttl, only while holder and epoch still match and the lease has not expired by
    /// the database clock; otherwise [`Error::Lost`] with the reason. On success the lease's
    /// [`local_deadline`](Lease::local_deadline) moves to (send time of this renewal + ttl).
    ///
    /// # Errors
    ///
    /// - [`Error::Lost`] when the tenure is no longer current, with the [`LossReason`] and the current epoch.
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
    #[tracing::instrument(level = "info", skip_all, fields(lease = %self.qualify(name)))]
    pub async fn force_release(&self, name: &str) -> Result<ForceReleased> {
        validate_name(name)?;
        let qualified = self.qualify(name);
        let (_, row): (Instant, LeaseResultRow) = self
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

    /// Every lease of this store's cluster, by name.
    ///
    /// # Errors
    ///
    /// The [errors of every database call](crate#errors). Dropping the future is safe: it only reads
    /// ([cancel safety](crate#cancel-safety)).
    pub async fn leases(&self) -> Result<Vec<LeaseStatus>> {
        use diesel_async::RunQueryDsl;
        let mut conn = self.conn().await?;
        let rows: Vec<LeaseStatusRow> = diesel::sql_query(format!(
            "{STATUS_SQL} WHERE starts_with(name, $1) ORDER BY name"
        ))
        .bind::<Text, _>(format!("{}/", self.cluster()))
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
        let mut conn = self.conn().await?;
        let rows: Vec<LeaseStatusRow> = diesel::sql_query(format!("{STATUS_SQL} ORDER BY name"))
            .load(&mut *conn)
            .await?;
        rows.into_iter().map(LeaseStatus::try_from).collect()
    }
}

/// The [`Error::Denied`] of a lease call the database refused (and audited).
fn denied(lease: String, operation: &str, reason: DenyReason) -> Error {
    tracing::warn!(%lease, operation, %reason, "lease call denied");
    Error::Denied {
        lease,
        operation: operation.to_owned(),
        reason,
    }
}

/// The secret of one tenure: the database returns it once, with the epoch, when it grants the tenure, and keeps
/// only its SHA-256, which no role but the schema owner can read. Every guarded write, renewal and release
/// presents it, so knowing a tenure's (lease, epoch) — from the tables, an error or a log — is not enough to
/// write under it or to end it.
///
/// It never shows: `Debug` prints `TenureSecret(<redacted>)`, there is no `Display`, and pgfence puts it in no
/// log, error, audit row or CLI output. It does serialize (as its text), so that a leader can hand its
/// [`Fence`](crate::Fence) to its own workers: treat a serialized fence like a credential.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TenureSecret(String);

/// Length of a tenure secret in characters (hexadecimal).
pub const SECRET_LEN: usize = 64;

impl TenureSecret {
    /// A secret from its text: the 64 hexadecimal characters `pgfence.acquire` returned.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] when the text is not [`SECRET_LEN`] hexadecimal characters; the text is never
    /// repeated in the error.
    pub fn parse(text: impl Into<String>) -> Result<TenureSecret> {
        let text = text.into();
        if text.len() != SECRET_LEN || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::invalid(
                "tenure secret",
                format!("must be {SECRET_LEN} hexadecimal characters"),
            ));
        }
        Ok(TenureSecret(text))
    }

    /// The secret's text, to pass to the SQL functions yourself (`pgfence.fence(lease, epoch, secret, …)`).
    /// Never log it.
    pub fn expose_secret(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TenureSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TenureSecret(<redacted>)")
    }
}

impl TryFrom<String> for TenureSecret {
    type Error = Error;
    fn try_from(text: String) -> Result<TenureSecret> {
        TenureSecret::parse(text)
    }
}

impl From<TenureSecret> for String {
    fn from(secret: TenureSecret) -> String {
        secret.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A tenure secret is exactly `SECRET_LEN` hexadecimal characters (either condition alone is not enough);
    /// `Debug` shows nothing of it; serde writes its text and reads it back through the same check, as a fence
    /// handed to a worker is.
    #[test]
    fn tenure_secrets_parse_strictly_redact_and_round_trip() {
        let text = "a1".repeat(SECRET_LEN / 2);
        let secret = TenureSecret::parse(text.clone()).unwrap();
        assert_eq!(secret.expose_secret(), text);
        for bad in [
            "a1".repeat(SECRET_LEN / 2 - 1),
            "a1".repeat(SECRET_LEN / 2 + 1),
            "g1".repeat(SECRET_LEN / 2),
            String::new(),
        ] {
            let error = TenureSecret::parse(bad.clone()).unwrap_err();
            assert!(
                matches!(&error, Error::InvalidInput { field, .. } if *field == "tenure secret"),
                "{error}"
            );
            assert!(TenureSecret::try_from(bad).is_err());
        }
        assert_eq!(format!("{secret:?}"), "TenureSecret(<redacted>)");
        let json = serde_json::to_string(&secret).unwrap();
        assert_eq!(json, format!("\"{text}\""));
        assert_eq!(serde_json::from_str::<TenureSecret>(&json).unwrap(), secret);
        assert!(serde_json::from_str::<TenureSecret>("\"g1\"").is_err());
        assert_eq!(String::from(secret), text);
    }

    /// A state's name is the one serde writes, `Display` prints and the CLI shows.
    #[test]
    fn lease_states_are_named_as_serialized() {
        for (state, name) in [
            (LeaseState::Held, "held"),
            (LeaseState::Expired, "expired"),
            (LeaseState::Released, "released"),
        ] {
            assert_eq!(state.as_str(), name);
            assert_eq!(state.to_string(), name);
            assert_eq!(
                serde_json::to_value(state).unwrap(),
                serde_json::json!(name)
            );
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
            LeaseReply::Denied(DenyReason::BadSecret)
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
            // The outcomes of the surface before refusals had one name are unknown now.
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
