-- The due runs of one workflow, for the claims of capped and rate-limited workflows (gates.sql):
-- without it their generic plans read the whole runs table once it holds many ended runs.
CREATE INDEX runs_ready_workflow ON runs (project_id, workflow, ready_at) WHERE ready_at IS NOT NULL;
