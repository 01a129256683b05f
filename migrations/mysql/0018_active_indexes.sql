-- dockhand 0018: on SQLite and PostgreSQL the hook and group indexes became partial (active
-- actions only; grouped actions only), so claims and finishes move fewer index entries. MySQL
-- has no partial indexes, and its indexes lead with `status` by design (0005), so its schema
-- does not change; this migration keeps the numbers of the three backends in step.
DO 0;
