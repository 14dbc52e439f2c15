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
SELECT run_release(id, project_id, $2, $3::double precision) FROM runs WHERE id = $1;

-- name: end_runs
-- Ends runs ($1: [{id, token, status, output, error, event, data}]), each when token is its
-- lease token, or when token is null (cancel, time limit): their open steps are cancelled, the
-- history gets their events and the end event (event, with data), and listeners hear of it.
-- Answers, for each run ended, what the caller must still settle.
WITH q AS (
    SELECT q.* FROM jsonb_array_elements($1::jsonb) AS item
        CROSS JOIN LATERAL jsonb_to_record(item)
            AS q(id uuid, token text, status run_status, output jsonb, error jsonb, event text,
                 data jsonb)
        WHERE jsonb_typeof(item) = 'object'
),
ok AS (
    SELECT runs.id FROM runs JOIN q ON q.id = runs.id
    WHERE (q.token IS NULL OR runs.lease_token = q.token)
      AND runs.status IN ('running', 'cancelling')
    ORDER BY runs.id
    FOR UPDATE OF runs
),
closed AS (
    UPDATE steps s SET status = 'cancelled', ended_at = now()
    FROM ok
    WHERE s.run_id = ok.id AND s.status IN ('running', 'retrying', 'sleeping', 'waiting')
    RETURNING s.run_id, s.name, s.kind, s.callback_id
),
cancelled_callbacks AS (
    UPDATE callbacks c SET status = 'cancelled', completed_at = now()
    FROM closed WHERE c.id = closed.callback_id AND c.status = 'pending'
),
evs AS (
    SELECT run_id, jsonb_agg(jsonb_build_object('type', type, 'step_name', name, 'data', data)
                             ORDER BY k, name) AS events
    FROM (
        SELECT run_id, 0 AS k, 'step.cancelled' AS type, name,
               jsonb_build_object('kind', kind) AS data
        FROM closed
        UNION ALL
        SELECT q.id, 1, q.event, NULL, q.data FROM q JOIN ok ON ok.id = q.id
    ) x
    GROUP BY run_id
),
r AS (
    UPDATE runs SET
        status = q.status, output = q.output, error = q.error, ended_at = now(),
        ready_at = NULL, lease_token = NULL, lease_owner = NULL, version = runs.version + 1
    FROM q JOIN ok ON ok.id = q.id
    WHERE runs.id = q.id
    RETURNING runs.id, runs.project_id, runs.parent_run_id, runs.parent_step,
              runs.schedule_id, runs.status
),
history AS (
    -- (Each run's events are appended once its row is updated: this reads r.)
    SELECT r.id, append_run_events(r.id, r.project_id, evs.events) AS seq
    FROM r JOIN evs ON evs.run_id = r.id
),
alerted AS (
    -- Alerts (alerts.sql): a run ending failed or timedOut records, in this statement, one
    -- notification per alert listening for it (run.failed, run.timedOut, and app.unreachable
    -- for a failure with code app_unreachable), at most one per alert, run and type.
    INSERT INTO alert_notifications (id, project_id, alert_id, type, run_id, data)
    SELECT gen_random_uuid(), r.project_id, a.id, t.type, r.id,
           jsonb_build_object('workflow', w.workflow, 'status', q.status, 'error', q.error)
    FROM r
    JOIN q ON q.id = r.id
    JOIN runs w ON w.id = r.id
    CROSS JOIN LATERAL (VALUES
        (CASE q.status WHEN 'failed' THEN 'run.failed' WHEN 'timedOut' THEN 'run.timedOut' END),
        (CASE WHEN q.status = 'failed' AND q.error ->> 'code' = 'app_unreachable'
              THEN 'app.unreachable' END)) AS t (type)
    JOIN alerts a ON a.project_id = r.project_id AND t.type = ANY (a.types)
                 AND (a.workflow IS NULL OR a.workflow = w.workflow)
    ON CONFLICT DO NOTHING
)
SELECT r.id, r.project_id, r.parent_run_id, r.parent_step, r.schedule_id, r.status,
       EXISTS (SELECT 1 FROM runs c
               WHERE c.parent_run_id = r.id AND c.status IN ('running', 'cancelling'))
           AS has_children,
       pg_notify('stepline_ended', r.id::text)
FROM r JOIN history h ON h.id = r.id;
