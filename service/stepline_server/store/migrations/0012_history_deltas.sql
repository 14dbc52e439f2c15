-- Invocations carry what changed: each step row says which transaction last wrote it, and each
-- run keeps the snapshot its last invocation's steps were read under. The next invocation
-- sends only the steps written by transactions that snapshot did not see (and the open ones);
-- the SDK lays them over the history it kept from that invocation.

-- The default is stable, so existing rows take this migration's transaction without a rewrite
-- of the table (their runs have no snapshot yet: their next invocation gets every step).
ALTER TABLE steps ADD COLUMN version xid8 NOT NULL DEFAULT pg_current_xact_id();
COMMENT ON COLUMN steps.version IS 'The transaction that last wrote the row (set on insert, and on every update by steps_version): the history an invocation gets is what changed since a snapshot.';
CREATE FUNCTION steps_stamp_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.version := pg_current_xact_id();
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION steps_stamp_version() IS 'Stamps an updated step row with the transaction writing it.';
CREATE TRIGGER steps_version BEFORE UPDATE ON steps
    FOR EACH ROW EXECUTE FUNCTION steps_stamp_version();

ALTER TABLE runs ADD COLUMN history_snapshot pg_snapshot;
COMMENT ON COLUMN runs.history_snapshot IS 'The snapshot the steps of the run''s last invocation were read under: the next one gets only the steps written by transactions it did not see. NULL: the next one gets every step (a retry or continue_as_new removed steps, or none began).';
ALTER TABLE runs ADD COLUMN history_invocation uuid;
COMMENT ON COLUMN runs.history_invocation IS 'The invocation that was sent the history as of history_snapshot (the base the app lays the next changes over).';
