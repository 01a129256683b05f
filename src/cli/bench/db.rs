//! The fresh database each workload runs on, the durability settings read back from it, and
//! its removal.
//!
//! SQLite: `dockhand-bench-<pid>-<random>.db` in the temp directory, opened exactly as
//! [`crate::store::connect`] opens a file (WAL, `synchronous = NORMAL`), deleted with its
//! `-wal`/`-shm` side files afterwards. PostgreSQL: schema `dh_bench_<random>` through
//! [`PgStore::connect_in_schema`], dropped with [`PgStore::drop_schema`] afterwards. MySQL /
//! MariaDB: database `dh_bench_<random>` through [`MySqlStore::create_database`], dropped with
//! [`MySqlStore::drop_database`] afterwards.
//!
//! `--relaxed`: SQLite runs `PRAGMA synchronous = OFF` on the store's write connection and its
//! callers' pool ([`SqliteStore::relax_synchronous`]); PostgreSQL adds
//! `options[synchronous_commit]=off` to the URL, so every pooled session starts with it. MySQL
//! has no per-session switch (`innodb_flush_log_at_trx_commit` and `sync_binlog` are global), so
//! `--relaxed` changes nothing there; the values in force are read back all the same.

use super::CliError;
use crate::store::mysql::MySqlStore;
use crate::store::postgres::PgStore;
use crate::store::sqlite::SqliteStore;
use crate::store::traced::Traced;
use crate::DynStore;
use sqlx::{MySqlPool, PgPool, SqlitePool};
use std::path::PathBuf;
use std::sync::Arc;

/// Where fresh databases are made.
#[derive(Debug, Clone)]
pub(super) enum Target {
    /// Temp files.
    Sqlite,
    /// Schemas on this server.
    Postgres(String),
    /// Databases on this MySQL / MariaDB server.
    Mysql(String),
}

enum Place {
    Sqlite {
        path: PathBuf,
        writer: SqlitePool,
    },
    Postgres {
        url: String,
        schema: String,
        pool: PgPool,
    },
    Mysql {
        url: String,
        name: String,
        pool: MySqlPool,
    },
}

/// A migrated, empty database for one workload.
pub(super) struct Fresh {
    /// The store, wrapped in [`Traced`] like every store [`crate::store::connect`] opens.
    pub(super) store: DynStore,
    /// `dockhand-sqlite`, `dockhand-postgres` or `dockhand-mysql`.
    pub(super) peer: &'static str,
    place: Place,
}

impl Fresh {
    /// Creates, opens and migrates a fresh database.
    pub(super) async fn open(target: &Target, relaxed: bool) -> Result<Fresh, CliError> {
        let fresh = match target {
            Target::Sqlite => {
                let path = std::env::temp_dir().join(format!(
                    "dockhand-bench-{}-{:016x}.db",
                    std::process::id(),
                    fastrand::u64(..)
                ));
                let url = format!("sqlite:{}", path.display());
                let store = SqliteStore::connect(&url).await?;
                let writer = store.pool().clone();
                if relaxed {
                    store.relax_synchronous().await?;
                }
                Fresh {
                    store: Traced::wrap(Arc::new(store)),
                    peer: "dockhand-sqlite",
                    place: Place::Sqlite { path, writer },
                }
            }
            Target::Postgres(url) => {
                let schema = format!("dh_bench_{:016x}", fastrand::u64(..));
                let session_url = if relaxed {
                    let sep = if url.contains('?') { '&' } else { '?' };
                    format!("{url}{sep}options[synchronous_commit]=off")
                } else {
                    url.clone()
                };
                let store = PgStore::connect_in_schema(&session_url, &schema).await?;
                let pool = store.pool().clone();
                Fresh {
                    store: Traced::wrap(Arc::new(store)),
                    peer: "dockhand-postgres",
                    place: Place::Postgres {
                        url: url.clone(),
                        schema,
                        pool,
                    },
                }
            }
            Target::Mysql(url) => {
                let name = format!("dh_bench_{:016x}", fastrand::u64(..));
                MySqlStore::create_database(url, &name).await?;
                let opened = match MySqlStore::url_for_database(url, &name) {
                    Ok(options) => {
                        MySqlStore::connect_with(
                            options,
                            crate::store::mysql::DEFAULT_MAX_CONNECTIONS,
                        )
                        .await
                    }
                    Err(e) => Err(e),
                };
                let store = match opened {
                    Ok(store) => store,
                    Err(e) => {
                        let _ = MySqlStore::drop_database(url, &name).await;
                        return Err(e.into());
                    }
                };
                let pool = store.pool().clone();
                Fresh {
                    store: Traced::wrap(Arc::new(store)),
                    peer: "dockhand-mysql",
                    place: Place::Mysql {
                        url: url.clone(),
                        name,
                        pool,
                    },
                }
            }
        };
        if let Err(e) = fresh.store.migrate().await {
            fresh.remove().await;
            return Err(e.into());
        }
        Ok(fresh)
    }

    /// The durability settings in force, read back from the database:
    /// `sqlite-<journal mode>-synchronous-<level>`, `pg-synchronous_commit-<value>` or
    /// `mysql-flush_log_at_trx_commit-<n>-sync_binlog-<n>`.
    pub(super) async fn durability(&self) -> Result<String, CliError> {
        match &self.place {
            Place::Sqlite { writer, .. } => {
                let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
                    .fetch_one(writer)
                    .await
                    .map_err(|e| failed("cannot read PRAGMA journal_mode", e))?;
                let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
                    .fetch_one(writer)
                    .await
                    .map_err(|e| failed("cannot read PRAGMA synchronous", e))?;
                let level = match sync {
                    0 => "off".to_string(),
                    1 => "normal".to_string(),
                    2 => "full".to_string(),
                    3 => "extra".to_string(),
                    other => other.to_string(),
                };
                Ok(format!(
                    "sqlite-{}-synchronous-{level}",
                    mode.to_ascii_lowercase()
                ))
            }
            Place::Postgres { pool, .. } => {
                let value: String = sqlx::query_scalar("SHOW synchronous_commit")
                    .fetch_one(pool)
                    .await
                    .map_err(|e| failed("cannot read synchronous_commit", e))?;
                Ok(format!("pg-synchronous_commit-{value}"))
            }
            Place::Mysql { pool, .. } => {
                let (flush, sync): (i64, i64) = sqlx::query_as(
                    "SELECT CAST(@@global.innodb_flush_log_at_trx_commit AS SIGNED),
                            CAST(@@global.sync_binlog AS SIGNED)",
                )
                .fetch_one(pool)
                .await
                .map_err(|e| {
                    failed(
                        "cannot read innodb_flush_log_at_trx_commit and sync_binlog",
                        e,
                    )
                })?;
                Ok(format!(
                    "mysql-flush_log_at_trx_commit-{flush}-sync_binlog-{sync}"
                ))
            }
        }
    }

    /// The file path or schema name (tests check that it is removed).
    #[cfg(test)]
    pub(super) fn location(&self) -> String {
        match &self.place {
            Place::Sqlite { path, .. } => path.display().to_string(),
            Place::Postgres { schema, .. } => schema.clone(),
            Place::Mysql { name, .. } => name.clone(),
        }
    }

    /// Closes the store and deletes the database; a failure is reported on stderr only.
    pub(super) async fn remove(self) {
        self.store.close().await;
        match self.place {
            Place::Sqlite { path, writer } => {
                writer.close().await;
                for suffix in ["", "-wal", "-shm"] {
                    let mut p = path.clone().into_os_string();
                    p.push(suffix);
                    let p = PathBuf::from(p);
                    match std::fs::remove_file(&p) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => eprintln!("warning: cannot delete {}: {e}", p.display()),
                    }
                }
            }
            Place::Postgres { url, schema, pool } => {
                pool.close().await;
                if let Err(e) = PgStore::drop_schema(&url, &schema).await {
                    eprintln!("warning: cannot drop schema {schema}: {e}");
                }
            }
            Place::Mysql { url, name, pool } => {
                pool.close().await;
                if let Err(e) = MySqlStore::drop_database(&url, &name).await {
                    eprintln!("warning: cannot drop database {name}: {e}");
                }
            }
        }
    }
}

fn failed(what: &str, e: sqlx::Error) -> CliError {
    CliError::Failed(format!("{what}: {e}"))
}
