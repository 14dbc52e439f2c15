-- Debounces and batches: the starts of a workflow gathered into one run until it fires.

-- name: lock_gathering_key
-- Serialises the starts that gather under key $4 of kind $3 of workflow $2 of project $1 until
-- the transaction ends (two orchestrators never open two gatherings of one key); answers the
-- transaction's time, which the gathering's times are counted in. Namespace 4 of the advisory
-- locks.
SELECT now() AS now FROM (
    SELECT pg_advisory_xact_lock(
        4, hashtext($1::uuid::text || ':' || $2::text || ':' || $3::text || ':' || $4::text))
) l;

-- name: open_gathering
-- The gathering of key $4 of kind $3 of workflow $2 of project $1, locked until the
-- transaction ends (a firing skips it meanwhile), and whether its run still gathers (running,
-- never invoked, no due time): a run cancelled or retried meanwhile gathers no more.
SELECT g.*,
       EXISTS (SELECT 1 FROM runs r
               WHERE r.id = g.run_id AND r.status = 'running' AND r.ready_at IS NULL
                 AND r.lease_token IS NULL AND r.started_at IS NULL) AS gathers
FROM run_gatherings g
WHERE g.project_id = $1 AND g.workflow = $2 AND g.kind = $3 AND g.key = $4
FOR UPDATE OF g;

-- name: drop_gathering
-- Forgets the gathering of run $1 (its run gathers no more).
DELETE FROM run_gatherings WHERE run_id = $1;

-- name: insert_gathering
-- Opens a gathering for run $5 (just created with its first start): project $1, workflow $2,
-- kind $3, key $4, the first event's id in $6 (a JSON array, empty for an API start), firing
-- at $7.
INSERT INTO run_gatherings (project_id, workflow, kind, key, run_id, event_ids, fire_at)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7)
RETURNING *;

-- name: join_gathering
-- Counts one more start in the gathering of run $1: the last start now, firing at $2, event
-- ids $3 (a JSON array) appended.
UPDATE run_gatherings
SET starts = starts + 1, last_at = now(), fire_at = $2, event_ids = event_ids || $3::jsonb
WHERE run_id = $1
RETURNING *;

-- name: debounce_input
-- Gives debounced run $1 (still gathering) the input of its last start, $2, with the
-- concurrency and rate limit key fields read from it as insert_run reads them.
-- (run_gather_input.)
-- (Answers whether it still gathers; the project read as wake reads it.)
SELECT run_gather_input($1, (SELECT project_id FROM runs WHERE id = $1), $2::jsonb, false);

-- name: batch_input
-- Appends the data $2 of one more event to batch run $1 (still gathering): its input is the
-- list of its events' data, in the order received.
-- (run_gather_input.)
-- (Answers whether it still gathers; the project read as wake reads it.)
SELECT run_gather_input($1, (SELECT project_id FROM runs WHERE id = $1), $2::jsonb, true);

-- name: fire_gatherings
-- Fires the gathering of run $1 now (a batch that just filled; the caller holds its row), or,
-- with $1 null, up to $2 gatherings whose time has come, each claimed (FOR UPDATE SKIP LOCKED)
-- so two orchestrators never fire one twice, and one a start is joining meanwhile is left for
-- the next pass. Firing deletes the gathering and makes its run due now, its time limit
-- counted from now, with run.debounced {starts} or run.batched {size, eventIds} in its
-- history; wakes every orchestrator's dispatcher. No row for a run that no longer gathers
-- (its gathering is deleted all the same).
WITH due AS (
    SELECT run_id FROM run_gatherings
    WHERE run_id = $1::uuid OR ($1::uuid IS NULL AND fire_at <= now())
    ORDER BY fire_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
g AS (
    DELETE FROM run_gatherings USING due WHERE run_gatherings.run_id = due.run_id
    RETURNING run_gatherings.*
),
-- Each run fires by run_fire (due now, its time limit from now, its history told).
r AS MATERIALIZED (
    SELECT runs.id, runs.project_id, runs.workflow, g.kind, g.starts FROM g
    JOIN runs ON runs.id = g.run_id
    WHERE run_fire(runs.id, runs.project_id, jsonb_build_array(
        CASE g.kind WHEN 'debounce'
             THEN jsonb_build_object('type', 'run.debounced',
                                     'data', jsonb_build_object('starts', g.starts))
             ELSE jsonb_build_object('type', 'run.batched',
                                     'data', jsonb_build_object('size', g.starts,
                                                                'eventIds', g.event_ids))
        END))
)
SELECT id, project_id, workflow, kind, starts,
       CASE WHEN EXISTS (SELECT 1 FROM r) THEN pg_notify('stepline_wake', '') END AS woken
FROM r;

-- name: gathering_of_run
-- The open gathering run $1 belongs to, if any (what GET /v1/runs/{id} shows of it).
SELECT kind, starts, first_at, fire_at, event_ids FROM run_gatherings WHERE run_id = $1;
