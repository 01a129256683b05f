-- dockhand 0003: batch fan-out — the parent's batch fields and counters, and the worklist.
ALTER TABLE dockhand_jobs ADD COLUMN batch_state TEXT
    CHECK (batch_state IS NULL OR batch_state IN ('scheduling', 'fenced'));
ALTER TABLE dockhand_jobs ADD COLUMN batch_outcome TEXT
    CHECK (batch_outcome IS NULL OR batch_outcome IN ('batch_schedule_failed', 'cancel_requested'));
ALTER TABLE dockhand_jobs ADD COLUMN batch_contract TEXT;
ALTER TABLE dockhand_jobs ADD COLUMN chunk_size INTEGER;
ALTER TABLE dockhand_jobs ADD COLUMN child_step INTEGER;
ALTER TABLE dockhand_jobs ADD COLUMN items_total INTEGER NOT NULL DEFAULT 0;
ALTER TABLE dockhand_jobs ADD COLUMN children_total INTEGER NOT NULL DEFAULT 0;
ALTER TABLE dockhand_jobs ADD COLUMN children_terminal INTEGER NOT NULL DEFAULT 0;
ALTER TABLE dockhand_jobs ADD COLUMN children_completed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE dockhand_jobs ADD COLUMN children_failed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE dockhand_jobs ADD COLUMN children_skipped INTEGER NOT NULL DEFAULT 0;
CREATE UNIQUE INDEX dockhand_jobs_child ON dockhand_jobs (parent_id, child_index)
    WHERE parent_id IS NOT NULL;

CREATE TABLE dockhand_worklist (
    parent_id    INTEGER NOT NULL,
    idx          INTEGER NOT NULL,
    payload_ref  TEXT    NOT NULL,
    sidecar      TEXT    NOT NULL DEFAULT '[]',
    state        TEXT    NOT NULL DEFAULT 'ready'
                 CHECK (state IN ('ready', 'leased', 'completed', 'discarded')),
    lease_owner  TEXT,
    lease_until  INTEGER,
    attempts     INTEGER NOT NULL DEFAULT 0,
    child_id     INTEGER,
    error        TEXT,
    PRIMARY KEY (parent_id, idx)
);
CREATE INDEX dockhand_worklist_ready ON dockhand_worklist (parent_id, state, idx);
