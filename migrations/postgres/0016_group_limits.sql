-- dockhand 0016: group limits (issue 17 item 4). At most `max_running` running actions of a
-- group across every runner, and at most `rate_count` starts in any window of
-- `rate_period_ms`; `rate_log` is the rate's record of the group's most recent starts
-- (JSON `[[time_ms, starts], ...]`, src/limits.rs). A claim that takes actions of a limited
-- group locks that group's row (FOR UPDATE), so claimers of one limited group are serialised
-- and claimers of other groups are not (src/store/postgres/limits.rs).
CREATE TABLE dockhand_group_limits (
    group_name      TEXT        PRIMARY KEY,
    max_running     INTEGER,
    rate_count      INTEGER,
    rate_period_ms  BIGINT,
    rate_log        TEXT,
    set_at          TIMESTAMPTZ NOT NULL,
    set_by          TEXT        NOT NULL,
    CHECK (max_running IS NOT NULL OR rate_count IS NOT NULL),
    CHECK ((rate_count IS NULL) = (rate_period_ms IS NULL))
);

-- The claim pick of 0009 with the limited groups left out as well (the limited claim takes
-- their shares under their row locks). Like the pause rows, a limit row in the sub-select is
-- never locked by the pick's FOR UPDATE, so it never makes an ordinary claim skip or wait.
CREATE OR REPLACE FUNCTION dockhand_due_ids(due timestamptz, n bigint, hooks text[],
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
           OR (NOT EXISTS (SELECT 1 FROM dockhand_group_pauses p WHERE p.group_name = a.group_name)
               AND NOT EXISTS (SELECT 1 FROM dockhand_group_limits l
                               WHERE l.group_name = a.group_name)))
    ORDER BY priority, scheduled_at, id
    LIMIT n
    FOR UPDATE SKIP LOCKED
$$;
