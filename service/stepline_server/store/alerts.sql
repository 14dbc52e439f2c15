-- Alerts and their outbox of notifications (alert_notifications). A notification is recorded
-- by the statement that caused it: the end of a run (end_runs in outcomes.sql), a schedule
-- disabled, a stuck run found, an SLA breach found; the delivery loop sends it.

-- name: insert_alert
-- A new alert of environment $2.
INSERT INTO alerts (id, project_id, name, types, workflow, destination_type, url, secret)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
RETURNING *;

-- name: list_alerts
-- The environment's alerts, oldest first, after the cursor ($2 created_at, $3 id).
SELECT * FROM alerts
WHERE project_id = $1 AND ($2::timestamptz IS NULL OR (created_at, id) > ($2, $3::uuid))
ORDER BY created_at, id
LIMIT $4;

-- name: get_alert
-- One alert, only within the caller's environment.
SELECT * FROM alerts WHERE project_id = $1 AND id = $2;

-- name: update_alert
-- Changes the fields given (NULL keeps one; $5 says whether workflow is given, NULL then
-- meaning every workflow); a new secret ($9) replaces the old one when given.
UPDATE alerts SET
    name = coalesce($3, name),
    types = coalesce($4, types),
    workflow = CASE WHEN $5 THEN $6 ELSE workflow END,
    destination_type = coalesce($7, destination_type),
    url = coalesce($8, url),
    secret = coalesce($9, secret),
    updated_at = now()
WHERE project_id = $1 AND id = $2
RETURNING *;

-- name: delete_alert
-- Removes an alert with its notifications (the foreign key cascades).
DELETE FROM alerts WHERE project_id = $1 AND id = $2 RETURNING id;

-- name: insert_test_notification
-- An alert.test notification of alert $2 (environment $1), due now; none if no such alert.
-- (The alert is read in a CTE of its own: Citus 13.2 cannot deparse the INSERT ... SELECT of
-- one reference table into another.)
WITH a AS MATERIALIZED (
    SELECT a.project_id, a.id FROM alerts a WHERE a.project_id = $1 AND a.id = $2
)
INSERT INTO alert_notifications (id, project_id, alert_id, type)
SELECT $3, a.project_id, a.id, 'alert.test' FROM a
RETURNING *;

-- name: record_run_stuck
-- Run $2 of environment $1 was found without a way forward (no live lease, due time or open
-- wait): one run.stuck notification per alert listening for it (of the run's workflow), and
-- never a second one for the same alert and run.
INSERT INTO alert_notifications (id, project_id, alert_id, type, run_id, data)
SELECT gen_random_uuid(), r.project_id, a.id, 'run.stuck', r.id,
       jsonb_build_object('workflow', r.workflow, 'status', r.status, 'error', r.error)
FROM runs r
JOIN alerts a ON a.project_id = r.project_id AND 'run.stuck' = ANY (a.types)
             AND (a.workflow IS NULL OR a.workflow = r.workflow)
WHERE r.project_id = $1 AND r.id = $2
ON CONFLICT DO NOTHING
RETURNING id;

-- name: record_schedule_disabled
-- Schedule $1 was disabled by the failure of its run $2 (in that run's end's transaction):
-- one schedule.disabled notification per alert listening for it, once per alert and run.
INSERT INTO alert_notifications (id, project_id, alert_id, type, run_id, schedule_id, data)
SELECT gen_random_uuid(), s.project_id, a.id, 'schedule.disabled', r.id, s.id,
       jsonb_build_object('workflow', s.workflow, 'status', r.status, 'error', r.error)
FROM schedules s
JOIN runs r ON r.id = $2
JOIN alerts a ON a.project_id = s.project_id AND 'schedule.disabled' = ANY (a.types)
             AND (a.workflow IS NULL OR a.workflow = s.workflow)
WHERE s.id = $1 AND s.status = 'disabled'
ON CONFLICT DO NOTHING
RETURNING id;

-- name: record_sla_breaches
-- Runs scheduled in the last hour (and after the alert was made) whose start lag is over
-- their schedule's SLA, a run not started yet counting once its SLA has passed (as a run's
-- slaBreached says): one schedule.slaBreached notification per alert listening for it, once
-- per alert and run. Answers how many were recorded.
WITH recorded AS (
    INSERT INTO alert_notifications (id, project_id, alert_id, type, run_id, schedule_id, data)
    SELECT gen_random_uuid(), a.project_id, a.id, 'schedule.slaBreached', r.id, s.id,
           jsonb_build_object('workflow', r.workflow, 'status', r.status, 'error', r.error,
                              'slaMs', s.sla_ms)
    FROM alerts a
    JOIN schedules s ON s.project_id = a.project_id AND s.sla_ms IS NOT NULL
                    AND (a.workflow IS NULL OR a.workflow = s.workflow)
    JOIN runs r ON r.schedule_id = s.id
    WHERE 'schedule.slaBreached' = ANY (a.types)
      AND r.scheduled_at > now() - interval '1 hour' AND r.scheduled_at >= a.created_at
      AND coalesce(r.started_at, r.ended_at, now()) - r.scheduled_at
          > make_interval(secs => s.sla_ms / 1000.0)
      AND NOT EXISTS (
          SELECT 1 FROM alert_notifications n
          WHERE n.alert_id = a.id AND n.run_id = r.id AND n.type = 'schedule.slaBreached')
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT count(*) FROM recorded;

-- name: claim_notifications
-- Takes up to $1 due pending notifications for one attempt each: each is leased ($2) and
-- due again in $3 seconds, so an attempt cut short by a crash is made again later, by any
-- orchestrator; those another orchestrator is taking are skipped. Answers all the attempt
-- needs: the alert's destination and what the body tells.
WITH due AS (
    SELECT id FROM alert_notifications
    WHERE status = 'pending' AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
taken AS (
    UPDATE alert_notifications n
    SET lease_token = $2, next_attempt_at = now() + make_interval(secs => $3::double precision)
    FROM due WHERE n.id = due.id
    RETURNING n.*
)
SELECT t.id, t.type, t.run_id, t.schedule_id, t.data, t.attempts, t.created_at, t.lease_token,
       a.id AS alert_id, a.name AS alert_name, a.destination_type, a.url, a.secret,
       e.id AS environment_id, e.name AS environment_name,
       p.id AS project_id, p.name AS project_name,
       s.workflow AS schedule_workflow, s.cron AS schedule_cron,
       ap.id AS app_id, ap.name AS app_name
FROM taken t
JOIN alerts a ON a.id = t.alert_id
JOIN environments e ON e.id = t.project_id
JOIN projects p ON p.id = e.project_id
LEFT JOIN schedules s ON s.id = t.schedule_id
LEFT JOIN runs r ON r.id = t.run_id
LEFT JOIN apps ap ON ap.id = r.app_id;

-- name: record_attempt
-- One attempt at notification $1 under lease $2 ended: it is now $3 (delivered, pending or
-- failed) with the answer's HTTP status $4 and the error $5; a pending one is due again in
-- $6 seconds. Nothing happens when the lease was taken by another attempt since. (The times
-- are computed once, in t: Citus takes no now() in a CASE of an UPDATE.)
UPDATE alert_notifications SET
    attempts = attempts + 1, status = $3, last_http_status = $4, last_error = $5,
    lease_token = NULL,
    delivered_at = CASE WHEN $3 = 'delivered' THEN t.now END,
    next_attempt_at = CASE WHEN $3 = 'pending' THEN t.due ELSE next_attempt_at END
FROM (SELECT now() AS now, now() + make_interval(secs => $6::double precision) AS due) AS t
WHERE id = $1 AND lease_token = $2 AND status = 'pending'
RETURNING attempts;

-- name: list_deliveries
-- The notifications of alert $1, newest first, after the cursor ($2 created_at, $3 id).
SELECT * FROM alert_notifications
WHERE alert_id = $1 AND ($2::timestamptz IS NULL OR (created_at, id) < ($2, $3::uuid))
ORDER BY created_at DESC, id DESC
LIMIT $4;

-- name: delete_old_notifications
-- Retention: delivered and failed notifications recorded more than $1 days ago, a batch of
-- at most $2 (those still pending are kept: they are being delivered).
DELETE FROM alert_notifications WHERE id IN (
    SELECT id FROM alert_notifications
    WHERE status <> 'pending' AND created_at < now() - make_interval(days => $1::integer)
    ORDER BY created_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
);
