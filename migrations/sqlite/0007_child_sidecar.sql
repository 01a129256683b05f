-- dockhand 0007: a batch child keeps the cleanup sidecar of its worklist row (the claim
-- descriptors it was handed: identity and completion config), written in the transaction that
-- creates it. Worklist rows are deleted once the parent is final (B8); this copy is what lets
-- an operator re-run a finished batch's failed children with their items claimed again
-- (`Jobs::rerun_failed`). NULL for jobs that are not batch children and for children created
-- before 0007 (re-run without claims).
ALTER TABLE dockhand_jobs ADD COLUMN sidecar TEXT;
