-- dockhand 0005: one index per sort order of the operator dashboard (docs/dashboard_plan.md §2),
-- so every list page is a range walk from its cursor, never a sort of the whole table. MySQL has
-- no partial indexes: each index leads with `status` instead, and InnoDB appends the primary key
-- to every secondary index, so `(status, x)` already orders ties by id. Of the sort orders,
-- next-to-run (`dockhand_actions_claim`), lease (`dockhand_actions_lease`) and finished
-- (`dockhand_actions_finished`, `(status, finished_at)`: also the throughput chart and
-- retention) exist since 0001. ALTER TABLE … ADD/DROP INDEX is online DDL.
ALTER TABLE dockhand_actions
    -- `(status, scheduled_at, id)`: the "scheduled" order of the pending tab.
    ADD INDEX dockhand_actions_status_sched (status, scheduled_at, id),
    -- `(group_name, status, scheduled_at)`: a group's lists and lag; it replaces
    -- `(group_name, status)`.
    ADD INDEX dockhand_actions_group_sched (group_name, status, scheduled_at),
    DROP INDEX dockhand_actions_group;
-- A job's step, chunk and finalize actions by key range use `dockhand_actions_unique_key`
-- (`(unique_key, status)`, since 0001). Batch parents, newest first, without walking children:
ALTER TABLE dockhand_jobs ADD INDEX dockhand_jobs_batch (batch_state, id);
