-- Bulk actions: an operation cancels or retries the runs a filter matched when it was created.
-- Its runs are listed in operation_runs in the same transaction, so the set is fixed; each row
-- gets its outcome in the transaction that acts on its run, so a run is acted on once.

CREATE TABLE operations (
    id uuid PRIMARY KEY,
    project_id uuid NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    action text NOT NULL CHECK (action IN ('cancel', 'retry', 'retryFromStep')),
    filter jsonb NOT NULL DEFAULT '{}',
    from_step text CHECK (length(from_step) BETWEEN 1 AND 256),
    status text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'completed', 'cancelled')),
    matched integer NOT NULL DEFAULT 0,
    succeeded integer NOT NULL DEFAULT 0,
    failed integer NOT NULL DEFAULT 0,
    skipped integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    ended_at timestamptz,
    CHECK ((status = 'running') = (ended_at IS NULL)),
    CHECK ((action = 'retryFromStep') = (from_step IS NOT NULL))
);
COMMENT ON TABLE operations IS 'A bulk action over the runs a filter matched at creation (operation_runs).';
COMMENT ON COLUMN operations.status IS 'running: runs left to act on; completed: every run acted on or skipped; cancelled: stopped by a request, what was done stays done.';
COMMENT ON COLUMN operations.succeeded IS 'Counters kept in the transaction that acts on each batch of runs.';
CREATE INDEX operations_created ON operations (project_id, created_at DESC, id DESC);
CREATE INDEX operations_running ON operations (created_at) WHERE status = 'running';
CREATE INDEX operations_ended ON operations (ended_at) WHERE ended_at IS NOT NULL;

CREATE TABLE operation_runs (
    operation_id uuid NOT NULL REFERENCES operations (id) ON DELETE CASCADE,
    position integer NOT NULL CHECK (position >= 1),
    run_id uuid NOT NULL,
    outcome text CHECK (outcome IN ('succeeded', 'failed', 'skipped')),
    error jsonb,
    done_at timestamptz,
    PRIMARY KEY (operation_id, position),
    CHECK ((outcome IS NULL) = (done_at IS NULL))
);
COMMENT ON TABLE operation_runs IS 'The runs of an operation, fixed at its creation, oldest first; no foreign key to runs: a run deleted since is skipped.';
COMMENT ON COLUMN operation_runs.outcome IS 'NULL: not acted on yet; succeeded: cancel requested or run retried; skipped: it no longer qualified; failed: see error.';
CREATE INDEX operation_runs_pending ON operation_runs (operation_id, position) WHERE outcome IS NULL;
CREATE INDEX operation_runs_failed ON operation_runs (operation_id, position) WHERE outcome = 'failed';
