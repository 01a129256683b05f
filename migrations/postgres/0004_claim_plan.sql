-- dockhand 0004: a claim plan that does not depend on fresh statistics, and autovacuum tuned
-- for a queue table.
--
-- The claim picks due pending rows in (priority, scheduled_at, id) order. With stale or missing
-- statistics (a fresh table, or a burst of inserts after a quiet spell, before autovacuum has
-- analyzed) the planner guesses that a handful of rows are pending and prefers a bitmap scan of
-- every due row plus a sort, making each claim O(pending). This function runs the pick with
-- bitmap scans, sorts and sequential scans disabled, so it is always the ordered walk of the
-- partial claim index that stops after n rows. (SQLite 0004 moves the `created`/`started` log
-- rows into triggers; PostgreSQL writes them in the same statements with CTEs already.)
CREATE FUNCTION dockhand_due_ids(due timestamptz, n bigint, hooks text[])
RETURNS SETOF bigint
LANGUAGE sql VOLATILE
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_seqscan = off
AS $$
    SELECT id FROM dockhand_actions
    WHERE status = 'pending' AND scheduled_at <= due
      AND (hooks IS NULL OR hook = ANY(hooks))
    ORDER BY priority, scheduled_at, id
    LIMIT n
    FOR UPDATE SKIP LOCKED
$$;

-- Every claim and finish leaves a dead row version behind: vacuum and analyze the queue tables
-- after 1% of their rows changed instead of the default 20% / 10%.
ALTER TABLE dockhand_actions SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.01
);
ALTER TABLE dockhand_action_logs SET (autovacuum_vacuum_scale_factor = 0.05);
