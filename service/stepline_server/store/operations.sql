-- Bulk operations: the runs a filter matches, the operation and its fixed set of runs, the
-- batches its loop claims, and what became of each run.

-- name: match_runs
-- A bulk filter's runs in project $1, as rules.bulk.select made it: statuses $2 (those the
-- action acts on), workflow $3, app $4, deployment of the last invocation $5, created in
-- [$6, $7), run key $8 exact or $9 as a prefix, trigger $10, a recorded step $11, one of the
-- ids $12 (the dashboard's selected runs), on deployment $14 (the current one also has the
-- runs on none). How many, and the newest $13 ids as a sample.
WITH m AS (
    SELECT r.id, r.created_at FROM runs r
    WHERE r.project_id = $1
      AND r.status = ANY ($2::text[]::run_status[])
      AND ($3::text IS NULL OR r.workflow = $3)
      AND ($4::uuid IS NULL OR r.app_id = $4)
      AND ($5::text IS NULL OR (SELECT e.deployment_id FROM run_events e
                                 WHERE e.run_id = r.id AND e.deployment_id IS NOT NULL
                                 ORDER BY e.seq DESC LIMIT 1) = $5)
      AND ($6::timestamptz IS NULL OR r.created_at >= $6)
      AND ($7::timestamptz IS NULL OR r.created_at < $7)
      AND ($8::text IS NULL OR r.run_key = $8)
      AND ($9::text IS NULL OR starts_with(r.run_key, $9))
      AND ($10::text IS NULL OR r.trigger = $10)
      AND ($11::text IS NULL OR EXISTS (SELECT 1 FROM steps s
                                         WHERE s.run_id = r.id AND s.name = $11))
      AND ($12::uuid[] IS NULL OR r.id = ANY ($12::uuid[]))
      AND ($14::uuid IS NULL OR r.deployment = $14
           OR (r.deployment IS NULL AND EXISTS (SELECT 1 FROM deployments d
                                                WHERE d.id = $14 AND d.current
                                                  AND d.app_id = r.app_id)))
)
SELECT (SELECT count(*) FROM m)::integer AS matched,
       (SELECT coalesce(jsonb_agg(s.id::text ORDER BY s.created_at DESC, s.id DESC), '[]')
        FROM (SELECT id, created_at FROM m ORDER BY created_at DESC, id DESC LIMIT $13) s)
           AS sample;

-- name: insert_operation
-- A new operation, running, with no runs yet (fill_operation lists them in the same
-- transaction). $6: a move's deployment.
INSERT INTO operations (id, project_id, action, filter, from_step, deployment)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING *;

-- name: fill_operation
-- The set of an operation's runs is fixed here, once: the runs match_runs' filter ($2–$12 and
-- $14, as there; $13 the project) matches now, oldest first, numbered from 1; answers how many
-- (operation_filled records it on the operation: Citus writes the operations, a reference
-- table, only in a statement that reads no distributed table).
WITH m AS (
    SELECT r.id, row_number() OVER (ORDER BY r.created_at, r.id) AS position FROM runs r
    WHERE r.project_id = $13
      AND r.status = ANY ($2::text[]::run_status[])
      AND ($3::text IS NULL OR r.workflow = $3)
      AND ($4::uuid IS NULL OR r.app_id = $4)
      AND ($5::text IS NULL OR (SELECT e.deployment_id FROM run_events e
                                 WHERE e.run_id = r.id AND e.deployment_id IS NOT NULL
                                 ORDER BY e.seq DESC LIMIT 1) = $5)
      AND ($6::timestamptz IS NULL OR r.created_at >= $6)
      AND ($7::timestamptz IS NULL OR r.created_at < $7)
      AND ($8::text IS NULL OR r.run_key = $8)
      AND ($9::text IS NULL OR starts_with(r.run_key, $9))
      AND ($10::text IS NULL OR r.trigger = $10)
      AND ($11::text IS NULL OR EXISTS (SELECT 1 FROM steps s
                                         WHERE s.run_id = r.id AND s.name = $11))
      AND ($12::uuid[] IS NULL OR r.id = ANY ($12::uuid[]))
      AND ($14::uuid IS NULL OR r.deployment = $14
           OR (r.deployment IS NULL AND EXISTS (SELECT 1 FROM deployments d
                                                WHERE d.id = $14 AND d.current
                                                  AND d.app_id = r.app_id)))
), ins AS (
    INSERT INTO operation_runs (operation_id, position, run_id)
    SELECT $1, m.position, m.id FROM m
    RETURNING 1
)
SELECT count(*)::integer FROM ins;

-- name: operation_filled
-- Operation $1 has $2 runs (fill_operation listed them): it counts them, and with none it is
-- completed at once. (The time is computed once, in t: Citus takes no now() in a CASE of an
-- UPDATE.)
UPDATE operations o
SET matched = $2::integer,
    status = CASE WHEN $2::integer = 0 THEN 'completed' ELSE 'running' END,
    ended_at = CASE WHEN $2::integer = 0 THEN t.now END
FROM (SELECT now() AS now) AS t
WHERE o.id = $1
RETURNING o.*;

-- name: get_operation
-- An operation of project $1 (another project's is not found).
SELECT * FROM operations WHERE project_id = $1 AND id = $2;

-- name: list_operations
-- Operations of project $1, newest first, after the keyset cursor ($2, $3), at most $4.
SELECT * FROM operations
WHERE project_id = $1
  AND ($2::timestamptz IS NULL OR (created_at, id) < ($2, $3::uuid))
ORDER BY created_at DESC, id DESC
LIMIT $4;

-- name: operation_errors
-- The first $3 errors of operation $1 (project $2), in the order of its runs.
SELECT r.run_id, r.error, r.done_at FROM operation_runs r
JOIN operations o ON o.id = r.operation_id AND o.project_id = $2
WHERE r.operation_id = $1 AND r.outcome = 'failed'
ORDER BY r.position
LIMIT $3;

-- name: cancel_operation
-- A cancel request stops a running operation (it waits for a batch being worked to commit:
-- what that batch did stays done, and no batch starts after); an ended one is left as it is.
UPDATE operations SET status = 'cancelled', ended_at = now()
WHERE project_id = $1 AND id = $2 AND status = 'running'
RETURNING *;

-- name: claim_operation
-- The running operation whose turn it is among those no other orchestrator is working a batch
-- of, its turn taken now. Environments take turns (the one whose operations had a batch
-- claimed longest ago first, one with none claimed yet before any), and so do the operations
-- of an environment, so a big operation never holds up another environment's. Its row stays
-- locked for the batch, so one batch of an operation is worked at a time and a cancel request
-- waits for it; its turn is taken even when the batch then waits for room. (The next one is a
-- subquery of the UPDATE, not a CTE joined to it: Citus 13.2 reads such a CTE's result of a
-- reference table wrongly, "invalid input syntax for type uuid: PGCOPY".)
UPDATE operations o SET turn_at = now()
WHERE o.id = (
    SELECT n.id FROM operations n
    JOIN (SELECT project_id, max(turn_at) AS turn_at FROM operations
          WHERE status = 'running'
          GROUP BY project_id) AS env ON env.project_id = n.project_id
    WHERE n.status = 'running'
    ORDER BY env.turn_at NULLS FIRST, n.turn_at NULLS FIRST, n.created_at, n.id
    LIMIT 1
    FOR UPDATE OF n SKIP LOCKED
)
RETURNING o.*;

-- name: claim_operation_runs
-- The next $2 runs of operation $1 not acted on yet, locked until the batch's transaction
-- records their outcomes (a crash before that leaves them to the next batch).
SELECT position, run_id FROM operation_runs
WHERE operation_id = $1 AND outcome IS NULL
ORDER BY position
LIMIT $2
FOR UPDATE SKIP LOCKED;

-- name: lock_operation_run
-- A run a bulk cancel is about to act on, locked, for its status now (NULL: it is gone).
SELECT status::text FROM runs WHERE project_id = $1 AND id = $2 FOR UPDATE;

-- name: record_operation_runs
-- What became of a batch's runs ($2: jsonb [{position, outcome, error}]) of operation $1, in
-- the transaction that acted on them: how many of them succeeded, failed and were skipped
-- (count_operation_runs adds them to the operation's counters).
WITH x AS (
    SELECT * FROM jsonb_to_recordset($2::jsonb) AS x(position integer, outcome text, error jsonb)
), u AS (
    UPDATE operation_runs r SET outcome = x.outcome, error = x.error, done_at = now()
    FROM x
    WHERE r.operation_id = $1 AND r.position = x.position AND r.outcome IS NULL
    RETURNING r.outcome
)
SELECT count(*) FILTER (WHERE outcome = 'succeeded')::integer AS succeeded,
       count(*) FILTER (WHERE outcome = 'failed')::integer AS failed,
       count(*) FILTER (WHERE outcome = 'skipped')::integer AS skipped
FROM u;

-- name: count_operation_runs
-- Operation $1's counters after a batch: $2 more runs succeeded, $3 failed, $4 were skipped.
-- Completed when no run is left ($5: runs still pending after this batch). (Apart from
-- record_operation_runs: Citus writes the operations, a reference table, only in a statement
-- that reads no distributed table; the time is computed once, in t, as Citus takes no now()
-- in a CASE of an UPDATE.)
UPDATE operations o
SET succeeded = o.succeeded + $2::integer, failed = o.failed + $3::integer,
    skipped = o.skipped + $4::integer,
    status = CASE WHEN $5::boolean THEN o.status ELSE 'completed' END,
    ended_at = CASE WHEN $5::boolean THEN o.ended_at ELSE t.now END
FROM (SELECT now() AS now) AS t
WHERE o.id = $1
RETURNING o.*;

-- name: operation_runs_left
-- Whether operation $1 has a run not acted on yet besides positions $2 (the batch at hand).
SELECT EXISTS (
    SELECT 1 FROM operation_runs
    WHERE operation_id = $1 AND outcome IS NULL AND position <> ALL ($2::integer[])
);

-- name: operation_runs_ahead
-- What operation $1 keeps in the dispatcher, among the runs it acted on last (its latest $2
-- positions done; an operation acts on its runs in order): how many are due and not yet taken
-- by an invocation (waiting), and how many are being invoked (invoking). Ended and sleeping
-- runs count in neither. rules.bulk.batch_room decides from these whether the next batch goes.
-- (The runs are read by id from the operation's list: on Citus the list is on the operation's
-- shard, the runs on theirs.)
SELECT count(*) FILTER (WHERE r.lease_token IS NULL AND r.ready_at <= now())::integer
           AS waiting,
       count(*) FILTER (WHERE r.lease_token IS NOT NULL)::integer AS invoking
FROM runs r
WHERE r.id IN (
    SELECT x.run_id FROM operations o
    JOIN operation_runs x ON x.operation_id = o.id
         AND x.position > o.succeeded + o.failed + o.skipped - $2
         AND x.position <= o.succeeded + o.failed + o.skipped
    WHERE o.id = $1 AND x.operation_id = $1 AND x.outcome = 'succeeded'
);

-- name: delete_old_operations
-- Up to $2 operations that ended more than $1 seconds ago, with their lists of runs (kept as
-- long as runs are, STEPLINE_RETENTION_DAYS). Rows another orchestrator is deleting are passed
-- over.
DELETE FROM operations WHERE id IN (
    SELECT id FROM operations
    WHERE ended_at < now() - make_interval(secs => $1::double precision)
    ORDER BY ended_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
);
