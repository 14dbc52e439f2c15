-- Published state: each key's current value of a run (run_state), set by ctx.set_state.

-- name: state_keys_locked
-- Locks the run's row (as the progress statement will) and answers the state keys it has, so
-- the count of keys checked before recording new ones still holds when they are written.
WITH run AS (SELECT id FROM runs WHERE id = $1 FOR UPDATE)
SELECT s.key FROM run JOIN run_state s ON s.run_id = $1;

-- name: state_record
-- Keeps the value of each state step this transaction wrote ($2: [{key, step}], the last set
-- of each key) as the key's current value, read from the step row itself: a set the steps
-- table already had (a call sent again, a replay) wrote no row now and changes nothing.
-- Answers the keys it set; wakes the long polls on them (stepline_state, the run's id).
WITH x AS (
    SELECT * FROM jsonb_to_recordset($2::jsonb) AS x(key text, step text)
),
kept AS (
    INSERT INTO run_state AS t (run_id, key, project_id, value, updated_at)
    SELECT s.run_id, x.key, s.project_id, s.output, now()
    FROM x JOIN steps s ON s.run_id = $1 AND s.name = x.step
    WHERE s.status = 'completed' AND s.version = pg_current_xact_id() AND s.output IS NOT NULL
    ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at
    RETURNING t.key
)
SELECT kept.key, pg_notify('stepline_state', $1::text) IS NULL AS notified FROM kept;

-- name: state_of_run
-- A run's current state, every key, in key order (project-scoped: another's run has none).
SELECT key, value, updated_at FROM run_state
WHERE run_id = $1 AND project_id = $2
ORDER BY key;

-- name: state_value
-- One key's current value of a run of the project, or no row.
SELECT key, value, updated_at FROM run_state
WHERE run_id = $1 AND project_id = $2 AND key = $3;
