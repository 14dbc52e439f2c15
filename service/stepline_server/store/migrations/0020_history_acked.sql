-- A delta goes only to a run whose last invocation was answered by an SDK that reads deltas:
-- which replica of an app answers is the load balancer's choice, so what the app declared at
-- its last sync cannot tell (a rolling deploy or a rollback mixes SDK versions).
ALTER TABLE runs ADD COLUMN history_acked uuid;
COMMENT ON COLUMN runs.history_acked IS 'The last invocation of the run answered by an SDK that reads history deltas (its answer declared protocol 3 or newer): the next invocation carries only what changed since history_invocation when this is history_invocation, else every step.';
