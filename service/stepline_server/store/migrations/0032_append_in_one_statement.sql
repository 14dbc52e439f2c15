-- The hot transitions (begin, progress, end) append their history in one statement: they have
-- just updated the run's row, so append_run_events takes no second lock of it (p_locked), and
-- it numbers the events in the statement that inserts them.

DROP FUNCTION append_run_events(uuid, uuid, jsonb, uuid);
CREATE FUNCTION append_run_events(p_run uuid, p_project uuid, p_events jsonb,
                                  p_invocation uuid DEFAULT NULL, p_locked boolean DEFAULT false)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    base bigint;
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
        SELECT p_run, last.seq + x.ord, p_project, coalesce(x.at, now()), x.type, x.step_name,
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
    -- so the run's row is updated in place (one row version); the heartbeat extends the
    -- lease. Touches only this run's rows.
    SELECT progress_at, progress_seq, progress_digest, log_lines, log_bytes, logs_dropped,
           runs.cancel_requested
    INTO was FROM runs
    WHERE id = p_run AND project_id = p_project AND lease_token = p_token
      AND invocation_id = p_invocation AND status IN ('running', 'cancelling')
      AND (deadline_at IS NULL OR deadline_at > now())
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_seq <> 0 AND was.progress_seq >= p_seq THEN
        IF p_seq = was.progress_seq AND p_digest IS NOT DISTINCT FROM was.progress_digest THEN
            applied := false;
            cancel_requested := was.cancel_requested;
            RETURN NEXT;
        END IF;
        RETURN;
    END IF;
    -- Each line's seq in the run's log and whether it fits (the run is locked: its counts hold).
    -- (A part the call does not have costs no statement.)
    kept := 0;
    kept_bytes := 0;
    dropped := 0;
    IF p_logs IS NOT NULL THEN
    WITH lines AS (
        SELECT l.*, was.log_lines + l.ord AS seq,
               was.logs_dropped = 0 AND was.log_lines + l.ord <= p_max_lines
               AND was.log_bytes + sum(l.size) OVER (ORDER BY l.ord) <= p_max_bytes AS fits
        FROM jsonb_to_recordset(coalesce(p_logs, '[]')) AS l(
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
    END IF;
    UPDATE runs SET
        progress_at = now(),
        progress_seq = greatest(runs.progress_seq, p_seq),
        progress_digest = CASE WHEN p_seq > 0 THEN p_digest ELSE runs.progress_digest END,
        log_lines = runs.log_lines + kept,
        log_bytes = runs.log_bytes + kept_bytes,
        logs_dropped = runs.logs_dropped + dropped + coalesce(p_logs_dropped, 0)
    WHERE id = p_run
    RETURNING runs.cancel_requested INTO cancel_requested;
    base := append_run_events(p_run, p_project, p_events, p_invocation, true);
    IF p_changes IS NOT NULL THEN
    INSERT INTO steps AS t (run_id, project_id, name, kind, status, position, attempt, output,
                            error, ended_at, wake_at, timeout_at, callback_id, child_run_id,
                            event_name, match)
    SELECT p_run, p_project, x.name, x.kind, x.status, base + x.ord - 1, x.attempt, x.output,
           x.error,
           CASE WHEN x.ended THEN now() END,
           -- A sleep counts from when the workflow reached it (at_ms, the app's clock) as far
           -- as that lies between the invocation's last commit and now; else from now.
           CASE WHEN x.delay_ms IS NOT NULL
                THEN CASE WHEN x.at_ms IS NULL THEN now()
                          ELSE greatest(was.progress_at,
                                        least(now(), to_timestamp(x.at_ms / 1000.0)))
                     END + make_interval(secs => x.delay_ms::double precision / 1000) END,
           CASE WHEN x.timeout_ms IS NOT NULL
                THEN now() + make_interval(secs => x.timeout_ms::double precision / 1000) END,
           x.callback_id, x.child_run_id, x.event_name, x.match
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
        started_at = CASE WHEN excluded.status = 'running' THEN now() ELSE t.started_at END
    WHERE t.status NOT IN ('completed', 'failed', 'cancelled');
    END IF;
    IF p_callbacks IS NOT NULL THEN
    -- A callback's id is derived from its run and step: an ended one comes back only when a
    -- retry runs its step again, and then it waits anew.
    INSERT INTO callbacks (id, project_id, run_id, step_name, timeout_at)
    SELECT x.id, p_project, p_run, x.step_name,
           CASE WHEN x.timeout_ms IS NOT NULL
                THEN now() + make_interval(secs => x.timeout_ms::double precision / 1000) END
    FROM jsonb_to_recordset(coalesce(p_callbacks, '[]')) AS x(
        id uuid, step_name text, timeout_ms bigint)
    ON CONFLICT (id) DO UPDATE SET
        status = 'pending', body = NULL, created_at = now(), completed_at = NULL,
        timeout_at = excluded.timeout_at
    WHERE callbacks.status <> 'pending';
    END IF;
    applied := true;
    RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION run_end(
    p_run uuid, p_project uuid, p_token text, p_status run_status, p_output jsonb,
    p_error jsonb, p_event run_event_type, p_data jsonb,
    OUT parent_run_id uuid, OUT parent_step text, OUT schedule_id text, OUT status run_status,
    OUT has_children boolean
) RETURNS SETOF record LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    wf text;
    closed jsonb;
BEGIN
    -- The end transition: a run not ended ends with p_status (its output or error), when
    -- p_token is its lease token or is NULL (a cancel, a time limit). Its open steps are
    -- cancelled (and their pending callbacks), its history gets their step.cancelled events
    -- and the end event p_event (with p_data), the alerts listening for a failure or a time
    -- out are recorded, and listeners hear of it (stepline_ended). Answers what the caller
    -- must still settle (its parent, by resolve_child; its children, when it has some; its
    -- schedule); no row when the run was not this token's or had ended. Touches only this
    -- run's rows.
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
        FROM c WHERE cb.id = c.callback_id AND cb.status = 'pending'
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
    has_children := EXISTS (SELECT 1 FROM runs c WHERE c.parent_run_id = p_run
                                                   AND c.status IN ('running', 'cancelling'));
    PERFORM pg_notify('stepline_ended', p_run::text);
    RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION run_begin(
    p_run uuid, p_project uuid, p_token text, p_invocation uuid, p_attempt integer,
    p_deltas boolean, p_lead double precision, p_inline_max integer
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
BEGIN
    -- The begin transition: the invocation p_invocation (attempt p_attempt) of the run leased
    -- to p_token begins, unless the lease went stale (no row: another orchestrator may hold the
    -- run now). What came due is settled (sleeps complete, those ending within p_lead seconds
    -- too, as of their end; event waits past their timeout complete with null; callbacks past
    -- theirs fail as timed out) and the invocation's start is recorded (invocation.started, with
    -- the deployment it goes to: the run's, else the app's last known one). Answers the run's
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
    SELECT coalesce((SELECT d.deployment_id FROM deployments d
                     WHERE d.id = r.deployment AND NOT d.current), a.deployment_id),
           CASE WHEN coalesce(p_deltas, true) AND r.history_db = stepline_database_id()
                     AND r.history_acked = r.history_invocation
                     AND r.history_invocation IS DISTINCT FROM p_invocation
                THEN r.history_snapshot END,
           r.history_invocation,
           r.history_invocation IS NOT DISTINCT FROM p_invocation
    INTO v_deployment, v_since, v_base, v_again
    FROM runs r JOIN apps a ON a.id = r.app_id
    WHERE r.id = p_run AND r.project_id = p_project AND r.lease_token = p_token
      AND r.status IN ('running', 'cancelling')
    FOR UPDATE OF r;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH resolved AS (
        UPDATE steps SET
            status = CASE WHEN steps.kind = 'callback' THEN 'failed' ELSE 'completed' END::step_status,
            error = CASE WHEN steps.kind = 'callback'
                THEN '{"type": "CallbackTimeout", "code": "callback_timeout", "message": "the callback was not completed in time"}'::jsonb END,
            ended_at = greatest(now(), CASE WHEN steps.status = 'sleeping' THEN steps.wake_at
                                            ELSE steps.timeout_at END)
        WHERE steps.run_id = p_run AND NOT v_again
          AND ((steps.status = 'sleeping'
                AND steps.wake_at <= now() + make_interval(secs => p_lead))
               OR (steps.status = 'waiting' AND steps.kind IN ('event', 'callback')
                   AND steps.timeout_at <= now()))
        RETURNING steps.name, steps.kind, steps.callback_id, steps.status, steps.error,
                  steps.ended_at
    ),
    timed_out AS (
        UPDATE callbacks c SET status = 'timedOut', completed_at = resolved.ended_at
        FROM resolved WHERE c.id = resolved.callback_id AND c.status = 'pending'
    ),
    -- When the invocation may start: now, or when the last sleep settled ends.
    starts AS (
        SELECT greatest(now(), max(rv.ended_at)) AS at FROM resolved rv
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
        UPDATE runs SET history_snapshot = pg_current_snapshot(),
                        history_invocation = p_invocation, history_db = stepline_database_id()
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
           extract(epoch FROM starts.at - now())::double precision AS wait_s, s.late_s,
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
                    ELSE (SELECT c.status FROM callbacks c WHERE c.id = s.callback_id)
               END AS callback_status,
               CASE WHEN rv.name IS NOT NULL
                    THEN extract(epoch FROM now() - CASE WHEN s.status = 'sleeping'
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
