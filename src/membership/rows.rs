//! What the membership functions are and what they answer: their SQL declarations, the `pgfence.member_result`
//! row a join, heartbeat or leave returns, decoded in this one place into a [`MemberReply`], the
//! `pgfence.rebalance_result` of a claim or an assignment ([`Rebalance`]), and the rows of the assignment's
//! inputs and of `pgfence.group_members`.

use std::time::Duration;

use diesel::sql_types::{Array, BigInt, Bool, Integer, Nullable, Text};
use diesel::QueryableByName;

use crate::error::Result;
use crate::lease::TenureSecret;
use crate::reply::unexpected;
use crate::types::LossReason;

/// The membership functions, each called as `SELECT * FROM pgfence.f(…)` ([`RowsOf`]).
pub(crate) mod sql {
    use diesel::sql_types::{Array, BigInt, Integer, Text};

    /// The composite type `pgfence.member_result` a join, heartbeat or leave returns.
    #[derive(Debug, diesel::sql_types::SqlType, diesel::query_builder::QueryId)]
    #[diesel(postgres_type(name = "member_result", schema = "pgfence"))]
    #[allow(unreachable_pub)]
    pub struct MemberResult;

    /// The composite type `pgfence.rebalance_result` a claim or an assignment returns.
    #[derive(Debug, diesel::sql_types::SqlType, diesel::query_builder::QueryId)]
    #[diesel(postgres_type(name = "rebalance_result", schema = "pgfence"))]
    #[allow(unreachable_pub)]
    pub struct RebalanceResult;

    /// A row of the table `pgfence.rebalance_inputs` returns.
    #[derive(Debug, diesel::sql_types::SqlType, diesel::query_builder::QueryId)]
    #[allow(unreachable_pub)]
    pub struct InputRows;

    /// A row of the table `pgfence.group_assignment` returns.
    #[derive(Debug, diesel::sql_types::SqlType, diesel::query_builder::QueryId)]
    #[allow(unreachable_pub)]
    pub struct AssignmentRows;

    /// The row `pgfence.assigned_names` returns.
    #[derive(Debug, diesel::sql_types::SqlType, diesel::query_builder::QueryId)]
    #[allow(unreachable_pub)]
    pub struct AssignedRow;

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
        #[sql_name = "pgfence.claim_rebalance"]
        fn claim_rebalance(grp: Text, member: Text, incarnation: BigInt, secret: Text) -> RebalanceResult;
    }
    diesel::define_sql_function! {
        // The function's own arguments, one bind each.
        #[allow(clippy::too_many_arguments)]
        #[sql_name = "pgfence.assign_group"]
        fn assign_group(grp: Text, member: Text, incarnation: BigInt, secret: Text, version: BigInt,
                        generation: BigInt, names: Array<Text>, owners: Array<Text>, removed: Array<Text>,
                        counted: Array<Text>) -> RebalanceResult;
    }
    diesel::define_sql_function! {
        #[sql_name = "pgfence.rebalance_inputs"]
        fn rebalance_inputs(grp: Text) -> InputRows;
    }
    diesel::define_sql_function! {
        #[sql_name = "pgfence.group_assignment"]
        fn group_assignment(grp: Text) -> AssignmentRows;
    }
    diesel::define_sql_function! {
        #[sql_name = "pgfence.assigned_names"]
        fn assigned_names(grp: Text, member: Text) -> AssignedRow;
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
    #[diesel(sql_type = Nullable<BigInt>)]
    generation: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    rebalance_in_ms: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    channel: Option<String>,
}

/// What the group says of its assignment in a join's or heartbeat's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct GroupNews {
    /// The generation of the stored assignment (0 before the group's first): a member whose own read is older
    /// reads its names again.
    pub generation: i64,
    /// How long until a new assignment may be computed (by the database clock); `None` when none is pending.
    pub rebalance_in: Option<Duration>,
}

/// What a membership function answered, decoded in this one place.
#[derive(Debug)]
pub(crate) enum MemberReply {
    /// `joined`: a new incarnation and its secret, and the group's channel.
    Joined {
        incarnation: i64,
        secret: TenureSecret,
        settled: bool,
        news: GroupNews,
        channel: String,
    },
    /// `renewed`: whether settled, and the group's news.
    Renewed { settled: bool, news: GroupNews },
    /// `left`.
    Left,
    /// `refused` / `member_taken`: the live member of that name, and its time left.
    Taken { expires_in: Duration },
    /// `refused` with a membership's loss reason (`unknown_member`, `superseded`, `bad_secret`, `left`, `expired`,
    /// `no_grant`).
    Lost(LossReason),
}

fn millis(ms: i64) -> Duration {
    Duration::from_millis(ms.max(0) as u64)
}

impl MemberResultRow {
    fn news(&self, function: &str) -> Result<GroupNews> {
        Ok(GroupNews {
            generation: self
                .generation
                .ok_or_else(|| unexpected(function, "generation missing"))?,
            rebalance_in: self.rebalance_in_ms.map(millis),
        })
    }

    pub(crate) fn decode(self, function: &str) -> Result<MemberReply> {
        let missing = |what: &str| unexpected(function, &format!("{what} missing"));
        Ok(match self.outcome.as_deref() {
            Some("joined") => MemberReply::Joined {
                news: self.news(function)?,
                incarnation: self.incarnation.ok_or_else(|| missing("incarnation"))?,
                secret: TenureSecret::parse(self.secret.ok_or_else(|| missing("secret"))?)?,
                settled: self.settled.ok_or_else(|| missing("settled"))?,
                channel: self.channel.ok_or_else(|| missing("channel"))?,
            },
            Some("renewed") => MemberReply::Renewed {
                news: self.news(function)?,
                settled: self.settled.ok_or_else(|| missing("settled"))?,
            },
            Some("left") => MemberReply::Left,
            Some("refused") if self.reason.as_deref() == Some("member_taken") => {
                MemberReply::Taken {
                    expires_in: millis(self.expires_in_ms.unwrap_or(0)),
                }
            }
            Some("refused") => MemberReply::Lost(
                self.reason
                    .as_deref()
                    .and_then(LossReason::from_member_sql)
                    .ok_or_else(|| {
                        unexpected(function, &format!("reason {:?}", self.reason.as_deref()))
                    })?,
            ),
            Some(other) => return Err(unexpected(function, &format!("outcome {other}"))),
            None => return Err(missing("outcome")),
        })
    }
}

/// A `pgfence.rebalance_result`, read by column name.
#[derive(QueryableByName, Debug)]
pub(crate) struct RebalanceResultRow {
    #[diesel(sql_type = Nullable<Text>)]
    outcome: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    reason: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    version: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    generation: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    in_ms: Option<i64>,
}

/// What a claim or an assignment answered, decoded in this one place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rebalance {
    /// `claim`: this member computes the next assignment, from the stored one of `generation`, for the inputs of
    /// `version`, within `within`.
    Claim {
        /// The version of the inputs the claim was granted for.
        version: i64,
        /// The generation of the stored assignment the next one is computed from.
        generation: i64,
        /// How long the claim lasts.
        within: Duration,
    },
    /// `not_due`: nothing to do for `wait` (none: nothing is pending).
    NotDue {
        /// How long until one is due; `None` when nothing is pending.
        wait: Option<Duration>,
    },
    /// `claimed`: another member is computing it; its claim lapses after `wait`.
    Claimed {
        /// How long until the other member's claim lapses.
        wait: Duration,
    },
    /// `assigned`: the new assignment is stored as `generation`.
    Assigned {
        /// Its generation.
        generation: i64,
    },
    /// `stale`: the stored assignment changed since the claim, a member it named is gone, or a member it left
    /// out (read as expired) is back and counted; claim again.
    Stale,
    /// `refused` / `not_claimed`: this member holds no live claim (it lapsed).
    NotClaimed,
}

impl RebalanceResultRow {
    pub(crate) fn decode(
        self,
        function: &str,
    ) -> Result<std::result::Result<Rebalance, LossReason>> {
        let missing = |what: &str| unexpected(function, &format!("{what} missing"));
        Ok(Ok(
            match (self.outcome.as_deref(), self.reason.as_deref()) {
                (Some("claim"), None) => Rebalance::Claim {
                    version: self.version.ok_or_else(|| missing("version"))?,
                    generation: self.generation.ok_or_else(|| missing("generation"))?,
                    within: millis(self.in_ms.ok_or_else(|| missing("in_ms"))?),
                },
                (Some("not_due"), None) => Rebalance::NotDue {
                    wait: self.in_ms.map(millis),
                },
                (Some("claimed"), None) => Rebalance::Claimed {
                    wait: millis(self.in_ms.ok_or_else(|| missing("in_ms"))?),
                },
                (Some("assigned"), None) => Rebalance::Assigned {
                    generation: self.generation.ok_or_else(|| missing("generation"))?,
                },
                (Some("stale"), Some("generation" | "member_gone" | "member_back")) => {
                    Rebalance::Stale
                }
                (Some("refused"), Some("not_claimed")) => Rebalance::NotClaimed,
                (Some("refused"), Some(reason)) => {
                    return Ok(Err(LossReason::from_member_sql(reason).ok_or_else(
                        || unexpected(function, &format!("reason {reason:?}")),
                    )?))
                }
                (outcome, reason) => {
                    return Err(unexpected(
                        function,
                        &format!("outcome {outcome:?} with reason {reason:?}"),
                    ))
                }
            },
        ))
    }
}

/// A row of `pgfence.rebalance_inputs`: a member the next assignment counts.
#[derive(QueryableByName)]
pub(crate) struct InputRow {
    #[diesel(sql_type = Text)]
    pub(crate) member: String,
    #[diesel(sql_type = Integer)]
    pub(crate) weight: i32,
    #[diesel(sql_type = BigInt)]
    pub(crate) set_id: i64,
    #[diesel(sql_type = Array<Text>)]
    pub(crate) pinned: Vec<String>,
    #[diesel(sql_type = Array<Text>)]
    pub(crate) excluded: Vec<String>,
    #[diesel(sql_type = Bool)]
    pub(crate) settled: bool,
}

/// A row of `pgfence.group_assignment`.
#[derive(QueryableByName)]
pub(crate) struct AssignmentRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) generation: i64,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) name: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) member: Option<String>,
}

/// The row of `pgfence.assigned_names`.
#[derive(QueryableByName)]
pub(crate) struct AssignedNamesRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) generation: i64,
    #[diesel(sql_type = Array<Text>)]
    pub(crate) names: Vec<String>,
    #[diesel(sql_type = Integer)]
    pub(crate) members: i32,
}

/// A row of `pgfence.group_members`.
#[derive(QueryableByName)]
pub(super) struct GroupMemberRow {
    #[diesel(sql_type = Text)]
    pub(super) group: String,
    #[diesel(sql_type = Text)]
    pub(super) member: String,
    #[diesel(sql_type = BigInt)]
    pub(super) incarnation: i64,
    #[diesel(sql_type = Integer)]
    pub(super) weight: i32,
    #[diesel(sql_type = Bool)]
    pub(super) live: bool,
    #[diesel(sql_type = Bool)]
    pub(super) settled: bool,
    #[diesel(sql_type = Bool)]
    pub(super) counted: bool,
    #[diesel(sql_type = Bool)]
    pub(super) left: bool,
    #[diesel(sql_type = BigInt)]
    pub(super) expires_in_ms: i64,
    #[diesel(sql_type = Integer)]
    pub(super) flaps: i32,
    #[diesel(sql_type = Integer)]
    pub(super) name_count: i32,
    #[diesel(sql_type = Array<Text>)]
    pub(super) pinned: Vec<String>,
    #[diesel(sql_type = Array<Text>)]
    pub(super) excluded: Vec<String>,
    #[diesel(sql_type = Array<Text>)]
    pub(super) assigned: Vec<String>,
    #[diesel(sql_type = Array<Text>)]
    pub(super) leads: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(reason: Option<&str>) -> MemberResultRow {
        MemberResultRow {
            outcome: Some("refused".to_owned()),
            reason: reason.map(str::to_owned),
            incarnation: Some(1),
            secret: None,
            settled: None,
            expires_in_ms: Some(1500),
            generation: None,
            rebalance_in_ms: None,
            channel: None,
        }
    }

    /// Every reason a heartbeat or leave is refused for decodes to its own loss, `member_taken` to the live
    /// member's time left, and a reason the functions never give (or none) is an error, never a default.
    #[test]
    fn refusals_decode_exactly() {
        for loss in [
            LossReason::UnknownMember,
            LossReason::Superseded,
            LossReason::BadSecret,
            LossReason::Left,
            LossReason::Expired,
            LossReason::NoGrant,
        ] {
            let name = serde_json::to_value(loss).unwrap();
            let name = name.as_str().unwrap();
            assert!(
                matches!(refused(Some(name)).decode("heartbeat"), Ok(MemberReply::Lost(l)) if l == loss),
                "{name}"
            );
        }
        assert!(matches!(
            refused(Some("member_taken")).decode("join_group"),
            Ok(MemberReply::Taken { expires_in }) if expires_in == Duration::from_millis(1500)
        ));
        for reason in [
            Some("denied"),
            Some("released"),
            Some("unknown_lease"),
            Some("forced"),
            Some(""),
            None,
        ] {
            let error = refused(reason).decode("heartbeat").unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains("unexpected result of pgfence.heartbeat"),
                "{reason:?}: {error}"
            );
        }
    }
}
