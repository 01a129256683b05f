//! `dockhand bench`: flags, the output line, and short real runs (SQLite always, PostgreSQL
//! when DOCKHAND_TEST_POSTGRES_URL is set, MySQL/MariaDB when DOCKHAND_TEST_MYSQL_URL is set).

use super::workloads::percentile;
use super::*;
use crate::cli::Cli;
use clap::Parser;

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(args.iter().copied())
}

fn bench_args(args: &[&str]) -> BenchArgs {
    let mut all = vec!["dockhand", "bench"];
    all.extend_from_slice(args);
    match parse(&all).expect("valid flags").command {
        crate::cli::Command::Bench(a) => a,
        other => panic!("parsed as {other:?}"),
    }
}

#[test]
fn flags_parse_with_defaults_and_reject_bad_values() {
    let a = bench_args(&["--backend", "sqlite"]);
    assert_eq!(
        (a.backend, a.n, a.concurrency, a.relaxed),
        (BenchBackend::Sqlite, 10_000, 8, false)
    );
    assert!(a.workload.is_empty());
    assert_eq!(
        bench_args(&["--backend", "mysql"]).backend,
        BenchBackend::Mysql
    );
    let a = bench_args(&[
        "--backend",
        "postgres",
        "--workload",
        "w2,W1b,W3",
        "--n",
        "5",
        "--concurrency",
        "16",
        "--relaxed",
    ]);
    assert_eq!(a.workload, vec![Workload::W2, Workload::W1b, Workload::W3]);
    assert_eq!((a.n, a.concurrency, a.relaxed), (5, 16, true));
    for bad in [
        &["dockhand", "bench"][..],
        &["dockhand", "bench", "--backend", "oracle"],
        &["dockhand", "bench", "--backend", "sqlite", "--n", "0"],
        &["dockhand", "bench", "--backend", "sqlite", "--n", "-3"],
        &[
            "dockhand",
            "bench",
            "--backend",
            "sqlite",
            "--concurrency",
            "0",
        ],
        &[
            "dockhand",
            "bench",
            "--backend",
            "sqlite",
            "--workload",
            "W5",
        ],
        &["dockhand", "bench", "--backend", "sqlite", "--timeout", "5"],
    ] {
        assert!(parse(bad).is_err(), "{bad:?} should be refused");
    }
}

#[test]
fn postgres_without_a_url_names_the_flag() {
    if std::env::var(TEST_POSTGRES_URL_ENV).is_ok() {
        // The fallback would find a server; only the explicit non-postgres URL case applies.
        let e = target(BenchBackend::Postgres, Some("sqlite:x.db")).unwrap_err();
        assert!(e.to_string().contains("--database-url"), "{e}");
        return;
    }
    let e = target(BenchBackend::Postgres, None).unwrap_err();
    assert!(e.to_string().contains("--database-url"), "{e}");
    let e = target(BenchBackend::Postgres, Some("sqlite:x.db")).unwrap_err();
    assert!(e.to_string().contains("--database-url"), "{e}");
}

#[test]
fn the_line_has_the_documented_fields() {
    let m = Measurement {
        peer: "dockhand-sqlite".into(),
        workload: "W2",
        n: 10_000,
        concurrency: Some(8),
        batch: None,
        secs: 0.4123,
        jobs_per_sec: Some(24_390.2),
        items_per_sec: None,
        p50_ms: None,
        p99_ms: None,
        dup: Some(0),
        durability: "sqlite-wal-synchronous-normal".into(),
    };
    assert_eq!(
        m.line(),
        "peer=dockhand-sqlite workload=W2 n=10000 concurrency=8 secs=0.41 jobs_per_sec=24390 \
         dup=0 durability=sqlite-wal-synchronous-normal"
    );
    let w4 = Measurement {
        workload: "W4",
        batch: Some(100),
        jobs_per_sec: None,
        items_per_sec: Some(3_120.6),
        ..m
    };
    assert_eq!(
        w4.line(),
        "peer=dockhand-sqlite workload=W4 n=10000 concurrency=8 batch=100 secs=0.41 \
         items_per_sec=3121 dup=0 durability=sqlite-wal-synchronous-normal"
    );
}

#[test]
fn percentiles_use_the_nearest_rank() {
    let v: Vec<f64> = (1..=200).map(f64::from).collect();
    assert_eq!(percentile(&v, 50.0), 100.0);
    assert_eq!(percentile(&v, 99.0), 198.0);
    assert_eq!(percentile(&[3.0], 99.0), 3.0);
    assert_eq!(percentile(&[], 50.0), 0.0);
}

async fn short_run(target: db::Target, relaxed: bool) -> Vec<Measurement> {
    let mut flags = vec!["--backend", "sqlite", "--n", "300", "--concurrency", "4"];
    if relaxed {
        flags.push("--relaxed");
    }
    let a = bench_args(&flags);
    let mut out = Vec::new();
    for w in Workload::ALL {
        out.push(
            run_one(&target, w, &a, Duration::from_secs(120))
                .await
                .unwrap(),
        );
    }
    out
}

fn check(ms: &[Measurement], peer: &str, durability_prefix: &str) {
    let names: Vec<&str> = ms.iter().map(|m| m.workload).collect();
    assert_eq!(names, ["W1", "W1b", "W2", "W3", "W4"]);
    for m in ms {
        assert_eq!(m.peer, peer);
        assert!(m.secs > 0.0, "{m:?}");
        assert!(m.durability.starts_with(durability_prefix), "{m:?}");
        assert_eq!(m.dup.unwrap_or(0), 0, "{m:?}");
    }
    assert_eq!(ms[0].n, 300);
    assert!(ms[2].jobs_per_sec.unwrap() > 0.0);
    assert_eq!(ms[3].n, u64::from(workloads::W3_JOBS));
    let (p50, p99) = (ms[3].p50_ms.unwrap(), ms[3].p99_ms.unwrap());
    assert!(p50 >= 0.0 && p99 >= p50, "{:?}", ms[3]);
    // W4 ran its pipeline to a completed parent with every claim processed and `check`
    // clean (run_one fails otherwise).
    assert_eq!(ms[4].n, 300);
    assert!(ms[4].items_per_sec.unwrap() > 0.0, "{:?}", ms[4]);
    assert_eq!(ms[4].batch, Some(100));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_runs_every_workload_on_fresh_files() {
    let before = bench_files();
    let ms = short_run(db::Target::Sqlite, false).await;
    check(&ms, "dockhand-sqlite", "sqlite-wal-synchronous-normal");
    let ms = short_run(db::Target::Sqlite, true).await;
    check(&ms, "dockhand-sqlite", "sqlite-wal-synchronous-off");
    assert_eq!(bench_files(), before, "temporary databases are deleted");
}

/// This process's benchmark files in the temp directory.
fn bench_files() -> Vec<String> {
    let prefix = format!("dockhand-bench-{}-", std::process::id());
    let mut names: Vec<String> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_runs_every_workload_in_fresh_schemas() {
    let Ok(url) = std::env::var(TEST_POSTGRES_URL_ENV) else {
        eprintln!("SKIPPED: set {TEST_POSTGRES_URL_ENV} to run the PostgreSQL bench test");
        return;
    };
    let ms = short_run(db::Target::Postgres(url.clone()), false).await;
    check(&ms, "dockhand-postgres", "pg-synchronous_commit-");
    let ms = short_run(db::Target::Postgres(url.clone()), true).await;
    check(&ms, "dockhand-postgres", "pg-synchronous_commit-off");
    // The schema is gone afterwards.
    let fresh = db::Fresh::open(&db::Target::Postgres(url.clone()), false)
        .await
        .unwrap();
    let schema = fresh.location();
    fresh.remove().await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1",
    )
    .bind(&schema)
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    assert_eq!(left, 0, "schema {schema} is dropped");
}

#[test]
fn mysql_without_a_url_names_the_flag() {
    let e = target(BenchBackend::Mysql, Some("postgres://h/db")).unwrap_err();
    assert!(e.to_string().contains("mysql://"), "{e}");
    if std::env::var(TEST_MYSQL_URL_ENV).is_err() {
        let e = target(BenchBackend::Mysql, None).unwrap_err();
        assert!(e.to_string().contains("--database-url"), "{e}");
    }
    assert!(matches!(
        target(BenchBackend::Mysql, Some("mariadb://root@h/test")),
        Ok(db::Target::Mysql(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_runs_every_workload_in_fresh_databases() {
    let Ok(url) = std::env::var(TEST_MYSQL_URL_ENV) else {
        eprintln!("SKIPPED: set {TEST_MYSQL_URL_ENV} to run the MySQL bench test");
        return;
    };
    let ms = short_run(db::Target::Mysql(url.clone()), false).await;
    check(&ms, "dockhand-mysql", "mysql-flush_log_at_trx_commit-");
    // The database is gone afterwards.
    let fresh = db::Fresh::open(&db::Target::Mysql(url.clone()), false)
        .await
        .unwrap();
    let name = fresh.location();
    fresh.remove().await;
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    let left: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?",
    )
    .bind(&name)
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    assert_eq!(left, 0, "database {name} is dropped");
}
