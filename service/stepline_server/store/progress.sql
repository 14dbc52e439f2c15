-- Step progress committed: an invocation's plans, several runs' in one statement.
-- A batch comes as one jsonb array of records, unpacked as claims.sql says (and why).

-- name: progress
-- Applies step changes for several runs at once (a group commit), each for the invocation
-- holding the run's lease, and appends their history (append_run_events) and log lines, in one
-- statement. $1: [{run_id, token, invocation_id, events, seq, digest, logs_dropped}] (events:
-- the run's history events, in order), $2: changes, each with run_id and ord (1-based, per
-- run; a step's position is the seq of its run's ord-th event), $3: callbacks to create
-- [{run_id, id, step_name, timeout_ms}], $4: log lines [{run_id, ord, at, level, message,
-- fields, step_name, size}], kept in order while the run's log has room ($5 lines, $6 bytes in
-- all; once a line did not fit, none newer is kept) and counted as dropped past it. A run
-- comes back with no row (nothing written: the caller must stop) when the token or the
-- invocation is not the one holding the run, when the run is past its time limit, or when the
-- call repeats an applied seq with another body (digest: a second execution of the
-- invocation); the same call sent again (same seq and digest: its answer was lost) comes back
-- with applied = false and writes nothing. The runs are locked in id order. ready_at (indexed)
-- is left alone so the run's row is updated in place; the heartbeat extends the lease.
WITH q AS (
    SELECT q.* FROM jsonb_array_elements($1::jsonb) AS item
        CROSS JOIN LATERAL jsonb_to_record(item)
            AS q(run_id uuid, token text, invocation_id uuid, events jsonb, seq bigint,
                 digest text, logs_dropped integer)
        WHERE jsonb_typeof(item) = 'object'
),
held AS (
    SELECT runs.id, runs.progress_at, runs.progress_seq, runs.progress_digest, runs.log_lines,
           runs.log_bytes, runs.logs_dropped
    FROM q JOIN runs ON runs.id = q.run_id
    WHERE runs.lease_token = q.token AND runs.invocation_id = q.invocation_id
      AND runs.status IN ('running', 'cancelling')
      AND (runs.deadline_at IS NULL OR runs.deadline_at > now())
    ORDER BY runs.id
    FOR UPDATE OF runs
),
-- Each batch is read once (materialised), then joined with the runs that took it.
changes AS MATERIALIZED (
    SELECT x.* FROM jsonb_array_elements($2::jsonb) AS item CROSS JOIN LATERAL jsonb_to_record(item)
        AS x(run_id uuid, ord integer, name text, kind step_kind, status step_status,
             attempt integer, output jsonb, error jsonb, ended boolean, delay_ms bigint,
             timeout_ms bigint, at_ms bigint, callback_id uuid, child_run_id uuid,
             event_name text, match jsonb)
        WHERE jsonb_typeof(item) = 'object'
),
callbacks_in AS MATERIALIZED (
    SELECT x.* FROM jsonb_array_elements($3::jsonb) AS item CROSS JOIN LATERAL jsonb_to_record(item)
        AS x(run_id uuid, id uuid, step_name text, timeout_ms bigint)
        WHERE jsonb_typeof(item) = 'object'
),
logs_in AS MATERIALIZED (
    SELECT x.* FROM jsonb_array_elements($4::jsonb) AS item CROSS JOIN LATERAL jsonb_to_record(item)
        AS x(run_id uuid, ord integer, at timestamptz, level text, message text, fields jsonb,
             step_name text, size integer)
        WHERE jsonb_typeof(item) = 'object'
),
-- Each line's seq in the run's log and whether it fits (the run is locked: its counts hold).
logs_fit AS MATERIALIZED (
    SELECT l.*, h.log_lines + l.ord AS seq,
           h.logs_dropped = 0 AND h.log_lines + l.ord <= $5::integer
           AND h.log_bytes + sum(l.size) OVER (PARTITION BY l.run_id ORDER BY l.ord)
               <= $6::bigint AS fits
    FROM logs_in l JOIN held h ON h.id = l.run_id
),
logs_count AS (
    SELECT run_id, count(*) FILTER (WHERE fits) AS kept,
           coalesce(sum(size) FILTER (WHERE fits), 0) AS bytes,
           count(*) FILTER (WHERE NOT fits) AS dropped
    FROM logs_fit GROUP BY run_id
),
u AS (
    UPDATE runs
    SET progress_at = now(),
        progress_seq = greatest(runs.progress_seq, q.seq),
        progress_digest = CASE WHEN q.seq > 0 THEN q.digest ELSE runs.progress_digest END,
        log_lines = runs.log_lines + coalesce(lc.kept, 0),
        log_bytes = runs.log_bytes + coalesce(lc.bytes, 0),
        logs_dropped = runs.logs_dropped + coalesce(lc.dropped, 0)
                       + coalesce(q.logs_dropped, 0)
    FROM q JOIN held AS before ON before.id = q.run_id
         LEFT JOIN logs_count lc ON lc.run_id = q.run_id
    WHERE runs.id = q.run_id AND (q.seq = 0 OR before.progress_seq < q.seq)
    RETURNING runs.id, runs.project_id, runs.cancel_requested, q.invocation_id, q.events,
              before.progress_at AS since
),
-- Each run's history, appended once its row is updated (this reads u): base is the seq of its
-- first event.
r AS (
    SELECT u.*, append_run_events(u.id, u.project_id, u.events, u.invocation_id) AS base
    FROM u
),
s AS (
    INSERT INTO steps AS t (run_id, project_id, name, kind, status, position, attempt, output,
                            error, ended_at, wake_at, timeout_at, callback_id, child_run_id,
                            event_name, match)
    SELECT r.id, r.project_id, x.name, x.kind, x.status, r.base + x.ord - 1, x.attempt,
           x.output, x.error,
           CASE WHEN x.ended THEN now() END,
           -- A sleep counts from when the workflow reached it (at_ms, the app's clock) as
           -- far as that lies between the invocation's last commit and now; else from now.
           CASE WHEN x.delay_ms IS NOT NULL
                THEN CASE WHEN x.at_ms IS NULL THEN now()
                          ELSE greatest(r.since, least(now(), to_timestamp(x.at_ms / 1000.0)))
                     END + make_interval(secs => x.delay_ms::double precision / 1000) END,
           CASE WHEN x.timeout_ms IS NOT NULL
                THEN now() + make_interval(secs => x.timeout_ms::double precision / 1000) END,
           x.callback_id, x.child_run_id, x.event_name, x.match
    FROM changes x JOIN r ON r.id = x.run_id
    ON CONFLICT (run_id, name) DO UPDATE SET
        status = excluded.status, attempt = excluded.attempt, output = excluded.output,
        error = excluded.error, ended_at = excluded.ended_at, wake_at = excluded.wake_at,
        timeout_at = excluded.timeout_at,
        callback_id = coalesce(excluded.callback_id, t.callback_id),
        child_run_id = coalesce(excluded.child_run_id, t.child_run_id),
        event_name = excluded.event_name, match = excluded.match,
        started_at = CASE WHEN excluded.status = 'running' THEN now() ELSE t.started_at END
    WHERE t.status NOT IN ('completed', 'failed', 'cancelled')
),
callbacks_made AS (
    -- A callback's id is derived from its run and step: an ended one comes back only when a
    -- retry runs its step again, and then it waits anew.
    INSERT INTO callbacks (id, project_id, run_id, step_name, timeout_at)
    SELECT x.id, r.project_id, r.id, x.step_name,
           CASE WHEN x.timeout_ms IS NOT NULL
                THEN now() + make_interval(secs => x.timeout_ms::double precision / 1000) END
    FROM callbacks_in x JOIN r ON r.id = x.run_id
    ON CONFLICT (id) DO UPDATE SET
        status = 'pending', body = NULL, created_at = now(), completed_at = NULL,
        timeout_at = excluded.timeout_at
    WHERE callbacks.status <> 'pending'
),
lg AS (
    INSERT INTO run_logs (run_id, seq, project_id, at, level, message, fields, step_name)
    SELECT r.id, l.seq, r.project_id, l.at, l.level, l.message, l.fields, l.step_name
    FROM logs_fit l JOIN r ON r.id = l.run_id
    WHERE l.fits
)
SELECT runs.id, runs.cancel_requested, runs.project_id, r.id IS NOT NULL AS applied
FROM q
JOIN held ON held.id = q.run_id
JOIN runs ON runs.id = q.run_id
LEFT JOIN r ON r.id = q.run_id
WHERE r.id IS NOT NULL
   OR (q.seq = held.progress_seq AND q.digest IS NOT DISTINCT FROM held.progress_digest);

-- name: progress_at
SELECT project_id, progress_at FROM runs WHERE id = $1;
