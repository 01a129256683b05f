-- dockhand 0020: on SQLite and PostgreSQL a claim no longer stores the `started` log row (the
-- log queries read the latest attempt's entry from the action's row). MySQL still stores it:
-- built the same way on MariaDB 10.11 it was slower (W2 -5 %, 14 alternating pairs) and even
-- without the re-claim's extra statement no faster (+1 %, 8 pairs); an InnoDB log insert in
-- the claim's transaction costs little beside its round trips (docs/BENCHMARKS.md, session 21).
-- This migration keeps the numbers of the three backends in step.
DO 0;
