-- Published state: each key's current value of a run (run_state), set by ctx.set_state.

-- name: state_keys_locked
-- Locks the run's row (as the progress statement will) and answers the state keys it has, so
-- the count of keys checked before recording new ones still holds when they are written.
WITH run AS (SELECT id FROM runs WHERE id = $1 FOR UPDATE)
SELECT s.key FROM run JOIN run_state s ON s.run_id = $1;

-- name: state_record
-- Keeps the value of each state step this transaction wrote ($2: [{key, step}], the last set
-- of each key) as the key's current value (run_record_state); answers the keys it set.
-- (The call made alone: on Citus it runs on the run's worker.)
SELECT * FROM run_record_state($1, $2::jsonb);

-- name: notify_state
-- Wakes the long polls on run $1's state (from the caller's session: on Citus, the
-- coordinator's, where the orchestrators listen).
SELECT pg_notify('stepline_state', $1::text);

-- name: state_of_run
-- A run's current state, every key, in key order (project-scoped: another's run has none).
SELECT key, value, updated_at FROM run_state
WHERE run_id = $1 AND project_id = $2
ORDER BY key;

-- name: state_value
-- One key's current value of a run of the project, or no row.
SELECT key, value, updated_at FROM run_state
WHERE run_id = $1 AND project_id = $2 AND key = $3;
