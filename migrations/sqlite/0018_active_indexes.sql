-- dockhand 0018: the hook and group indexes hold only the rows their queries read, so that a
-- claim and a finish move fewer index entries. Both indexes led with a column that changes on
-- every transition (`status`), so each claim and each finish deleted and re-inserted an entry
-- in each: with them dropped, W2 on SQLite ran 26-47 % faster; with these, 19 %
-- (docs/BENCHMARKS.md, session 18).
-- `(hook, scheduled_at)` of pending and running actions: next_scheduled / has_scheduled /
-- unschedule by hook and the dashboard's pending and running tabs filtered by hook (those
-- queries name the index's condition, `status IN ('pending', 'running')`, so the planner may
-- use it). A claim leaves its entry where it is; a finish removes it. Finished actions
-- filtered by hook walk `dockhand_actions_finished_by_status` (0005).
DROP INDEX IF EXISTS dockhand_actions_hook;
CREATE INDEX dockhand_actions_hook_active ON dockhand_actions (hook, scheduled_at)
    WHERE status IN ('pending', 'running');
-- `(group_name, status, scheduled_at)` of grouped actions only: every query that reads it names
-- a group (`group_name = ?` or `>`, which imply NOT NULL), so an ungrouped action has no entry.
DROP INDEX IF EXISTS dockhand_actions_group_sched;
CREATE INDEX dockhand_actions_group_sched ON dockhand_actions (group_name, status, scheduled_at)
    WHERE group_name IS NOT NULL;
