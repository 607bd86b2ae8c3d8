//! Guarded writes: the [`Fence`] a write presents ([`Lease::fence`]); the statement that carries a write and
//! its guard together (`write`), the guard's verdict (`outcome`), and the guarded writes themselves
//! ([`Store::fenced`], [`Store::guarded_write`], in `guard`).
//!
//! The guard runs in the database, in the same statement as the write (or as the first statement of the
//! caller's transaction): it takes the lease's *guard lock* (a transaction-level advisory lock) shared, then
//! reads the lease row in a fresh snapshot and compares the presented epoch with the current, held, unexpired
//! one granted on the current WAL timeline. Every change of who may write (acquire, release, force-release, and
//! a direct UPDATE of the row through a trigger) takes the guard lock exclusive, so a takeover waits for guarded
//! writes already past their check, and a guarded write arriving during a takeover waits and then reads the new
//! epoch. PostgreSQL queues lock requests fairly, so writes that start after a takeover began never hold it off,
//! and a takeover waits for a stalled guarded transaction at most the takeover grace (then ends it). Renewals
//! never take the guard lock, so they never queue behind writes.
//!
//! SQL: `migrations/2026-11-30-000003_guard/up.sql` (`pgfence.fence`, `pgfence._guard`, `pgfence._await_takeover`,
//! `pgfence.ungated_write`). The audit of refused writes is [`crate::audit`]'s, the enforcement switch and the
//! grants [`crate::admin`]'s.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::lease::{Lease, TenureSecret};
use crate::limits::MAX_OPERATION_LEN;
#[cfg(doc)]
use crate::store::Store;
use crate::types::Epoch;
use crate::validate::{validate_holder, validate_qualified};

pub(crate) mod guard;
pub(crate) mod outcome;
pub(crate) mod write;

/// What a guarded write presents: the cluster-qualified lease name, the epoch of the tenure that writes, and
/// that tenure's [`TenureSecret`].
///
/// A `Fence` is plain, serializable data, so a leader can hand it to a worker that writes through pgfence (or
/// through SQL) on its behalf; the database decides whether it is still current. Its serialized form carries
/// the secret: hand it only to processes that may write for the leader. `Debug` redacts the secret.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "FenceParts")]
pub struct Fence {
    lease: String,
    epoch: Epoch,
    secret: TenureSecret,
}

/// The unchecked shape of a serialized [`Fence`]; deserializing validates it like [`Fence::new`].
#[derive(Deserialize)]
struct FenceParts {
    lease: String,
    epoch: Epoch,
    secret: TenureSecret,
}

impl TryFrom<FenceParts> for Fence {
    type Error = Error;
    fn try_from(parts: FenceParts) -> Result<Fence> {
        Fence::new(parts.lease, parts.epoch, parts.secret)
    }
}

impl Fence {
    /// A fence from a cluster-qualified lease name (`<cluster>/<name>`), an epoch and its tenure's secret.
    /// Usually you get one from [`Lease::fence`](crate::Lease::fence) instead.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] when `lease` is not a valid cluster-qualified lease name.
    pub fn new(lease: impl Into<String>, epoch: Epoch, secret: TenureSecret) -> Result<Fence> {
        let lease = lease.into();
        validate_qualified(&lease)?;
        Ok(Fence {
            lease,
            epoch,
            secret,
        })
    }

    pub(crate) fn from_parts(lease: String, epoch: Epoch, secret: TenureSecret) -> Fence {
        Fence {
            lease,
            epoch,
            secret,
        }
    }

    /// The tenure's secret.
    pub fn secret(&self) -> &TenureSecret {
        &self.secret
    }

    /// The cluster-qualified lease name.
    pub fn lease(&self) -> &str {
        &self.lease
    }

    /// The epoch presented.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }
}

/// Refuses an operation label the audit would not keep.
pub(crate) fn check_operation(operation: &str) -> Result<()> {
    validate_holder("operation", operation)?;
    if operation.chars().count() > MAX_OPERATION_LEN {
        return Err(Error::invalid(
            "operation",
            format!("must be at most {MAX_OPERATION_LEN} characters"),
        ));
    }
    Ok(())
}

impl Lease {
    /// The fence every guarded write of this tenure presents (it carries the tenure's secret).
    pub fn fence(&self) -> Fence {
        Fence::from_parts(self.qualified.clone(), self.epoch, self.secret.clone())
    }
}
