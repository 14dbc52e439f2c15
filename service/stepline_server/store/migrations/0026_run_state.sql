-- Published state: a workflow's ctx.set_state(key, value) records a step of the new kind
-- 'state' (its history) and keeps the key's current value here, for fast reads and long polls.
ALTER TYPE step_kind ADD VALUE 'state';
COMMENT ON TYPE step_kind IS 'run: a user function; sleep: a timer; value: now/uuid; callback: a signed URL; event: waits for POST /v1/events; invoke: a child run; state: ctx.set_state (its key''s value is kept in run_state)';
CREATE TABLE run_state (
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    key text NOT NULL CHECK (key ~ '^[A-Za-z0-9._:-]{1,128}$'),
    project_id uuid NOT NULL,
    value jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, key)
);
COMMENT ON TABLE run_state IS 'The current value of each key a run published with ctx.set_state (the last set of the key wins; every set is also a state step and a state.set event); deleted with the run.';
COMMENT ON COLUMN run_state.value IS 'The value as the app sent it (JSON, at most 64 KiB; an envelope when the app encrypts or stores values).';
