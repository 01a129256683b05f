//! Backoff settings (§5 row 8): for random settings — including zero, huge, NaN and infinite
//! ones — the delay never panics, is never negative, is non-decreasing in the attempt without
//! jitter, never exceeds the cap, and stays within `±jitter` of the deterministic delay.

use crate::support::check;
use chrono::Duration;
use dockhand::Backoff;
use proptest::prelude::*;
use std::time::Duration as Std;

fn duration() -> impl Strategy<Value = Std> {
    prop_oneof![
        (0u64..10_000_000).prop_map(Std::from_millis),
        any::<u64>().prop_map(Std::from_millis),
        any::<u64>().prop_map(Std::from_secs),
        Just(Std::ZERO),
        Just(Std::MAX),
    ]
}

fn factor() -> impl Strategy<Value = f64> {
    prop_oneof![
        0.0f64..10.0,
        any::<f64>(),
        Just(f64::NAN),
        Just(f64::INFINITY)
    ]
}

fn attempt() -> impl Strategy<Value = i32> {
    prop_oneof![-5i32..100, any::<i32>(), Just(i32::MAX - 1)]
}

/// The cap in whole milliseconds, as `Backoff::delay` applies it.
fn cap_ms(max: Std) -> i64 {
    max.as_millis().min(i64::MAX as u128 / 4) as i64
}

#[test]
fn without_jitter_non_decreasing_and_capped() {
    check(
        5000,
        (duration(), factor(), duration(), attempt(), 1i32..40),
        |(base, factor, max, a, step)| {
            let b = Backoff::fixed_exponential(base, factor, max);
            let d1 = b.delay(a);
            let d2 = b.delay(a.saturating_add(step));
            prop_assert!(d1 >= Duration::zero(), "{b:?} attempt {a}: {d1}");
            prop_assert!(d1 <= d2, "{b:?}: attempt {a} → {d1}, +{step} → {d2}");
            prop_assert!(
                d2.num_milliseconds() <= cap_ms(max),
                "{b:?}: {d2} over the cap"
            );
            Ok(())
        },
    );
}

#[test]
fn jitter_stays_within_its_spread() {
    check(
        5000,
        (
            duration(),
            factor(),
            duration(),
            attempt(),
            prop_oneof![0.0f64..=1.0, any::<f64>()],
        ),
        |(base, factor, max, a, jitter)| {
            let fixed = Backoff::fixed_exponential(base, factor, max).delay(a);
            let b = Backoff {
                base,
                factor,
                max,
                jitter,
            };
            let d = b.delay(a).num_milliseconds();
            let j = if jitter.is_finite() {
                jitter.clamp(0.0, 1.0)
            } else {
                0.0
            };
            let exact = fixed.num_milliseconds() as f64;
            // One millisecond of truncation slack, plus float rounding at huge values.
            let slack = 1.0 + exact * 1e-12;
            prop_assert!(d >= 0);
            prop_assert!(
                (d as f64) >= exact * (1.0 - j) - slack,
                "{b:?}: {d} < {exact}·(1−{j})"
            );
            prop_assert!(
                (d as f64) <= exact * (1.0 + j) + slack,
                "{b:?}: {d} > {exact}·(1+{j})"
            );
            Ok(())
        },
    );
}
