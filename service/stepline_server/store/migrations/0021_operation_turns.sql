-- Bulk operations take turns (claim_operation): when each last had a batch claimed, so the
-- operations of every environment go side by side instead of the oldest first.
ALTER TABLE operations ADD COLUMN turn_at timestamptz;
COMMENT ON COLUMN operations.turn_at IS 'When a batch of it was last claimed (NULL: never); the claims take environments, then their operations, in turn by it.';
