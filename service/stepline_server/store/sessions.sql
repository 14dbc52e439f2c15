-- The dashboard's server-side sessions (the cookie holds only a random id; rows its hash).

-- name: insert_session
-- A sign-in: a new session for key $2, which ends at $3 unless used before then.
INSERT INTO dashboard_sessions (id_hash, key_id, expires_at) VALUES ($1, $2, $3);

-- name: session_viewer
-- The signed-in key of a live session: none once it expired, was ended, or its key revoked.
SELECT k.id AS key_id, k.role, e.id AS environment_id, e.name AS environment,
       p.id AS project_id, p.name AS project, s.expires_at
FROM dashboard_sessions s
JOIN api_keys k ON k.id = s.key_id AND k.revoked_at IS NULL
JOIN environments e ON e.id = k.project_id
JOIN projects p ON p.id = e.project_id
WHERE s.id_hash = $1 AND s.expires_at > now();

-- name: extend_session
-- A session in use lasts until $2 (written at most once a minute per session).
UPDATE dashboard_sessions SET expires_at = $2 WHERE id_hash = $1 AND expires_at < $2;

-- name: delete_session
-- Signing out ends the session at once, on every orchestrator.
DELETE FROM dashboard_sessions WHERE id_hash = $1;

-- name: delete_expired_sessions
-- Expired sessions are never used; they are deleted as others sign in.
DELETE FROM dashboard_sessions WHERE expires_at <= now();
