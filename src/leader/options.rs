//! How a held lease is timed: [`LeaseOptions`], validated at construction.

use std::time::Duration;

use crate::error::{Error, Result};

/// How a held lease is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseOptions {
    /// Lease duration granted by each acquisition and renewal (database clock).
    pub ttl: Duration,
    /// Renewal period; default ttl/3.
    pub renew_every: Option<Duration>,
    /// How long before (send time of the last good renewal + ttl) the holder declares itself lost; covers
    /// clock-rate drift and scheduling delay. Default max(ttl/10, 50 ms).
    pub safety_margin: Option<Duration>,
    /// Delay between retries after a transient renewal error; default ttl/10.
    pub retry_every: Option<Duration>,
}

impl LeaseOptions {
    /// Options with `ttl` and the default renewal timing.
    pub fn new(ttl: Duration) -> LeaseOptions {
        LeaseOptions {
            ttl,
            renew_every: None,
            safety_margin: None,
            retry_every: None,
        }
    }

    /// The renewal period in effect.
    pub fn renew_period(&self) -> Duration {
        self.renew_every.unwrap_or(self.ttl / 3)
    }

    /// The safety margin in effect.
    pub fn margin(&self) -> Duration {
        self.safety_margin
            .unwrap_or_else(|| (self.ttl / 10).max(Duration::from_millis(50)))
    }

    /// The retry delay in effect.
    pub fn retry_period(&self) -> Duration {
        self.retry_every
            .unwrap_or(self.ttl / 10)
            .max(Duration::from_millis(10))
    }

    /// Checks that a renewal can happen before the holder's deadline.
    pub fn validate(&self) -> Result<()> {
        if self.ttl < crate::types::MIN_TTL || self.ttl > crate::types::MAX_TTL {
            return Err(Error::invalid(
                "ttl",
                format!(
                    "must be between {:?} and {:?}",
                    crate::types::MIN_TTL,
                    crate::types::MAX_TTL
                ),
            ));
        }
        if self.margin() >= self.ttl {
            return Err(Error::invalid(
                "safety margin",
                "must be shorter than the ttl",
            ));
        }
        if self.renew_period().is_zero() || self.renew_period() >= self.ttl - self.margin() {
            return Err(Error::invalid(
                "renew interval",
                format!(
                    "must be positive and shorter than ttl - safety margin ({:?})",
                    self.ttl - self.margin()
                ),
            ));
        }
        Ok(())
    }
}
