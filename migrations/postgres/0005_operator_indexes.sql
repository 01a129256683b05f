-- dockhand 0005: one index per sort order of the operator dashboard (docs/dashboard_plan.md §2),
-- so every list page is a range walk from its cursor, never a sort of the whole table.
-- sqlx runs a migration in a transaction, so these are plain CREATE INDEX; operators with huge
-- tables may pre-create them CONCURRENTLY under the same names (IF NOT EXISTS then skips them).
-- `(scheduled_at, id)` of pending actions: the "scheduled" order of the pending tab.
CREATE INDEX IF NOT EXISTS dockhand_actions_pending_sched ON dockhand_actions (scheduled_at, id)
    WHERE status = 'pending';
-- `(status, finished_at, id)` of finished actions: the finished tabs (latest first), the
-- throughput chart and retention; it replaces the `(finished_at)` index of 0001.
CREATE INDEX IF NOT EXISTS dockhand_actions_finished_by_status
    ON dockhand_actions (status, finished_at, id) WHERE finished_at IS NOT NULL;
DROP INDEX IF EXISTS dockhand_actions_finished;
-- `(group_name, status, scheduled_at)`: a group's lists and lag; it replaces `(group_name, status)`.
CREATE INDEX IF NOT EXISTS dockhand_actions_group_sched
    ON dockhand_actions (group_name, status, scheduled_at);
DROP INDEX IF EXISTS dockhand_actions_group;
-- Keyed actions whatever their status: a job's step (`j:{id}:…`), chunk (`b:{id}:…`) and
-- finalize (`f:{id}`) actions for the job page (the unique index of 0001 holds active ones only).
CREATE INDEX IF NOT EXISTS dockhand_actions_key ON dockhand_actions (unique_key)
    WHERE unique_key IS NOT NULL;
-- Batch parents, newest first, without walking their children.
CREATE INDEX IF NOT EXISTS dockhand_jobs_batch ON dockhand_jobs (id) WHERE batch_state IS NOT NULL;
