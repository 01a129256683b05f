-- dockhand 0008: an operator's stop of a batch parent (B5: cancel or manual fail, one
-- batch-aware function behind the library, the CLI and the dashboard). The stop sets
-- batch_outcome = 'cancel_requested' (scheduling stops: unscheduled rows discarded, no new
-- child, children not yet started cancelled) and records here the final status and reason the
-- parent finishes with once no child is active: 'cancelled' (a cancel) or 'failed' (a manual
-- fail, with the operator's reason). Written only by the first stop (an existing outcome is
-- kept). NULL on parents stopped before 0008: they finish cancelled / manual, as before.
ALTER TABLE dockhand_jobs ADD COLUMN batch_stop_status TEXT
    CHECK (batch_stop_status IS NULL OR batch_stop_status IN ('cancelled', 'failed'));
ALTER TABLE dockhand_jobs ADD COLUMN batch_stop_reason TEXT;
