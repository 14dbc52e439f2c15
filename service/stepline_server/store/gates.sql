-- Flow control: concurrency caps (held runs) and rate limits, each group under its advisory lock.

-- name: due_gated_groups
-- The runs of push apps due now (not past their deadline) that claim_due leaves to a gate, by
-- group: of a workflow with a concurrency cap, not held, by concurrency key value, with the
-- cap their runs were started under (kind capped: claim_capped); of a workflow with a rate
-- limit, not yet started nor cancelled, by rate key value, with the tightest limit and the
-- longest period their runs were started under (kind rate: claim_rate_limited).
SELECT 'capped' AS kind, project_id, workflow, concurrency_key AS key,
       min((options ->> 'concurrency')::integer) AS cap, NULL::bigint AS period_ms
FROM runs
WHERE ready_at <= now() AND NOT held AND options ->> 'concurrency' IS NOT NULL AND NOT pull
  AND (deadline_at IS NULL OR deadline_at > now())
GROUP BY project_id, workflow, concurrency_key
UNION ALL
SELECT 'rate', project_id, workflow, rate_key,
       min((options -> 'rateLimit' ->> 'limit')::integer),
       max((options -> 'rateLimit' ->> 'periodMs')::bigint)
FROM runs
WHERE ready_at <= now() AND started_at IS NULL AND NOT cancel_requested AND NOT pull
  AND options -> 'rateLimit' IS NOT NULL
  AND (deadline_at IS NULL OR deadline_at > now())
GROUP BY project_id, workflow, rate_key;

-- name: held_workflows
-- The workflows with held runs, by concurrency key value, with the cap of their runs.
SELECT project_id, workflow, concurrency_key, min((options ->> 'concurrency')::integer) AS cap
FROM runs WHERE held
GROUP BY project_id, workflow, concurrency_key;

-- name: lock_workflow
-- Serialises claiming and releasing the runs of workflow $2 of project $1 with concurrency key
-- value $3 until the transaction ends, so two orchestrators never both see room under its
-- cap. Namespace 2 of the advisory locks.
SELECT pg_advisory_xact_lock(
    2, hashtext($1::uuid::text || ':' || $2::text || ':' || coalesce($3::text, '')));

-- name: claim_capped
-- With lock_workflow held: leases up to $6 of the due or held runs of workflow $2 (project
-- $1) with concurrency key value $7, higher priority first, then oldest, as far as its cap $3
-- has room beside its invocations in flight (a live lease, or one of the caller's own, $9,
-- whose beat came late), to $4 for $5 seconds (lease_runs). When that fills the cap, its other
-- due runs are held (ready_at at their deadline, no lease) until release_held lets them go.
-- Without takeovers ($8 false), runs whose lease expired are left to their holders; a pull
-- run's lapsed lease that lease_runs would not take over is not cleared either. A worker's poll
-- of pull app $10 leases only the runs on its deployment $11 (as claim_pull; $10 NULL: the
-- dispatcher, any run); the cap counts and holds the workflow's runs whatever their deployment.
WITH busy AS (
    SELECT greatest(0, $3::integer - count(*)) AS room FROM runs
    WHERE project_id = $1 AND workflow = $2 AND concurrency_key IS NOT DISTINCT FROM $7::text
      AND lease_token IS NOT NULL AND (ready_at > now() OR id = ANY ($9::uuid[]))
),
cand AS (
    (SELECT id, priority, created_at FROM runs
     WHERE project_id = $1 AND workflow = $2 AND concurrency_key IS NOT DISTINCT FROM $7::text
       AND held
       AND ($10::uuid IS NULL OR (app_id = $10 AND coalesce(
           deployment, (SELECT d.id FROM deployments d WHERE d.app_id = $10 AND d.current))
           = coalesce($11::uuid, (SELECT d.id FROM deployments d
                                  WHERE d.app_id = $10 AND d.current))))
     ORDER BY priority DESC, created_at, id LIMIT $6)
    UNION ALL
    (SELECT id, priority, created_at FROM runs
     WHERE ready_at <= now() AND NOT held AND project_id = $1 AND workflow = $2
       AND concurrency_key IS NOT DISTINCT FROM $7::text
       AND ($8::boolean OR lease_token IS NULL) AND NOT (id = ANY ($9::uuid[]))
       AND ($10::uuid IS NULL OR (app_id = $10 AND coalesce(
           deployment, (SELECT d.id FROM deployments d WHERE d.app_id = $10 AND d.current))
           = coalesce($11::uuid, (SELECT d.id FROM deployments d
                                  WHERE d.app_id = $10 AND d.current))))
     ORDER BY priority DESC, created_at, id LIMIT $6)
),
go AS (
    SELECT r.id FROM runs r
    WHERE r.id IN (SELECT id FROM cand ORDER BY priority DESC, created_at, id
                   LIMIT least($6::integer, (SELECT room FROM busy)))
    FOR UPDATE SKIP LOCKED
),
to_hold AS MATERIALIZED (
    SELECT h.id, h.project_id FROM runs h
    WHERE h.project_id = $1 AND h.workflow = $2
      AND h.concurrency_key IS NOT DISTINCT FROM $7::text
      AND h.ready_at <= now() AND NOT h.held
      AND ($8::boolean OR h.lease_token IS NULL) AND NOT (h.id = ANY ($9::uuid[]))
      AND coalesce(pull_lease_lapse(h, $5), 'ours') = 'ours'
      AND h.id NOT IN (SELECT id FROM go)
      AND (SELECT room FROM busy) <= (SELECT count(*) FROM go)
    ORDER BY h.id
    FOR UPDATE OF h
),
-- Each held by run_hold, once all are locked; the count makes this run before the lease.
held_now AS MATERIALIZED (
    SELECT count(*) FILTER (WHERE run_hold(id, project_id)) AS n FROM to_hold
)
SELECT * FROM lease_runs(ARRAY(SELECT id FROM go), $4, $5, $9, $8)
WHERE (SELECT n FROM held_now) IS NOT NULL
ORDER BY priority DESC, created_at, id;

-- name: release_held
-- With lock_workflow held: the held runs of workflow $2 (project $1) with concurrency key
-- value $4, higher priority first, then oldest, become due again, as far as its cap $3 has
-- room beside its invocations in flight.
-- Each by run_unhold, once all are locked in id order (a materialised CTE).
WITH go AS MATERIALIZED (
    SELECT r.id, r.project_id FROM runs r
    WHERE r.id IN (
        SELECT id FROM runs
        WHERE project_id = $1 AND workflow = $2 AND concurrency_key IS NOT DISTINCT FROM $4::text
          AND held
        ORDER BY priority DESC, created_at, id
        LIMIT (SELECT greatest(0, $3::integer - count(*)) FROM runs
               WHERE project_id = $1 AND workflow = $2
                 AND concurrency_key IS NOT DISTINCT FROM $4::text
                 AND lease_token IS NOT NULL AND ready_at > now()))
    ORDER BY r.id
    FOR UPDATE OF r
)
SELECT id FROM go WHERE run_unhold(id, project_id);

-- name: lock_rate
-- Serialises claiming the runs of workflow $2 of project $1 with rate key value $3 until the
-- transaction ends, so two orchestrators never both see room in its window. Namespace 3 of the
-- advisory locks. Answers the transaction's time, the time its leases start runs at, which
-- rate_window counts the window to (on Citus a read across shards evaluates now() on each
-- worker, whose transaction there began later, once the lock was taken).
SELECT now() AS now
FROM pg_advisory_xact_lock(
    3, hashtext($1::uuid::text || ':' || $2::text || ':' || coalesce($3::text, '')));

-- name: rate_window
-- With lock_rate held, as of its time $5: when the runs of workflow $2 (project $1) with rate
-- key value $3 that started within the last $4 milliseconds started (oldest first), and how
-- many of its runs are due and not yet started.
SELECT array(SELECT started_at FROM runs
             WHERE project_id = $1 AND workflow = $2 AND options ? 'rateLimit'
               AND rate_key IS NOT DISTINCT FROM $3::text
               AND started_at > $5::timestamptz
                                - make_interval(secs => $4::double precision / 1000)
             ORDER BY started_at) AS starts,
       (SELECT count(*) FROM runs
        WHERE ready_at <= $5::timestamptz AND started_at IS NULL AND NOT cancel_requested
          AND project_id = $1 AND workflow = $2 AND options -> 'rateLimit' IS NOT NULL
          AND rate_key IS NOT DISTINCT FROM $3::text) AS waiting;

-- name: claim_rate_limited
-- With lock_rate held: leases up to $4 of the due runs not yet started of workflow $2 (project
-- $1) with rate key value $3, higher priority first, then oldest, to $5 for $6 seconds
-- (lease_runs; their started_at, now, counts in the window from then on). $7: the runs the
-- caller invokes now, $8: whether lapsed leases may be taken over (lease_runs). A worker's
-- poll of pull app $9 leases only the runs on its deployment $10 (as claim_pull; $9 NULL: the
-- dispatcher, any run); the window counts the workflow's starts whatever their deployment.
WITH go AS (
    SELECT id FROM runs
    WHERE ready_at <= now() AND started_at IS NULL AND NOT cancel_requested
      AND project_id = $1 AND workflow = $2 AND options -> 'rateLimit' IS NOT NULL
      AND rate_key IS NOT DISTINCT FROM $3::text
      AND ($9::uuid IS NULL OR (app_id = $9 AND coalesce(
         deployment, (SELECT d.id FROM deployments d WHERE d.app_id = $9 AND d.current))
         = coalesce($10::uuid, (SELECT d.id FROM deployments d
                                WHERE d.app_id = $9 AND d.current))))
    ORDER BY priority DESC, created_at, id
    LIMIT $4
    FOR UPDATE SKIP LOCKED
)
SELECT * FROM lease_runs(ARRAY(SELECT id FROM go), $5, $6, $7, $8)
ORDER BY priority DESC, created_at, id;

-- name: defer_rate_limited
-- With lock_rate held: the due runs not yet started of workflow $2 (project $1) with rate key
-- value $3, in the order they go (higher priority first, then oldest), come due at the times
-- $4 gives them in that order, never past their deadline; a time not after now leaves its run
-- due (run_defer, each in id order, its condition, not started still, checked under its row
-- lock; no lock is taken first: on Citus that would be FOR UPDATE across shards). Only as many
-- runs are read as $4 has times.
WITH ranked AS MATERIALIZED (
    SELECT id, project_id, row_number() OVER (ORDER BY priority DESC, created_at, id) AS n
    FROM (SELECT id, project_id, priority, created_at FROM runs
          WHERE ready_at <= now() AND started_at IS NULL AND NOT cancel_requested
            AND project_id = $1 AND workflow = $2 AND options -> 'rateLimit' IS NOT NULL
            AND rate_key IS NOT DISTINCT FROM $3::text
          ORDER BY priority DESC, created_at, id
          LIMIT cardinality($4::timestamptz[])) due
),
go AS MATERIALIZED (
    SELECT ranked.id, ranked.project_id, t.at FROM ranked
    JOIN unnest($4::timestamptz[]) WITH ORDINALITY AS t(at, n) ON t.n = ranked.n
    WHERE t.at > now()
    ORDER BY ranked.id
)
SELECT count(*) FILTER (WHERE run_defer(id, project_id, at)) FROM go;
