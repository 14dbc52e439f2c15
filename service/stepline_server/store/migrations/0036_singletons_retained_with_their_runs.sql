-- A singleton key's row goes when retention deletes the run that last held it (a run ended
-- or gone frees its key, so the row said nothing more): found by its run. (One statement
-- alone in its file: on Citus, DDL on a distributed table is sent to the workers as the
-- whole text it came in, which may hold only one command.)

CREATE INDEX run_singletons_run ON run_singletons (run_id);
