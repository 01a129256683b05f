-- dockhand 0006: paused action groups. A claim skips the pending actions of a paused group
-- (running ones finish); resuming deletes the row. Few rows: a paused group is an operator's
-- decision (the dashboard's groups page).
CREATE TABLE dockhand_group_pauses (
    group_name  TEXT        PRIMARY KEY,
    paused_at   TIMESTAMPTZ NOT NULL,
    paused_by   TEXT        NOT NULL
);

-- The claim pick of 0004 with the paused groups left out. The sub-select is not locked by
-- FOR UPDATE (only the FROM table is), so a pause row never makes a claim skip or wait.
CREATE OR REPLACE FUNCTION dockhand_due_ids(due timestamptz, n bigint, hooks text[])
RETURNS SETOF bigint
LANGUAGE sql VOLATILE
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_seqscan = off
AS $$
    SELECT id FROM dockhand_actions a
    WHERE status = 'pending' AND scheduled_at <= due
      AND (hooks IS NULL OR hook = ANY(hooks))
      AND (a.group_name IS NULL
           OR NOT EXISTS (SELECT 1 FROM dockhand_group_pauses p WHERE p.group_name = a.group_name))
    ORDER BY priority, scheduled_at, id
    LIMIT n
    FOR UPDATE SKIP LOCKED
$$;
