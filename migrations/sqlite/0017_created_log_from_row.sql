-- dockhand 0017: an action's `created` log entry is its row's `created_at`, read back by the
-- log queries (an entry is synthesised unless an older stored `created` row exists), so an
-- enqueue writes one row instead of two: the trigger of 0004 that wrote it goes.
DROP TRIGGER IF EXISTS dockhand_actions_log_created;
