//! Retry delays for actions whose handler failed with a retryable error: exponential with a
//! cap and optional jitter. (In-process retries of store calls use the `backon` crate.)

use chrono::Duration;

/// Exponential backoff: `base * factor^(attempt - 1)`, capped at `max`, then spread by
/// `±jitter` (a fraction, 0.0–1.0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Delay after the first failed attempt.
    pub base: std::time::Duration,
    /// Growth per attempt (≥ 1.0).
    pub factor: f64,
    /// Upper bound.
    pub max: std::time::Duration,
    /// Random spread as a fraction of the delay (0.0 = deterministic).
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: std::time::Duration::from_secs(1),
            factor: 2.0,
            max: std::time::Duration::from_secs(3600),
            jitter: 0.1,
        }
    }
}

impl Backoff {
    /// A deterministic policy (no jitter), for tests and predictable schedules.
    pub fn fixed_exponential(
        base: std::time::Duration,
        factor: f64,
        max: std::time::Duration,
    ) -> Self {
        Self {
            base,
            factor,
            max,
            jitter: 0.0,
        }
    }

    /// The delay before the run after failed attempt number `attempt` (1-based).
    /// Never negative, never above `max * (1 + jitter)`, no overflow for any input.
    pub fn delay(&self, attempt: i32) -> Duration {
        let exp = (attempt.max(1) - 1).min(1024);
        let factor = if self.factor.is_finite() {
            self.factor.max(1.0)
        } else {
            1.0
        };
        let max_ms = self.max.as_millis().min(i64::MAX as u128 / 4) as f64;
        let raw = self.base.as_millis() as f64 * factor.powi(exp);
        let capped = if raw.is_finite() {
            raw.min(max_ms)
        } else {
            max_ms
        };
        let jitter = if self.jitter.is_finite() {
            self.jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let spread = if jitter > 0.0 {
            1.0 + jitter * (fastrand::f64() * 2.0 - 1.0)
        } else {
            1.0
        };
        // The cap again in whole milliseconds: `max_ms` as f64 may round up past it.
        let max_whole = self.max.as_millis().min(i64::MAX as u128 / 4) as i64;
        let bound = max_whole.saturating_add((max_whole as f64 * jitter) as i64);
        Duration::milliseconds(((capped * spread).max(0.0) as i64).min(bound))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration as StdDuration;

    #[test]
    fn grows_then_caps() {
        let b =
            Backoff::fixed_exponential(StdDuration::from_secs(1), 2.0, StdDuration::from_secs(10));
        let d: Vec<i64> = (1..=6).map(|a| b.delay(a).num_milliseconds()).collect();
        assert_eq!(d, vec![1000, 2000, 4000, 8000, 10000, 10000]);
    }

    #[test]
    fn extreme_inputs_do_not_overflow() {
        let b = Backoff {
            base: StdDuration::from_secs(u64::MAX / 2),
            factor: f64::INFINITY,
            max: StdDuration::MAX,
            jitter: f64::NAN,
        };
        for a in [i32::MIN, -1, 0, 1, 2, 1000, i32::MAX] {
            assert!(b.delay(a) >= Duration::zero());
        }
    }

    #[test]
    fn cap_holds_to_the_millisecond() {
        // 15591306317070267 ms is not an f64: it rounds up to …268, one past the cap.
        let max = StdDuration::from_millis(15_591_306_317_070_267);
        let b = Backoff::fixed_exponential(StdDuration::MAX / 2, 2.0, max);
        assert_eq!(b.delay(1).num_milliseconds(), 15_591_306_317_070_267);
    }

    #[test]
    fn jitter_stays_within_bounds() {
        let b = Backoff {
            base: StdDuration::from_secs(10),
            factor: 1.0,
            max: StdDuration::from_secs(10),
            jitter: 0.5,
        };
        for _ in 0..200 {
            let d = b.delay(3).num_milliseconds();
            assert!((5000..=15000).contains(&d), "{d}");
        }
    }
}
