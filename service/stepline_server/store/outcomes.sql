-- Invocations that ended: runs suspended, invoked again later, or ended.
-- A batch comes as one jsonb array of records, unpacked as claims.sql says (and why).

-- name: suspend_runs
-- Ends invocations ($1: [{id, token, acked}], each a run and its lease token, and whether an SDK
-- that reads history deltas answered) with the runs still running: each is suspended
-- (run_suspend: due at its earliest timer, or at once when something woke it while the
-- invocation ran). Answers the runs suspended (not those whose lease was lost). The runs are
-- locked in id order, before any is suspended (a materialised CTE: the planner would otherwise
-- call run_suspend below the lock).
WITH locked AS MATERIALIZED (
    SELECT r.id, r.project_id, q.token, q.acked FROM runs r
    JOIN (SELECT q.* FROM jsonb_array_elements($1::jsonb) AS item
              CROSS JOIN LATERAL jsonb_to_record(item) AS q(id uuid, token text, acked boolean)
          WHERE jsonb_typeof(item) = 'object') q ON r.id = q.id AND r.lease_token = q.token
    ORDER BY r.id
    FOR UPDATE OF r
)
SELECT id FROM locked WHERE run_suspend(id, project_id, token, acked);

-- name: invoke_failed
-- The invocation of run $1 (lease $2) could not be delivered: the run stays running, due again
-- in $3 ms (run_release); answers the failures counted, null when the lease was lost.
-- (The run's project read by a subquery of the call's argument, and the call made alone: on
-- Citus a transition called from a query on the run's shard is refused, while this is routed.)
SELECT run_release($1, (SELECT project_id FROM runs WHERE id = $1), $2, $3::double precision);

-- name: end_runs
-- Ends runs ($1: [{id, token, status, output, error, event, data}]), each when token is its
-- lease token, or when token is null (cancel, time limit), by run_end: their open steps are
-- cancelled, the history gets their events and the end event (event, with data); here its
-- alerts are recorded (record_run_alerts) and listeners hear of it (stepline_ended). Answers,
-- for each run ended, what the caller must still settle (has_children: it has children not
-- ended). The runs are locked in id order before any ends (a materialised CTE: the planner
-- would otherwise call run_end below the lock).
WITH q AS (
    SELECT q.* FROM jsonb_array_elements($1::jsonb) AS item
        CROSS JOIN LATERAL jsonb_to_record(item)
            AS q(id uuid, token text, status run_status, output jsonb, error jsonb,
                 event run_event_type, data jsonb)
        WHERE jsonb_typeof(item) = 'object'
),
locked AS MATERIALIZED (
    SELECT q.*, runs.project_id, runs.workflow FROM runs JOIN q ON q.id = runs.id
    WHERE (q.token IS NULL OR runs.lease_token = q.token)
      AND runs.status IN ('running', 'cancelling')
    ORDER BY runs.id
    FOR UPDATE OF runs
)
SELECT l.id, l.project_id, e.parent_run_id, e.parent_step, e.schedule_id, e.status,
       EXISTS (SELECT 1 FROM runs c WHERE c.parent_run_id = l.id
                                      AND c.status IN ('running', 'cancelling')) AS has_children,
       pg_notify('stepline_ended', l.id::text) IS NULL AS told,
       CASE WHEN e.status IN ('failed', 'timedOut')
            THEN record_run_alerts(l.project_id, l.id, l.workflow, e.status, l.error) END
           AS alerted
FROM locked l
CROSS JOIN LATERAL run_end(l.id, l.project_id, l.token, l.status, l.output, l.error, l.event,
                           l.data) e;
