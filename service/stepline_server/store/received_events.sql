-- The events an environment received, as the dashboard's events page lists them.

-- name: received_events
-- The newest $2 events environment $1 received (events are kept a day), newest first, each
-- with its answer: the runs it resumed (matched) and started.
SELECT id, name, data, key, received_at, answer FROM events
WHERE project_id = $1
ORDER BY received_at DESC, id DESC
LIMIT $2;

-- name: events_page
-- The events environment $1 received, newest first: named $2 (any when NULL), received in
-- [$3, $4), before the keyset cursor ($5, $6); at most $7.
SELECT id, name, data, key, received_at, answer FROM events
WHERE project_id = $1
  AND ($2::text IS NULL OR name = $2)
  AND ($3::timestamptz IS NULL OR received_at >= $3)
  AND ($4::timestamptz IS NULL OR received_at < $4)
  AND ($5::timestamptz IS NULL OR (received_at, id) < ($5, $6::uuid))
ORDER BY received_at DESC, id DESC
LIMIT $7;

-- name: event_runs
-- The workflow and status of runs $2 of environment $1 (those an event resumed or started;
-- a run deleted since is left out).
SELECT id, workflow, status FROM runs WHERE project_id = $1 AND id = ANY($2::uuid[]);
