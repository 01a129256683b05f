-- dockhand 0017: an action's `created` log entry is its row's `created_at`, read back by the
-- log queries (synthesised unless an older stored `created` row exists); enqueues stop writing
-- it from this version on. No schema change; kept so the three backends share numbers.
SELECT 1;
