-- Flow control and event-started runs: concurrency keys, singleton keys, the event a run was
-- started by, and event ids sent by clients (a second send of one id answers the first).

ALTER TABLE runs ADD COLUMN event_id uuid;
ALTER TABLE runs ADD COLUMN concurrency_key text;
ALTER TABLE runs ADD COLUMN singleton_key text;
COMMENT ON COLUMN runs.concurrency_key IS 'The value of the workflow''s concurrency key field in the input: the cap counts runs per value (NULL: the field is missing, or the workflow has no key).';
COMMENT ON COLUMN runs.singleton_key IS 'The value of the workflow''s singleton key field in the input: at most one run per value is not ended.';
CREATE UNIQUE INDEX runs_singleton ON runs (project_id, workflow, singleton_key)
    WHERE singleton_key IS NOT NULL AND ended_at IS NULL;
DROP INDEX runs_leased;
CREATE INDEX runs_leased ON runs (project_id, workflow, concurrency_key) WHERE lease_token IS NOT NULL;
DROP INDEX runs_held;
CREATE INDEX runs_held ON runs (project_id, workflow, concurrency_key, created_at) WHERE held;

ALTER TABLE events ADD COLUMN key text;
ALTER TABLE events ADD COLUMN answer jsonb;
COMMENT ON COLUMN events.key IS 'The id the sender gave (the row''s id is derived from it), or NULL.';
COMMENT ON COLUMN events.answer IS 'What sending it answered: a second send of the same id answers this.';
