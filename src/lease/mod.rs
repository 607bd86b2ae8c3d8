//! Leases: acquire, renew, release and force-release, each one call of a SQL function, timed only by the
//! database clock. A granted tenure carries the [`Epoch`](crate::Epoch) the database issued and its
//! [`TenureSecret`].
//!
//! SQL: `migrations/2026-11-30-000002_lease_protocol/up.sql` (`pgfence.acquire`, `pgfence.renew`,
//! `pgfence.release`, `pgfence.force_release`, the view `pgfence.tenure_history`).
//!
//! Which file of this module owns what: the table of files in docs/architecture.md.

use std::fmt;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::types::{Epoch, LossReason};

mod calls;
mod many;
mod rows;
mod secret;

pub use secret::TenureSecret;

/// A tenure this process holds: the lease name, the holder, the epoch the database issued and the local
/// deadline before which the database cannot grant a successor.
///
/// This is plain data: it does not renew itself. Call [`Store::renew`](crate::Store::renew) before [`Lease::local_deadline`].
#[derive(Debug, Clone)]
pub struct Lease {
    name: String,
    pub(crate) qualified: String,
    holder: String,
    pub(crate) epoch: Epoch,
    /// `Debug` redacts it.
    pub(crate) secret: TenureSecret,
    ttl: Duration,
    local_deadline: Instant,
    believed_from: DateTime<Utc>,
}

impl Lease {
    #[cfg(feature = "testing")]
    pub(crate) fn from_parts(
        name: &str,
        qualified: String,
        holder: &str,
        (epoch, secret): (Epoch, TenureSecret),
        ttl: Duration,
        local_deadline: Instant,
    ) -> Lease {
        Lease {
            name: name.to_owned(),
            qualified,
            holder: holder.to_owned(),
            epoch,
            secret,
            ttl,
            local_deadline,
            believed_from: Utc::now(),
        }
    }

    /// The lease name without its cluster prefix.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cluster-qualified name (`<cluster>/<name>`), as stored in the database.
    pub fn qualified_name(&self) -> &str {
        &self.qualified
    }

    /// Who holds it.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The fencing token of this tenure.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The ttl of the last acquisition or renewal.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// By this process's monotonic clock: when the last successful acquire or renew statement was *sent*, plus
    /// the ttl. The database computed the expiry from its own clock when it *ran* the statement, which was
    /// later, so it cannot grant a successor before this instant (up to clock-rate drift, which a holder covers
    /// with a safety margin). No wall clock is involved.
    pub fn local_deadline(&self) -> Instant {
        self.local_deadline
    }

    /// When this process received the acquisition's reply, by its own wall clock (UTC): the start of its belief
    /// that it leads, as [`History::report_belief_start`](crate::history::History::report_belief_start) reports it. Only for the record of an investigation —
    /// no decision of pgfence compares it with another clock.
    pub fn believed_from(&self) -> DateTime<Utc> {
        self.believed_from
    }

    /// Time left until [`local_deadline`](Self::local_deadline) (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.local_deadline
            .saturating_duration_since(Instant::now())
    }
}

/// What [`Store::release`](crate::Store::release) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome", content = "reason")]
#[non_exhaustive]
pub enum Released {
    /// The tenure ended now; a successor can acquire immediately.
    Released,
    /// The tenure had already ended (released before, expired and taken over, …); nothing was changed.
    NotHeld(LossReason),
}

/// What [`Admin::force_release`](crate::admin::Admin::force_release) did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
#[non_exhaustive]
pub enum ForceReleased {
    /// The current tenure was ended: its epoch can no longer write.
    Ended {
        /// The epoch that was ended.
        epoch: Epoch,
        /// Who held it.
        holder: String,
    },
    /// Nobody holds the lease (released or expired already).
    NotHeld,
    /// No lease has this name.
    Unknown,
}

/// The state of a lease as the database sees it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LeaseState {
    /// Held and unexpired.
    Held,
    /// Held, but the ttl ran out (by the database clock); anyone may acquire.
    Expired,
    /// Released by its holder or an operator, or never acquired.
    Released,
}

impl LeaseState {
    /// The state's name, as serialized: `held`, `expired` or `released`.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Held => "held",
            LeaseState::Expired => "expired",
            LeaseState::Released => "released",
        }
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One lease row, read with durations computed by the database.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LeaseStatus {
    /// The cluster-qualified name.
    pub name: String,
    /// The last holder (current holder when `state` is `Held`).
    pub holder: Option<String>,
    /// The last issued epoch (`None` when never acquired).
    pub epoch: Option<Epoch>,
    /// Held, expired or released.
    pub state: LeaseState,
    /// Time left when held, by the database clock.
    pub expires_in: Option<Duration>,
    /// How many times the holder identity changed.
    pub transitions: i64,
    /// When the current tenure began.
    pub acquired_at: Option<DateTime<Utc>>,
    /// When it was last renewed.
    pub renewed_at: Option<DateTime<Utc>>,
    /// The last accepted task write (any epoch).
    pub last_write_at: Option<DateTime<Utc>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state's name is the one serde writes, `Display` prints and the CLI shows.
    #[test]
    fn lease_states_are_named_as_serialized() {
        for (state, name) in [
            (LeaseState::Held, "held"),
            (LeaseState::Expired, "expired"),
            (LeaseState::Released, "released"),
        ] {
            assert_eq!(state.as_str(), name);
            assert_eq!(state.to_string(), name);
            assert_eq!(
                serde_json::to_value(state).unwrap(),
                serde_json::json!(name)
            );
        }
    }
}
