-- Laying the schema out on a Citus cluster (citus.py): what the layout step reads and calls.
-- Only citus_present and citus_sequential_writes run on plain PostgreSQL; the others name
-- Citus's catalogs and functions.

-- name: citus_present
-- Whether the citus extension is installed in this database.
SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus');

-- name: citus_session
-- A pooled session on a Citus coordinator plans each statement for its values (the store's
-- sessions force generic plans elsewhere: db.SESSION_SETTINGS).
SET plan_cache_mode = force_custom_plan;

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
-- called with one run id of a shard (a representative: citus_shard_runs), it runs on the
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

-- name: citus_shard_runs
-- One run id per shard of runs (any id that hashes into it: the per-shard claim is called
-- with it), found among random ids; read again when the shards change (a split).
SELECT DISTINCT ON (shard) shard, id FROM (
    SELECT get_shard_id_for_distribution_column('runs', id::text) AS shard, id
    FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, 64 * (
        SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'runs'::regclass))) g
) s
ORDER BY shard, id;

-- name: citus_shard_count
SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'runs'::regclass;

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

-- name: citus_begin
-- (begin_invocations, one run: run_begin delegated)
SELECT * FROM run_begin($1, $2, $3, $4, $5, $6, $7::double precision, $8::integer);

-- name: citus_progress
-- (progress, one run: run_progress delegated; the changes, callbacks and log lines its own)
SELECT * FROM run_progress($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::integer,
                           $13::bigint);

-- name: citus_suspend
-- (suspend_runs, one run: run_suspend delegated)
SELECT run_suspend($1, $2, $3, $4);

-- name: citus_end
-- (end_runs, one run: run_end delegated; its pg_notify reaches only the worker's listeners,
-- so citus_notify_ended follows it from the coordinator's session)
SELECT * FROM run_end($1, $2, $3, $4, $5, $6, $7, $8);

-- name: citus_notify_ended
SELECT pg_notify('stepline_ended', $1::text);
