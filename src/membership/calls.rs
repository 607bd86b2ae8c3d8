//! The membership calls ([`Groups`], a [`Store`]'s): join, heartbeat and leave, one SQL function call each; the
//! stored assignment's claim, inputs, reads and write; the members an operator reads; and the gap a handover left.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::sql_types::{Array, BigInt, Nullable, Text};
use diesel::QueryableByName;

use super::rows::{
    sql, AssignedNamesRow, AssignmentRow, GroupMemberRow, InputRow, MemberReply, MemberResultRow,
    RebalanceResultRow,
};
use super::{
    member_lost, validate_group, GroupAssignment, GroupMember, GroupNews, Groups, Member,
    MemberSpec, OwnNames, Rebalance, RosterMember,
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
    /// A member counts for the assignment once settled, at its first heartbeat — or at once when the stored
    /// assignment still gives it names (it joins again under its name). A member whose previous incarnation
    /// expired (rather than left) within the last 10 ttls is a flap: it is settled only after
    /// ttl × 2^(flaps − 1), at most 8 ttls, so a replica that keeps restarting or missing its renewals cannot
    /// move names back and forth faster than that.
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
                news,
                channel,
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
                    channel,
                    news,
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

    /// Extends a membership by `ttl` (database clock) and answers what the group says of its assignment (the
    /// stored generation, and how long until a new one may be computed); [`Member::settled`] says whether it is
    /// settled.
    ///
    /// # Errors
    ///
    /// - [`Error::MemberLost`] with the reason when the database no longer counts it (expired, left, superseded,
    ///   a wrong secret — audited —, no grant).
    /// - [`Error::InvalidInput`] for an invalid ttl.
    /// - The [errors of every database call](crate#errors).
    pub async fn heartbeat(&self, member: &mut Member, ttl: Duration) -> Result<GroupNews> {
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
            MemberReply::Renewed { settled, news } => {
                member.ttl = Duration::from_millis(ttl_ms as u64);
                member.renewed(sent, settled);
                Ok(news)
            }
            MemberReply::Lost(reason) => Err(member_lost(member, reason)),
            other => Err(unexpected("heartbeat", &format!("{other:?}"))),
        }
    }

    /// Leaves the group at once (an orderly end: the next join under the name is no flap); a member that
    /// counted makes a new assignment due at once, and the other members are notified. Returns false when the membership had already ended (expired, superseded).
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

    /// Asks to compute the group's next assignment (`pgfence.claim_rebalance`): [`Rebalance::Claim`] when one
    /// is due and nobody else holds a live claim; otherwise how long to wait.
    ///
    /// # Errors
    ///
    /// [`Error::MemberLost`] when the database no longer counts `member` (a wrong secret is audited); the
    /// [errors of every database call](crate#errors).
    pub async fn claim_rebalance(&self, member: &Member) -> Result<Rebalance> {
        let (_, row): (Instant, RebalanceResultRow) = self
            .store
            .call_one(RowsOf(sql::claim_rebalance(
                member.qualified.clone(),
                member.member.clone(),
                member.incarnation,
                member.secret.expose_secret().to_owned(),
            )))
            .await?;
        row.decode("claim_rebalance")?
            .map_err(|reason| member_lost(member, reason))
    }

    /// The members the next assignment of `group` counts (`pgfence.rebalance_inputs`: live, and settled or
    /// counted by the stored one), with their name sets read through `names` (each set once per process:
    /// sets never change).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for an invalid group name; a database error `42501` without a grant on the
    /// cluster; the [errors of every database call](crate#errors).
    pub async fn rebalance_inputs(
        &self,
        group: &str,
        names: &NameSets,
    ) -> Result<Vec<RosterMember>> {
        validate_group(group)?;
        let qualified = self.store.qualify(group);
        let rows: Vec<InputRow> = self
            .load_rows(RowsOf(sql::rebalance_inputs(qualified.clone())))
            .await?;
        let mut members = Vec::with_capacity(rows.len());
        for row in rows {
            let set = match names.get(row.set_id) {
                Some(set) => set,
                None => {
                    let read = self.group_names(&qualified, row.set_id).await?;
                    names.insert(row.set_id, read)
                }
            };
            members.push(RosterMember {
                member: row.member,
                weight: row.weight.max(1) as u32,
                settled: row.settled,
                names: set,
                pinned: row.pinned.into_iter().collect(),
                excluded: row.excluded.into_iter().collect(),
            });
        }
        Ok(members)
    }

    /// The names of set `set_id` as a member of `qualified` declared them.
    async fn group_names(&self, qualified: &str, set_id: i64) -> Result<Arc<BTreeSet<String>>> {
        #[derive(QueryableByName)]
        struct NamesRow {
            #[diesel(sql_type = Nullable<Array<Text>>)]
            names: Option<Vec<String>>,
        }
        let rows: Vec<NamesRow> = self
            .load_rows(
                diesel::sql_query("SELECT pgfence.group_names($1, $2) AS names")
                    .bind::<Text, _>(qualified.to_owned())
                    .bind::<BigInt, _>(set_id),
            )
            .await?;
        let names = rows
            .into_iter()
            .next()
            .and_then(|r| r.names)
            .ok_or_else(|| unexpected("group_names", "no names for a set a member declares"))?;
        Ok(Arc::new(names.into_iter().collect()))
    }

    /// The stored assignment of group `group` (`pgfence.group_assignment`): O(names).
    ///
    /// # Errors
    ///
    /// As [`rebalance_inputs`](Self::rebalance_inputs).
    pub async fn assignment(&self, group: &str) -> Result<GroupAssignment> {
        validate_group(group)?;
        let rows: Vec<AssignmentRow> = self
            .load_rows(RowsOf(sql::group_assignment(self.store.qualify(group))))
            .await?;
        let mut assignment = GroupAssignment::default();
        for row in rows {
            assignment.generation = row.generation;
            if let (Some(name), Some(member)) = (row.name, row.member) {
                assignment.owners.insert(name, member);
            }
        }
        Ok(assignment)
    }

    /// `member`'s own part of the stored assignment of `group` (`pgfence.assigned_names`): its generation, the
    /// names assigned to `member` (sorted) and how many members it counts. O(its names + members).
    ///
    /// # Errors
    ///
    /// As [`rebalance_inputs`](Self::rebalance_inputs); [`Error::InvalidInput`] for an invalid member name.
    pub async fn assigned_names(&self, group: &str, member: &str) -> Result<OwnNames> {
        validate_group(group)?;
        validate_holder("member", member)?;
        let rows: Vec<AssignedNamesRow> = self
            .load_rows(RowsOf(sql::assigned_names(
                self.store.qualify(group),
                member.to_owned(),
            )))
            .await?;
        let row = rows
            .into_iter()
            .next()
            .ok_or_else(|| unexpected("assigned_names", "no row"))?;
        Ok(OwnNames {
            generation: row.generation,
            names: row.names,
            members: row.members.max(0) as usize,
        })
    }

    /// Stores the next assignment of `member`'s group (`pgfence.assign_group`), computed under a claim from the
    /// stored one of `generation` for the inputs of `version`: `moves` (name → its new member), `removed` (names
    /// no member may lead any more) and the members it counted. [`Rebalance::Assigned`] with the new generation,
    /// or [`Rebalance::Stale`] / [`Rebalance::NotClaimed`].
    ///
    /// # Errors
    ///
    /// [`Error::MemberLost`] when the database no longer counts `member`; the
    /// [errors of every database call](crate#errors).
    pub async fn store_assignment(
        &self,
        member: &Member,
        version: i64,
        generation: i64,
        moves: &BTreeMap<String, String>,
        removed: &[String],
        counted: &[String],
    ) -> Result<Rebalance> {
        let (_, row): (Instant, RebalanceResultRow) = self
            .store
            .call_one(RowsOf(sql::assign_group(
                member.qualified.clone(),
                member.member.clone(),
                member.incarnation,
                member.secret.expose_secret().to_owned(),
                version,
                generation,
                moves.keys().cloned().collect::<Vec<_>>(),
                moves.values().cloned().collect::<Vec<_>>(),
                removed.to_vec(),
                counted.to_vec(),
            )))
            .await?;
        row.decode("assign_group")?
            .map_err(|reason| member_lost(member, reason))
    }

    /// Runs a read on a pooled connection.
    async fn load_rows<Q, R>(&self, query: Q) -> Result<Vec<R>>
    where
        Q: diesel_async::methods::LoadQuery<'static, diesel_async::AsyncPgConnection, R>
            + Send
            + 'static,
        R: Send + 'static,
    {
        use diesel_async::RunQueryDsl;
        let mut conn = self.store.checked().await?;
        let rows: std::result::Result<Vec<R>, diesel::result::Error> = query.load(&mut *conn).await;
        conn.settle(&rows);
        Ok(rows?)
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
            "SELECT \"group\", member, incarnation, weight, live, settled, counted, left_at IS NOT NULL AS left, \
             greatest(expires_in_ms, 0) AS expires_in_ms, flaps, name_count, pinned, excluded, assigned, leads \
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
                counted: r.counted,
                left: r.left,
                expires_in: Duration::from_millis(r.expires_in_ms.max(0) as u64),
                flaps: r.flaps,
                name_count: r.name_count.max(0) as usize,
                pinned: r.pinned,
                excluded: r.excluded,
                assigned: r.assigned,
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

/// The name sets a process has read, by id: a set never changes once stored, so each is read once, and every
/// member declaring it shares one copy.
#[derive(Debug, Default)]
pub struct NameSets {
    sets: std::sync::Mutex<std::collections::HashMap<i64, Arc<BTreeSet<String>>>>,
}

impl NameSets {
    fn get(&self, id: i64) -> Option<Arc<BTreeSet<String>>> {
        self.sets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    fn insert(&self, id: i64, set: Arc<BTreeSet<String>>) -> Arc<BTreeSet<String>> {
        self.sets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id)
            .or_insert(set)
            .clone()
    }
}
