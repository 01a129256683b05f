//! S-A6 across processes: two `dockhand run` worker processes share one database (PostgreSQL,
//! MySQL/MariaDB, and SQLite through its file) and drain it without running any action twice.

use dockhand::store::mysql::MySqlStore;
use dockhand::store::postgres::PgStore;
use dockhand::store::sqlite::SqliteStore;
use dockhand::{ActionQuery, ActionSpec, ActionStatus, DynStore, Queue};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const N: usize = 2000;

fn spawn_worker(url: &str) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dockhand"))
        .args(["--database-url", url, "run", "--concurrency", "4"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dockhand run");
    // Wait for the banner so both workers are up before work arrives.
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    for line in lines.by_ref() {
        if line.expect("read stderr").contains("dockhand worker on") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    child
}

fn stop(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().expect("wait");
    assert!(status.success(), "worker exited with {status}");
}

async fn two_processes_share_the_queue(store: DynStore, url: &str) {
    let a = spawn_worker(url);
    let b = spawn_worker(url);
    let queue = Queue::new(store.clone());
    let specs = (0..N)
        .map(|i| ActionSpec::new("demo.sleep", json!({"i": i, "ms": 2})))
        .collect();
    queue.enqueue_bulk(specs).await.unwrap();
    for _ in 0..1200 {
        let s = queue.stats().await.unwrap();
        if s.by_status.get("complete").copied().unwrap_or(0) == N as i64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop(a);
    stop(b);
    let mut owners: HashMap<String, usize> = HashMap::new();
    let mut seen = HashSet::new();
    let mut offset = 0;
    loop {
        let page = queue
            .query(&ActionQuery {
                limit: 500,
                offset,
                ..ActionQuery::default()
            })
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        offset += page.len() as i64;
        for action in page {
            assert_eq!(
                action.status,
                ActionStatus::Complete,
                "action {}",
                action.id
            );
            assert_eq!(
                action.attempt, 1,
                "action {} was claimed more than once",
                action.id
            );
            let starts: Vec<_> = queue
                .logs(action.id)
                .await
                .unwrap()
                .into_iter()
                .filter(|l| l.event == "started")
                .collect();
            assert_eq!(
                starts.len(),
                1,
                "action {} started {} times",
                action.id,
                starts.len()
            );
            *owners
                .entry(starts[0].detail.clone().unwrap_or_default())
                .or_default() += 1;
            seen.insert(action.id);
        }
    }
    assert_eq!(seen.len(), N);
    assert_eq!(owners.len(), 2, "both processes did work: {owners:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s_a6_two_worker_processes_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("shared.db").display());
    let store: DynStore = Arc::new(SqliteStore::connect(&url).await.unwrap());
    store.migrate().await.unwrap();
    two_processes_share_the_queue(store, &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s_a6_two_worker_processes_on_postgres() {
    let Some(base) = std::env::var("DOCKHAND_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: PostgreSQL multi-process test (set DOCKHAND_TEST_POSTGRES_URL to run it)"
        );
        return;
    };
    let schema = format!("dh_{}", uuid::Uuid::new_v4().simple());
    let store: DynStore = Arc::new(PgStore::connect_in_schema(&base, &schema).await.unwrap());
    store.migrate().await.unwrap();
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-c%20search_path%3D{schema}");
    two_processes_share_the_queue(store.clone(), &url).await;
    store.close().await;
    PgStore::drop_schema(&base, &schema).await.unwrap();
}

/// `url` (`mysql://USER@HOST:PORT/DB?…`) naming database `name` instead.
fn mysql_url_for(url: &str, name: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("mysql", url));
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let query = tail.find('?').map_or("", |i| &tail[i..]);
    format!("{scheme}://{authority}/{name}{query}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s_a6_two_worker_processes_on_mysql() {
    let Some(base) = std::env::var("DOCKHAND_TEST_MYSQL_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: MySQL/MariaDB multi-process test (set DOCKHAND_TEST_MYSQL_URL to run it)"
        );
        return;
    };
    let name = format!("dh_{}", uuid::Uuid::new_v4().simple());
    MySqlStore::create_database(&base, &name).await.unwrap();
    let url = mysql_url_for(&base, &name);
    let store: DynStore = Arc::new(MySqlStore::connect(&url).await.unwrap());
    store.migrate().await.unwrap();
    two_processes_share_the_queue(store.clone(), &url).await;
    store.close().await;
    MySqlStore::drop_database(&base, &name).await.unwrap();
}

#[test]
fn mysql_urls_name_the_test_database() {
    assert_eq!(
        mysql_url_for("mysql://root@127.0.0.1:3306/test", "dh_1"),
        "mysql://root@127.0.0.1:3306/dh_1"
    );
    assert_eq!(
        mysql_url_for("mariadb://u:p@h/db?ssl-mode=disabled", "dh_2"),
        "mariadb://u:p@h/dh_2?ssl-mode=disabled"
    );
    assert_eq!(mysql_url_for("mysql://h", "dh_3"), "mysql://h/dh_3");
}
