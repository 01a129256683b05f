-- dockhand 0013: scheduled pipelines (a schedule that starts a job of a pipeline per
-- occurrence). `schedule_id`: the schedule whose occurrence started the job, NULL for other
-- jobs; its index answers "is a job of this schedule still live?" for the no-overlap option.
ALTER TABLE dockhand_jobs ADD COLUMN schedule_id INTEGER;
CREATE INDEX dockhand_jobs_schedule ON dockhand_jobs (schedule_id, status)
    WHERE schedule_id IS NOT NULL;
