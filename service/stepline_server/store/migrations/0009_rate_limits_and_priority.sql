-- Flow control, continued: a run's priority (among due runs of a workflow, higher first) and
-- the value of its workflow's rate limit key, with the indexes that claim by them.

ALTER TABLE runs ADD COLUMN priority smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100);
ALTER TABLE runs ADD COLUMN rate_key text;
COMMENT ON COLUMN runs.priority IS 'Among due runs of a workflow, higher priority is claimed first (-100 to 100, default 0).';
COMMENT ON COLUMN runs.rate_key IS 'The value of the workflow''s rate limit key field in the input: the limit counts starts per value (NULL: the field is missing, or the limit has no key).';
CREATE INDEX runs_ready_priority ON runs (priority DESC, ready_at) WHERE ready_at IS NOT NULL;
CREATE INDEX runs_rate_starts ON runs (project_id, workflow, started_at) WHERE options ? 'rateLimit';
DROP INDEX runs_held;
CREATE INDEX runs_held ON runs (project_id, workflow, concurrency_key, priority DESC, created_at) WHERE held;
