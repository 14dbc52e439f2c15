-- Each run transition runs whole on the shard that holds its run (docs/scaling.md): now() is
-- read once into a variable (Citus refuses a non-IMMUTABLE function beside a run's columns in
-- CASE, COALESCE, ON CONFLICT ... DO UPDATE and UPDATE ... SET), what a statement needed of
-- another table is read first (a run's earliest timer, a deployment's app, its time limit),
-- callbacks are named by their run and id, run_begin takes the deployment its caller read with
-- the lease, and run_end leaves the children's check and the notification to end_runs (a
-- NOTIFY on a worker reaches nobody). On plain PostgreSQL each behaves as before.

DROP FUNCTION woken_ready_at(text, timestamptz);
CREATE FUNCTION woken_ready_at(lease_token text, ready_at timestamptz, at timestamptz)
RETURNS timestamptz LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN lease_token IS NULL THEN at ELSE ready_at END
$$;
COMMENT ON FUNCTION woken_ready_at(text, timestamptz, timestamptz) IS 'The wake rule: a run woken from outside (a callback, an event, a child''s end, a cancel) is due now (at: the caller''s now(), passed in so that the rule is IMMUTABLE, as Citus wants of a function called with a run''s columns), or, while an invocation holds it, right after that invocation (whose end sees wake_seq moved and makes it due).';

CREATE OR REPLACE FUNCTION append_run_events(p_run uuid, p_project uuid, p_events jsonb,
                                  p_invocation uuid DEFAULT NULL, p_locked boolean DEFAULT false)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    base bigint;
    v_now timestamptz := now();
BEGIN
    -- Appends p_events (a JSON array of {type, step_name, invocation_id, deployment_id,
    -- http_status, duration_ms, data, at}; invocation_id defaults to p_invocation, at to now())
    -- to run p_run's history, numbered after its last event; answers the first event's seq
    -- (NULL when p_events is empty or the run is not p_project's). The run's row is locked
    -- first, unless p_locked says this transaction has locked or updated it already (a
    -- transition that has just updated the run passes true: no second lock of the row), so
    -- two transactions appending to one run take turns and the seqs have no gap; the numbering
    -- reads the run's last event after the lock (a new snapshot: what the previous holder
    -- appended is seen), in the statement that inserts. The only writer of run_events.
    IF coalesce(jsonb_array_length(p_events), 0) = 0 THEN
        RETURN NULL;
    END IF;
    IF NOT p_locked THEN
        PERFORM FROM runs WHERE id = p_run AND project_id = p_project FOR NO KEY UPDATE;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
    END IF;
    WITH added AS (
        INSERT INTO run_events (run_id, seq, project_id, at, type, step_name, invocation_id,
                                deployment_id, http_status, duration_ms, data)
        SELECT p_run, last.seq + x.ord, p_project, coalesce(x.at, v_now), x.type, x.step_name,
               coalesce(x.invocation_id, p_invocation), x.deployment_id, x.http_status,
               x.duration_ms, x.data
        FROM (SELECT coalesce(max(e.seq), 0) AS seq FROM run_events e WHERE e.run_id = p_run) last,
             ROWS FROM (jsonb_to_recordset(p_events) AS (
                 type run_event_type, step_name text, invocation_id uuid, deployment_id text,
                 http_status integer, duration_ms integer, data jsonb, at timestamptz))
                 WITH ORDINALITY AS x(type, step_name, invocation_id, deployment_id,
                                      http_status, duration_ms, data, at, ord)
        RETURNING seq
    )
    SELECT min(seq) INTO base FROM added;
    RETURN base;
END
$$;
COMMENT ON FUNCTION append_run_events(uuid, uuid, jsonb, uuid, boolean) IS 'Appends events to a run''s history, numbered after its last event under the run''s row lock (taken here unless p_locked), and answers the first one''s seq: the only writer of run_events.';

CREATE OR REPLACE FUNCTION run_wake(p_run uuid, p_project uuid, p_events jsonb DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now timestamptz := now();
BEGIN
    -- The wake transition: something outside the run (a callback completed, an event received,
    -- a child's end, a cancel request, a child deleted) moved it. A run not ended is due now,
    -- or, while an invocation holds it, right after that invocation (woken_ready_at: its end
    -- sees wake_seq moved and makes it due), and p_events (what woke it) are appended to its
    -- history. Answers whether the run was woken (false: ended, or not p_project's; nothing is
    -- appended). Touches only this run's row and history: a child's end wakes its parent by the
    -- caller calling this for the parent (store.children.resolve_child).
    UPDATE runs SET wake_seq = wake_seq + 1, ready_at = woken_ready_at(lease_token, ready_at, v_now)
    WHERE id = p_run AND project_id = p_project AND status IN ('running', 'cancelling');
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM append_run_events(p_run, p_project, p_events);
    RETURN true;
END
$$;
COMMENT ON FUNCTION run_wake(uuid, uuid, jsonb) IS 'The wake transition: a run not ended is due now (or right after its active invocation), with what woke it in its history.';

CREATE OR REPLACE FUNCTION run_suspend(p_run uuid, p_project uuid, p_token text, p_acked boolean)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now timestamptz := now();
    v_timer timestamptz;
BEGIN
    -- The suspend transition: the invocation holding lease p_token ended with the run still
    -- running. The lease is released and the run comes due at its earliest timer (a sleep, a
    -- retry, a wait's timeout; its deadline at the latest), or at once when something woke it
    -- while the invocation ran (wake_seq moved since the claim); the next invocation may carry
    -- a delta only after one answered by an SDK that reads them (p_acked). Answers whether the
    -- lease was still p_token's. Touches only this run's rows. (The earliest timer is read
    -- first: only the invocation holding the lease changes the run's steps.)
    SELECT min(coalesce(s.wake_at, s.timeout_at)) INTO v_timer FROM steps s
    WHERE s.run_id = p_run AND s.status IN ('sleeping', 'retrying', 'waiting');
    UPDATE runs SET
        lease_token = NULL, lease_owner = NULL, invoke_attempts = 0, undelivered_since = NULL,
        history_acked = CASE WHEN p_acked THEN runs.invocation_id END,
        ready_at = CASE
            WHEN runs.wake_seq <> runs.claimed_wake_seq THEN v_now
            ELSE least(runs.deadline_at, v_timer)
            END
    WHERE id = p_run AND project_id = p_project AND lease_token = p_token;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION run_suspend(uuid, uuid, text, boolean) IS 'The suspend transition: the lease released, the run due at its earliest timer or at once when woken meanwhile.';

CREATE OR REPLACE FUNCTION run_release(p_run uuid, p_project uuid, p_token text, p_delay_ms double precision)
RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    attempts integer;
    v_now timestamptz := now();
    v_due timestamptz := now() + make_interval(secs => p_delay_ms / 1000);
BEGIN
    -- The release transition after a delivery failure: the invocation holding lease p_token
    -- could not reach the app. The lease is released and the run, still running, is due again
    -- in p_delay_ms (never past its deadline); the delivery window counts from the first
    -- failure of the streak. Answers the failures counted so far (NULL: the lease was lost).
    -- Touches only this run's row.
    UPDATE runs SET
        lease_token = NULL, lease_owner = NULL, invoke_attempts = invoke_attempts + 1,
        undelivered_since = coalesce(undelivered_since, v_now),
        ready_at = least(deadline_at, v_due)
    WHERE id = p_run AND project_id = p_project AND lease_token = p_token
    RETURNING invoke_attempts INTO attempts;
    RETURN attempts;
END
$$;
COMMENT ON FUNCTION run_release(uuid, uuid, text, double precision) IS 'The release transition after a delivery failure: the lease released, the run due again after a backoff.';

CREATE OR REPLACE FUNCTION run_restart(p_run uuid, p_project uuid, p_trigger text) RETURNS SETOF runs
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now timestamptz := now();
    v_deadline timestamptz;
BEGIN
    -- The restart transition (a retry): the run goes again, due now, its time limit counted
    -- from now; its trigger becomes p_trigger when given (a retry asked for by a person).
    -- Answers the run as it is now. Touches only this run's row.
    SELECT v_now + make_interval(secs => (options ->> 'timeoutMs')::double precision / 1000)
    INTO v_deadline FROM runs WHERE id = p_run AND project_id = p_project;
    RETURN QUERY
    UPDATE runs SET
        trigger = coalesce(p_trigger, trigger),
        status = 'running', output = NULL, error = NULL, ended_at = NULL,
        cancel_requested = false, invoke_attempts = 0, undelivered_since = NULL,
        ready_at = v_now, lease_token = NULL, version = version + 1, history_snapshot = NULL,
        history_invocation = NULL, deadline_at = v_deadline
    WHERE id = p_run AND project_id = p_project
    RETURNING *;
END
$$;
COMMENT ON FUNCTION run_restart(uuid, uuid, text) IS 'The restart transition (a retry): the run goes again, due now.';

CREATE OR REPLACE FUNCTION run_continue(p_run uuid, p_project uuid, p_token text, p_input jsonb,
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
        FROM dropped
        WHERE c.run_id = p_run AND c.id = dropped.callback_id AND c.status = 'pending'
    )
    SELECT count(*) INTO run_continue.steps FROM dropped;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION run_continue(uuid, uuid, text, jsonb) IS 'The restart transition of continue_as_new: the next generation starts, due now, with no steps.';

CREATE OR REPLACE FUNCTION run_move(p_run uuid, p_project uuid, p_deployment uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_app uuid;
BEGIN
    -- The move transition: a run not ended goes to deployment p_deployment of its own app (its
    -- next invocation goes to that deployment's URL). Answers whether it moved (false: ended,
    -- not found, or the deployment is not its app's). Touches only this run's row.
    SELECT d.app_id INTO v_app FROM deployments d WHERE d.id = p_deployment;
    UPDATE runs r SET deployment = p_deployment
    WHERE r.id = p_run AND r.project_id = p_project AND r.status IN ('running', 'cancelling')
      AND r.app_id = v_app;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION run_move(uuid, uuid, uuid) IS 'The move transition: a run not ended goes to another deployment of its app.';

CREATE OR REPLACE FUNCTION run_gather_input(p_run uuid, p_project uuid, p_input jsonb, p_append boolean)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_item jsonb := jsonb_build_array(p_input);
    v_object boolean := jsonb_typeof(p_input) = 'object';
BEGIN
    -- A run still gathering starts (not yet due, never leased, not started) takes one more
    -- start's input: a debounce's last start's input replaces it (p_append false; the
    -- concurrency and rate limit keys are read from it as insert_run reads them), a batch's
    -- event data is appended to the list (p_append true). Answers whether the run still
    -- gathers. Touches only this run's row.
    UPDATE runs SET
        input = CASE WHEN p_append THEN coalesce(input, '[]'::jsonb) || v_item
                     ELSE p_input END,
        concurrency_key = CASE WHEN p_append THEN concurrency_key
                               WHEN v_object
                               THEN p_input ->> (options ->> 'concurrencyKey') END,
        rate_key = CASE WHEN p_append THEN rate_key
                        WHEN v_object
                        THEN p_input ->> (options -> 'rateLimit' ->> 'key') END
    WHERE id = p_run AND project_id = p_project AND status = 'running' AND ready_at IS NULL
      AND lease_token IS NULL AND started_at IS NULL;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION run_gather_input(uuid, uuid, jsonb, boolean) IS 'A gathering run takes one more start''s input (a debounce''s replaces it, a batch''s is appended).';

CREATE OR REPLACE FUNCTION run_fire(p_run uuid, p_project uuid, p_events jsonb) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now timestamptz := now();
    v_deadline timestamptz;
BEGIN
    -- The fire transition of a gathering: the run that gathered starts is due now, its time
    -- limit counted from now, with p_events (run.debounced or run.batched) in its history.
    -- Answers whether the run still gathered. Touches only this run's row and history.
    SELECT v_now + make_interval(secs => (options ->> 'timeoutMs')::double precision / 1000)
    INTO v_deadline FROM runs WHERE id = p_run;
    UPDATE runs SET ready_at = v_now, deadline_at = v_deadline
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

CREATE OR REPLACE FUNCTION run_keep_lease(p_run uuid, p_project uuid, p_token text,
                               p_seconds double precision) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    cancelling boolean;
    v_until timestamptz := now() + make_interval(secs => p_seconds);
BEGIN
    -- The heartbeat: the lease p_token still holds is extended by p_seconds, never past the
    -- run's deadline (a run at its time limit comes due, to be ended). Answers whether a cancel
    -- was requested (NULL: the lease was lost). Touches only this run's row.
    UPDATE runs SET ready_at = least(v_until, deadline_at)
    WHERE id = p_run AND project_id = p_project AND lease_token = p_token
    RETURNING coalesce(cancel_requested, false) INTO cancelling;
    RETURN cancelling;
END
$$;
COMMENT ON FUNCTION run_keep_lease(uuid, uuid, text, double precision) IS 'The heartbeat: a lease still held is extended.';

CREATE OR REPLACE FUNCTION run_progress(
    p_run uuid, p_project uuid, p_token text, p_invocation uuid, p_events jsonb, p_seq bigint,
    p_digest text, p_logs_dropped integer, p_changes jsonb, p_callbacks jsonb, p_logs jsonb,
    p_max_lines integer, p_max_bytes bigint,
    OUT applied boolean, OUT cancel_requested boolean
) RETURNS SETOF record LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    was record;
    base bigint;
    kept integer;
    kept_bytes bigint;
    dropped integer;
    v_now timestamptz := now();
BEGIN
    -- The progress transition: the invocation p_invocation holding lease p_token commits its
    -- step changes (p_changes: [{ord (1-based; a step's position is the seq of the ord-th of
    -- p_events), name, kind, status, attempt, output, error, ended, delay_ms, timeout_ms,
    -- at_ms, callback_id, child_run_id, event_name, match}]), the callbacks it created
    -- (p_callbacks: [{id, step_name, timeout_ms}]), its history events (p_events, appended
    -- through append_run_events) and its log lines (p_logs: [{ord, at, level, message, fields,
    -- step_name, size}], kept in order while the run's log has room, p_max_lines lines and
    -- p_max_bytes bytes in all; once a line did not fit, none newer is kept; p_logs_dropped
    -- more were dropped by the app). No row (nothing written: the caller must stop) when the
    -- token or the invocation is not the one holding the run, when the run is past its time
    -- limit, or when the call repeats an applied seq with another body (p_digest: a second
    -- execution of the invocation); the same call sent again (same seq and digest: its answer
    -- was lost) answers applied = false and writes nothing. ready_at (indexed) is left alone
    -- so the run's row is updated in place; the heartbeat extends the lease. Touches only this
    -- run's rows.
    -- The fence, the replay check and the update are one statement: its conditions are
    -- checked again on the row's latest version when another transaction updated it first,
    -- and what it answers of the row (the log counts, which only this function changes, and
    -- cancel_requested) is that version's. The last commit's time (a sleep counts from no
    -- earlier) is read by the subquery, which sees the row as it was before this update.
    UPDATE runs r SET
        progress_at = v_now,
        progress_seq = greatest(r.progress_seq, p_seq),
        progress_digest = CASE WHEN p_seq > 0 THEN p_digest ELSE r.progress_digest END,
        logs_dropped = r.logs_dropped + coalesce(p_logs_dropped, 0)
    WHERE r.id = p_run AND r.project_id = p_project AND r.lease_token = p_token
      AND r.invocation_id = p_invocation AND r.status IN ('running', 'cancelling')
      AND (r.deadline_at IS NULL OR r.deadline_at > v_now)
      AND (p_seq = 0 OR r.progress_seq < p_seq)
    RETURNING r.cancel_requested, r.log_lines, r.log_bytes,
              r.logs_dropped - coalesce(p_logs_dropped, 0) AS logs_dropped,
              (SELECT o.progress_at FROM runs o WHERE o.id = p_run) AS progress_at
    INTO was;
    IF NOT FOUND THEN
        -- Not this invocation's any more, past its time limit, or a seq already applied: the
        -- same call again (its answer was lost) is told so; anything else writes nothing.
        SELECT r.cancel_requested INTO was FROM runs r
        WHERE r.id = p_run AND r.project_id = p_project AND r.lease_token = p_token
          AND r.invocation_id = p_invocation AND r.status IN ('running', 'cancelling')
          AND (r.deadline_at IS NULL OR r.deadline_at > v_now)
          AND p_seq <> 0 AND r.progress_seq = p_seq
          AND r.progress_digest IS NOT DISTINCT FROM p_digest;
        IF FOUND THEN
            applied := false;
            cancel_requested := was.cancel_requested;
            RETURN NEXT;
        END IF;
        RETURN;
    END IF;
    cancel_requested := was.cancel_requested;
    IF p_logs IS NOT NULL THEN
        -- Each line's seq in the run's log and whether it fits (the run is locked by the
        -- update: its counts hold), then the counts.
        WITH lines AS (
            SELECT l.*, was.log_lines + l.ord AS seq,
                   was.logs_dropped = 0 AND was.log_lines + l.ord <= p_max_lines
                   AND was.log_bytes + sum(l.size) OVER (ORDER BY l.ord) <= p_max_bytes AS fits
            FROM jsonb_to_recordset(p_logs) AS l(
                ord integer, at timestamptz, level text, message text, fields jsonb,
                step_name text, size integer)
        ),
        ins AS (
            INSERT INTO run_logs (run_id, seq, project_id, at, level, message, fields, step_name)
            SELECT p_run, l.seq, p_project, l.at, l.level, l.message, l.fields, l.step_name
            FROM lines l WHERE l.fits
        )
        SELECT count(*) FILTER (WHERE fits), coalesce(sum(size) FILTER (WHERE fits), 0),
               count(*) FILTER (WHERE NOT fits)
        INTO kept, kept_bytes, dropped
        FROM lines;
        UPDATE runs r SET
            log_lines = r.log_lines + kept,
            log_bytes = r.log_bytes + kept_bytes,
            logs_dropped = r.logs_dropped + dropped
        WHERE r.id = p_run AND (kept > 0 OR dropped > 0);
    END IF;
    base := append_run_events(p_run, p_project, p_events, p_invocation, true);
    IF p_changes IS NOT NULL THEN
    INSERT INTO steps AS t (run_id, project_id, name, kind, status, position, attempt, output,
                            error, ended_at, wake_at, timeout_at, callback_id, child_run_id,
                            event_name, match, started_at)
    SELECT p_run, p_project, x.name, x.kind, x.status, base + x.ord - 1, x.attempt, x.output,
           x.error,
           CASE WHEN x.ended THEN v_now END,
           -- A sleep counts from when the workflow reached it (at_ms, the app's clock) as far
           -- as that lies between the invocation's last commit and now; else from now.
           CASE WHEN x.delay_ms IS NOT NULL
                THEN CASE WHEN x.at_ms IS NULL THEN v_now
                          ELSE greatest(was.progress_at,
                                        least(v_now, to_timestamp(x.at_ms / 1000.0)))
                     END + make_interval(secs => x.delay_ms::double precision / 1000) END,
           CASE WHEN x.timeout_ms IS NOT NULL
                THEN v_now + make_interval(secs => x.timeout_ms::double precision / 1000) END,
           x.callback_id, x.child_run_id, x.event_name, x.match, v_now
    FROM jsonb_to_recordset(coalesce(p_changes, '[]')) AS x(
        ord integer, name text, kind step_kind, status step_status, attempt integer,
        output jsonb, error jsonb, ended boolean, delay_ms bigint, timeout_ms bigint,
        at_ms bigint, callback_id uuid, child_run_id uuid, event_name text, match jsonb)
    ON CONFLICT (run_id, name) DO UPDATE SET
        status = excluded.status, attempt = excluded.attempt, output = excluded.output,
        error = excluded.error, ended_at = excluded.ended_at, wake_at = excluded.wake_at,
        timeout_at = excluded.timeout_at,
        callback_id = coalesce(excluded.callback_id, t.callback_id),
        child_run_id = coalesce(excluded.child_run_id, t.child_run_id),
        event_name = excluded.event_name, match = excluded.match,
        -- (What DO UPDATE sets comes from excluded: Citus plans no parameter there.)
        started_at = CASE WHEN excluded.status = 'running' THEN excluded.started_at
                          ELSE t.started_at END
    WHERE t.status NOT IN ('completed', 'failed', 'cancelled');
    END IF;
    IF p_callbacks IS NOT NULL THEN
    -- A callback's id is derived from its run and step: an ended one comes back only when a
    -- retry runs its step again, and then it waits anew.
    INSERT INTO callbacks (id, project_id, run_id, step_name, created_at, timeout_at)
    SELECT x.id, p_project, p_run, x.step_name, v_now,
           CASE WHEN x.timeout_ms IS NOT NULL
                THEN v_now + make_interval(secs => x.timeout_ms::double precision / 1000) END
    FROM jsonb_to_recordset(coalesce(p_callbacks, '[]')) AS x(
        id uuid, step_name text, timeout_ms bigint)
    ON CONFLICT ON CONSTRAINT callbacks_pkey DO UPDATE SET
        status = 'pending', body = NULL, created_at = excluded.created_at, completed_at = NULL,
        timeout_at = excluded.timeout_at
    WHERE callbacks.status <> 'pending';
    END IF;
    applied := true;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION run_progress(uuid, uuid, text, uuid, jsonb, bigint, text, integer, jsonb, jsonb, jsonb, integer, bigint) IS 'The progress transition: an invocation''s step changes, callbacks, history and log lines committed under its lease, replays answered once.';

DROP FUNCTION run_end(uuid, uuid, text, run_status, jsonb, jsonb, run_event_type, jsonb);
CREATE FUNCTION run_end(
    p_run uuid, p_project uuid, p_token text, p_status run_status, p_output jsonb,
    p_error jsonb, p_event run_event_type, p_data jsonb,
    OUT parent_run_id uuid, OUT parent_step text, OUT schedule_id text, OUT status run_status
) RETURNS SETOF record LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    wf text;
    closed jsonb;
BEGIN
    -- The end transition: a run not ended ends with p_status (its output or error), when
    -- p_token is its lease token or is NULL (a cancel, a time limit). Its open steps are
    -- cancelled (and their pending callbacks), its history gets their step.cancelled events
    -- and the end event p_event (with p_data), the alerts listening for a failure or a time
    -- out are recorded. Answers what the caller must still settle (its parent, by
    -- resolve_child; its schedule); no row when the run was not this token's or had ended.
    -- Touches only this run's rows: the caller (end_runs) cancels its children and tells the
    -- listeners (stepline_ended, from the caller's session: on Citus this body runs on the
    -- run's worker, where nobody listens).
    UPDATE runs r SET
        status = p_status, output = p_output, error = p_error, ended_at = now(),
        ready_at = NULL, lease_token = NULL, lease_owner = NULL, version = r.version + 1
    WHERE r.id = p_run AND r.project_id = p_project
      AND (p_token IS NULL OR r.lease_token = p_token)
      AND r.status IN ('running', 'cancelling')
    RETURNING r.parent_run_id, r.parent_step, r.schedule_id, r.status, r.workflow
    INTO parent_run_id, parent_step, schedule_id, status, wf;
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
    -- Alerts (alerts.sql): a run ending failed or timedOut records one notification per alert
    -- listening for it (run.failed, run.timedOut, and app.unreachable for a failure with code
    -- app_unreachable), at most one per alert, run and type.
    IF p_status IN ('failed', 'timedOut') THEN
        INSERT INTO alert_notifications (id, project_id, alert_id, type, run_id, data)
        SELECT gen_random_uuid(), p_project, a.id, t.type, p_run,
               jsonb_build_object('workflow', wf, 'status', p_status, 'error', p_error)
        FROM (VALUES
            (CASE p_status WHEN 'failed' THEN 'run.failed' WHEN 'timedOut' THEN 'run.timedOut' END),
            (CASE WHEN p_status = 'failed' AND p_error ->> 'code' = 'app_unreachable'
                  THEN 'app.unreachable' END)) AS t (type)
        JOIN alerts a ON a.project_id = p_project AND t.type = ANY (a.types)
                     AND (a.workflow IS NULL OR a.workflow = wf)
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION run_end(uuid, uuid, text, run_status, jsonb, jsonb, run_event_type, jsonb) IS 'The end transition: a run ends, its open steps cancelled, its history and alerts told; a child''s end wakes its parent by the caller (resolve_child).';

DROP FUNCTION run_begin(uuid, uuid, text, uuid, integer, boolean, double precision, integer);
CREATE FUNCTION run_begin(
    p_run uuid, p_project uuid, p_token text, p_invocation uuid, p_attempt integer,
    p_deltas boolean, p_lead double precision, p_inline_max integer, p_deployment text
) RETURNS TABLE (
    name text, kind step_kind, status step_status, "position" bigint, attempt integer,
    output jsonb, output_bytes integer, output_digest text, error jsonb, wake_at timestamptz,
    callback_id uuid, child_run_id uuid, callback_status text, blocked boolean,
    wait_s double precision, late_s double precision, history_base uuid,
    history_steps bigint, history_bytes bigint
) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_deployment text;
    v_since pg_snapshot;
    v_base uuid;
    v_again boolean;
    v_now timestamptz := now();
    v_db text := stepline_database_id();
    v_snapshot pg_snapshot;
BEGIN
    -- The begin transition: the invocation p_invocation (attempt p_attempt) of the run leased
    -- to p_token begins, unless the lease went stale (no row: another orchestrator may hold the
    -- run now). What came due is settled (sleeps complete, those ending within p_lead seconds
    -- too, as of their end; event waits past their timeout complete with null; callbacks past
    -- theirs fail as timed out) and the invocation's start is recorded (invocation.started, with
    -- p_deployment, the deployment it goes to, which the caller read with the lease: the run's,
    -- else the app's last known one). Answers the run's
    -- steps in the order they were first recorded (a run with no steps to send: one row whose
    -- name is null): every step (history_base null) when its last invocation is not known or
    -- was not answered by an SDK that reads deltas (history_acked), or p_deltas is false, else
    -- only those written by transactions the snapshot that invocation read under did not see,
    -- the open ones and those settled here; the snapshot taken here is kept for the next
    -- invocation, taken in this database (history_db: not a dump restored elsewhere). Each row
    -- says the size of the whole history (history_steps, history_bytes); wait_s, in how many
    -- seconds the last sleep settled ends (the app must not be called before); blocked marks a
    -- retrying step whose next attempt is not due then; a result over p_inline_max bytes comes
    -- back as null with its output_bytes and output_digest; late_s, for a timer settled here,
    -- how many seconds ago it was due (negative: claimed ahead; only sleeps are settled ahead).
    -- A begin tried again after its commit went through unseen finds its invocation already
    -- begun: it records and settles nothing more and sends every step. Touches only this run's
    -- rows.
    SELECT CASE WHEN coalesce(p_deltas, true) AND r.history_db = v_db
                     AND r.history_acked = r.history_invocation
                     AND r.history_invocation IS DISTINCT FROM p_invocation
                THEN r.history_snapshot END,
           r.history_invocation,
           r.history_invocation IS NOT DISTINCT FROM p_invocation
    INTO v_since, v_base, v_again
    FROM runs r
    WHERE r.id = p_run AND r.project_id = p_project AND r.lease_token = p_token
      AND r.status IN ('running', 'cancelling')
    FOR UPDATE OF r;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_deployment := p_deployment;
    -- (Taken before the steps are read: a step written in between is sent now and again next
    -- time, never missed.)
    v_snapshot := pg_current_snapshot();
    RETURN QUERY
    WITH resolved AS (
        UPDATE steps SET
            status = CASE WHEN steps.kind = 'callback' THEN 'failed' ELSE 'completed' END::step_status,
            error = CASE WHEN steps.kind = 'callback'
                THEN '{"type": "CallbackTimeout", "code": "callback_timeout", "message": "the callback was not completed in time"}'::jsonb END,
            ended_at = greatest(v_now, CASE WHEN steps.status = 'sleeping' THEN steps.wake_at
                                            ELSE steps.timeout_at END)
        WHERE steps.run_id = p_run AND NOT v_again
          AND ((steps.status = 'sleeping'
                AND steps.wake_at <= v_now + make_interval(secs => p_lead))
               OR (steps.status = 'waiting' AND steps.kind IN ('event', 'callback')
                   AND steps.timeout_at <= v_now))
        RETURNING steps.name, steps.kind, steps.callback_id, steps.status, steps.error,
                  steps.ended_at
    ),
    timed_out AS (
        UPDATE callbacks c SET status = 'timedOut', completed_at = resolved.ended_at
        FROM resolved
        WHERE c.run_id = p_run AND c.id = resolved.callback_id AND c.status = 'pending'
    ),
    -- When the invocation may start: now, or when the last sleep settled ends.
    starts AS (
        SELECT greatest(v_now, max(rv.ended_at)) AS at FROM resolved rv
    ),
    evs AS (
        SELECT jsonb_agg(jsonb_build_object('at', x.at, 'type', x.type, 'step_name', x.name,
                                            'invocation_id', x.invocation_id,
                                            'deployment_id', x.deployment_id, 'data', x.data)
                         ORDER BY x.k, x.at, x.name) AS events
        FROM (
            SELECT 0 AS k, rv.ended_at AS at,
                   CASE WHEN rv.kind = 'callback' THEN 'step.failed' ELSE 'step.completed' END
                       AS type,
                   rv.name, NULL::uuid AS invocation_id, NULL::text AS deployment_id,
                   CASE WHEN rv.kind = 'sleep' THEN jsonb_build_object('kind', rv.kind)
                        ELSE jsonb_build_object('kind', rv.kind, 'timedOut', true) END AS data
            FROM resolved rv
            UNION ALL
            SELECT 1, starts.at, 'invocation.started', NULL, p_invocation, v_deployment,
                   jsonb_build_object('attempt', p_attempt)
            FROM starts WHERE NOT v_again
        ) x
    ),
    -- The run's snapshot for the next invocation, and its history (appended once its row is
    -- updated: this reads r).
    r AS (
        UPDATE runs SET history_snapshot = v_snapshot,
                        history_invocation = p_invocation, history_db = v_db
        FROM evs WHERE runs.id = p_run AND evs.events IS NOT NULL
        RETURNING runs.id, evs.events
    ),
    history AS (
        SELECT append_run_events(p_run, p_project, r.events, NULL, true) AS seq FROM r
    ),
    size AS (
        SELECT count(*) AS steps, coalesce(sum(a.output_bytes), 0)::bigint AS bytes
        FROM steps a WHERE a.run_id = p_run
    )
    -- The steps to send as read before this statement, with what it just settled laid over.
    SELECT s.name, s.kind, s.status, s.position, s.attempt, s.output, s.output_bytes,
           s.output_digest, s.error, s.wake_at, s.callback_id, s.child_run_id,
           s.callback_status,
           coalesce(s.status = 'retrying' AND s.wake_at > starts.at, false) AS blocked,
           extract(epoch FROM starts.at - v_now)::double precision AS wait_s, s.late_s,
           CASE WHEN v_since IS NOT NULL THEN v_base END AS history_base,
           size.steps AS history_steps, size.bytes AS history_bytes
    FROM starts
    CROSS JOIN size
    -- (The history is appended: a join the planner cannot drop reads it.)
    CROSS JOIN (SELECT count(*) AS n FROM history) h
    LEFT JOIN LATERAL (
        SELECT s.name, s.kind, coalesce(rv.status, s.status) AS status, s.position, s.attempt,
               CASE WHEN s.output_bytes > p_inline_max THEN NULL ELSE s.output END AS output,
               s.output_bytes, s.output_digest, coalesce(rv.error, s.error) AS error, s.wake_at,
               s.callback_id, s.child_run_id,
               CASE WHEN rv.kind = 'callback' THEN 'timedOut'
                    ELSE (SELECT c.status FROM callbacks c
                          WHERE c.run_id = p_run AND c.id = s.callback_id)
               END AS callback_status,
               CASE WHEN rv.name IS NOT NULL
                    THEN extract(epoch FROM v_now - CASE WHEN s.status = 'sleeping'
                                                         THEN s.wake_at
                                                         ELSE s.timeout_at END)::double precision
               END AS late_s
        FROM steps s
        LEFT JOIN resolved rv ON rv.name = s.name
        WHERE s.run_id = p_run
          AND (v_since IS NULL OR NOT pg_visible_in_snapshot(s.version, v_since)
               OR s.status NOT IN ('completed', 'failed', 'cancelled') OR rv.name IS NOT NULL)
    ) s ON true
    WHERE h.n >= 0
    ORDER BY s.position;
END
$$;
COMMENT ON FUNCTION run_begin(uuid, uuid, text, uuid, integer, boolean, double precision, integer, text) IS 'The begin transition: an invocation of a leased run begins, timers due settled, its start in the history; answers the steps to send.';
