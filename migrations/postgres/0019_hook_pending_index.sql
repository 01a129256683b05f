-- dockhand 0019: the hook index holds pending actions only. Each claim writes a new version of
-- the row, with an entry in every index whose condition it meets; under 0018 a running version
-- met the hook index's, now it meets only the primary key's and the lease index's.
-- Same-minute A/B on W2: +5 % (docs/BENCHMARKS.md, session 19).
-- `(hook, scheduled_at)` of pending actions: next_scheduled / has_scheduled / unschedule by
-- hook and the pending tab filtered by hook. Running actions by hook are read through
-- `dockhand_actions_lease` (running actions only); finished ones through
-- `dockhand_actions_finished_by_status` (0005).
DROP INDEX IF EXISTS dockhand_actions_hook_active;
CREATE INDEX IF NOT EXISTS dockhand_actions_hook_pending ON dockhand_actions (hook, scheduled_at)
    WHERE status = 'pending';
