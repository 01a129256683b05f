//! Shared plumbing: a deterministic proptest runner and a per-backend test expander.

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseResult, TestRng, TestRunner};

/// A runner with `cases` cases, a fixed seed (reproducible runs) and no failure persistence
/// (no regression files). A failure panics with the minimal input proptest shrank it to.
pub fn runner(cases: u32) -> TestRunner {
    let config = Config {
        cases,
        failure_persistence: None,
        // Shrinking a store-backed case re-runs it; keep a failing run short.
        max_shrink_iters: 256,
        ..Config::default()
    };
    TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha))
}

/// Runs `test` over `cases` inputs from `strategy`, panicking with the shrunk input on failure.
pub fn check<S: Strategy>(cases: u32, strategy: S, test: impl Fn(S::Value) -> TestCaseResult)
where
    S::Value: std::fmt::Debug,
{
    if let Err(e) = runner(cases).run(&strategy, test) {
        panic!("{e}");
    }
}

/// A current-thread tokio runtime for driving async store calls from a property.
pub fn tokio_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Expands each named `fn(Kind)` of the enclosing module into a `#[test]` per backend
/// (`sqlite_…`, `postgres_…`, `mysql_…`); the body skips when the backend is not configured.
#[macro_export]
macro_rules! per_backend {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[test] fn $name() { super::$name($crate::harness::Kind::Sqlite) } )*
        }
        mod postgres {
            $( #[test] fn $name() { super::$name($crate::harness::Kind::Postgres) } )*
        }
        mod mysql {
            $( #[test] fn $name() { super::$name($crate::harness::Kind::Mysql) } )*
        }
    };
}
