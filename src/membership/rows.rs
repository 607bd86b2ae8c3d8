//! What the membership functions are and what they answer: their SQL declarations, the `pgfence.member_result`
//! row every one of them returns, decoded in this one place into a [`MemberReply`], and the rows of the roster
//! and of `pgfence.group_members`.

use std::time::Duration;

use diesel::sql_types::{Array, BigInt, Bool, Integer, Nullable, Text};
use diesel::QueryableByName;

use crate::error::Result;
use crate::lease::TenureSecret;
use crate::reply::unexpected;
use crate::types::LossReason;

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
    /// `refused` with a membership's loss reason (`unknown_member`, `superseded`, `bad_secret`, `left`, `expired`,
    /// `no_grant`).
    Lost(LossReason),
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

/// A row of `pgfence.roster`.
#[derive(QueryableByName)]
pub(super) struct RosterRow {
    #[diesel(sql_type = Text)]
    pub(super) member: String,
    #[diesel(sql_type = Integer)]
    pub(super) weight: i32,
    #[diesel(sql_type = Bool)]
    pub(super) settled: bool,
    #[diesel(sql_type = Array<Text>)]
    pub(super) names: Vec<String>,
    #[diesel(sql_type = Array<Text>)]
    pub(super) pinned: Vec<String>,
    #[diesel(sql_type = Array<Text>)]
    pub(super) excluded: Vec<String>,
    #[diesel(sql_type = Array<Text>)]
    pub(super) leads: Vec<String>,
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
    pub(super) left: bool,
    #[diesel(sql_type = BigInt)]
    pub(super) expires_in_ms: i64,
    #[diesel(sql_type = Integer)]
    pub(super) flaps: i32,
    #[diesel(sql_type = Array<Text>)]
    pub(super) names: Vec<String>,
    #[diesel(sql_type = Array<Text>)]
    pub(super) pinned: Vec<String>,
    #[diesel(sql_type = Array<Text>)]
    pub(super) excluded: Vec<String>,
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
            roster_digest: None,
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
