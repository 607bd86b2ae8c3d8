//! SQLSTATEs as a type: [`SqlState`] names the codes pgfence tells apart — PostgreSQL's that it retries, maps or
//! reports, and its own `PF00x`, which its SQL functions raise (`USING ERRCODE`) — and keeps every other code
//! as it came ([`SqlState::Other`]). [`Error::sqlstate`](crate::Error::sqlstate) gives one:
//!
//! ```
//! use pgfence::sqlstate::SqlState;
//! # fn example(error: &pgfence::Error) {
//! match error.sqlstate() {
//!     // A bounded lock wait of pgfence ended; the message names the sessions that held the lock.
//!     Some(SqlState::LockWaitEnded) => {}
//!     Some(code) if code.is_retryable() => {}
//!     _ => {}
//! }
//! # }
//! assert_eq!(SqlState::from_code("40P01"), SqlState::DeadlockDetected);
//! assert_eq!(SqlState::from_code("PF003").code(), "PF003");
//! assert_eq!(SqlState::from_code("0A000").code(), "0A000");
//! ```

use std::fmt;

macro_rules! sqlstates {
    ($($(#[$doc:meta])* $name:ident = $code:literal,)*) => {
        /// A SQLSTATE: one of the codes pgfence tells apart by name, or [`SqlState::Other`] for any other.
        ///
        /// [`SqlState::from_code`] gives the named variant for its code, so two values are equal exactly when
        /// their codes are.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum SqlState {
            $($(#[$doc])* $name,)*
            /// Any other code, as the server sent it (five characters of `0`–`9` and `A`–`Z`).
            Other(Code),
        }

        impl SqlState {
            /// Every named code, in the order of the enum (for tests and tables).
            pub const NAMED: &'static [SqlState] = &[$(SqlState::$name,)*];

            /// The five-character code.
            pub fn code(&self) -> &str {
                match self {
                    $(SqlState::$name => $code,)*
                    SqlState::Other(code) => code.as_str(),
                }
            }

            /// The SQLSTATE of `code`: its named variant, else [`SqlState::Other`]; `None` when `code` is not
            /// five characters of `0`–`9` and `A`–`Z`.
            pub fn parse(code: &str) -> Option<SqlState> {
                Some(match code {
                    $($code => SqlState::$name,)*
                    other => SqlState::Other(Code::new(other)?),
                })
            }
        }
    };
}

sqlstates! {
    /// `PF001`: a raw write to a guarded table refused by enforcement (its fence is stale or missing); the
    /// statement's transaction aborts.
    RawWriteRefused = "PF001",
    /// `PF002`: a change to an append-only pgfence table (an event, a tenure record), `TRUNCATE` included.
    AppendOnly = "PF002",
    /// `PF003`: a bounded lock wait of pgfence ended (a takeover, a guard, the migration lock); the message
    /// names the sessions that held the lock. Transient.
    LockWaitEnded = "PF003",
    /// `PF004`: a guarded write outside READ COMMITTED, refused before anything was written (it can run again in
    /// a READ COMMITTED transaction).
    NotReadCommitted = "PF004",
    /// `PF005`: a refused change of a lease row (a delete, a truncate, a lower epoch), also for the schema owner.
    LeaseRowChangeRefused = "PF005",
    /// `PF006`: a one-statement guarded write that mentions the guard without being gated on it, while the guard
    /// refused: the statement fails as a whole.
    UngatedWrite = "PF006",
    /// `40001` serialization_failure. Transient.
    SerializationFailure = "40001",
    /// `40P01` deadlock_detected. Transient.
    DeadlockDetected = "40P01",
    /// `55P03` lock_not_available: a lock wait ran out of `lock_timeout`. Transient.
    LockNotAvailable = "55P03",
    /// `57014` query_canceled: a statement timeout or a cancel request.
    QueryCanceled = "57014",
    /// `57P01` admin_shutdown: the server terminated the session or is shutting down. Transient.
    AdminShutdown = "57P01",
    /// `57P02` crash_shutdown. Transient.
    CrashShutdown = "57P02",
    /// `57P03` cannot_connect_now: the server is starting or stopping. Transient.
    CannotConnectNow = "57P03",
    /// `08006` connection_failure: also what a connection diesel found closed is reported as. Transient, as is
    /// every code of class `08` ([`SqlState::is_connection_exception`]).
    ConnectionFailure = "08006",
    /// `25P03` idle_in_transaction_session_timeout: the server ended a session idle in a transaction.
    IdleInTransactionSessionTimeout = "25P03",
    /// `22023` invalid_parameter_value: pgfence's SQL functions refusing an argument.
    InvalidParameterValue = "22023",
    /// `42501` insufficient_privilege: a missing grant, or a migration refused by pgfence's layout checks.
    InsufficientPrivilege = "42501",
    /// `3F000` invalid_schema_name: with a message naming pgfence, the schema is not installed.
    InvalidSchemaName = "3F000",
    /// `42P01` undefined_table: with a message naming pgfence, the schema is not (fully) installed.
    UndefinedTable = "42P01",
    /// `42883` undefined_function: with a message naming pgfence, the schema is not (fully) installed; for
    /// `pgfence_native.fence`, the native guard went missing.
    UndefinedFunction = "42883",
    /// `42704` undefined_object: with a message naming pgfence, the schema is not (fully) installed; from grant
    /// and revoke, the role named does not exist.
    UndefinedObject = "42704",
    /// `23505` unique_violation.
    UniqueViolation = "23505",
    /// `23503` foreign_key_violation.
    ForeignKeyViolation = "23503",
    /// `23502` not_null_violation.
    NotNullViolation = "23502",
    /// `23514` check_violation.
    CheckViolation = "23514",
    /// `23P01` exclusion_violation.
    ExclusionViolation = "23P01",
    /// `23001` restrict_violation.
    RestrictViolation = "23001",
    /// `25006` read_only_sql_transaction.
    ReadOnlySqlTransaction = "25006",
}

impl SqlState {
    /// The SQLSTATE of `code`, which the caller knows to be well formed (the server's, or a literal).
    ///
    /// # Panics
    /// When `code` is not five characters of `0`–`9` and `A`–`Z`; use [`SqlState::parse`] for text from
    /// elsewhere.
    pub fn from_code(code: &str) -> SqlState {
        SqlState::parse(code).unwrap_or_else(|| panic!("not a SQLSTATE: {code:?}"))
    }

    /// Whether the code is of class `08`, connection exception.
    pub fn is_connection_exception(&self) -> bool {
        self.code().starts_with("08")
    }

    /// Whether a retry of the same transaction can clear the condition: serialization failure, deadlock, a lock
    /// wait that timed out (`55P03`, and pgfence's `PF003` that names the blockers), the server ending or
    /// refusing sessions (`57P01`–`57P03`) and every connection exception (class `08`).
    ///
    /// ```
    /// use pgfence::sqlstate::SqlState;
    /// assert!(SqlState::SerializationFailure.is_retryable());
    /// assert!(SqlState::from_code("08001").is_retryable());
    /// assert!(!SqlState::InsufficientPrivilege.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            SqlState::SerializationFailure
                | SqlState::DeadlockDetected
                | SqlState::LockNotAvailable
                | SqlState::AdminShutdown
                | SqlState::CrashShutdown
                | SqlState::CannotConnectNow
                | SqlState::LockWaitEnded
        ) || self.is_connection_exception()
    }

    /// Whether the error means its session is over: the server terminated it or is shutting down (`57P0x`),
    /// ended it for idling in a transaction (`25P03`), or the connection broke (class `08`).
    pub(crate) fn ends_the_session(&self) -> bool {
        self.is_connection_exception()
            || self.code().starts_with("57P")
            || *self == SqlState::IdleInTransactionSessionTimeout
    }
}

impl fmt::Display for SqlState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// A SQLSTATE that pgfence does not name ([`SqlState::Other`]): five characters of `0`–`9` and `A`–`Z`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Code([u8; 5]);

impl Code {
    fn new(code: &str) -> Option<Code> {
        let bytes: [u8; 5] = code.as_bytes().try_into().ok()?;
        bytes
            .iter()
            .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
            .then_some(Code(bytes))
    }

    /// The code as text.
    pub fn as_str(&self) -> &str {
        // Only ASCII digits and capitals are ever stored.
        std::str::from_utf8(&self.0).unwrap_or("?????")
    }
}

impl fmt::Debug for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every named code reads back as its variant, no two variants share a code, and no named code reads back as
    /// `Other` — so a value's equality is its code's.
    #[test]
    fn every_code_reads_back_as_one_variant() {
        let mut seen = std::collections::BTreeSet::new();
        for state in SqlState::NAMED {
            assert!(seen.insert(state.code().to_owned()), "{state:?} twice");
            assert_eq!(SqlState::parse(state.code()), Some(*state));
            assert!(!matches!(state, SqlState::Other(_)));
        }
        assert_eq!(
            SqlState::parse("0A000").map(|s| s.to_string()),
            Some("0A000".into())
        );
        for bad in ["", "4000", "400011", "4000a", "40 01", "4000\u{e9}"] {
            assert_eq!(SqlState::parse(bad), None, "{bad:?}");
        }
    }

    /// The retryable codes are exactly the documented ones.
    #[test]
    fn retryable_codes_are_the_documented_ones() {
        let retryable: Vec<&str> = SqlState::NAMED
            .iter()
            .filter(|s| s.is_retryable())
            .map(|s| s.code())
            .collect();
        assert_eq!(
            retryable,
            ["PF003", "40001", "40P01", "55P03", "57P01", "57P02", "57P03", "08006"]
        );
        assert!(SqlState::from_code("08P01").is_retryable());
        assert!(!SqlState::from_code("57014").is_retryable());
        assert!(SqlState::from_code("25P03").ends_the_session());
        assert!(SqlState::from_code("57P04").ends_the_session());
        assert!(!SqlState::from_code("40001").ends_the_session());
    }
}
