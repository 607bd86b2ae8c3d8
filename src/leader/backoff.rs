//! [`Backoff`]: how long a supervised controller waits before campaigning again after a failure.

use std::time::Duration;

/// Exponential backoff with jitter and a cap, for re-campaigning after a loss or an error.
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
