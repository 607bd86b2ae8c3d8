//! The one error type of pgfence.
//!
//! Every failure source has its own variant with the context a caller or an operator needs (lease name,
//! epochs, SQLSTATE). Connection strings never appear in an error: targets are shown as
//! `user@host:port/database`.

use std::time::Duration;

use crate::connect::sqlstate::sqlstate_of;
use crate::sqlstate::SqlState;
use crate::types::{Epoch, LossReason, TaskState};

/// Result alias used throughout pgfence.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in pgfence.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument was refused; nothing was written. Usually before anything was sent; the database applies the
    /// same checks and refuses what reaches it (SQLSTATE `22023`, from SQL callers, or text whose Unicode is
    /// newer than the Rust-side check can judge alike), reported as this variant too.
    #[error("invalid {field}: {reason}")]
    InvalidInput {
        /// Which argument (`lease name`, `holder`, `ttl`, `epoch`, …).
        field: &'static str,
        /// Why it was refused.
        reason: String,
    },

    /// The connection string could not be parsed. The string itself is never repeated.
    #[error("invalid database URL: {reason}")]
    InvalidUrl {
        /// What is wrong with it.
        reason: String,
    },

    /// The database could not be reached or refused the connection.
    #[error("cannot connect to {target}: {cause}")]
    Connect {
        /// `user@host:port/database`, without credentials.
        target: String,
        /// The real cause as reported by the driver (e.g. "connection refused").
        cause: String,
    },

    /// TLS refused the connection: the server's certificate failed verification ("unknown issuer", "certificate
    /// not valid for name …"), the handshake failed, the server does not support the TLS that `sslmode`
    /// demands, or a certificate or key file could not be read. Not transient: retrying unchanged fails the same
    /// way.
    #[error("TLS connection to {target} refused: {cause}")]
    Tls {
        /// `user@host:port/database`, without credentials.
        target: String,
        /// The real cause, as rustls or the server reported it.
        cause: String,
    },

    /// No pooled connection became available in time.
    #[error("no database connection to {target} within {waited:?}{}", cause.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    PoolTimeout {
        /// `user@host:port/database`, without credentials.
        target: String,
        /// How long the checkout waited.
        waited: Duration,
        /// What the checkout waited for, when known: every connection of the pool checked out by other tasks
        /// for the whole wait, or the last connection error the pool saw (the real cause when the database
        /// cannot be reached).
        cause: Option<String>,
    },

    /// The server is a standby (`pg_is_in_recovery()`): pgfence only writes to a primary.
    #[error("{target} is a standby (in recovery); pgfence needs the primary")]
    NotPrimary {
        /// `user@host:port/database`, without credentials.
        target: String,
    },

    /// The server is not the database this store was configured to expect. Nothing was written.
    #[error("wrong database: expected {what} {expected}, found {actual}")]
    WrongDatabase {
        /// Which part of the identity differs (`system identifier`, `instance id`, `database`).
        what: &'static str,
        /// The configured value.
        expected: String,
        /// The value the server reported.
        actual: String,
    },

    /// The pgfence schema is not installed in this database (run `migrate`).
    #[error("the pgfence schema is missing or incomplete in this database: run `pgfence migrate` (or Store::migrate) first")]
    SchemaMissing,

    /// `acquire` found the lease held by another, unexpired tenure.
    #[error("lease {lease} is held by {holder} at epoch {epoch}, expiring in {expires_in:?} (database clock)")]
    Held {
        /// The cluster-qualified lease name.
        lease: String,
        /// The current holder.
        holder: String,
        /// The current epoch.
        epoch: Epoch,
        /// Time left on the current tenure, computed by the database.
        expires_in: Duration,
    },

    /// A renewal found the tenure no longer current.
    #[error("lease {lease} lost at epoch {epoch}: {reason} (current epoch {})", fmt_epoch(*current))]
    Lost {
        /// The cluster-qualified lease name.
        lease: String,
        /// The epoch that was being renewed.
        epoch: Epoch,
        /// Why it is no longer current.
        reason: LossReason,
        /// The lease's epoch now, if the lease exists.
        current: Option<Epoch>,
    },

    /// A write presented an epoch that is not the lease's current, held, unexpired epoch. The database refused
    /// it and recorded a row in `pgfence.rejections`.
    #[error("stale write refused on {lease}: presented epoch {presented}, current epoch {} ({reason}) during {operation}", fmt_epoch(*current))]
    Stale {
        /// The cluster-qualified lease name.
        lease: String,
        /// The epoch the write presented.
        presented: Epoch,
        /// The lease's current epoch (or the row's fence for [`LossReason::RowFence`]).
        current: Option<Epoch>,
        /// Why the presented epoch is stale.
        reason: LossReason,
        /// The refused operation (`claim_task`, `fenced_transaction`, …).
        operation: String,
    },

    /// The database refused the call because of who made it: the session's role has no grant on the lease's
    /// cluster, or the fence did not carry its tenure's secret. Recorded in `pgfence.rejections` (under the
    /// session's role); nothing else was written.
    #[error("{operation} on {lease} denied: {}", denial_text(*reason))]
    Denied {
        /// The cluster-qualified lease name (or group name, for `join_group`).
        lease: String,
        /// The refused operation (`acquire`, `renew`, `release`, `force_release`, `claim_task`, `join_group`, …).
        operation: String,
        /// Why: always [`LossReason::NoGrant`] or [`LossReason::BadSecret`].
        reason: LossReason,
    },

    /// `join_group` found a live member of that name in the group (another process using the same member name,
    /// or this process's previous incarnation that has not expired yet): the same name never counts twice.
    /// Nothing was written. Join again after `expires_in`.
    #[error("member {member} of group {group} is live in another process, expiring in {expires_in:?} (database clock)")]
    MemberTaken {
        /// The cluster-qualified group name.
        group: String,
        /// The member name.
        member: String,
        /// Time left on the live member, computed by the database.
        expires_in: Duration,
    },

    /// A heartbeat or leave found the membership no longer counted (expired, left, superseded, a wrong secret
    /// — audited —, or no grant).
    #[error("membership of {member} in group {group} lost: {}", member_loss_text(*reason))]
    MemberLost {
        /// The cluster-qualified group name.
        group: String,
        /// The member name.
        member: String,
        /// Why: one of [`LossReason::UnknownMember`], [`Superseded`](LossReason::Superseded) (a later incarnation
        /// joined), [`BadSecret`](LossReason::BadSecret), [`Left`](LossReason::Left),
        /// [`Expired`](LossReason::Expired) and [`NoGrant`](LossReason::NoGrant).
        reason: LossReason,
    },

    /// The task does not exist under this lease.
    #[error("task {key} not found under lease {lease}")]
    TaskNotFound {
        /// The cluster-qualified lease name.
        lease: String,
        /// The task's stable key.
        key: String,
    },

    /// A business guard failed: the task is not in the state the write requires. This is not a fencing
    /// rejection and is not audited.
    #[error("task {key} under {lease} is {actual}, expected {expected}")]
    Conflict {
        /// The cluster-qualified lease name.
        lease: String,
        /// The task's stable key.
        key: String,
        /// The state the write required.
        expected: TaskState,
        /// The state the task is in.
        actual: TaskState,
    },

    /// The task has an effect in doubt — an intent of an ended tenure without an outcome, or an outcome that is
    /// unknown — so it may not move on, and no new effect of it is recorded, until that effect is settled
    /// ([`Effects::settle`](crate::effects::Effects::settle), after asking the external system by its key).
    /// Nothing was written; not audited.
    #[error("task {task_key} under {lease} has effect {effect_key} in doubt (recorded by epoch {epoch}): settle it first")]
    InDoubt {
        /// The cluster-qualified lease name.
        lease: String,
        /// The task's key.
        task_key: String,
        /// The effect key in doubt.
        effect_key: String,
        /// The tenure that recorded its intent.
        epoch: Epoch,
    },

    /// An effect ledger write that does not apply to the effect as it stands (settled already, not in doubt, in
    /// flight, done, …). Nothing was written; not audited.
    #[error("effect {effect_key} under {lease}: {reason}")]
    EffectConflict {
        /// The cluster-qualified lease name.
        lease: String,
        /// The effect key.
        effect_key: String,
        /// Why.
        reason: EffectConflict,
    },

    /// No effect of that key was ever recorded under the lease.
    #[error("effect {effect_key} not found under lease {lease}")]
    EffectNotFound {
        /// The cluster-qualified lease name.
        lease: String,
        /// The effect key.
        effect_key: String,
    },

    /// Applying the embedded migrations failed.
    #[error("migration failed: {reason}")]
    Migration {
        /// What failed (the migration's version and the server's message).
        reason: String,
        /// The migration harness's or driver's error, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },

    /// Any other database error, with the server's SQLSTATE as it sent it: PostgreSQL's codes (`40P01`, `55P03`,
    /// `42501`, …) and pgfence's own (`PF001`–`PF006`, `22023` for a refused argument), whatever the language of
    /// the server's messages. On connections pgfence opened the code is read off the wire
    /// ([`WireStream`](crate::connection::WireStream)); on a store built from an application's pool
    /// ([`Store::from_pool`](crate::Store::from_pool)) only the classes diesel names itself (serialization
    /// failure, unique/foreign-key/not-null/check/exclusion violation, read-only transaction, lost connection)
    /// carry one. The message is the server's (in its `lc_messages` language) or the driver's.
    #[error("database error{}: {message}", sqlstate.as_ref().map(|s| format!(" [{s}]")).unwrap_or_default())]
    Database {
        /// The SQLSTATE, if known.
        sqlstate: Option<SqlState>,
        /// The server's or driver's message.
        message: String,
        /// The driver's error, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
}

/// Why a ledger write did not apply to the effect as it stands ([`Error::EffectConflict`]; also [`pgfence::effects::EffectConflict`](crate::effects::EffectConflict)): nothing was
/// written, and nothing audited (the tenure may write; the effect is elsewhere).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EffectConflict {
    /// The key's effect is done or confirmed: it is not attempted again.
    Done,
    /// An intent of this tenure under the key is in flight with another intent.
    IntentDiffers,
    /// The key belongs to another task.
    OtherTask,
    /// The attempt is settled already, by this epoch.
    Settled {
        /// The tenure that settled it.
        by: Option<Epoch>,
    },
    /// The attempt has a final outcome: nothing to settle.
    NotInDoubt,
    /// The attempt's tenure is the current one and has not reported its outcome: not in doubt yet.
    InFlight,
    /// An outcome for an attempt another tenure recorded (settle it instead).
    NotThisTenure,
    /// Another final outcome is recorded for the attempt.
    OutcomeRecorded,
}

impl EffectConflict {
    pub(crate) fn from_sql(reason: &str, settled_by: Option<Epoch>) -> Option<EffectConflict> {
        Some(match reason {
            "done" => EffectConflict::Done,
            "intent_differs" => EffectConflict::IntentDiffers,
            "other_task" => EffectConflict::OtherTask,
            "settled" => EffectConflict::Settled { by: settled_by },
            "not_in_doubt" => EffectConflict::NotInDoubt,
            "in_flight" => EffectConflict::InFlight,
            "not_this_tenure" => EffectConflict::NotThisTenure,
            "outcome_recorded" => EffectConflict::OutcomeRecorded,
            _ => return None,
        })
    }
}

impl std::fmt::Display for EffectConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EffectConflict::Done => f.write_str("its effect is done already"),
            EffectConflict::IntentDiffers => {
                f.write_str("an intent of this tenure with another intent is in flight")
            }
            EffectConflict::OtherTask => f.write_str("the key belongs to another task"),
            EffectConflict::Settled { by: Some(epoch) } => {
                write!(f, "settled already by epoch {epoch}")
            }
            EffectConflict::Settled { by: None } => f.write_str("settled already"),
            EffectConflict::NotInDoubt => f.write_str("it has a final outcome: not in doubt"),
            EffectConflict::InFlight => f.write_str(
                "its tenure is the current one and has not reported: in flight, not in doubt",
            ),
            EffectConflict::NotThisTenure => {
                f.write_str("its last attempt is another tenure's: settle it instead")
            }
            EffectConflict::OutcomeRecorded => f.write_str("another outcome is recorded"),
        }
    }
}

/// A denial's reason with what it means, as [`Error::Denied`] and the log say it.
pub(crate) fn denial_text(reason: LossReason) -> String {
    let means = match reason {
        LossReason::NoGrant => "the session's role has no grant on the lease's cluster",
        LossReason::BadSecret => "the fence does not carry its tenure's secret",
        _ => return reason.to_string(),
    };
    format!("{reason} ({means})")
}

/// A membership's loss, as [`Error::MemberLost`] and a membership's end say it.
pub(crate) fn member_loss_text(reason: LossReason) -> &'static str {
    match reason {
        LossReason::UnknownMember => "unknown member",
        LossReason::Superseded => "superseded by a later incarnation",
        LossReason::BadSecret => "wrong secret",
        LossReason::NoGrant => "no grant on the group's cluster",
        other => other.as_str(),
    }
}

fn fmt_epoch(epoch: Option<Epoch>) -> String {
    epoch.map_or_else(|| "none".to_owned(), |e| e.to_string())
}

impl Error {
    /// True for errors worth retrying unchanged: serialization failures and deadlocks (SQLSTATE 40001, 40P01),
    /// connection trouble and pool timeouts. Fencing outcomes (`Held`, `Lost`, `Stale`) are definitive.
    ///
    /// A connection lost while a write was in flight leaves its outcome unknown: the server may have committed
    /// it. Retry blindly only what is idempotent (`create_task` by key, `release`); for the rest, read back
    /// first (for instance the task's events) or make the write idempotent by key.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Connect { .. } | Error::PoolTimeout { .. } => true,
            Error::Database { sqlstate, .. } => sqlstate.is_some_and(|s| s.is_retryable()),
            _ => false,
        }
    }

    /// The SQLSTATE of a database error, if any; for a [`Error::Migration`] refused by the database's rules
    /// (`42501`: the schema is not the migrating role's, or it may not execute what pgfence needs), the
    /// SQLSTATE of that refusal.
    pub fn sqlstate(&self) -> Option<SqlState> {
        match self {
            Error::Database { sqlstate, .. } => *sqlstate,
            Error::Migration {
                source: Some(source),
                ..
            } => source.downcast_ref::<Error>().and_then(Error::sqlstate),
            _ => None,
        }
    }

    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            field,
            reason: reason.into(),
        }
    }
}

impl From<diesel::result::Error> for Error {
    fn from(err: diesel::result::Error) -> Self {
        use diesel::result::Error as D;
        let (sqlstate, message) = match &err {
            D::DatabaseError(_, info) => (diesel_sqlstate(&err), info.message().to_owned()),
            other => (None, other.to_string()),
        };
        // A missing pgfence object means the schema was never migrated (or only partly): an undefined schema,
        // table, function or type, named in the pgfence schema (a name is the same in every language; a user's
        // `pgfence_app.x` is not pgfence's). pgfence's own messages (`pgfence: role … does not exist`, 42704
        // from grant and revoke) are about the caller's argument, not the schema.
        let missing = [
            SqlState::InvalidSchemaName,
            SqlState::UndefinedTable,
            SqlState::UndefinedFunction,
            SqlState::UndefinedObject,
        ];
        if sqlstate.is_some_and(|c| missing.contains(&c))
            && names_pgfence(&message)
            && !message.starts_with("pgfence: ")
        {
            return Error::SchemaMissing;
        }
        // pgfence's own check of an argument (SQLSTATE 22023, raised before anything is written, the argument
        // named in the error's COLUMN field): the same refusal as the Rust-side check, which leaves some text to
        // it (Unicode newer than the database's tables).
        if sqlstate == Some(SqlState::InvalidParameterValue) {
            if let D::DatabaseError(_, info) = &err {
                if let Some(refused) = argument_refused(info.column_name(), &message) {
                    return refused;
                }
            }
        }
        Error::Database {
            sqlstate,
            message,
            source: Some(Box::new(err)),
        }
    }
}

/// Every argument name pgfence's SQL functions put in the COLUMN field of a 22023 refusal (the Rust API's field
/// names); `tests/sqlstate.rs` checks that each refusal the SQL can raise names one of them.
pub(crate) const REFUSED_ARGUMENTS: [&str; 41] = [
    "lease",
    "epoch",
    "secret",
    "ttl",
    "leases",
    "grace",
    "holder",
    "cluster",
    "role",
    "operation",
    "target table",
    "target key",
    "task key",
    "effect key",
    "assignee",
    "event kind",
    "endpoint",
    "payload",
    "state",
    "outcome",
    "resolution",
    "detail",
    "mode",
    "age or batch",
    "group",
    "member",
    "incarnation",
    "weight",
    "names",
    "name",
    "pin",
    "pins",
    "exclusion",
    "exclusions",
    "belief event",
    "belief time",
    "belief cause",
    "belief detail",
    "version",
    "generation",
    "assignment",
];

/// The [`Error::InvalidInput`] for the database's check of an argument: the argument is the one the error's
/// COLUMN field names (one of [`REFUSED_ARGUMENTS`]), the reason the message after `pgfence: invalid
/// <argument>: ` (the whole message when it is worded otherwise); `None` when COLUMN names no argument, and
/// the refusal stays [`Error::Database`].
fn argument_refused(column: Option<&str>, message: &str) -> Option<Error> {
    let field = REFUSED_ARGUMENTS
        .iter()
        .copied()
        .find(|&f| Some(f) == column)?;
    let reason = message
        .strip_prefix("pgfence: invalid ")
        .and_then(|rest| rest.strip_prefix(field))
        .and_then(|rest| rest.strip_prefix(": "))
        .or_else(|| message.strip_prefix("pgfence: "))
        .unwrap_or(message);
    Some(Error::invalid(field, reason))
}

/// Whether a message names the pgfence schema or one of its objects: the identifier `pgfence` standing alone
/// (`pgfence.acquire`, `»pgfence«`, `"pgfence"`), not as part of another name (`pgfence_app`). Identifiers are
/// not translated; the quotes around them are.
fn names_pgfence(message: &str) -> bool {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_' || c == '$';
    message.match_indices("pgfence").any(|(at, word)| {
        let before = message[..at].chars().next_back();
        let after = message[at + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// The SQLSTATEs diesel keeps as a kind of its own (the server's code mapped by diesel-async): for stores built
/// from an application's pool, whose connections pgfence did not open.
fn kind_sqlstate(kind: &diesel::result::DatabaseErrorKind) -> Option<SqlState> {
    use diesel::result::DatabaseErrorKind as K;
    match kind {
        K::SerializationFailure => Some(SqlState::SerializationFailure),
        K::UniqueViolation => Some(SqlState::UniqueViolation),
        K::ForeignKeyViolation => Some(SqlState::ForeignKeyViolation),
        K::NotNullViolation => Some(SqlState::NotNullViolation),
        K::CheckViolation => Some(SqlState::CheckViolation),
        K::ExclusionViolation => Some(SqlState::ExclusionViolation),
        K::RestrictViolation => Some(SqlState::RestrictViolation),
        K::ReadOnlyTransaction => Some(SqlState::ReadOnlySqlTransaction),
        K::ClosedConnection | K::UnableToSendCommand => Some(SqlState::ConnectionFailure),
        _ => None,
    }
}

/// Whether a statement's error means its session is over: the server terminated it or is shutting down (57P0x),
/// ended it for idling in a transaction (25P03), or the connection broke (08xxx). Such a connection must not go
/// back to the pool: the driver may not have noticed the closed socket yet, and the next statement — a retry,
/// typically — would be handed the same dead session.
pub(crate) fn ends_the_session(err: &diesel::result::Error) -> bool {
    diesel_sqlstate(err).is_some_and(|c| c.ends_the_session())
}

/// The SQLSTATE of a database error: read off the wire (any server language), else from diesel's coarse kind.
pub(crate) fn diesel_sqlstate(err: &diesel::result::Error) -> Option<SqlState> {
    let diesel::result::Error::DatabaseError(kind, info) = err else {
        return None;
    };
    sqlstate_of(info.message(), info.details(), info.hint()).or_else(|| kind_sqlstate(kind))
}

/// An error with its sources, each once ("error connecting to server: Connection refused (os error 111)"):
/// drivers keep the cause of an error in its [`source`](std::error::Error::source), out of its `Display`.
///
/// ```
/// let err = std::io::Error::other("connection refused");
/// assert_eq!(pgfence::connection::error_chain(&err), "connection refused");
/// ```
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal names its argument in COLUMN and becomes InvalidInput for that field, its reason the message
    /// after the field; a COLUMN that names no argument (or none at all) leaves it a database error.
    #[test]
    fn argument_refusals_name_their_field() {
        for (column, message, reason) in [
            (
                "lease",
                "pgfence: invalid lease: must be cluster-qualified",
                "must be cluster-qualified",
            ),
            (
                "belief detail",
                "pgfence: invalid belief detail: longer than 64 bytes",
                "longer than 64 bytes",
            ),
            (
                "ttl",
                "pgfence: ttl must be between 1000 ms and 24 h, got 5 ms",
                "ttl must be between 1000 ms and 24 h, got 5 ms",
            ),
        ] {
            match argument_refused(Some(column), message) {
                Some(Error::InvalidInput { field, reason: r }) => {
                    assert_eq!((field, r.as_str()), (column, reason), "{message}");
                }
                other => panic!("{message}: {other:?}"),
            }
        }
        for column in [None, Some(""), Some("belief"), Some("Lease")] {
            assert!(
                argument_refused(column, "pgfence: invalid lease: x").is_none(),
                "{column:?}"
            );
        }
    }

    /// Every argument the migrations can name in a 22023 refusal's COLUMN — a `COLUMN = '…'` literal, an
    /// `invalid <argument>:` problem text, an argument name handed to the shared text checks, an element kind of a
    /// list — is one of [`REFUSED_ARGUMENTS`], so each becomes [`Error::InvalidInput`] for its field.
    #[test]
    fn every_argument_the_sql_names_is_a_refused_argument() {
        let patterns = [
            r"COLUMN = '([a-z ]+)'",
            r"'(?:pgfence: )?invalid ([a-z]+(?: [a-z]+)*)(?: %s of %s)?: ",
            r"_(?:arg_problem|check_text)\('([a-z ]+)'::text",
            r"'([a-z ]+)'::text,[ \n]*p_[a-z_]+,[ \n]*pgfence\._max_",
            r"\('([a-z]+)', p_(?:names|pinned|excluded)\)",
            r"\('([a-z]+)', CASE WHEN p_known THEN",
        ];
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut named = std::collections::BTreeSet::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let Ok(sql) = std::fs::read_to_string(entry.unwrap().path().join("up.sql")) else {
                continue;
            };
            for pattern in patterns {
                let pattern = regex::Regex::new(pattern).unwrap();
                for found in pattern.captures_iter(&sql) {
                    named.insert(found[1].to_owned());
                }
            }
        }
        for expected in [
            "lease",
            "epoch",
            "ttl",
            "names",
            "name",
            "exclusion",
            "assignee",
        ] {
            assert!(
                named.contains(expected),
                "the scan misses {expected}: {named:?}"
            );
        }
        let unknown: Vec<&String> = named
            .iter()
            .filter(|n| !REFUSED_ARGUMENTS.contains(&n.as_str()))
            .collect();
        assert!(
            unknown.is_empty(),
            "named by the SQL, unknown to REFUSED_ARGUMENTS: {unknown:?}"
        );
    }
}
