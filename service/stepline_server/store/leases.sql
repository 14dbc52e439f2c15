-- Leasing a run outside the claim loops: a run just started, or just woken by a callback, is
-- given to the orchestrator that handled the request, through the one lease transition, and
-- its invocation begins in the same statement.

-- name: lease_begin_now
-- Leases run $1 to $2 for $3 seconds (lease_runs, with the caller's runs in flight $4 and
-- whether lapsed leases may be taken over $5) when nothing gates it: not a pull app's (its
-- workers' polls lease it), not of a workflow with a concurrency cap (claim_capped counts the
-- room), not a rate-limited run not yet started (claim_rate_limited counts the window). A run
-- leased and not past its deadline then begins its invocation (run_begin, as
-- begin_invocations does for a claim, a result over $6 bytes by reference; run_begin sees the
-- lease: a volatile function called after another in one statement reads its writes). No row
-- when the run was not leased; else one row a step to send, the claim's columns (lease_claim,
-- status as run_status) on the first only (the rest null: it is not read again), the step
-- columns all null when the run was not begun (past its deadline, to be ended), name null when
-- it was begun with no step to send.
-- (Leased in a materialised CTE, so run_begin is called only after the lease. A run past its
-- deadline is kept from beginning by a null token, which run_begin finds no lease for: a
-- filter beside the call would be applied to its rows, after it ran.)
WITH leased AS MATERIALIZED (
    SELECT c FROM lease_runs(
        ARRAY(SELECT id FROM runs
              WHERE id = $1 AND NOT pull AND NOT options ? 'concurrency'
                AND (NOT options ? 'rateLimit' OR started_at IS NOT NULL)),
        $2, $3, $4, $5) c
)
SELECT c.*, b.name, b.kind, b.status, b.position, b.attempt, b.output, b.output_bytes,
       b.output_digest, b.error, b.wake_at, b.callback_id, b.child_run_id, b.callback_status,
       b.blocked, b.wait_s, b.late_s, b.history_base, b.history_steps, b.history_bytes
FROM leased l
LEFT JOIN LATERAL (
    SELECT f.*, f.ordinality AS n
    FROM run_begin((l.c).id, (l.c).project_id,
                   CASE WHEN NOT (l.c).past_deadline THEN (l.c).lease_token END,
                   (l.c).invocation_id, (l.c).invoke_attempts + 1, true, 0,
                   $6::integer,
                   -- The deployment the invocation goes to: the run's, else the app's.
                   (SELECT coalesce(d.deployment_id, a.deployment_id)
                    FROM runs r JOIN apps a ON a.id = r.app_id
                    LEFT JOIN deployments d ON d.id = r.deployment AND NOT d.current
                    WHERE r.id = (l.c).id)) WITH ORDINALITY AS f
) b ON true
-- The claim's columns (its status renamed: the step's goes by status), on the first row.
LEFT JOIN LATERAL (SELECT (l.c).*) c (id, project_id, app_id, workflow, run_status)
    ON coalesce(b.n, 1) = 1
ORDER BY b.n;
