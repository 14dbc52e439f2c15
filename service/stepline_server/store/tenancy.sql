-- Projects, environments, API keys and the server's secrets.

-- name: bootstrap_lock
-- Orchestrators starting at once make the default project one after another (namespace 5 of
-- the advisory locks): on Citus, projects and environments are reference tables, whose writes
-- lock each table's shard on every node, and two starts taking those in turns deadlocked.
SELECT pg_advisory_xact_lock(5, 0);

-- name: ensure_project
INSERT INTO projects (id, name) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING;

-- name: insert_project
INSERT INTO projects (id, name) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING RETURNING *;

-- name: get_project
SELECT * FROM projects WHERE id = $1;

-- name: list_projects
SELECT * FROM projects ORDER BY name;

-- name: find_project
SELECT * FROM projects WHERE name = $1;

-- name: insert_environment
INSERT INTO environments (id, project_id, name) VALUES ($1, $2, $3)
ON CONFLICT (project_id, name) DO NOTHING
RETURNING *;

-- name: find_environment
SELECT * FROM environments WHERE project_id = $1 AND name = $2;

-- name: project_environments
SELECT * FROM environments WHERE project_id = $1 ORDER BY created_at, name;

-- name: insert_key
INSERT INTO api_keys (id, project_id, name, key_hash, role, prefix)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING *;

-- name: find_key
-- The key's context: its environment (the scope of every query), project and role.
SELECT k.id, k.name, k.role, e.id AS environment_id, e.name AS environment,
       p.id AS project_id, p.name AS project
FROM api_keys k
JOIN environments e ON e.id = k.project_id
JOIN projects p ON p.id = e.project_id
WHERE k.key_hash = $1 AND k.revoked_at IS NULL;

-- name: environment_keys
SELECT k.*, e.name AS environment FROM api_keys k JOIN environments e ON e.id = k.project_id
WHERE k.project_id = $1 AND k.revoked_at IS NULL
ORDER BY k.created_at, k.id;

-- name: project_keys
SELECT k.*, e.name AS environment FROM api_keys k JOIN environments e ON e.id = k.project_id
WHERE e.project_id = $1 AND k.revoked_at IS NULL
ORDER BY e.name, k.created_at, k.id;

-- name: revoke_key
-- Revokes key $1 of environment $2 (any when NULL) of project $3 (any when NULL: the CLI),
-- unless its role is one of $4 (an admin cannot revoke an owner key); the dashboard sessions
-- it signed in end with it.
WITH revoked AS (
    UPDATE api_keys k SET revoked_at = now()
    WHERE k.id = $1 AND ($2::uuid IS NULL OR k.project_id = $2) AND k.revoked_at IS NULL
      AND ($3::uuid IS NULL OR k.project_id IN (SELECT id FROM environments WHERE project_id = $3))
      AND NOT (k.role = ANY ($4::text[]))
    RETURNING k.id
), ended AS (
    DELETE FROM dashboard_sessions WHERE key_id IN (SELECT id FROM revoked)
)
SELECT id FROM revoked;

-- name: server_secrets
SELECT secret FROM server_secrets ORDER BY id DESC;

-- name: insert_server_secret
INSERT INTO server_secrets (secret)
SELECT $1 WHERE NOT EXISTS (SELECT 1 FROM server_secrets);
