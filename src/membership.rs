//! Replica groups: a process that spreads its controllers joins a named group as a member, with the names it can
//! lead, and keeps its membership live by heartbeats (database clock); every member reads the same [`Roster`]
//! and derives the same balanced assignment from it ([`leader::assign`](crate::leader::assign)). Membership is
//! no fence: every write stays fenced by its lease's epoch, so members that disagree for a moment about who
//! should lead a name can delay a handover, never produce a write the database should have refused.
//!
//! SQL: `migrations/2026-11-30-000005_membership/up.sql` (`pgfence.join_group`, `pgfence.heartbeat`,
//! `pgfence.leave_group`, `pgfence.roster`, the view `pgfence.group_members`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

use diesel::sql_types::{Array, BigInt, Bool, Integer, Nullable, Text};
use diesel::QueryableByName;
use serde::{Deserialize, Serialize};

use crate::error::{DenyReason, Error, Result};
use crate::lease::TenureSecret;
use crate::reply::{unexpected, RowsOf};
use crate::store::Store;
use crate::types::{MAX_TTL, MIN_TTL};
use crate::validate::{check_text, validate_holder, validate_name};

/// The largest accepted member weight (capacity); the smallest is 1.
pub const MAX_WEIGHT: u32 = 1000;

/// The most names, pins and exclusions one member may declare in all.
pub const MAX_GROUP_NAMES: usize = 4096;

/// The most shards one sharded controller may have (its shards are names of the group, within
/// [`MAX_GROUP_NAMES`]).
pub const MAX_SHARDS: u32 = 1024;

/// Longest accepted group name, in characters (the cluster prefix is not counted): a lease name's limit.
pub const MAX_GROUP_LEN: usize = crate::types::MAX_NAME_LEN;

/// What a member declares when it joins: the names it can lead, its weight, and the names it must or must never
/// lead.
///
/// ```
/// use pgfence::MemberSpec;
///
/// let spec = MemberSpec::new(["scheduler", "rollout", "billing"])
///     .weight(2)
///     .exclude(["billing"]);
/// spec.validate()?;
/// # Ok::<(), pgfence::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MemberSpec {
    /// Capacity, 1..=[`MAX_WEIGHT`]: a member of weight 2 is assigned about twice the names of one of weight 1.
    pub weight: u32,
    /// The names this member can lead (its controllers, shards expanded).
    pub names: BTreeSet<String>,
    /// Names this member leads whenever it is live, whatever the balance (each must be one of `names`).
    pub pinned: BTreeSet<String>,
    /// Names this member must never lead.
    pub excluded: BTreeSet<String>,
}

impl MemberSpec {
    /// A member of weight 1 that can lead `names`, with no pins or exclusions.
    pub fn new(names: impl IntoIterator<Item = impl Into<String>>) -> MemberSpec {
        MemberSpec {
            weight: 1,
            names: names.into_iter().map(Into::into).collect(),
            pinned: BTreeSet::new(),
            excluded: BTreeSet::new(),
        }
    }

    /// Sets the weight.
    pub fn weight(mut self, weight: u32) -> MemberSpec {
        self.weight = weight;
        self
    }

    /// Adds pinned names.
    pub fn pin(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> MemberSpec {
        self.pinned.extend(names.into_iter().map(Into::into));
        self
    }

    /// Adds excluded names.
    pub fn exclude(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> MemberSpec {
        self.excluded.extend(names.into_iter().map(Into::into));
        self
    }

    /// Checks the spec as the database does (`pgfence._member_problem`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the field: a weight of 0 or above [`MAX_WEIGHT`]; no names; more than
    /// [`MAX_GROUP_NAMES`] names, pins and exclusions in all; a name that is not a valid lease name; a pin that is
    /// not one of the names, or is also excluded.
    pub fn validate(&self) -> Result<()> {
        if self.weight == 0 || self.weight > MAX_WEIGHT {
            return Err(Error::invalid(
                "weight",
                format!("must be between 1 and {MAX_WEIGHT}, got {}", self.weight),
            ));
        }
        if self.names.is_empty() {
            return Err(Error::invalid("names", "a member leads at least one name"));
        }
        let total = self.names.len() + self.pinned.len() + self.excluded.len();
        if total > MAX_GROUP_NAMES {
            return Err(Error::invalid(
                "names",
                format!("at most {MAX_GROUP_NAMES} names, pins and exclusions in all, got {total}"),
            ));
        }
        for name in self.names.iter().chain(&self.pinned).chain(&self.excluded) {
            validate_name(name)?;
        }
        if let Some(pin) = self.pinned.iter().find(|p| !self.names.contains(*p)) {
            return Err(Error::invalid(
                "pin",
                format!("{pin:?} is not one of the member's names"),
            ));
        }
        if let Some(pin) = self.pinned.iter().find(|p| self.excluded.contains(*p)) {
            return Err(Error::invalid("pin", format!("{pin:?} is also excluded")));
        }
        Ok(())
    }
}

/// Checks a group name (without its cluster): a lease name's rules.
pub(crate) fn validate_group(group: &str) -> Result<()> {
    check_text("group", group, MAX_GROUP_LEN)
}

/// A membership this process holds: the group, the member name, the incarnation the database issued, its secret
/// and the local deadline before which the database cannot have expired it.
///
/// Plain data, like [`Lease`](crate::Lease): it does not heartbeat by itself (the leadership runtime does:
/// [`Elector::join`](crate::leader::Elector::join)).
#[derive(Debug, Clone)]
pub struct Member {
    group: String,
    qualified: String,
    member: String,
    incarnation: i64,
    /// `Debug` redacts it.
    secret: TenureSecret,
    ttl: Duration,
    settled: bool,
    local_deadline: Instant,
}

impl Member {
    #[cfg(feature = "testing")]
    pub(crate) fn from_parts(
        group: &str,
        qualified: String,
        member: &str,
        incarnation: i64,
        secret: TenureSecret,
        local_deadline: Instant,
    ) -> Member {
        Member {
            group: group.to_owned(),
            qualified,
            member: member.to_owned(),
            incarnation,
            secret,
            ttl: MAX_TTL,
            settled: true,
            local_deadline,
        }
    }

    /// The group name without its cluster prefix.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The cluster-qualified group name (`<cluster>/<group>`).
    pub fn qualified_group(&self) -> &str {
        &self.qualified
    }

    /// The member name.
    pub fn member(&self) -> &str {
        &self.member
    }

    /// How many times this member name has joined the group (this join included).
    pub fn incarnation(&self) -> i64 {
        self.incarnation
    }

    /// The ttl of the join or last heartbeat.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Whether the database counted the member as settled (it may acquire) at the join or last heartbeat.
    pub fn settled(&self) -> bool {
        self.settled
    }

    /// By the monotonic clock: the send time of the join or last heartbeat + ttl. The database cannot have
    /// expired the member before it.
    pub fn local_deadline(&self) -> Instant {
        self.local_deadline
    }

    pub(crate) fn secret(&self) -> &TenureSecret {
        &self.secret
    }

    /// The membership after a heartbeat sent at `sent` answered `renewed`.
    pub(crate) fn renewed(&mut self, sent: Instant, settled: bool) {
        self.settled = settled;
        self.local_deadline = sent + self.ttl;
    }
}

/// Why the database no longer counts a membership (a heartbeat's refusal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MemberLoss {
    /// The group has no member of this name.
    UnknownMember,
    /// A later incarnation of the name joined (this one had expired).
    Superseded,
    /// The secret presented is not the incarnation's (audited).
    BadSecret,
    /// The member left.
    Left,
    /// Its ttl ran out by the database clock: join again.
    Expired,
    /// The session's role has no grant on the group's cluster (audited).
    NoGrant,
}

impl MemberLoss {
    fn parse(function: &str, reason: Option<&str>) -> Result<MemberLoss> {
        Ok(match reason {
            Some("unknown_member") => MemberLoss::UnknownMember,
            Some("superseded") => MemberLoss::Superseded,
            Some("bad_secret") => MemberLoss::BadSecret,
            Some("left") => MemberLoss::Left,
            Some("expired") => MemberLoss::Expired,
            Some("no_grant") => MemberLoss::NoGrant,
            other => return Err(unexpected(function, &format!("reason {other:?}"))),
        })
    }
}

impl fmt::Display for MemberLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemberLoss::UnknownMember => "unknown member",
            MemberLoss::Superseded => "superseded by a later incarnation",
            MemberLoss::BadSecret => "wrong secret",
            MemberLoss::Left => "left",
            MemberLoss::Expired => "expired",
            MemberLoss::NoGrant => "no grant on the group's cluster",
        })
    }
}

/// One live member of a group as the assignment sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RosterMember {
    /// The member name.
    pub member: String,
    /// Capacity, 1..=[`MAX_WEIGHT`]. A member of weight 2 gets about twice the names of one of weight 1.
    pub weight: u32,
    /// Counted for acquisition: settled members may acquire; the assignment itself counts every live member,
    /// settled or not (so that nobody grabs a settling member's share meanwhile).
    pub settled: bool,
    /// Names this member can lead (its controllers, shards expanded).
    pub names: BTreeSet<String>,
    /// Names this member must lead when it is live (they go to a pinning member whatever the balance).
    pub pinned: BTreeSet<String>,
    /// Names this member must never lead.
    pub excluded: BTreeSet<String>,
}

impl RosterMember {
    /// A member with weight 1, settled, no pins or exclusions.
    pub fn new(
        member: impl Into<String>,
        names: impl IntoIterator<Item = impl Into<String>>,
    ) -> RosterMember {
        RosterMember {
            member: member.into(),
            weight: 1,
            settled: true,
            names: names.into_iter().map(Into::into).collect(),
            pinned: BTreeSet::new(),
            excluded: BTreeSet::new(),
        }
    }

    /// The member with weight, pins and exclusions of `spec`.
    pub fn from_spec(member: impl Into<String>, spec: &MemberSpec, settled: bool) -> RosterMember {
        RosterMember {
            member: member.into(),
            weight: spec.weight,
            settled,
            names: spec.names.clone(),
            pinned: spec.pinned.clone(),
            excluded: spec.excluded.clone(),
        }
    }
}

/// The live members of a group and who leads each of its names now: the assignment's one input, read in one
/// statement (`pgfence.roster`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Roster {
    /// The live members, in member order.
    pub members: Vec<RosterMember>,
    /// Name → the member holding a live tenure of its lease (under the member's name and role) now.
    pub holders: BTreeMap<String, String>,
}

/// A row of `pgfence.group_members`: a member of a group as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GroupMember {
    /// The cluster-qualified group name.
    pub group: String,
    /// The member name.
    pub member: String,
    /// How many times the name has joined.
    pub incarnation: i64,
    /// Its weight.
    pub weight: u32,
    /// Whether it is live now (database clock).
    pub live: bool,
    /// Whether it is settled (may acquire).
    pub settled: bool,
    /// Whether it left in order (a member that is neither live nor left expired).
    pub left: bool,
    /// Time left before it expires (database clock; zero when it has).
    pub expires_in: Duration,
    /// Consecutive incarnations that ended by expiry (the hysteresis counter).
    pub flaps: i32,
    /// The names it can lead.
    pub names: Vec<String>,
    /// Its pinned names.
    pub pinned: Vec<String>,
    /// Its excluded names.
    pub excluded: Vec<String>,
    /// The names it leads now.
    pub leads: Vec<String>,
}

/// The membership functions, each called as `SELECT * FROM pgfence.f(…)` ([`RowsOf`]) and answered by one
/// [`MemberResultRow`].
pub(crate) mod sql {
    use diesel::sql_types::{Array, BigInt, Integer, Text};

    /// The composite type `pgfence.member_result` every membership function returns.
    #[derive(Debug, diesel::sql_types::SqlType, diesel::query_builder::QueryId)]
    #[diesel(postgres_type(name = "member_result", schema = "pgfence"))]
    #[allow(unreachable_pub)]
    pub struct MemberResult;

    /// A row of the table `pgfence.roster` returns.
    #[derive(Debug, diesel::sql_types::SqlType, diesel::query_builder::QueryId)]
    #[allow(unreachable_pub)]
    pub struct RosterRows;

    diesel::define_sql_function! {
        #[sql_name = "pgfence.join_group"]
        fn join_group(grp: Text, member: Text, weight: Integer, names: Array<Text>, pinned: Array<Text>,
                      excluded: Array<Text>, ttl_ms: BigInt) -> MemberResult;
    }
    diesel::define_sql_function! {
        #[sql_name = "pgfence.heartbeat"]
        fn heartbeat(grp: Text, member: Text, incarnation: BigInt, secret: Text, ttl_ms: BigInt) -> MemberResult;
    }
    diesel::define_sql_function! {
        #[sql_name = "pgfence.leave_group"]
        fn leave_group(grp: Text, member: Text, incarnation: BigInt, secret: Text) -> MemberResult;
    }
    diesel::define_sql_function! {
        #[sql_name = "pgfence.roster"]
        fn roster(grp: Text) -> RosterRows;
    }
}

/// A `pgfence.member_result`, read by column name.
#[derive(QueryableByName, Debug)]
pub(crate) struct MemberResultRow {
    #[diesel(sql_type = Nullable<Text>)]
    outcome: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    reason: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    incarnation: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    secret: Option<String>,
    #[diesel(sql_type = Nullable<Bool>)]
    settled: Option<bool>,
    #[diesel(sql_type = Nullable<BigInt>)]
    expires_in_ms: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    roster_digest: Option<String>,
}

/// What a membership function answered, decoded in this one place.
#[derive(Debug)]
pub(crate) enum MemberReply {
    /// `joined`: a new incarnation and its secret.
    Joined {
        incarnation: i64,
        secret: TenureSecret,
        settled: bool,
    },
    /// `renewed`: whether settled, and the roster's digest.
    Renewed { settled: bool, digest: String },
    /// `left`.
    Left,
    /// `refused` / `member_taken`: the live member of that name, and its time left.
    Taken { expires_in: Duration },
    /// `refused` with a loss reason.
    Lost(MemberLoss),
}

impl MemberResultRow {
    pub(crate) fn decode(self, function: &str) -> Result<MemberReply> {
        let missing = |what: &str| unexpected(function, &format!("{what} missing"));
        Ok(match self.outcome.as_deref() {
            Some("joined") => MemberReply::Joined {
                incarnation: self.incarnation.ok_or_else(|| missing("incarnation"))?,
                secret: TenureSecret::parse(self.secret.ok_or_else(|| missing("secret"))?)?,
                settled: self.settled.ok_or_else(|| missing("settled"))?,
            },
            Some("renewed") => MemberReply::Renewed {
                settled: self.settled.ok_or_else(|| missing("settled"))?,
                digest: self.roster_digest.ok_or_else(|| missing("roster digest"))?,
            },
            Some("left") => MemberReply::Left,
            Some("refused") if self.reason.as_deref() == Some("member_taken") => {
                MemberReply::Taken {
                    expires_in: Duration::from_millis(self.expires_in_ms.unwrap_or(0).max(0) as u64),
                }
            }
            Some("refused") => {
                MemberReply::Lost(MemberLoss::parse(function, self.reason.as_deref())?)
            }
            Some(other) => return Err(unexpected(function, &format!("outcome {other}"))),
            None => return Err(missing("outcome")),
        })
    }
}

/// A row of `pgfence.roster`.
#[derive(QueryableByName)]
struct RosterRow {
    #[diesel(sql_type = Text)]
    member: String,
    #[diesel(sql_type = Integer)]
    weight: i32,
    #[diesel(sql_type = Bool)]
    settled: bool,
    #[diesel(sql_type = Array<Text>)]
    names: Vec<String>,
    #[diesel(sql_type = Array<Text>)]
    pinned: Vec<String>,
    #[diesel(sql_type = Array<Text>)]
    excluded: Vec<String>,
    #[diesel(sql_type = Array<Text>)]
    leads: Vec<String>,
}

/// A row of `pgfence.group_members`.
#[derive(QueryableByName)]
struct GroupMemberRow {
    #[diesel(sql_type = Text)]
    group: String,
    #[diesel(sql_type = Text)]
    member: String,
    #[diesel(sql_type = BigInt)]
    incarnation: i64,
    #[diesel(sql_type = Integer)]
    weight: i32,
    #[diesel(sql_type = Bool)]
    live: bool,
    #[diesel(sql_type = Bool)]
    settled: bool,
    #[diesel(sql_type = Bool)]
    left: bool,
    #[diesel(sql_type = BigInt)]
    expires_in_ms: i64,
    #[diesel(sql_type = Integer)]
    flaps: i32,
    #[diesel(sql_type = Array<Text>)]
    names: Vec<String>,
    #[diesel(sql_type = Array<Text>)]
    pinned: Vec<String>,
    #[diesel(sql_type = Array<Text>)]
    excluded: Vec<String>,
    #[diesel(sql_type = Array<Text>)]
    leads: Vec<String>,
}

pub(crate) fn ttl_ms(ttl: Duration) -> Result<i64> {
    if ttl < MIN_TTL || ttl > MAX_TTL {
        return Err(Error::invalid(
            "ttl",
            format!("must be between {MIN_TTL:?} and {MAX_TTL:?}, got {ttl:?}"),
        ));
    }
    Ok(ttl.as_millis() as i64)
}

pub(crate) fn member_lost(member: &Member, reason: MemberLoss) -> Error {
    Error::MemberLost {
        group: member.qualified.clone(),
        member: member.member.clone(),
        reason,
    }
}

impl Store {
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
    #[tracing::instrument(level = "info", skip_all, fields(group = %self.qualify(group), member = member))]
    pub async fn join_group(
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
        let qualified = self.qualify(group);
        let vec = |set: &BTreeSet<String>| set.iter().cloned().collect::<Vec<_>>();
        let (sent, row): (Instant, MemberResultRow) = self
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
            MemberReply::Lost(MemberLoss::NoGrant) => Err(Error::Denied {
                lease: qualified,
                operation: "join_group".to_owned(),
                reason: DenyReason::NoGrant,
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
    pub async fn leave_group(&self, member: &Member) -> Result<bool> {
        let (_, row): (Instant, MemberResultRow) = self
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
                MemberLoss::Expired
                | MemberLoss::Left
                | MemberLoss::Superseded
                | MemberLoss::UnknownMember,
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
        let mut conn = self.checked().await?;
        let rows: std::result::Result<Vec<RosterRow>, diesel::result::Error> =
            RowsOf(sql::roster(self.qualify(group)))
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
    pub async fn group_members(&self, group: Option<&str>) -> Result<Vec<GroupMember>> {
        use diesel_async::RunQueryDsl;
        if let Some(group) = group {
            crate::validate::validate_qualified(group)?;
        }
        let mut conn = self.checked().await?;
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

impl Store {
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
        let mut conn = self.checked().await?;
        let rows: std::result::Result<Vec<GapRow>, diesel::result::Error> = diesel::sql_query(
            "SELECT (SELECT CASE WHEN p.end_reason = 'released' \
                      THEN (extract(epoch FROM (t.acquired_at - p.ended_at)) * 1000000)::bigint END \
                      FROM pgfence.tenures p WHERE p.lease = t.lease AND p.epoch < t.epoch \
                     ORDER BY p.epoch DESC LIMIT 1) AS gap_us \
               FROM pgfence.tenures t WHERE t.lease = $1 AND t.epoch = $2",
        )
        .bind::<Text, _>(self.qualify(name))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Bad input is refused before anything is sent, with the field named.
    #[test]
    fn member_specs_are_checked_as_the_database_checks_them() {
        let field = |spec: MemberSpec| match spec.validate() {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(MemberSpec::new(["a"]).weight(0)), "weight");
        assert_eq!(
            field(MemberSpec::new(["a"]).weight(MAX_WEIGHT + 1)),
            "weight"
        );
        assert_eq!(field(MemberSpec::new(Vec::<String>::new())), "names");
        assert_eq!(field(MemberSpec::new(["a"]).pin(["b"])), "pin");
        assert_eq!(
            field(MemberSpec::new(["a"]).pin(["a"]).exclude(["a"])),
            "pin"
        );
        assert_eq!(field(MemberSpec::new(["a\n"])), "lease name");
        assert_eq!(
            field(MemberSpec::new(
                (0..=MAX_GROUP_NAMES).map(|i| i.to_string())
            )),
            "names"
        );
        MemberSpec::new(["a", "b"])
            .weight(MAX_WEIGHT)
            .pin(["a"])
            .exclude(["c"])
            .validate()
            .unwrap();
    }
}
