-- dockhand 0016: group limits (issue 17 item 4). At most `max_running` running actions of a
-- group across every runner, and at most `rate_count` starts in any window of
-- `rate_period_ms`; `rate_log` is the rate's record of the group's most recent starts
-- (JSON `[[time_ms, starts], ...]`, src/limits.rs). A claim that takes actions of a limited
-- group locks that group's row (FOR UPDATE), so claimers of one limited group are serialised
-- and claimers of other groups are not (src/store/mysql/limits.rs).
CREATE TABLE dockhand_group_limits (
    group_name      VARCHAR(255)  NOT NULL PRIMARY KEY,
    max_running     INT           NULL,
    rate_count      INT           NULL,
    rate_period_ms  BIGINT        NULL,
    rate_log        MEDIUMTEXT    NULL,
    set_at          BIGINT        NOT NULL,
    set_by          VARCHAR(255)  NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
