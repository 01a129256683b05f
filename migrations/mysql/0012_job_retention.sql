-- dockhand 0012: idempotent job starts and job/packet retention.
-- `idempotency_key`: an optional caller key, unique among the jobs of a pipeline
-- (`Jobs::start_with`); `idempotency_hash` = sha256(pipeline, key) carries the uniqueness, so
-- every backend indexes a fixed-width value whatever the key's length (InnoDB allows many
-- NULLs in a unique index). NULL for other jobs.
-- `dockhand_packets.used_at`: when a packet was last written (a start or a step that emitted
-- the same content again bumps it); retention collects packets not used since its cutoff that
-- no remaining job or worklist row references (Q11, B8).
-- `dockhand_jobs_finished`: retention picks final jobs by finish time.
ALTER TABLE dockhand_jobs ADD COLUMN idempotency_key LONGTEXT NULL;
ALTER TABLE dockhand_jobs ADD COLUMN idempotency_hash CHAR(64) NULL;
CREATE UNIQUE INDEX dockhand_jobs_idempotency ON dockhand_jobs (idempotency_hash);
CREATE INDEX dockhand_jobs_finished ON dockhand_jobs (finished_at);
ALTER TABLE dockhand_packets ADD COLUMN used_at BIGINT NULL;
UPDATE dockhand_packets SET used_at = created_at;
ALTER TABLE dockhand_packets MODIFY used_at BIGINT NOT NULL;
CREATE INDEX dockhand_packets_used ON dockhand_packets (used_at);
