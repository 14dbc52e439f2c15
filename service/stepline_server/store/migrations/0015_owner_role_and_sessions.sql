-- A project-level role, owner, above an environment's admin; and the dashboard's sessions kept
-- in the database (the cookie holds only an opaque id), ended by signing out or by revoking
-- the key they signed in with.

ALTER TABLE api_keys DROP CONSTRAINT api_keys_role_check;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_role_check
    CHECK (role IN ('owner', 'admin', 'write', 'read'));
COMMENT ON COLUMN api_keys.role IS 'owner: everything in every environment of its project (keys of any environment, new environments); admin: everything in its environment, its keys included; write: everything but keys; read: GET only.';

CREATE TABLE dashboard_sessions (
    id_hash text PRIMARY KEY,
    key_id uuid NOT NULL REFERENCES api_keys (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX dashboard_sessions_key ON dashboard_sessions (key_id);
CREATE INDEX dashboard_sessions_expiry ON dashboard_sessions (expires_at);
COMMENT ON TABLE dashboard_sessions IS 'A signed-in dashboard session: the cookie holds a random id, this row its SHA-256 and the key it signed in with. Signing out deletes it; revoking the key deletes its sessions.';
COMMENT ON COLUMN dashboard_sessions.expires_at IS 'The session ends then (12 hours after its last request); an expired row is never used and is deleted at the next sign-in.';
