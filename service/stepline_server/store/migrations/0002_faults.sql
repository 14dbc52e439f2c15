-- Fencing of repeated progress calls, delivery retries kept apart from workflow retries.

ALTER TABLE runs ADD COLUMN progress_digest text;
ALTER TABLE runs ADD COLUMN undelivered_since timestamptz;
COMMENT ON COLUMN runs.progress_digest IS 'Digest of the body of the last progress call applied (progress_seq): the same call sent again is answered, a different one under that seq is refused as stale.';
COMMENT ON COLUMN runs.undelivered_since IS 'When the first of the current run of delivery failures happened (the app could not be invoked); NULL once an invocation was delivered. The delivery window counts from here.';
