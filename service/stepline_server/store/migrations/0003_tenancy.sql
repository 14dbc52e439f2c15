-- Projects have environments; every scoped table's project_id now holds an environment id.
--
-- The scope column keeps its name so no query changes: apps, workflows, runs, steps,
-- callbacks, events, run_events, schedules and api_keys are scoped by "project_id", which
-- from here on is the id of an environment row (projects -> environments -> resources). Each
-- existing project's production environment takes the project's own id, so existing rows
-- move into it unchanged; staging and development are made beside it.

CREATE TABLE environments (
    id uuid PRIMARY KEY,
    project_id uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,63}$'),
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (project_id, name)
);
COMMENT ON TABLE environments IS 'An environment of a project. Every scoped table''s project_id column holds an environment id: a key sees one environment.';

INSERT INTO environments (id, project_id, name) SELECT id, id, 'production' FROM projects;
INSERT INTO environments (id, project_id, name)
SELECT gen_random_uuid(), p.id, e.name
FROM projects p CROSS JOIN (VALUES ('staging'), ('development')) AS e (name);

ALTER TABLE api_keys DROP CONSTRAINT api_keys_project_id_fkey;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_project_id_fkey
    FOREIGN KEY (project_id) REFERENCES environments (id) ON DELETE CASCADE;
ALTER TABLE apps DROP CONSTRAINT apps_project_id_fkey;
ALTER TABLE apps ADD CONSTRAINT apps_project_id_fkey
    FOREIGN KEY (project_id) REFERENCES environments (id) ON DELETE CASCADE;
ALTER TABLE workflows DROP CONSTRAINT workflows_project_id_fkey;
ALTER TABLE workflows ADD CONSTRAINT workflows_project_id_fkey
    FOREIGN KEY (project_id) REFERENCES environments (id) ON DELETE CASCADE;
ALTER TABLE runs DROP CONSTRAINT runs_project_id_fkey;
ALTER TABLE runs ADD CONSTRAINT runs_project_id_fkey
    FOREIGN KEY (project_id) REFERENCES environments (id) ON DELETE CASCADE;
ALTER TABLE events DROP CONSTRAINT events_project_id_fkey;
ALTER TABLE events ADD CONSTRAINT events_project_id_fkey
    FOREIGN KEY (project_id) REFERENCES environments (id) ON DELETE CASCADE;
ALTER TABLE schedules DROP CONSTRAINT schedules_project_id_fkey;
ALTER TABLE schedules ADD CONSTRAINT schedules_project_id_fkey
    FOREIGN KEY (project_id) REFERENCES environments (id) ON DELETE CASCADE;

ALTER TABLE api_keys ADD COLUMN role text NOT NULL DEFAULT 'admin'
    CHECK (role IN ('admin', 'write', 'read'));
ALTER TABLE api_keys ADD COLUMN prefix text NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN revoked_at timestamptz;
COMMENT ON COLUMN api_keys.project_id IS 'The environment the key sees (an environments row).';
COMMENT ON COLUMN api_keys.role IS 'admin: everything, keys and environments included; write: everything but keys; read: GET only.';
COMMENT ON COLUMN api_keys.prefix IS 'The first characters of the key, shown in lists so a person can tell keys apart.';
COMMENT ON COLUMN api_keys.revoked_at IS 'When the key was revoked; a revoked key is refused.';
