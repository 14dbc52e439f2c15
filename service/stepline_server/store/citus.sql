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
-- The functions named in $1 not yet delegated: their signatures (the run id is the first
-- argument of each).
SELECT p.oid::regprocedure::text AS signature
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public' AND p.proname = ANY ($1::text[])
  AND NOT EXISTS (SELECT 1 FROM pg_dist_object o
                  WHERE o.classid = 'pg_proc'::regclass AND o.objid = p.oid
                    AND o.distribution_argument_index IS NOT NULL)
ORDER BY 1;

-- name: citus_delegate_function
-- Function $1 runs on the worker holding the shard of its first argument's run.
SELECT create_distributed_function($1::regprocedure, '$1', colocate_with := 'runs');

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
