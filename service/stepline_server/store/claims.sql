-- The dispatcher's claims: due runs leased, their leases kept, invocations begun.
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
-- deadline (run_keep_lease: a run at its time limit comes due, to be ended). The runs are
-- locked in id order, before any is extended (a materialised CTE, as suspend_runs).
WITH held AS MATERIALIZED (
    SELECT r.id, r.project_id, h.token FROM runs r
    JOIN (SELECT h.* FROM jsonb_array_elements($1::jsonb) AS item
              CROSS JOIN LATERAL jsonb_to_record(item) AS h(id uuid, token text)
          WHERE jsonb_typeof(item) = 'object') h ON r.id = h.id AND r.lease_token = h.token
    ORDER BY r.id
    FOR UPDATE OF r
)
SELECT id, cancel_requested FROM (
    SELECT id, run_keep_lease(id, project_id, token, $2::double precision) AS cancel_requested
    FROM held
) k
WHERE cancel_requested IS NOT NULL;

-- name: begin_invocations
-- For each claimed run ($1: [{run_id, token, invocation_id, attempt, deltas}]) whose lease the
-- token still holds (a claim that went stale begins nothing: another orchestrator may hold the
-- run now), the invocation begins (run_begin: what came due is settled, timers within $2
-- seconds ahead too, the start is recorded, and the steps to send come back, a result over $3
-- bytes by reference; deltas false: the poll of a worker that does not read history deltas).
-- One row a step per run (a run begun with no steps to send: one row whose name is null), in
-- the order they were first recorded. The runs are locked in id order, as every statement
-- that locks several runs does.
WITH q AS (
    SELECT q.* FROM jsonb_array_elements($1::jsonb) AS item
        CROSS JOIN LATERAL jsonb_to_record(item) AS q(run_id uuid, token text,
                                                      invocation_id uuid, attempt integer,
                                                      deltas boolean)
        WHERE jsonb_typeof(item) = 'object'
),
-- (Locked before any run begins: a materialised CTE, or the planner may call run_begin below
-- the lock.)
-- The deployment each invocation goes to is read here (the run's, else the app's last known
-- one) and passed to run_begin.
locked AS MATERIALIZED (
    SELECT q.*, runs.project_id,
           coalesce(d.deployment_id, a.deployment_id) AS invoked_deployment_id
    FROM q JOIN runs ON runs.id = q.run_id
    JOIN apps a ON a.id = runs.app_id
    LEFT JOIN deployments d ON d.id = runs.deployment AND NOT d.current
    WHERE runs.lease_token = q.token AND runs.status IN ('running', 'cancelling')
    ORDER BY runs.id
    FOR UPDATE OF runs
)
SELECT l.run_id, b.*
FROM locked l
CROSS JOIN LATERAL run_begin(l.run_id, l.project_id, l.token, l.invocation_id, l.attempt,
                             l.deltas, $2::double precision, $3::integer,
                             l.invoked_deployment_id) b
ORDER BY l.run_id, b.position;
