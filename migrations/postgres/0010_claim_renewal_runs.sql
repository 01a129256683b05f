-- dockhand 0010: item claims keep what renewing and per-run release need.
-- `ttl_ms`: the time-to-live the claim was taken with; maintenance renews the claims of live
-- jobs to `now + ttl_ms` once half of it has passed (`Store::renew_claims`), soonest expiry
-- first over the new partial/prefix index on `expires_at`. Claims taken before 0010 get the TTL
-- they were taken with (`expires_at - claimed_at`).
-- `run_step`, `run_action`, `run_token`: the step run that took the claim (step index, step
-- action id, lease fencing token; NULL for claims not taken by a step). When a run's output is
-- written, the claims an earlier run of the same step took and the committed output does not
-- hold are released (`Store::release_superseded_claims`) instead of being completed with the
-- job.
ALTER TABLE dockhand_item_claims ADD COLUMN ttl_ms BIGINT;
ALTER TABLE dockhand_item_claims ADD COLUMN run_step INTEGER;
ALTER TABLE dockhand_item_claims ADD COLUMN run_action BIGINT;
ALTER TABLE dockhand_item_claims ADD COLUMN run_token BIGINT;
UPDATE dockhand_item_claims
   SET ttl_ms = GREATEST(1, (EXTRACT(EPOCH FROM (expires_at - claimed_at)) * 1000)::BIGINT)
 WHERE status = 'claimed' AND expires_at IS NOT NULL AND claimed_at IS NOT NULL;
CREATE INDEX dockhand_item_claims_expiry ON dockhand_item_claims (expires_at)
    WHERE status = 'claimed';
