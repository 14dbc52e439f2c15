-- Each transition of a run makes one row version of runs: append_run_events no longer moves a
-- counter on the run's row but numbers events after the run's last one (an index probe on
-- run_events' primary key), serialised by the run's row lock, which every transition takes
-- (and which append_run_events takes itself, a no-op when its transaction already holds it).
-- runs.next_seq goes. Retention keeps each run's last event, so the numbering never restarts.

CREATE OR REPLACE FUNCTION append_run_events(p_run uuid, p_project uuid, p_events jsonb,
                                             p_invocation uuid DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n integer := coalesce(jsonb_array_length(p_events), 0);
    base bigint;
BEGIN
    -- Appends p_events (a JSON array of {type, step_name, invocation_id, deployment_id,
    -- http_status, duration_ms, data, at}; invocation_id defaults to p_invocation, at to now())
    -- to run p_run's history, numbered after its last event; answers the first event's seq
    -- (NULL when p_events is empty or the run is not p_project's). The run's row is locked
    -- first (its transition has locked or updated it already: then this is cheap, no new row
    -- version),
    -- so two transactions appending to one run take turns and the seqs have no gap; the
    -- numbering reads the run's last event after the lock (a new snapshot: what the previous
    -- holder appended is seen). The only writer of run_events.
    IF n = 0 THEN
        RETURN NULL;
    END IF;
    PERFORM FROM runs WHERE id = p_run AND project_id = p_project FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT coalesce(max(seq), 0) + 1 INTO base FROM run_events WHERE run_id = p_run;
    INSERT INTO run_events (run_id, seq, project_id, at, type, step_name, invocation_id,
                            deployment_id, http_status, duration_ms, data)
    SELECT p_run, base + x.ord - 1, p_project, coalesce(x.at, now()), x.type, x.step_name,
           coalesce(x.invocation_id, p_invocation), x.deployment_id, x.http_status,
           x.duration_ms, x.data
    FROM ROWS FROM (jsonb_to_recordset(p_events) AS (
        type run_event_type, step_name text, invocation_id uuid, deployment_id text,
        http_status integer, duration_ms integer, data jsonb, at timestamptz))
        WITH ORDINALITY AS x(type, step_name, invocation_id, deployment_id, http_status,
                             duration_ms, data, at, ord);
    RETURN base;
END
$$;
COMMENT ON FUNCTION append_run_events(uuid, uuid, jsonb, uuid) IS 'Appends events to a run''s history, numbered after its last event under the run''s row lock, and answers the first one''s seq: the only writer of run_events.';

ALTER TABLE runs DROP COLUMN next_seq;
