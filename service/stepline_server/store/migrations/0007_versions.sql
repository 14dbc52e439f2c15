-- Versions of an environment's workflow definitions: each sync that changes an app's workflows
-- (names, options, schemas) makes the next one, and every run records the one it started under.

ALTER TABLE environments ADD COLUMN definitions_version integer NOT NULL DEFAULT 0;
COMMENT ON COLUMN environments.definitions_version IS 'The newest version of the environment''s workflow definitions (0: none synced yet).';
ALTER TABLE workflows ADD COLUMN version integer NOT NULL DEFAULT 1;
COMMENT ON COLUMN workflows.version IS 'The definitions version of the sync that last changed this workflow''s app.';
ALTER TABLE runs ADD COLUMN definition_version integer;
COMMENT ON COLUMN runs.definition_version IS 'The definitions version of its workflow when the run was started.';
