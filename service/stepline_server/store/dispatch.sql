-- The run loop: due runs leased, invocations begun, step progress committed, invocations suspended
-- or ended.
--
-- A batch comes as one jsonb array of records, unpacked with jsonb_array_elements and
-- jsonb_to_record. Its filter jsonb_typeof(item) = 'object' always holds; it is there for the
-- planner, which expects a hundred rows from a set-returning function but only one or two
-- after an equality it cannot judge, so a batch joined with runs or steps goes through their
-- indexes whatever their size (with a hundred rows expected, a table of a few thousand would
-- be read whole for every batch).

-- name: claim_due
-- Takes up to $1 due runs, higher priority first, then the longest due, and leases each to one
-- invocation: the run's ready_at moves to the end of the lease (or its deadline, if sooner), so
-- a crashed orchestrator's run comes due again, and a run past its time limit is claimed to be
-- ended. A run is due when its ready_at has come, or comes within $4 seconds for a sleep of it
-- that ends then (due_in says in how many seconds; 0: now). Runs of a workflow with a
-- concurrency cap are left to claim_capped, and runs of a workflow with a rate limit not yet
-- started to claim_rate_limited, unless past their deadline (or, not started, cancelled).
-- Without takeovers ($5 false), a run whose lease expired is left to its holder (the dispatcher
-- asks so just after the database was away). taken_over: the run still had a lease, run out
-- (its orchestrator died or stalled). Runs of pull apps are left to their workers' polls
-- (claim_pull), but claimed here once past their deadline, to be ended. The runs in $6 are
-- being invoked by this orchestrator: never taken again while they are.
-- The priorities present are walked one index probe each (levels; nearly always one), and each
-- level's due runs are read in ready_at order from runs_ready_priority: the claim reads what it
-- takes, however many runs wait for a later time. The runs taken are updated through the
-- primary key (id = ANY), so no estimate of how many there are can make a plan read the table.
-- The lease itself is lease_runs's (the fence, the outage grace and pausing are its).
WITH RECURSIVE levels AS (
    (SELECT priority FROM runs WHERE ready_at IS NOT NULL AND NOT pull
     ORDER BY priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT r.priority FROM runs r
            WHERE r.ready_at IS NOT NULL AND NOT r.pull AND r.priority < l.priority
            ORDER BY r.priority DESC LIMIT 1)
    FROM levels l WHERE l.priority IS NOT NULL
),
push_due AS (
    SELECT c.* FROM levels l CROSS JOIN LATERAL (
        SELECT id, priority, ready_at, lease_token AS old_token
        FROM runs
        WHERE priority = l.priority AND NOT pull
          AND ready_at <= now() + make_interval(secs => $4::double precision)
          AND NOT (id = ANY ($6::uuid[]))
          AND (NOT options ? 'concurrency' OR deadline_at <= now())
          AND (NOT options ? 'rateLimit' OR started_at IS NOT NULL OR cancel_requested
               OR deadline_at <= now())
          AND ($5::boolean OR lease_token IS NULL)
          -- (A scalar subquery, read by the run's key: an EXISTS here may be planned as a
          -- hash of every sleeping step.)
          AND (ready_at <= now()
               OR (SELECT min(s.wake_at) FROM steps s
                   WHERE s.run_id = runs.id AND s.status = 'sleeping')
                  <= now() + make_interval(secs => $4::double precision))
        ORDER BY ready_at
        LIMIT $1
        FOR UPDATE SKIP LOCKED
    ) c
    WHERE l.priority IS NOT NULL
    ORDER BY c.priority DESC, c.ready_at
    LIMIT $1
),
pull_overdue AS (
    SELECT id, priority, ready_at, lease_token AS old_token
    FROM runs
    WHERE pull AND ready_at IS NOT NULL AND deadline_at <= now() AND ready_at <= now()
      AND ($5::boolean OR lease_token IS NULL)
    ORDER BY deadline_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
due AS (
    SELECT * FROM (SELECT * FROM push_due UNION ALL SELECT * FROM pull_overdue) d
    ORDER BY priority DESC, ready_at
    LIMIT $1
),
leased AS (
    SELECT * FROM lease_runs(ARRAY(SELECT id FROM due), $2, $3, $6, $5)
)
SELECT * FROM leased ORDER BY priority DESC, due_in;

-- name: due_backlog
-- Runs due now that no invocation has taken (a run out lease included), and how many seconds
-- the oldest has waited. Runs of pull apps, which wait for their workers, are not counted.
SELECT count(*) AS n,
       coalesce(extract(epoch FROM now() - min(ready_at)), 0)::double precision AS oldest_s
FROM runs WHERE ready_at <= now() AND NOT pull;

-- name: next_due_in
-- Seconds until the next run comes due; without takeovers ($1 false), expired leases do not
-- count. Pull apps' runs are their workers' (past their deadline, the next claim ends them).
SELECT extract(epoch FROM min(ready_at) - now())::double precision FROM runs
WHERE ready_at IS NOT NULL AND NOT pull AND ($1::boolean OR lease_token IS NULL);

-- name: heartbeat
-- Extends the leases ($1: [{id, token}]) still held by $2 seconds, never past a run's
-- deadline (a run at its time limit comes due, to be ended). The runs are locked in id order.
WITH held AS (
    SELECT r.id FROM runs r
    JOIN (SELECT h.* FROM jsonb_array_elements($1::jsonb) AS item
              CROSS JOIN LATERAL jsonb_to_record(item) AS h(id uuid, token text)
          WHERE jsonb_typeof(item) = 'object') h ON r.id = h.id AND r.lease_token = h.token
    ORDER BY r.id
    FOR UPDATE OF r
)
UPDATE runs r
SET ready_at = least(now() + make_interval(secs => $2::double precision), r.deadline_at)
FROM held WHERE r.id = held.id
RETURNING r.id, r.cancel_requested;

-- name: begin_invocations
-- For each claimed run ($1: [{run_id, token, invocation_id, attempt, deltas}]) whose lease the
-- token still holds (a claim that went stale begins nothing: another orchestrator may hold the
-- run now): settles what came due (sleeps complete, those ending within $2 seconds too, as of
-- their end; event waits past their timeout complete with null; callbacks past theirs fail as
-- timed out) and records its invocation starting, with the app's last known deployment. Returns
-- the run's steps in the order they were first recorded, one row each (a run begun with no
-- steps to send: one row whose name is null): every step (history_base null) when the run's
-- last invocation is not known or was not answered by an SDK that reads deltas, or when deltas
-- is false (the poll of a worker that does not read them), else only those written by
-- transactions the snapshot that invocation's steps were read under did not see, the open ones
-- (their flags depend on the time) and those this statement settled; the app lays them over
-- the history it kept from invocation history_base. The snapshot of this statement is kept for the next invocation. Each row says
-- the size of the run's whole history (history_steps, history_bytes: bytes of results); wait_s
-- says in how many seconds the last sleep settled ends: the app must not be called before;
-- blocked marks a retrying step whose next attempt is not due when the app is called; a result
-- over $3 bytes comes back as null with its output_bytes and output_digest (the app fetches it
-- by reference, so it is not read here); late_s, for a timer this statement settled (a sleep's
-- end, a wait's timeout), how many seconds ago it was due (negative: claimed ahead). (Only
-- sleeps are settled ahead: nothing from outside can end one sooner, while a callback or an
-- event may still come before a wait's timeout.) The runs are locked in id order, as every
-- statement that locks several runs does.
WITH q AS (
    SELECT q.* FROM jsonb_array_elements($1::jsonb) AS item
        CROSS JOIN LATERAL jsonb_to_record(item) AS q(run_id uuid, token text,
                                                      invocation_id uuid, attempt integer,
                                                      deltas boolean)
        WHERE jsonb_typeof(item) = 'object'
),
db AS MATERIALIZED (
    SELECT stepline_database_id() AS id
),
-- What the invocation carries is decided here, once: only what changed since the snapshot its
-- last invocation read under, when that snapshot was taken in this database (not a dump
-- restored elsewhere, not a logical copy: their transactions are another cluster's) and that
-- invocation was answered by an SDK that reads deltas (history_acked; not what the app declared
-- at its last sync: another replica, of another SDK, may have answered since); else every step.
-- A begin tried again after its commit went through unseen (the connection dropped at its commit)
-- finds its own invocation already begun (again): it records and settles nothing more and sends
-- every step, since the base its first try moved past is gone.
held AS (
    SELECT q.run_id, q.invocation_id, q.attempt, a.deployment_id,
           CASE WHEN coalesce(q.deltas, true) AND runs.history_db = db.id
                     AND runs.history_acked = runs.history_invocation
                     AND runs.history_invocation IS DISTINCT FROM q.invocation_id
                THEN runs.history_snapshot END AS since,
           runs.history_invocation AS base,
           runs.history_invocation IS NOT DISTINCT FROM q.invocation_id AS again
    FROM q JOIN runs ON runs.id = q.run_id JOIN apps a ON a.id = runs.app_id CROSS JOIN db
    WHERE runs.lease_token = q.token AND runs.status IN ('running', 'cancelling')
    ORDER BY runs.id
    FOR UPDATE OF runs
),
resolved AS (
    UPDATE steps SET
        status = CASE WHEN kind = 'callback' THEN 'failed' ELSE 'completed' END::step_status,
        error = CASE WHEN kind = 'callback'
            THEN '{"type": "CallbackTimeout", "code": "callback_timeout", "message": "the callback was not completed in time"}'::jsonb END,
        ended_at = greatest(now(), CASE WHEN steps.status = 'sleeping' THEN steps.wake_at
                                        ELSE steps.timeout_at END)
    FROM held q
    WHERE steps.run_id = q.run_id AND NOT q.again
      AND ((steps.status = 'sleeping'
            AND steps.wake_at <= now() + make_interval(secs => $2::double precision))
           OR (steps.status = 'waiting' AND steps.kind IN ('event', 'callback')
               AND steps.timeout_at <= now()))
    RETURNING steps.run_id, steps.name, steps.kind, steps.callback_id, steps.status,
              steps.error, steps.ended_at
),
timed_out AS (
    UPDATE callbacks c SET status = 'timedOut', completed_at = resolved.ended_at
    FROM resolved WHERE c.id = resolved.callback_id AND c.status = 'pending'
),
-- When each run's invocation may start: now, or when the last sleep it settled ends.
starts AS (
    SELECT q.run_id, greatest(now(), max(rv.ended_at)) AS at
    FROM held q LEFT JOIN resolved rv ON rv.run_id = q.run_id
    GROUP BY q.run_id
),
evs AS (
    SELECT run_id, row_number() OVER (PARTITION BY run_id ORDER BY k, at, name) AS ord, at,
           type, name, invocation_id, deployment_id, data
    FROM (
        SELECT run_id, 0 AS k, ended_at AS at,
               CASE WHEN kind = 'callback' THEN 'step.failed' ELSE 'step.completed' END AS type,
               name, NULL::uuid AS invocation_id, NULL::text AS deployment_id,
               CASE WHEN kind = 'sleep' THEN jsonb_build_object('kind', kind)
                    ELSE jsonb_build_object('kind', kind, 'timedOut', true) END AS data
        FROM resolved
        UNION ALL
        SELECT q.run_id, 1, starts.at, 'invocation.started', NULL, q.invocation_id,
               q.deployment_id, jsonb_build_object('attempt', q.attempt)
        FROM held q JOIN starts ON starts.run_id = q.run_id
        WHERE NOT q.again
    ) x
),
counts AS (
    SELECT run_id, count(*) AS n FROM evs GROUP BY run_id
),
r AS (
    UPDATE runs SET next_seq = runs.next_seq + counts.n,
                    history_snapshot = pg_current_snapshot(), history_invocation = h.invocation_id,
                    history_db = db.id
    FROM counts JOIN held h ON h.run_id = counts.run_id CROSS JOIN db
    WHERE runs.id = counts.run_id
    RETURNING runs.id, runs.project_id, runs.next_seq - counts.n AS base
),
history AS (
    INSERT INTO run_events (run_id, seq, project_id, at, type, step_name, invocation_id,
                            deployment_id, data)
    SELECT r.id, r.base + evs.ord - 1, r.project_id, evs.at, evs.type, evs.name,
           evs.invocation_id, evs.deployment_id, evs.data
    FROM r JOIN evs ON evs.run_id = r.id
)
-- The steps to send as read before this statement, with what it just settled laid over them.
SELECT q.run_id, s.name, s.kind, s.status, s.position, s.attempt, s.output, s.output_bytes,
       s.output_digest, s.error, s.wake_at, s.callback_id, s.child_run_id, s.callback_status,
       coalesce(s.status = 'retrying' AND s.wake_at > starts.at, false) AS blocked,
       extract(epoch FROM starts.at - now())::double precision AS wait_s, s.late_s,
       CASE WHEN q.since IS NOT NULL THEN q.base END AS history_base,
       size.steps AS history_steps, size.bytes AS history_bytes
FROM held q
JOIN starts ON starts.run_id = q.run_id
CROSS JOIN LATERAL (
    SELECT count(*) AS steps, coalesce(sum(a.output_bytes), 0)::bigint AS bytes
    FROM steps a WHERE a.run_id = q.run_id
) size
LEFT JOIN LATERAL (
    SELECT s.name, s.kind, coalesce(rv.status, s.status) AS status, s.position, s.attempt,
           CASE WHEN s.output_bytes > $3::integer THEN NULL ELSE s.output END AS output,
           s.output_bytes, s.output_digest, coalesce(rv.error, s.error) AS error, s.wake_at,
           s.callback_id, s.child_run_id,
           CASE WHEN rv.kind = 'callback' THEN 'timedOut'
                ELSE (SELECT c.status FROM callbacks c WHERE c.id = s.callback_id)
           END AS callback_status,
           CASE WHEN rv.name IS NOT NULL
                THEN extract(epoch FROM now() - CASE WHEN s.status = 'sleeping' THEN s.wake_at
                                                     ELSE s.timeout_at END)::double precision
           END AS late_s
    FROM steps s
    LEFT JOIN resolved rv ON rv.run_id = s.run_id AND rv.name = s.name
    WHERE s.run_id = q.run_id
      AND (q.since IS NULL OR NOT pg_visible_in_snapshot(s.version, q.since)
           OR s.status NOT IN ('completed', 'failed', 'cancelled') OR rv.name IS NOT NULL)
) s ON true
ORDER BY q.run_id, s.position;

-- name: progress
-- Applies step changes for several runs at once (a group commit), each for the invocation
-- holding the run's lease, and appends their history and log lines, in one statement. $1:
-- [{run_id, token, invocation_id, n_events, seq, digest, logs_dropped}], $2: changes and $3:
-- events, each with run_id and ord (1-based, per run), $4: callbacks to create [{run_id, id,
-- step_name, timeout_ms}], $5: log lines [{run_id, ord, at, level, message, fields, step_name,
-- size}], kept in order while the run's log has room ($6 lines, $7 bytes in all; once a line
-- did not fit, none newer is kept) and counted as dropped past it. A run
-- comes back with no row (nothing written: the caller must stop) when the token or the
-- invocation is not the one holding the run, when the run is past its time limit, or when the
-- call repeats an applied seq with another body (digest: a second execution of the
-- invocation); the same call sent again (same seq and digest: its answer was lost) comes back
-- with applied = false and writes nothing. The runs are locked in id order. ready_at (indexed)
-- is left alone so the run's row is updated in place; the heartbeat extends the lease.
WITH q AS (
    SELECT q.* FROM jsonb_array_elements($1::jsonb) AS item
        CROSS JOIN LATERAL jsonb_to_record(item)
            AS q(run_id uuid, token text, invocation_id uuid, n_events integer, seq bigint,
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
history_in AS MATERIALIZED (
    SELECT x.* FROM jsonb_array_elements($3::jsonb) AS item CROSS JOIN LATERAL jsonb_to_record(item)
        AS x(run_id uuid, ord integer, type text, step_name text, deployment_id text,
             http_status integer, duration_ms integer, data jsonb)
        WHERE jsonb_typeof(item) = 'object'
),
callbacks_in AS MATERIALIZED (
    SELECT x.* FROM jsonb_array_elements($4::jsonb) AS item CROSS JOIN LATERAL jsonb_to_record(item)
        AS x(run_id uuid, id uuid, step_name text, timeout_ms bigint)
        WHERE jsonb_typeof(item) = 'object'
),
logs_in AS MATERIALIZED (
    SELECT x.* FROM jsonb_array_elements($5::jsonb) AS item CROSS JOIN LATERAL jsonb_to_record(item)
        AS x(run_id uuid, ord integer, at timestamptz, level text, message text, fields jsonb,
             step_name text, size integer)
        WHERE jsonb_typeof(item) = 'object'
),
-- Each line's seq in the run's log and whether it fits (the run is locked: its counts hold).
logs_fit AS MATERIALIZED (
    SELECT l.*, h.log_lines + l.ord AS seq,
           h.logs_dropped = 0 AND h.log_lines + l.ord <= $6::integer
           AND h.log_bytes + sum(l.size) OVER (PARTITION BY l.run_id ORDER BY l.ord)
               <= $7::bigint AS fits
    FROM logs_in l JOIN held h ON h.id = l.run_id
),
logs_count AS (
    SELECT run_id, count(*) FILTER (WHERE fits) AS kept,
           coalesce(sum(size) FILTER (WHERE fits), 0) AS bytes,
           count(*) FILTER (WHERE NOT fits) AS dropped
    FROM logs_fit GROUP BY run_id
),
r AS (
    UPDATE runs
    SET next_seq = runs.next_seq + q.n_events,
        progress_at = now(),
        progress_seq = greatest(runs.progress_seq, q.seq),
        progress_digest = CASE WHEN q.seq > 0 THEN q.digest ELSE runs.progress_digest END,
        log_lines = runs.log_lines + coalesce(lc.kept, 0),
        log_bytes = runs.log_bytes + coalesce(lc.bytes, 0),
        logs_dropped = runs.logs_dropped + coalesce(lc.dropped, 0)
                       + coalesce(q.logs_dropped, 0)
    FROM q JOIN held AS before ON before.id = q.run_id
         LEFT JOIN logs_count lc ON lc.run_id = q.run_id
    WHERE runs.id = q.run_id AND (q.seq = 0 OR before.progress_seq < q.seq)
    RETURNING runs.id, runs.project_id, runs.next_seq - q.n_events AS base,
              runs.cancel_requested, q.invocation_id, before.progress_at AS since
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
e AS (
    INSERT INTO run_events (run_id, seq, project_id, type, step_name, invocation_id,
                            deployment_id, http_status, duration_ms, data)
    SELECT r.id, r.base + x.ord - 1, r.project_id, x.type, x.step_name, r.invocation_id,
           x.deployment_id, x.http_status, x.duration_ms, x.data
    FROM history_in x JOIN r ON r.id = x.run_id
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

-- name: fail_step
UPDATE steps SET status = 'failed', error = $3, ended_at = now()
WHERE run_id = $1 AND name = $2 AND status = 'waiting';

-- name: suspend_runs
-- Ends invocations ($1: [{id, token, acked}], each a run and its lease token, and whether an SDK
-- that reads history deltas answered) with the runs still running: each comes due at its
-- earliest timer, or at once when something woke it while the invocation ran; the next
-- invocation may carry a delta only after an acked one. Answers the runs suspended (not those
-- whose lease was lost). The runs are locked in id order.
UPDATE runs SET
    lease_token = NULL, lease_owner = NULL, invoke_attempts = 0, undelivered_since = NULL,
    history_acked = CASE WHEN q.acked THEN runs.invocation_id END,
    ready_at = CASE
        WHEN runs.wake_seq <> runs.claimed_wake_seq THEN now()
        ELSE least(runs.deadline_at, (
            SELECT min(coalesce(s.wake_at, s.timeout_at)) FROM steps s
            WHERE s.run_id = runs.id AND s.status IN ('sleeping', 'retrying', 'waiting')))
        END
FROM (
    SELECT r.id, q.acked FROM runs r
    JOIN (SELECT q.* FROM jsonb_array_elements($1::jsonb) AS item
              CROSS JOIN LATERAL jsonb_to_record(item) AS q(id uuid, token text, acked boolean)
          WHERE jsonb_typeof(item) = 'object') q ON r.id = q.id AND r.lease_token = q.token
    ORDER BY r.id
    FOR UPDATE OF r
) q
WHERE runs.id = q.id
RETURNING runs.id;

-- name: invoke_failed
-- The invocation of run $1 (lease $2) could not be delivered: the run stays running, due again
-- in $3 ms; the delivery window counts from the first failure of the streak.
UPDATE runs SET
    lease_token = NULL, lease_owner = NULL, invoke_attempts = invoke_attempts + 1,
    undelivered_since = coalesce(undelivered_since, now()),
    ready_at = least(deadline_at, now() + make_interval(secs => $3::double precision / 1000))
WHERE id = $1 AND lease_token = $2
RETURNING invoke_attempts;

-- name: end_runs
-- Ends runs ($1: [{id, token, status, output, error, event, data}]), each when token is its
-- lease token, or when token is null (cancel, time limit): their open steps are cancelled, the
-- history gets their events and the end event (event, with data), and listeners hear of it.
-- Answers, for each run ended, what the caller must still settle.
WITH q AS (
    SELECT q.* FROM jsonb_array_elements($1::jsonb) AS item
        CROSS JOIN LATERAL jsonb_to_record(item)
            AS q(id uuid, token text, status run_status, output jsonb, error jsonb, event text,
                 data jsonb)
        WHERE jsonb_typeof(item) = 'object'
),
ok AS (
    SELECT runs.id FROM runs JOIN q ON q.id = runs.id
    WHERE (q.token IS NULL OR runs.lease_token = q.token)
      AND runs.status IN ('running', 'cancelling')
    ORDER BY runs.id
    FOR UPDATE OF runs
),
closed AS (
    UPDATE steps s SET status = 'cancelled', ended_at = now()
    FROM ok
    WHERE s.run_id = ok.id AND s.status IN ('running', 'retrying', 'sleeping', 'waiting')
    RETURNING s.run_id, s.name, s.kind, s.callback_id
),
cancelled_callbacks AS (
    UPDATE callbacks c SET status = 'cancelled', completed_at = now()
    FROM closed WHERE c.id = closed.callback_id AND c.status = 'pending'
),
evs AS (
    SELECT run_id, row_number() OVER (PARTITION BY run_id ORDER BY k, name) AS ord, type, name,
           data
    FROM (
        SELECT run_id, 0 AS k, 'step.cancelled' AS type, name,
               jsonb_build_object('kind', kind) AS data
        FROM closed
        UNION ALL
        SELECT q.id, 1, q.event, NULL, q.data FROM q JOIN ok ON ok.id = q.id
    ) x
),
counts AS (
    SELECT run_id, count(*) AS n FROM evs GROUP BY run_id
),
r AS (
    UPDATE runs SET
        status = q.status, output = q.output, error = q.error, ended_at = now(),
        ready_at = NULL, lease_token = NULL, lease_owner = NULL, version = runs.version + 1,
        next_seq = runs.next_seq + counts.n
    FROM q JOIN counts ON counts.run_id = q.id
    WHERE runs.id = q.id
    RETURNING runs.id, runs.project_id, runs.parent_run_id, runs.parent_step,
              runs.schedule_id, runs.status, runs.next_seq - counts.n AS base
),
history AS (
    INSERT INTO run_events (run_id, seq, project_id, type, step_name, data)
    SELECT r.id, r.base + evs.ord - 1, r.project_id, evs.type, evs.name, evs.data
    FROM r JOIN evs ON evs.run_id = r.id
),
alerted AS (
    -- Alerts (alerts.sql): a run ending failed or timedOut records, in this statement, one
    -- notification per alert listening for it (run.failed, run.timedOut, and app.unreachable
    -- for a failure with code app_unreachable), at most one per alert, run and type.
    INSERT INTO alert_notifications (id, project_id, alert_id, type, run_id, data)
    SELECT gen_random_uuid(), r.project_id, a.id, t.type, r.id,
           jsonb_build_object('workflow', w.workflow, 'status', q.status, 'error', q.error)
    FROM r
    JOIN q ON q.id = r.id
    JOIN runs w ON w.id = r.id
    CROSS JOIN LATERAL (VALUES
        (CASE q.status WHEN 'failed' THEN 'run.failed' WHEN 'timedOut' THEN 'run.timedOut' END),
        (CASE WHEN q.status = 'failed' AND q.error ->> 'code' = 'app_unreachable'
              THEN 'app.unreachable' END)) AS t (type)
    JOIN alerts a ON a.project_id = r.project_id AND t.type = ANY (a.types)
                 AND (a.workflow IS NULL OR a.workflow = w.workflow)
    ON CONFLICT DO NOTHING
)
SELECT r.id, r.project_id, r.parent_run_id, r.parent_step, r.schedule_id, r.status,
       EXISTS (SELECT 1 FROM runs c
               WHERE c.parent_run_id = r.id AND c.status IN ('running', 'cancelling'))
           AS has_children,
       pg_notify('stepline_ended', r.id::text)
FROM r;

-- name: progress_at
SELECT project_id, progress_at FROM runs WHERE id = $1;
