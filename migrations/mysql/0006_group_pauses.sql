-- dockhand 0006: paused action groups. A claim skips the pending actions of a paused group
-- (running ones finish); resuming deletes the row. Few rows: a paused group is an operator's
-- decision (the dashboard's groups page). The claim reads them with a plain (non-locking)
-- SELECT before its FOR UPDATE SKIP LOCKED pick: inside that pick a locked pause row would be
-- skipped, and the group's actions claimed.
CREATE TABLE dockhand_group_pauses (
    group_name  VARCHAR(255)  NOT NULL PRIMARY KEY,
    paused_at   BIGINT        NOT NULL,
    paused_by   VARCHAR(255)  NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
