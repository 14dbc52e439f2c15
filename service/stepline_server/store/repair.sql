-- No run without a way forward: a run not ended always has a live lease, a due time, or an
-- open wait that something outside can complete. The check finds any run without one.

-- name: repair_stuck_runs
-- Up to $1 runs not ended that have no way forward, made due now (run_repair: woken, their
-- history says run.repaired): no lease (or one whose invocation's orchestrator is gone: lapsed, with no
-- due time), no due time, not held by a concurrency cap or set aside by a pause (a release or
-- a resume is their way forward), not gathering a debounce's or a batch's starts (its firing
-- is), and no step waiting for a callback, an event or a child run. Answers the runs repaired. Read through runs_without_due, which holds only the runs
-- with no due time, so the check costs what few such runs there are.
WITH stuck AS MATERIALIZED (
    SELECT r.id FROM runs r
    WHERE r.ready_at IS NULL AND r.ended_at IS NULL AND NOT r.held AND NOT r.paused
      AND NOT EXISTS (SELECT 1 FROM run_gatherings g WHERE g.run_id = r.id)
      AND NOT EXISTS (
          SELECT 1 FROM steps s
          WHERE s.run_id = r.id AND s.status = 'waiting'
            AND s.kind IN ('callback', 'event', 'invoke'))
    ORDER BY r.id
    LIMIT $1
    FOR UPDATE OF r SKIP LOCKED
),
woken AS MATERIALIZED (
    SELECT r.id, r.project_id, r.workflow FROM stuck JOIN runs r ON r.id = stuck.id
    WHERE run_repair(r.id, r.project_id, 'no lease, no due time and no open wait')
)
SELECT id, project_id, workflow, CASE WHEN EXISTS (SELECT 1 FROM woken)
                                      THEN pg_notify('stepline_wake', '') END
FROM woken;
