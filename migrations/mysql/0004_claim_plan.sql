-- dockhand 0004: nothing to change on MySQL/MariaDB. The same number is used by SQLite (the
-- `created`/`started` log rows written by triggers) and PostgreSQL (a claim plan independent of
-- statistics, autovacuum thresholds for the queue tables). Here the claim's
-- `FOR UPDATE SKIP LOCKED` pick already walks the (status, priority, scheduled_at, id) index,
-- whose equality prefix InnoDB's optimizer does not trade for a sort, and the log rows are
-- written by multi-row inserts in the claim's transaction.
SELECT 1;
