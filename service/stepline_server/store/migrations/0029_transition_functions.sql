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

CREATE FUNCTION run_request_cancel(p_run uuid, p_project uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The cancel request: a running run becomes cancelling (its next invocation, or the one
    -- holding it, runs its cleanup). Answers whether it was running. Touches only this run's row.
    UPDATE runs SET status = 'cancelling', cancel_requested = true, version = version + 1
    WHERE id = p_run AND project_id = p_project AND status = 'running';
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION run_request_cancel(uuid, uuid) IS 'The cancel request transition: running -> cancelling.';

CREATE FUNCTION run_restart(p_run uuid, p_project uuid, p_trigger text) RETURNS SETOF runs
LANGUAGE sql VOLATILE AS $$
    -- The restart transition (a retry): the run goes again, due now, its time limit counted
    -- from now; its trigger becomes p_trigger when given (a retry asked for by a person).
    -- Answers the run as it is now. Touches only this run's row.
    UPDATE runs SET
        trigger = coalesce(p_trigger, trigger),
        status = 'running', output = NULL, error = NULL, ended_at = NULL,
        cancel_requested = false, invoke_attempts = 0, undelivered_since = NULL,
        ready_at = now(), lease_token = NULL, version = version + 1, history_snapshot = NULL,
        history_invocation = NULL,
        deadline_at = now() + make_interval(secs => (options ->> 'timeoutMs')::double precision / 1000)
    WHERE id = p_run AND project_id = p_project
    RETURNING *
$$;
COMMENT ON FUNCTION run_restart(uuid, uuid, text) IS 'The restart transition (a retry): the run goes again, due now.';

CREATE FUNCTION run_continue(p_run uuid, p_project uuid, p_token text, p_input jsonb,
                             OUT generation integer, OUT steps bigint)
RETURNS SETOF record LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The restart transition of continue_as_new: the invocation holding lease p_token ended
    -- the run's generation; the next one starts with input p_input, due now, with no steps
    -- (the history keeps what they did; callbacks still pending are cancelled); the input the
    -- run was started with is kept (first_input). Answers the new generation and the steps
    -- dropped; no row when the lease was lost. Touches only this run's rows.
    UPDATE runs r SET
        first_input = CASE WHEN r.generation = 1 THEN r.input ELSE r.first_input END,
        input = p_input, generation = r.generation + 1, lease_token = NULL, lease_owner = NULL,
        invoke_attempts = 0, undelivered_since = NULL, ready_at = now(), version = r.version + 1,
        history_snapshot = NULL, history_invocation = NULL
    WHERE r.id = p_run AND r.project_id = p_project AND r.lease_token = p_token
      AND r.status IN ('running', 'cancelling')
    RETURNING r.generation INTO run_continue.generation;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    WITH dropped AS (
        DELETE FROM steps s WHERE s.run_id = p_run RETURNING s.callback_id
    ),
    cancelled AS (
        UPDATE callbacks c SET status = 'cancelled', completed_at = now()
        FROM dropped WHERE c.id = dropped.callback_id AND c.status = 'pending'
    )
    SELECT count(*) INTO run_continue.steps FROM dropped;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION run_continue(uuid, uuid, text, jsonb) IS 'The restart transition of continue_as_new: the next generation starts, due now, with no steps.';

CREATE FUNCTION run_resume(p_run uuid, p_project uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The resume transition: a run set aside by a pause is due again, as of when it was
    -- created (the claims take the resumed runs higher priority first, then oldest; one whose
    -- workflow or app is still paused is set aside again when claimed). Answers whether it was
    -- set aside. Touches only this run's row.
    UPDATE runs SET paused = false, ready_at = least(created_at, deadline_at)
    WHERE id = p_run AND project_id = p_project AND paused;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION run_resume(uuid, uuid) IS 'The resume transition: a run set aside by a pause is due again.';

CREATE FUNCTION run_move(p_run uuid, p_project uuid, p_deployment uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The move transition: a run not ended goes to deployment p_deployment of its own app (its
    -- next invocation goes to that deployment's URL). Answers whether it moved (false: ended,
    -- not found, or the deployment is not its app's). Touches only this run's row.
    UPDATE runs r SET deployment = p_deployment
    WHERE r.id = p_run AND r.project_id = p_project AND r.status IN ('running', 'cancelling')
      AND EXISTS (SELECT 1 FROM deployments d WHERE d.id = p_deployment AND d.app_id = r.app_id);
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION run_move(uuid, uuid, uuid) IS 'The move transition: a run not ended goes to another deployment of its app.';

CREATE FUNCTION run_repair(p_run uuid, p_project uuid, p_reason text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The repair transition: a run not ended found with no way forward is woken: due now, no
    -- lease, run.repaired {reason} in its history. Answers whether it was repaired. Touches
    -- only this run's row and history.
    UPDATE runs SET ready_at = now(), wake_seq = wake_seq + 1, lease_token = NULL,
                    lease_owner = NULL
    WHERE id = p_run AND project_id = p_project AND ended_at IS NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM append_run_events(p_run, p_project, jsonb_build_array(jsonb_build_object(
        'type', 'run.repaired', 'data', jsonb_build_object('reason', p_reason))));
    RETURN true;
END
$$;
COMMENT ON FUNCTION run_repair(uuid, uuid, text) IS 'The repair transition: a run with no way forward is due now, with run.repaired in its history.';

CREATE FUNCTION run_hold(p_run uuid, p_project uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The hold transition: a due run whose workflow's concurrency cap has no room is held (no
    -- lease, due at its deadline, to be ended then) until release_held makes it due again.
    -- Touches only this run's row.
    UPDATE runs SET held = true, ready_at = deadline_at, lease_token = NULL, lease_owner = NULL
    WHERE id = p_run AND project_id = p_project AND NOT held;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION run_hold(uuid, uuid) IS 'The hold transition: a run over its concurrency cap waits, held, until released.';

CREATE FUNCTION run_unhold(p_run uuid, p_project uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The release of a held run: its concurrency cap has room, it is due now. Touches only
    -- this run's row.
    UPDATE runs SET ready_at = now(), held = false
    WHERE id = p_run AND project_id = p_project AND held;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION run_unhold(uuid, uuid) IS 'A held run released: its concurrency cap has room, it is due now.';

CREATE FUNCTION run_defer(p_run uuid, p_project uuid, p_at timestamptz) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The deferral of a run not yet started by its workflow's rate limit: due at p_at, never
    -- past its deadline. Touches only this run's row.
    UPDATE runs SET ready_at = least(p_at, deadline_at)
    WHERE id = p_run AND project_id = p_project AND started_at IS NULL;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION run_defer(uuid, uuid, timestamptz) IS 'A run not yet started deferred by its rate limit: due later.';

CREATE FUNCTION run_gather_input(p_run uuid, p_project uuid, p_input jsonb, p_append boolean)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- A run still gathering starts (not yet due, never leased, not started) takes one more
    -- start's input: a debounce's last start's input replaces it (p_append false; the
    -- concurrency and rate limit keys are read from it as insert_run reads them), a batch's
    -- event data is appended to the list (p_append true). Answers whether the run still
    -- gathers. Touches only this run's row.
    UPDATE runs SET
        input = CASE WHEN p_append THEN coalesce(input, '[]'::jsonb) || jsonb_build_array(p_input)
                     ELSE p_input END,
        concurrency_key = CASE WHEN p_append THEN concurrency_key
                               WHEN jsonb_typeof(p_input) = 'object'
                               THEN p_input ->> (options ->> 'concurrencyKey') END,
        rate_key = CASE WHEN p_append THEN rate_key
                        WHEN jsonb_typeof(p_input) = 'object'
                        THEN p_input ->> (options -> 'rateLimit' ->> 'key') END
    WHERE id = p_run AND project_id = p_project AND status = 'running' AND ready_at IS NULL
      AND lease_token IS NULL AND started_at IS NULL;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION run_gather_input(uuid, uuid, jsonb, boolean) IS 'A gathering run takes one more start''s input (a debounce''s replaces it, a batch''s is appended).';

CREATE FUNCTION run_fire(p_run uuid, p_project uuid, p_events jsonb) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The fire transition of a gathering: the run that gathered starts is due now, its time
    -- limit counted from now, with p_events (run.debounced or run.batched) in its history.
    -- Answers whether the run still gathered. Touches only this run's row and history.
    UPDATE runs SET ready_at = now(),
        deadline_at = now() + make_interval(secs => (options ->> 'timeoutMs')::double precision / 1000)
    WHERE id = p_run AND project_id = p_project AND status = 'running' AND ready_at IS NULL
      AND lease_token IS NULL AND started_at IS NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM append_run_events(p_run, p_project, p_events);
    RETURN true;
END
$$;
COMMENT ON FUNCTION run_fire(uuid, uuid, jsonb) IS 'The fire transition of a gathering: the run is due now, its time limit from now.';

CREATE FUNCTION run_keep_lease(p_run uuid, p_project uuid, p_token text,
                               p_seconds double precision) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    cancelling boolean;
BEGIN
    -- The heartbeat: the lease p_token still holds is extended by p_seconds, never past the
    -- run's deadline (a run at its time limit comes due, to be ended). Answers whether a cancel
    -- was requested (NULL: the lease was lost). Touches only this run's row.
    UPDATE runs SET ready_at = least(now() + make_interval(secs => p_seconds), deadline_at)
    WHERE id = p_run AND project_id = p_project AND lease_token = p_token
    RETURNING coalesce(cancel_requested, false) INTO cancelling;
    RETURN cancelling;
END
$$;
COMMENT ON FUNCTION run_keep_lease(uuid, uuid, text, double precision) IS 'The heartbeat: a lease still held is extended.';
