-- Pausing a workflow or an app: while paused, none of its runs is leased to be invoked
-- (lease_runs sets them aside); resuming makes the runs set aside due again.

-- name: pause_workflow
-- Pauses workflow $2 of environment $1 (again: no change, it keeps when it was paused).
-- (The time read once in FROM: Citus takes no now() inside coalesce.)
UPDATE workflows SET paused_at = coalesce(paused_at, t.now)
FROM (SELECT now() AS now) t
WHERE project_id = $1 AND name = $2
RETURNING workflows.*, (SELECT a.slug FROM apps a WHERE a.id = workflows.app_id) AS app_slug,
          (SELECT a.name FROM apps a WHERE a.id = workflows.app_id) AS app_name;

-- name: resume_workflow
-- Resumes workflow $2 of environment $1: its runs set aside while it was paused are due again,
-- as of when they were created, so the claims take them higher priority first, then oldest
-- (those of a paused app are set aside again when claimed): each resumed by run_resume, in id
-- order (a materialised CTE), its condition (set aside still) checked under its row lock. No
-- lock is taken first: on Citus that would be FOR UPDATE across shards. Wakes every
-- dispatcher.
WITH w AS (
    UPDATE workflows SET paused_at = NULL
    WHERE project_id = $1 AND name = $2
    RETURNING *
),
aside AS MATERIALIZED (
    SELECT runs.id, runs.project_id FROM runs JOIN w
        ON runs.project_id = w.project_id AND runs.workflow = w.name
    WHERE runs.paused
    ORDER BY runs.id
),
r AS MATERIALIZED (
    SELECT id FROM aside WHERE run_resume(id, project_id)
)
SELECT w.*, (SELECT a.slug FROM apps a WHERE a.id = w.app_id) AS app_slug,
       (SELECT a.name FROM apps a WHERE a.id = w.app_id) AS app_name,
       (SELECT count(*) FROM r) AS resumed, pg_notify('stepline_wake', '')
FROM w;

-- name: pause_app
-- Pauses app $2 (its id) of environment $1 (again: no change; the time read as
-- pause_workflow reads it).
UPDATE apps SET paused_at = coalesce(paused_at, t.now)
FROM (SELECT now() AS now) t
WHERE project_id = $1 AND id = $2
RETURNING apps.*;

-- name: resume_app
-- Resumes app $2 of environment $1: its runs set aside while it was paused are due again, as
-- resume_workflow does (those of a paused workflow are set aside again when claimed).
WITH a AS (
    UPDATE apps SET paused_at = NULL WHERE project_id = $1 AND id = $2 RETURNING *
),
aside AS MATERIALIZED (
    SELECT runs.id, runs.project_id FROM runs JOIN a ON runs.app_id = a.id
    WHERE runs.paused
    ORDER BY runs.id
),
r AS MATERIALIZED (
    SELECT id FROM aside WHERE run_resume(id, project_id)
)
SELECT a.*, (SELECT count(*) FROM r) AS resumed, pg_notify('stepline_wake', '') FROM a;
