-- The dispatcher's claims: due runs leased, their leases kept, invocations begun.
--
-- A batch comes as one jsonb array of records, unpacked with jsonb_array_elements and
-- jsonb_to_record. Its filter jsonb_typeof(item) = 'object' always holds; it is there for the
-- planner, which expects a hundred rows from a set-returning function but only one or two
-- after an equality it cannot judge, so a batch joined with runs or steps goes through their
-- indexes whatever their size (with a hundred rows expected, a table of a few thousand would
-- be read whole for every batch).

-- name: claim_due
-- Takes up to $1 due runs, higher priority first, then the longest due, and leases each to one
-- invocation: the run's ready_at moves to the end of the lease (or its deadline, if sooner), so
-- a crashed orchestrator's run comes due again, and a run past its time limit is claimed to be
-- ended. A run is due when its ready_at has come, or comes within $4 seconds for a sleep of it
-- that ends then (due_in says in how many seconds; 0: now). Runs of a workflow with a
-- concurrency cap are left to claim_capped, and runs of a workflow with a rate limit not yet
-- started to claim_rate_limited, unless past their deadline (or, not started, cancelled).
-- Without takeovers ($5 false), a run whose lease expired is left to its holder (the dispatcher
-- asks so just after the database was away). taken_over: the run still had a lease, run out
-- (its orchestrator died or stalled). Runs of pull apps are left to their workers' polls
-- (claim_pull), but claimed here once past their deadline, to be ended. The runs in $6 are
-- being invoked by this orchestrator: never taken again while they are.
-- The priorities present are walked one index probe each (levels; nearly always one), and each
-- level's due runs are read in ready_at order from runs_ready_priority: the claim reads what it
-- takes, however many runs wait for a later time. The runs taken are updated through the
-- primary key (id = ANY), so no estimate of how many there are can make a plan read the table.
-- The lease itself is lease_runs's (the fence, the outage grace and pausing are its).
WITH RECURSIVE levels AS (
    (SELECT priority FROM runs WHERE ready_at IS NOT NULL AND NOT pull
     ORDER BY priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT r.priority FROM runs r
            WHERE r.ready_at IS NOT NULL AND NOT r.pull AND r.priority < l.priority
            ORDER BY r.priority DESC LIMIT 1)
    FROM levels l WHERE l.priority IS NOT NULL
),
push_due AS (
    SELECT c.* FROM levels l CROSS JOIN LATERAL (
        SELECT id, priority, ready_at, lease_token AS old_token
        FROM runs
        WHERE priority = l.priority AND NOT pull
          AND ready_at <= now() + make_interval(secs => $4::double precision)
          AND NOT (id = ANY ($6::uuid[]))
          AND (NOT options ? 'concurrency' OR deadline_at <= now())
          AND (NOT options ? 'rateLimit' OR started_at IS NOT NULL OR cancel_requested
               OR deadline_at <= now())
          AND ($5::boolean OR lease_token IS NULL)
          -- (A scalar subquery, read by the run's key: an EXISTS here may be planned as a
          -- hash of every sleeping step.)
          AND (ready_at <= now()
               OR (SELECT min(s.wake_at) FROM steps s
                   WHERE s.run_id = runs.id AND s.status = 'sleeping')
                  <= now() + make_interval(secs => $4::double precision))
        ORDER BY ready_at
        LIMIT $1
        FOR UPDATE SKIP LOCKED
    ) c
    WHERE l.priority IS NOT NULL
    ORDER BY c.priority DESC, c.ready_at
    LIMIT $1
),
pull_overdue AS (
    SELECT id, priority, ready_at, lease_token AS old_token
    FROM runs
    WHERE pull AND ready_at IS NOT NULL AND deadline_at <= now() AND ready_at <= now()
      AND ($5::boolean OR lease_token IS NULL)
    ORDER BY deadline_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
due AS (
    SELECT * FROM (SELECT * FROM push_due UNION ALL SELECT * FROM pull_overdue) d
    ORDER BY priority DESC, ready_at
    LIMIT $1
),
leased AS (
    SELECT * FROM lease_runs(ARRAY(SELECT id FROM due), $2, $3, $6, $5)
)
SELECT * FROM leased ORDER BY priority DESC, due_in;

-- name: due_backlog
-- Runs due now that no invocation has taken (a run out lease included), and how many seconds
-- the oldest has waited. Runs of pull apps, which wait for their workers, are not counted.
SELECT count(*) AS n,
       coalesce(extract(epoch FROM now() - min(ready_at)), 0)::double precision AS oldest_s
FROM runs WHERE ready_at <= now() AND NOT pull;

-- name: next_due_in
-- Seconds until the next run comes due; without takeovers ($1 false), expired leases do not
-- count. Pull apps' runs are their workers' (past their deadline, the next claim ends them).
SELECT extract(epoch FROM min(ready_at) - now())::double precision FROM runs
WHERE ready_at IS NOT NULL AND NOT pull AND ($1::boolean OR lease_token IS NULL);

-- name: heartbeat
-- Extends the leases ($1: [{id, token}]) still held by $2 seconds, never past a run's
-- deadline (run_keep_lease: a run at its time limit comes due, to be ended). The runs are
-- locked in id order, before any is extended (a materialised CTE, as suspend_runs).
WITH held AS MATERIALIZED (
    SELECT r.id, r.project_id, h.token FROM runs r
    JOIN (SELECT h.* FROM jsonb_array_elements($1::jsonb) AS item
              CROSS JOIN LATERAL jsonb_to_record(item) AS h(id uuid, token text)
          WHERE jsonb_typeof(item) = 'object') h ON r.id = h.id AND r.lease_token = h.token
    ORDER BY r.id
    FOR UPDATE OF r
)
SELECT id, cancel_requested FROM (
    SELECT id, run_keep_lease(id, project_id, token, $2::double precision) AS cancel_requested
    FROM held
) k
WHERE cancel_requested IS NOT NULL;

-- name: begin_invocations
-- For each claimed run ($1: [{run_id, token, invocation_id, attempt, deltas}]) whose lease the
-- token still holds (a claim that went stale begins nothing: another orchestrator may hold the
-- run now): settles what came due (sleeps complete, those ending within $2 seconds too, as of
-- their end; event waits past their timeout complete with null; callbacks past theirs fail as
-- timed out) and records its invocation starting, with the id of the deployment it goes to (the
-- app's last known one for its current deployment). Returns
-- the run's steps in the order they were first recorded, one row each (a run begun with no
-- steps to send: one row whose name is null): every step (history_base null) when the run's
-- last invocation is not known or was not answered by an SDK that reads deltas, or when deltas
-- is false (the poll of a worker that does not read them), else only those written by
-- transactions the snapshot that invocation's steps were read under did not see, the open ones
-- (their flags depend on the time) and those this statement settled; the app lays them over
-- the history it kept from invocation history_base. The snapshot of this statement is kept for the next invocation. Each row says
-- the size of the run's whole history (history_steps, history_bytes: bytes of results); wait_s
-- says in how many seconds the last sleep settled ends: the app must not be called before;
-- blocked marks a retrying step whose next attempt is not due when the app is called; a result
-- over $3 bytes comes back as null with its output_bytes and output_digest (the app fetches it
-- by reference, so it is not read here); late_s, for a timer this statement settled (a sleep's
-- end, a wait's timeout), how many seconds ago it was due (negative: claimed ahead). (Only
-- sleeps are settled ahead: nothing from outside can end one sooner, while a callback or an
-- event may still come before a wait's timeout.) The runs are locked in id order, as every
-- statement that locks several runs does.
WITH q AS (
    SELECT q.* FROM jsonb_array_elements($1::jsonb) AS item
        CROSS JOIN LATERAL jsonb_to_record(item) AS q(run_id uuid, token text,
                                                      invocation_id uuid, attempt integer,
                                                      deltas boolean)
        WHERE jsonb_typeof(item) = 'object'
),
db AS MATERIALIZED (
    SELECT stepline_database_id() AS id
),
-- What the invocation carries is decided here, once: only what changed since the snapshot its
-- last invocation read under, when that snapshot was taken in this database (not a dump
-- restored elsewhere, not a logical copy: their transactions are another cluster's) and that
-- invocation was answered by an SDK that reads deltas (history_acked; not what the app declared
-- at its last sync: another replica, of another SDK, may have answered since); else every step.
-- A begin tried again after its commit went through unseen (the connection dropped at its commit)
-- finds its own invocation already begun (again): it records and settles nothing more and sends
-- every step, since the base its first try moved past is gone.
held AS (
    SELECT q.run_id, q.invocation_id, q.attempt,
           coalesce((SELECT d.deployment_id FROM deployments d
                     WHERE d.id = runs.deployment AND NOT d.current), a.deployment_id)
               AS deployment_id,
           CASE WHEN coalesce(q.deltas, true) AND runs.history_db = db.id
                     AND runs.history_acked = runs.history_invocation
                     AND runs.history_invocation IS DISTINCT FROM q.invocation_id
                THEN runs.history_snapshot END AS since,
           runs.history_invocation AS base,
           runs.history_invocation IS NOT DISTINCT FROM q.invocation_id AS again
    FROM q JOIN runs ON runs.id = q.run_id JOIN apps a ON a.id = runs.app_id CROSS JOIN db
    WHERE runs.lease_token = q.token AND runs.status IN ('running', 'cancelling')
    ORDER BY runs.id
    FOR UPDATE OF runs
),
resolved AS (
    UPDATE steps SET
        status = CASE WHEN kind = 'callback' THEN 'failed' ELSE 'completed' END::step_status,
        error = CASE WHEN kind = 'callback'
            THEN '{"type": "CallbackTimeout", "code": "callback_timeout", "message": "the callback was not completed in time"}'::jsonb END,
        ended_at = greatest(now(), CASE WHEN steps.status = 'sleeping' THEN steps.wake_at
                                        ELSE steps.timeout_at END)
    FROM held q
    WHERE steps.run_id = q.run_id AND NOT q.again
      AND ((steps.status = 'sleeping'
            AND steps.wake_at <= now() + make_interval(secs => $2::double precision))
           OR (steps.status = 'waiting' AND steps.kind IN ('event', 'callback')
               AND steps.timeout_at <= now()))
    RETURNING steps.run_id, steps.name, steps.kind, steps.callback_id, steps.status,
              steps.error, steps.ended_at
),
timed_out AS (
    UPDATE callbacks c SET status = 'timedOut', completed_at = resolved.ended_at
    FROM resolved WHERE c.id = resolved.callback_id AND c.status = 'pending'
),
-- When each run's invocation may start: now, or when the last sleep it settled ends.
starts AS (
    SELECT q.run_id, greatest(now(), max(rv.ended_at)) AS at
    FROM held q LEFT JOIN resolved rv ON rv.run_id = q.run_id
    GROUP BY q.run_id
),
evs AS (
    SELECT run_id,
           jsonb_agg(jsonb_build_object('at', at, 'type', type, 'step_name', name,
                                        'invocation_id', invocation_id,
                                        'deployment_id', deployment_id, 'data', data)
                     ORDER BY k, at, name) AS events
    FROM (
        SELECT run_id, 0 AS k, ended_at AS at,
               CASE WHEN kind = 'callback' THEN 'step.failed' ELSE 'step.completed' END AS type,
               name, NULL::uuid AS invocation_id, NULL::text AS deployment_id,
               CASE WHEN kind = 'sleep' THEN jsonb_build_object('kind', kind)
                    ELSE jsonb_build_object('kind', kind, 'timedOut', true) END AS data
        FROM resolved
        UNION ALL
        SELECT q.run_id, 1, starts.at, 'invocation.started', NULL, q.invocation_id,
               q.deployment_id, jsonb_build_object('attempt', q.attempt)
        FROM held q JOIN starts ON starts.run_id = q.run_id
        WHERE NOT q.again
    ) x
    GROUP BY run_id
),
r AS (
    UPDATE runs SET history_snapshot = pg_current_snapshot(), history_invocation = h.invocation_id,
                    history_db = db.id
    FROM evs JOIN held h ON h.run_id = evs.run_id CROSS JOIN db
    WHERE runs.id = evs.run_id
    RETURNING runs.id, runs.project_id, evs.events
),
-- Each run's history, appended once its row is updated (this reads r).
history AS (
    SELECT r.id, append_run_events(r.id, r.project_id, r.events) AS seq FROM r
)
-- The steps to send as read before this statement, with what it just settled laid over them.
SELECT q.run_id, s.name, s.kind, s.status, s.position, s.attempt, s.output, s.output_bytes,
       s.output_digest, s.error, s.wake_at, s.callback_id, s.child_run_id, s.callback_status,
       coalesce(s.status = 'retrying' AND s.wake_at > starts.at, false) AS blocked,
       extract(epoch FROM starts.at - now())::double precision AS wait_s, s.late_s,
       CASE WHEN q.since IS NOT NULL THEN q.base END AS history_base,
       size.steps AS history_steps, size.bytes AS history_bytes
FROM held q
JOIN starts ON starts.run_id = q.run_id
LEFT JOIN history ON history.id = q.run_id
CROSS JOIN LATERAL (
    SELECT count(*) AS steps, coalesce(sum(a.output_bytes), 0)::bigint AS bytes
    FROM steps a WHERE a.run_id = q.run_id
) size
LEFT JOIN LATERAL (
    SELECT s.name, s.kind, coalesce(rv.status, s.status) AS status, s.position, s.attempt,
           CASE WHEN s.output_bytes > $3::integer THEN NULL ELSE s.output END AS output,
           s.output_bytes, s.output_digest, coalesce(rv.error, s.error) AS error, s.wake_at,
           s.callback_id, s.child_run_id,
           CASE WHEN rv.kind = 'callback' THEN 'timedOut'
                ELSE (SELECT c.status FROM callbacks c WHERE c.id = s.callback_id)
           END AS callback_status,
           CASE WHEN rv.name IS NOT NULL
                THEN extract(epoch FROM now() - CASE WHEN s.status = 'sleeping' THEN s.wake_at
                                                     ELSE s.timeout_at END)::double precision
           END AS late_s
    FROM steps s
    LEFT JOIN resolved rv ON rv.run_id = s.run_id AND rv.name = s.name
    WHERE s.run_id = q.run_id
      AND (q.since IS NULL OR NOT pg_visible_in_snapshot(s.version, q.since)
           OR s.status NOT IN ('completed', 'failed', 'cancelled') OR rv.name IS NOT NULL)
) s ON true
ORDER BY q.run_id, s.position;
