-- dockhand 0019: on SQLite and PostgreSQL the hook index now holds pending actions only. MySQL
-- has no partial indexes (see 0018), so its schema does not change; this migration keeps the
-- numbers of the three backends in step.
DO 0;
