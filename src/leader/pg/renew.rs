//! Batched renewal: the leases of one holder and timing renewed together by one statement per tick
//! (`pgfence.renew_many`, with the membership's heartbeat when there is one), retried until each one's local
//! deadline, on a connection kept for the purpose ([`KeptConnection`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use diesel::QueryableByName;
use tokio::sync::Notify;

use crate::error::{Error, Result};
use crate::leader::end::TenureEnd;
use crate::leader::group::MemberShared;
use crate::leader::held::Shared;
use crate::membership::{Member, MemberReply, MemberResultRow};
use crate::metrics::METRIC_RENEW_DURATION;
use crate::reply::{deny_reason, is_denial, loss_reason, unexpected, RowsOf};
use crate::store::statement::{KeptConnection, Unavailable};
use crate::store::Store;
use crate::types::LossReason;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct GroupKey {
    pub(super) holder: String,
    pub(super) ttl: Duration,
    pub(super) renew_every: Duration,
    pub(super) retry_every: Duration,
}

/// Leases renewed together by one statement per tick, with at most one membership of a replica group: its
/// heartbeat goes in the same statement.
#[derive(Debug)]
pub(super) struct Group {
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

/// The renewal groups of one elector, each renewed by a loop of its own while it has members.
#[derive(Debug)]
pub(super) struct Renewals {
    store: Store,
    groups: Mutex<HashMap<GroupKey, Arc<Group>>>,
}

impl Renewals {
    /// No groups yet, renewing through `store`.
    pub(super) fn new(store: Store) -> Renewals {
        Renewals {
            store,
            groups: Mutex::new(HashMap::new()),
        }
    }

    /// Adds `member` to the renewal group of `key`.
    pub(super) fn join_group(self: &Arc<Self>, key: GroupKey, member: Arc<Shared>) {
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
    pub(super) fn attach_membership(
        self: &Arc<Self>,
        key: GroupKey,
        membership: Arc<MemberShared>,
    ) -> Result<()> {
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
    fn renewal_group(
        self: &Arc<Self>,
        key: GroupKey,
        add: impl FnOnce(&Group) -> Result<()>,
    ) -> Result<()> {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
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
        tokio::spawn(renew_loop(Arc::downgrade(self), group));
        Ok(())
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
    Denied(LossReason),
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

/// One attempt: one renewal statement for every held member of the group, all of it — connecting
/// included — by `until` (the earliest local deadline of the members).
async fn renew(
    kept: &mut KeptConnection,
    store: &Store,
    key: &GroupKey,
    members: &[Arc<Shared>],
    membership: Option<&Member>,
    until: tokio::time::Instant,
) -> Attempt {
    use diesel_async::RunQueryDsl;
    let mut lent = match kept.lend(store, until).await {
        Ok(lent) => lent,
        Err(Unavailable::Failed(e)) => return Attempt::Failed(e),
        Err(Unavailable::CutOff { doing }) => return Attempt::CutOff { doing },
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
    let conn = lent.conn();
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
    let result = match result {
        Ok(result) => {
            kept.settle(lent, &result);
            result
        }
        Err(_) => {
            KeptConnection::abandon(lent);
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

/// How soon after the last statement a membership that is not settled yet is heartbeated (at most the renewal
/// period): it settles at its first heartbeat, so a replica that joins leads its share about this long after
/// its join, and replicas that start within this window all count before any of them acquires.
const SETTLE_PROBE: Duration = Duration::from_secs(1);

/// The renewal loop of one group: renews all held members with one statement per tick, retries transient
/// errors every `retry_every` until each member's local deadline, and declares members lost at that deadline
/// even while an attempt is still in flight.
async fn renew_loop(elector: Weak<Renewals>, group: Arc<Group>) {
    let key = group.key.clone();
    let mut next = tokio::time::Instant::now() + key.renew_every;
    // When the last statement was sent (or the loop started): a membership not settled yet is heartbeated
    // SETTLE_PROBE after it, not a whole period later.
    let mut last_sent = tokio::time::Instant::now();
    let mut last_error: Option<String> = None;
    let mut connection = match elector.upgrade() {
        Some(inner) => KeptConnection::new(&inner.store),
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
            renew(
                &mut connection,
                &inner.store,
                &key,
                &members,
                member.as_ref(),
                trust_until,
            ),
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
                        MemberReply::Renewed { settled, news } => {
                            membership.renewed(sent, settled, news)
                        }
                        MemberReply::Lost(reason) => {
                            membership.end(format!(
                                "heartbeat refused: {}",
                                crate::error::member_loss_text(reason)
                            ));
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
/// tenure was granted before the server's last promotion), or denied (`no_grant`, `bad_secret`: the loss names
/// which): asking again gets the same answer, and only a new acquisition (a new epoch) can help, which the
/// runtime's campaign loop does on its own.
fn renewal_verdict(renewal: Renewal) -> Option<TenureEnd> {
    match renewal {
        Renewal::Renewed => None,
        Renewal::Lost(reason) | Renewal::Denied(reason) => Some(TenureEnd::Lost { reason }),
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
            Some(TenureEnd::Lost {
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
                Some(TenureEnd::Lost { reason })
            );
        }
        for reason in [LossReason::NoGrant, LossReason::BadSecret] {
            assert_eq!(
                renewal_verdict(Renewal::Denied(reason)),
                Some(TenureEnd::Lost { reason })
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
            Renewal::Denied(LossReason::NoGrant)
        );
        for (outcome, reason) in [
            (Some("extended"), None),
            (None, None),
            (Some("refused"), None),
            (Some("refused"), Some("eclipsed")),
            // Outcome names renew_many never gives.
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
