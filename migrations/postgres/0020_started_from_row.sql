-- dockhand 0020: an attempt's `started` log entry is read from its action's row while it is the
-- latest attempt, so a claim writes no log row (as 0017 did for `created` and `completed`).
-- A claim sets `started_by` (the claimer, the entry's detail) and `started_after` (the action's
-- largest stored log id at the claim, 0 if none: an index probe, no write) beside `started_at`.
-- The log queries add the entry `(started_at, 'started', started_by)` at sort key
-- `started_after + 0.25`: after every row stored before the claim, before every row stored
-- after it. Only when the action is claimed again does its previous attempt's entry get stored,
-- by the trigger below (its WHEN is checked per row; a first claim queues nothing), with that
-- same sort key in `sort_key`; the log queries order stored rows by `COALESCE(sort_key, id)`.
-- Actions claimed before 0020 have their `started` rows stored and `started_by` NULL; their
-- next claim stores nothing for them.
ALTER TABLE dockhand_actions ADD COLUMN started_by TEXT, ADD COLUMN started_after BIGINT;
ALTER TABLE dockhand_action_logs ADD COLUMN sort_key DOUBLE PRECISION;

CREATE FUNCTION dockhand_log_restarted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO dockhand_action_logs (action_id, at, event, detail, sort_key)
    VALUES (NEW.id, OLD.started_at, 'started', OLD.started_by,
            OLD.started_after::double precision + 0.25);
    RETURN NULL;
END
$$;

CREATE TRIGGER dockhand_actions_log_restarted AFTER UPDATE OF status ON dockhand_actions
FOR EACH ROW
WHEN (OLD.status = 'pending' AND NEW.status = 'running' AND OLD.started_by IS NOT NULL)
EXECUTE FUNCTION dockhand_log_restarted();
