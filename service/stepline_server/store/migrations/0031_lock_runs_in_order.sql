-- Several runs locked in a given order, each by a statement of its own: on Citus a row lock
-- is taken only by a statement on one shard (lock_app_runs, before an app is deleted).

CREATE FUNCTION lock_runs_in_order(p_ids uuid[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    run uuid;
    locked integer := 0;
BEGIN
    -- Locks runs p_ids FOR NO KEY UPDATE (as an UPDATE locks), in the order given; answers
    -- how many exist.
    FOREACH run IN ARRAY coalesce(p_ids, '{}') LOOP
        PERFORM 1 FROM runs WHERE id = run FOR NO KEY UPDATE;
        IF FOUND THEN
            locked := locked + 1;
        END IF;
    END LOOP;
    RETURN locked;
END
$$;
COMMENT ON FUNCTION lock_runs_in_order(uuid[]) IS 'Runs locked FOR NO KEY UPDATE one by one, in the order given (on Citus, each lock a statement on one shard).';
