-- dockhand 0007: a batch child keeps what its worklist row held, written in the transaction
-- that creates it: the item's packet ref (`item_ref`; the child's own input_refs move on with
-- its steps) and the cleanup sidecar (the claim descriptors it was handed: identity and
-- completion config). Worklist rows are deleted once the parent is final (B8); these copies
-- let an operator re-run a finished batch's failed children from the child step with their
-- items claimed again (`Jobs::rerun_failed`). NULL for jobs that are not batch children and
-- for children created before 0007.
ALTER TABLE dockhand_jobs ADD COLUMN item_ref TEXT;
ALTER TABLE dockhand_jobs ADD COLUMN sidecar JSONB;
