-- What an invocation is sent beyond its delta, and a run continued as new.

-- name: step_result
-- The JSON text of the result of run $1's step at position $4, for its invocation $2 holding
-- lease $3 (the SDK fetches a large result by reference): no row when that invocation does not
-- hold the run; found is false when no step is there.
SELECT s.output::text AS output, s.run_id IS NOT NULL AS found
FROM runs r LEFT JOIN steps s ON s.run_id = r.id AND s.position = $4
WHERE r.id = $1 AND r.invocation_id = $2 AND r.lease_token = $3
  AND r.status IN ('running', 'cancelling');

-- name: invocation_steps
-- Every step of run $1 as it stands now, in recorded order, as begin_invocations sends them
-- (results over $4 bytes as null beside their size and digest), for its invocation $2 holding
-- lease $3: the SDK fetches the whole history when it did not keep the one an invocation's
-- changes are laid over. No row when that invocation does not hold the run; one row whose name
-- is null for a run with no steps.
SELECT s.name, s.kind, s.status, s.position, s.attempt,
       CASE WHEN s.output_bytes > $4::integer THEN NULL ELSE s.output END AS output,
       s.output_bytes, s.output_digest, s.error, s.wake_at, s.callback_id, s.child_run_id,
       (SELECT c.status FROM callbacks c
        WHERE c.id = s.callback_id AND c.run_id = $1) AS callback_status,
       coalesce(s.status = 'retrying' AND s.wake_at > now(), false) AS blocked
FROM runs r LEFT JOIN steps s ON s.run_id = $1
WHERE r.id = $1 AND r.invocation_id = $2 AND r.lease_token = $3
  AND r.status IN ('running', 'cancelling')
ORDER BY s.position;

-- name: continue_run
-- The invocation of run $1 holding lease $2 continued as new with input $3: the run's next
-- generation starts (run_continue). Answers the new generation and the steps dropped; no row
-- when the lease was lost.
-- (The run's project read by a subquery of the call's argument, and the call made alone: on
-- Citus a transition called from a query on the run's shard is refused, while this is routed.)
SELECT c.generation, c.steps FROM run_continue($1, (SELECT project_id FROM runs WHERE id = $1), $2, $3::jsonb) c;

-- name: step_position
SELECT position FROM steps WHERE run_id = $1 AND name = $2;
