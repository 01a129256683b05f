-- dockhand 0020: on SQLite and PostgreSQL a claim no longer stores the `started` log row (the
-- log queries read the latest attempt's entry from the action's row). MySQL still stores it;
-- this migration keeps the numbers of the three backends in step.
DO 0;
