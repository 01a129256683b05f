-- dockhand 0006: paused action groups. A claim skips the pending actions of a paused group
-- (running ones finish); resuming deletes the row. Few rows: a paused group is an operator's
-- decision (the dashboard's groups page).
CREATE TABLE dockhand_group_pauses (
    group_name  TEXT    PRIMARY KEY,
    paused_at   INTEGER NOT NULL,
    paused_by   TEXT    NOT NULL
);
