-- Retention at scale: every cascade from a deleted run and every sweep goes through an index,
-- so a sweep costs what it deletes, not the size of the tables.
CREATE INDEX callbacks_run ON callbacks (run_id);
CREATE INDEX events_received ON events (received_at);
CREATE INDEX schedule_ticks_created ON schedule_ticks (created_at);
CREATE INDEX runs_active_created ON runs (created_at) WHERE ended_at IS NULL;
