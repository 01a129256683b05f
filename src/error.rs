//! The crate's one error type.
//!
//! Every fallible public function returns [`Result`]. Errors name what was wrong: the field of a
//! bad input, the action id a store call was about, the database operation that failed.

/// The crate-wide result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in dockhand.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A caller-supplied value was rejected before anything was stored.
    #[error("invalid {field}: {message}")]
    InvalidInput {
        /// The name of the offending field (`hook`, `args`, `cron`, `timezone`, `interval`, ...).
        field: &'static str,
        /// What was wrong with it.
        message: String,
    },
    /// An action names a hook that has no registered handler.
    #[error("unknown hook `{hook}` (action {action_id})")]
    UnknownHook {
        /// The hook that has no handler.
        hook: String,
        /// The action that named it.
        action_id: i64,
    },
    /// An operator asked to cancel or delete an action its job owns (a step, finish, chunk or
    /// finalize action: `store::operator::JOB_OWNED_HOOKS`); that would leave the job with
    /// nothing to move it. The job's own commands stop it through the bridge.
    #[error(
        "action {action_id} (`{hook}`) belongs to job {job_id}: canceling or deleting it would \
         strand the job; cancel the job instead (`dockhand cancel-job {job_id}`, `Jobs::cancel`)"
    )]
    OwnedByJob {
        /// The action.
        action_id: i64,
        /// Its hook.
        hook: String,
        /// The job that owns it (for a chunk or finalize action, the batch parent).
        job_id: i64,
    },
    /// A record that the caller named does not exist.
    #[error("{what} {id} not found")]
    NotFound {
        /// What kind of record (`action`, `schedule`).
        what: &'static str,
        /// Its id.
        id: i64,
    },
    /// A database statement failed.
    #[error("database error during {op}: {source}")]
    Database {
        /// The store operation that failed (e.g. `claim`, `enqueue`).
        op: &'static str,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// Applying the schema migrations failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The database was opened but does not have the settings dockhand needs.
    #[error("database configuration: {0}")]
    Config(String),
    /// A stored row could not be decoded (corrupt or foreign data).
    #[error("corrupt row for {what} {id}: {message}")]
    Corrupt {
        /// What kind of record.
        what: &'static str,
        /// Its id.
        id: i64,
        /// What could not be decoded.
        message: String,
    },
    /// The database could not be reached or opened: a refused connection, a host name that did
    /// not resolve, a connect timeout, a SQLite file that cannot be opened.
    #[error("{reason}")]
    Connect {
        /// What was being connected to (`HOST:PORT`, or `SQLite database PATH`); never carries
        /// credentials.
        target: String,
        /// The whole message, naming the target: `connection to HOST:PORT refused`, `host H did
        /// not resolve (connecting to H:PORT)`, `SQLite database PATH does not exist`, ...
        reason: String,
    },
    /// A write on behalf of an action run was refused because the run no longer holds its
    /// lease (the reaper expired it, or a newer attempt claimed the action): the stale run
    /// must stop without side effects.
    #[error("action {action_id} no longer holds lease token {token}: a newer attempt or the reaper took it")]
    LeaseLost {
        /// The action whose run lost its lease.
        action_id: i64,
        /// The fencing token the stale run presented.
        token: i64,
    },
    /// A completion handler failed with a transient error (deadlock, serialization failure,
    /// lost connection) in every attempt the store made; everything it wrote was rolled back.
    /// A later retry may succeed: this is not a verdict on the item.
    #[error(
        "completion handler for item {item_id} (job {job_id:?}) failed transiently: {message}"
    )]
    TransientCompletion {
        /// The item whose claim was being completed.
        item_id: String,
        /// The job owning the claim.
        job_id: Option<i64>,
        /// What the handler reported.
        message: String,
    },
}

impl Error {
    /// Shorthand for an [`Error::InvalidInput`].
    pub fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidInput {
            field,
            message: message.into(),
        }
    }

    /// Wraps a driver error with the name of the store operation it came from.
    pub fn db(op: &'static str) -> impl FnOnce(sqlx::Error) -> Self {
        move |source| Error::Database { op, source }
    }

    /// True when retrying cannot help: the database refuses the write for good (a read-only
    /// SQLite file or file system, a read-only PostgreSQL transaction or server, a MySQL
    /// `--read-only` server, a permission denied), or it could not be opened at all. A worker
    /// meeting one should stop and say why rather than retry forever. Never true for an error
    /// [`Error::is_transient`] accepts.
    pub fn is_permanent(&self) -> bool {
        match self {
            Error::Connect { .. } | Error::Config(_) => true,
            Error::Database {
                source: sqlx::Error::Database(db),
                ..
            } if !self.is_transient() => {
                let mysql_number = db
                    .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                    .map(|e| e.number());
                // MySQL: read-only server (1290 --read-only, 1836 read-only mode),
                // access denied (1142 table, 1044 database, 1045 login).
                matches!(mysql_number, Some(1290 | 1836 | 1142 | 1044 | 1045))
                    || matches!(
                        db.code().as_deref(),
                        // SQLite READONLY and its extended codes (8, 264 recovery, 520
                        // cantlock, 776 rollback, 1032 dbmoved, 1288 cantinit, 1544
                        // directory), CANTOPEN (14), PERM (3), AUTH (23); PostgreSQL
                        // read-only transaction, insufficient privilege.
                        Some(
                            "8" | "264"
                                | "520"
                                | "776"
                                | "1032"
                                | "1288"
                                | "1544"
                                | "14"
                                | "3"
                                | "23"
                                | "25006"
                                | "42501"
                        )
                    )
            }
            _ => false,
        }
    }

    /// True when the error is a transient database condition (busy, deadlock, serialization
    /// failure, lost connection) that a retry may clear.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::TransientCompletion { .. } => true,
            Error::Database { source, .. } => match source {
                sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
                sqlx::Error::Database(db) => {
                    // MySQL reports SQLSTATE in `code()` ("HY000" for a lock wait timeout):
                    // its error number tells deadlock (1213) and lock wait timeout (1205).
                    let mysql_number = db
                        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                        .map(|e| e.number());
                    matches!(mysql_number, Some(1213) | Some(1205))
                        || matches!(
                            db.code().as_deref(),
                            // SQLite busy/locked, Postgres serialization failure/deadlock,
                            // Postgres backend terminated or server restarting (the pooled
                            // connection is gone; a new one works).
                            Some("5")
                                | Some("6")
                                | Some("517")
                                | Some("40001")
                                | Some("40P01")
                                | Some("57P01")
                                | Some("57P02")
                                | Some("57P03")
                        )
                }
                _ => false,
            },
            _ => false,
        }
    }

    /// True when the failed store transaction certainly rolled back and running it again
    /// whole may succeed: a deadlock, a serialization failure or lock wait timeout, or a
    /// completion handler's transient failure. (Unlike [`Error::is_transient`], not a lost
    /// connection: a commit whose acknowledgement was lost may have taken effect.)
    pub(crate) fn reruns_transaction(&self) -> bool {
        match self {
            Error::TransientCompletion { .. } => true,
            Error::Database {
                source: sqlx::Error::Database(db),
                ..
            } => {
                let mysql_number = db
                    .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                    .map(|e| e.number());
                matches!(mysql_number, Some(1213) | Some(1205))
                    || (mysql_number.is_none()
                        && matches!(db.code().as_deref(), Some("40001") | Some("40P01")))
            }
            _ => false,
        }
    }
}
