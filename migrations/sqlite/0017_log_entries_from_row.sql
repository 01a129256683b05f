-- dockhand 0017: an action's `created` entry is its row's `created_at`, and a completed
-- action's `completed` entry its `finished_at`; the log queries read them from the row (each
-- unless the action, from before 0017, has it stored). An enqueue writes one row instead of
-- two and a completion none in the log: the triggers of 0004 and 0014 that wrote them go.
DROP TRIGGER IF EXISTS dockhand_actions_log_created;
DROP TRIGGER IF EXISTS dockhand_actions_log_completed;
