-- dockhand 0014: SQLite writes the `completed` log row by trigger from this version on.
-- MySQL/MariaDB need no change (their completions write the log rows in the same
-- transaction). Kept so the three backends share migration numbers.
SELECT 1;
