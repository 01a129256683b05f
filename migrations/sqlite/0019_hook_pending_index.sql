-- dockhand 0019: the hook index holds pending actions only. Under 0018 it held pending and
-- running ones, so a claim rewrote the row's entry (SQLite updates a partial index whenever a
-- column of its condition changes) and a finish deleted it; now a claim deletes it and a finish
-- does not touch it. Same-minute A/B on W2: +9 % (docs/BENCHMARKS.md, session 19).
-- `(hook, scheduled_at)` of pending actions: next_scheduled / has_scheduled / unschedule by
-- hook and the pending tab filtered by hook (each names the condition `status = 'pending'`, so
-- the planner may use it). Running actions by hook are read through `dockhand_actions_lease`
-- (running actions only: at most the slots of the runners at work); finished ones through
-- `dockhand_actions_finished_by_status` (0005).
DROP INDEX IF EXISTS dockhand_actions_hook_active;
CREATE INDEX dockhand_actions_hook_pending ON dockhand_actions (hook, scheduled_at)
    WHERE status = 'pending';
