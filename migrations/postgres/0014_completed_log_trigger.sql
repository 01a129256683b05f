-- dockhand 0014: SQLite writes the `completed` log row by trigger from this version on.
-- PostgreSQL needs no change: its completions already write their log rows in the same
-- statement (a data-modifying CTE). Kept so the three backends share migration numbers.
SELECT 1;
