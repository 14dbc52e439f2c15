-- Run logs (ctx.log and Python logging records written while a step runs), kept on the run up
-- to a cap with a count of the lines dropped past it; child runs say they came from their
-- parent; schedules may set an SLA on their runs' start lag.

CREATE TABLE run_logs (
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq bigint NOT NULL,
    project_id uuid NOT NULL,
    at timestamptz NOT NULL,
    level text NOT NULL CHECK (level IN ('debug', 'info', 'warning', 'error')),
    message text NOT NULL,
    fields jsonb,
    step_name text,
    PRIMARY KEY (run_id, seq)
);
COMMENT ON TABLE run_logs IS 'Log lines of a run in the order the app wrote them (seq from 1); deleted with the run.';
COMMENT ON COLUMN run_logs.at IS 'When the app wrote the line (the app''s clock).';
COMMENT ON COLUMN run_logs.step_name IS 'The step whose execution wrote the line; NULL for lines of the workflow code between steps.';

ALTER TABLE runs ADD COLUMN log_lines integer NOT NULL DEFAULT 0;
COMMENT ON COLUMN runs.log_lines IS 'Log lines kept (run_logs rows): the seq of the last one.';
ALTER TABLE runs ADD COLUMN log_bytes bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN runs.log_bytes IS 'Size of the log lines kept (message and fields as JSON), counted against the cap.';
ALTER TABLE runs ADD COLUMN logs_dropped integer NOT NULL DEFAULT 0;
COMMENT ON COLUMN runs.logs_dropped IS 'Log lines dropped past the cap (1,000 lines or 1 MiB a run); once one is dropped, no newer line is kept.';

UPDATE runs SET trigger = 'parent' WHERE trigger = 'invoke';

ALTER TABLE schedules ADD COLUMN sla_ms bigint CHECK (sla_ms > 0);
COMMENT ON COLUMN schedules.sla_ms IS 'The longest start lag (first invocation minus scheduled time) its runs should have; NULL: none.';
