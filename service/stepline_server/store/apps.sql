-- Apps and the workflows they declare.

-- name: rotate_app_secret
-- App $2 of $1 signs with secret $3 from now on; the previous one is kept after it.
UPDATE apps SET signing_secrets = ARRAY[$3, signing_secrets[1]], updated_at = now()
WHERE project_id = $1 AND id = $2
RETURNING *;

-- name: insert_app
-- A push app has a url ($5), a pull app ($7 = 'pull') none; its one deployment ($8, current)
-- is at that url.
WITH a AS (
    INSERT INTO apps (id, project_id, slug, name, url, signing_secrets, kind)
    VALUES ($1, $2, $3, $4, $5, $6, $7)
    ON CONFLICT (project_id, name) DO NOTHING
    RETURNING *
),
d AS (
    INSERT INTO deployments (id, app_id, url, current) SELECT $8, a.id, a.url, true FROM a
)
SELECT * FROM a;

-- name: get_app
SELECT * FROM apps WHERE project_id = $1 AND (id::text = $2 OR slug = $2);

-- name: get_app_by_name
SELECT * FROM apps WHERE project_id = $1 AND name = $2;

-- name: list_apps
SELECT * FROM apps
WHERE project_id = $1 AND ($2::timestamptz IS NULL OR (created_at, id) > ($2, $3::uuid))
ORDER BY created_at, id
LIMIT $4;

-- name: update_app
-- Changes app $2's URL (its current deployment's too) and/or name.
WITH a AS (
    UPDATE apps SET url = coalesce($3, url), name = coalesce($4, name), updated_at = now()
    WHERE project_id = $1 AND id = $2
    RETURNING *
),
d AS (
    UPDATE deployments d SET url = a.url FROM a WHERE d.app_id = a.id AND d.current
)
SELECT * FROM a;

-- name: lock_app_runs
-- Locks the runs of app $2 of project $1, and the runs of other apps whose child runs they
-- are, in id order, as every statement that locks several runs does, so deleting the app
-- (whose cascade takes them in the order they lie) never deadlocks with a group commit or an
-- invocation's end holding some of them. FOR NO KEY UPDATE, as an UPDATE locks: a transaction
-- updating a child run a second time checks its parent key, which locks the parent for share,
-- and a stronger lock on the parent, held while waiting for that child, would deadlock with it.
-- (The cascade still takes each run for the delete when it reaches it.) The ids are read
-- first, then locked one by one by lock_runs_in_order: Citus locks rows only by a statement
-- on one shard.
SELECT lock_runs_in_order(ARRAY(
    SELECT id FROM runs WHERE app_id = $2 AND project_id = $1
    UNION
    SELECT c.parent_run_id FROM runs c
    WHERE c.app_id = $2 AND c.project_id = $1 AND c.parent_run_id IS NOT NULL
    ORDER BY 1
));

-- name: fail_orphaned_parents
-- Before app $2 of project $1 is deleted: every run of another app waiting on an invoke step
-- for a child run of this app gets that step failed (child_deleted, $3 the error): no parent
-- waits forever for a child that no longer exists. Answers the parents and their steps. (The
-- children are read first, c; each parent's step is then joined by its run: on Citus a child
-- and its parent are on different shards.)
WITH c AS MATERIALIZED (
    SELECT c.id, c.parent_run_id, c.parent_step FROM runs c
    WHERE c.app_id = $2 AND c.project_id = $1 AND c.parent_run_id IS NOT NULL
)
UPDATE steps s SET status = 'failed', error = $3::jsonb, ended_at = now()
FROM c, runs p
WHERE s.run_id = c.parent_run_id AND s.name = c.parent_step
  AND p.id = s.run_id AND p.app_id <> $2
  AND s.kind = 'invoke' AND s.status = 'waiting'
RETURNING s.run_id, s.name, c.id AS child_id;

-- name: delete_app
-- Deletes app $2 of project $1 with its workflows and runs (by cascade).
DELETE FROM apps WHERE project_id = $1 AND id = $2;

-- name: app_synced
-- App $1 synced now: its deployment $2, and the protocol version $3 and SDK version $4 it
-- declared (only that protocol's features are used when invoking it).
UPDATE apps SET synced_at = now(), deployment_id = $2, protocol_version = $3, sdk_version = $4
WHERE id = $1 RETURNING *;

-- name: upsert_workflow
-- Stores a synced workflow; $5: the definitions version it changed in (NULL: it did not). A
-- workflow of another app is taken from it only when $6 (asked to): no row otherwise.
INSERT INTO workflows (project_id, name, app_id, options, synced_at, version)
VALUES ($1, $2, $3, $4, now(), coalesce($5::integer, 1))
ON CONFLICT (project_id, name)
DO UPDATE SET app_id = excluded.app_id, options = excluded.options, synced_at = excluded.synced_at,
              version = coalesce($5::integer, workflows.version)
WHERE workflows.app_id = excluded.app_id OR $6::boolean
RETURNING name;

-- name: workflows_held_elsewhere
-- The workflows named $3 that another app than $2 of environment $1 registered, with that
-- app's slug and name, locked until the sync that asks ends.
SELECT w.name, a.slug AS app_slug, a.name AS app_name
FROM workflows w JOIN apps a ON a.id = w.app_id
WHERE w.project_id = $1 AND w.name = ANY($3::text[]) AND w.app_id <> $2
ORDER BY w.name
FOR UPDATE OF w;

-- name: app_definitions
-- The workflows app $2 hosts in environment $1, as last synced.
SELECT name, options FROM workflows WHERE project_id = $1 AND app_id = $2;

-- name: next_definitions_version
UPDATE environments SET definitions_version = definitions_version + 1 WHERE id = $1
RETURNING definitions_version;

-- name: list_workflows
SELECT w.*, a.slug AS app_slug, a.name AS app_name FROM workflows w JOIN apps a ON a.id = w.app_id
WHERE w.project_id = $1 AND ($2::text IS NULL OR w.name > $2)
ORDER BY w.name
LIMIT $3;

-- name: get_workflow
SELECT w.*, a.url AS app_url, a.slug AS app_slug, a.name AS app_name,
       a.paused_at AS app_paused_at
FROM workflows w JOIN apps a ON a.id = w.app_id
WHERE w.project_id = $1 AND w.name = $2;

-- name: lock_app_sync
-- Serialises the syncs of environment $1's apps until the transaction ends: on Citus the
-- tables a sync writes are reference tables, whose rows are locked on every node, and two
-- syncs at once (workers of one pull app starting together) deadlocked. Namespace 6 of the
-- advisory locks.
SELECT pg_advisory_xact_lock(6, hashtext($1::uuid::text));
