-- 0002: stepline_items, which reads a batch parameter so that joins with it use indexes.

CREATE FUNCTION stepline_items(batch jsonb) RETURNS SETOF jsonb
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE ROWS 4
    AS $$ BEGIN RETURN QUERY SELECT jsonb_array_elements(batch); END $$;
COMMENT ON FUNCTION stepline_items(jsonb) IS 'The elements of a batch parameter (a JSON array of records), which the planner expects to be a few rows rather than the hundred it assumes for jsonb_array_elements and jsonb_to_recordset: a batch joined with runs and steps then goes through their indexes. PL/pgSQL, so the estimate is not inlined away.';
