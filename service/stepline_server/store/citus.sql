-- Laying the schema out on a Citus cluster (citus.py): what the layout step reads and calls.
-- Only citus_present and citus_sequential_writes run on plain PostgreSQL; the others name
-- Citus's catalogs and functions.

-- name: citus_present
-- Whether the citus extension is installed in this database.
SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus');

-- name: citus_session
-- A pooled session on a Citus coordinator plans each statement for its values (the store's
-- sessions force generic plans elsewhere: db.SESSION_SETTINGS), and runs a statement over many
-- shards one shard after another over one connection per worker: a transaction may then write
-- a reference table after it (settling a run's schedule after an end's check of its children
-- across shards), which Citus refuses after a parallel one. The run loop's statements each
-- touch one shard, so this costs only the rarer statements that span shards. It also shows
-- the shards' own tables in pg_class (the coordinator holds the reference tables' shards):
-- hiding them filters every pg_class row through a function, which made asyncpg's lookup of
-- a type it does not know (uuid[], once per session) take half a second there, against 10 ms.
SET plan_cache_mode = force_custom_plan;
SET citus.multi_shard_modify_mode = 'sequential';
SET citus.override_table_visibility = off;

-- name: citus_sequential_writes
-- This transaction's statements that write many shards do it one shard after another, over
-- one connection per worker: Citus then lets the transaction write a reference table after
-- them (deleting an app, after its children's parents' steps were failed), which it refuses
-- after a parallel write. On plain PostgreSQL it sets a placeholder setting nothing reads.
SELECT set_config('citus.multi_shard_modify_mode', 'sequential', true);

-- name: citus_tables_laid_out
-- The tables Citus already knows (distributed, reference or coordinator-local), by name.
SELECT logicalrelid::regclass::text AS name FROM pg_dist_partition;

-- name: citus_table_exists
SELECT to_regclass($1::text) IS NOT NULL;

-- name: citus_unique_without
-- The primary key and unique indexes of table $1 that leave out column $2 (Citus refuses
-- them on a table distributed by $2): each index's name, the constraint it backs (NULL: a
-- bare unique index), its definition, whether it is the primary key, and its columns.
SELECT i.indexrelid::regclass::text AS index, con.conname AS constraint_name,
       pg_get_indexdef(i.indexrelid) AS definition, i.indisprimary AS primary_key,
       array(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, n)
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
             ORDER BY k.n) AS columns
FROM pg_index i
LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid AND con.contype IN ('p', 'u')
WHERE i.indrelid = $1::regclass AND i.indisunique
  AND NOT (SELECT a.attnum FROM pg_attribute a
           WHERE a.attrelid = $1::regclass AND a.attname = $2::text) = ANY (i.indkey::int2[]);

-- name: citus_foreign_keys_among
-- The foreign keys between tables of $1 (both ends in it): table, referenced table, name,
-- definition, and
-- whether both ends are their tables' distribution columns $2 (a name per table of $1; NULL:
-- not distributed), which Citus needs to keep the key once the tables are distributed.
WITH t AS (
    SELECT t.name, t.col FROM unnest($1::text[], $2::text[]) AS t(name, col)
)
SELECT con.conrelid::regclass::text AS tbl, con.confrelid::regclass::text AS ref,
       con.conname AS name,
       pg_get_constraintdef(con.oid) AS definition,
       coalesce(array_length(con.conkey, 1) = 1
                AND (SELECT a.attname FROM pg_attribute a
                     WHERE a.attrelid = con.conrelid AND a.attnum = con.conkey[1]) = src.col
                AND (SELECT a.attname FROM pg_attribute a
                     WHERE a.attrelid = con.confrelid AND a.attnum = con.confkey[1]) = dst.col
                AND con.conrelid <> con.confrelid, false) AS colocated
FROM pg_constraint con
JOIN t src ON src.name = con.conrelid::regclass::text
JOIN t dst ON dst.name = con.confrelid::regclass::text
WHERE con.contype = 'f'
ORDER BY 1, 2;

-- name: citus_create_reference_table
SELECT create_reference_table($1::regclass);

-- name: citus_allow_triggers
-- Lets this session distribute a table with a trigger (steps_version): Citus runs it on the
-- shard's node, in the transaction writing the row there.
SET citus.enable_unsafe_triggers = on;

-- name: citus_reset_triggers
RESET citus.enable_unsafe_triggers;

-- name: citus_create_distributed_table
-- Table $1 hashed by column $2, colocated with $3 ('none': a colocation group of its own).
SELECT create_distributed_table($1::regclass, $2::text, colocate_with => $3::text);

-- name: citus_functions_to_delegate
-- The functions named in $1 not yet delegated (or delegated only outside transactions, as
-- an earlier layout did): their signatures (the run id is the first argument of each).
SELECT p.oid::regprocedure::text AS signature
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public' AND p.proname = ANY ($1::text[])
  AND NOT EXISTS (SELECT 1 FROM pg_dist_object o
                  WHERE o.classid = 'pg_proc'::regclass AND o.objid = p.oid
                    AND o.distribution_argument_index IS NOT NULL AND o.force_delegation)
ORDER BY 1;

-- name: citus_delegate_function
-- Function $1 runs on the worker holding the shard of its first argument's run, also when
-- called inside a transaction (force_delegation: the run loop's transitions are; without it
-- Citus runs a call in a transaction on the coordinator). Every statement inside must then
-- stay on that run's shard.
SELECT create_distributed_function($1::regprocedure, '$1', colocate_with := 'runs',
                                   force_delegation := true);

-- name: citus_functions_to_propagate
-- The functions of the schema Citus has not made on every node, other than those of $1
-- (delegated instead): those of a table's row type (lease_claim_of, pull_lease_lapse), which
-- it does not propagate while the table is not distributed.
SELECT p.oid::regprocedure::text AS signature
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public' AND NOT p.proname = ANY ($1::text[])
  AND NOT EXISTS (SELECT 1 FROM pg_dist_object o
                  WHERE o.classid = 'pg_proc'::regclass AND o.objid = p.oid)
ORDER BY 1;

-- name: citus_propagate_function
-- Function $1 made on every node (called where its caller runs, not delegated).
SELECT create_distributed_function($1::regprocedure);

-- ---------------------------------------------------------------------------------------
-- The run loop on Citus (claims.py, progress.py, outcomes.py, leases.py choose these when
-- db.on_citus says the database is a coordinator; plain PostgreSQL never runs them).

-- name: citus_make_claim_on_shard
-- The per-shard claim, made on Citus only (by lay_out) and delegated by its first argument:
-- called with one run id of a shard (a due run citus_due_candidates found), it runs on the
-- worker holding that shard and claims on the shard's own table, named: Citus refuses FOR
-- UPDATE across shards, and a statement naming runs inside a delegated function is still
-- planned by Citus as one across shards (and refused). What it claims is claim_due's, on the
-- shard: the due runs, higher priority first then the longest due, locked SKIP LOCKED (due
-- runs are in order within the shard, not across shards). Each is leased as lease_runs leases
-- (the Citus form of its rule, kept beside it: a lapsed lease is taken over only when
-- p_takeovers and, for a pull app's run, when pull_lease_lapse says ours; a paused run not
-- past its deadline is set aside) and answered as lease_claim_of answers it. (The reference
-- tables, workflows, apps, deployments and orchestrators, are read by statements of their own:
-- Citus refuses a statement joining them with a shard named.)
CREATE OR REPLACE FUNCTION citus_claim_on_shard(
    p_shard_run uuid, p_limit integer, p_owner text, p_seconds double precision,
    p_lead double precision, p_takeovers boolean, p_holding uuid[]
) RETURNS SETOF lease_claim LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    runs_shard text := shard_name('runs', get_shard_id_for_distribution_column(
        'runs', p_shard_run::text));
    steps_shard text := shard_name('steps', get_shard_id_for_distribution_column(
        'steps', p_shard_run::text));
    due uuid;
BEGIN
    FOR due IN EXECUTE format($q$
    WITH RECURSIVE levels AS (
        (SELECT priority FROM %1$s WHERE ready_at IS NOT NULL AND NOT pull
         ORDER BY priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT r.priority FROM %1$s r
                WHERE r.ready_at IS NOT NULL AND NOT r.pull AND r.priority < l.priority
                ORDER BY r.priority DESC LIMIT 1)
        FROM levels l WHERE l.priority IS NOT NULL
    ),
    push_due AS (
        SELECT c.* FROM levels l CROSS JOIN LATERAL (
            SELECT id, priority, ready_at FROM %1$s runs
            WHERE priority = l.priority AND NOT pull
              AND ready_at <= now() + make_interval(secs => $1)
              AND NOT (id = ANY ($2))
              AND (NOT options ? 'concurrency' OR deadline_at <= now())
              AND (NOT options ? 'rateLimit' OR started_at IS NOT NULL OR cancel_requested
                   OR deadline_at <= now())
              AND ($3 OR lease_token IS NULL)
              AND (ready_at <= now()
                   OR (SELECT min(s.wake_at) FROM %2$s s
                       WHERE s.run_id = runs.id AND s.status = 'sleeping')
                      <= now() + make_interval(secs => $1))
            ORDER BY ready_at
            LIMIT $4
            FOR UPDATE SKIP LOCKED
        ) c
        WHERE l.priority IS NOT NULL
        ORDER BY c.priority DESC, c.ready_at
        LIMIT $4
    ),
    pull_overdue AS (
        SELECT id, priority, ready_at FROM %1$s
        WHERE pull AND ready_at IS NOT NULL AND deadline_at <= now() AND ready_at <= now()
          AND ($3 OR lease_token IS NULL)
        ORDER BY deadline_at
        LIMIT $4
        FOR UPDATE SKIP LOCKED
    )
    SELECT id FROM (SELECT * FROM push_due UNION ALL SELECT * FROM pull_overdue) d
    ORDER BY priority DESC, ready_at
    LIMIT $4
    $q$, runs_shard, steps_shard) USING p_lead, coalesce(p_holding, '{}'), p_takeovers, p_limit
    LOOP
        RETURN QUERY SELECT * FROM citus_lease_run(due, p_owner, p_seconds, p_holding,
                                                   p_takeovers, false);
    END LOOP;
END
$fn$;

-- name: citus_make_lease_run
-- The lease transition on Citus, for one run (lease_runs's rule, on the run's shard named:
-- Citus refuses lease_runs there, for its gen_random_uuid() in an UPDATE's SET, its FOR
-- UPDATE by a list of ids and lease_claim_of of a shard's row): run p_run, not ended, not
-- locked by another transaction and not in p_holding, is leased to p_owner for p_seconds
-- unless another invocation holds a live lease on it, or its lease lapsed and p_takeovers is
-- false or, for a pull app's run, pull_lease_lapse does not say ours; a paused run not past
-- its deadline is set aside instead. With p_ungated, only when nothing gates it (as
-- lease_begin_now: not a pull app's, not capped, not rate-limited and not yet started).
-- Made on Citus only, delegated by its first argument.
CREATE OR REPLACE FUNCTION citus_lease_run(
    p_run uuid, p_owner text, p_seconds double precision, p_holding uuid[],
    p_takeovers boolean, p_ungated boolean
) RETURNS SETOF lease_claim LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    runs_shard text := shard_name('runs', get_shard_id_for_distribution_column(
        'runs', p_run::text));
    r runs;
    was_ready timestamptz;
    old_token text;
BEGIN
    EXECUTE format($q$
        SELECT r.* FROM %s r
        WHERE r.id = $1 AND r.status IN ('running', 'cancelling') AND NOT (r.id = ANY ($2))
          AND (NOT $3 OR (NOT r.pull AND NOT r.options ? 'concurrency'
                          AND (NOT r.options ? 'rateLimit' OR r.started_at IS NOT NULL)))
        FOR UPDATE SKIP LOCKED
    $q$, runs_shard) INTO r USING p_run, coalesce(p_holding, '{}'), p_ungated;
    IF r.id IS NULL THEN
        RETURN;
    END IF;
    IF r.lease_token IS NOT NULL
       AND NOT (p_takeovers AND r.ready_at IS NOT NULL AND r.ready_at <= now()
                AND coalesce(pull_lease_lapse(r, p_seconds), 'ours') = 'ours') THEN
        RETURN;
    END IF;
    was_ready := r.ready_at;
    old_token := r.lease_token;
    IF NOT coalesce(r.deadline_at <= now(), false)
       AND (EXISTS (SELECT 1 FROM workflows w
                    WHERE w.project_id = r.project_id AND w.name = r.workflow
                      AND w.paused_at IS NOT NULL)
            OR EXISTS (SELECT 1 FROM apps a WHERE a.id = r.app_id AND a.paused_at IS NOT NULL))
    THEN
        EXECUTE format('UPDATE %s SET paused = true, ready_at = deadline_at, '
                       'lease_token = NULL, lease_owner = NULL, held = false '
                       'WHERE id = $1', runs_shard) USING p_run;
        RETURN;
    END IF;
    EXECUTE format($q$
        UPDATE %s r
        SET lease_token = gen_random_uuid()::text,
            invocation_id = gen_random_uuid(),
            lease_owner = $2,
            ready_at = least(now() + make_interval(secs => $3), r.deadline_at),
            claimed_wake_seq = r.wake_seq,
            progress_at = now(),
            progress_seq = 0,
            progress_digest = NULL,
            held = false,
            paused = false,
            started_at = coalesce(r.started_at, now())
        WHERE r.id = $1
        RETURNING r.*
    $q$, runs_shard) INTO r USING p_run, p_owner, p_seconds;
    RETURN NEXT lease_claim_of(
        r, greatest(coalesce(extract(epoch FROM was_ready - now()), 0), 0)::double precision,
        old_token IS NOT NULL);
END
$fn$;

-- name: citus_due_candidates
-- (claim_due on Citus, first) The runs claim_due would take now, read across the shards
-- without locks: up to $2 of the longest due, up to $2 of those with a priority above the
-- default (highest first: a run that goes ahead of a backlog is found in it), and up to $2
-- pull apps' runs past their deadline; each with its priority, when it is due and its shard.
-- The per-shard claim is then called on these shards alone, so a claim cycle asks no shard
-- that has nothing due, and costs the orchestrator one statement more than the shards it
-- claims on. The conditions are citus_claim_on_shard's (push_due, pull_overdue), kept beside
-- it: a run left out here would never be claimed, one let in costs a call.
-- $1: the timer lead (seconds), $3: the runs this orchestrator is invoking, $4: takeovers.
WITH push_due AS NOT MATERIALIZED (
    SELECT id, priority, ready_at FROM runs
    WHERE ready_at <= now() + make_interval(secs => $1::double precision) AND NOT pull
      AND NOT (id = ANY ($3::uuid[])) AND ($4::boolean OR lease_token IS NULL)
      AND (NOT options ? 'concurrency' OR deadline_at <= now())
      AND (NOT options ? 'rateLimit' OR started_at IS NOT NULL OR cancel_requested
           OR deadline_at <= now())
      AND (ready_at <= now()
           OR (SELECT min(s.wake_at) FROM steps s
               WHERE s.run_id = runs.id AND s.status = 'sleeping')
              <= now() + make_interval(secs => $1::double precision))
),
found AS (
    (SELECT * FROM push_due ORDER BY ready_at LIMIT $2)
    UNION ALL
    (SELECT * FROM push_due WHERE priority > 0 ORDER BY priority DESC, ready_at LIMIT $2)
    UNION ALL
    (SELECT id, priority, ready_at FROM runs
     WHERE pull AND ready_at IS NOT NULL AND deadline_at <= now() AND ready_at <= now()
       AND ($4::boolean OR lease_token IS NULL)
     ORDER BY deadline_at
     LIMIT $2)
)
SELECT DISTINCT id, priority, ready_at,
       get_shard_id_for_distribution_column('runs', id) AS shard
FROM found;

-- name: citus_claim_on_shard
SELECT * FROM citus_claim_on_shard($1, $2, $3, $4, $5, $6, $7);

-- name: citus_run_projects
-- The projects of runs $1 (one read across their shards, no lock): the per-run transitions
-- take the run's project.
SELECT id, project_id FROM runs WHERE id = ANY ($1::uuid[]);

-- name: citus_lease_run
SELECT * FROM citus_lease_run($1, $2, $3, $4, $5, $6);

-- name: citus_keep_lease
-- (heartbeat, one run: run_keep_lease delegated)
SELECT run_keep_lease($1, $2, $3, $4::double precision);

-- name: citus_keep_leases
-- (heartbeat, several runs: $1 [{id, project_id, token}]) the procedure citus_keep_leases:
-- answers {run id: cancel_requested} of the leases still held.
CALL citus_keep_leases($1::jsonb, $2::double precision, NULL);

-- name: citus_run_invocations
-- The project of runs $1 and the deployment each one's invocation goes to (the run's, else
-- the app's last known one): what run_begin takes besides the lease.
SELECT r.id, r.project_id, coalesce(d.deployment_id, a.deployment_id) AS invoked_deployment_id
FROM runs r JOIN apps a ON a.id = r.app_id
LEFT JOIN deployments d ON d.id = r.deployment AND NOT d.current
WHERE r.id = ANY ($1::uuid[]);

-- name: citus_begin
-- (begin_invocations, one run: run_begin delegated)
SELECT * FROM run_begin($1, $2, $3, $4, $5, $6, $7::double precision, $8::integer, $9);

-- name: citus_progress
-- (progress, one run: run_progress delegated; the changes, callbacks and log lines its own)
SELECT * FROM run_progress($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::integer,
                           $13::bigint);

-- name: citus_suspend
-- (suspend_runs, one run: run_suspend delegated)
SELECT run_suspend($1, $2, $3, $4);

-- name: citus_end
-- (end_runs, one run: run_end delegated; then citus_after_end from the coordinator's session)
SELECT * FROM run_end($1, $2, $3, $4, $5, $6, $7, $8);

-- name: citus_after_end
-- What end_runs does beside run_end, for run $1 (project $2) ended $3 with error $4: whether it
-- has children not ended (they may be on any shard), its alerts recorded (a reference table,
-- written from here) and its end told to the listeners (who listen on the coordinator).
SELECT EXISTS (SELECT 1 FROM runs c WHERE c.parent_run_id = $1
                                      AND c.status IN ('running', 'cancelling')) AS has_children,
       pg_notify('stepline_ended', $1::text) IS NULL AS told,
       CASE WHEN $3::run_status IN ('failed', 'timedOut')
            THEN record_run_alerts($2, $1, (SELECT workflow FROM runs WHERE id = $1),
                                   $3::run_status, $4::jsonb) END AS alerted;


-- ---------------------------------------------------------------------------------------
-- Claims and sweeps across shards (docs/scaling.md, "Claims without locks across shards").
-- Citus refuses FOR UPDATE [SKIP LOCKED] over many shards, so each statement below is the
-- Citus variant of the store's statement of the same name after the prefix (db.query runs it
-- instead on a Citus coordinator): its candidates are read without locks, then each is acted
-- on through a statement or a transition on its own shard, whose condition (checked again
-- under the run's row lock there) replaces the lock skipped. A row another orchestrator took
-- meanwhile is then not found, as SKIP LOCKED passed it over. citus_claim_functions makes the
-- per-run functions they call.

-- name: citus_claim_functions
-- The per-run functions of the Citus variants, made (or made again) by each layout. Each
-- statement in them names one run by id: Citus routes it to that run's shard.
-- (citus_lease_runs, made by earlier layouts, wrote lease_runs's rule again on the
-- coordinator: the gated claims now lease through citus_lease_run, the one lease rule here.)
DROP FUNCTION IF EXISTS citus_lease_runs(uuid[], text, double precision, uuid[], boolean);

CREATE OR REPLACE FUNCTION citus_run(p_run uuid) RETURNS SETOF runs
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- Run p_run's row, read on its shard and answered where this is called: a function of
    -- runs' row type (lease_claim_of, pull_lease_lapse, which read reference tables) is then
    -- called on the coordinator, not pushed down to the shard (where it would have to run a
    -- distributed query from a query on a shard, which Citus refuses). PL/pgSQL: an SQL
    -- function would be inlined into its caller's query, and pushed down with it.
    RETURN QUERY SELECT * FROM runs WHERE id = p_run;
END
$$;

CREATE OR REPLACE FUNCTION citus_hold_runs(
    _ids uuid[], _lease_seconds double precision, _holding uuid[], _takeovers boolean
) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    run_id uuid;
    r runs;
    n integer := 0;
BEGIN
    -- claim_capped's holds, run by run in id order: a run still due, not held, not one the
    -- caller invokes, its lapsed lease one lease_runs would take over, is held (run_hold).
    -- Answers how many.
    FOREACH run_id IN ARRAY ARRAY(SELECT DISTINCT u FROM unnest(_ids) u ORDER BY u) LOOP
        CONTINUE WHEN run_id = ANY (coalesce(_holding, '{}'));
        SELECT * INTO r FROM runs
        WHERE id = run_id AND ready_at <= now() AND NOT held
          AND (_takeovers OR lease_token IS NULL)
        FOR UPDATE;
        CONTINUE WHEN NOT FOUND
                      OR coalesce(pull_lease_lapse(r, _lease_seconds), 'ours') <> 'ours';
        IF run_hold(run_id, r.project_id) THEN
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END
$$;

CREATE OR REPLACE FUNCTION citus_repair_run(p_run uuid, p_project uuid, p_reason text)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- repair_stuck_runs's check for run p_run alone, under its row lock (another transaction
    -- holding it is passed over), then its repair (run_repair). Answers whether it was
    -- repaired.
    PERFORM 1 FROM runs r
    WHERE r.id = p_run AND r.ready_at IS NULL AND r.ended_at IS NULL AND NOT r.held
      AND NOT r.paused
      AND NOT EXISTS (SELECT 1 FROM run_gatherings g WHERE g.run_id = p_run)
      AND NOT EXISTS (
          SELECT 1 FROM steps s
          WHERE s.run_id = p_run AND s.status = 'waiting'
            AND s.kind IN ('callback', 'event', 'invoke'))
    FOR UPDATE OF r SKIP LOCKED;
    RETURN FOUND AND run_repair(p_run, p_project, p_reason);
END
$$;

CREATE OR REPLACE PROCEDURE citus_keep_leases(
    p_leases jsonb, p_seconds double precision, INOUT p_kept jsonb DEFAULT NULL
) LANGUAGE plpgsql AS $$
DECLARE
    l record;
    v_cancel boolean;
    v_left jsonb := p_leases;
    v_busy jsonb;
    v_round integer := 0;
    v_began timestamptz := clock_timestamp();
BEGIN
    -- heartbeat on Citus: each lease of p_leases ([{id, project_id, token}]) kept by
    -- run_keep_lease on its run's shard, in run id order, never waiting for a run's row while
    -- holding another's: in rounds, each keeping in one transaction the runs whose rows are
    -- free (SKIP LOCKED) and leaving the others, whose rows a progress commit or a wake
    -- holds, to the next round 20 ms later; after half a second of rounds each run still
    -- left is kept on its own, waiting for its row. (In one transaction waiting row by
    -- row, beats and progress commits waited for each other: up to 4 s a beat with 60 leases,
    -- and a lease lapsed under its live invocation; waiting row by row after one round, up to
    -- 3.5 s, half the runs' rows held at any moment under load.) Answers {run id:
    -- cancel_requested} for each lease held. Called on its own (CALL, outside a transaction
    -- block): it commits.
    p_kept := '{}';
    WHILE jsonb_array_length(v_left) > 0
          AND (v_round = 0 OR clock_timestamp() - v_began < interval '0.5 seconds') LOOP
        IF v_round > 0 THEN
            PERFORM pg_sleep(0.02);
        END IF;
        v_busy := '[]';
        FOR l IN
            SELECT * FROM jsonb_to_recordset(v_left) AS x(id uuid, project_id uuid, token text)
            ORDER BY x.id
        LOOP
            PERFORM 1 FROM runs r WHERE r.id = l.id AND r.project_id = l.project_id
            FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                v_busy := v_busy || jsonb_build_array(to_jsonb(l));
                CONTINUE;
            END IF;
            v_cancel := run_keep_lease(l.id, l.project_id, l.token, p_seconds);
            IF v_cancel IS NOT NULL THEN
                p_kept := p_kept || jsonb_build_object(l.id::text, v_cancel);
            END IF;
        END LOOP;
        COMMIT;
        v_left := v_busy;
        v_round := v_round + 1;
    END LOOP;
    FOR l IN
        SELECT * FROM jsonb_to_recordset(v_left) AS x(id uuid, project_id uuid, token text)
        ORDER BY x.id
    LOOP
        v_cancel := run_keep_lease(l.id, l.project_id, l.token, p_seconds);
        IF v_cancel IS NOT NULL THEN
            p_kept := p_kept || jsonb_build_object(l.id::text, v_cancel);
        END IF;
        COMMIT;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION citus_complete_callback(
    p_callback uuid, p_run uuid, p_body jsonb, p_project uuid
) RETURNS TABLE (callback callbacks, woken boolean, pull boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    c callbacks;
    v_woken boolean;
BEGIN
    -- complete_callback for callback p_callback of run p_run (read before: a callback's id
    -- does not name its run), each statement on the run's shard: the callback completed if
    -- still pending (and of project p_project when given), its step completed, the run woken
    -- by run_wake with the same history (complete_callback's, kept beside it). No row when
    -- nothing was pending. (On every shard, as complete_callback is without its run, Citus
    -- makes each such write wait for every other on the same table.)
    UPDATE callbacks SET status = 'completed', body = p_body, completed_at = now()
    WHERE id = p_callback AND run_id = p_run AND status = 'pending'
      AND (p_project IS NULL OR project_id = p_project)
    RETURNING * INTO c;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE steps SET status = 'completed', output = p_body, ended_at = now()
    WHERE run_id = p_run AND name = c.step_name AND status = 'waiting';
    v_woken := run_wake(p_run, c.project_id, jsonb_build_array(
        jsonb_build_object('type', 'callback.completed', 'step_name', c.step_name,
                           'data', jsonb_build_object('callbackId', p_callback::text)),
        jsonb_build_object('type', 'step.completed', 'step_name', c.step_name,
                           'data', '{"kind": "callback"}'::jsonb)));
    RETURN QUERY SELECT c, v_woken, (SELECT r.pull FROM runs r WHERE r.id = p_run);
END
$$;

CREATE OR REPLACE FUNCTION citus_match_event_run(
    p_run uuid, p_project uuid, p_name text, p_data jsonb, p_event_id text
) RETURNS TABLE (id uuid, pull boolean) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_name text;
    v_names text[] := '{}';
BEGIN
    -- match_event for run p_run alone (a candidate read before without locks), each statement
    -- on the run's shard: its steps of project p_project waiting for event p_name whose match
    -- fields all equal p_data's completed (still waiting: one that timed out meanwhile is
    -- passed over), then the run woken by run_wake with event.received and step.completed for
    -- each, in step name order (match_event's history, kept beside it). A row for the run
    -- when it was woken, with whether it is a pull app's.
    FOR v_name IN
        UPDATE steps s SET status = 'completed', output = p_data, ended_at = now()
        WHERE s.run_id = p_run AND s.project_id = p_project AND s.kind = 'event'
          AND s.status = 'waiting' AND s.event_name = p_name
          AND NOT EXISTS (
              SELECT 1 FROM jsonb_each(CASE WHEN jsonb_typeof(s.match) = 'object'
                                            THEN s.match ELSE '{}'::jsonb END) f
              WHERE f.value IS DISTINCT FROM
                    CASE WHEN jsonb_typeof(p_data) = 'object' THEN p_data -> f.key END)
        RETURNING s.name
    LOOP
        v_names := v_names || v_name;
    END LOOP;
    IF cardinality(v_names) = 0 THEN
        RETURN;
    END IF;
    IF run_wake(p_run, p_project, (
        SELECT jsonb_agg(x.ev ORDER BY n.name, x.i)
        FROM unnest(v_names) n(name) CROSS JOIN LATERAL (VALUES
            (0, jsonb_build_object('type', 'event.received', 'step_name', n.name,
                                   'data', jsonb_build_object('event', p_name,
                                                              'eventId', p_event_id))),
            (1, jsonb_build_object('type', 'step.completed', 'step_name', n.name,
                                   'data', '{"kind": "event"}'::jsonb))) AS x(i, ev)))
    THEN
        RETURN QUERY SELECT p_run, (SELECT r.pull FROM runs r WHERE r.id = p_run);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION citus_forget_parents(p_parents uuid[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n integer;
BEGIN
    -- The runs whose parent is one of p_parents (deleted by retention) have none any more: on
    -- plain PostgreSQL the foreign key's ON DELETE SET NULL does it. Answers how many.
    UPDATE runs SET parent_run_id = NULL WHERE parent_run_id = ANY (p_parents);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

CREATE OR REPLACE FUNCTION citus_fire_gathering(p_run uuid, p_due boolean)
RETURNS TABLE (id uuid, project_id uuid, workflow text, kind text, starts integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    g record;
    r record;
BEGIN
    -- fire_gatherings for run p_run alone: its gathering (when p_due, only once its time has
    -- come) locked, passed over when another transaction holds it, deleted, and the run fired
    -- (run_fire) with run.debounced or run.batched in its history. No row when nothing fired.
    SELECT rg.kind, rg.starts, rg.event_ids INTO g FROM run_gatherings rg
    WHERE rg.run_id = p_run AND (NOT p_due OR rg.fire_at <= now())
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    DELETE FROM run_gatherings rg WHERE rg.run_id = p_run;
    SELECT ru.project_id, ru.workflow INTO r FROM runs ru WHERE ru.id = p_run;
    IF NOT FOUND OR NOT run_fire(p_run, r.project_id, jsonb_build_array(
        CASE g.kind WHEN 'debounce'
             THEN jsonb_build_object('type', 'run.debounced',
                                     'data', jsonb_build_object('starts', g.starts))
             ELSE jsonb_build_object('type', 'run.batched',
                                     'data', jsonb_build_object('size', g.starts,
                                                                'eventIds', g.event_ids))
        END)) THEN
        RETURN;
    END IF;
    id := p_run;
    project_id := r.project_id;
    workflow := r.workflow;
    kind := g.kind;
    starts := g.starts;
    RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION citus_move_run(p_run uuid, p_project uuid, p_from uuid,
                                          p_to uuid)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- move_deployment_runs for run p_run alone: still on deployment p_from and not ended
    -- once locked, it moves to p_to (run_move). Answers whether it moved.
    PERFORM 1 FROM runs
    WHERE id = p_run AND deployment = p_from AND status IN ('running', 'cancelling')
    FOR NO KEY UPDATE;
    RETURN FOUND AND run_move(p_run, p_project, p_to);
END
$$;

-- name: on_citus_delete_old_runs
-- delete_old_runs on Citus: the runs read without locks, deleted if still ended before the
-- cut (a retry may have started one again); answers their ids, whose children then lose their
-- parent (on_citus_forget_parents: the foreign key that did it is gone).
DELETE FROM runs
WHERE id IN (SELECT id FROM runs
             WHERE ended_at < now() - make_interval(secs => $1::double precision)
             ORDER BY ended_at
             LIMIT $2)
  AND ended_at < now() - make_interval(secs => $1::double precision)
RETURNING id;

-- name: on_citus_complete_callback
-- complete_callback on Citus, for the callback's run $5 (callback_run; NULL: no such
-- callback, nothing changes): citus_complete_callback, each statement on the run's shard; the
-- wake-up sent from the coordinator's session.
SELECT (f.callback).*, f.woken AS run_woken,
       CASE WHEN $4::boolean OR (f.woken AND f.pull) THEN pg_notify('stepline_wake', '') END
FROM citus_complete_callback($1::uuid, $5::uuid, $2::jsonb, $3::uuid) f;

-- name: on_citus_match_event
-- match_event on Citus: the runs with a step waiting for the event that it matches, read
-- without locks (every shard: an event may match a run on any), each then completed on its
-- shard by citus_match_event_run, in run id order. (As one statement, a write across every
-- shard of steps, which Citus makes wait for every other such write to the table.)
WITH cand AS MATERIALIZED (
    SELECT DISTINCT s.run_id FROM steps s
    WHERE s.project_id = $2 AND s.kind = 'event' AND s.status = 'waiting'
      AND s.event_name = $3
      AND NOT EXISTS (
          SELECT 1 FROM jsonb_each(CASE WHEN jsonb_typeof(s.match) = 'object'
                                        THEN s.match ELSE '{}'::jsonb END) f
          WHERE f.value IS DISTINCT FROM
                CASE WHEN jsonb_typeof($4::jsonb) = 'object' THEN $4::jsonb -> f.key END)
    ORDER BY s.run_id
)
SELECT m.id, m.pull
FROM cand CROSS JOIN LATERAL citus_match_event_run(
    cand.run_id, $2::uuid, $3::text, $4::jsonb, coalesce($5::text, $1::uuid::text)) m;

-- name: on_citus_forget_parents
-- The runs whose parent is one of $1 (deleted) have none any more (citus_forget_parents).
SELECT citus_forget_parents($1::uuid[]);

-- name: on_citus_delete_old_events
-- delete_old_events on Citus: read without locks, deleted if still past the cut.
DELETE FROM events
WHERE id IN (SELECT id FROM events
             WHERE received_at < now() - make_interval(secs => $1::double precision)
             ORDER BY received_at
             LIMIT $2)
  AND received_at < now() - make_interval(secs => $1::double precision);

-- name: on_citus_delete_old_ticks
-- delete_old_ticks on Citus: read without locks, deleted if still past the cut.
DELETE FROM schedule_ticks t USING (
    SELECT schedule_id, tick_at FROM schedule_ticks
    WHERE created_at < now() - make_interval(secs => $1::double precision)
    ORDER BY created_at
    LIMIT $2
) old
WHERE t.schedule_id = old.schedule_id AND t.tick_at = old.tick_at
  AND t.created_at < now() - make_interval(secs => $1::double precision);

-- name: on_citus_delete_old_history
-- delete_old_history on Citus: read without locks (each run's last event still kept: a
-- newer one may only have been appended meanwhile).
DELETE FROM run_events e USING (
    SELECT ev.run_id, ev.seq
    FROM runs r JOIN run_events ev ON ev.run_id = r.id
    WHERE r.ended_at IS NULL
      AND r.created_at < now() - make_interval(secs => $1::double precision)
      AND ev.at < now() - make_interval(secs => $1::double precision)
      AND ev.seq < (SELECT max(l.seq) FROM run_events l WHERE l.run_id = ev.run_id)
    LIMIT $2
) old
WHERE e.run_id = old.run_id AND e.seq = old.seq;

-- name: on_citus_repair_stuck_runs
-- repair_stuck_runs on Citus: the runs with no way forward read without locks, each checked
-- again under its lock and repaired by citus_repair_run (on the coordinator's session, so the
-- wake-up reaches the orchestrators).
WITH stuck AS MATERIALIZED (
    SELECT r.id, r.project_id, r.workflow FROM runs r
    WHERE r.ready_at IS NULL AND r.ended_at IS NULL AND NOT r.held AND NOT r.paused
      AND NOT EXISTS (SELECT 1 FROM run_gatherings g WHERE g.run_id = r.id)
      AND NOT EXISTS (
          SELECT 1 FROM steps s
          WHERE s.run_id = r.id AND s.status = 'waiting'
            AND s.kind IN ('callback', 'event', 'invoke'))
    ORDER BY r.id
    LIMIT $1
),
woken AS MATERIALIZED (
    SELECT id, project_id, workflow FROM stuck
    WHERE citus_repair_run(id, project_id, 'no lease, no due time and no open wait')
)
SELECT id, project_id, workflow, CASE WHEN EXISTS (SELECT 1 FROM woken)
                                      THEN pg_notify('stepline_wake', '') END
FROM woken;

-- name: on_citus_fire_gatherings
-- fire_gatherings on Citus: the gathering of run $1, or with $1 null up to $2 whose time has
-- come, read without locks, each fired on its run's shard by citus_fire_gathering (a gathering
-- another transaction holds is passed over, as SKIP LOCKED does); the wake-up sent from the
-- coordinator's session. (Run $1 is named as a value, not looked up: a statement whose scans
-- all name one run's shard is sent whole to that shard's worker, where the delegated run_fire
-- may not be called.)
WITH due AS MATERIALIZED (
    SELECT $1::uuid AS run_id WHERE $1::uuid IS NOT NULL
    UNION ALL
    (SELECT run_id FROM run_gatherings
     WHERE $1::uuid IS NULL AND fire_at <= now()
     ORDER BY fire_at
     LIMIT $2)
),
r AS MATERIALIZED (
    SELECT f.* FROM due CROSS JOIN LATERAL citus_fire_gathering(due.run_id, $1::uuid IS NULL) f
)
SELECT id, project_id, workflow, kind, starts,
       CASE WHEN EXISTS (SELECT 1 FROM r) THEN pg_notify('stepline_wake', '') END AS woken
FROM r;

-- name: on_citus_move_deployment_runs
-- move_deployment_runs on Citus: the runs read without locks, each moved in id order by
-- citus_move_run if still on deployment $1 and not ended once locked.
WITH m AS MATERIALIZED (
    SELECT id, project_id FROM runs
    WHERE deployment = $1 AND status IN ('running', 'cancelling')
    ORDER BY id
)
SELECT id FROM m WHERE citus_move_run(id, project_id, $1, $2);

-- name: on_citus_open_gathering
-- open_gathering on Citus, first: the runs of the gatherings of key $4 of kind $3 of workflow
-- $2 of project $1, read without locks (then each locked on its shard:
-- on_citus_lock_gathering).
SELECT run_id FROM run_gatherings
WHERE project_id = $1 AND workflow = $2 AND kind = $3 AND key = $4;

-- name: on_citus_lock_gathering
-- open_gathering on Citus, then: the gathering of run $5 (of key $4 of kind $3 of workflow $2
-- of project $1), locked, on its run's shard.
SELECT g.*,
       EXISTS (SELECT 1 FROM runs r
               WHERE r.id = $5 AND r.status = 'running' AND r.ready_at IS NULL
                 AND r.lease_token IS NULL AND r.started_at IS NULL) AS gathers
FROM run_gatherings g
WHERE g.run_id = $5 AND g.project_id = $1 AND g.workflow = $2 AND g.kind = $3 AND g.key = $4
FOR UPDATE OF g;

-- name: citus_pull_candidates
-- (claim_pull on Citus, first) Up to $1 due runs of pull app $2 a poll would lease (on
-- deployment $3, NULL: the app's current one; $4: whether lapsed leases may be taken over),
-- read without locks, higher priority first: each is then leased by citus_lease_run on its
-- shard, if still leasable there.
SELECT id
FROM runs
WHERE pull AND app_id = $2 AND ready_at <= now()
  AND coalesce(deployment, (SELECT d.id FROM deployments d WHERE d.app_id = $2 AND d.current))
      = coalesce($3::uuid, (SELECT d.id FROM deployments d WHERE d.app_id = $2 AND d.current))
  AND options ->> 'concurrency' IS NULL
  AND (options -> 'rateLimit' IS NULL OR started_at IS NOT NULL OR cancel_requested)
  AND (deadline_at IS NULL OR deadline_at > now())
  AND ($4::boolean OR lease_token IS NULL)
ORDER BY priority DESC, ready_at
LIMIT $1;

-- name: citus_rate_limited_candidates
-- (claim_rate_limited on Citus, first; the window counted under the limit's advisory lock,
-- taken on the coordinator's session) Up to $4 of the due runs not yet started of workflow $2
-- (project $1) with rate key value $3, read without locks, in claim_rate_limited's order: each
-- is then leased by citus_lease_run on its shard, if still leasable there. $5, $6: a pull
-- poll's app and deployment (claim_rate_limited's $9, $10).
SELECT id FROM runs
WHERE ready_at <= now() AND started_at IS NULL AND NOT cancel_requested
  AND project_id = $1 AND workflow = $2 AND options -> 'rateLimit' IS NOT NULL
  AND rate_key IS NOT DISTINCT FROM $3::text
  AND ($5::uuid IS NULL OR (app_id = $5 AND coalesce(
     deployment, (SELECT d.id FROM deployments d WHERE d.app_id = $5 AND d.current))
     = coalesce($6::uuid, (SELECT d.id FROM deployments d
                            WHERE d.app_id = $5 AND d.current))))
ORDER BY priority DESC, created_at, id
LIMIT $4;

-- name: citus_capped_candidates
-- (claim_capped on Citus, first; under the cap's advisory lock, taken on the coordinator's
-- session) The room counted and the candidates read without locks, the runs to hold held by
-- citus_hold_runs (each under its lock, on its shard, if still holdable), and the runs with
-- room answered in claim_capped's order: each is then leased by citus_lease_run on its shard,
-- if still leasable there (room not used is the next cycle's). $1 project, $2 workflow, $3
-- cap, $4 lease seconds, $5 limit, $6 concurrency key value, $7 takeovers, $8 the runs the
-- caller invokes, $9 and $10 a pull poll's app and deployment.
WITH busy AS MATERIALIZED (
    SELECT greatest(0, $3::integer - count(*)) AS room FROM runs
    WHERE project_id = $1 AND workflow = $2 AND concurrency_key IS NOT DISTINCT FROM $6::text
      AND lease_token IS NOT NULL AND (ready_at > now() OR id = ANY ($8::uuid[]))
),
cand AS MATERIALIZED (
    (SELECT id, priority, created_at FROM runs
     WHERE project_id = $1 AND workflow = $2 AND concurrency_key IS NOT DISTINCT FROM $6::text
       AND held
       AND ($9::uuid IS NULL OR (app_id = $9 AND coalesce(
           deployment, (SELECT d.id FROM deployments d WHERE d.app_id = $9 AND d.current))
           = coalesce($10::uuid, (SELECT d.id FROM deployments d
                                  WHERE d.app_id = $9 AND d.current))))
     ORDER BY priority DESC, created_at, id LIMIT $5)
    UNION ALL
    (SELECT id, priority, created_at FROM runs
     WHERE ready_at <= now() AND NOT held AND project_id = $1 AND workflow = $2
       AND concurrency_key IS NOT DISTINCT FROM $6::text
       AND ($7::boolean OR lease_token IS NULL) AND NOT (id = ANY ($8::uuid[]))
       AND ($9::uuid IS NULL OR (app_id = $9 AND coalesce(
           deployment, (SELECT d.id FROM deployments d WHERE d.app_id = $9 AND d.current))
           = coalesce($10::uuid, (SELECT d.id FROM deployments d
                                  WHERE d.app_id = $9 AND d.current))))
     ORDER BY priority DESC, created_at, id LIMIT $5)
),
go AS MATERIALIZED (
    SELECT c.id, c.priority, c.created_at FROM cand c
    ORDER BY c.priority DESC, c.created_at, c.id
    LIMIT least($5::integer, (SELECT room FROM busy))
),
to_hold AS MATERIALIZED (
    SELECT h.id FROM runs h
    WHERE h.project_id = $1 AND h.workflow = $2
      AND h.concurrency_key IS NOT DISTINCT FROM $6::text
      AND h.ready_at <= now() AND NOT h.held
      AND ($7::boolean OR h.lease_token IS NULL) AND NOT (h.id = ANY ($8::uuid[]))
      AND h.id NOT IN (SELECT id FROM go)
      AND (SELECT room FROM busy) <= (SELECT count(*) FROM go)
),
-- The holds first (their count), then the runs to lease.
held_now AS MATERIALIZED (
    SELECT citus_hold_runs(ARRAY(SELECT id FROM to_hold), $4, $8, $7) AS n
)
SELECT id FROM go
WHERE (SELECT n FROM held_now) IS NOT NULL
ORDER BY priority DESC, created_at, id;

-- name: on_citus_release_held
-- release_held on Citus: the room counted first (Citus takes no subquery in a LIMIT over
-- many shards), the held runs read without locks, each released in id order by run_unhold
-- (whose condition, held still, is what the lock kept).
WITH busy AS MATERIALIZED (
    SELECT greatest(0, $3::integer - count(*)) AS room FROM runs
    WHERE project_id = $1 AND workflow = $2 AND concurrency_key IS NOT DISTINCT FROM $4::text
      AND lease_token IS NOT NULL AND ready_at > now()
),
held AS MATERIALIZED (
    SELECT id, project_id, priority, created_at FROM runs
    WHERE project_id = $1 AND workflow = $2 AND concurrency_key IS NOT DISTINCT FROM $4::text
      AND held
    ORDER BY priority DESC, created_at, id
    LIMIT $3
),
go AS MATERIALIZED (
    SELECT g.id, g.project_id FROM (
        SELECT id, project_id FROM held ORDER BY priority DESC, created_at, id
        LIMIT (SELECT room FROM busy)) g
    ORDER BY g.id
)
SELECT id FROM go WHERE run_unhold(id, project_id);

-- name: on_citus_pull_lease
-- pull_lease on Citus: the run read on its shard (citus_run), its lease's claim made here.
SELECT (lease_claim_of(r, 0, false)).* FROM citus_run($1) r WHERE r.lease_token = $2 AND r.pull;

-- name: on_citus_lost_pull_leases
-- lost_pull_leases on Citus: the app's lapsed pull leases read first (a materialised CTE: the
-- rows come to the coordinator), whose they are and their claims worked out there
-- (pull_lease_lapse and lease_claim_of read reference tables, which a function called on a
-- shard may not).
WITH lapsed AS MATERIALIZED (
    SELECT r.* FROM runs r
    WHERE r.pull AND r.app_id = $1 AND r.lease_token IS NOT NULL
      AND r.status IN ('running', 'cancelling') AND r.ready_at <= now()
      AND (r.deadline_at IS NULL OR r.deadline_at > now())
)
SELECT (lease_claim_of(ROW(l.*)::runs, 0, false)).* FROM lapsed l
WHERE pull_lease_lapse(ROW(l.*)::runs, $2) = 'lost'
ORDER BY l.ready_at
LIMIT 100;

-- name: on_citus_next_pull_due_in
-- next_pull_due_in on Citus: the leased runs read first, their lapses worked out on the
-- coordinator (as on_citus_lost_pull_leases).
WITH leased AS MATERIALIZED (
    SELECT r.* FROM runs r WHERE r.pull AND r.app_id = $1 AND r.lease_token IS NOT NULL
)
SELECT extract(epoch FROM least(
    (SELECT min(ready_at) FROM runs
     WHERE ready_at IS NOT NULL AND pull AND app_id = $1 AND lease_token IS NULL
       AND coalesce(deployment, (SELECT d.id FROM deployments d WHERE d.app_id = $1 AND d.current))
           = coalesce($3::uuid, (SELECT d.id FROM deployments d
                                 WHERE d.app_id = $1 AND d.current))),
    (SELECT min(CASE WHEN pull_lease_lapse(ROW(l.*)::runs, $2) = 'unsure'
                     THEN now() + make_interval(secs => least($2::double precision / 10, 1))
                     ELSE l.ready_at END)
     FROM leased l)
) - now())::double precision;
