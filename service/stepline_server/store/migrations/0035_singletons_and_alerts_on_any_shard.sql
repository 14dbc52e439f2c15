-- A run's singleton key is held in a row of its own (run_singletons), so that on Citus, where a
-- unique index must include the distribution column and runs_singleton cannot stay unique, one
-- run at a time still holds a key; and a run's end leaves the alerts to end_runs (a reference
-- table is written from the coordinator's session, not from a transition on a worker); and a
-- run's published state is kept by a function of the run (run_record_state), which on Citus
-- runs on the worker whose transaction wrote the state's steps.

CREATE TABLE run_singletons (
    id uuid PRIMARY KEY,
    run_id uuid NOT NULL
);
COMMENT ON TABLE run_singletons IS 'Which run holds each singleton key: id is singleton_id(environment, workflow, key value); the key is held while that run has not ended (a run ended or gone frees it, so an end writes nothing here).';

CREATE FUNCTION singleton_id(p_project uuid, p_workflow text, p_key text)
RETURNS uuid LANGUAGE sql IMMUTABLE AS $$
    SELECT md5(jsonb_build_array(p_project, p_workflow, p_key)::text)::uuid
$$;
COMMENT ON FUNCTION singleton_id(uuid, text, text) IS 'The id of a singleton key''s row in run_singletons: a hash of its environment, workflow and value.';

CREATE FUNCTION take_singleton(p_project uuid, p_workflow text, p_key text, p_run uuid)
RETURNS uuid LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_id uuid := singleton_id(p_project, p_workflow, p_key);
    v_holder uuid;
BEGIN
    -- Run p_run takes singleton key p_key of workflow p_workflow (environment p_project), unless
    -- another run not ended holds it: answers that run (and takes nothing), else NULL. No key
    -- (NULL) is never held. The key's row is locked until the caller's transaction ends, so two
    -- takers of one key take turns; each statement sees what the one before it committed. On
    -- Citus this runs on the coordinator: the key's row and the runs may be on other shards.
    IF p_key IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO run_singletons (id, run_id) VALUES (v_id, p_run) ON CONFLICT (id) DO NOTHING;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    SELECT s.run_id INTO v_holder FROM run_singletons s WHERE s.id = v_id FOR UPDATE;
    IF v_holder <> p_run AND EXISTS (
        SELECT 1 FROM runs r
        WHERE r.id = v_holder AND r.ended_at IS NULL AND r.project_id = p_project
          AND r.workflow = p_workflow AND r.singleton_key = p_key) THEN
        RETURN v_holder;
    END IF;
    UPDATE run_singletons SET run_id = p_run WHERE id = v_id;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION take_singleton(uuid, text, text, uuid) IS 'A run takes its singleton key (a start, a retry): NULL when it holds it now, else the run not ended that does.';

INSERT INTO run_singletons (id, run_id)
SELECT singleton_id(project_id, workflow, singleton_key), id FROM runs
WHERE singleton_key IS NOT NULL AND ended_at IS NULL;

CREATE FUNCTION record_run_alerts(p_project uuid, p_run uuid, p_workflow text,
                                  p_status run_status, p_error jsonb)
RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    recorded integer;
BEGIN
    -- A run of p_workflow that ended failed or timedOut records one notification per alert
    -- listening for it (run.failed, run.timedOut, and app.unreachable for a failure with code
    -- app_unreachable), at most one per alert, run and type; answers how many it recorded.
    -- (PL/pgSQL: Citus plans a SQL function's INSERT with its parameters in it as a whole,
    -- and refuses it.)
    INSERT INTO alert_notifications (id, project_id, alert_id, type, run_id, data)
    SELECT gen_random_uuid(), p_project, a.id, t.type, p_run,
           jsonb_build_object('workflow', p_workflow, 'status', p_status, 'error', p_error)
    FROM (VALUES
        (CASE p_status WHEN 'failed' THEN 'run.failed' WHEN 'timedOut' THEN 'run.timedOut' END),
        (CASE WHEN p_status = 'failed' AND p_error ->> 'code' = 'app_unreachable'
              THEN 'app.unreachable' END)) AS t (type)
    JOIN alerts a ON a.project_id = p_project AND t.type = ANY (a.types)
                 AND (a.workflow IS NULL OR a.workflow = p_workflow)
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS recorded = ROW_COUNT;
    RETURN recorded;
END
$$;
COMMENT ON FUNCTION record_run_alerts(uuid, uuid, text, run_status, jsonb) IS 'The alerts told of a run''s end (end_runs calls it for each run it ends, from the caller''s session).';

CREATE OR REPLACE FUNCTION run_end(
    p_run uuid, p_project uuid, p_token text, p_status run_status, p_output jsonb,
    p_error jsonb, p_event run_event_type, p_data jsonb,
    OUT parent_run_id uuid, OUT parent_step text, OUT schedule_id text, OUT status run_status
) RETURNS SETOF record LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    closed jsonb;
BEGIN
    -- The end transition: a run not ended ends with p_status (its output or error), when
    -- p_token is its lease token or is NULL (a cancel, a time limit). Its open steps are
    -- cancelled (and their pending callbacks), its history gets their step.cancelled events
    -- and the end event p_event (with p_data). Answers what the caller must still settle
    -- (its parent, by resolve_child; its schedule); no row when the run was not this token's
    -- or had ended. Touches only this run's rows: the caller (end_runs) cancels its children,
    -- records its alerts (record_run_alerts) and tells the listeners (stepline_ended), from
    -- the caller's session: on Citus this body runs on the run's worker, where nobody listens
    -- and a reference table is not written.
    UPDATE runs r SET
        status = p_status, output = p_output, error = p_error, ended_at = now(),
        ready_at = NULL, lease_token = NULL, lease_owner = NULL, version = r.version + 1
    WHERE r.id = p_run AND r.project_id = p_project
      AND (p_token IS NULL OR r.lease_token = p_token)
      AND r.status IN ('running', 'cancelling')
    RETURNING r.parent_run_id, r.parent_step, r.schedule_id, r.status
    INTO parent_run_id, parent_step, schedule_id, status;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    WITH c AS (
        UPDATE steps s SET status = 'cancelled', ended_at = now()
        WHERE s.run_id = p_run AND s.status IN ('running', 'retrying', 'sleeping', 'waiting')
        RETURNING s.name, s.kind, s.callback_id
    ),
    cancelled_callbacks AS (
        UPDATE callbacks cb SET status = 'cancelled', completed_at = now()
        FROM c
        WHERE cb.run_id = p_run AND cb.id = c.callback_id AND cb.status = 'pending'
    )
    SELECT jsonb_agg(jsonb_build_object('type', 'step.cancelled', 'step_name', c.name,
                                        'data', jsonb_build_object('kind', c.kind))
                     ORDER BY c.name)
    INTO closed FROM c;
    PERFORM append_run_events(p_run, p_project, coalesce(closed, '[]'::jsonb)
        || jsonb_build_array(jsonb_build_object('type', p_event, 'data', p_data)), NULL, true);
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION run_end(uuid, uuid, text, run_status, jsonb, jsonb, run_event_type, jsonb) IS 'The end transition: a run ends, its open steps cancelled, its history told (its alerts by the caller: record_run_alerts); a child''s end wakes its parent by the caller (resolve_child).';

CREATE FUNCTION run_record_state(p_run uuid, p_items jsonb)
RETURNS SETOF text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now timestamptz := now();
    v_xid xid8 := pg_current_xact_id();
BEGIN
    -- Keeps the value of each state step of run p_run that this transaction wrote (p_items:
    -- [{key, step}], the last set of each key) as the key's current value, read from the step
    -- row itself: a set the steps table already had (a call sent again, a replay) wrote no row
    -- now and changes nothing. Answers the keys it set. Touches only this run's rows (on
    -- Citus it runs on the run's worker, whose transaction wrote the steps: their version is
    -- that transaction's id there); the caller wakes the long polls (stepline_state).
    RETURN QUERY
    INSERT INTO run_state AS t (run_id, key, project_id, value, updated_at)
    SELECT p_run, x.key, s.project_id, s.output, v_now
    FROM jsonb_to_recordset(p_items) AS x(key text, step text), steps s
    WHERE s.run_id = p_run AND s.name = x.step AND s.status = 'completed'
      AND s.version = v_xid AND s.output IS NOT NULL
    ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at
    RETURNING t.key;
END
$$;
COMMENT ON FUNCTION run_record_state(uuid, jsonb) IS 'A run''s published state kept from the state steps its transaction wrote (the keys set).';
