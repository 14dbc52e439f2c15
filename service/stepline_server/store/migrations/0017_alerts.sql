-- Alerts: rules that notify a person (a webhook or a Slack incoming webhook) of what went
-- wrong, and the outbox of their notifications. A notification is inserted by the statement
-- that caused it (a run ending, a schedule disabled), so a crash never loses one; the delivery
-- loop sends each until it is delivered or a day has passed.
CREATE TABLE alerts (
    id uuid PRIMARY KEY,
    project_id uuid NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    name text NOT NULL CHECK (length(name) BETWEEN 1 AND 128),
    types text[] NOT NULL CHECK (cardinality(types) >= 1 AND types <@ ARRAY['run.failed', 'run.timedOut', 'run.stuck', 'app.unreachable', 'schedule.disabled', 'schedule.slaBreached']),
    workflow text CHECK (workflow ~ '^[A-Za-z0-9_-]{1,64}$'),
    destination_type text NOT NULL CHECK (destination_type IN ('webhook', 'slack')),
    url text NOT NULL,
    secret text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE alerts IS 'What to notify (types, optionally of one workflow) and where (a webhook signed with secret, or Slack).';
COMMENT ON COLUMN alerts.types IS 'The notification types the alert sends: run.failed, run.timedOut, run.stuck, app.unreachable, schedule.disabled, schedule.slaBreached.';
COMMENT ON COLUMN alerts.secret IS 'Signs webhook bodies (Stepline-Signature), shown once when the alert is made.';
CREATE INDEX alerts_project ON alerts (project_id, created_at, id);

CREATE TABLE alert_notifications (
    id uuid PRIMARY KEY,
    project_id uuid NOT NULL,
    alert_id uuid NOT NULL REFERENCES alerts (id) ON DELETE CASCADE,
    type text NOT NULL CHECK (type IN ('run.failed', 'run.timedOut', 'run.stuck', 'app.unreachable', 'schedule.disabled', 'schedule.slaBreached', 'alert.test')),
    run_id uuid,
    schedule_id text,
    data jsonb NOT NULL DEFAULT '{}',
    status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts integer NOT NULL DEFAULT 0,
    last_http_status integer,
    last_error text,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_token uuid,
    created_at timestamptz NOT NULL DEFAULT now(),
    delivered_at timestamptz,
    CHECK ((status = 'delivered') = (delivered_at IS NOT NULL))
);
COMMENT ON TABLE alert_notifications IS 'The outbox: one row per notification, sent at least once under the same id.';
COMMENT ON COLUMN alert_notifications.status IS 'pending: to be sent (again) at next_attempt_at; delivered: a 2xx answer; failed: not delivered within a day of tries.';
COMMENT ON COLUMN alert_notifications.data IS 'What the notification tells, as it was when it was recorded (the run''s workflow, status and error).';
COMMENT ON COLUMN alert_notifications.lease_token IS 'The delivery attempt under way (its claim): only it may record the attempt''s outcome.';
CREATE UNIQUE INDEX alert_notifications_once ON alert_notifications (alert_id, run_id, type)
    WHERE run_id IS NOT NULL;
CREATE INDEX alert_notifications_due ON alert_notifications (next_attempt_at) WHERE status = 'pending';
CREATE INDEX alert_notifications_alert ON alert_notifications (alert_id, created_at DESC, id DESC);
CREATE INDEX alert_notifications_settled ON alert_notifications (created_at) WHERE status <> 'pending';
