//! Input checks, applied before anything is sent (the database applies the same rules again): the one text rule
//! for names and identities, and the fallible constructors of the shared value types.

use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::limits::{MAX_CLUSTER_LEN, MAX_HOLDER_LEN, MAX_NAME_LEN, MAX_TTL, MIN_TTL};
use crate::types::{Epoch, TaskState};

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
///
/// NFC is judged with this build's Unicode tables and the database's own, which may be older (PostgreSQL 13 and
/// 14 have Unicode 13.0, 15 has 14.0, 16 has 15.0). For text of characters assigned by Unicode 13.0 the two
/// agree (Unicode's stability policy: an assigned character's combining class and decomposition never change).
/// A newer character is judged here as Unicode 13.0 tables judge it — unassigned, neither reordering nor
/// composing with its neighbours — so the text between such characters is checked on its own. Whatever is refused here,
/// every database refuses too: refusing more could refuse a name that the database stores, which no Rust client
/// could then address. The database refuses what its own, newer, tables call not NFC.
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
    if !value.split(is_unsettled).all(unicode_normalization::is_nfc) {
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

/// `ttl` in whole milliseconds, as the SQL functions take it, once it is within
/// [`MIN_TTL`]..=[`MAX_TTL`].
pub(crate) fn ttl_ms(ttl: Duration) -> Result<i64> {
    if ttl < MIN_TTL || ttl > MAX_TTL {
        return Err(Error::invalid(
            "ttl",
            format!("must be between {MIN_TTL:?} and {MAX_TTL:?}, got {ttl:?}"),
        ));
    }
    Ok(ttl.as_millis() as i64)
}

mod assigned;

/// Whether Unicode 13.0 tables — the oldest a supported database judges NFC with (PostgreSQL 14, the oldest
/// supported version (docs/compatibility.md), has them, as 13, the first with `IS NFC NORMALIZED`, had) — know
/// the character. One they do not know is, to them, unassigned: a starter that
/// neither reorders nor composes with its neighbours. A later version may give it a part in normalization
/// (U+10D69, Garay, Unicode 16.0, has combining class 230), so NFC verdicts on text around it can differ
/// between versions; on text of known characters they cannot (Unicode's stability policy).
fn is_unsettled(c: char) -> bool {
    let c = u32::from(c);
    assigned::ASSIGNED_BY_UNICODE_13
        .binary_search_by(|&(first, last)| {
            if last < c {
                std::cmp::Ordering::Less
            } else if first > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_err()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unicode_13_table_is_sorted_and_spot_on() {
        let table = assigned::ASSIGNED_BY_UNICODE_13;
        assert!(table.iter().all(|&(first, last)| first <= last));
        assert!(
            table.windows(2).all(|w| w[0].1 + 1 < w[1].0),
            "sorted, disjoint, merged"
        );
        // Unicode 1.1, 13.0 (U+1ABF, U+1AC0 combining marks), 14.0, 16.0 and never assigned (U+0378).
        for (c, known) in [
            ('a', true),
            ('\u{301}', true),
            ('\u{1ac0}', true),
            ('\u{1ac1}', false),
            ('\u{10d69}', false),
            ('\u{378}', false),
            ('\u{e0080}', false),
        ] {
            assert_eq!(!is_unsettled(c), known, "U+{:04X}", u32::from(c));
        }
    }

    /// A character newer than Unicode 13.0 before a combining mark: not NFC by this build's tables (U+10D69 has
    /// combining class 230, U+1CD4 class 1), NFC by PostgreSQL 15's (Unicode 14.0, U+10D69 unassigned), so
    /// accepted here and left to the database; the text around it is still judged.
    #[test]
    fn text_with_an_unsettled_character_is_left_to_the_database() {
        let unsettled = "\u{10d69}\u{1cd4}";
        assert!(!unicode_normalization::is_nfc(unsettled));
        assert!(check_text("holder", unsettled, 256).is_ok());
        assert!(check_text("holder", "\u{1ac1}\u{1cd4}", 256).is_ok());
        // Settled text around it is still judged: U+0301 (class 230) before U+1CD4 (class 1) is out of order
        // whatever the version, as is a composable pair.
        assert!(check_text("holder", "\u{301}\u{1cd4}\u{113c2}", 256).is_err());
        assert!(check_text("holder", "\u{10d69}e\u{301}", 256).is_err());
        assert!(check_text("holder", "e\u{301}", 256).is_err());
        assert!(check_text("holder", "a\u{10d69}\u{301}", 256).is_ok());
    }
}
