-- dockhand 0001: actions, their logs, schedules and maintenance leases (MySQL 8 / MariaDB 10.6+).
-- Times are BIGINT milliseconds since the Unix epoch (UTC); JSON is LONGTEXT parsed in Rust.
-- Every table is InnoDB with the binary utf8mb4 collation, so names compare case-sensitively.
-- MySQL has no partial indexes: uniqueness among active actions (Q6) lives in `active_key`, which
-- holds the unique key while the action is pending or running and is NULL otherwise (a UNIQUE
-- index ignores NULLs). It is VARBINARY so keys compare byte for byte (the PAD SPACE rule of
-- utf8mb4_bin would make keys differing only in trailing spaces collide). Keys are short
-- (at most 193 bytes: `k:` plus a 191-byte name), so they are indexed whole, never by prefix.
CREATE TABLE dockhand_actions (
    id            BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
    hook          VARCHAR(255)  NOT NULL,
    args          LONGTEXT      NOT NULL,
    group_name    VARCHAR(255),
    priority      INT           NOT NULL DEFAULT 10,
    status        VARCHAR(16)   NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'running', 'complete', 'failed', 'canceled')),
    scheduled_at  BIGINT        NOT NULL,
    attempt       INT           NOT NULL DEFAULT 0,
    max_attempts  INT           NOT NULL,
    timeout_ms    BIGINT,
    unique_key    VARCHAR(255),
    active_key    VARBINARY(255),
    lease_owner   TEXT,
    lease_token   BIGINT        NOT NULL DEFAULT 0,
    lease_until   BIGINT,
    created_at    BIGINT        NOT NULL,
    started_at    BIGINT,
    finished_at   BIGINT,
    last_error    LONGTEXT,
    schedule_id   BIGINT,
    -- Uniqueness among active actions (Q6).
    UNIQUE INDEX dockhand_actions_active_key (active_key),
    -- The claim order (Q3): matches WHERE status = 'pending' ORDER BY priority, scheduled_at, id.
    INDEX dockhand_actions_claim (status, priority, scheduled_at, id),
    INDEX dockhand_actions_lease (status, lease_until),
    INDEX dockhand_actions_finished (status, finished_at),
    INDEX dockhand_actions_hook (hook, status, scheduled_at),
    INDEX dockhand_actions_group (group_name, status),
    INDEX dockhand_actions_schedule (schedule_id, status),
    -- Lookups of a job's step/chunk/finalize actions by key (recovery).
    INDEX dockhand_actions_unique_key (unique_key, status)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE dockhand_action_logs (
    id         BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    action_id  BIGINT       NOT NULL,
    at         BIGINT       NOT NULL,
    event      VARCHAR(64)  NOT NULL,
    detail     LONGTEXT,
    INDEX dockhand_action_logs_action (action_id, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- `name` is VARBINARY (at most 191 bytes of UTF-8) so names differing only in trailing spaces
-- stay distinct.
CREATE TABLE dockhand_schedules (
    id            BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
    name          VARBINARY(255) NOT NULL,
    hook          VARCHAR(255)  NOT NULL,
    args          LONGTEXT      NOT NULL,
    group_name    VARCHAR(255),
    priority      INT           NOT NULL,
    max_attempts  INT           NOT NULL,
    timeout_ms    BIGINT,
    kind          VARCHAR(16)   NOT NULL CHECK (kind IN ('interval', 'cron')),
    interval_ms   BIGINT        CHECK (interval_ms IS NULL OR interval_ms > 0),
    fixed_delay   BOOLEAN       NOT NULL DEFAULT FALSE,
    cron_expr     TEXT,
    timezone      VARCHAR(255),
    next_run_at   BIGINT,
    enabled       BOOLEAN       NOT NULL DEFAULT TRUE,
    created_at    BIGINT        NOT NULL,
    updated_at    BIGINT        NOT NULL,
    UNIQUE INDEX dockhand_schedules_name (name),
    INDEX dockhand_schedules_due (enabled, next_run_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE dockhand_maintenance_leases (
    task   VARBINARY(255)  NOT NULL PRIMARY KEY,
    owner  TEXT            NOT NULL,
    until  BIGINT          NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
