//! Where a SQLite store call's time goes (docs/BENCHMARKS.md, "Speed II"): the cost of one
//! round trip to sqlx's SQLite worker thread (through the pool or on a held connection, one
//! statement or several in one query string, a BEGIN/COMMIT pair), a single enqueue, and a
//! claim and a completion round of k actions, on a fresh file opened as `SqliteStore` opens
//! one (WAL, synchronous = NORMAL). Run with `cargo run --release --example sqlite_phases`.
use chrono::Utc;
use dockhand::store::sqlite::SqliteStore;
use dockhand::store::{ClaimRequest, Finish, Store};

use dockhand::ActionSpec;
use serde_json::json;
use std::time::Instant;

fn per(label: &str, n: usize, t: Instant) {
    let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!("{label:50} {us:8.1} us/op");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite:{}", dir.path().join("p.db").display());
    let store = SqliteStore::connect(&url).await?;
    store.migrate().await?;
    let pool = store.pool().clone();
    let n = 3000;

    let t = Instant::now();
    for _ in 0..n {
        let _: i64 = sqlx::query_scalar("SELECT 1").fetch_one(&pool).await?;
    }
    per("SELECT 1 (pool)", n, t);

    let mut conn = pool.acquire().await?;
    let t = Instant::now();
    for _ in 0..n {
        let _: i64 = sqlx::query_scalar("SELECT 1").fetch_one(&mut *conn).await?;
    }
    per("SELECT 1 (held conn)", n, t);
    let t = Instant::now();
    for _ in 0..n {
        sqlx::query("SELECT 1").execute(&mut *conn).await?;
    }
    per("SELECT 1 execute (held conn)", n, t);
    let t = Instant::now();
    for _ in 0..n {
        let _: Vec<i64> = sqlx::query_scalar("SELECT 1; SELECT 2; SELECT 3")
            .fetch_all(&mut *conn)
            .await?;
    }
    per("SELECT 1;2;3 one string (held conn)", n, t);
    drop(conn);

    let t = Instant::now();
    for _ in 0..n {
        let tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        tx.commit().await?;
    }
    per("begin immediate + commit (empty)", n, t);

    let mut conn = pool.acquire().await?;
    let t = Instant::now();
    for _ in 0..n {
        sqlx::query("BEGIN IMMEDIATE; SELECT 1; COMMIT")
            .execute(&mut *conn)
            .await?;
    }
    per("'BEGIN IMMEDIATE; SELECT 1; COMMIT' one string", n, t);
    drop(conn);

    let now = Utc::now();
    let t = Instant::now();
    for i in 0..n {
        let a = ActionSpec::new("x", json!({ "n": i })).prepare(now)?;
        store.enqueue(&a, now).await?;
    }
    per("store.enqueue", n, t);

    // Seed for claims.
    let bulk = (0..60_000)
        .map(|i| ActionSpec::new("x", json!({ "n": i })).prepare(now))
        .collect::<Result<Vec<_>, _>>()?;
    for c in bulk.chunks(1000) {
        store.enqueue_bulk(c, now).await?;
    }
    for k in [1usize, 8, 32, 64, 128] {
        let rounds = (6000 / k).min(1500);
        let mut claim_t = 0.0;
        let mut fin_t = 0.0;
        for _ in 0..rounds {
            let now = Utc::now();
            let t = Instant::now();
            let c = store
                .claim(&ClaimRequest {
                    owner: "o",
                    limit: k as i64,
                    now,
                    lease_until: now + chrono::Duration::seconds(30),
                    hooks: None,
                    routing: None,
                })
                .await?;
            claim_t += t.elapsed().as_secs_f64();
            let items: Vec<_> = c.iter().map(|a| (a.lease(), Finish::Complete)).collect();
            let t = Instant::now();
            store.finish_many(&items, now).await?;
            fin_t += t.elapsed().as_secs_f64();
        }
        println!(
            "k={k:4} claim {:8.1} us/round ({:6.1} us/action)  finish_many {:8.1} us/round ({:6.1} us/action)",
            claim_t * 1e6 / rounds as f64,
            claim_t * 1e6 / (rounds * k) as f64,
            fin_t * 1e6 / rounds as f64,
            fin_t * 1e6 / (rounds * k) as f64
        );
    }
    Ok(())
}
