-- Schedules and their ticks. Every time that decides when a schedule fires is passed in by the
-- caller (the scheduler's clock), never read from the database's now().

-- name: insert_schedule
INSERT INTO schedules (id, project_id, workflow, cron, timezone, input, overlap, misfire,
                       disable_after, source, next_fire_at, created_at, updated_at, sla_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12, $13)
ON CONFLICT DO NOTHING
RETURNING *;

-- name: get_schedule
SELECT * FROM schedules WHERE project_id = $1 AND id = $2;

-- name: lock_schedule
SELECT * FROM schedules WHERE project_id = $1 AND id = $2 FOR UPDATE;

-- name: lock_schedule_by_id
-- A run of the schedule ended: its counters and buffered tick change under this lock.
SELECT * FROM schedules WHERE id = $1 FOR UPDATE;

-- name: list_schedules
SELECT * FROM schedules
WHERE project_id = $1 AND ($2::timestamptz IS NULL OR (created_at, id) > ($2, $3::text))
ORDER BY created_at, id
LIMIT $4;

-- name: update_schedule
-- A user's change (PATCH, pause, resume, sync): the version goes up, the buffered tick is let go.
UPDATE schedules SET
    cron = $3, timezone = $4, input = $5, overlap = $6, misfire = $7, disable_after = $8,
    status = $9, consecutive_failures = $10, next_fire_at = $11, last_tick_at = $12,
    buffered_tick_at = NULL, version = version + 1, updated_at = $13, sla_ms = $14
WHERE project_id = $1 AND id = $2
RETURNING *;

-- name: schedule_sla
SELECT sla_ms FROM schedules WHERE id = $1;

-- name: delete_schedule
DELETE FROM schedules WHERE project_id = $1 AND id = $2 RETURNING id;

-- name: claim_due_schedule
-- One active schedule whose next tick has come ($1 is the scheduler's clock), locked until the
-- transaction ends; a schedule another scheduler holds is passed over, and so are those in $2
-- (whose firing failed in this pass).
SELECT * FROM schedules
WHERE status = 'active' AND next_fire_at <= $1 AND NOT (id = ANY($2::text[]))
ORDER BY next_fire_at, id
LIMIT 1
FOR UPDATE SKIP LOCKED;

-- name: next_schedule_fire_at
SELECT min(next_fire_at) FROM schedules WHERE status = 'active';

-- name: advance_schedule
-- Move the cursor past the ticks just planned; only under the version they were planned with.
UPDATE schedules SET
    last_tick_at = $3, next_fire_at = $4,
    last_fire_at = CASE WHEN $5::timestamptz IS NULL THEN last_fire_at
                        ELSE greatest(last_fire_at, $5) END,
    buffered_tick_at = $6
WHERE id = $1 AND version = $2
RETURNING id;

-- name: record_tick
-- The primary key makes a tick's outcome (and so its run) happen once, whoever plans it.
INSERT INTO schedule_ticks (schedule_id, tick_at, version, outcome, reason, run_id)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT DO NOTHING
RETURNING tick_at;

-- name: record_ticks_skipped
INSERT INTO schedule_ticks (schedule_id, tick_at, version, outcome, reason)
SELECT $1, t, $2, 'skipped', $4 FROM unnest($3::timestamptz[]) AS t
ON CONFLICT DO NOTHING;

-- name: get_tick
SELECT * FROM schedule_ticks WHERE schedule_id = $1 AND tick_at = $2;

-- name: list_ticks
SELECT * FROM schedule_ticks WHERE schedule_id = $1 ORDER BY tick_at;

-- name: settle_buffered_tick
-- The buffered tick either started its run or was let go.
UPDATE schedule_ticks SET outcome = $3, reason = $4, run_id = $5
WHERE schedule_id = $1 AND tick_at = $2 AND outcome = 'buffered';

-- name: count_active_schedule_runs
SELECT count(*) FROM runs
WHERE schedule_id = $1 AND status IN ('running', 'cancelling');

-- name: schedule_run_ended
-- Count consecutive failures ($2: +1 failed, 0 completed, null leaves it) and disable the
-- schedule when they reach its threshold; the buffered tick goes when it is no longer active.
UPDATE schedules SET
    consecutive_failures = CASE WHEN $2::integer IS NULL THEN consecutive_failures
                                WHEN $2 = 0 THEN 0
                                ELSE consecutive_failures + $2 END,
    status = CASE WHEN $3 THEN 'disabled' ELSE status END
WHERE id = $1
RETURNING *;

-- name: buffered_tick_due
-- The run that held back schedule $1's buffered tick ended: the schedule is due from that tick
-- on, so the next scheduler pass starts its run, and the schedulers are woken for it now.
-- (Notified from the statement's result, not its RETURNING: Citus takes no volatile function
-- there, and sends it from the coordinator's session, where the schedulers listen.)
WITH due AS (
    UPDATE schedules SET next_fire_at = least(next_fire_at, buffered_tick_at)
    WHERE id = $1 AND buffered_tick_at IS NOT NULL
    RETURNING id
)
SELECT pg_notify('stepline_schedule', id) FROM due;

-- name: take_buffered_tick
-- The buffered tick was let go.
UPDATE schedules SET buffered_tick_at = NULL WHERE id = $1;

-- name: get_code_schedule
SELECT * FROM schedules
WHERE project_id = $1 AND workflow = $2 AND source = 'code'
FOR UPDATE;

-- name: delete_stale_code_schedules
-- A sync of app $2: its workflows that no longer declare a schedule lose their code schedule.
DELETE FROM schedules s
USING workflows w
WHERE s.project_id = $1 AND s.source = 'code'
  AND w.project_id = s.project_id AND w.name = s.workflow AND w.app_id = $2
  AND NOT (s.workflow = ANY($3::text[]))
RETURNING s.id;
