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
-- A worker's poll: leases up to $1 due runs of pull app $2 to $3 for $4 seconds, as claim_due
-- leases (a run whose lease ran out is taken over: its worker died or stalled). Runs of a
-- workflow with a concurrency cap are left to claim_capped, runs of a workflow with a rate
-- limit not yet started to claim_rate_limited, runs past their deadline to the dispatcher
-- (which ends them). Higher priority first, then the longest due.
WITH due AS (
    SELECT id, ready_at, lease_token AS old_token
    FROM runs
    WHERE pull AND app_id = $2 AND ready_at <= now()
      AND options ->> 'concurrency' IS NULL
      AND (options -> 'rateLimit' IS NULL OR started_at IS NOT NULL OR cancel_requested)
      AND (deadline_at IS NULL OR deadline_at > now())
    ORDER BY priority DESC, ready_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE runs r
SET lease_token = gen_random_uuid()::text,
    invocation_id = gen_random_uuid(),
    lease_owner = $3,
    ready_at = least(now() + make_interval(secs => $4::double precision), r.deadline_at),
    claimed_wake_seq = r.wake_seq,
    progress_at = now(),
    progress_seq = 0,
    progress_digest = NULL,
    held = false,
    started_at = coalesce(r.started_at, now())
FROM due
WHERE r.id = due.id
RETURNING r.id, r.project_id, r.app_id, r.workflow, r.status, r.input, r.options,
          r.cancel_requested, false AS past_deadline,
          r.lease_token, r.invocation_id, r.invoke_attempts, r.undelivered_since, r.wake_seq,
          r.concurrency_key, r.generation, 0::double precision AS due_in,
          due.old_token IS NOT NULL AS taken_over, r.created_at,
          NULL::text AS app_url, NULL::text[] AS app_secrets;

-- name: pull_lease
-- The run $1 of a pull app while lease $2 holds it: what recording its invocation's answer
-- needs (as a claim row has it).
SELECT id, project_id, app_id, workflow, status, input, options, cancel_requested,
       false AS past_deadline, lease_token, invocation_id, invoke_attempts, undelivered_since,
       wake_seq, concurrency_key, created_at, generation
FROM runs WHERE id = $1 AND lease_token = $2 AND pull;

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
