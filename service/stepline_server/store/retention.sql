-- The sweeper's deletes past retention, in batches.

-- name: delete_old_runs
-- Up to $2 runs that ended more than $1 seconds ago, with their steps, callbacks, history and
-- log lines (each cascade goes through an index) and the singleton keys they held last
-- (forget_singletons). Rows another sweeper is deleting are passed over. Answers how many.
WITH gone AS (
    DELETE FROM runs WHERE id IN (
        SELECT id FROM runs
        WHERE ended_at < now() - make_interval(secs => $1::double precision)
        ORDER BY ended_at
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
    RETURNING id
),
freed AS (
    DELETE FROM run_singletons s WHERE s.run_id IN (SELECT id FROM gone)
)
SELECT count(*) FROM gone;

-- name: forget_singletons
-- The singleton keys runs $1 (deleted) held last: their rows go (a key taken since by another
-- run names that run, and stays). On Citus, after on_citus_delete_old_runs.
DELETE FROM run_singletons WHERE run_id = ANY ($1::uuid[]);

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
-- runs): their steps stay, so replay is unchanged; the history starts later. Each run's last
-- event stays (append_run_events numbers after it: a run's seqs never restart, and a
-- follower's ?after= cursor stays valid; one appended meanwhile is newer still).
DELETE FROM run_events e USING (
    SELECT ev.run_id, ev.seq
    FROM runs r JOIN run_events ev ON ev.run_id = r.id
    WHERE r.ended_at IS NULL
      AND r.created_at < now() - make_interval(secs => $1::double precision)
      AND ev.at < now() - make_interval(secs => $1::double precision)
      AND ev.seq < (SELECT max(l.seq) FROM run_events l WHERE l.run_id = ev.run_id)
    LIMIT $2
    FOR UPDATE OF ev SKIP LOCKED
) old
WHERE e.run_id = old.run_id AND e.seq = old.seq;
