//! How pgfence reads what its SQL functions answer: a call is sent as `SELECT * FROM pgfence.f(…)` ([`RowsOf`]),
//! so that its row is read by column name into a `QueryableByName` struct, never by position; the reasons the
//! replies share are decoded here; and a reply this crate does not know is an error ([`unexpected`]), never a
//! default. Each module decodes its functions' outcomes into an enum of its own, in one place: `LeaseReply`
//! (src/lease/rows.rs), `WriteOutcome` (src/fence/outcome.rs), `Renewal` (src/leader/pg/renew.rs).

use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::Untyped;

use crate::error::{Error, Result};
use crate::types::LossReason;

/// `SELECT * FROM <call>` for a call of a pgfence function (declared with `diesel::define_sql_function!`): one
/// statement, prepared once per connection and reused (cached by the call's type, as `diesel::select` is), whose
/// rows — the function's composite result, or its table — are read by column name.
#[derive(Debug, Clone, Copy, QueryId)]
pub(crate) struct RowsOf<F>(pub(crate) F);

impl<F: QueryFragment<Pg>> QueryFragment<Pg> for RowsOf<F> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> diesel::QueryResult<()> {
        out.push_sql("SELECT * FROM ");
        self.0.walk_ast(out.reborrow())
    }
}

impl<F> Query for RowsOf<F> {
    type SqlType = Untyped;
}

/// The error for a reply of `pgfence.<function>` that this crate does not know: an outcome or reason it never
/// gives, or a field missing that it always gives.
pub(crate) fn unexpected(function: &str, what: &str) -> Error {
    Error::Database {
        sqlstate: None,
        message: format!("unexpected result of pgfence.{function}: {what}"),
        source: None,
    }
}

/// The [`LossReason`] a reply of `pgfence.<function>` names (a renewal's or a write's `refused`, a release's
/// `not_held`).
pub(crate) fn loss_reason(function: &str, reason: Option<&str>) -> Result<LossReason> {
    reason
        .and_then(LossReason::from_sql)
        .ok_or_else(|| unexpected(function, &format!("reason {}", reason.unwrap_or("NULL"))))
}

/// Whether a `refused` reply's reason is a refusal of the role or of the presented secret (`no_grant`,
/// `bad_secret`: [`Error::Denied`]) rather than a loss of the tenure. Every SQL function answers a refusal with
/// the one outcome `refused`; the reason tells the two apart.
pub(crate) fn is_denial(reason: Option<&str>) -> bool {
    reason
        .and_then(LossReason::from_sql)
        .is_some_and(LossReason::is_denial)
}

/// The denial a `refused` reply of `pgfence.<function>` names: [`LossReason::NoGrant`] or
/// [`LossReason::BadSecret`], never another reason (what [`Error::Denied`] carries).
pub(crate) fn deny_reason(function: &str, reason: Option<&str>) -> Result<LossReason> {
    reason
        .and_then(LossReason::from_sql)
        .filter(|r| r.is_denial())
        .ok_or_else(|| {
            unexpected(
                function,
                &format!("denied for reason {}", reason.unwrap_or("NULL")),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reason the SQL functions give decodes to its own variant, and anything else — a text pgfence never
    /// writes, or none — is an error, not a default.
    #[test]
    fn reasons_decode_exactly_and_unknown_ones_are_errors() {
        for reason in [
            LossReason::Superseded,
            LossReason::Expired,
            LossReason::Released,
            LossReason::UnknownLease,
            LossReason::FutureEpoch,
            LossReason::HolderMismatch,
            LossReason::RowFence,
            LossReason::Failover,
        ] {
            assert_eq!(loss_reason("renew", Some(reason.as_str())).unwrap(), reason);
        }
        for reason in [LossReason::NoGrant, LossReason::BadSecret] {
            assert_eq!(
                loss_reason("renew_many", Some(reason.as_str())).unwrap(),
                reason
            );
            assert_eq!(deny_reason("fence", Some(reason.as_str())).unwrap(), reason);
            assert!(is_denial(Some(reason.as_str())));
        }
        assert!(!is_denial(Some("superseded")));
        assert!(!is_denial(Some("denied")));
        assert!(!is_denial(None));
        for (function, error) in [
            ("renew", loss_reason("renew", Some("eclipsed")).unwrap_err()),
            ("renew", loss_reason("renew", None).unwrap_err()),
            (
                "fence",
                deny_reason("fence", Some("superseded")).unwrap_err(),
            ),
            ("fence", deny_reason("fence", None).unwrap_err()),
            ("fence", deny_reason("fence", Some("denied")).unwrap_err()),
            (
                "heartbeat",
                loss_reason("heartbeat", Some("unknown_member")).unwrap_err(),
            ),
        ] {
            let text = error.to_string();
            assert!(
                text.contains(&format!("unexpected result of pgfence.{function}")),
                "{text}"
            );
        }
    }
}
