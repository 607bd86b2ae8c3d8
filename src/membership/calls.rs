//! The membership calls ([`Groups`], a [`Store`]'s): join, heartbeat and leave, one SQL function call each; the reads of a
//! group's roster and members; and the gap a handover left.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::QueryableByName;

use super::rows::{sql, GroupMemberRow, MemberReply, MemberResultRow, RosterRow};
use super::{
    member_lost, validate_group, GroupMember, Groups, Member, MemberSpec, Roster, RosterMember,
};
use crate::error::{Error, Result};
use crate::reply::{unexpected, RowsOf};
use crate::types::LossReason;
use crate::validate::{ttl_ms, validate_holder, validate_name};

impl Groups<'_> {
    /// Joins group `group` (of the store's cluster) as `member` with `spec`, live for `ttl` by the database
    /// clock. The membership is not renewed by itself: the leadership runtime heartbeats it
    /// ([`Elector::join`](crate::leader::Elector::join)); [`heartbeat`](Self::heartbeat) does it by hand.
    ///
    /// A member whose previous incarnation expired (rather than left) within the last 10 ttls is a flap: it
    /// counts for the assignment at once but is settled (may acquire) only after ttl × 2^(flaps − 1), at most
    /// 8 ttls, so a replica that keeps restarting or missing its renewals cannot move names back and forth
    /// faster than that.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidInput`] for an invalid group, member name, spec ([`MemberSpec::validate`]) or ttl;
    ///   nothing is sent.
    /// - [`Error::MemberTaken`] while a live member of that name exists (another process, or this one's
    ///   previous incarnation): the same name never counts twice. Join again after `expires_in`.
    /// - [`Error::Denied`] when the session's role has no grant on the store's cluster (audited).
    /// - The [errors of every database call](crate#errors).
    #[tracing::instrument(name = "join_group", level = "info", skip_all, fields(group = %self.store.qualify(group), member = member))]
    pub async fn join(
        &self,
        group: &str,
        member: &str,
        spec: &MemberSpec,
        ttl: Duration,
    ) -> Result<Member> {
        validate_group(group)?;
        validate_holder("member", member)?;
        spec.validate()?;
        let ttl_ms = ttl_ms(ttl)?;
        let ttl = Duration::from_millis(ttl_ms as u64);
        let qualified = self.store.qualify(group);
        let vec = |set: &BTreeSet<String>| set.iter().cloned().collect::<Vec<_>>();
        let (sent, row): (Instant, MemberResultRow) = self
            .store
            .call_one(RowsOf(sql::join_group(
                qualified.clone(),
                member.to_owned(),
                spec.weight as i32,
                vec(&spec.names),
                vec(&spec.pinned),
                vec(&spec.excluded),
                ttl_ms,
            )))
            .await?;
        match row.decode("join_group")? {
            MemberReply::Joined {
                incarnation,
                secret,
                settled,
            } => {
                tracing::info!(group = %qualified, member, incarnation, settled, "joined the group");
                Ok(Member {
                    group: group.to_owned(),
                    qualified,
                    member: member.to_owned(),
                    incarnation,
                    secret,
                    ttl,
                    settled,
                    local_deadline: sent + ttl,
                })
            }
            MemberReply::Taken { expires_in } => Err(Error::MemberTaken {
                group: qualified,
                member: member.to_owned(),
                expires_in,
            }),
            MemberReply::Lost(LossReason::NoGrant) => Err(Error::Denied {
                lease: qualified,
                operation: "join_group".to_owned(),
                reason: LossReason::NoGrant,
            }),
            other => Err(unexpected("join_group", &format!("{other:?}"))),
        }
    }

    /// Extends a membership by `ttl` (database clock) and answers whether it is settled and the digest of the
    /// group's roster (it changes when a member joins, leaves, expires or settles, or a name changes hands).
    ///
    /// # Errors
    ///
    /// - [`Error::MemberLost`] with the reason when the database no longer counts it (expired, left, superseded,
    ///   a wrong secret — audited —, no grant).
    /// - [`Error::InvalidInput`] for an invalid ttl.
    /// - The [errors of every database call](crate#errors).
    pub async fn heartbeat(&self, member: &mut Member, ttl: Duration) -> Result<String> {
        let ttl_ms = ttl_ms(ttl)?;
        let (sent, row): (Instant, MemberResultRow) = self
            .store
            .call_one(RowsOf(sql::heartbeat(
                member.qualified.clone(),
                member.member.clone(),
                member.incarnation,
                member.secret.expose_secret().to_owned(),
                ttl_ms,
            )))
            .await?;
        match row.decode("heartbeat")? {
            MemberReply::Renewed { settled, digest } => {
                member.ttl = Duration::from_millis(ttl_ms as u64);
                member.renewed(sent, settled);
                Ok(digest)
            }
            MemberReply::Lost(reason) => Err(member_lost(member, reason)),
            other => Err(unexpected("heartbeat", &format!("{other:?}"))),
        }
    }

    /// Leaves the group at once (an orderly end: the next join under the name is no flap); the other members
    /// are notified and rebalance. Returns false when the membership had already ended (expired, superseded).
    ///
    /// # Errors
    ///
    /// [`Error::MemberLost`] for a wrong secret (audited) or no grant; the
    /// [errors of every database call](crate#errors).
    pub async fn leave(&self, member: &Member) -> Result<bool> {
        let (_, row): (Instant, MemberResultRow) = self
            .store
            .call_one(RowsOf(sql::leave_group(
                member.qualified.clone(),
                member.member.clone(),
                member.incarnation,
                member.secret.expose_secret().to_owned(),
            )))
            .await?;
        match row.decode("leave_group")? {
            MemberReply::Left => {
                tracing::info!(group = %member.qualified, member = %member.member, "left the group");
                Ok(true)
            }
            MemberReply::Lost(
                LossReason::Expired
                | LossReason::Left
                | LossReason::Superseded
                | LossReason::UnknownMember,
            ) => Ok(false),
            MemberReply::Lost(reason) => Err(member_lost(member, reason)),
            other => Err(unexpected("leave_group", &format!("{other:?}"))),
        }
    }

    /// The live roster of group `group` (of the store's cluster), one statement.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for an invalid group name; a database error `42501` without a grant on the
    /// cluster; the [errors of every database call](crate#errors).
    pub async fn roster(&self, group: &str) -> Result<Roster> {
        use diesel_async::RunQueryDsl;
        validate_group(group)?;
        let mut conn = self.store.checked().await?;
        let rows: std::result::Result<Vec<RosterRow>, diesel::result::Error> =
            RowsOf(sql::roster(self.store.qualify(group)))
                .load(&mut *conn)
                .await;
        conn.settle(&rows);
        let mut roster = Roster::default();
        for row in rows? {
            for name in &row.leads {
                roster.holders.insert(name.clone(), row.member.clone());
            }
            roster.members.push(RosterMember {
                member: row.member,
                weight: row.weight.max(1) as u32,
                settled: row.settled,
                names: row.names.into_iter().collect(),
                pinned: row.pinned.into_iter().collect(),
                excluded: row.excluded.into_iter().collect(),
            });
        }
        Ok(roster)
    }

    /// Every member row of the groups this role can read (`pgfence.group_members`), live or not, of group
    /// `group` (cluster-qualified) or of all groups; in group and member order.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a group that is not `<cluster>/<group>`; the
    /// [errors of every database call](crate#errors).
    pub async fn members(&self, group: Option<&str>) -> Result<Vec<GroupMember>> {
        use diesel_async::RunQueryDsl;
        if let Some(group) = group {
            crate::validate::validate_qualified(group)?;
        }
        let mut conn = self.store.checked().await?;
        let rows: std::result::Result<Vec<GroupMemberRow>, diesel::result::Error> = diesel::sql_query(
            "SELECT \"group\", member, incarnation, weight, live, settled, left_at IS NOT NULL AS left, \
             greatest(expires_in_ms, 0) AS expires_in_ms, flaps, names, pinned, excluded, leads \
             FROM pgfence.group_members WHERE $1::text IS NULL OR \"group\" = $1 ORDER BY \"group\", member",
        )
        .bind::<Nullable<Text>, _>(group)
        .load(&mut *conn)
        .await;
        conn.settle(&rows);
        Ok(rows?
            .into_iter()
            .map(|r| GroupMember {
                group: r.group,
                member: r.member,
                incarnation: r.incarnation,
                weight: r.weight.max(1) as u32,
                live: r.live,
                settled: r.settled,
                left: r.left,
                expires_in: Duration::from_millis(r.expires_in_ms.max(0) as u64),
                flaps: r.flaps,
                names: r.names,
                pinned: r.pinned,
                excluded: r.excluded,
                leads: r.leads,
            })
            .collect())
    }
}

/// The answer of the handover-gap query: the gap in microseconds, NULL unless the predecessor released.
#[derive(QueryableByName)]
struct GapRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    gap_us: Option<i64>,
}

impl Groups<'_> {
    /// How long lease `name` had no holder before the tenure `epoch` began, by the database clock, when the
    /// tenure before it was released (a handover); `None` when it ended otherwise (expired, forced, …) or there
    /// is none.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a malformed name; the [errors of every database call](crate#errors).
    pub async fn handover_gap(&self, name: &str, epoch: crate::Epoch) -> Result<Option<Duration>> {
        use diesel_async::RunQueryDsl;
        validate_name(name)?;
        let mut conn = self.store.checked().await?;
        let rows: std::result::Result<Vec<GapRow>, diesel::result::Error> = diesel::sql_query(
            "SELECT (SELECT CASE WHEN p.end_reason = 'released' \
                      THEN (extract(epoch FROM (t.acquired_at - p.ended_at)) * 1000000)::bigint END \
                      FROM pgfence.tenures p WHERE p.lease = t.lease AND p.epoch < t.epoch \
                     ORDER BY p.epoch DESC LIMIT 1) AS gap_us \
               FROM pgfence.tenures t WHERE t.lease = $1 AND t.epoch = $2",
        )
        .bind::<Text, _>(self.store.qualify(name))
        .bind::<BigInt, _>(epoch.get())
        .load(&mut *conn)
        .await;
        conn.settle(&rows);
        Ok(rows?
            .into_iter()
            .next()
            .and_then(|r| r.gap_us)
            .map(|us| Duration::from_micros(us.max(0) as u64)))
    }
}
