-- dockhand 0014: the `completed` log row is written by a trigger inside the statement that
-- completes the action (as 0004 did for `created` and `started`), so a batch of completions is
-- one statement, and can share one round trip to SQLite's worker thread with the next claim.
CREATE TRIGGER dockhand_actions_log_completed AFTER UPDATE OF status ON dockhand_actions
WHEN OLD.status = 'running' AND NEW.status = 'complete'
BEGIN
    INSERT INTO dockhand_action_logs (action_id, at, event)
    VALUES (NEW.id, NEW.finished_at, 'completed');
END;
