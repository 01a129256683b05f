-- dockhand 0009: claim routing. Runtimes with different pipeline sets share one database: a
-- runner claims the job engine's actions (step, finish, chunk, finalize) only from the groups
-- of the pipelines it has (`pipeline:<name>`; `dockhand.batch` for chunk and finalize), so it
-- never claims and fails a job of a pipeline it lacks (issue 15, defect 12). Step actions
-- have carried their pipeline's group since 0002, so rows enqueued before this migration are
-- routed too.
--
-- The pick of 0006 with one more filter on the ordered scan of the claim index (rows of a
-- routed hook outside `routed_groups` are skipped like a paused group's); `routed_hooks`
-- NULL: no routing. The three-argument function of 0006 stays for binaries built before
-- 0009 during a rolling upgrade.
CREATE FUNCTION dockhand_due_ids(due timestamptz, n bigint, hooks text[],
                                 routed_hooks text[], routed_groups text[])
RETURNS SETOF bigint
LANGUAGE sql VOLATILE
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_seqscan = off
AS $$
    SELECT id FROM dockhand_actions a
    WHERE status = 'pending' AND scheduled_at <= due
      AND (hooks IS NULL OR hook = ANY(hooks))
      AND (routed_hooks IS NULL OR hook <> ALL(routed_hooks)
           OR a.group_name = ANY(routed_groups))
      AND (a.group_name IS NULL
           OR NOT EXISTS (SELECT 1 FROM dockhand_group_pauses p WHERE p.group_name = a.group_name))
    ORDER BY priority, scheduled_at, id
    LIMIT n
    FOR UPDATE SKIP LOCKED
$$;
