//! [`Backoff`]: how long a supervised controller waits before campaigning again after a failure.

use std::time::Duration;

/// Exponential backoff with *equal jitter* and a cap, for re-campaigning after a loss or an error: the delay
/// before attempt `n + 1` is drawn uniformly between half and all of `initial × multiplier^n` (at most `max`).
///
/// Equal jitter rather than full jitter (uniform between zero and the exponential): full jitter spreads retries
/// a little wider but can draw a delay near zero, so a controller that fails at once could retry at once and
/// spin on the database; equal jitter never waits less than half the exponential. (Candidates waiting for a
/// holder to go away are spread differently: [`run_with_leadership`](super::run_with_leadership) adds up to
/// 10 % to each poll.)
///
/// Start from the default (100 ms, doubling, at most 10 s) and change what you need:
///
/// ```
/// use std::time::Duration;
/// use pgfence::leader::Backoff;
///
/// let mut backoff = Backoff::default();
/// backoff.max = Duration::from_secs(30);
/// let delay = backoff.delay(3); // 400 to 800 ms
/// assert!(delay >= Duration::from_millis(400) && delay <= Duration::from_millis(800));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Backoff {
    /// First delay (default 100 ms).
    pub initial: Duration,
    /// Cap (default 10 s).
    pub max: Duration,
    /// Growth factor per consecutive failure (default 2).
    pub multiplier: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
            multiplier: 2.0,
        }
    }
}

impl Backoff {
    /// The delay before attempt `failures + 1`: "equal jitter" — uniformly between half and all of the capped
    /// exponential (`initial × multiplier^failures`, at most `max`), so it is never less than half of it.
    pub fn delay(&self, failures: u32) -> Duration {
        // Never zero and never shrinking, whatever the configuration: a controller that fails at once must not
        // spin on the database.
        let initial = self.initial.max(Duration::from_millis(1)).as_secs_f64();
        let exp = initial * self.multiplier.max(1.0).powi(failures.min(64) as i32);
        let capped = exp.min(self.max.as_secs_f64().max(initial));
        Duration::from_secs_f64(capped * (0.5 + fastrand::f64() * 0.5))
    }
}
