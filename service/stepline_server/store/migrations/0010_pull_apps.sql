-- Pull apps: an app with no URL whose workers poll the orchestrator for its invocations. Their
-- runs are claimed by the workers' polls, never by the dispatcher (which would call a URL).

ALTER TABLE apps ALTER COLUMN url DROP NOT NULL;
ALTER TABLE apps ADD COLUMN kind text NOT NULL DEFAULT 'push' CHECK (kind IN ('push', 'pull'));
ALTER TABLE apps ADD COLUMN polled_at timestamptz;
ALTER TABLE apps ADD CONSTRAINT apps_url_of_kind CHECK ((kind = 'push') = (url IS NOT NULL));
COMMENT ON COLUMN apps.kind IS 'push: the orchestrator POSTs invocations to url; pull: workers poll for them (no url).';
COMMENT ON COLUMN apps.polled_at IS 'When a worker of a pull app last polled for invocations.';
ALTER TABLE runs ADD COLUMN pull boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN runs.pull IS 'The run''s app is a pull app: its workers'' polls claim it, the dispatcher only ends it past its time limit.';
DROP INDEX runs_ready;
CREATE INDEX runs_ready ON runs (ready_at) WHERE ready_at IS NOT NULL AND NOT pull;
DROP INDEX runs_ready_priority;
CREATE INDEX runs_ready_priority ON runs (priority DESC, ready_at) WHERE ready_at IS NOT NULL AND NOT pull;
CREATE INDEX runs_pull_ready ON runs (app_id, ready_at) WHERE ready_at IS NOT NULL AND pull;
CREATE INDEX runs_pull_deadline ON runs (deadline_at) WHERE ready_at IS NOT NULL AND pull;
