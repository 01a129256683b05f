-- dockhand 0018: the hook and group indexes hold only the rows their queries read. Every
-- UPDATE of an action that changes an indexed column (`status` on each claim and finish) writes
-- a new entry into every index whose condition the new row version meets; finished versions
-- and ungrouped actions now meet neither of these.
-- `(hook, scheduled_at)` of pending and running actions: next_scheduled / has_scheduled /
-- unschedule by hook and the dashboard's pending and running tabs filtered by hook. Finished
-- actions filtered by hook walk `dockhand_actions_finished_by_status` (0005).
DROP INDEX IF EXISTS dockhand_actions_hook;
CREATE INDEX IF NOT EXISTS dockhand_actions_hook_active ON dockhand_actions (hook, scheduled_at)
    WHERE status IN ('pending', 'running');
-- `(group_name, status, scheduled_at)` of grouped actions only: every query that reads it names
-- a group.
DROP INDEX IF EXISTS dockhand_actions_group_sched;
CREATE INDEX IF NOT EXISTS dockhand_actions_group_sched
    ON dockhand_actions (group_name, status, scheduled_at) WHERE group_name IS NOT NULL;
