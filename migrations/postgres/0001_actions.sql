-- dockhand 0001: actions, their logs, schedules and maintenance leases.
CREATE TABLE dockhand_actions (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    hook          TEXT        NOT NULL,
    args          JSONB       NOT NULL,
    group_name    TEXT,
    priority      INTEGER     NOT NULL DEFAULT 10,
    status        TEXT        NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'running', 'complete', 'failed', 'canceled')),
    scheduled_at  TIMESTAMPTZ NOT NULL,
    attempt       INTEGER     NOT NULL DEFAULT 0,
    max_attempts  INTEGER     NOT NULL,
    timeout_ms    BIGINT,
    unique_key    TEXT,
    lease_owner   TEXT,
    lease_token   BIGINT      NOT NULL DEFAULT 0,
    lease_until   TIMESTAMPTZ,
    created_at    TIMESTAMPTZ NOT NULL,
    started_at    TIMESTAMPTZ,
    finished_at   TIMESTAMPTZ,
    last_error    TEXT,
    schedule_id   BIGINT
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
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action_id  BIGINT      NOT NULL,
    at         TIMESTAMPTZ NOT NULL,
    event      TEXT        NOT NULL,
    detail     TEXT
);
CREATE INDEX dockhand_action_logs_action ON dockhand_action_logs (action_id, id);

CREATE TABLE dockhand_schedules (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name          TEXT        NOT NULL UNIQUE,
    hook          TEXT        NOT NULL,
    args          JSONB       NOT NULL,
    group_name    TEXT,
    priority      INTEGER     NOT NULL,
    max_attempts  INTEGER     NOT NULL,
    timeout_ms    BIGINT,
    kind          TEXT        NOT NULL CHECK (kind IN ('interval', 'cron')),
    interval_ms   BIGINT      CHECK (interval_ms IS NULL OR interval_ms > 0),
    fixed_delay   BOOLEAN     NOT NULL DEFAULT FALSE,
    cron_expr     TEXT,
    timezone      TEXT,
    next_run_at   TIMESTAMPTZ,
    enabled       BOOLEAN     NOT NULL DEFAULT TRUE,
    created_at    TIMESTAMPTZ NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL
);
CREATE INDEX dockhand_schedules_due ON dockhand_schedules (next_run_at) WHERE enabled;

CREATE TABLE dockhand_maintenance_leases (
    task   TEXT        PRIMARY KEY,
    owner  TEXT        NOT NULL,
    until  TIMESTAMPTZ NOT NULL
);
