//! The elector's acquisitions: each one `pgfence.acquire_many` statement of one lease, which acquires it exactly as
//! `pgfence.acquire` would and answers in the same statement what the runtime reads first for a new tenure (its
//! effects in doubt, its handover gap): one statement per tenure start instead of three. A lease whose row or
//! guard lock another transaction holds answers busy (the statement waits for no lock), and is then acquired with
//! `pgfence.acquire` and its bounded waits.
//!
//! Not batched across names: a batch's leases start their ttl when each is acquired, but their holder learns of
//! them at its commit, and on a saturated server (100 replicas acquiring 10,000 names on 2 cores) batches of tens
//! of names ate enough of every ttl that thousands of new tenures expired before their first renewal (measured:
//! docs/leadership.md, "Fleets").

use std::time::Duration;

use super::super::held::FirstReads;
use crate::error::Result;
use crate::lease::Lease;
use crate::store::Store;

/// Acquires `name` for `holder`, with what the statement read for the tenure's start.
///
/// Not cancel safe, as [`Store::acquire`]: a dropped call may have begun a tenure nobody holds.
pub(super) async fn acquire(
    store: &Store,
    name: &str,
    holder: &str,
    ttl: Duration,
) -> Result<(Lease, FirstReads)> {
    let mut answers = store.acquire_many(&[name.to_owned()], holder, ttl).await?;
    match answers.pop().flatten() {
        Some(begun) => {
            let begun = begun?;
            let first = FirstReads {
                in_doubt: begun.in_doubt,
                gap: Some(begun.gap),
            };
            Ok((begun.lease, first))
        }
        // Busy: acquired alone, with acquire's bounded waits.
        None => Ok((
            store.acquire(name, holder, ttl).await?,
            FirstReads::default(),
        )),
    }
}
