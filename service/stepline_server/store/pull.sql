-- Pull apps: their workers' polls lease runs.

-- name: due_gated_pull_groups
-- As due_gated_groups, for the runs of pull app $1.
SELECT 'capped' AS kind, project_id, workflow, concurrency_key AS key,
       min((options ->> 'concurrency')::integer) AS cap, NULL::bigint AS period_ms
FROM runs
WHERE pull AND app_id = $1 AND ready_at <= now() AND NOT held
  AND options ->> 'concurrency' IS NOT NULL
  AND (deadline_at IS NULL OR deadline_at > now())
GROUP BY project_id, workflow, concurrency_key
UNION ALL
SELECT 'rate', project_id, workflow, rate_key,
       min((options -> 'rateLimit' ->> 'limit')::integer),
       max((options -> 'rateLimit' ->> 'periodMs')::bigint)
FROM runs
WHERE pull AND app_id = $1 AND ready_at <= now() AND started_at IS NULL
  AND NOT cancel_requested AND options -> 'rateLimit' IS NOT NULL
  AND (deadline_at IS NULL OR deadline_at > now())
GROUP BY project_id, workflow, rate_key;

-- name: claim_pull
-- A worker's poll: leases up to $1 due runs of pull app $2 to $3 for $4 seconds (lease_runs: a
-- run whose lease ran out is taken over, its worker died or stalled, unless $5 is false, just
-- after the database was away). Runs of a workflow with a concurrency cap are left to
-- claim_capped, runs of a workflow with a rate limit not yet started to claim_rate_limited,
-- runs past their deadline to the dispatcher (which ends them). Higher priority first, then
-- the longest due.
WITH due AS (
    SELECT id
    FROM runs
    WHERE pull AND app_id = $2 AND ready_at <= now()
      AND options ->> 'concurrency' IS NULL
      AND (options -> 'rateLimit' IS NULL OR started_at IS NOT NULL OR cancel_requested)
      AND (deadline_at IS NULL OR deadline_at > now())
      AND ($5::boolean OR lease_token IS NULL)
    ORDER BY priority DESC, ready_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
SELECT * FROM lease_runs(ARRAY(SELECT id FROM due), $3, $4, '{}', $5)
ORDER BY priority DESC, due_in;

-- name: pull_lease
-- The run $1 of a pull app while lease $2 holds it: what recording its invocation's answer
-- needs, in the shape every lease answers.
SELECT (lease_claim_of(r, 0, false)).* FROM runs r WHERE r.id = $1 AND r.lease_token = $2 AND r.pull;

-- name: app_polled
-- A worker of app $1 polls now; written at most once a second (workers of a busy app poll
-- back to back, and the app's row would be a hot spot).
UPDATE apps SET polled_at = now()
WHERE id = $1 AND (polled_at IS NULL OR polled_at < now() - interval '1 second');

-- name: next_pull_due_in
-- Seconds until the next run of pull app $1 comes due (negative when overdue), NULL when none
-- will.
SELECT extract(epoch FROM min(ready_at) - now())::double precision FROM runs
WHERE ready_at IS NOT NULL AND pull AND app_id = $1;
