-- Child runs and the parents' invoke steps.

-- name: fail_step
UPDATE steps SET status = 'failed', error = $3, ended_at = now()
WHERE run_id = $1 AND name = $2 AND status = 'waiting';
