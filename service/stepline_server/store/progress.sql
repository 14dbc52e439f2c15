-- Step progress committed: an invocation's plans, several runs' in one statement.
-- A batch comes as one jsonb array of records, unpacked as claims.sql says (and why).

-- name: progress
-- Applies step changes for several runs at once (a group commit), each for the invocation
-- holding the run's lease, in one statement: each run's progress is run_progress's (its
-- fencing, replay rules, time limit and log caps). $1: [{run_id, token, invocation_id, events,
-- seq, digest, logs_dropped}] (events: the run's history events, in order), $2: changes, each
-- with run_id and ord (1-based, per run), $3: callbacks to create [{run_id, id, step_name,
-- timeout_ms}], $4: log lines [{run_id, ord, at, level, message, fields, step_name, size}],
-- $5 and $6: the log caps (lines, bytes). A run comes back with no row when nothing was
-- written (the caller must stop), with applied = false for the same call sent again. Each
-- batch is split by run once; the runs are locked in id order before any is moved (a
-- materialised CTE: the planner would otherwise call run_progress below the lock).
WITH q AS (
    SELECT q.* FROM jsonb_array_elements($1::jsonb) AS item
        CROSS JOIN LATERAL jsonb_to_record(item)
            AS q(run_id uuid, token text, invocation_id uuid, events jsonb, seq bigint,
                 digest text, logs_dropped integer)
        WHERE jsonb_typeof(item) = 'object'
),
locked AS MATERIALIZED (
    SELECT q.*, runs.project_id FROM q JOIN runs ON runs.id = q.run_id
    WHERE runs.lease_token = q.token
    ORDER BY runs.id
    FOR UPDATE OF runs
),
changes AS MATERIALIZED (
    SELECT (item ->> 'run_id')::uuid AS run_id, jsonb_agg(item) AS items
    FROM jsonb_array_elements($2::jsonb) AS item GROUP BY 1
),
callbacks_in AS MATERIALIZED (
    SELECT (item ->> 'run_id')::uuid AS run_id, jsonb_agg(item) AS items
    FROM jsonb_array_elements($3::jsonb) AS item GROUP BY 1
),
logs_in AS MATERIALIZED (
    SELECT (item ->> 'run_id')::uuid AS run_id, jsonb_agg(item) AS items
    FROM jsonb_array_elements($4::jsonb) AS item GROUP BY 1
)
SELECT l.run_id AS id, p.cancel_requested, l.project_id, p.applied
FROM locked l
LEFT JOIN changes c ON c.run_id = l.run_id
LEFT JOIN callbacks_in cb ON cb.run_id = l.run_id
LEFT JOIN logs_in lg ON lg.run_id = l.run_id
CROSS JOIN LATERAL run_progress(l.run_id, l.project_id, l.token, l.invocation_id, l.events,
                                l.seq, l.digest, l.logs_dropped, c.items, cb.items, lg.items,
                                $5::integer, $6::bigint) p;

-- name: progress_at
SELECT project_id, progress_at FROM runs WHERE id = $1;
