-- Debounces and batches: the starts of a workflow gathered into one run, held (no due time)
-- until the gathering fires. One row per open gathering; firing deletes it.
CREATE TABLE run_gatherings (
    project_id uuid NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    workflow text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('debounce', 'batch')),
    key text NOT NULL,
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    starts integer NOT NULL DEFAULT 1 CHECK (starts >= 1),
    event_ids jsonb NOT NULL DEFAULT '[]',
    first_at timestamptz NOT NULL DEFAULT now(),
    last_at timestamptz NOT NULL DEFAULT now(),
    fire_at timestamptz NOT NULL,
    PRIMARY KEY (project_id, workflow, kind, key)
);
COMMENT ON TABLE run_gatherings IS 'Open debounces and batches: starts (API or event) of a workflow with one key value gathered into one run, which has no due time until the gathering fires (the row is then deleted and the run made due).';
COMMENT ON COLUMN run_gatherings.key IS 'The value of the workflow''s debounce or batch key field in the start''s input or event data, as canonical JSON; * without a key field.';
COMMENT ON COLUMN run_gatherings.starts IS 'How many starts (a debounce) or events (a batch) the run has gathered.';
COMMENT ON COLUMN run_gatherings.event_ids IS 'The ids of the events gathered, in order, as their senders see them.';
COMMENT ON COLUMN run_gatherings.fire_at IS 'When the gathering fires: a debounce its period after the last start (at most max wait after the first), a batch its wait after the first event.';
CREATE UNIQUE INDEX run_gatherings_run ON run_gatherings (run_id);
CREATE INDEX run_gatherings_due ON run_gatherings (fire_at);
