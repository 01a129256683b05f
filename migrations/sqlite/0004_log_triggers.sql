-- dockhand 0004: the `created` and `started` log rows are written by triggers, inside the
-- statement that inserts or claims the action, so enqueue and claim are one statement each
-- (no explicit transaction, one round trip to SQLite's worker thread instead of four).
CREATE TRIGGER dockhand_actions_log_created AFTER INSERT ON dockhand_actions
BEGIN
    INSERT INTO dockhand_action_logs (action_id, at, event) VALUES (NEW.id, NEW.created_at, 'created');
END;

CREATE TRIGGER dockhand_actions_log_started AFTER UPDATE OF status ON dockhand_actions
WHEN OLD.status = 'pending' AND NEW.status = 'running'
BEGIN
    INSERT INTO dockhand_action_logs (action_id, at, event, detail)
    VALUES (NEW.id, NEW.started_at, 'started', NEW.lease_owner);
END;
