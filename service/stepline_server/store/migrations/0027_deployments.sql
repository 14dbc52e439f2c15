-- Deployments: an app may run at several URLs at once (each deploy of a serverless app has its
-- own; a container platform can keep the previous revision up). The newest is the current one:
-- new runs start on it; a run stays on the deployment it started on until it ends, unless an
-- operator moves it. Every existing app gets one deployment, its URL, and every existing run is
-- pinned to it.
CREATE TABLE deployments (
    id uuid PRIMARY KEY,
    app_id uuid NOT NULL REFERENCES apps (id) ON DELETE CASCADE,
    deployment_id text,
    url text,
    current boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX deployments_current ON deployments (app_id) WHERE current;
CREATE INDEX deployments_app ON deployments (app_id, created_at);
COMMENT ON TABLE deployments IS 'The deployments of an app, each at its own URL (none for a pull app: its workers declare their deployment id). The current one (one per app) is where new runs start; the app''s url is its url.';
COMMENT ON COLUMN deployments.deployment_id IS 'The id the deployment goes by: given when it was registered, else what it answered at its registration sync. NULL on the current deployment: the app''s deployment_id (what it last answered or synced with).';

ALTER TABLE runs ADD COLUMN deployment uuid REFERENCES deployments (id) ON DELETE SET NULL;
COMMENT ON COLUMN runs.deployment IS 'The deployment the run is invoked at: the app''s current one when it started (a child run of the same app: its parent''s), until it ends or is moved. NULL: its deployment was deleted after it ended; it goes to the current one.';
CREATE INDEX runs_deployment ON runs (deployment);

INSERT INTO deployments (id, app_id, url, current, created_at)
SELECT gen_random_uuid(), id, url, true, created_at FROM apps;
UPDATE runs r SET deployment = d.id FROM deployments d WHERE d.app_id = r.app_id;

-- The bulk action move: the runs an operation takes go to its deployment.
ALTER TABLE operations DROP CONSTRAINT operations_action_check;
ALTER TABLE operations ADD CONSTRAINT operations_action_check
    CHECK (action IN ('cancel', 'retry', 'retryFromStep', 'move'));
ALTER TABLE operations ADD COLUMN deployment uuid;
ALTER TABLE operations ADD CONSTRAINT operations_move_deployment
    CHECK ((action = 'move') = (deployment IS NOT NULL));
COMMENT ON COLUMN operations.deployment IS 'A move''s deployment: where its runs go (no foreign key: once it is deleted, what is left of the move fails).';

CREATE OR REPLACE FUNCTION lease_claim_of(r runs, due_in double precision, taken_over boolean)
RETURNS lease_claim LANGUAGE sql STABLE AS $$
    SELECT r.id, r.project_id, r.app_id, r.workflow, r.status, r.input, r.options,
           coalesce(r.cancel_requested, false), coalesce(r.deadline_at <= now(), false),
           r.lease_token, r.invocation_id, r.invoke_attempts, r.undelivered_since, r.wake_seq,
           r.concurrency_key, r.generation, r.created_at, r.pull, r.priority, due_in,
           taken_over,
           -- The run's deployment's URL: the app's (its current deployment's) when it has none.
           coalesce((SELECT d.url FROM deployments d WHERE d.id = r.deployment), a.url),
           a.signing_secrets, a.protocol_version
    FROM apps a WHERE a.id = r.app_id
$$;
