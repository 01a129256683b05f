-- dockhand 0002: jobs, their lifecycle outbox, content-addressed packets, item claims and the
-- tracked-items ledger. Times are BIGINT milliseconds since the Unix epoch (UTC); JSON is
-- LONGTEXT parsed in Rust. Binary collation everywhere: names, identities and tokens compare
-- exactly (case- and trailing-space-sensitive). MySQL has no partial indexes: a UNIQUE index
-- over nullable columns ignores rows with a NULL part, which is what the partial indexes of the
-- other backends express.
CREATE TABLE dockhand_jobs (
    id              BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    pipeline        TEXT         NOT NULL,
    status          VARCHAR(32)  NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'processing', 'waiting', 'completed',
                                      'completed_no_items', 'skipped', 'failed', 'cancelled')),
    reason          TEXT,
    step_index      INT          NOT NULL DEFAULT 0,
    input_refs      LONGTEXT     NOT NULL,
    engine_data     LONGTEXT     NOT NULL,
    engine_version  BIGINT       NOT NULL DEFAULT 0,
    parent_id       BIGINT,
    child_index     INT,
    created_at      BIGINT       NOT NULL,
    updated_at      BIGINT       NOT NULL,
    finished_at     BIGINT,
    INDEX dockhand_jobs_status (status, id),
    INDEX dockhand_jobs_parent (parent_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Lifecycle events written by the terminal bridge in its transaction, delivered after commit.
CREATE TABLE dockhand_job_events (
    id            BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    job_id        BIGINT       NOT NULL,
    status        VARCHAR(32)  NOT NULL,
    reason        TEXT,
    created_at    BIGINT       NOT NULL,
    delivered_at  BIGINT,
    UNIQUE INDEX dockhand_job_events_job (job_id),
    INDEX dockhand_job_events_undelivered (delivered_at, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Keyed by the sha256 hex of the canonical body.
CREATE TABLE dockhand_packets (
    hash        CHAR(64)     NOT NULL PRIMARY KEY,
    body        LONGTEXT     NOT NULL,
    created_at  BIGINT       NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- One row per item identity (scope, source_type, item_id); the hash (sha256 hex of the
-- length-prefixed parts) is the unique index, the parts are compared in full.
CREATE TABLE dockhand_item_claims (
    id             BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    identity_hash  CHAR(64)     NOT NULL,
    scope          VARCHAR(191) NOT NULL,
    source_type    VARCHAR(191) NOT NULL,
    item_id        LONGTEXT     NOT NULL,
    status         VARCHAR(16)  NOT NULL CHECK (status IN ('claimed', 'processed', 'deferred')),
    token          VARCHAR(255),
    job_id         BIGINT,
    completion     LONGTEXT,
    claimed_at     BIGINT,
    expires_at     BIGINT,
    processed_at   BIGINT,
    UNIQUE INDEX dockhand_item_claims_identity (identity_hash),
    INDEX dockhand_item_claims_job (job_id, status),
    INDEX dockhand_item_claims_scope (scope, status)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The shipped completion handler's ledger (C8). One row per (namespace, item_id); the key is
-- the sha256 hex of the length-prefixed parts, the parts are compared in full.
CREATE TABLE dockhand_tracked_items (
    item_hash   CHAR(64)     NOT NULL PRIMARY KEY,
    namespace   TEXT         NOT NULL,
    item_id     LONGTEXT     NOT NULL,
    revision    BIGINT       NOT NULL,
    last_job    BIGINT,
    updated_at  BIGINT       NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
