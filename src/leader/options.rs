//! How a held lease is timed: [`LeaseOptions`], checked by [`LeaseOptions::validate`] before every acquisition.

use std::time::Duration;

use crate::error::{Error, Result};

/// The shortest accepted [`LeaseOptions::retry_every`]: a shorter one would spin on an unreachable database.
const MIN_RETRY_EVERY: Duration = Duration::from_millis(10);

/// How a held lease is timed.
///
/// [`new`](Self::new) derives every setting from the ttl; change the others afterwards (each setting has one
/// name: the field's). Set `ttl` through `new`: changing it afterwards keeps the settings derived from the old one.
///
/// ```
/// use std::time::Duration;
/// use pgfence::leader::LeaseOptions;
///
/// let mut options = LeaseOptions::new(Duration::from_secs(15));
/// assert_eq!(options.renew_every, Duration::from_secs(5)); // ttl / 3
/// options.renew_every = Duration::from_secs(3);
/// options.validate()?;
/// # Ok::<(), pgfence::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseOptions {
    /// Lease duration granted by each acquisition and renewal (database clock), between
    /// [`MIN_TTL`](crate::limits::MIN_TTL) and [`MAX_TTL`](crate::limits::MAX_TTL).
    pub ttl: Duration,
    /// Renewal period; default ttl / 3. Must be positive and shorter than `ttl − safety_margin`.
    pub renew_every: Duration,
    /// How long before (send time of the last good renewal + ttl) the holder declares itself lost; covers
    /// clock-rate drift and scheduling delay. Default max(ttl / 10, 50 ms); shorter than `ttl`.
    pub safety_margin: Duration,
    /// Delay between retries after a transient renewal error; default max(ttl / 10, 10 ms), at least 10 ms.
    pub retry_every: Duration,
    /// Whether a [`PgElector`](super::PgElector) reports when this process started and stopped believing it
    /// held each tenure ([`History::report_belief_start`](crate::history::History::report_belief_start), …`_end`), for the
    /// overlap review of `pgfence history`. In the background, off the leader's path: a report that fails is
    /// logged and counted ([`METRIC_BELIEF_REPORTS_FAILED`](crate::metrics::METRIC_BELIEF_REPORTS_FAILED)), never
    /// retried into the next tenure. Default true.
    pub report_beliefs: bool,
}

impl LeaseOptions {
    /// Options with `ttl` and the default timing derived from it.
    pub fn new(ttl: Duration) -> LeaseOptions {
        LeaseOptions {
            ttl,
            renew_every: ttl / 3,
            safety_margin: (ttl / 10).max(Duration::from_millis(50)),
            retry_every: (ttl / 10).max(MIN_RETRY_EVERY),
            report_beliefs: true,
        }
    }

    /// Checks that a renewal can happen before the holder's deadline. Every acquisition checks it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the setting (`ttl`, `safety_margin`, `renew_every` or `retry_every`) when
    /// `ttl` is outside [`MIN_TTL`](crate::limits::MIN_TTL)..=[`MAX_TTL`](crate::limits::MAX_TTL), `safety_margin` is not shorter
    /// than `ttl`, `renew_every` is zero or not shorter than `ttl − safety_margin`, or `retry_every` is under
    /// 10 ms.
    pub fn validate(&self) -> Result<()> {
        if self.ttl < crate::limits::MIN_TTL || self.ttl > crate::limits::MAX_TTL {
            return Err(Error::invalid(
                "ttl",
                format!(
                    "must be between {:?} and {:?}",
                    crate::limits::MIN_TTL,
                    crate::limits::MAX_TTL
                ),
            ));
        }
        if self.safety_margin >= self.ttl {
            return Err(Error::invalid(
                "safety_margin",
                "must be shorter than the ttl",
            ));
        }
        if self.renew_every.is_zero() || self.renew_every >= self.ttl - self.safety_margin {
            return Err(Error::invalid(
                "renew_every",
                format!(
                    "must be positive and shorter than ttl - safety_margin ({:?})",
                    self.ttl - self.safety_margin
                ),
            ));
        }
        if self.retry_every < MIN_RETRY_EVERY {
            return Err(Error::invalid(
                "retry_every",
                format!("must be at least {MIN_RETRY_EVERY:?}"),
            ));
        }
        Ok(())
    }
}
