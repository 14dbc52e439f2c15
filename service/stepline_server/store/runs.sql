-- Runs as their readers see them: starting one, finding, listing, history and logs, and the operator's
-- cancel and retry.

-- name: insert_run
-- Creates a run of workflow $3 (its app and options as last synced) due now, with its
-- run.started event (data $11), and wakes every orchestrator's dispatcher when $12; no row when
-- the workflow is not registered or the id, the run key or an active run of its singleton key
-- exists (take_singleton: the run takes its key first) ($13: the event that started it; $14:
-- its priority; the input's concurrency, singleton and rate limit key fields are read as the
-- workflow's options name them). A run of a pull app
-- always wakes every orchestrator (their workers' polls claim it). A caller that invokes it at
-- once leases it in the same transaction (lease_begin_now). $15: the id the event's sender gave.
-- $16: the run gathers a debounce's or a batch's starts: it has no due time (and wakes no
-- dispatcher) until the gathering fires (fire_gatherings). The run is on its app's current
-- deployment.
WITH w AS (
    SELECT w.app_id, w.options, w.version, a.slug, a.name, a.kind = 'pull' AS pull,
           (SELECT d.id FROM deployments d WHERE d.app_id = a.id AND d.current) AS deployment
    FROM workflows w JOIN apps a ON a.id = w.app_id
    WHERE w.project_id = $2 AND w.name = $3
),
r AS (
    INSERT INTO runs (id, project_id, app_id, workflow, input, run_key, parent_run_id,
                      parent_step, schedule_id, scheduled_at, trigger, options, deadline_at,
                      ready_at, event_id, concurrency_key, singleton_key,
                      definition_version, pull, priority, rate_key, event_key, deployment)
    SELECT $1, $2, w.app_id, $3, $4::jsonb, $5::text, $6::uuid, $7::text, $8::text,
           $9::timestamptz, $10::text, w.options,
           now() + make_interval(secs => (w.options ->> 'timeoutMs')::double precision / 1000),
           CASE WHEN $16::boolean THEN NULL ELSE now() END, $13::uuid,
           CASE WHEN jsonb_typeof($4::jsonb) = 'object'
                THEN $4::jsonb ->> (w.options ->> 'concurrencyKey') END,
           CASE WHEN jsonb_typeof($4::jsonb) = 'object'
                THEN $4::jsonb ->> (w.options ->> 'singletonKey') END,
           w.version, w.pull, $14::smallint,
           CASE WHEN jsonb_typeof($4::jsonb) = 'object'
                THEN $4::jsonb ->> (w.options -> 'rateLimit' ->> 'key') END,
           $15::text, w.deployment
    FROM w
    WHERE w.options ->> 'singletonKey' IS NULL
       OR take_singleton($2, $3, CASE WHEN jsonb_typeof($4::jsonb) = 'object'
                                      THEN $4::jsonb ->> (w.options ->> 'singletonKey') END,
                         $1) IS NULL
    ON CONFLICT DO NOTHING
    RETURNING *
)
SELECT r.*, w.slug AS app_slug, w.name AS app_name,
       CASE WHEN ($12::boolean OR w.pull) AND NOT $16::boolean
            THEN pg_notify('stepline_wake', '') END
FROM r, w
CROSS JOIN LATERAL (
    SELECT append_run_events(r.id, r.project_id,
                             jsonb_build_array(jsonb_build_object('type', 'run.started',
                                                                  'data', $11::jsonb))) AS seq
) e;

-- name: get_run_by_key
SELECT r.*, a.slug AS app_slug, a.name AS app_name FROM runs r JOIN apps a ON a.id = r.app_id
WHERE r.project_id = $1 AND r.run_key = $2;

-- name: get_run
-- The run, its app's slug, the deployment of its last invocation that named one and the SLA
-- of its schedule.
SELECT r.*, a.slug AS app_slug, a.name AS app_name,
       (SELECT e.deployment_id FROM run_events e
        WHERE e.run_id = $2 AND e.deployment_id IS NOT NULL
        ORDER BY e.seq DESC LIMIT 1) AS deployment_id,
       (SELECT s.sla_ms FROM schedules s WHERE s.id = r.schedule_id) AS schedule_sla_ms
FROM runs r JOIN apps a ON a.id = r.app_id
WHERE r.project_id = $1 AND r.id = $2;

-- name: run_steps
-- (The callback's status is looked up per step, so the plan reads callbacks by key whatever the
-- statistics said when it was made.)
-- (The callback is looked up by its run too, and every table by the run's id as given: on Citus
-- the statement is then one task on the run's shard; a correlated equality alone is not
-- pruned.)
SELECT s.*, (SELECT c.status FROM callbacks c
             WHERE c.id = s.callback_id AND c.run_id = $1) AS callback_status
FROM steps s
WHERE s.run_id = $1 ORDER BY s.position;

-- name: search_runs
-- Runs of project $1 newest first, by workflow $2, status $3, run key $4 exact or $10 as a
-- prefix, created in [$5, $6), before the keyset cursor ($7, $8); at most $9.
SELECT r.*, a.slug AS app_slug, a.name AS app_name,
       (SELECT s.sla_ms FROM schedules s WHERE s.id = r.schedule_id) AS schedule_sla_ms
FROM runs r JOIN apps a ON a.id = r.app_id
WHERE r.project_id = $1
  AND ($2::text IS NULL OR r.workflow = $2)
  AND ($3::run_status IS NULL OR r.status = $3)
  AND ($4::text IS NULL OR r.run_key = $4)
  AND ($10::text IS NULL OR starts_with(r.run_key, $10))
  AND ($5::timestamptz IS NULL OR r.created_at >= $5)
  AND ($6::timestamptz IS NULL OR r.created_at < $6)
  AND ($7::timestamptz IS NULL OR (r.created_at, r.id) < ($7, $8::uuid))
ORDER BY r.created_at DESC, r.id DESC
LIMIT $9;

-- name: list_logs
-- The log lines of run $1 (project $2) after seq $3, in order, at most $4.
SELECT l.* FROM run_logs l
WHERE l.run_id = $1 AND l.project_id = $2 AND l.seq > $3
ORDER BY l.seq
LIMIT $4;

-- name: list_events
SELECT e.* FROM run_events e
WHERE e.run_id = $1 AND e.project_id = $2 AND e.seq > $3
ORDER BY e.seq
LIMIT $4;

-- name: append_events
-- $1 run id, $2 jsonb array of {type, step_name, invocation_id, deployment_id, http_status,
-- duration_ms, data}; numbers them after the run's last event (append_run_events).
-- (The run's project read by a subquery of the call's argument, and the call made alone: on
-- Citus a transition called from a query on the run's shard is refused, while this is routed.)
SELECT append_run_events($1, (SELECT project_id FROM runs WHERE id = $1), $2::jsonb);

-- name: insert_child_run
-- A child run of workflow $3 for run $5's step $6: on its parent's deployment when it is of
-- the same app (the parent's code started it), else on its app's current one.
INSERT INTO runs (id, project_id, app_id, workflow, input, parent_run_id, parent_step, trigger,
                  options, deadline_at, ready_at, definition_version, pull, concurrency_key,
                  rate_key, priority, deployment)
SELECT $1, w.project_id, w.app_id, w.name, $4, $5, $6, 'parent', w.options,
       now() + make_interval(secs => (w.options ->> 'timeoutMs')::double precision / 1000),
       now(), w.version, (SELECT a.kind = 'pull' FROM apps a WHERE a.id = w.app_id),
       CASE WHEN jsonb_typeof($4::jsonb) = 'object'
            THEN $4::jsonb ->> (w.options ->> 'concurrencyKey') END,
       CASE WHEN jsonb_typeof($4::jsonb) = 'object'
            THEN $4::jsonb ->> (w.options -> 'rateLimit' ->> 'key') END,
       coalesce((SELECT p.priority FROM runs p WHERE p.id = $5), 0),
       coalesce((SELECT p.deployment FROM runs p WHERE p.id = $5 AND p.app_id = w.app_id),
                (SELECT d.id FROM deployments d WHERE d.app_id = w.app_id AND d.current))
FROM workflows w WHERE w.project_id = $2 AND w.name = $3
ON CONFLICT (id) DO NOTHING
RETURNING id;

-- name: request_cancel
-- Run $1, if running, becomes cancelling (run_request_cancel); answers whether it did.
-- (The run's project read by a subquery of the call's argument, and the call made alone: on
-- Citus a transition called from a query on the run's shard is refused, while this is routed.)
SELECT run_request_cancel($1, (SELECT project_id FROM runs WHERE id = $1));

-- name: lock_run
SELECT * FROM runs WHERE project_id = $1 AND id = $2 FOR UPDATE;

-- name: delete_steps_for_retry
-- Steps that run again on retry: from the first failed or unfinished step (or fromStep's
-- position $2, when earlier) every step recorded after it too, so the history replays without
-- a hole (cleanup steps of a cancel, a callback's notification, parallel siblings run again).
DELETE FROM steps
WHERE run_id = $1
  AND position >= least($2::bigint, (
      SELECT min(position) FROM steps
      WHERE run_id = $1 AND status IN ('failed', 'cancelled', 'running', 'retrying')));

-- name: run_trigger
SELECT trigger FROM runs WHERE id = $1;

-- name: take_run_singleton
-- Run $1 (going again) takes its singleton key (take_singleton): NULL when it holds it now (or
-- has none), else the run not ended that does.
-- (Called alone with its arguments read by subqueries: on Citus it runs on the coordinator,
-- the key's row and the holder on other shards than the run.)
SELECT take_singleton((SELECT project_id FROM runs WHERE id = $1),
                      (SELECT workflow FROM runs WHERE id = $1),
                      (SELECT singleton_key FROM runs WHERE id = $1), $1);

-- name: singleton_holder
-- The run not ended, other than run $1, that holds run $1's singleton key (of its workflow and
-- environment): while there is one, run $1 cannot go again.
-- (Run $1's key read first, then the runs holding it: on Citus they are on other shards.)
SELECT o.id FROM runs o
WHERE (o.project_id, o.workflow, o.singleton_key)
      = (SELECT r.project_id, r.workflow, r.singleton_key FROM runs r WHERE r.id = $1)
  AND o.ended_at IS NULL AND o.id <> $1;

-- name: restart_run
-- Run $1 goes again (run_restart); its trigger becomes $2 when given (a retry asked for by a
-- person).
-- (The run's project read by a subquery of the call's argument, and the call made alone: on
-- Citus a transition called from a query on the run's shard is refused, while this is routed.)
SELECT x.* FROM run_restart($1, (SELECT project_id FROM runs WHERE id = $1), $2::text) x;

-- name: active_singleton
-- The run of workflow $2 (project $1) not ended whose singleton key is input $3's field $4.
SELECT r.*, a.slug AS app_slug, a.name AS app_name FROM runs r JOIN apps a ON a.id = r.app_id
WHERE r.project_id = $1 AND r.workflow = $2 AND r.ended_at IS NULL
  AND r.singleton_key = (CASE WHEN jsonb_typeof($3::jsonb) = 'object'
                              THEN $3::jsonb ->> $4::text END);

-- name: children_of
SELECT id FROM runs WHERE parent_run_id = $1 AND status IN ('running', 'cancelling');

-- name: notify_wake
SELECT pg_notify('stepline_wake', '');

-- name: writable
-- Whether this server takes writes: not a standby, not read-only by default.
SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off';

-- name: run_invocations
-- The invocations of run $1 (project $2) begun after history seq $3, in order, each with how
-- it ended (from its invocation.ended event; none yet while it runs) and what was sent, at most
-- $4.
SELECT s.seq, s.invocation_id AS id, coalesce((s.data ->> 'attempt')::integer, 1) AS attempt,
       s.at AS started_at, e.at AS ended_at, e.duration_ms, e.data ->> 'outcome' AS outcome,
       e.http_status, coalesce(e.deployment_id, s.deployment_id) AS deployment_id,
       e.data ->> 'error' AS error, e.data ->> 'request' AS request
FROM run_events s
LEFT JOIN LATERAL (
    SELECT x.* FROM run_events x
    WHERE x.run_id = $1 AND x.seq > s.seq AND x.type = 'invocation.ended'
      AND x.invocation_id = s.invocation_id
    ORDER BY x.seq LIMIT 1
) e ON true
WHERE s.run_id = $1 AND s.project_id = $2 AND s.type = 'invocation.started' AND s.seq > $3
ORDER BY s.seq
LIMIT $4;

-- name: run_counters
-- What run $1 shows beside its fields when read alone: how often it was invoked, how many of
-- those could not be delivered, and whether a pause holds it (not ended, and its workflow or
-- its app is paused).
SELECT c.invocations, c.delivery_failures,
       r.ended_at IS NULL
       AND (a.paused_at IS NOT NULL
            OR EXISTS (SELECT 1 FROM workflows w
                       WHERE w.project_id = r.project_id AND w.name = r.workflow
                         AND w.paused_at IS NOT NULL)) AS paused
FROM runs r JOIN apps a ON a.id = r.app_id,
     LATERAL (SELECT count(*) FILTER (WHERE e.type = 'invocation.started') AS invocations,
                     count(*) FILTER (WHERE e.type = 'invocation.ended'
                                        AND e.data ->> 'outcome' = 'delivery_failed')
                         AS delivery_failures
              FROM run_events e WHERE e.run_id = $1) c
WHERE r.id = $1;
