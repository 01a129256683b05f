-- dockhand 0016: group limits (issue 17 item 4). At most `max_running` running actions of a
-- group across every runner, and at most `rate_count` starts in any window of
-- `rate_period_ms`; `rate_log` is the rate's record of the group's most recent starts
-- (JSON `[[time_ms, starts], ...]`, src/limits.rs). The claim statement leaves the groups
-- named here out of its ordinary pick; the limited claim (src/store/sqlite/limits.rs) takes
-- each one's share in the same write transaction. Few rows: limits are an operator's choice.
CREATE TABLE dockhand_group_limits (
    group_name      TEXT    PRIMARY KEY,
    max_running     INTEGER,
    rate_count      INTEGER,
    rate_period_ms  INTEGER,
    rate_log        TEXT,
    set_at          INTEGER NOT NULL,
    set_by          TEXT    NOT NULL,
    CHECK (max_running IS NOT NULL OR rate_count IS NOT NULL),
    CHECK ((rate_count IS NULL) = (rate_period_ms IS NULL))
);
