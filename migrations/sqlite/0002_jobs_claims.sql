-- dockhand 0002: jobs, their lifecycle outbox, content-addressed packets, item claims and the
-- tracked-items ledger. Times are INTEGER milliseconds since the Unix epoch (UTC).
CREATE TABLE dockhand_jobs (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline        TEXT    NOT NULL,
    status          TEXT    NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'processing', 'waiting', 'completed',
                                      'completed_no_items', 'skipped', 'failed', 'cancelled')),
    reason          TEXT,
    step_index      INTEGER NOT NULL DEFAULT 0,
    input_refs      TEXT    NOT NULL DEFAULT '[]',
    engine_data     TEXT    NOT NULL DEFAULT '{}',
    engine_version  INTEGER NOT NULL DEFAULT 0,
    parent_id       INTEGER,
    child_index     INTEGER,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    finished_at     INTEGER
);
CREATE INDEX dockhand_jobs_status ON dockhand_jobs (status, id);
CREATE INDEX dockhand_jobs_parent ON dockhand_jobs (parent_id) WHERE parent_id IS NOT NULL;

-- Lifecycle events written by the terminal bridge in its transaction, delivered after commit.
CREATE TABLE dockhand_job_events (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id        INTEGER NOT NULL,
    status        TEXT    NOT NULL,
    reason        TEXT,
    created_at    INTEGER NOT NULL,
    delivered_at  INTEGER
);
CREATE UNIQUE INDEX dockhand_job_events_job ON dockhand_job_events (job_id);
CREATE INDEX dockhand_job_events_undelivered ON dockhand_job_events (id)
    WHERE delivered_at IS NULL;

CREATE TABLE dockhand_packets (
    hash        TEXT    PRIMARY KEY,
    body        TEXT    NOT NULL,
    created_at  INTEGER NOT NULL
);

-- One row per item identity (scope, source_type, item_id); the hash is the index, the parts
-- are compared in full.
CREATE TABLE dockhand_item_claims (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    identity_hash  TEXT    NOT NULL UNIQUE,
    scope          TEXT    NOT NULL,
    source_type    TEXT    NOT NULL,
    item_id        TEXT    NOT NULL,
    status         TEXT    NOT NULL CHECK (status IN ('claimed', 'processed', 'deferred')),
    token          TEXT,
    job_id         INTEGER,
    completion     TEXT,
    claimed_at     INTEGER,
    expires_at     INTEGER,
    processed_at   INTEGER
);
CREATE INDEX dockhand_item_claims_job ON dockhand_item_claims (job_id) WHERE status = 'claimed';
CREATE INDEX dockhand_item_claims_scope ON dockhand_item_claims (scope, status);

-- The shipped completion handler's ledger (C8).
CREATE TABLE dockhand_tracked_items (
    namespace   TEXT    NOT NULL,
    item_id     TEXT    NOT NULL,
    revision    INTEGER NOT NULL,
    last_job    INTEGER,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (namespace, item_id)
);
