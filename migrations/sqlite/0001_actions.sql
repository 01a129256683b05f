-- dockhand 0001: actions, their logs, schedules and maintenance leases.
-- Times are INTEGER milliseconds since the Unix epoch (UTC).
CREATE TABLE dockhand_actions (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    hook          TEXT    NOT NULL,
    args          TEXT    NOT NULL,
    group_name    TEXT,
    priority      INTEGER NOT NULL DEFAULT 10,
    status        TEXT    NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'running', 'complete', 'failed', 'canceled')),
    scheduled_at  INTEGER NOT NULL,
    attempt       INTEGER NOT NULL DEFAULT 0,
    max_attempts  INTEGER NOT NULL,
    timeout_ms    INTEGER,
    unique_key    TEXT,
    lease_owner   TEXT,
    lease_token   INTEGER NOT NULL DEFAULT 0,
    lease_until   INTEGER,
    created_at    INTEGER NOT NULL,
    started_at    INTEGER,
    finished_at   INTEGER,
    last_error    TEXT,
    schedule_id   INTEGER
);

-- The claim order (Q3): a partial index matching ORDER BY priority, scheduled_at, id.
CREATE INDEX dockhand_actions_claim ON dockhand_actions (priority, scheduled_at, id)
    WHERE status = 'pending';
-- Uniqueness among active actions (Q6).
CREATE UNIQUE INDEX dockhand_actions_unique ON dockhand_actions (unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'running');
CREATE INDEX dockhand_actions_lease ON dockhand_actions (lease_until) WHERE status = 'running';
CREATE INDEX dockhand_actions_finished ON dockhand_actions (finished_at)
    WHERE status IN ('complete', 'failed', 'canceled');
CREATE INDEX dockhand_actions_hook ON dockhand_actions (hook, status, scheduled_at);
CREATE INDEX dockhand_actions_group ON dockhand_actions (group_name, status);
CREATE INDEX dockhand_actions_schedule ON dockhand_actions (schedule_id, status)
    WHERE schedule_id IS NOT NULL;

CREATE TABLE dockhand_action_logs (
    id         INTEGER PRIMARY KEY,
    action_id  INTEGER NOT NULL,
    at         INTEGER NOT NULL,
    event      TEXT    NOT NULL,
    detail     TEXT
);
CREATE INDEX dockhand_action_logs_action ON dockhand_action_logs (action_id, id);

CREATE TABLE dockhand_schedules (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    name          TEXT    NOT NULL UNIQUE,
    hook          TEXT    NOT NULL,
    args          TEXT    NOT NULL,
    group_name    TEXT,
    priority      INTEGER NOT NULL,
    max_attempts  INTEGER NOT NULL,
    timeout_ms    INTEGER,
    kind          TEXT    NOT NULL CHECK (kind IN ('interval', 'cron')),
    interval_ms   INTEGER CHECK (interval_ms IS NULL OR interval_ms > 0),
    fixed_delay   INTEGER NOT NULL DEFAULT 0,
    cron_expr     TEXT,
    timezone      TEXT,
    next_run_at   INTEGER,
    enabled       INTEGER NOT NULL DEFAULT 1,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
);
CREATE INDEX dockhand_schedules_due ON dockhand_schedules (next_run_at) WHERE enabled = 1;

CREATE TABLE dockhand_maintenance_leases (
    task   TEXT    PRIMARY KEY,
    owner  TEXT    NOT NULL,
    until  INTEGER NOT NULL
);
