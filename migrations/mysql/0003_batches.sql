-- dockhand 0003: batch fan-out — the parent's batch fields and counters, and the worklist.
ALTER TABLE dockhand_jobs
    ADD COLUMN batch_state VARCHAR(16)
        CHECK (batch_state IS NULL OR batch_state IN ('scheduling', 'fenced')),
    ADD COLUMN batch_outcome VARCHAR(32)
        CHECK (batch_outcome IS NULL OR batch_outcome IN ('batch_schedule_failed', 'cancel_requested')),
    ADD COLUMN batch_contract TEXT,
    ADD COLUMN chunk_size INT,
    ADD COLUMN child_step INT,
    ADD COLUMN items_total INT NOT NULL DEFAULT 0,
    ADD COLUMN children_total INT NOT NULL DEFAULT 0,
    ADD COLUMN children_terminal INT NOT NULL DEFAULT 0,
    ADD COLUMN children_completed INT NOT NULL DEFAULT 0,
    ADD COLUMN children_failed INT NOT NULL DEFAULT 0,
    ADD COLUMN children_skipped INT NOT NULL DEFAULT 0;

-- One child per (parent, index); rows with a NULL parent (top-level jobs) are not constrained.
CREATE UNIQUE INDEX dockhand_jobs_child ON dockhand_jobs (parent_id, child_index);

CREATE TABLE dockhand_worklist (
    parent_id    BIGINT       NOT NULL,
    idx          INT          NOT NULL,
    payload_ref  TEXT         NOT NULL,
    sidecar      LONGTEXT     NOT NULL,
    state        VARCHAR(16)  NOT NULL DEFAULT 'ready'
                 CHECK (state IN ('ready', 'leased', 'completed', 'discarded')),
    lease_owner  TEXT,
    lease_until  BIGINT,
    attempts     INT          NOT NULL DEFAULT 0,
    child_id     BIGINT,
    error        TEXT,
    PRIMARY KEY (parent_id, idx),
    INDEX dockhand_worklist_ready (parent_id, state, idx)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
