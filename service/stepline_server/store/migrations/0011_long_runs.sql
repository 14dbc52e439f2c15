-- Long runs: a step's result size and digest, kept with it (large results travel to the app by
-- reference, and the history limit counts bytes without re-encoding), and the run's generation
-- (ctx.continue_as_new starts the run over with a fresh history under the same id).

ALTER TABLE runs ADD COLUMN generation integer NOT NULL DEFAULT 1 CHECK (generation >= 1);
COMMENT ON COLUMN runs.generation IS 'Counts from 1; each continue_as_new starts the next, with the new input and no steps.';
ALTER TABLE steps ADD COLUMN output_bytes integer GENERATED ALWAYS AS (octet_length(output::text)) STORED;
COMMENT ON COLUMN steps.output_bytes IS 'Bytes of the result''s JSON text (NULL without one): large results are sent to the app by reference.';
ALTER TABLE steps ADD COLUMN output_digest text GENERATED ALWAYS AS (md5(output::text)) STORED;
COMMENT ON COLUMN steps.output_digest IS 'MD5 of the result''s JSON text, so the SDK can check a result it fetched by reference.';
