//! The PostgreSQL [`Elector`](super::Elector): acquisition, batched renewal on a connection of its own, and
//! release announcements through LISTEN/NOTIFY.
//!
//! SQL: `pgfence.renew_many` and the `pgfence_lease_free` notification of `pgfence.release` and
//! `pgfence.force_release`, in `migrations/2026-11-30-000002_lease_protocol/up.sql`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use diesel::QueryableByName;
use diesel_async::AsyncPgConnection;
use tokio::sync::{broadcast, Notify};

use super::group::{Leaver, MemberShared, Membership};
use super::held::{BeliefReporter, Health, HeldLease, LossCause, Releaser, Shared, Wake, Wakeups};
use super::options::LeaseOptions;
use super::supervisor::BoxFuture;
use super::{Elector, METRIC_RENEW_DURATION};
use crate::error::{DenyReason, Error, Result};
use crate::lease::{Lease, Released};
use crate::membership::{Member, MemberReply, MemberResultRow, MemberSpec, Roster};
use crate::reply::{deny_reason, is_denial, loss_reason, unexpected, RowsOf};
use crate::store::statement::Checked;
use crate::store::Store;
use crate::types::LossReason;

/// The PostgreSQL [`Elector`]: leases in `pgfence.leases`, renewed in batches, woken by LISTEN/NOTIFY.
/// Create one per process and clone it.
#[derive(Clone, Debug)]
pub struct PgElector {
    inner: Arc<PgInner>,
}

#[derive(Debug)]
struct PgInner {
    store: Store,
    /// Lock key → lease name, for the release listener (a notification carries the key); shared so that a
    /// roster read can warm it (`warm_lease_names`) and a release is never waited on behind a lookup.
    lease_names: Arc<Mutex<HashMap<i32, String>>>,
    groups: Mutex<HashMap<GroupKey, Arc<Group>>>,
    notifications: OnceLock<broadcast::Sender<Wake>>,
    listener: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for PgInner {
    fn drop(&mut self) {
        if let Some(task) = self
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            task.abort();
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GroupKey {
    holder: String,
    ttl: Duration,
    renew_every: Duration,
    retry_every: Duration,
}

/// Leases renewed together by one statement per tick, with at most one membership of a replica group: its
/// heartbeat goes in the same statement.
#[derive(Debug)]
struct Group {
    key: GroupKey,
    members: Mutex<Vec<Arc<Shared>>>,
    membership: Mutex<Option<Arc<MemberShared>>>,
    wake: Notify,
}

impl Group {
    /// The membership heartbeated with this group, while it is current.
    fn membership(&self) -> Option<Arc<MemberShared>> {
        let mut slot = self.membership.lock().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_some_and(|m| !m.is_current()) {
            *slot = None;
        }
        slot.clone()
    }
}

impl PgElector {
    /// An elector on `store`.
    pub fn new(store: Store) -> PgElector {
        PgElector {
            inner: Arc::new(PgInner {
                store,
                lease_names: Arc::default(),
                groups: Mutex::new(HashMap::new()),
                notifications: OnceLock::new(),
                listener: Mutex::new(None),
            }),
        }
    }

    /// The store behind it.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    fn join_group(&self, key: GroupKey, member: Arc<Shared>) {
        self.renewal_group(key, |group| {
            group
                .members
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(member);
            Ok(())
        })
        .expect("adding a lease never fails");
    }

    /// Adds `membership` to the renewal group of `key`: heartbeated in the statement that renews its leases.
    fn attach_membership(&self, key: GroupKey, membership: Arc<MemberShared>) -> Result<()> {
        self.renewal_group(key, |group| {
            let mut slot = group.membership.lock().unwrap_or_else(|p| p.into_inner());
            if slot.as_ref().is_some_and(|m| m.is_current()) {
                return Err(Error::invalid(
                    "member",
                    "this elector already heartbeats a membership with this holder name and timing: join \
                     another group under another member name",
                ));
            }
            *slot = Some(membership);
            Ok(())
        })
    }

    /// Runs `add` on the renewal group of `key` (created, with its renewal loop, when missing) and wakes it.
    fn renewal_group(&self, key: GroupKey, add: impl FnOnce(&Group) -> Result<()>) -> Result<()> {
        let mut groups = self.inner.groups.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(group) = groups.get(&key) {
            add(group)?;
            group.wake.notify_one();
            return Ok(());
        }
        let group = Arc::new(Group {
            key: key.clone(),
            members: Mutex::new(Vec::new()),
            membership: Mutex::new(None),
            wake: Notify::new(),
        });
        add(&group)?;
        groups.insert(key, group.clone());
        tokio::spawn(renew_loop(Arc::downgrade(&self.inner), group));
        Ok(())
    }

    fn notifications(&self) -> &broadcast::Sender<Wake> {
        self.inner.notifications.get_or_init(|| {
            let (tx, _) = broadcast::channel(1024);
            if self.inner.store.can_open_dedicated() {
                let task = tokio::spawn(listen(
                    self.inner.store.clone(),
                    self.inner.lease_names.clone(),
                    tx.clone(),
                ));
                *self
                    .inner
                    .listener
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(task);
            }
            tx
        })
    }
}

/// First delay before the release listener reconnects; it doubles up to [`LISTEN_RETRY_MAX`].
const LISTEN_RETRY_MIN: Duration = Duration::from_millis(100);
/// Longest delay between the release listener's connection attempts. Short: while it is away, releases go unheard
/// (waiters sleep out their timers, up to `poll_every`), and an attempt against a server that is down costs it
/// nothing. With the former cap of 5 s the attempts came 0.1, 0.3, 0.7, 1.5, 3.1 and 6.3 s after the connection
/// was lost: a server back after 3.2 s was listened to again only 3.1 s later.
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(1);

/// Keeps one dedicated connection LISTENing for released leases and fans the names out. Reconnects after
/// 100 ms, doubling up to 1 s; while it is down, waiters fall back to their timeouts, and once it LISTENs again
/// every waiter is woken ([`Wake::Resumed`]) to look for a release it did not hear.
///
/// A notification carries the released lease's lock key, not its name (any role may LISTEN): the name is
/// looked up in `pgfence.leases`, which shows only leases of clusters this role has a grant on, and cached
/// (lock keys are never reused and names never change). Keys of leases this role cannot see are ignored.
async fn listen(
    store: Store,
    names: Arc<Mutex<HashMap<i32, String>>>,
    tx: broadcast::Sender<Wake>,
) {
    use diesel_async::SimpleAsyncConnection;
    use futures_util::StreamExt;
    let mut delay = LISTEN_RETRY_MIN;
    let mut listened_before = false;
    loop {
        match store.open_dedicated(crate::connect::Kind::Listening).await {
            // Two statements, the release channel last: what `pg_stat_activity` shows of the listener.
            Ok(mut conn) => match async {
                conn.batch_execute("LISTEN pgfence_members").await?;
                conn.batch_execute("LISTEN pgfence_lease_free").await
            }
            .await
            {
                Ok(()) => {
                    delay = LISTEN_RETRY_MIN;
                    if listened_before {
                        let _ = tx.send(Wake::Resumed);
                    }
                    listened_before = true;
                    loop {
                        // The stream only reads the connection's notification queue: dropping it between
                        // notifications loses none, and frees the connection for the name lookup.
                        let next = std::pin::pin!(conn.notifications_stream()).next().await;
                        match next {
                            Some(Ok(n)) if n.channel == "pgfence_members" => {
                                let _ = tx.send(Wake::Members);
                            }
                            Some(Ok(n)) => {
                                let Ok(key) = n.payload.parse::<i32>() else {
                                    continue;
                                };
                                if let Some(name) = lease_name(&mut conn, &names, key).await {
                                    let _ = tx.send(Wake::Free(name));
                                }
                            }
                            Some(Err(e)) => {
                                tracing::debug!(error = %e, "release listener connection failed");
                                break;
                            }
                            None => break,
                        }
                    }
                }
                Err(e) => tracing::debug!(error = %e, "LISTEN failed"),
            },
            Err(e) => {
                tracing::debug!(error = %e, "release listener cannot connect")
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(LISTEN_RETRY_MAX);
    }
}

/// The name of the lease with lock key `key`, if this role can see it (cached). Looked up on the listener's own
/// connection, the one that just proved alive: right after an outage the pool may still hand out connections
/// that died with the server, or none at all during its reconnect backoff, and the notification would be lost.
async fn lease_name(
    conn: &mut AsyncPgConnection,
    names: &Mutex<HashMap<i32, String>>,
    key: i32,
) -> Option<String> {
    use diesel::OptionalExtension;
    use diesel_async::RunQueryDsl;
    if let Some(name) = names.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Some(name.clone());
    }
    let name: Option<String> = diesel::select(
        diesel::dsl::sql::<diesel::sql_types::Nullable<diesel::sql_types::Text>>(
            "(SELECT name FROM pgfence.leases WHERE lock_key = ",
        )
        .bind::<diesel::sql_types::Integer, _>(key)
        .sql(")"),
    )
    .get_result::<Option<String>>(conn)
    .await
    .optional()
    .ok()
    .flatten()
    .flatten();
    if let Some(name) = &name {
        names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, name.clone());
    }
    name
}

/// The lock key and name of every lease of `qualified` that the listener does not know yet, read in one
/// statement into its cache. Called after a roster read, off the path of any release: so that the release of a
/// name that changes hands wakes its successor at once, not after a lookup of the key on the listener's
/// connection (one statement more on the path of every handover of a name this process never saw released).
async fn warm_lease_names(inner: &PgInner, qualified: Vec<String>) {
    use diesel_async::RunQueryDsl;
    let missing: Vec<String> = {
        let names = inner.lease_names.lock().unwrap_or_else(|p| p.into_inner());
        let known: std::collections::HashSet<&String> = names.values().collect();
        qualified
            .into_iter()
            .filter(|n| !known.contains(n))
            .collect()
    };
    if missing.is_empty() {
        return;
    }
    #[derive(QueryableByName)]
    struct KeyRow {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        lock_key: i32,
        #[diesel(sql_type = diesel::sql_types::Text)]
        name: String,
    }
    let Ok(mut conn) = inner.store.checked().await else {
        return;
    };
    let rows: std::result::Result<Vec<KeyRow>, diesel::result::Error> =
        diesel::sql_query("SELECT lock_key, name FROM pgfence.leases WHERE name = ANY($1)")
            .bind::<diesel::sql_types::Array<diesel::sql_types::Text>, _>(missing)
            .load(&mut *conn)
            .await;
    conn.settle(&rows);
    if let Ok(rows) = rows {
        let mut names = inner.lease_names.lock().unwrap_or_else(|p| p.into_inner());
        for row in rows {
            names.insert(row.lock_key, row.name);
        }
    }
}

/// `pgfence.renew_many`, called as `SELECT * FROM pgfence.renew_many(…)` ([`RowsOf`]): one [`RenewManyRow`]
/// per lease.
mod sql {
    use diesel::sql_types::{Array, BigInt, Text};

    /// A row of the table `pgfence.renew_many` returns (lease, outcome, reason, epoch).
    #[derive(Debug, diesel::sql_types::SqlType, diesel::query_builder::QueryId)]
    // `pub`: the types diesel generates for each function name it in their public interface.
    #[allow(unreachable_pub)]
    pub struct RenewManyResult;

    diesel::define_sql_function! {
        #[sql_name = "pgfence.renew_many"]
        fn renew_many(leases: Array<Text>, epochs: Array<BigInt>, secrets: Array<Text>, ttl_ms: BigInt)
            -> RenewManyResult;
    }
}

/// A row of `pgfence.renew_many`, read by column name.
#[derive(diesel::QueryableByName)]
struct RenewManyRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    lease: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    outcome: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    reason: Option<String>,
}

/// What `pgfence.renew_many` answered for one tenure, decoded in this one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Renewal {
    /// `renewed`.
    Renewed,
    /// `refused`, with a loss reason.
    Lost(LossReason),
    /// `refused` with `no_grant` or `bad_secret`: the role has no grant on the lease's cluster, or the secret is
    /// not the tenure's.
    Denied(DenyReason),
}

impl RenewManyRow {
    /// The lease and what renew_many answered for it; an outcome or reason it never gives is an error.
    fn decode(self) -> Result<(String, Renewal)> {
        const FUNCTION: &str = "renew_many";
        let renewal = match self.outcome.as_deref() {
            Some("renewed") => Renewal::Renewed,
            Some("refused") if is_denial(self.reason.as_deref()) => {
                Renewal::Denied(deny_reason(FUNCTION, self.reason.as_deref())?)
            }
            Some("refused") => Renewal::Lost(loss_reason(FUNCTION, self.reason.as_deref())?),
            Some(other) => return Err(unexpected(FUNCTION, &format!("outcome {other}"))),
            None => return Err(unexpected(FUNCTION, "outcome missing")),
        };
        Ok((self.lease, renewal))
    }
}

/// The connection a group's renewals go through.
///
/// A store that opens connections of its own ([`Store::connect`]) keeps one for the group's renewals, opened
/// again — checked to be the expected primary, as every pooled connection is — by the first attempt after it
/// broke. Every retry then really tries to connect. Through the pool a retry would only wait: after a failed
/// connect, bb8 tries again 0.4 s later, then 0.8 s, … (up to half the checkout timeout), and a checkout waits
/// for that pending attempt instead of starting one. A database down for 0.8 s cost a lease with a 2 s ttl that
/// way (the next attempt came after the local deadline). Renewals also no longer wait for an application that
/// has every pooled connection busy. A store built from an application's pool ([`Store::from_pool`]) renews
/// through that pool.
struct RenewalConnection {
    dedicated: bool,
    conn: Option<AsyncPgConnection>,
}

/// A connection lent to one renewal attempt.
enum Lent<'a> {
    /// Armed (see [`Checked`]): dropped before the answer, its statement is cancelled and it is discarded.
    Pooled(Checked<'a>),
    Dedicated(AsyncPgConnection),
}

/// A row of the heartbeat statement: the membership's answer (the same on every row) beside one row of
/// renew_many (none when no lease is renewed with it).
#[derive(QueryableByName)]
struct HeartbeatRow {
    #[diesel(embed)]
    member: MemberResultRow,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    renew_lease: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    renew_outcome: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    renew_reason: Option<String>,
}

/// One statement for a membership's heartbeat and its leases' renewal: `pgfence.heartbeat` first, then
/// `pgfence.renew_many` laterally (run once, for the heartbeat's one row; its rows in input order). A member
/// renews its membership and every lease it leads with the same timing in one round trip per tick.
const HEARTBEAT_SQL: &str = "SELECT h.*, r.lease AS renew_lease, r.outcome AS renew_outcome, \
    r.reason AS renew_reason \
    FROM pgfence.heartbeat($1, $2, $3, $4, $5) h \
    LEFT JOIN LATERAL pgfence.renew_many($6, $7, $8, $5) WITH ORDINALITY AS r(lease, outcome, reason, epoch, ord) \
    ON true ORDER BY r.ord";

/// How one renewal attempt ended.
enum Attempt {
    /// The database answered: one row per member (its lease and what renew_many said), in the order sent, and
    /// when the statement was sent; and the membership's answer when one was heartbeated.
    Answered {
        sent: Instant,
        rows: Vec<(String, Renewal)>,
        membership: Option<MemberReply>,
    },
    /// Connecting or the statement failed.
    Failed(Error),
    /// The local deadline came while `doing` was in progress.
    CutOff { doing: &'static str },
}

impl RenewalConnection {
    fn new(store: &Store) -> RenewalConnection {
        RenewalConnection {
            dedicated: store.can_open_dedicated(),
            conn: None,
        }
    }

    /// A connection for one attempt, by `until` at the latest: the kept one unless it broke, else a new one.
    async fn lend<'a>(
        &mut self,
        store: &'a Store,
        until: tokio::time::Instant,
    ) -> std::result::Result<Lent<'a>, Attempt> {
        use diesel_async::pooled_connection::PoolableConnection;
        if !self.dedicated {
            return match tokio::time::timeout_at(until, store.checked()).await {
                Ok(Ok(conn)) => Ok(Lent::Pooled(conn)),
                Ok(Err(e)) => Err(Attempt::Failed(e)),
                Err(_) => Err(Attempt::CutOff {
                    doing: "waiting for a pooled connection",
                }),
            };
        }
        if let Some(mut conn) = self.conn.take() {
            // Closed by the server (a restart, an idle-session timeout): a statement on it could only fail.
            if !conn.is_broken() {
                return Ok(Lent::Dedicated(conn));
            }
        }
        match tokio::time::timeout_at(until, store.open_dedicated_checked()).await {
            Ok(Ok(conn)) => Ok(Lent::Dedicated(conn)),
            Ok(Err(e)) => Err(Attempt::Failed(e)),
            Err(_) => Err(Attempt::CutOff {
                doing: "connecting",
            }),
        }
    }

    /// One attempt: one renewal statement for every held member of the group, all of it — connecting
    /// included — by `until` (the earliest local deadline of the members).
    async fn renew(
        &mut self,
        store: &Store,
        key: &GroupKey,
        members: &[Arc<Shared>],
        membership: Option<&Member>,
        until: tokio::time::Instant,
    ) -> Attempt {
        use diesel_async::pooled_connection::PoolableConnection;
        use diesel_async::RunQueryDsl;
        let mut lent = match self.lend(store, until).await {
            Ok(lent) => lent,
            Err(attempt) => return attempt,
        };
        let names: Vec<String> = members
            .iter()
            .map(|m| m.lease.qualified_name().to_owned())
            .collect();
        let epochs: Vec<i64> = members.iter().map(|m| m.lease.epoch().get()).collect();
        let secrets: Vec<String> = members
            .iter()
            .map(|m| m.lease.fence().secret().expose_secret().to_owned())
            .collect();
        let ttl_ms = key.ttl.as_millis() as i64;
        let conn: &mut AsyncPgConnection = match &mut lent {
            Lent::Pooled(conn) => conn,
            Lent::Dedicated(conn) => conn,
        };
        let cancel = conn.cancel_token();
        let sent = Instant::now();
        let statement = async {
            match membership {
                None => RowsOf(sql::renew_many(names, epochs, secrets, ttl_ms))
                    .load::<RenewManyRow>(conn)
                    .await
                    .map(|rows| (rows, None)),
                Some(member) => {
                    use diesel::sql_types::{Array, BigInt, Text};
                    let rows = diesel::sql_query(HEARTBEAT_SQL)
                        .bind::<Text, _>(member.qualified_group())
                        .bind::<Text, _>(member.member())
                        .bind::<BigInt, _>(member.incarnation())
                        .bind::<Text, _>(member.secret().expose_secret())
                        .bind::<BigInt, _>(ttl_ms)
                        .bind::<Array<Text>, _>(names)
                        .bind::<Array<BigInt>, _>(epochs)
                        .bind::<Array<Text>, _>(secrets)
                        .load::<HeartbeatRow>(conn)
                        .await?;
                    let mut renewals = Vec::with_capacity(rows.len());
                    let mut reply = None;
                    for row in rows {
                        if let Some(lease) = row.renew_lease {
                            renewals.push(RenewManyRow {
                                lease,
                                outcome: row.renew_outcome,
                                reason: row.renew_reason,
                            });
                        }
                        reply.get_or_insert(row.member);
                    }
                    Ok((renewals, reply))
                }
            }
        };
        let result = tokio::time::timeout_at(until, statement).await;
        let result = match (result, lent) {
            (Ok(result), Lent::Pooled(mut conn)) => {
                conn.settle(&result);
                result
            }
            (Ok(result), Lent::Dedicated(mut conn)) => {
                let ended = result.as_ref().is_err_and(crate::error::ends_the_session);
                if !ended && (result.is_ok() || !conn.is_broken()) {
                    self.conn = Some(conn);
                }
                result
            }
            // Dropped armed: the statement is cancelled and the connection discarded.
            (Err(_), Lent::Pooled(_)) => {
                return Attempt::CutOff {
                    doing: "the renewal statement",
                }
            }
            (Err(_), Lent::Dedicated(conn)) => {
                // The statement may still be queued on the server (behind a lock): cancel it, so that it cannot
                // renew a tenure this process has given up, and close the connection.
                drop(conn);
                let store = store.clone();
                tokio::spawn(async move {
                    // Over TLS like the connection itself, when it used TLS.
                    if let Err(e) = store.cancel(&cancel).await {
                        tracing::debug!(error = %e, "cancelling a late renewal failed");
                    }
                });
                return Attempt::CutOff {
                    doing: "the renewal statement",
                };
            }
        };
        let decoded = result.map_err(Error::from).and_then(|(rows, reply)| {
            let rows = rows
                .into_iter()
                .map(RenewManyRow::decode)
                .collect::<Result<Vec<_>>>()?;
            let membership = match (membership, reply) {
                (None, _) => None,
                (Some(_), Some(reply)) => Some(reply.decode("heartbeat")?),
                (Some(_), None) => return Err(unexpected("heartbeat", "no row")),
            };
            Ok((rows, membership))
        });
        match decoded {
            Ok((rows, membership)) => Attempt::Answered {
                sent,
                rows,
                membership,
            },
            Err(e) => Attempt::Failed(e),
        }
    }
}

/// How soon after the last statement a membership that is not settled yet is heartbeated (at most the renewal
/// period): it settles at its first heartbeat, so a replica that joins leads its share about this long after
/// its join, and replicas that start within this window all count before any of them acquires.
const SETTLE_PROBE: Duration = Duration::from_secs(1);

/// The renewal loop of one group: renews all held members with one statement per tick, retries transient
/// errors every `retry_every` until each member's local deadline, and declares members lost at that deadline
/// even while an attempt is still in flight.
async fn renew_loop(elector: Weak<PgInner>, group: Arc<Group>) {
    let key = group.key.clone();
    let mut next = tokio::time::Instant::now() + key.renew_every;
    // When the last statement was sent (or the loop started): a membership not settled yet is heartbeated
    // SETTLE_PROBE after it, not a whole period later.
    let mut last_sent = tokio::time::Instant::now();
    let mut last_error: Option<String> = None;
    let mut connection = match elector.upgrade() {
        Some(inner) => RenewalConnection::new(&inner.store),
        None => return,
    };
    loop {
        let Some(inner) = elector.upgrade() else {
            return;
        };
        let members: Vec<Arc<Shared>> = {
            let mut members = group.members.lock().unwrap_or_else(|p| p.into_inner());
            members.retain(|m| m.is_current());
            members.clone()
        };
        let membership = group.membership();
        if members.is_empty() && membership.is_none() {
            let mut groups = inner.groups.lock().unwrap_or_else(|p| p.into_inner());
            // Re-check under the registry lock: a member may have joined since.
            if group
                .members
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
                && group.membership().is_none()
            {
                groups.remove(&key);
                return;
            }
            continue;
        }
        let trust_until = members
            .iter()
            .map(|m| m.trust_until())
            .chain(membership.iter().map(|m| m.trust_until()))
            .min()
            .expect("a lease or a membership");
        let trust_until = tokio::time::Instant::from_std(trust_until);
        // A member settles at its first heartbeat (pgfence.join_group): send it soon after the join.
        let unsettled = membership
            .as_ref()
            .is_some_and(|m| !m.state.borrow().settled);
        let tick = if unsettled {
            next.min(last_sent + SETTLE_PROBE.min(key.renew_every))
        } else {
            next
        };
        tokio::select! {
            _ = tokio::time::sleep_until(tick.min(trust_until)) => {}
            _ = group.wake.notified() => continue,
        }
        let now = tokio::time::Instant::now();
        if now < tick {
            // Woken by a deadline, not by the tick: declare the members whose deadline passed.
            expire_members(&members, &last_error);
            if let Some(membership) = &membership {
                membership.set_last_error(last_error.clone());
                membership.is_current();
            }
            continue;
        }

        // Members may have ended while we slept (released, abandoned, or lost through `is_held`): renewing them
        // would extend a tenure nobody holds and delay its successor by up to a period.
        let members: Vec<Arc<Shared>> = members.into_iter().filter(|m| m.is_current()).collect();
        let membership = membership.filter(|m| m.is_current());
        if members.is_empty() && membership.is_none() {
            continue;
        }
        let member = membership.as_ref().map(|m| m.member());
        // One span per attempt: its events, and the losses it declares, carry the holder and the batch's size.
        let span = tracing::debug_span!("renewal", holder = %key.holder, leases = members.len());
        let attempt = tracing::Instrument::instrument(
            connection.renew(&inner.store, &key, &members, member.as_ref(), trust_until),
            span.clone(),
        )
        .await;
        drop(inner);
        let _in_span = span.enter();
        match attempt {
            Attempt::Answered {
                sent,
                rows,
                membership: reply,
            } => {
                if let (Some(membership), Some(reply)) = (&membership, reply) {
                    match reply {
                        MemberReply::Renewed { settled, digest } => {
                            membership.renewed(sent, settled, digest)
                        }
                        MemberReply::Lost(reason) => {
                            membership.end(format!("heartbeat refused: {reason}"));
                        }
                        other => {
                            membership.end(format!("heartbeat answered {other:?}"));
                        }
                    }
                }
                metrics::histogram!(METRIC_RENEW_DURATION).record(sent.elapsed().as_secs_f64());
                // One row per member, in the order sent (two tenures of one lease may be in the group: the
                // names alone would not tell them apart).
                for (member, (lease, renewal)) in members.iter().zip(&rows) {
                    debug_assert_eq!(member.lease.qualified_name(), lease);
                    match renewal_verdict(*renewal) {
                        None => member.renewed(sent),
                        Some(cause) => {
                            member.lose(cause);
                        }
                    }
                }
                last_error = None;
                next = tokio::time::Instant::from_std(sent) + key.renew_every;
                last_sent = tokio::time::Instant::from_std(sent);
                tracing::debug!(holder = %key.holder, leases = rows.len(), "leases renewed");
            }
            Attempt::Failed(err) if !err.is_transient() => {
                // The statement itself was refused: nothing will make the next try different.
                last_error = Some(err.to_string());
                tracing::error!(holder = %key.holder, error = %err, "renewal refused");
                next = tokio::time::Instant::now() + key.retry_every;
            }
            Attempt::Failed(err) => {
                tracing::warn!(holder = %key.holder, error = %err, "renewal failed; retrying");
                last_error = Some(err.to_string());
                next = tokio::time::Instant::now() + key.retry_every;
            }
            Attempt::CutOff { doing } => {
                // An attempt in flight at the deadline says nothing about the database that the one before it
                // did not: keep that one's error (e.g. the refused connection) as the cause.
                tracing::warn!(holder = %key.holder, doing,
                    "renewal did not complete before the local deadline");
                last_error.get_or_insert_with(|| {
                    format!("{doing} did not complete before the local deadline")
                });
                next = tokio::time::Instant::now() + key.retry_every;
            }
        }
        expire_members(&members, &last_error);
        if let Some(membership) = &membership {
            if last_error.is_some() {
                membership.set_last_error(last_error.clone());
            }
            membership.is_current();
        }
    }
}

/// What one row of `pgfence.renew_many` means for its tenure: `None` when it was renewed, otherwise a definitive
/// loss. Every refusal is definitive, whatever its reason — superseded, expired, released, `failover` (the
/// tenure was granted before the server's last promotion), or denied: asking again gets the same answer, and only
/// a new acquisition (a new epoch) can help, which the runtime's campaign loop does on its own.
fn renewal_verdict(renewal: Renewal) -> Option<LossCause> {
    match renewal {
        Renewal::Renewed => None,
        Renewal::Lost(reason) => Some(LossCause::Definitive { reason }),
        Renewal::Denied(_) => Some(LossCause::Definitive {
            reason: LossReason::Denied,
        }),
    }
}

/// Records the last renewal outcome on every member and declares the loss of those whose local deadline passed.
fn expire_members(members: &[Arc<Shared>], last_error: &Option<String>) {
    for member in members {
        member.set_last_error(last_error.clone());
        // Declares the loss (with that error) when the deadline has passed.
        member.believed_held();
    }
}

#[derive(Debug)]
struct PgReleaser {
    store: Store,
}

impl Releaser for PgReleaser {
    fn release(&self, lease: Lease) -> BoxFuture<Result<Released>> {
        let store = self.store.clone();
        Box::pin(async move {
            // Release is idempotent, so a transient failure (a connection that died under us) is retried once on
            // a fresh connection; if that fails too, the lease simply expires after its ttl.
            match store.release(&lease).await {
                Err(e) if e.is_transient() => store.release(&lease).await,
                other => other,
            }
        })
    }
}

#[derive(Debug)]
struct PgLeaver {
    store: Store,
}

impl Leaver for PgLeaver {
    fn leave(&self, member: Member) -> BoxFuture<Result<bool>> {
        let store = self.store.clone();
        Box::pin(async move {
            // Idempotent, like a release: retried once on a fresh connection; if that fails too, the membership
            // expires after its ttl.
            match store.leave_group(&member).await {
                Err(e) if e.is_transient() => store.leave_group(&member).await,
                other => other,
            }
        })
    }
}

impl Elector for PgElector {
    fn qualify(&self, name: &str) -> String {
        self.inner.store.qualify(name)
    }

    async fn acquire(&self, name: &str, holder: &str, options: &LeaseOptions) -> Result<HeldLease> {
        options.validate()?;
        let lease = self.inner.store.acquire(name, holder, options.ttl).await?;
        let deadline = lease.local_deadline();
        let reporter = options.report_beliefs.then(|| BeliefReporter {
            store: self.inner.store.clone(),
            runtime: tokio::runtime::Handle::current(),
        });
        let shared = Shared::new(lease, options.safety_margin, deadline, reporter);
        self.join_group(
            GroupKey {
                holder: holder.to_owned(),
                ttl: options.ttl,
                renew_every: options.renew_every,
                retry_every: options.retry_every,
            },
            shared.clone(),
        );
        Ok(HeldLease::new(
            shared,
            Arc::new(PgReleaser {
                store: self.inner.store.clone(),
            }),
        ))
    }

    fn wakeups(&self) -> Wakeups {
        Wakeups {
            rx: Some(self.notifications().subscribe()),
        }
    }

    async fn join(
        &self,
        group: &str,
        member: &str,
        spec: &MemberSpec,
        options: &LeaseOptions,
    ) -> Result<Membership> {
        options.validate()?;
        // Listening before the join: a change of the roster right after it is not missed.
        self.notifications();
        let joined = self
            .inner
            .store
            .join_group(group, member, spec, options.ttl)
            .await?;
        let shared = MemberShared::new(joined, options.safety_margin);
        let key = GroupKey {
            holder: member.to_owned(),
            ttl: options.ttl,
            renew_every: options.renew_every,
            retry_every: options.retry_every,
        };
        let leaver = Arc::new(PgLeaver {
            store: self.inner.store.clone(),
        });
        if let Err(e) = self.attach_membership(key, shared.clone()) {
            // Not heartbeated: leave at once rather than leave a member the others would count for a ttl.
            let _ = leaver.leave(shared.member()).await;
            return Err(e);
        }
        Ok(Membership::new(shared, leaver))
    }

    async fn roster(&self, group: &str) -> Result<Roster> {
        let roster = self.inner.store.roster(group).await?;
        let names: std::collections::BTreeSet<String> = roster
            .members
            .iter()
            .flat_map(|m| m.names.iter().map(|n| self.qualify(n)))
            .collect();
        // In the background: the roster goes to the balancer at once.
        let inner = self.inner.clone();
        tokio::spawn(async move { warm_lease_names(&inner, names.into_iter().collect()).await });
        Ok(roster)
    }

    async fn handover_gap(&self, name: &str, epoch: crate::types::Epoch) -> Option<Duration> {
        self.inner
            .store
            .handover_gap(name, epoch)
            .await
            .unwrap_or_else(|e| {
                tracing::debug!(error = %e, "reading the handover gap failed");
                None
            })
    }

    async fn health(&self) -> Health {
        match self.inner.store.verify_identity().await {
            Ok(_) => Health {
                database_reachable: true,
                primary: Some(true),
                identity_as_expected: Some(true),
                error: None,
            },
            Err(e @ Error::NotPrimary { .. }) => Health {
                database_reachable: true,
                primary: Some(false),
                identity_as_expected: None,
                error: Some(e.to_string()),
            },
            Err(e @ Error::WrongDatabase { .. }) => Health {
                database_reachable: true,
                primary: Some(true),
                identity_as_expected: Some(false),
                error: Some(e.to_string()),
            },
            Err(e) => Health {
                database_reachable: false,
                primary: None,
                identity_as_expected: None,
                error: Some(e.to_string()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A renewal refused with `failover` (the tenure predates the server's last promotion) is a definitive loss
    /// with that reason — never a transient error retried until the deadline — so the campaign loop starts a new
    /// tenure at once. Every other refusal is definitive too; only `renewed` keeps the tenure.
    #[test]
    fn every_refused_renewal_is_a_definitive_loss_with_its_reason() {
        assert_eq!(renewal_verdict(Renewal::Renewed), None);
        assert_eq!(
            renewal_verdict(Renewal::Lost(LossReason::Failover)),
            Some(LossCause::Definitive {
                reason: LossReason::Failover
            })
        );
        for reason in [
            LossReason::Superseded,
            LossReason::Expired,
            LossReason::Released,
            LossReason::UnknownLease,
            LossReason::HolderMismatch,
        ] {
            assert_eq!(
                renewal_verdict(Renewal::Lost(reason)),
                Some(LossCause::Definitive { reason })
            );
        }
        for reason in [DenyReason::NoGrant, DenyReason::BadSecret] {
            assert_eq!(
                renewal_verdict(Renewal::Denied(reason)),
                Some(LossCause::Definitive {
                    reason: LossReason::Denied
                })
            );
        }
    }

    /// A row of renew_many decodes by its outcome and reason, and one it never gives — an unknown outcome, or a
    /// loss without its reason — is an error, not a loss with a made-up reason nor a renewal.
    #[test]
    fn renew_many_rows_decode_exactly() {
        let row = |outcome: Option<&str>, reason: Option<&str>| RenewManyRow {
            lease: "c/l".to_owned(),
            outcome: outcome.map(str::to_owned),
            reason: reason.map(str::to_owned),
        };
        assert_eq!(
            row(Some("renewed"), None).decode().unwrap(),
            ("c/l".to_owned(), Renewal::Renewed)
        );
        assert_eq!(
            row(Some("refused"), Some("superseded")).decode().unwrap().1,
            Renewal::Lost(LossReason::Superseded)
        );
        assert_eq!(
            row(Some("refused"), Some("no_grant")).decode().unwrap().1,
            Renewal::Denied(DenyReason::NoGrant)
        );
        for (outcome, reason) in [
            (Some("extended"), None),
            (None, None),
            (Some("refused"), None),
            (Some("refused"), Some("eclipsed")),
            // The outcomes of the surface before refusals had one name are unknown now.
            (Some("lost"), Some("superseded")),
            (Some("denied"), Some("no_grant")),
        ] {
            assert!(
                row(outcome, reason).decode().is_err(),
                "{outcome:?} {reason:?}"
            );
        }
    }
}
