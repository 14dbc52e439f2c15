-- The events an environment received, as the dashboard's events page lists them.

-- name: received_events
-- The newest $2 events environment $1 received (events are kept a day), newest first, each
-- with its answer: the runs it resumed (matched) and started.
SELECT id, name, data, key, received_at, answer FROM events
WHERE project_id = $1
ORDER BY received_at DESC, id DESC
LIMIT $2;

-- name: event_runs
-- The workflow and status of runs $2 of environment $1 (those an event resumed or started;
-- a run deleted since is left out).
SELECT id, workflow, status FROM runs WHERE project_id = $1 AND id = ANY($2::uuid[]);
