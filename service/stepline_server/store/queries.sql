-- Every query Stepline runs, one named block each ("-- name: x"). Loaded once by store.db.
--
-- A batch comes as one jsonb array of records, unpacked with jsonb_array_elements and
-- jsonb_to_record. Its filter jsonb_typeof(item) = 'object' always holds; it is there for the
-- planner, which expects a hundred rows from a set-returning function but only one or two
-- after an equality it cannot judge, so a batch joined with runs or steps goes through their
-- indexes whatever their size (with a hundred rows expected, a table of a few thousand would
-- be read whole for every batch).

-- name: ensure_project
INSERT INTO projects (id, name) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING;

-- name: insert_project
INSERT INTO projects (id, name) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING RETURNING *;

-- name: get_project
SELECT * FROM projects WHERE id = $1;

-- name: list_projects
SELECT * FROM projects ORDER BY name;

-- name: find_project
SELECT * FROM projects WHERE name = $1;

-- name: insert_environment
INSERT INTO environments (id, project_id, name) VALUES ($1, $2, $3)
ON CONFLICT (project_id, name) DO NOTHING
RETURNING *;

-- name: find_environment
SELECT * FROM environments WHERE project_id = $1 AND name = $2;

-- name: project_environments
SELECT * FROM environments WHERE project_id = $1 ORDER BY created_at, name;

-- name: insert_key
INSERT INTO api_keys (id, project_id, name, key_hash, role, prefix)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING *;

-- name: find_key
-- The key's context: its environment (the scope of every query), project and role.
SELECT k.id, k.name, k.role, e.id AS environment_id, e.name AS environment,
       p.id AS project_id, p.name AS project
FROM api_keys k
JOIN environments e ON e.id = k.project_id
JOIN projects p ON p.id = e.project_id
WHERE k.key_hash = $1 AND k.revoked_at IS NULL;

-- name: environment_keys
SELECT k.*, e.name AS environment FROM api_keys k JOIN environments e ON e.id = k.project_id
WHERE k.project_id = $1 AND k.revoked_at IS NULL
ORDER BY k.created_at, k.id;

-- name: project_keys
SELECT k.*, e.name AS environment FROM api_keys k JOIN environments e ON e.id = k.project_id
WHERE e.project_id = $1 AND k.revoked_at IS NULL
ORDER BY e.name, k.created_at, k.id;

-- name: revoke_key
-- Revokes key $1 of environment $2 (of any environment when $2 is NULL: the CLI).
UPDATE api_keys SET revoked_at = now()
WHERE id = $1 AND ($2::uuid IS NULL OR project_id = $2) AND revoked_at IS NULL
RETURNING id;

-- name: server_secrets
SELECT secret FROM server_secrets ORDER BY id DESC;

-- name: insert_server_secret
INSERT INTO server_secrets (secret)
SELECT $1 WHERE NOT EXISTS (SELECT 1 FROM server_secrets);

-- name: rotate_app_secret
-- App $2 of $1 signs with secret $3 from now on; the previous one is kept after it.
UPDATE apps SET signing_secrets = ARRAY[$3, signing_secrets[1]], updated_at = now()
WHERE project_id = $1 AND id = $2
RETURNING *;

-- name: insert_app
-- A push app has a url ($5), a pull app ($7 = 'pull') none.
INSERT INTO apps (id, project_id, slug, name, url, signing_secrets, kind)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (project_id, name) DO NOTHING
RETURNING *;

-- name: get_app
SELECT * FROM apps WHERE project_id = $1 AND (id::text = $2 OR slug = $2);

-- name: get_app_by_name
SELECT * FROM apps WHERE project_id = $1 AND name = $2;

-- name: list_apps
SELECT * FROM apps
WHERE project_id = $1 AND ($2::timestamptz IS NULL OR (created_at, id) > ($2, $3::uuid))
ORDER BY created_at, id
LIMIT $4;

-- name: update_app
UPDATE apps SET url = coalesce($3, url), name = coalesce($4, name), updated_at = now()
WHERE project_id = $1 AND id = $2
RETURNING *;

-- name: lock_app_runs
-- Locks the runs of app $2 of project $1 in id order, as every statement that locks several
-- runs does, so deleting the app (whose cascade takes them in the order they lie) never
-- deadlocks with a group commit or an invocation's end holding some of them.
SELECT id FROM runs WHERE app_id = $2 AND project_id = $1 ORDER BY id FOR UPDATE;

-- name: delete_app
-- Deletes app $2 of project $1 with its workflows and runs (by cascade).
DELETE FROM apps WHERE project_id = $1 AND id = $2;

-- name: app_synced
UPDATE apps SET synced_at = now(), deployment_id = $2 WHERE id = $1 RETURNING *;

-- name: upsert_workflow
-- Stores a synced workflow; $5: the definitions version it changed in (NULL: it did not).
INSERT INTO workflows (project_id, name, app_id, options, synced_at, version)
VALUES ($1, $2, $3, $4, now(), coalesce($5::integer, 1))
ON CONFLICT (project_id, name)
DO UPDATE SET app_id = excluded.app_id, options = excluded.options, synced_at = now(),
              version = coalesce($5::integer, workflows.version);

-- name: app_definitions
-- The workflows app $2 hosts in environment $1, as last synced.
SELECT name, options FROM workflows WHERE project_id = $1 AND app_id = $2;

-- name: next_definitions_version
UPDATE environments SET definitions_version = definitions_version + 1 WHERE id = $1
RETURNING definitions_version;

-- name: list_workflows
SELECT w.*, a.slug AS app_slug FROM workflows w JOIN apps a ON a.id = w.app_id
WHERE w.project_id = $1 AND ($2::text IS NULL OR w.name > $2)
ORDER BY w.name
LIMIT $3;

-- name: get_workflow
SELECT w.*, a.url AS app_url, a.slug AS app_slug FROM workflows w JOIN apps a ON a.id = w.app_id
WHERE w.project_id = $1 AND w.name = $2;

-- name: insert_run
-- Creates a run of workflow $3 (its app and options as last synced) due now, with its
-- run.started event (data $11), and wakes every orchestrator's dispatcher when $12; no row when
-- the workflow is not registered or the id, the run key or an active run of its singleton key
-- exists ($15: the event that started it; $16: its priority; the input's concurrency, singleton
-- and rate limit key fields are read as the workflow's options name them). When $13 (an
-- orchestrator) is given and the workflow has neither a concurrency cap nor a rate limit, the
-- run is created leased to it for $14
-- seconds with its first invocation begun (as claim_due and begin_invocations would leave it,
-- its history snapshot too), and the row carries what the invocation needs. A run of a pull app is never created leased,
-- and always wakes every orchestrator (their workers' polls claim it).
WITH w AS (
    SELECT w.app_id, w.options, w.version, a.slug, a.url, a.signing_secrets,
           a.kind = 'pull' AS pull, gen_random_uuid() AS invocation_id,
           $13::text IS NOT NULL AND w.options ->> 'concurrency' IS NULL
               AND w.options -> 'rateLimit' IS NULL AND a.kind = 'push' AS leased
    FROM workflows w JOIN apps a ON a.id = w.app_id
    WHERE w.project_id = $2 AND w.name = $3
),
r AS (
    INSERT INTO runs (id, project_id, app_id, workflow, input, run_key, parent_run_id,
                      parent_step, schedule_id, scheduled_at, trigger, options, deadline_at,
                      ready_at, next_seq, lease_token, lease_owner, invocation_id, started_at,
                      progress_at, event_id, concurrency_key, singleton_key,
                      definition_version, pull, priority, rate_key, history_snapshot,
                      history_invocation)
    SELECT $1, $2, w.app_id, $3, $4::jsonb, $5::text, $6::uuid, $7::text, $8::text,
           $9::timestamptz, $10::text, w.options,
           now() + make_interval(secs => (w.options ->> 'timeoutMs')::double precision / 1000),
           CASE WHEN w.leased
                THEN least(now() + make_interval(secs => $14::double precision),
                           now() + make_interval(
                               secs => (w.options ->> 'timeoutMs')::double precision / 1000))
                ELSE now() END,
           CASE WHEN w.leased THEN 3 ELSE 2 END,
           CASE WHEN w.leased THEN gen_random_uuid()::text END,
           CASE WHEN w.leased THEN $13::text END,
           CASE WHEN w.leased THEN w.invocation_id END,
           CASE WHEN w.leased THEN now() END,
           CASE WHEN w.leased THEN now() END,
           $15::uuid,
           CASE WHEN jsonb_typeof($4::jsonb) = 'object'
                THEN $4::jsonb ->> (w.options ->> 'concurrencyKey') END,
           CASE WHEN jsonb_typeof($4::jsonb) = 'object'
                THEN $4::jsonb ->> (w.options ->> 'singletonKey') END,
           w.version, w.pull, $16::smallint,
           CASE WHEN jsonb_typeof($4::jsonb) = 'object'
                THEN $4::jsonb ->> (w.options -> 'rateLimit' ->> 'key') END,
           -- Begun with no steps: every step the next invocation gets is one written since.
           CASE WHEN w.leased THEN pg_current_snapshot() END,
           CASE WHEN w.leased THEN w.invocation_id END
    FROM w
    ON CONFLICT DO NOTHING
    RETURNING *
),
e AS (
    INSERT INTO run_events (run_id, seq, project_id, type, invocation_id, data)
    SELECT id, 1, project_id, 'run.started', NULL, $11::jsonb FROM r
    UNION ALL
    SELECT id, 2, project_id, 'invocation.started', invocation_id, '{"attempt": 1}'::jsonb
    FROM r WHERE lease_token IS NOT NULL
)
SELECT r.*, w.slug AS app_slug, w.url AS app_url, w.signing_secrets AS app_secrets,
       coalesce(r.deadline_at <= now(), false) AS past_deadline,
       CASE WHEN $12::boolean OR w.pull THEN pg_notify('stepline_wake', '') END
FROM r, w;

-- name: get_run_by_key
SELECT r.*, a.slug AS app_slug FROM runs r JOIN apps a ON a.id = r.app_id
WHERE r.project_id = $1 AND r.run_key = $2;

-- name: get_run
-- The run, its app's slug, the deployment of its last invocation that named one and the SLA
-- of its schedule.
SELECT r.*, a.slug AS app_slug,
       (SELECT e.deployment_id FROM run_events e
        WHERE e.run_id = r.id AND e.deployment_id IS NOT NULL
        ORDER BY e.seq DESC LIMIT 1) AS deployment_id,
       (SELECT s.sla_ms FROM schedules s WHERE s.id = r.schedule_id) AS schedule_sla_ms
FROM runs r JOIN apps a ON a.id = r.app_id
WHERE r.project_id = $1 AND r.id = $2;

-- name: run_steps
-- (The callback's status is looked up per step, so the plan reads callbacks by key whatever the
-- statistics said when it was made.)
SELECT s.*, (SELECT c.status FROM callbacks c WHERE c.id = s.callback_id) AS callback_status
FROM steps s
WHERE s.run_id = $1 ORDER BY s.position;

-- name: search_runs
SELECT r.*, a.slug AS app_slug,
       (SELECT s.sla_ms FROM schedules s WHERE s.id = r.schedule_id) AS schedule_sla_ms
FROM runs r JOIN apps a ON a.id = r.app_id
WHERE r.project_id = $1
  AND ($2::text IS NULL OR r.workflow = $2)
  AND ($3::run_status IS NULL OR r.status = $3)
  AND ($4::text IS NULL OR r.run_key = $4)
  AND ($5::timestamptz IS NULL OR r.created_at >= $5)
  AND ($6::timestamptz IS NULL OR r.created_at < $6)
  AND ($7::timestamptz IS NULL OR (r.created_at, r.id) < ($7, $8::uuid))
ORDER BY r.created_at DESC, r.id DESC
LIMIT $9;

-- name: list_logs
-- The log lines of run $1 (project $2) after seq $3, in order, at most $4.
SELECT l.* FROM run_logs l
WHERE l.run_id = $1 AND l.project_id = $2 AND l.seq > $3
ORDER BY l.seq
LIMIT $4;

-- name: list_events
SELECT e.* FROM run_events e
WHERE e.run_id = $1 AND e.project_id = $2 AND e.seq > $3
ORDER BY e.seq
LIMIT $4;

-- name: append_events
-- $1 run id, $2 jsonb array of {type, step_name, invocation_id, deployment_id, http_status,
-- duration_ms, data}; numbers them after the run's last event.
WITH r AS (
    UPDATE runs SET next_seq = next_seq + jsonb_array_length($2::jsonb)
    WHERE id = $1
    RETURNING project_id, next_seq - jsonb_array_length($2::jsonb) AS base
)
INSERT INTO run_events (run_id, seq, project_id, type, step_name, invocation_id, deployment_id,
                        http_status, duration_ms, data)
SELECT $1, r.base + x.ord - 1, r.project_id, x.type, x.step_name, x.invocation_id,
       x.deployment_id, x.http_status, x.duration_ms, x.data
FROM r, ROWS FROM (jsonb_to_recordset($2::jsonb) AS (
    type text, step_name text, invocation_id uuid, deployment_id text, http_status integer,
    duration_ms integer, data jsonb)) WITH ORDINALITY AS x(type, step_name, invocation_id,
    deployment_id, http_status, duration_ms, data, ord);

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
claimed AS (
    UPDATE runs r
    SET lease_token = gen_random_uuid()::text,
        invocation_id = gen_random_uuid(),
        lease_owner = $2,
        ready_at = least(now() + make_interval(secs => $3::double precision), r.deadline_at),
        claimed_wake_seq = r.wake_seq,
        progress_at = now(),
        progress_seq = 0,
        progress_digest = NULL,
        held = false,
        started_at = coalesce(r.started_at, now())
    WHERE r.id = ANY (ARRAY(SELECT id FROM due))
    RETURNING r.id, r.project_id, r.app_id, r.workflow, r.status, r.input, r.options,
              r.cancel_requested, coalesce(r.deadline_at <= now(), false) AS past_deadline,
              r.lease_token, r.invocation_id, r.invoke_attempts, r.undelivered_since,
              r.wake_seq, r.concurrency_key, r.generation, r.created_at,
              (SELECT a.url FROM apps a WHERE a.id = r.app_id) AS app_url,
              (SELECT a.signing_secrets FROM apps a WHERE a.id = r.app_id) AS app_secrets
)
SELECT claimed.*,
       greatest(extract(epoch FROM due.ready_at - now()), 0)::double precision AS due_in,
       due.old_token IS NOT NULL AS taken_over
FROM claimed JOIN due ON due.id = claimed.id
ORDER BY due.priority DESC, due.ready_at;

-- name: due_gated_groups
-- The runs of push apps due now (not past their deadline) that claim_due leaves to a gate, by
-- group: of a workflow with a concurrency cap, not held, by concurrency key value, with the
-- cap their runs were started under (kind capped: claim_capped); of a workflow with a rate
-- limit, not yet started nor cancelled, by rate key value, with the tightest limit and the
-- longest period their runs were started under (kind rate: claim_rate_limited).
SELECT 'capped' AS kind, project_id, workflow, concurrency_key AS key,
       min((options ->> 'concurrency')::integer) AS cap, NULL::bigint AS period_ms
FROM runs
WHERE ready_at <= now() AND NOT held AND options ->> 'concurrency' IS NOT NULL AND NOT pull
  AND (deadline_at IS NULL OR deadline_at > now())
GROUP BY project_id, workflow, concurrency_key
UNION ALL
SELECT 'rate', project_id, workflow, rate_key,
       min((options -> 'rateLimit' ->> 'limit')::integer),
       max((options -> 'rateLimit' ->> 'periodMs')::bigint)
FROM runs
WHERE ready_at <= now() AND started_at IS NULL AND NOT cancel_requested AND NOT pull
  AND options -> 'rateLimit' IS NOT NULL
  AND (deadline_at IS NULL OR deadline_at > now())
GROUP BY project_id, workflow, rate_key;

-- name: due_gated_pull_groups
-- As due_gated_groups, for the runs of pull app $1.
SELECT 'capped' AS kind, project_id, workflow, concurrency_key AS key,
       min((options ->> 'concurrency')::integer) AS cap, NULL::bigint AS period_ms
FROM runs
WHERE pull AND app_id = $1 AND ready_at <= now() AND NOT held
  AND options ->> 'concurrency' IS NOT NULL
  AND (deadline_at IS NULL OR deadline_at > now())
GROUP BY project_id, workflow, concurrency_key
UNION ALL
SELECT 'rate', project_id, workflow, rate_key,
       min((options -> 'rateLimit' ->> 'limit')::integer),
       max((options -> 'rateLimit' ->> 'periodMs')::bigint)
FROM runs
WHERE pull AND app_id = $1 AND ready_at <= now() AND started_at IS NULL
  AND NOT cancel_requested AND options -> 'rateLimit' IS NOT NULL
  AND (deadline_at IS NULL OR deadline_at > now())
GROUP BY project_id, workflow, rate_key;

-- name: held_workflows
-- The workflows with held runs, by concurrency key value, with the cap of their runs.
SELECT project_id, workflow, concurrency_key, min((options ->> 'concurrency')::integer) AS cap
FROM runs WHERE held
GROUP BY project_id, workflow, concurrency_key;

-- name: lock_workflow
-- Serialises claiming and releasing the runs of workflow $2 of project $1 with concurrency key
-- value $3 until the transaction ends, so two orchestrators never both see room under its
-- cap. Namespace 2 of the advisory locks.
SELECT pg_advisory_xact_lock(
    2, hashtext($1::uuid::text || ':' || $2::text || ':' || coalesce($3::text, '')));

-- name: claim_capped
-- With lock_workflow held: leases up to $6 of the due or held runs of workflow $2 (project
-- $1) with concurrency key value $7, higher priority first, then oldest, as far as its cap $3 has room beside its
-- invocations in flight, to $4 for $5 seconds (as claim_due leases). When that fills the cap,
-- its other due runs are held (ready_at at their deadline, no lease) until release_held lets
-- them go. Without takeovers ($8 false), runs whose lease expired are left to their holders.
WITH busy AS (
    SELECT greatest(0, $3::integer - count(*)) AS room FROM runs
    WHERE project_id = $1 AND workflow = $2 AND concurrency_key IS NOT DISTINCT FROM $7::text
      AND lease_token IS NOT NULL AND ready_at > now()
),
cand AS (
    (SELECT id, priority, created_at FROM runs
     WHERE project_id = $1 AND workflow = $2 AND concurrency_key IS NOT DISTINCT FROM $7::text
       AND held
     ORDER BY priority DESC, created_at, id LIMIT $6)
    UNION ALL
    (SELECT id, priority, created_at FROM runs
     WHERE ready_at <= now() AND NOT held AND project_id = $1 AND workflow = $2
       AND concurrency_key IS NOT DISTINCT FROM $7::text
       AND ($8::boolean OR lease_token IS NULL)
     ORDER BY priority DESC, created_at, id LIMIT $6)
),
go AS (
    SELECT r.id, r.lease_token AS old_token FROM runs r
    WHERE r.id IN (SELECT id FROM cand ORDER BY priority DESC, created_at, id
                   LIMIT least($6::integer, (SELECT room FROM busy)))
    FOR UPDATE SKIP LOCKED
),
held_now AS (
    UPDATE runs h SET held = true, ready_at = h.deadline_at, lease_token = NULL,
                      lease_owner = NULL
    WHERE h.project_id = $1 AND h.workflow = $2
      AND h.concurrency_key IS NOT DISTINCT FROM $7::text
      AND h.ready_at <= now() AND NOT h.held
      AND ($8::boolean OR h.lease_token IS NULL)
      AND h.id NOT IN (SELECT id FROM go)
      AND (SELECT room FROM busy) <= (SELECT count(*) FROM go)
)
UPDATE runs r
SET lease_token = gen_random_uuid()::text,
    invocation_id = gen_random_uuid(),
    lease_owner = $4,
    ready_at = least(now() + make_interval(secs => $5::double precision), r.deadline_at),
    claimed_wake_seq = r.wake_seq,
    progress_at = now(),
    progress_seq = 0,
    progress_digest = NULL,
    held = false,
    started_at = coalesce(r.started_at, now())
FROM go
WHERE r.id = go.id
RETURNING r.id, r.project_id, r.app_id, r.workflow, r.status, r.input, r.options,
          r.cancel_requested, coalesce(r.deadline_at <= now(), false) AS past_deadline,
          r.lease_token, r.invocation_id, r.invoke_attempts, r.undelivered_since, r.wake_seq,
          r.concurrency_key, r.generation, 0::double precision AS due_in,
          go.old_token IS NOT NULL AS taken_over, r.created_at,
          (SELECT a.url FROM apps a WHERE a.id = r.app_id) AS app_url,
          (SELECT a.signing_secrets FROM apps a WHERE a.id = r.app_id) AS app_secrets;

-- name: claim_pull
-- A worker's poll: leases up to $1 due runs of pull app $2 to $3 for $4 seconds, as claim_due
-- leases (a run whose lease ran out is taken over: its worker died or stalled). Runs of a
-- workflow with a concurrency cap are left to claim_capped, runs of a workflow with a rate
-- limit not yet started to claim_rate_limited, runs past their deadline to the dispatcher
-- (which ends them). Higher priority first, then the longest due.
WITH due AS (
    SELECT id, ready_at, lease_token AS old_token
    FROM runs
    WHERE pull AND app_id = $2 AND ready_at <= now()
      AND options ->> 'concurrency' IS NULL
      AND (options -> 'rateLimit' IS NULL OR started_at IS NOT NULL OR cancel_requested)
      AND (deadline_at IS NULL OR deadline_at > now())
    ORDER BY priority DESC, ready_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE runs r
SET lease_token = gen_random_uuid()::text,
    invocation_id = gen_random_uuid(),
    lease_owner = $3,
    ready_at = least(now() + make_interval(secs => $4::double precision), r.deadline_at),
    claimed_wake_seq = r.wake_seq,
    progress_at = now(),
    progress_seq = 0,
    progress_digest = NULL,
    held = false,
    started_at = coalesce(r.started_at, now())
FROM due
WHERE r.id = due.id
RETURNING r.id, r.project_id, r.app_id, r.workflow, r.status, r.input, r.options,
          r.cancel_requested, false AS past_deadline,
          r.lease_token, r.invocation_id, r.invoke_attempts, r.undelivered_since, r.wake_seq,
          r.concurrency_key, r.generation, 0::double precision AS due_in,
          due.old_token IS NOT NULL AS taken_over, r.created_at,
          NULL::text AS app_url, NULL::text[] AS app_secrets;

-- name: pull_lease
-- The run $1 of a pull app while lease $2 holds it: what recording its invocation's answer
-- needs (as a claim row has it).
SELECT id, project_id, app_id, workflow, status, input, options, cancel_requested,
       false AS past_deadline, lease_token, invocation_id, invoke_attempts, undelivered_since,
       wake_seq, concurrency_key, created_at, generation
FROM runs WHERE id = $1 AND lease_token = $2 AND pull;

-- name: app_polled
-- A worker of app $1 polls now; written at most once a second (workers of a busy app poll
-- back to back, and the app's row would be a hot spot).
UPDATE apps SET polled_at = now()
WHERE id = $1 AND (polled_at IS NULL OR polled_at < now() - interval '1 second');

-- name: release_held
-- With lock_workflow held: the held runs of workflow $2 (project $1) with concurrency key
-- value $4, higher priority first, then oldest, become due again, as far as its cap $3 has
-- room beside its invocations in flight.
UPDATE runs r SET ready_at = now(), held = false
WHERE r.id IN (
    SELECT id FROM runs
    WHERE project_id = $1 AND workflow = $2 AND concurrency_key IS NOT DISTINCT FROM $4::text
      AND held
    ORDER BY priority DESC, created_at, id
    LIMIT (SELECT greatest(0, $3::integer - count(*)) FROM runs
           WHERE project_id = $1 AND workflow = $2
             AND concurrency_key IS NOT DISTINCT FROM $4::text
             AND lease_token IS NOT NULL AND ready_at > now())
)
RETURNING r.id;

-- name: lock_rate
-- Serialises claiming the runs of workflow $2 of project $1 with rate key value $3 until the
-- transaction ends, so two orchestrators never both see room in its window. Namespace 3 of the
-- advisory locks.
SELECT pg_advisory_xact_lock(
    3, hashtext($1::uuid::text || ':' || $2::text || ':' || coalesce($3::text, '')));

-- name: rate_window
-- With lock_rate held: the transaction's time, when the runs of workflow $2 (project $1) with
-- rate key value $3 that started within the last $4 milliseconds started (oldest first), and
-- how many of its runs are due and not yet started.
SELECT now() AS now,
       array(SELECT started_at FROM runs
             WHERE project_id = $1 AND workflow = $2 AND options ? 'rateLimit'
               AND rate_key IS NOT DISTINCT FROM $3::text
               AND started_at > now() - make_interval(secs => $4::double precision / 1000)
             ORDER BY started_at) AS starts,
       (SELECT count(*) FROM runs
        WHERE ready_at <= now() AND started_at IS NULL AND NOT cancel_requested
          AND project_id = $1 AND workflow = $2 AND options -> 'rateLimit' IS NOT NULL
          AND rate_key IS NOT DISTINCT FROM $3::text) AS waiting;

-- name: claim_rate_limited
-- With lock_rate held: leases up to $4 of the due runs not yet started of workflow $2 (project
-- $1) with rate key value $3, higher priority first, then oldest, to $5 for $6 seconds (as
-- claim_due leases; their started_at, now, counts in the window from then on).
WITH go AS (
    SELECT id FROM runs
    WHERE ready_at <= now() AND started_at IS NULL AND NOT cancel_requested
      AND project_id = $1 AND workflow = $2 AND options -> 'rateLimit' IS NOT NULL
      AND rate_key IS NOT DISTINCT FROM $3::text
    ORDER BY priority DESC, created_at, id
    LIMIT $4
    FOR UPDATE SKIP LOCKED
)
UPDATE runs r
SET lease_token = gen_random_uuid()::text,
    invocation_id = gen_random_uuid(),
    lease_owner = $5,
    ready_at = least(now() + make_interval(secs => $6::double precision), r.deadline_at),
    claimed_wake_seq = r.wake_seq,
    progress_at = now(),
    progress_seq = 0,
    progress_digest = NULL,
    held = false,
    started_at = now()
FROM go
WHERE r.id = go.id
RETURNING r.id, r.project_id, r.app_id, r.workflow, r.status, r.input, r.options,
          r.cancel_requested, coalesce(r.deadline_at <= now(), false) AS past_deadline,
          r.lease_token, r.invocation_id, r.invoke_attempts, r.undelivered_since, r.wake_seq,
          r.concurrency_key, r.generation, 0::double precision AS due_in, false AS taken_over,
          r.created_at,
          (SELECT a.url FROM apps a WHERE a.id = r.app_id) AS app_url,
          (SELECT a.signing_secrets FROM apps a WHERE a.id = r.app_id) AS app_secrets;

-- name: defer_rate_limited
-- With lock_rate held: the due runs not yet started of workflow $2 (project $1) with rate key
-- value $3, in the order they go (higher priority first, then oldest), come due at the times
-- $4 gives them in that order, never past their deadline; a time not after now leaves its run
-- due.
WITH ranked AS (
    SELECT id, row_number() OVER (ORDER BY priority DESC, created_at, id) AS n FROM runs
    WHERE ready_at <= now() AND started_at IS NULL AND NOT cancel_requested
      AND project_id = $1 AND workflow = $2 AND options -> 'rateLimit' IS NOT NULL
      AND rate_key IS NOT DISTINCT FROM $3::text
)
UPDATE runs r SET ready_at = least(t.at, r.deadline_at)
FROM ranked JOIN unnest($4::timestamptz[]) WITH ORDINALITY AS t(at, n) ON t.n = ranked.n
WHERE r.id = ranked.id AND t.at > now();

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

-- name: next_pull_due_in
-- Seconds until the next run of pull app $1 comes due (negative when overdue), NULL when none
-- will.
SELECT extract(epoch FROM min(ready_at) - now())::double precision FROM runs
WHERE ready_at IS NOT NULL AND pull AND app_id = $1;

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
-- For each claimed run ($1: [{run_id, token, invocation_id, attempt}]) whose lease the token
-- still holds (a claim that went stale begins nothing: another orchestrator may hold the run
-- now): settles what came due (sleeps complete, those ending within $2 seconds too, as of their
-- end; event waits past their timeout complete with null; callbacks past theirs fail as timed
-- out) and records its invocation starting, with the app's last known deployment. Returns the
-- run's steps in the order they were first recorded, one row each (a run begun with no steps to
-- send: one row whose name is null): every step when the run's last invocation is not known
-- (history_base null), else only those written by transactions the snapshot that invocation's
-- steps were read under did not see, the open ones (their flags depend on the time) and those
-- this statement settled; the app lays them over the history it kept from invocation
-- history_base. The snapshot of this statement is kept for the next invocation. Each row says
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
                                                      invocation_id uuid, attempt integer)
        WHERE jsonb_typeof(item) = 'object'
),
held AS (
    SELECT q.run_id, q.invocation_id, q.attempt,
           (SELECT a.deployment_id FROM apps a WHERE a.id = runs.app_id) AS deployment_id,
           runs.history_snapshot AS since, runs.history_invocation AS base
    FROM q JOIN runs ON runs.id = q.run_id
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
    WHERE steps.run_id = q.run_id
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
    ) x
),
counts AS (
    SELECT run_id, count(*) AS n FROM evs GROUP BY run_id
),
r AS (
    UPDATE runs SET next_seq = runs.next_seq + counts.n,
                    history_snapshot = pg_current_snapshot(), history_invocation = h.invocation_id
    FROM counts JOIN held h ON h.run_id = counts.run_id
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

-- name: insert_child_run
INSERT INTO runs (id, project_id, app_id, workflow, input, parent_run_id, parent_step, trigger,
                  options, deadline_at, ready_at, definition_version, pull, concurrency_key,
                  rate_key, priority)
SELECT $1, w.project_id, w.app_id, w.name, $4, $5, $6, 'parent', w.options,
       now() + make_interval(secs => (w.options ->> 'timeoutMs')::double precision / 1000),
       now(), w.version, (SELECT a.kind = 'pull' FROM apps a WHERE a.id = w.app_id),
       CASE WHEN jsonb_typeof($4::jsonb) = 'object'
            THEN $4::jsonb ->> (w.options ->> 'concurrencyKey') END,
       CASE WHEN jsonb_typeof($4::jsonb) = 'object'
            THEN $4::jsonb ->> (w.options -> 'rateLimit' ->> 'key') END,
       coalesce((SELECT p.priority FROM runs p WHERE p.id = $5), 0)
FROM workflows w WHERE w.project_id = $2 AND w.name = $3
ON CONFLICT (id) DO NOTHING
RETURNING id;

-- name: fail_step
UPDATE steps SET status = 'failed', error = $3, ended_at = now()
WHERE run_id = $1 AND name = $2 AND status = 'waiting';

-- name: suspend_runs
-- Ends invocations ($1: [{id, token}], each a run and its lease token) with the runs still
-- running: each comes due at its earliest timer, or at once when something woke it while the
-- invocation ran. Answers the runs suspended (not those whose lease was lost). The runs are
-- locked in id order.
UPDATE runs SET
    lease_token = NULL, lease_owner = NULL, invoke_attempts = 0, undelivered_since = NULL,
    ready_at = CASE
        WHEN runs.wake_seq <> runs.claimed_wake_seq THEN now()
        ELSE least(runs.deadline_at, (
            SELECT min(coalesce(s.wake_at, s.timeout_at)) FROM steps s
            WHERE s.run_id = runs.id AND s.status IN ('sleeping', 'retrying', 'waiting')))
        END
FROM (
    SELECT r.id FROM runs r
    JOIN (SELECT q.* FROM jsonb_array_elements($1::jsonb) AS item
              CROSS JOIN LATERAL jsonb_to_record(item) AS q(id uuid, token text)
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
)
SELECT r.id, r.project_id, r.parent_run_id, r.parent_step, r.schedule_id, r.status,
       EXISTS (SELECT 1 FROM runs c
               WHERE c.parent_run_id = r.id AND c.status IN ('running', 'cancelling'))
           AS has_children,
       pg_notify('stepline_ended', r.id::text)
FROM r;

-- name: cancel_waits
-- On a cancel request: what waits (sleeps, callbacks, events, children) is cancelled.
UPDATE steps SET status = 'cancelled', ended_at = now()
WHERE run_id = $1 AND status IN ('sleeping', 'waiting')
RETURNING name, kind, child_run_id, callback_id;

-- name: cancel_callbacks
UPDATE callbacks SET status = 'cancelled', completed_at = now()
WHERE id = ANY($1::uuid[]) AND status = 'pending';

-- name: resolve_child_step
UPDATE steps SET status = $3, output = $4, error = $5, ended_at = now()
WHERE run_id = $1 AND name = $2 AND status = 'waiting'
RETURNING name;

-- name: wake
-- Something outside the run moved it: run it now, or right after the active invocation.
UPDATE runs SET
    wake_seq = wake_seq + 1,
    ready_at = CASE WHEN lease_token IS NULL THEN now() ELSE ready_at END
WHERE id = $1 AND status IN ('running', 'cancelling');

-- name: request_cancel
UPDATE runs SET status = 'cancelling', cancel_requested = true, version = version + 1
WHERE id = $1 AND status = 'running'
RETURNING id;

-- name: lock_run
SELECT * FROM runs WHERE project_id = $1 AND id = $2 FOR UPDATE;

-- name: delete_steps_for_retry
-- Steps that run again on retry: from the first failed or unfinished step (or fromStep's
-- position $2, when earlier) every step recorded after it too, so the history replays without
-- a hole (cleanup steps of a cancel, a callback's notification, parallel siblings run again).
DELETE FROM steps
WHERE run_id = $1
  AND position >= least($2::bigint, (
      SELECT min(position) FROM steps
      WHERE run_id = $1 AND status IN ('failed', 'cancelled', 'running', 'retrying')));

-- name: run_trigger
SELECT trigger FROM runs WHERE id = $1;

-- name: step_result
-- The JSON text of the result of run $1's step at position $4, for its invocation $2 holding
-- lease $3 (the SDK fetches a large result by reference): no row when that invocation does not
-- hold the run; found is false when no step is there.
SELECT s.output::text AS output, s.run_id IS NOT NULL AS found
FROM runs r LEFT JOIN steps s ON s.run_id = r.id AND s.position = $4
WHERE r.id = $1 AND r.invocation_id = $2 AND r.lease_token = $3
  AND r.status IN ('running', 'cancelling');

-- name: invocation_steps
-- Every step of run $1 as it stands now, in recorded order, as begin_invocations sends them
-- (results over $4 bytes as null beside their size and digest), for its invocation $2 holding
-- lease $3: the SDK fetches the whole history when it did not keep the one an invocation's
-- changes are laid over. No row when that invocation does not hold the run; one row whose name
-- is null for a run with no steps.
SELECT s.name, s.kind, s.status, s.position, s.attempt,
       CASE WHEN s.output_bytes > $4::integer THEN NULL ELSE s.output END AS output,
       s.output_bytes, s.output_digest, s.error, s.wake_at, s.callback_id, s.child_run_id,
       (SELECT c.status FROM callbacks c WHERE c.id = s.callback_id) AS callback_status,
       coalesce(s.status = 'retrying' AND s.wake_at > now(), false) AS blocked
FROM runs r LEFT JOIN steps s ON s.run_id = r.id
WHERE r.id = $1 AND r.invocation_id = $2 AND r.lease_token = $3
  AND r.status IN ('running', 'cancelling')
ORDER BY s.position;

-- name: continue_run
-- The invocation of run $1 holding lease $2 continued as new with input $3: the run's next
-- generation starts, due now, with no steps (the history keeps what they did; callbacks still
-- pending are cancelled). Answers the new generation; no row when the lease was lost.
WITH r AS (
    UPDATE runs SET
        input = $3::jsonb, generation = generation + 1, lease_token = NULL, lease_owner = NULL,
        invoke_attempts = 0, undelivered_since = NULL, ready_at = now(), version = version + 1,
        history_snapshot = NULL, history_invocation = NULL
    WHERE id = $1 AND lease_token = $2 AND status IN ('running', 'cancelling')
    RETURNING id, generation
),
dropped AS (
    DELETE FROM steps s USING r WHERE s.run_id = r.id RETURNING s.callback_id
),
callbacks_cancelled AS (
    UPDATE callbacks c SET status = 'cancelled', completed_at = now()
    FROM dropped WHERE c.id = dropped.callback_id AND c.status = 'pending'
)
SELECT generation, (SELECT count(*) FROM dropped) AS steps FROM r;

-- name: step_position
SELECT position FROM steps WHERE run_id = $1 AND name = $2;

-- name: restart_run
-- Run $1 goes again; its trigger becomes $2 when given (a retry asked for by a person).
UPDATE runs SET
    trigger = coalesce($2::text, trigger),
    status = 'running', output = NULL, error = NULL, ended_at = NULL, cancel_requested = false,
    invoke_attempts = 0, undelivered_since = NULL, ready_at = now(), lease_token = NULL,
    version = version + 1, history_snapshot = NULL, history_invocation = NULL,
    deadline_at = now() + make_interval(secs => (options ->> 'timeoutMs')::double precision / 1000)
WHERE id = $1
RETURNING *;

-- name: get_callback
SELECT * FROM callbacks WHERE id = $1 AND ($2::uuid IS NULL OR project_id = $2);

-- name: complete_callback
-- Completes pending callback $1 (of project $3 when given) with body $2: its step completes,
-- the history says so, and the run wakes (now, or right after its active invocation), with
-- every orchestrator's dispatcher when $4. When $5 (an orchestrator) is given, a run with no
-- active invocation and no concurrency cap is leased to it for $6 seconds instead (as
-- claim_due would lease it), and the row carries what the invocation needs (run_* columns;
-- run_claimed says whether this statement leased the run).
WITH c AS (
    UPDATE callbacks SET status = 'completed', body = $2, completed_at = now()
    WHERE id = $1 AND status = 'pending' AND ($3::uuid IS NULL OR project_id = $3)
    RETURNING *
),
s AS (
    UPDATE steps SET status = 'completed', output = $2, ended_at = now()
    FROM c
    WHERE steps.run_id = c.run_id AND steps.name = c.step_name AND steps.status = 'waiting'
),
-- The run, locked: whether to lease it is judged on its latest version.
k AS (
    SELECT runs.id, gen_random_uuid()::text AS token, gen_random_uuid() AS invocation_id,
           runs.lease_token IS NULL AND $5::text IS NOT NULL AND NOT runs.pull
           AND runs.options ->> 'concurrency' IS NULL AS take
    FROM runs JOIN c ON runs.id = c.run_id
    WHERE runs.status IN ('running', 'cancelling')
    FOR UPDATE OF runs
),
r AS (
    UPDATE runs SET
        next_seq = next_seq + 2,
        wake_seq = wake_seq + 1,
        ready_at = CASE WHEN k.take
                        THEN least(now() + make_interval(secs => $6::double precision),
                                   deadline_at)
                        WHEN lease_token IS NULL THEN now() ELSE ready_at END,
        lease_token = CASE WHEN k.take THEN k.token ELSE lease_token END,
        lease_owner = CASE WHEN k.take THEN $5::text ELSE lease_owner END,
        invocation_id = CASE WHEN k.take THEN k.invocation_id ELSE runs.invocation_id END,
        claimed_wake_seq = CASE WHEN k.take THEN wake_seq + 1 ELSE claimed_wake_seq END,
        progress_at = CASE WHEN k.take THEN now() ELSE progress_at END,
        progress_seq = CASE WHEN k.take THEN 0 ELSE progress_seq END,
        progress_digest = CASE WHEN k.take THEN NULL ELSE progress_digest END
    FROM k
    WHERE runs.id = k.id
    RETURNING runs.id, runs.project_id, runs.next_seq - 2 AS base, k.take AS claimed,
              runs.workflow, runs.input, runs.options, runs.cancel_requested,
              runs.deadline_at <= now() AS past_deadline, runs.lease_token,
              runs.invocation_id, runs.invoke_attempts, runs.undelivered_since, runs.app_id,
              runs.pull
),
e AS (
    INSERT INTO run_events (run_id, seq, project_id, type, step_name, data)
    SELECT r.id, r.base + x.n, r.project_id, x.type, c.step_name, x.data
    FROM r, c, (VALUES (0, 'callback.completed', jsonb_build_object('callbackId', $1::text)),
                       (1, 'step.completed', '{"kind": "callback"}'::jsonb)) AS x(n, type, data)
)
SELECT c.*, CASE WHEN $4::boolean OR r.pull THEN pg_notify('stepline_wake', '') END,
       coalesce(r.claimed, false) AS run_claimed, r.workflow AS run_workflow,
       r.input AS run_input, r.options AS run_options,
       r.cancel_requested AS run_cancel_requested,
       coalesce(r.past_deadline, false) AS run_past_deadline,
       r.lease_token AS run_lease_token, r.invocation_id AS run_invocation_id,
       r.invoke_attempts AS run_invoke_attempts,
       r.undelivered_since AS run_undelivered_since, a.url AS run_app_url,
       a.signing_secrets AS run_app_secrets
FROM c LEFT JOIN r ON true LEFT JOIN apps a ON a.id = r.app_id;

-- name: progress_at
SELECT project_id, progress_at FROM runs WHERE id = $1;

-- name: lock_event_name
-- Serialises sending event $2 of project $1 with recording a wait for it, until the
-- transaction ends: each then sees what the other committed (an event and a wait committed at
-- once would otherwise each miss the other). Namespace 1 of the advisory locks.
SELECT pg_advisory_xact_lock(1, hashtext($1::uuid::text || ':' || $2::text));

-- name: take_recent_event
-- An event wait just recorded takes the first matching event received since $4 (the wait's
-- invocation last committed): the event may have raced the wait's own commit.
UPDATE steps s SET status = 'completed', output = ev.data, ended_at = now()
FROM (
    SELECT e.data FROM events e
    WHERE e.project_id = $2 AND e.name = $5 AND e.received_at >= $4
      -- Every match field equals the data's (data of any kind matches no match fields).
      AND NOT EXISTS (
          SELECT 1 FROM jsonb_each(CASE WHEN jsonb_typeof($6::jsonb) = 'object'
                                        THEN $6::jsonb ELSE '{}'::jsonb END) f
          WHERE f.value IS DISTINCT FROM
                CASE WHEN jsonb_typeof(e.data) = 'object' THEN e.data -> f.key END)
    ORDER BY e.received_at
    LIMIT 1
) ev
WHERE s.run_id = $1 AND s.name = $3 AND s.status = 'waiting'
RETURNING s.name;

-- name: delete_old_runs
-- Up to $2 runs that ended more than $1 seconds ago, with their steps, callbacks, history and
-- log lines (each cascade goes through an index). Rows another sweeper is deleting are passed over.
DELETE FROM runs WHERE id IN (
    SELECT id FROM runs
    WHERE ended_at < now() - make_interval(secs => $1::double precision)
    ORDER BY ended_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
);

-- name: delete_old_events
-- Up to $2 events received more than $1 seconds ago.
DELETE FROM events WHERE id IN (
    SELECT id FROM events
    WHERE received_at < now() - make_interval(secs => $1::double precision)
    ORDER BY received_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
);

-- name: delete_old_ticks
-- Up to $2 schedule ticks recorded more than $1 seconds ago (a tick before its schedule's
-- cursor is never planned again, so its record is no longer needed to fire it once).
DELETE FROM schedule_ticks t USING (
    SELECT schedule_id, tick_at FROM schedule_ticks
    WHERE created_at < now() - make_interval(secs => $1::double precision)
    ORDER BY created_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
) old
WHERE t.schedule_id = old.schedule_id AND t.tick_at = old.tick_at;

-- name: delete_old_history
-- Up to $2 history events older than $1 seconds of runs still going after that long (long-lived
-- runs): their steps stay, so replay is unchanged; the history starts later.
DELETE FROM run_events e USING (
    SELECT ev.run_id, ev.seq
    FROM runs r JOIN run_events ev ON ev.run_id = r.id
    WHERE r.ended_at IS NULL
      AND r.created_at < now() - make_interval(secs => $1::double precision)
      AND ev.at < now() - make_interval(secs => $1::double precision)
    LIMIT $2
    FOR UPDATE OF ev SKIP LOCKED
) old
WHERE e.run_id = old.run_id AND e.seq = old.seq;

-- name: insert_event
-- Records event $1 (project $2, name $3, data $4, the sender's id $5 or NULL); no row when an
-- event of that id exists (sent before, within the day events are kept).
INSERT INTO events (id, project_id, name, data, key, received_at)
VALUES ($1, $2, $3, $4, $5, clock_timestamp())
ON CONFLICT (id) DO NOTHING
RETURNING id;

-- name: event_answer
SELECT answer FROM events WHERE id = $1;

-- name: set_event_answer
UPDATE events SET answer = $2 WHERE id = $1;

-- name: match_event
-- Completes every step of project $2 waiting for event $3 whose match fields all equal the
-- data's ($4; $1 the event): each such run's history gets event.received and step.completed,
-- and the run wakes (now, or right after its active invocation). Answers the runs it woke.
WITH m AS (
    UPDATE steps SET status = 'completed', output = $4, ended_at = now()
    WHERE project_id = $2 AND kind = 'event' AND status = 'waiting' AND event_name = $3
      -- Every match field equals the data's (data of any kind matches no match fields).
      AND NOT EXISTS (
          SELECT 1 FROM jsonb_each(CASE WHEN jsonb_typeof(match) = 'object'
                                        THEN match ELSE '{}'::jsonb END) f
          WHERE f.value IS DISTINCT FROM
                CASE WHEN jsonb_typeof($4::jsonb) = 'object' THEN $4::jsonb -> f.key END)
    RETURNING run_id, name
),
numbered AS (
    SELECT run_id, name, row_number() OVER (PARTITION BY run_id ORDER BY name) AS k,
           count(*) OVER (PARTITION BY run_id) AS n
    FROM m
),
r AS (
    UPDATE runs SET
        next_seq = next_seq + 2 * w.n,
        wake_seq = wake_seq + 1,
        ready_at = CASE WHEN lease_token IS NULL AND status IN ('running', 'cancelling')
                        THEN now() ELSE ready_at END
    FROM (SELECT run_id, n FROM numbered WHERE k = 1) w
    WHERE runs.id = w.run_id
    RETURNING runs.id, runs.project_id, runs.next_seq - 2 * w.n AS base, runs.pull
),
history AS (
    INSERT INTO run_events (run_id, seq, project_id, type, step_name, data)
    SELECT r.id, r.base + 2 * (numbered.k - 1) + x.i, r.project_id, x.type, numbered.name,
           x.data
    FROM r JOIN numbered ON numbered.run_id = r.id,
         (VALUES (0, 'event.received', jsonb_build_object('event', $3::text, 'eventId', $1::uuid::text)),
                 (1, 'step.completed', '{"kind": "event"}'::jsonb)) AS x(i, type, data)
)
-- A pull app's run wakes every orchestrator: their workers' polls claim it.
SELECT id, CASE WHEN pull THEN pg_notify('stepline_wake', '') END FROM r;

-- name: event_workflows
-- The workflows of project $1 that every event named $2 starts a run of.
SELECT name FROM workflows WHERE project_id = $1 AND options ->> 'onEvent' = $2 ORDER BY name;

-- name: active_singleton
-- The run of workflow $2 (project $1) not ended whose singleton key is input $3's field $4.
SELECT r.*, a.slug AS app_slug FROM runs r JOIN apps a ON a.id = r.app_id
WHERE r.project_id = $1 AND r.workflow = $2 AND r.ended_at IS NULL
  AND r.singleton_key = (CASE WHEN jsonb_typeof($3::jsonb) = 'object'
                              THEN $3::jsonb ->> $4::text END);

-- name: children_of
SELECT id FROM runs WHERE parent_run_id = $1 AND status IN ('running', 'cancelling');

-- name: notify_wake
SELECT pg_notify('stepline_wake', '');

-- name: ping
SELECT 1;

-- name: run_invocations
-- The invocations of run $1 (project $2) begun after history seq $3, in order, each with how
-- it ended (from its invocation.ended event; none yet while it runs), at most $4.
SELECT s.seq, s.invocation_id AS id, coalesce((s.data ->> 'attempt')::integer, 1) AS attempt,
       s.at AS started_at, e.at AS ended_at, e.duration_ms, e.data ->> 'outcome' AS outcome,
       e.http_status, coalesce(e.deployment_id, s.deployment_id) AS deployment_id,
       e.data ->> 'error' AS error
FROM run_events s
LEFT JOIN LATERAL (
    SELECT x.* FROM run_events x
    WHERE x.run_id = s.run_id AND x.seq > s.seq AND x.type = 'invocation.ended'
      AND x.invocation_id = s.invocation_id
    ORDER BY x.seq LIMIT 1
) e ON true
WHERE s.run_id = $1 AND s.project_id = $2 AND s.type = 'invocation.started' AND s.seq > $3
ORDER BY s.seq
LIMIT $4;

-- name: run_counters
-- How often run $1 was invoked, how many of those could not be delivered, and its steps
-- completed.
SELECT count(*) FILTER (WHERE type = 'invocation.started') AS invocations,
       count(*) FILTER (WHERE type = 'invocation.ended'
                          AND data ->> 'outcome' = 'delivery_failed') AS delivery_failures,
       (SELECT count(*) FROM steps WHERE run_id = $1 AND status = 'completed') AS steps_completed
FROM run_events WHERE run_id = $1;
