-- Waits completed from outside: callbacks, events, child runs, and waking a run.

-- name: cancel_waits
-- On a cancel request: what waits (sleeps, callbacks, events, children) is cancelled.
UPDATE steps SET status = 'cancelled', ended_at = now()
WHERE run_id = $1 AND status IN ('sleeping', 'waiting')
RETURNING name, kind, child_run_id, callback_id;

-- name: cancel_callbacks
UPDATE callbacks SET status = 'cancelled', completed_at = now()
WHERE id = ANY($1::uuid[]) AND status = 'pending';

-- name: resolve_child_step
UPDATE steps SET status = $3, output = $4, error = $5, ended_at = now()
WHERE run_id = $1 AND name = $2 AND status = 'waiting'
RETURNING name;

-- name: wake
-- Something outside run $1 moved it: run it now, or right after the active invocation, with
-- what woke it ($2: events, or null) in its history (run_wake, the wake transition).
-- (The run's project read by a subquery of the call's argument, and the call made alone: on
-- Citus a transition called from a query on the run's shard is refused, while this is routed.)
SELECT run_wake($1, (SELECT project_id FROM runs WHERE id = $1), $2::jsonb);

-- name: get_callback
SELECT * FROM callbacks WHERE id = $1 AND ($2::uuid IS NULL OR project_id = $2);

-- name: callback_completed_with
-- Whether callback $1 was completed with body $2 (compared as jsonb: key order and spacing
-- aside, `1` is not `true`): a second delivery of the same body.
SELECT status = 'completed' AND body IS NOT DISTINCT FROM $2::jsonb FROM callbacks WHERE id = $1;

-- name: complete_callback
-- Completes pending callback $1 (of project $3 when given) with body $2: its step completes,
-- the history says so, and the run wakes (wake_run's rule: now, or right after its active
-- invocation), with every orchestrator's dispatcher when $4. A pull app's run always wakes
-- every orchestrator (their workers' polls claim it). (On Citus: on_citus_complete_callback.)
WITH c AS (
    UPDATE callbacks SET status = 'completed', body = $2, completed_at = now()
    WHERE id = $1 AND status = 'pending' AND ($3::uuid IS NULL OR project_id = $3)
    RETURNING *
),
s AS (
    UPDATE steps SET status = 'completed', output = $2, ended_at = now()
    FROM c
    WHERE steps.run_id = c.run_id AND steps.name = c.step_name AND steps.status = 'waiting'
),
w AS (
    -- (A CTE that reads c: the run wakes once its callback is completed.)
    SELECT c.run_id, run_wake(c.run_id, c.project_id, jsonb_build_array(
        jsonb_build_object('type', 'callback.completed', 'step_name', c.step_name,
                           'data', jsonb_build_object('callbackId', $1::text)),
        jsonb_build_object('type', 'step.completed', 'step_name', c.step_name,
                           'data', '{"kind": "callback"}'::jsonb))) AS woken
    FROM c
)
SELECT c.*, w.woken AS run_woken,
       CASE WHEN $4::boolean OR (w.woken AND r.pull) THEN pg_notify('stepline_wake', '') END
FROM c JOIN w ON w.run_id = c.run_id LEFT JOIN runs r ON r.id = c.run_id;

-- name: callback_run
-- The run of callback $1, read without a lock (on Citus, before on_citus_complete_callback).
SELECT run_id FROM callbacks WHERE id = $1;

-- name: lock_event_name
-- Serialises sending event $2 of project $1 with recording a wait for it that could match it,
-- until the transaction ends: each then sees what the other committed (an event and a wait
-- committed at once would otherwise each miss the other). The name's lock (namespace 1 of the
-- advisory locks; exclusive when $3), then the locks of match fields $4 (namespace 7; lock
-- keys, in the order given; exclusive when $5): engine/event_locks.py says which.
SELECT CASE WHEN l.exclusive THEN pg_advisory_xact_lock(l.ns, l.k)
            ELSE pg_advisory_xact_lock_shared(l.ns, l.k) END
FROM (
    SELECT 0::bigint AS i, 1 AS ns, hashtext($1::uuid::text || ':' || $2::text) AS k,
           $3::boolean AS exclusive
    UNION ALL
    SELECT u.i, 7, u.k, $5::boolean FROM unnest($4::integer[]) WITH ORDINALITY AS u(k, i)
) l
ORDER BY l.i;

-- name: take_recent_event
-- An event wait just recorded takes the first matching event received since $4 (the wait's
-- invocation last committed): the event may have raced the wait's own commit. Answers the
-- step and the event's id (its sender's, else its own).
UPDATE steps s SET status = 'completed', output = ev.data, ended_at = now()
FROM (
    SELECT e.data, coalesce(e.key, e.id::text) AS event_id FROM events e
    WHERE e.project_id = $2 AND e.name = $5 AND e.received_at >= $4
      -- Every match field equals the data's (data of any kind matches no match fields).
      AND NOT EXISTS (
          SELECT 1 FROM jsonb_each(CASE WHEN jsonb_typeof($6::jsonb) = 'object'
                                        THEN $6::jsonb ELSE '{}'::jsonb END) f
          WHERE f.value IS DISTINCT FROM
                CASE WHEN jsonb_typeof(e.data) = 'object' THEN e.data -> f.key END)
    ORDER BY e.received_at
    LIMIT 1
) ev
WHERE s.run_id = $1 AND s.name = $3 AND s.status = 'waiting'
RETURNING s.name, ev.event_id;

-- name: insert_event
-- Records event $1 (project $2, name $3, data $4, the sender's id $5 or NULL); no row when an
-- event of that id exists (sent before, within the day events are kept).
INSERT INTO events (id, project_id, name, data, key, received_at)
VALUES ($1, $2, $3, $4, $5, clock_timestamp())
ON CONFLICT (id) DO NOTHING
RETURNING id;

-- name: event_answer
SELECT answer FROM events WHERE id = $1;

-- name: set_event_answer
UPDATE events SET answer = $2 WHERE id = $1;

-- name: match_event
-- Completes every step of project $2 waiting for event $3 whose match fields all equal the
-- data's ($4; $1 the event, $5 its id as its sender gave it, else $1): each such run's history
-- gets event.received and step.completed,
-- and the run wakes (now, or right after its active invocation). Answers the runs it woke.
WITH m AS (
    UPDATE steps SET status = 'completed', output = $4, ended_at = now()
    WHERE project_id = $2 AND kind = 'event' AND status = 'waiting' AND event_name = $3
      -- Every match field equals the data's (data of any kind matches no match fields).
      AND NOT EXISTS (
          SELECT 1 FROM jsonb_each(CASE WHEN jsonb_typeof(match) = 'object'
                                        THEN match ELSE '{}'::jsonb END) f
          WHERE f.value IS DISTINCT FROM
                CASE WHEN jsonb_typeof($4::jsonb) = 'object' THEN $4::jsonb -> f.key END)
    RETURNING run_id, name
),
numbered AS (
    SELECT run_id, name, row_number() OVER (PARTITION BY run_id ORDER BY name) AS k
    FROM m
),
w AS (
    SELECT n1.run_id, run_wake(n1.run_id, $2, (
        SELECT jsonb_agg(x.ev ORDER BY n.k, x.i)
        FROM numbered n CROSS JOIN LATERAL (VALUES
            (0, jsonb_build_object(
                    'type', 'event.received', 'step_name', n.name,
                    'data', jsonb_build_object('event', $3::text,
                                               'eventId', coalesce($5::text, $1::uuid::text)))),
            (1, jsonb_build_object('type', 'step.completed', 'step_name', n.name,
                                   'data', '{"kind": "event"}'::jsonb))) AS x(i, ev)
        WHERE n.run_id = n1.run_id)) AS woken
    FROM numbered n1 WHERE n1.k = 1
)
-- pull: a pull app's run, which wakes every orchestrator (their workers' polls claim it): the
-- caller sends notify_wake (on Citus a notification in this statement would be sent on a
-- worker, which refuses to prepare a two-phase commit after it and where nobody listens).
SELECT w.run_id AS id, r.pull
FROM w JOIN runs r ON r.id = w.run_id
WHERE w.woken;

-- name: event_workflows
-- The workflows of project $1 that every event named $2 starts a run of, with their options
-- (a debounce or a batch gathers the event into a run).
SELECT name, options FROM workflows WHERE project_id = $1 AND options ->> 'onEvent' = $2 ORDER BY name;
