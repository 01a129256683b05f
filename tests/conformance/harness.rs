//! Test harness: one isolated database per test (a temp SQLite file, a fresh PostgreSQL
//! schema, or a fresh MySQL/MariaDB database), a frozen clock, and a runtime builder preset for
//! deterministic tests.

use chrono::{DateTime, TimeZone, Utc};
use dockhand::runtime::RuntimeBuilder;
use dockhand::store::mysql::MySqlStore;
use dockhand::store::postgres::PgStore;
use dockhand::store::sqlite::SqliteStore;
use dockhand::{Backoff, Clock, DynStore, Runtime, TestClock};
use std::io::Write;
use std::sync::{Arc, Once};
use std::time::Duration;

/// Which backend a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sqlite,
    Postgres,
    Mysql,
}

/// An isolated database for one test.
#[derive(Clone)]
pub struct TestDb {
    pub kind: Kind,
    pub store: DynStore,
    pub clock: TestClock,
    url: String,
    /// The PostgreSQL schema or the MySQL database of this test.
    schema: Option<String>,
    /// The pool raw SQL runs on ([`TestDb::exec_all`], [`TestDb::count_all`]), opened on first
    /// use and kept for the test: the fault sweep resets its tables before each of ~650
    /// points.
    raw: Arc<tokio::sync::OnceCell<RawPool>>,
    _dir: Option<Arc<tempfile::TempDir>>,
}

/// A test's pool for raw SQL. Like every pool here, without sqlx's reaper task (no idle
/// timeout, no lifetime): it can spin for good (sqlx#3645, see `dockhand::store`'s pool notes).
#[derive(Clone)]
pub enum RawPool {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
    Mysql(sqlx::MySqlPool),
}

impl RawPool {
    /// Cancels action `id` (pending or running) behind the store's back, as an operator's
    /// cancel of a job's step, chunk or finalize action did before the store refused those
    /// (a database written then can hold such rows): the recovery routes must still move
    /// their jobs. Returns the rows changed (1, or 0 when the action was final).
    pub async fn cancel_action(&self, id: i64, at: DateTime<Utc>) -> u64 {
        let ms = at.timestamp_millis();
        let set = "status = 'canceled', lease_owner = NULL, lease_until = NULL";
        let cond = format!("id = {id} AND status IN ('pending', 'running')");
        let done = match self {
            RawPool::Sqlite(p) => sqlx::query(&format!(
                "UPDATE dockhand_actions SET {set}, finished_at = {ms} WHERE {cond}"
            ))
            .execute(p)
            .await
            .map(|d| d.rows_affected()),
            RawPool::Postgres(p) => sqlx::query(&format!(
                "UPDATE dockhand_actions SET {set}, finished_at = to_timestamp({ms} / 1000.0)
                 WHERE {cond}"
            ))
            .execute(p)
            .await
            .map(|d| d.rows_affected()),
            RawPool::Mysql(p) => sqlx::query(&format!(
                "UPDATE dockhand_actions SET {set}, active_key = NULL, finished_at = {ms}
                 WHERE {cond}"
            ))
            .execute(p)
            .await
            .map(|d| d.rows_affected()),
        };
        done.expect("cancel behind the store")
    }
}

/// Pool options without the reaper task, for the pools the harness opens itself.
fn quiet<DB: sqlx::Database>() -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new()
        .max_connections(2)
        .idle_timeout(None)
        .max_lifetime(None)
}

/// 2026-03-27 12:00 UTC: two days before the Paris spring DST change.
pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 27, 12, 0, 0).unwrap()
}

static PG_SKIP: Once = Once::new();
static MYSQL_SKIP: Once = Once::new();

pub fn mysql_url() -> Option<String> {
    let url = std::env::var("DOCKHAND_TEST_MYSQL_URL")
        .ok()
        .filter(|u| !u.is_empty());
    if url.is_none() {
        MYSQL_SKIP.call_once(|| {
            // Written to the real stderr (not the captured test output) so it is visible once.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: MySQL/MariaDB conformance tests (set DOCKHAND_TEST_MYSQL_URL to run them)"
            );
        });
    }
    url
}

/// Opens a store on database `name` of the MySQL server `url` names.
async fn open_mysql(url: &str, name: &str) -> MySqlStore {
    let options = MySqlStore::url_for_database(url, name).expect("mysql url");
    MySqlStore::connect_with(options, 10)
        .await
        .expect("open mysql database")
}

pub fn postgres_url() -> Option<String> {
    let url = std::env::var("DOCKHAND_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty());
    if url.is_none() {
        PG_SKIP.call_once(|| {
            // Written to the real stderr (not the captured test output) so it is visible once.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: PostgreSQL conformance tests (set DOCKHAND_TEST_POSTGRES_URL to run them)"
            );
        });
    }
    url
}

impl TestDb {
    /// A fresh, migrated database; `None` when the backend is not configured (skipped).
    pub async fn new(kind: Kind) -> Option<TestDb> {
        let clock = TestClock::at(t0());
        match kind {
            Kind::Sqlite => {
                let dir = tempfile::tempdir().expect("tempdir");
                let url = format!("sqlite:{}", dir.path().join("test.db").display());
                let store: DynStore =
                    Arc::new(SqliteStore::connect(&url).await.expect("open sqlite"));
                store.migrate().await.expect("migrate");
                Some(TestDb {
                    kind,
                    store,
                    clock,
                    url,
                    schema: None,
                    raw: Default::default(),
                    _dir: Some(Arc::new(dir)),
                })
            }
            Kind::Postgres => {
                let url = postgres_url()?;
                let schema = format!("dh_{}", uuid::Uuid::new_v4().simple());
                let store: DynStore = Arc::new(
                    PgStore::connect_in_schema(&url, &schema)
                        .await
                        .expect("open postgres schema"),
                );
                store.migrate().await.expect("migrate");
                Some(TestDb {
                    kind,
                    store,
                    clock,
                    url,
                    schema: Some(schema),
                    raw: Default::default(),
                    _dir: None,
                })
            }
            Kind::Mysql => {
                let url = mysql_url()?;
                let name = format!("dh_{}", uuid::Uuid::new_v4().simple());
                MySqlStore::create_database(&url, &name)
                    .await
                    .expect("create mysql database");
                let store: DynStore = Arc::new(open_mysql(&url, &name).await);
                store.migrate().await.expect("migrate");
                Some(TestDb {
                    kind,
                    store,
                    clock,
                    url,
                    schema: Some(name),
                    raw: Default::default(),
                    _dir: None,
                })
            }
        }
    }

    /// A second, independent store (its own pool) on the same database.
    pub async fn open_another(&self) -> DynStore {
        match self.kind {
            Kind::Sqlite => Arc::new(SqliteStore::connect(&self.url).await.expect("open sqlite")),
            Kind::Postgres => Arc::new(
                PgStore::connect_in_schema(&self.url, self.schema.as_deref().unwrap_or("public"))
                    .await
                    .expect("open postgres"),
            ),
            Kind::Mysql => {
                Arc::new(open_mysql(&self.url, self.schema.as_deref().unwrap_or("test")).await)
            }
        }
    }

    /// A store on the same database whose every write is refused for good: SQLite opened
    /// `mode=ro`, PostgreSQL with `default_transaction_read_only`, MySQL/MariaDB one session
    /// set to `TRANSACTION READ ONLY`.
    pub async fn open_read_only(&self) -> DynStore {
        match self.kind {
            Kind::Sqlite => Arc::new(
                SqliteStore::connect(&format!("{}?mode=ro", self.url))
                    .await
                    .expect("open sqlite read-only"),
            ),
            Kind::Postgres => {
                use std::str::FromStr;
                let schema = self.schema.clone().unwrap_or_else(|| "public".into());
                let opts = sqlx::postgres::PgConnectOptions::from_str(&self.url)
                    .expect("pg url")
                    .options([
                        ("search_path", schema.as_str()),
                        ("default_transaction_read_only", "on"),
                    ]);
                Arc::new(PgStore::connect_with(opts, 2).await.expect("open pg"))
            }
            Kind::Mysql => {
                let name = self.schema.clone().unwrap_or_else(|| "test".into());
                let opts = MySqlStore::url_for_database(&self.url, &name).expect("mysql url");
                let store = MySqlStore::connect_with(opts, 1).await.expect("open mysql");
                sqlx::query("SET SESSION TRANSACTION READ ONLY")
                    .execute(store.pool())
                    .await
                    .expect("read-only session");
                Arc::new(store)
            }
        }
    }

    /// A runtime on this database with the frozen clock and deterministic settings.
    pub fn runtime(&self) -> RuntimeBuilder {
        self.runtime_on(self.store.clone())
    }

    /// The same, over another store on this database.
    pub fn runtime_on(&self, store: DynStore) -> RuntimeBuilder {
        Runtime::with_store(store)
            .clock(Arc::new(self.clock.clone()))
            .migrate(false)
            .concurrency(8)
            .backoff(Backoff::fixed_exponential(
                Duration::from_secs(10),
                2.0,
                Duration::from_secs(3600),
            ))
    }

    pub fn queue(&self) -> dockhand::Queue {
        dockhand::Queue::with_clock(self.store.clone(), Arc::new(self.clock.clone()))
    }

    /// Runs raw SQL against the test database (to tamper with stored data in failure tests).
    pub async fn exec_sql(&self, sql: &str) {
        self.exec_all(&[sql]).await;
    }

    /// [`RawPool::cancel_action`] at the test clock's now.
    pub async fn cancel_behind_store(&self, id: i64) {
        let changed = self.raw().await.cancel_action(id, self.clock.now()).await;
        assert_eq!(changed, 1, "action {id} canceled behind the store");
    }

    /// The test's raw-SQL pool, opened on first use.
    pub async fn raw(&self) -> RawPool {
        self.raw
            .get_or_init(|| async {
                match self.kind {
                    Kind::Sqlite => {
                        use std::str::FromStr;
                        let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&self.url)
                            .expect("sqlite url");
                        RawPool::Sqlite(quiet().connect_with(opts).await.expect("open sqlite"))
                    }
                    Kind::Postgres => {
                        use std::str::FromStr;
                        let schema = self.schema.clone().unwrap_or_else(|| "public".into());
                        let opts = sqlx::postgres::PgConnectOptions::from_str(&self.url)
                            .expect("pg url")
                            .options([("search_path", schema.as_str())]);
                        RawPool::Postgres(quiet().connect_with(opts).await.expect("open pg"))
                    }
                    Kind::Mysql => {
                        let name = self.schema.clone().unwrap_or_else(|| "test".into());
                        let opts =
                            MySqlStore::url_for_database(&self.url, &name).expect("mysql url");
                        RawPool::Mysql(quiet().connect_with(opts).await.expect("open mysql"))
                    }
                }
            })
            .await
            .clone()
    }

    /// Runs raw SQL statements, in order, on the test's raw-SQL pool.
    pub async fn exec_all(&self, sqls: &[&str]) {
        macro_rules! run {
            ($pool:expr) => {
                for sql in sqls {
                    sqlx::query(sql).execute(&$pool).await.expect("exec sql");
                }
            };
        }
        match self.raw().await {
            RawPool::Sqlite(p) => run!(p),
            RawPool::Postgres(p) => run!(p),
            RawPool::Mysql(p) => run!(p),
        }
    }

    /// Runs a query returning one text value (a diagnostic dump) on the test's raw-SQL pool;
    /// the error's text when it fails.
    pub async fn text_of(&self, sql: &str) -> String {
        let got: Result<Option<String>, sqlx::Error> = match self.raw().await {
            RawPool::Sqlite(p) => sqlx::query_scalar(sql).fetch_one(&p).await,
            RawPool::Postgres(p) => sqlx::query_scalar(sql).fetch_one(&p).await,
            RawPool::Mysql(p) => sqlx::query_scalar(sql).fetch_one(&p).await,
        };
        match got {
            Ok(text) => text.unwrap_or_default(),
            Err(e) => format!("({e})"),
        }
    }

    /// Runs queries returning one integer each (a `COUNT(*)`) on the test's raw-SQL pool.
    pub async fn count_all(&self, sqls: &[&str]) -> Vec<i64> {
        let mut out = Vec::new();
        macro_rules! run {
            ($pool:expr) => {
                for sql in sqls {
                    out.push(
                        sqlx::query_scalar(sql)
                            .fetch_one(&$pool)
                            .await
                            .expect("count"),
                    );
                }
            };
        }
        match self.raw().await {
            RawPool::Sqlite(p) => run!(p),
            RawPool::Postgres(p) => run!(p),
            RawPool::Mysql(p) => run!(p),
        }
        out
    }

    /// The recorded start and finish times (milliseconds since the epoch) of every action of
    /// `group`, as the rows hold them.
    pub async fn start_finish_ms(&self, group: &str) -> Vec<(Option<i64>, Option<i64>)> {
        let (started, finished) = match self.kind {
            Kind::Postgres => (
                "(extract(epoch FROM started_at) * 1000)::bigint",
                "(extract(epoch FROM finished_at) * 1000)::bigint",
            ),
            Kind::Sqlite | Kind::Mysql => ("started_at", "finished_at"),
        };
        let sql = format!(
            "SELECT {started} AS s, {finished} AS f FROM dockhand_actions WHERE group_name = '{group}'"
        );
        macro_rules! rows {
            ($pool:expr) => {
                sqlx::query_as(&sql).fetch_all(&$pool).await.expect("times")
            };
        }
        match self.raw().await {
            RawPool::Sqlite(p) => rows!(p),
            RawPool::Postgres(p) => rows!(p),
            RawPool::Mysql(p) => rows!(p),
        }
    }

    pub async fn cleanup(self) {
        self.store.close().await;
        match self.raw.get() {
            Some(RawPool::Sqlite(p)) => p.close().await,
            Some(RawPool::Postgres(p)) => p.close().await,
            Some(RawPool::Mysql(p)) => p.close().await,
            None => {}
        }
        match (self.kind, &self.schema) {
            (Kind::Postgres, Some(schema)) => {
                let _ = PgStore::drop_schema(&self.url, schema).await;
            }
            (Kind::Mysql, Some(name)) => {
                let _ = MySqlStore::drop_database(&self.url, name).await;
            }
            _ => {}
        }
    }
}

/// How long one scenario may run before the watchdog fails it with the store's state
/// (`DOCKHAND_TEST_SCENARIO_LIMIT_SECS` overrides it for every scenario). Most scenarios take
/// a few seconds alone and under a minute beside the whole suite on two cores; the fault
/// sweep walks ~650 fault points and takes minutes. A scenario past its limit is stuck, and
/// failing it names it and shows where its actions stand instead of leaving CI hanging.
fn scenario_limit(name: &str) -> Duration {
    /// Scenarios that take minutes by design, and their limits in seconds.
    const LONG: &[(&str, u64)] = &[("sweep_fault_points", 1200)];
    let default = LONG
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(300, |(_, secs)| *secs);
    let secs = std::env::var("DOCKHAND_TEST_SCENARIO_LIMIT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    Duration::from_secs(secs)
}

/// Runs one scenario on `kind` (skipped when the backend is not configured) on a task of its
/// own, so a scenario that stops yielding cannot keep the watchdog from firing.
pub async fn run<F, Fut>(kind: Kind, name: &'static str, scenario: F)
where
    F: FnOnce(TestDb) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let Some(db) = TestDb::new(kind).await else {
        return;
    };
    let limit = scenario_limit(name);
    // A second watchdog on a thread of its own: when the runtime itself is wedged (a worker
    // spinning in a task that never yields, the one driving the timers, as sqlx#3645 did),
    // the timeout below never fires; this one ends the test binary with the scenario's name.
    let (alive, finished) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let grace = limit + Duration::from_secs(60);
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(grace) {
            let _ = writeln!(
                std::io::stderr(),
                "{name} ({kind:?}): its runtime did not answer {grace:?} after the start; \
                 ending the test binary"
            );
            std::process::exit(1);
        }
    });
    let _alive = alive;
    let mut task = tokio::spawn(scenario(db.clone()));
    match tokio::time::timeout(limit, &mut task).await {
        Ok(Ok(())) => db.cleanup().await,
        Ok(Err(e)) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => panic!("{name}: the scenario's task ended without finishing: {e}"),
        },
        Err(_) => {
            task.abort();
            let state = stuck_state(&db).await;
            panic!(
                "{name} ({kind:?}): still running after {limit:?}; unfinished actions:\n{state}"
            );
        }
    }
}

/// The unfinished actions of a stuck scenario's store, one per line (at most 50).
async fn stuck_state(db: &TestDb) -> String {
    let q = dockhand::ActionQuery {
        statuses: vec![
            dockhand::ActionStatus::Pending,
            dockhand::ActionStatus::Running,
        ],
        limit: 50,
        ..Default::default()
    };
    let read = tokio::time::timeout(Duration::from_secs(10), db.store.query(&q)).await;
    match read {
        Ok(Ok(actions)) => actions
            .iter()
            .map(|a| {
                format!(
                    "  #{} {} {:?} attempt {} token {} owner {:?} until {:?} at {} args {}",
                    a.id,
                    a.hook,
                    a.status,
                    a.attempt,
                    a.lease_token,
                    a.lease_owner,
                    a.lease_until,
                    a.scheduled_at,
                    a.args
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Ok(Err(e)) => format!("  (the store could not be read: {e})"),
        Err(_) => "  (the store did not answer within 10 s)".into(),
    }
}

/// Expands each named scenario (an `async fn(TestDb)` in `scenarios`) into a test per backend,
/// each run through [`run`].
#[macro_export]
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        $crate::conformance!(@backend sqlite, Sqlite, $($name),*);
        $crate::conformance!(@backend postgres, Postgres, $($name),*);
        $crate::conformance!(@backend mysql, Mysql, $($name),*);
    };
    (@backend $module:ident, $kind:ident, $($name:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    $crate::harness::run(
                        $crate::harness::Kind::$kind,
                        stringify!($name),
                        $crate::scenarios::$name,
                    )
                    .await;
                }
            )*
        }
    };
}
