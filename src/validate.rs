//! Input checks, applied before anything is sent (the database applies the same rules again): the one text rule
//! for names and identities, and the fallible constructors of the shared value types.

use std::str::FromStr;

use crate::error::{Error, Result};
use crate::types::{Epoch, TaskState, MAX_CLUSTER_LEN, MAX_HOLDER_LEN, MAX_NAME_LEN};

impl Epoch {
    /// An epoch from its number; epochs start at 1.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a number below 1.
    pub fn new(value: i64) -> Result<Epoch> {
        if value < 1 {
            return Err(Error::invalid(
                "epoch",
                format!("must be >= 1, got {value}"),
            ));
        }
        Ok(Epoch(value))
    }
}

impl TryFrom<i64> for Epoch {
    type Error = Error;
    fn try_from(value: i64) -> Result<Epoch> {
        Epoch::new(value)
    }
}

/// The one text rule, as the database applies it (`pgfence._text_problem`): 1 to `max` characters, no control
/// character, Unicode Normalization Form C.
pub(crate) fn check_text(field: &'static str, value: &str, max: usize) -> Result<()> {
    let len = value.chars().count();
    if len == 0 {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if len > max {
        return Err(Error::invalid(
            field,
            format!("must be at most {max} characters, got {len}"),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::invalid(
            field,
            "must not contain control characters (NUL, newline, …)",
        ));
    }
    if !unicode_normalization::is_nfc(value) {
        return Err(Error::invalid(
            field,
            "must be in Unicode Normalization Form C (NFC)",
        ));
    }
    Ok(())
}

/// Checks a cluster name: 1 to 63 characters, no `/` (it separates cluster and lease name), no control
/// characters.
pub(crate) fn validate_cluster(cluster: &str) -> Result<()> {
    check_text("cluster", cluster, MAX_CLUSTER_LEN)?;
    if cluster.contains('/') {
        return Err(Error::invalid("cluster", "must not contain '/'"));
    }
    Ok(())
}

/// Checks a lease name (without cluster): 1 to 200 characters, no control characters. Quotes, `/` and SQL are
/// plain data.
pub(crate) fn validate_name(name: &str) -> Result<()> {
    check_text("lease name", name, MAX_NAME_LEN)
}

/// Checks a holder, assignee or similar identity: 1 to 256 characters, no control characters.
pub(crate) fn validate_holder(field: &'static str, holder: &str) -> Result<()> {
    check_text(field, holder, MAX_HOLDER_LEN)
}

/// Checks a cluster-qualified lease name (`<cluster>/<name>`).
pub(crate) fn validate_qualified(qualified: &str) -> Result<()> {
    match qualified.split_once('/') {
        Some((cluster, name)) => {
            validate_cluster(cluster)?;
            validate_name(name)
        }
        None => Err(Error::invalid(
            "lease",
            "must be cluster-qualified: '<cluster>/<name>'",
        )),
    }
}

impl FromStr for TaskState {
    type Err = Error;
    fn from_str(s: &str) -> Result<TaskState> {
        Ok(match s {
            "pending" => TaskState::Pending,
            "claimed" => TaskState::Claimed,
            "running" => TaskState::Running,
            "succeeded" => TaskState::Succeeded,
            "failed" => TaskState::Failed,
            "cancelled" => TaskState::Cancelled,
            other => {
                return Err(Error::invalid(
                    "task state",
                    format!("unknown state {other:?}"),
                ))
            }
        })
    }
}
