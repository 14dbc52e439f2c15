-- The progress transition in fewer statements: the run's row is fenced, checked for a replay
-- and updated in one UPDATE (no SELECT ... FOR UPDATE before it), and its log counts are
-- written by a second one only when the call brings log lines.

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
    -- so the run's row is updated in place; the heartbeat extends the lease. Touches only this
    -- run's rows.
    -- The fence, the replay check and the update are one statement: its conditions are
    -- checked again on the row's latest version when another transaction updated it first,
    -- and what it answers of the row (the log counts, which only this function changes, and
    -- cancel_requested) is that version's. The last commit's time (a sleep counts from no
    -- earlier) is read by the subquery, which sees the row as it was before this update.
    UPDATE runs r SET
        progress_at = now(),
        progress_seq = greatest(r.progress_seq, p_seq),
        progress_digest = CASE WHEN p_seq > 0 THEN p_digest ELSE r.progress_digest END,
        logs_dropped = r.logs_dropped + coalesce(p_logs_dropped, 0)
    WHERE r.id = p_run AND r.project_id = p_project AND r.lease_token = p_token
      AND r.invocation_id = p_invocation AND r.status IN ('running', 'cancelling')
      AND (r.deadline_at IS NULL OR r.deadline_at > now())
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
          AND (r.deadline_at IS NULL OR r.deadline_at > now())
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
