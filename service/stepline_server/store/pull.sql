-- Pull apps: their workers' polls lease runs.

-- name: due_gated_pull_groups
-- As due_gated_groups, for the runs of pull app $1 on deployment $2 (as claim_pull).
SELECT 'capped' AS kind, project_id, workflow, concurrency_key AS key,
       min((options ->> 'concurrency')::integer) AS cap, NULL::bigint AS period_ms
FROM runs
WHERE pull AND app_id = $1 AND ready_at <= now() AND NOT held
  AND coalesce(deployment, (SELECT d.id FROM deployments d WHERE d.app_id = $1 AND d.current))
      = coalesce($2::uuid, (SELECT d.id FROM deployments d WHERE d.app_id = $1 AND d.current))
  AND options ->> 'concurrency' IS NOT NULL
  AND (deadline_at IS NULL OR deadline_at > now())
GROUP BY project_id, workflow, concurrency_key
UNION ALL
SELECT 'rate', project_id, workflow, rate_key,
       min((options -> 'rateLimit' ->> 'limit')::integer),
       max((options -> 'rateLimit' ->> 'periodMs')::bigint)
FROM runs
WHERE pull AND app_id = $1 AND ready_at <= now() AND started_at IS NULL
  AND coalesce(deployment, (SELECT d.id FROM deployments d WHERE d.app_id = $1 AND d.current))
      = coalesce($2::uuid, (SELECT d.id FROM deployments d WHERE d.app_id = $1 AND d.current))
  AND NOT cancel_requested AND options -> 'rateLimit' IS NOT NULL
  AND (deadline_at IS NULL OR deadline_at > now())
GROUP BY project_id, workflow, rate_key;

-- name: claim_pull
-- A worker's poll: leases up to $1 due runs of pull app $2 to $3 for $4 seconds (lease_runs: a
-- run whose lease ran out is taken over, unless $5 is false, just after the database was away,
-- or its worker lost it, to be recorded first by lost_pull_leases, or its orchestrator may beat
-- yet; what is taken over here counts nothing). Runs of a workflow with a concurrency cap are left to
-- claim_capped, runs of a workflow with a rate limit not yet started to claim_rate_limited,
-- runs past their deadline to the dispatcher (which ends them). Higher priority first, then
-- the longest due. Only runs on deployment $6, the one the polling worker declared (NULL: the
-- app's current one; a run on no deployment counts as on the current one).
WITH due AS (
    SELECT id
    FROM runs
    WHERE pull AND app_id = $2 AND ready_at <= now()
      AND coalesce(deployment, (SELECT d.id FROM deployments d WHERE d.app_id = $2 AND d.current))
          = coalesce($6::uuid, (SELECT d.id FROM deployments d WHERE d.app_id = $2 AND d.current))
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

-- name: lost_pull_leases
-- Runs of pull app $1 whose worker lost its invocation: the lease its poll was given lapsed (no
-- beat for a whole lease, $2 seconds) while the orchestrator that gave it, this one or another,
-- was up and reaching the database from before the lease was last kept (given or beaten) until
-- it lapsed, as that orchestrator's beats say (pull_lease_lapse). A lease that lapsed while our
-- side was away is not the worker's loss: one whose orchestrator stopped beating (it may have
-- died with it) or lost the database (its worker's beats may have failed on our side) is left
-- to the takeover (claim_pull), which counts nothing. Past their deadline, runs are the
-- dispatcher's to end. The claims answered are the lapsed leases' own, for recording the loss
-- under them (a delivery failure, fenced by their token). Read through runs_pull_leased: the
-- leased runs only, not those waiting for a worker.
SELECT (lease_claim_of(r, 0, false)).* FROM runs r
WHERE r.pull AND r.app_id = $1 AND r.lease_token IS NOT NULL
  AND r.status IN ('running', 'cancelling') AND r.ready_at <= now()
  AND (r.deadline_at IS NULL OR r.deadline_at > now())
  AND pull_lease_lapse(r, $2) = 'lost'
ORDER BY r.ready_at
LIMIT 100;

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
-- will; a lapsed lease whose orchestrator may beat yet (pull_lease_lapse, leases of $2 seconds)
-- is looked at again in a tenth of a lease, at most a second. The runs waiting for a worker and
-- the leased ones (runs_pull_leased) are read apart, each through its index. Only the runs
-- waiting on deployment $3 (as claim_pull) count.
SELECT extract(epoch FROM least(
    (SELECT min(ready_at) FROM runs
     WHERE ready_at IS NOT NULL AND pull AND app_id = $1 AND lease_token IS NULL
       AND coalesce(deployment, (SELECT d.id FROM deployments d WHERE d.app_id = $1 AND d.current))
           = coalesce($3::uuid, (SELECT d.id FROM deployments d
                                 WHERE d.app_id = $1 AND d.current))),
    (SELECT min(CASE WHEN pull_lease_lapse(r, $2) = 'unsure'
                     THEN now() + make_interval(secs => least($2::double precision / 10, 1))
                     ELSE r.ready_at END)
     FROM runs r WHERE r.pull AND r.app_id = $1 AND r.lease_token IS NOT NULL)
) - now())::double precision;
