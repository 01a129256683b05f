-- dockhand 0017: an action's `created` entry is its row's `created_at`, and a completed
-- action's `completed` entry its `finished_at`; the log queries read them from the row (each
-- unless the action, from before 0017, has it stored), and enqueues and completions stop
-- writing those log rows. No schema change; kept so the three backends share numbers.
SELECT 1;
