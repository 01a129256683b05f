-- dockhand 0002: jobs, their lifecycle outbox, content-addressed packets, item claims and the
-- tracked-items ledger.
CREATE TABLE dockhand_jobs (
    id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pipeline        TEXT        NOT NULL,
    status          TEXT        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'processing', 'waiting', 'completed',
                                      'completed_no_items', 'skipped', 'failed', 'cancelled')),
    reason          TEXT,
    step_index      INTEGER     NOT NULL DEFAULT 0,
    input_refs      JSONB       NOT NULL DEFAULT '[]',
    engine_data     JSONB       NOT NULL DEFAULT '{}',
    engine_version  BIGINT      NOT NULL DEFAULT 0,
    parent_id       BIGINT,
    child_index     INTEGER,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL,
    finished_at     TIMESTAMPTZ
);
CREATE INDEX dockhand_jobs_status ON dockhand_jobs (status, id);
CREATE INDEX dockhand_jobs_parent ON dockhand_jobs (parent_id) WHERE parent_id IS NOT NULL;

-- Lifecycle events written by the terminal bridge in its transaction, delivered after commit.
CREATE TABLE dockhand_job_events (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id        BIGINT      NOT NULL,
    status        TEXT        NOT NULL,
    reason        TEXT,
    created_at    TIMESTAMPTZ NOT NULL,
    delivered_at  TIMESTAMPTZ
);
CREATE UNIQUE INDEX dockhand_job_events_job ON dockhand_job_events (job_id);
CREATE INDEX dockhand_job_events_undelivered ON dockhand_job_events (id)
    WHERE delivered_at IS NULL;

CREATE TABLE dockhand_packets (
    hash        TEXT        PRIMARY KEY,
    body        TEXT        NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL
);

-- One row per item identity (scope, source_type, item_id); the hash is the index, the parts
-- are compared in full.
CREATE TABLE dockhand_item_claims (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    identity_hash  TEXT        NOT NULL UNIQUE,
    scope          TEXT        NOT NULL,
    source_type    TEXT        NOT NULL,
    item_id        TEXT        NOT NULL,
    status         TEXT        NOT NULL CHECK (status IN ('claimed', 'processed', 'deferred')),
    token          TEXT,
    job_id         BIGINT,
    completion     JSONB,
    claimed_at     TIMESTAMPTZ,
    expires_at     TIMESTAMPTZ,
    processed_at   TIMESTAMPTZ
);
CREATE INDEX dockhand_item_claims_job ON dockhand_item_claims (job_id) WHERE status = 'claimed';
CREATE INDEX dockhand_item_claims_scope ON dockhand_item_claims (scope, status);

-- The shipped completion handler's ledger (C8).
CREATE TABLE dockhand_tracked_items (
    namespace   TEXT        NOT NULL,
    item_id     TEXT        NOT NULL,
    revision    BIGINT      NOT NULL,
    last_job    BIGINT,
    updated_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (namespace, item_id)
);
