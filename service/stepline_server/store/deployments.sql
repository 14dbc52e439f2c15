-- An app's deployments: the one the orchestrator expects (the one it last answered or synced
-- with), the others it keeps for the runs started on them, and moving runs between them.

-- name: run_on_former_deployment
-- Whether run $1 is on a deployment that is no longer its app's current one.
SELECT EXISTS (SELECT 1 FROM runs r JOIN deployments d ON d.id = r.deployment
               WHERE r.id = $1 AND NOT d.current);

-- name: app_answered_with
-- An invocation of a run on app $1's current deployment (or on none: run_on_former_deployment
-- says) was answered by deployment $2: the app's next invocations expect it (their
-- invocation.started events carry it), as a sync would have recorded it. (Two statements:
-- Citus writes a reference table only in a statement that reads no distributed one.)
UPDATE apps a SET deployment_id = $2
WHERE a.id = $1 AND a.deployment_id IS DISTINCT FROM $2;

-- name: list_deployments
-- The deployments of app $1, newest first, each with how many runs not ended are on it (the
-- current one also counts those on no deployment) and the id it goes by.
-- (The runs are counted by deployment once, then joined: Citus takes no subquery over the
-- runs correlated with a reference table's rows.)
WITH c AS (
    SELECT r.deployment, count(*) AS n FROM runs r
    WHERE r.app_id = $1 AND r.status IN ('running', 'cancelling')
    GROUP BY r.deployment
)
SELECT d.id, d.app_id, d.url, d.current, d.created_at,
       coalesce(d.deployment_id, CASE WHEN d.current THEN a.deployment_id END) AS deployment_id,
       coalesce(sum(c.n), 0)::bigint AS running_runs
FROM deployments d JOIN apps a ON a.id = d.app_id
LEFT JOIN c ON c.deployment = d.id OR (d.current AND c.deployment IS NULL)
WHERE d.app_id = $1
GROUP BY d.id, a.deployment_id
ORDER BY d.created_at DESC, d.id DESC;

-- name: get_deployment
-- Deployment $2 of app $1 (by its id, or the id it goes by: the newest going by it).
SELECT d.id, d.app_id, d.url, d.current, d.created_at,
       coalesce(d.deployment_id, CASE WHEN d.current THEN a.deployment_id END) AS deployment_id
FROM deployments d JOIN apps a ON a.id = d.app_id
WHERE d.app_id = $1
  AND (d.id::text = $2
       OR coalesce(d.deployment_id, CASE WHEN d.current THEN a.deployment_id END) = $2)
ORDER BY d.id::text = $2 DESC, d.created_at DESC
LIMIT 1;

-- name: lock_app_deployments
-- Locks app $1's row while its deployments change (one change at a time per app).
SELECT id FROM apps WHERE id = $1 FOR UPDATE;

-- name: retire_current_deployment
-- App $1's current deployment stops being current; it keeps the id it went by (the app's,
-- when it was given none).
UPDATE deployments d SET current = false,
       deployment_id = coalesce(d.deployment_id, (SELECT a.deployment_id FROM apps a
                                                  WHERE a.id = d.app_id))
WHERE d.app_id = $1 AND d.current;

-- name: insert_deployment
-- Deployment $1 of app $2 at URL $4 (NULL for a pull app), going by $3, current from now:
-- the app's URL becomes its own, and the app goes by $3 (or by what it answers next).
WITH d AS (
    INSERT INTO deployments (id, app_id, deployment_id, url, current)
    VALUES ($1, $2, $3, $4, true)
    RETURNING *
)
UPDATE apps a SET url = d.url, deployment_id = d.deployment_id, updated_at = now()
FROM d WHERE a.id = d.app_id
RETURNING d.id;

-- name: current_deployment_url
-- The app $1's URL changed (PATCH): its current deployment is at the new URL.
UPDATE deployments d SET url = a.url FROM apps a
WHERE a.id = $1 AND d.app_id = a.id AND d.current;

-- name: deployment_runs_left
-- How many runs not ended are on deployment $1.
SELECT count(*) FROM runs WHERE deployment = $1 AND status IN ('running', 'cancelling');

-- name: move_deployment_runs
-- Moves every run not ended on deployment $1 to deployment $2 (in id order, as every
-- statement that locks several runs does); their next invocation goes to its URL.
-- Each run moves by run_move, once all are locked (a materialised CTE).
WITH m AS MATERIALIZED (
    SELECT id, project_id FROM runs
    WHERE deployment = $1 AND status IN ('running', 'cancelling')
    ORDER BY id FOR NO KEY UPDATE
)
SELECT id FROM m WHERE run_move(id, project_id, $2);

-- name: delete_deployment
-- Deletes deployment $1 (not the current one); ended runs on it keep no deployment.
DELETE FROM deployments WHERE id = $1 AND NOT current RETURNING id;

-- name: move_run
-- Moves run $1 of environment $2, if not ended, to deployment $3 of its own app: its next
-- invocation goes to that deployment's URL. No row when the run is not found, is ended, or the
-- deployment is not its app's.
-- (run_move.)
SELECT $1::uuid AS id WHERE run_move($1, $2, $3);

-- name: pull_deployment
-- Which deployment of pull app $1 a worker declaring deployment id $2 gets runs of (NULL: it
-- declared none, so the current one), and whether it is the current one. No row when the app
-- has no such deployment.
SELECT d.id, d.current FROM deployments d JOIN apps a ON a.id = d.app_id
WHERE d.app_id = $1
  AND CASE WHEN $2::text IS NULL THEN d.current
           ELSE coalesce(d.deployment_id, CASE WHEN d.current THEN a.deployment_id END) = $2 END
ORDER BY d.current
LIMIT 1;

-- name: get_current_deployment
-- The id of app $1's current deployment.
SELECT id FROM deployments WHERE app_id = $1 AND current;

-- name: deployment_in_environment
-- Deployment $2, when it is of an app of environment $1.
SELECT d.id FROM deployments d JOIN apps a ON a.id = d.app_id
WHERE d.id = $2 AND a.project_id = $1;
