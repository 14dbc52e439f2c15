-- The current truth of Stepline's database, folded: each type, table, index and function once,
-- in its final form. The numbered migrations in migrations/ must produce exactly this schema
-- (a test checks it); change both together. A table's columns are in the order the migrations
-- added them (PostgreSQL cannot reorder columns), so its newer columns come last.
--
-- Scoped tables name their scope column project_id; it holds an environment id (environments
-- belong to projects), so a key, which sees one environment, filters every query by it.

-- Tenancy: projects, their environments, the keys that see one environment, dashboard
-- sessions, and the server's signing secrets.

CREATE TABLE projects (
    id uuid PRIMARY KEY,
    name text NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE environments (
    id uuid PRIMARY KEY,
    project_id uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,63}$'),
    created_at timestamptz NOT NULL DEFAULT now(),
    definitions_version integer NOT NULL DEFAULT 0,
    UNIQUE (project_id, name)
);
COMMENT ON TABLE environments IS 'An environment of a project. Every scoped table''s project_id column holds an environment id: a key sees one environment.';
COMMENT ON COLUMN environments.definitions_version IS 'The newest version of the environment''s workflow definitions (0: none synced yet).';

CREATE TABLE api_keys (
    id uuid PRIMARY KEY,
    project_id uuid NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    name text NOT NULL,
    key_hash text NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now(),
    role text NOT NULL DEFAULT 'admin' CHECK (role IN ('owner', 'admin', 'write', 'read')),
    prefix text NOT NULL DEFAULT '',
    revoked_at timestamptz
);
COMMENT ON COLUMN api_keys.project_id IS 'The environment the key sees (an environments row).';
COMMENT ON COLUMN api_keys.role IS 'owner: everything in every environment of its project (keys of any environment, new environments); admin: everything in its environment, its keys included; write: everything but keys; read: GET only.';
COMMENT ON COLUMN api_keys.prefix IS 'The first characters of the key, shown in lists so a person can tell keys apart.';
COMMENT ON COLUMN api_keys.revoked_at IS 'When the key was revoked; a revoked key is refused.';

CREATE TABLE dashboard_sessions (
    id_hash text PRIMARY KEY,
    key_id uuid NOT NULL REFERENCES api_keys (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
COMMENT ON TABLE dashboard_sessions IS 'A signed-in dashboard session: the cookie holds a random id, this row its SHA-256 and the key it signed in with. Signing out deletes it; revoking the key deletes its sessions.';
COMMENT ON COLUMN dashboard_sessions.expires_at IS 'The session ends then (12 hours after its last request); an expired row is never used and is deleted at the next sign-in.';
CREATE INDEX dashboard_sessions_key ON dashboard_sessions (key_id);
CREATE INDEX dashboard_sessions_expiry ON dashboard_sessions (expires_at);

CREATE TABLE server_secrets (
    id serial PRIMARY KEY,
    secret text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE server_secrets IS 'Keys that sign callback URLs: the newest signs, all verify.';

-- Apps, their deployments, and the workflows a sync declared.

CREATE TABLE apps (
    id uuid PRIMARY KEY,
    project_id uuid NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    slug text NOT NULL UNIQUE,
    name text NOT NULL,
    url text,
    signing_secrets text[] NOT NULL CHECK (cardinality(signing_secrets) >= 1),
    deployment_id text,
    synced_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    kind text NOT NULL DEFAULT 'push' CHECK (kind IN ('push', 'pull')),
    polled_at timestamptz,
    paused_at timestamptz,
    protocol_version integer NOT NULL DEFAULT 1 CHECK (protocol_version >= 1),
    sdk_version text,
    UNIQUE (project_id, name),
    CONSTRAINT apps_url_of_kind CHECK ((kind = 'push') = (url IS NOT NULL))
);
COMMENT ON COLUMN apps.signing_secrets IS 'Newest first: the first signs invocations.';
COMMENT ON COLUMN apps.kind IS 'push: the orchestrator POSTs invocations to url; pull: workers poll for them (no url).';
COMMENT ON COLUMN apps.polled_at IS 'When a worker of a pull app last polled for invocations.';
COMMENT ON COLUMN apps.paused_at IS 'When the app was paused (NULL: not paused): none of its runs is invoked until it is resumed.';
COMMENT ON COLUMN apps.protocol_version IS 'The protocol version the app declared at its last sync (1 when it declared none): only features of that version are used when invoking it.';
COMMENT ON COLUMN apps.sdk_version IS 'The SDK version the app declared at its last sync.';

CREATE TABLE deployments (
    id uuid PRIMARY KEY,
    app_id uuid NOT NULL REFERENCES apps (id) ON DELETE CASCADE,
    deployment_id text,
    url text,
    current boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE deployments IS 'The deployments of an app, each at its own URL (none for a pull app: its workers declare their deployment id). The current one (one per app) is where new runs start; the app''s url is its url.';
COMMENT ON COLUMN deployments.deployment_id IS 'The id the deployment goes by: given when it was registered, else what it answered at its registration sync. NULL on the current deployment: the app''s deployment_id (what it last answered or synced with).';
CREATE UNIQUE INDEX deployments_current ON deployments (app_id) WHERE current;
CREATE INDEX deployments_app ON deployments (app_id, created_at);

CREATE TABLE workflows (
    project_id uuid NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    name text NOT NULL CHECK (name ~ '^[A-Za-z0-9_-]{1,64}$'),
    app_id uuid NOT NULL REFERENCES apps (id) ON DELETE CASCADE,
    options jsonb NOT NULL DEFAULT '{}',
    synced_at timestamptz NOT NULL DEFAULT now(),
    version integer NOT NULL DEFAULT 1,
    paused_at timestamptz,
    PRIMARY KEY (project_id, name)
);
COMMENT ON COLUMN workflows.version IS 'The definitions version of the sync that last changed this workflow''s app.';
COMMENT ON COLUMN workflows.paused_at IS 'When the workflow was paused (NULL: not paused): none of its runs is invoked until it is resumed.';

-- Runs.

CREATE TYPE run_status AS ENUM ('running', 'cancelling', 'completed', 'failed', 'cancelled', 'timedOut');
COMMENT ON TYPE run_status IS 'running: in progress, also while it sleeps or waits; cancelling: cancel requested, cleanup may run; completed: returned; failed: raised or could not be invoked; cancelled: cancel finished; timedOut: past its time limit';

CREATE TABLE runs (
    id uuid PRIMARY KEY,
    project_id uuid NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    app_id uuid NOT NULL REFERENCES apps (id) ON DELETE CASCADE,
    workflow text NOT NULL,
    status run_status NOT NULL DEFAULT 'running',
    input jsonb,
    output jsonb,
    error jsonb,
    run_key text CHECK (run_key ~ '^[A-Za-z0-9._:-]{1,128}$'),
    parent_run_id uuid REFERENCES runs (id) ON DELETE SET NULL,
    parent_step text,
    schedule_id text,
    scheduled_at timestamptz,
    trigger text NOT NULL DEFAULT 'api',
    options jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    ended_at timestamptz,
    deadline_at timestamptz,
    cancel_requested boolean NOT NULL DEFAULT false,
    version integer NOT NULL DEFAULT 1,
    ready_at timestamptz,
    lease_token text,
    lease_owner text,
    invocation_id uuid,
    invoke_attempts integer NOT NULL DEFAULT 0,
    wake_seq bigint NOT NULL DEFAULT 0,
    claimed_wake_seq bigint NOT NULL DEFAULT 0,
    progress_at timestamptz,
    progress_seq bigint NOT NULL DEFAULT 0,
    held boolean NOT NULL DEFAULT false,
    progress_digest text,
    undelivered_since timestamptz,
    event_id uuid,
    concurrency_key text,
    singleton_key text,
    definition_version integer,
    log_lines integer NOT NULL DEFAULT 0,
    log_bytes bigint NOT NULL DEFAULT 0,
    logs_dropped integer NOT NULL DEFAULT 0,
    priority smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100),
    rate_key text,
    pull boolean NOT NULL DEFAULT false,
    generation integer NOT NULL DEFAULT 1 CHECK (generation >= 1),
    history_snapshot pg_snapshot,
    history_invocation uuid,
    paused boolean NOT NULL DEFAULT false,
    first_input jsonb,
    history_db text,
    history_acked uuid,
    event_key text,
    deployment uuid REFERENCES deployments (id) ON DELETE SET NULL,
    CHECK ((status IN ('running', 'cancelling')) = (ended_at IS NULL)),
    CHECK (ready_at IS NULL OR status IN ('running', 'cancelling'))
) WITH (fillfactor = 80);
COMMENT ON TABLE runs IS 'Room is left in each page (fillfactor) so the frequent updates of unindexed columns stay in place.';
COMMENT ON COLUMN runs.ready_at IS 'When the dispatcher should next claim the run: due work, a timer, a timeout, or the end of the current lease. NULL: nothing to do until something wakes it.';
COMMENT ON COLUMN runs.lease_token IS 'Fencing token of the active invocation; NULL when none is active.';
COMMENT ON COLUMN runs.wake_seq IS 'Bumped by every outside wake-up (callback, event, child end, cancel) so an invocation that ends suspended knows it must run again.';
COMMENT ON COLUMN runs.progress_at IS 'When the active invocation last committed (its claim or a progress call): an event wait recorded after it also takes events received since.';
COMMENT ON COLUMN runs.progress_seq IS 'The last progress call of the active invocation that was applied: a call sent again (its answer lost) is not applied twice.';
COMMENT ON COLUMN runs.held IS 'Due, but its workflow''s concurrency was full: it waits (ready_at at its deadline) until an invocation of the workflow ends.';
COMMENT ON COLUMN runs.progress_digest IS 'Digest of the body of the last progress call applied (progress_seq): the same call sent again is answered, a different one under that seq is refused as stale.';
COMMENT ON COLUMN runs.undelivered_since IS 'When the first of the current run of delivery failures happened (the app could not be invoked); NULL once an invocation was delivered. The delivery window counts from here.';
COMMENT ON COLUMN runs.concurrency_key IS 'The value of the workflow''s concurrency key field in the input: the cap counts runs per value (NULL: the field is missing, or the workflow has no key).';
COMMENT ON COLUMN runs.singleton_key IS 'The value of the workflow''s singleton key field in the input: at most one run per value is not ended.';
COMMENT ON COLUMN runs.definition_version IS 'The definitions version of its workflow when the run was started.';
COMMENT ON COLUMN runs.log_lines IS 'Log lines kept (run_logs rows): the seq of the last one.';
COMMENT ON COLUMN runs.log_bytes IS 'Size of the log lines kept (message and fields as JSON), counted against the cap.';
COMMENT ON COLUMN runs.logs_dropped IS 'Log lines dropped past the cap (1,000 lines or 1 MiB a run); once one is dropped, no newer line is kept.';
COMMENT ON COLUMN runs.priority IS 'Among due runs of a workflow, higher priority is claimed first (-100 to 100, default 0).';
COMMENT ON COLUMN runs.rate_key IS 'The value of the workflow''s rate limit key field in the input: the limit counts starts per value (NULL: the field is missing, or the limit has no key).';
COMMENT ON COLUMN runs.pull IS 'The run''s app is a pull app: its workers'' polls claim it, the dispatcher only ends it past its time limit.';
COMMENT ON COLUMN runs.generation IS 'Counts from 1; each continue_as_new starts the next, with the new input and no steps.';
COMMENT ON COLUMN runs.history_snapshot IS 'The snapshot the steps of the run''s last invocation were read under: the next one gets only the steps written by transactions it did not see. NULL: the next one gets every step (a retry or continue_as_new removed steps, or none began).';
COMMENT ON COLUMN runs.history_invocation IS 'The invocation that was sent the history as of history_snapshot (the base the app lays the next changes over).';
COMMENT ON COLUMN runs.paused IS 'Due while its workflow or app was paused: set aside (ready_at at its deadline, no lease) until the pause ends.';
COMMENT ON COLUMN runs.first_input IS 'The input the run was started with, once it has continued as new (input is then the current generation''s); NULL while it is in its first generation.';
COMMENT ON COLUMN runs.history_db IS 'stepline_database_id() of the database history_snapshot was taken in: in any other, the next invocation gets every step.';
COMMENT ON COLUMN runs.history_acked IS 'The last invocation of the run answered by an SDK that reads history deltas (its answer declared protocol 3 or newer): the next invocation carries only what changed since history_invocation when this is history_invocation, else every step.';
COMMENT ON COLUMN runs.event_key IS 'The id the sender gave the event that started the run (events.key), or NULL: its eventId is then event_id.';
COMMENT ON COLUMN runs.deployment IS 'The deployment the run is invoked at: the app''s current one when it started (a child run of the same app: its parent''s), until it ends or is moved. NULL: its deployment was deleted after it ended; it goes to the current one.';
-- Lookups and lists.
CREATE UNIQUE INDEX runs_run_key ON runs (project_id, run_key) WHERE run_key IS NOT NULL;
CREATE INDEX runs_created ON runs (project_id, created_at DESC, id DESC);
CREATE INDEX runs_workflow_created ON runs (project_id, workflow, created_at DESC, id DESC);
CREATE INDEX runs_status_created ON runs (project_id, status, created_at DESC, id DESC);
CREATE INDEX runs_app ON runs (app_id);
CREATE INDEX runs_deployment ON runs (deployment);
CREATE INDEX runs_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_schedule ON runs (schedule_id, status) WHERE schedule_id IS NOT NULL;
-- Claims: due runs (push runs by the dispatcher, pull runs by their workers' polls).
CREATE INDEX runs_ready ON runs (ready_at) WHERE ready_at IS NOT NULL AND NOT pull;
CREATE INDEX runs_ready_priority ON runs (priority DESC, ready_at) WHERE ready_at IS NOT NULL AND NOT pull;
CREATE INDEX runs_ready_workflow ON runs (project_id, workflow, ready_at) WHERE ready_at IS NOT NULL;
CREATE INDEX runs_pull_ready ON runs (app_id, ready_at) WHERE ready_at IS NOT NULL AND pull;
CREATE INDEX runs_pull_deadline ON runs (deadline_at) WHERE ready_at IS NOT NULL AND pull;
CREATE INDEX runs_pull_leased ON runs (app_id, ready_at) WHERE pull AND lease_token IS NOT NULL;
-- Flow control: concurrency caps, rate limits, singletons, pauses.
CREATE INDEX runs_leased ON runs (project_id, workflow, concurrency_key) WHERE lease_token IS NOT NULL;
CREATE INDEX runs_held ON runs (project_id, workflow, concurrency_key, priority DESC, created_at) WHERE held;
CREATE INDEX runs_rate_starts ON runs (project_id, workflow, started_at) WHERE options ? 'rateLimit';
CREATE UNIQUE INDEX runs_singleton ON runs (project_id, workflow, singleton_key)
    WHERE singleton_key IS NOT NULL AND ended_at IS NULL;
CREATE INDEX runs_paused ON runs (project_id, workflow, priority DESC, created_at) WHERE paused;
-- Retention sweeps, and the way-forward check (the runs with no due time only).
CREATE INDEX runs_ended ON runs (ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX runs_active_created ON runs (created_at) WHERE ended_at IS NULL;
CREATE INDEX runs_without_due ON runs (id) WHERE ready_at IS NULL AND ended_at IS NULL;

-- Singleton keys: which run holds each (take_singleton).
CREATE TABLE run_singletons (
    id uuid PRIMARY KEY,
    run_id uuid NOT NULL
);
COMMENT ON TABLE run_singletons IS 'Which run holds each singleton key: id is singleton_id(environment, workflow, key value); the key is held while that run has not ended (a run ended or gone frees it, so an end writes nothing here).';
CREATE INDEX run_singletons_run ON run_singletons (run_id);

-- Debounces and batches: starts gathered into one run until the gathering fires.
CREATE TABLE run_gatherings (
    project_id uuid NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    workflow text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('debounce', 'batch')),
    key text NOT NULL,
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    starts integer NOT NULL DEFAULT 1 CHECK (starts >= 1),
    event_ids jsonb NOT NULL DEFAULT '[]',
    first_at timestamptz NOT NULL DEFAULT now(),
    last_at timestamptz NOT NULL DEFAULT now(),
    fire_at timestamptz NOT NULL,
    PRIMARY KEY (project_id, workflow, kind, key)
);
COMMENT ON TABLE run_gatherings IS 'Open debounces and batches: starts (API or event) of a workflow with one key value gathered into one run, which has no due time until the gathering fires (the row is then deleted and the run made due).';
COMMENT ON COLUMN run_gatherings.key IS 'The value of the workflow''s debounce or batch key field in the start''s input or event data, as canonical JSON; * without a key field.';
COMMENT ON COLUMN run_gatherings.starts IS 'How many starts (a debounce) or events (a batch) the run has gathered.';
COMMENT ON COLUMN run_gatherings.event_ids IS 'The ids of the events gathered, in order, as their senders see them.';
COMMENT ON COLUMN run_gatherings.fire_at IS 'When the gathering fires: a debounce its period after the last start (at most max wait after the first), a batch its wait after the first event.';
CREATE UNIQUE INDEX run_gatherings_run ON run_gatherings (run_id);
CREATE INDEX run_gatherings_due ON run_gatherings (fire_at);

-- Steps and what they wait for: callbacks and events.

CREATE TYPE step_kind AS ENUM ('run', 'sleep', 'value', 'callback', 'event', 'invoke', 'state');
COMMENT ON TYPE step_kind IS 'run: a user function; sleep: a timer; value: now/uuid; callback: a signed URL; event: waits for POST /v1/events; invoke: a child run; state: ctx.set_state (its key''s value is kept in run_state)';

CREATE TYPE step_status AS ENUM ('running', 'retrying', 'completed', 'failed', 'cancelled', 'sleeping', 'waiting');
COMMENT ON TYPE step_status IS 'running: started; retrying: next attempt due at wake_at; completed: has output; failed: has error; cancelled: the run was cancelled while it waited; sleeping: until wake_at; waiting: callback, event or child';

CREATE TABLE steps (
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    name text NOT NULL CHECK (length(name) BETWEEN 1 AND 256),
    project_id uuid NOT NULL,
    kind step_kind NOT NULL,
    status step_status NOT NULL,
    position bigint NOT NULL,
    attempt integer NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    output jsonb,
    error jsonb,
    started_at timestamptz NOT NULL DEFAULT now(),
    ended_at timestamptz,
    wake_at timestamptz,
    timeout_at timestamptz,
    callback_id uuid,
    child_run_id uuid,
    event_name text,
    match jsonb,
    output_bytes integer GENERATED ALWAYS AS (octet_length(output::text)) STORED,
    output_digest text GENERATED ALWAYS AS (md5(output::text)) STORED,
    version xid8 NOT NULL DEFAULT pg_current_xact_id(),
    PRIMARY KEY (run_id, name)
);
COMMENT ON COLUMN steps.output_bytes IS 'Bytes of the result''s JSON text (NULL without one): large results are sent to the app by reference.';
COMMENT ON COLUMN steps.output_digest IS 'MD5 of the result''s JSON text, so the SDK can check a result it fetched by reference.';
COMMENT ON COLUMN steps.version IS 'The transaction that last wrote the row (set on insert, and on every update by steps_version): the history an invocation gets is what changed since a snapshot.';
CREATE INDEX steps_event_waits ON steps (project_id, event_name) WHERE kind = 'event' AND status = 'waiting';

CREATE FUNCTION steps_stamp_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.version := pg_current_xact_id();
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION steps_stamp_version() IS 'Stamps an updated step row with the transaction writing it.';
CREATE TRIGGER steps_version BEFORE UPDATE ON steps
    FOR EACH ROW EXECUTE FUNCTION steps_stamp_version();

CREATE TABLE callbacks (
    id uuid PRIMARY KEY,
    project_id uuid NOT NULL,
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step_name text NOT NULL,
    status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'completed', 'timedOut', 'cancelled')),
    body jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz,
    timeout_at timestamptz
);
CREATE INDEX callbacks_run ON callbacks (run_id);

CREATE TABLE events (
    id uuid PRIMARY KEY,
    project_id uuid NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    name text NOT NULL,
    data jsonb,
    received_at timestamptz NOT NULL DEFAULT now(),
    key text,
    answer jsonb
);
COMMENT ON TABLE events IS 'Events sent with POST /v1/events, kept a day so a wait recorded just after one arrived still sees it.';
COMMENT ON COLUMN events.key IS 'The id the sender gave (the row''s id is derived from it), or NULL.';
COMMENT ON COLUMN events.answer IS 'What sending it answered: a second send of the same id answers this.';
CREATE INDEX events_recent ON events (project_id, name, received_at);
CREATE INDEX events_received ON events (received_at);

-- What a run leaves behind: its history, its logs, its published state.

CREATE TYPE run_event_type AS ENUM (
    'run.started', 'run.retried', 'run.continuedAsNew',
    'run.debounced', 'run.batched', 'run.repaired',
    'run.cancelling',
    'run.completed', 'run.failed', 'run.cancelled', 'run.timedOut',
    'invocation.started', 'invocation.ended',
    'step.started', 'step.completed', 'step.failed', 'step.retrying', 'step.sleeping',
    'step.waiting', 'step.cancelled',
    'callback.completed', 'event.received',
    'state.set', 'patch.recorded'
);
COMMENT ON TYPE run_event_type IS 'The types of a run''s history events, by the transition that appends each: start (insert_run, a child''s start): run.started; restart (a retry, continue_as_new): run.retried, run.started, run.continuedAsNew; wake (a gathering fires, a repair, a callback, an event, a child''s end): run.debounced, run.batched, run.repaired, callback.completed, event.received, step.completed, step.failed; cancel request: run.cancelling, step.cancelled; end: run.completed, run.failed, run.cancelled, run.timedOut, step.cancelled; lease-and-begin: invocation.started, step.completed and step.failed (timers settled); progress: invocation.ended, step.started, step.completed, step.failed, step.retrying, step.sleeping, step.waiting, state.set, patch.recorded, event.received (an event wait takes an event that came first).';

CREATE TABLE run_events (
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq bigint NOT NULL,
    project_id uuid NOT NULL,
    at timestamptz NOT NULL DEFAULT now(),
    type run_event_type NOT NULL,
    step_name text,
    invocation_id uuid,
    deployment_id text,
    http_status integer,
    duration_ms integer,
    data jsonb,
    PRIMARY KEY (run_id, seq)
);
COMMENT ON TABLE run_events IS 'Append-only history of a run, in per-run seq order.';

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

CREATE TABLE run_state (
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    key text NOT NULL CHECK (key ~ '^[A-Za-z0-9._:-]{1,128}$'),
    project_id uuid NOT NULL,
    value jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, key)
);
COMMENT ON TABLE run_state IS 'The current value of each key a run published with ctx.set_state (the last set of the key wins; every set is also a state step and a state.set event); deleted with the run.';
COMMENT ON COLUMN run_state.value IS 'The value as the app sent it (JSON, at most 64 KiB; an envelope when the app encrypts or stores values).';

-- Runs locked in a given order (before an app is deleted), each by a statement of its own.

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

-- Leases: the one run state machine. A run is leased to an invocation in one place
-- (lease_runs), whatever path leases it; the fence and pausing live inside it. Orchestrators
-- beat, so a pull app's lapsed lease can be told lost by its worker or by us.

CREATE TABLE orchestrators (
    owner text PRIMARY KEY,
    serving_since timestamptz NOT NULL,
    seen_at timestamptz NOT NULL
);
COMMENT ON TABLE orchestrators IS 'The orchestrators that beat lately, one row each (its lease_owner); a row unseen for a day is forgotten.';
COMMENT ON COLUMN orchestrators.serving_since IS 'Since when the orchestrator has been up and reaching the database without a break, as of its last beat.';
COMMENT ON COLUMN orchestrators.seen_at IS 'Its last beat: written every third of a lease while it reaches the database.';

CREATE FUNCTION stepline_database_id() RETURNS text LANGUAGE sql STABLE AS $$
    SELECT (SELECT system_identifier FROM pg_control_system())::text || '/'
           || (SELECT oid FROM pg_database WHERE datname = current_database())::text || '/'
           || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)
$$;
COMMENT ON FUNCTION stepline_database_id() IS 'This database''s identity: the cluster''s system identifier, the database''s oid and the timeline (on a primary). A dump restored elsewhere, a logical copy, or a standby promoted has another.';

CREATE TYPE lease_claim AS (
    id uuid,
    project_id uuid,
    app_id uuid,
    workflow text,
    status run_status,
    input jsonb,
    options jsonb,
    cancel_requested boolean,
    past_deadline boolean,
    lease_token text,
    invocation_id uuid,
    invoke_attempts integer,
    undelivered_since timestamptz,
    wake_seq bigint,
    concurrency_key text,
    generation integer,
    created_at timestamptz,
    pull boolean,
    priority smallint,
    due_in double precision,
    taken_over boolean,
    app_url text,
    app_secrets text[],
    app_protocol integer
);
COMMENT ON TYPE lease_claim IS 'A run leased to one invocation (lease_runs): its fencing token, generation and deadline, and what invoking it needs.';

CREATE FUNCTION lease_claim_of(r runs, due_in double precision, taken_over boolean)
RETURNS lease_claim LANGUAGE sql STABLE AS $$
    SELECT r.id, r.project_id, r.app_id, r.workflow, r.status, r.input, r.options,
           coalesce(r.cancel_requested, false), coalesce(r.deadline_at <= now(), false),
           r.lease_token, r.invocation_id, r.invoke_attempts, r.undelivered_since, r.wake_seq,
           r.concurrency_key, r.generation, r.created_at, r.pull, r.priority, due_in,
           taken_over,
           -- The run's deployment's URL: the app's (its current deployment's) when it has none.
           coalesce((SELECT d.url FROM deployments d WHERE d.id = r.deployment), a.url),
           a.signing_secrets, a.protocol_version
    FROM apps a WHERE a.id = r.app_id
$$;
COMMENT ON FUNCTION lease_claim_of(runs, double precision, boolean) IS 'A leased run as every lease answers it (lease_runs, and a pull worker''s answer recorded under its lease).';

CREATE FUNCTION pull_lease_lapse(r runs, _lease_seconds double precision) RETURNS text
LANGUAGE sql STABLE AS $$
    -- Whose loss a pull app's lapsed lease is, from the beats of the orchestrator that gave it
    -- (NULL: no pull run with a lapsed lease).
    SELECT CASE
        WHEN NOT r.pull OR r.lease_token IS NULL OR r.ready_at > now() THEN NULL
        -- It served from before the lease was last kept and beat after it lapsed: nothing on
        -- our side kept the worker's beats from landing.
        WHEN o.seen_at >= r.ready_at
             AND r.ready_at >= o.serving_since + make_interval(secs => _lease_seconds) THEN 'lost'
        -- Its last beat came before the lapse, less than a lease ago: it may beat yet.
        WHEN o.seen_at < r.ready_at
             AND o.seen_at > now() - make_interval(secs => _lease_seconds) THEN 'unsure'
        ELSE 'ours'
    END
    FROM (SELECT r.lease_owner AS owner) l LEFT JOIN orchestrators o ON o.owner = l.owner
$$;
COMMENT ON FUNCTION pull_lease_lapse(runs, double precision) IS 'Whose loss a pull app''s lapsed lease is: lost (its worker''s: recorded as a delivery failure before the run is leased again), unsure (its orchestrator may beat yet: wait), ours (its orchestrator stopped or lost the database: taken over with no count).';

CREATE FUNCTION lease_runs(
    _ids uuid[], _owner text, _lease_seconds double precision, _holding uuid[],
    _takeovers boolean
) RETURNS SETOF lease_claim LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The lease transition (running, no live lease -> running, leased to _owner), the only
    -- one. Of the runs _ids names, each not ended and not locked by another transaction is
    -- leased to one invocation unless
    --   * the caller is invoking it now (_holding: its beat came late and its lease lapsed,
    --     but its invocation is alive),
    --   * another invocation holds a live lease on it,
    --   * its lease lapsed and _takeovers is false (just after the database was away, a
    --     lease may have lapsed only because its holder could not beat),
    --   * it is a pull app's run whose lapsed lease its worker lost (recorded as a delivery
    --     failure first: lost_pull_leases) or whose orchestrator may beat yet
    --     (pull_lease_lapse),
    --   * its workflow or app is paused and it is not past its deadline: then it is set aside
    --     instead (paused, no lease, due at its deadline) until the pause ends.
    -- The lease lasts _lease_seconds, never past the deadline (a run at its time limit comes
    -- due, to be ended; a crashed holder's run comes due again when the lease ends). due_in:
    -- in how many seconds the run was due (0: now; a sleep claimed ahead of its end).
    RETURN QUERY
    WITH cand AS (
        SELECT r.id, r.ready_at AS was_ready, r.lease_token AS old_token,
               coalesce(r.deadline_at <= now(), false) AS past,
               (EXISTS (SELECT 1 FROM workflows w
                        WHERE w.project_id = r.project_id AND w.name = r.workflow
                          AND w.paused_at IS NOT NULL)
                OR EXISTS (SELECT 1 FROM apps a
                           WHERE a.id = r.app_id AND a.paused_at IS NOT NULL)) AS paused
        FROM runs r
        WHERE r.id = ANY (_ids)
          AND r.status IN ('running', 'cancelling')
          AND NOT (r.id = ANY (coalesce(_holding, '{}')))
          AND (r.lease_token IS NULL
               OR (_takeovers AND r.ready_at IS NOT NULL AND r.ready_at <= now()
                   AND coalesce(pull_lease_lapse(r, _lease_seconds), 'ours') = 'ours'))
        ORDER BY r.id
        FOR UPDATE OF r SKIP LOCKED
    ),
    set_aside AS (
        UPDATE runs r SET paused = true, ready_at = r.deadline_at, lease_token = NULL,
                          lease_owner = NULL, held = false
        FROM cand WHERE r.id = cand.id AND cand.paused AND NOT cand.past
    ),
    leased AS (
        UPDATE runs r
        SET lease_token = gen_random_uuid()::text,
            invocation_id = gen_random_uuid(),
            lease_owner = _owner,
            ready_at = least(now() + make_interval(secs => _lease_seconds), r.deadline_at),
            claimed_wake_seq = r.wake_seq,
            progress_at = now(),
            progress_seq = 0,
            progress_digest = NULL,
            held = false,
            paused = false,
            started_at = coalesce(r.started_at, now())
        FROM cand
        WHERE r.id = cand.id AND (NOT cand.paused OR cand.past)
        RETURNING lease_claim_of(
            r, greatest(coalesce(extract(epoch FROM cand.was_ready - now()), 0), 0)::double precision,
            cand.old_token IS NOT NULL) AS c
    )
    SELECT (l.c).* FROM leased l;
END
$$;
COMMENT ON FUNCTION lease_runs(uuid[], text, double precision, uuid[], boolean) IS 'The lease transition: every path that gives a run to an invocation calls it (its body says the rule).';

CREATE FUNCTION woken_ready_at(lease_token text, ready_at timestamptz, at timestamptz)
RETURNS timestamptz LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN lease_token IS NULL THEN at ELSE ready_at END
$$;
COMMENT ON FUNCTION woken_ready_at(text, timestamptz, timestamptz) IS 'The wake rule: a run woken from outside (a callback, an event, a child''s end, a cancel) is due now (at: the caller''s now(), passed in so that the rule is IMMUTABLE, as Citus wants of a function called with a run''s columns), or, while an invocation holds it, right after that invocation (whose end sees wake_seq moved and makes it due).';

-- Schedules and the ticks they planned.

CREATE TABLE schedules (
    id text PRIMARY KEY CHECK (id ~ '^wfs_[A-Za-z0-9]+$'),
    project_id uuid NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    workflow text NOT NULL,
    cron text NOT NULL,
    timezone text NOT NULL DEFAULT 'UTC',
    input jsonb,
    overlap text NOT NULL DEFAULT 'allow' CHECK (overlap IN ('allow', 'skip', 'buffer_one')),
    misfire text NOT NULL DEFAULT 'fire_once' CHECK (misfire IN ('fire_once', 'skip', 'fire_all')),
    status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'paused', 'disabled', 'completed')),
    source text NOT NULL DEFAULT 'api' CHECK (source IN ('api', 'code')),
    disable_after integer NOT NULL DEFAULT 20 CHECK (disable_after >= 0),
    consecutive_failures integer NOT NULL DEFAULT 0,
    version integer NOT NULL DEFAULT 1,
    next_fire_at timestamptz,
    last_fire_at timestamptz,
    last_tick_at timestamptz,
    buffered_tick_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    sla_ms bigint CHECK (sla_ms > 0)
);
COMMENT ON COLUMN schedules.last_tick_at IS 'The tick cursor: ticks at or before it are never planned again (the newest planned tick, or the time of an edit or resume that restarted counting).';
COMMENT ON COLUMN schedules.buffered_tick_at IS 'overlap buffer_one: the tick waiting for the active run to end.';
COMMENT ON COLUMN schedules.sla_ms IS 'The longest start lag (first invocation minus scheduled time) its runs should have; NULL: none.';
CREATE UNIQUE INDEX schedules_code ON schedules (project_id, workflow) WHERE source = 'code';
CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE status = 'active';

CREATE TABLE schedule_ticks (
    schedule_id text NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
    tick_at timestamptz NOT NULL,
    version integer NOT NULL,
    outcome text NOT NULL CHECK (outcome IN ('fired', 'skipped', 'buffered')),
    reason text,
    run_id uuid,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule_id, tick_at)
);
COMMENT ON TABLE schedule_ticks IS 'One row per planned tick: the primary key makes each tick fire at most once.';
CREATE INDEX schedule_ticks_created ON schedule_ticks (created_at);

-- Bulk operations: an action over the runs a filter matched at creation.

CREATE TABLE operations (
    id uuid PRIMARY KEY,
    project_id uuid NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    action text NOT NULL CHECK (action IN ('cancel', 'retry', 'retryFromStep', 'move')),
    filter jsonb NOT NULL DEFAULT '{}',
    from_step text CHECK (length(from_step) BETWEEN 1 AND 256),
    status text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'completed', 'cancelled')),
    matched integer NOT NULL DEFAULT 0,
    succeeded integer NOT NULL DEFAULT 0,
    failed integer NOT NULL DEFAULT 0,
    skipped integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    ended_at timestamptz,
    turn_at timestamptz,
    deployment uuid,
    CHECK ((status = 'running') = (ended_at IS NULL)),
    CHECK ((action = 'retryFromStep') = (from_step IS NOT NULL)),
    CONSTRAINT operations_move_deployment CHECK ((action = 'move') = (deployment IS NOT NULL))
);
COMMENT ON TABLE operations IS 'A bulk action over the runs a filter matched at creation (operation_runs).';
COMMENT ON COLUMN operations.status IS 'running: runs left to act on; completed: every run acted on or skipped; cancelled: stopped by a request, what was done stays done.';
COMMENT ON COLUMN operations.succeeded IS 'Counters kept in the transaction that acts on each batch of runs.';
COMMENT ON COLUMN operations.turn_at IS 'When a batch of it was last claimed (NULL: never); the claims take environments, then their operations, in turn by it.';
COMMENT ON COLUMN operations.deployment IS 'A move''s deployment: where its runs go (no foreign key: once it is deleted, what is left of the move fails).';
CREATE INDEX operations_created ON operations (project_id, created_at DESC, id DESC);
CREATE INDEX operations_running ON operations (created_at) WHERE status = 'running';
CREATE INDEX operations_ended ON operations (ended_at) WHERE ended_at IS NOT NULL;

CREATE TABLE operation_runs (
    operation_id uuid NOT NULL REFERENCES operations (id) ON DELETE CASCADE,
    position integer NOT NULL CHECK (position >= 1),
    run_id uuid NOT NULL,
    outcome text CHECK (outcome IN ('succeeded', 'failed', 'skipped')),
    error jsonb,
    done_at timestamptz,
    PRIMARY KEY (operation_id, position),
    CHECK ((outcome IS NULL) = (done_at IS NULL))
);
COMMENT ON TABLE operation_runs IS 'The runs of an operation, fixed at its creation, oldest first; no foreign key to runs: a run deleted since is skipped.';
COMMENT ON COLUMN operation_runs.outcome IS 'NULL: not acted on yet; succeeded: cancel requested or run retried; skipped: it no longer qualified; failed: see error.';
CREATE INDEX operation_runs_pending ON operation_runs (operation_id, position) WHERE outcome IS NULL;
CREATE INDEX operation_runs_failed ON operation_runs (operation_id, position) WHERE outcome = 'failed';

-- Alerts: rules that notify a person of what went wrong, and the outbox of their notifications.

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

-- Run transitions: append_run_events (the only writer of a run's history)
-- and the functions that each move one run, keyed by the run and its project.
CREATE FUNCTION append_run_events(p_run uuid, p_project uuid, p_events jsonb,
                                  p_invocation uuid DEFAULT NULL, p_locked boolean DEFAULT false)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    base bigint;
    v_now timestamptz := now();
BEGIN
    -- Appends p_events (a JSON array of {type, step_name, invocation_id, deployment_id,
    -- http_status, duration_ms, data, at}; invocation_id defaults to p_invocation, at to now())
    -- to run p_run's history, numbered after its last event; answers the first event's seq
    -- (NULL when p_events is empty or the run is not p_project's). The run's row is locked
    -- first, unless p_locked says this transaction has locked or updated it already (a
    -- transition that has just updated the run passes true: no second lock of the row), so
    -- two transactions appending to one run take turns and the seqs have no gap; the numbering
    -- reads the run's last event after the lock (a new snapshot: what the previous holder
    -- appended is seen), in the statement that inserts. The only writer of run_events.
    IF coalesce(jsonb_array_length(p_events), 0) = 0 THEN
        RETURN NULL;
    END IF;
    IF NOT p_locked THEN
        PERFORM FROM runs WHERE id = p_run AND project_id = p_project FOR NO KEY UPDATE;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
    END IF;
    WITH added AS (
        INSERT INTO run_events (run_id, seq, project_id, at, type, step_name, invocation_id,
                                deployment_id, http_status, duration_ms, data)
        SELECT p_run, last.seq + x.ord, p_project, coalesce(x.at, v_now), x.type, x.step_name,
               coalesce(x.invocation_id, p_invocation), x.deployment_id, x.http_status,
               x.duration_ms, x.data
        FROM (SELECT coalesce(max(e.seq), 0) AS seq FROM run_events e WHERE e.run_id = p_run) last,
             ROWS FROM (jsonb_to_recordset(p_events) AS (
                 type run_event_type, step_name text, invocation_id uuid, deployment_id text,
                 http_status integer, duration_ms integer, data jsonb, at timestamptz))
                 WITH ORDINALITY AS x(type, step_name, invocation_id, deployment_id,
                                      http_status, duration_ms, data, at, ord)
        RETURNING seq
    )
    SELECT min(seq) INTO base FROM added;
    RETURN base;
END
$$;
COMMENT ON FUNCTION append_run_events(uuid, uuid, jsonb, uuid, boolean) IS 'Appends events to a run''s history, numbered after its last event under the run''s row lock (taken here unless p_locked), and answers the first one''s seq: the only writer of run_events.';

CREATE FUNCTION run_wake(p_run uuid, p_project uuid, p_events jsonb DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now timestamptz := now();
BEGIN
    -- The wake transition: something outside the run (a callback completed, an event received,
    -- a child's end, a cancel request, a child deleted) moved it. A run not ended is due now,
    -- or, while an invocation holds it, right after that invocation (woken_ready_at: its end
    -- sees wake_seq moved and makes it due), and p_events (what woke it) are appended to its
    -- history. Answers whether the run was woken (false: ended, or not p_project's; nothing is
    -- appended). Touches only this run's row and history: a child's end wakes its parent by the
    -- caller calling this for the parent (store.children.resolve_child).
    UPDATE runs SET wake_seq = wake_seq + 1, ready_at = woken_ready_at(lease_token, ready_at, v_now)
    WHERE id = p_run AND project_id = p_project AND status IN ('running', 'cancelling');
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM append_run_events(p_run, p_project, p_events);
    RETURN true;
END
$$;
COMMENT ON FUNCTION run_wake(uuid, uuid, jsonb) IS 'The wake transition: a run not ended is due now (or right after its active invocation), with what woke it in its history.';

CREATE FUNCTION run_suspend(p_run uuid, p_project uuid, p_token text, p_acked boolean)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now timestamptz := now();
    v_timer timestamptz;
BEGIN
    -- The suspend transition: the invocation holding lease p_token ended with the run still
    -- running. The lease is released and the run comes due at its earliest timer (a sleep, a
    -- retry, a wait's timeout; its deadline at the latest), or at once when something woke it
    -- while the invocation ran (wake_seq moved since the claim); the next invocation may carry
    -- a delta only after one answered by an SDK that reads them (p_acked). Answers whether the
    -- lease was still p_token's. Touches only this run's rows. (The earliest timer is read
    -- first: only the invocation holding the lease changes the run's steps.)
    SELECT min(coalesce(s.wake_at, s.timeout_at)) INTO v_timer FROM steps s
    WHERE s.run_id = p_run AND s.status IN ('sleeping', 'retrying', 'waiting');
    UPDATE runs SET
        lease_token = NULL, lease_owner = NULL, invoke_attempts = 0, undelivered_since = NULL,
        history_acked = CASE WHEN p_acked THEN runs.invocation_id END,
        ready_at = CASE
            WHEN runs.wake_seq <> runs.claimed_wake_seq THEN v_now
            ELSE least(runs.deadline_at, v_timer)
            END
    WHERE id = p_run AND project_id = p_project AND lease_token = p_token;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION run_suspend(uuid, uuid, text, boolean) IS 'The suspend transition: the lease released, the run due at its earliest timer or at once when woken meanwhile.';

CREATE FUNCTION run_release(p_run uuid, p_project uuid, p_token text, p_delay_ms double precision)
RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    attempts integer;
    v_now timestamptz := now();
    v_due timestamptz := now() + make_interval(secs => p_delay_ms / 1000);
BEGIN
    -- The release transition after a delivery failure: the invocation holding lease p_token
    -- could not reach the app. The lease is released and the run, still running, is due again
    -- in p_delay_ms (never past its deadline); the delivery window counts from the first
    -- failure of the streak. Answers the failures counted so far (NULL: the lease was lost).
    -- Touches only this run's row.
    UPDATE runs SET
        lease_token = NULL, lease_owner = NULL, invoke_attempts = invoke_attempts + 1,
        undelivered_since = coalesce(undelivered_since, v_now),
        ready_at = least(deadline_at, v_due)
    WHERE id = p_run AND project_id = p_project AND lease_token = p_token
    RETURNING invoke_attempts INTO attempts;
    RETURN attempts;
END
$$;
COMMENT ON FUNCTION run_release(uuid, uuid, text, double precision) IS 'The release transition after a delivery failure: the lease released, the run due again after a backoff.';

CREATE FUNCTION run_request_cancel(p_run uuid, p_project uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The cancel request: a running run becomes cancelling (its next invocation, or the one
    -- holding it, runs its cleanup). Answers whether it was running. Touches only this run's row.
    UPDATE runs SET status = 'cancelling', cancel_requested = true, version = version + 1
    WHERE id = p_run AND project_id = p_project AND status = 'running';
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION run_request_cancel(uuid, uuid) IS 'The cancel request transition: running -> cancelling.';

CREATE FUNCTION run_restart(p_run uuid, p_project uuid, p_trigger text) RETURNS SETOF runs
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now timestamptz := now();
    v_deadline timestamptz;
BEGIN
    -- The restart transition (a retry): the run goes again, due now, its time limit counted
    -- from now; its trigger becomes p_trigger when given (a retry asked for by a person).
    -- Answers the run as it is now. Touches only this run's row.
    SELECT v_now + make_interval(secs => (options ->> 'timeoutMs')::double precision / 1000)
    INTO v_deadline FROM runs WHERE id = p_run AND project_id = p_project;
    RETURN QUERY
    UPDATE runs SET
        trigger = coalesce(p_trigger, trigger),
        status = 'running', output = NULL, error = NULL, ended_at = NULL,
        cancel_requested = false, invoke_attempts = 0, undelivered_since = NULL,
        ready_at = v_now, lease_token = NULL, version = version + 1, history_snapshot = NULL,
        history_invocation = NULL, deadline_at = v_deadline
    WHERE id = p_run AND project_id = p_project
    RETURNING *;
END
$$;
COMMENT ON FUNCTION run_restart(uuid, uuid, text) IS 'The restart transition (a retry): the run goes again, due now.';

CREATE FUNCTION run_continue(p_run uuid, p_project uuid, p_token text, p_input jsonb,
                             OUT generation integer, OUT steps bigint)
RETURNS SETOF record LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The restart transition of continue_as_new: the invocation holding lease p_token ended
    -- the run's generation; the next one starts with input p_input, due now, with no steps
    -- (the history keeps what they did; callbacks still pending are cancelled); the input the
    -- run was started with is kept (first_input). Answers the new generation and the steps
    -- dropped; no row when the lease was lost. Touches only this run's rows.
    UPDATE runs r SET
        first_input = CASE WHEN r.generation = 1 THEN r.input ELSE r.first_input END,
        input = p_input, generation = r.generation + 1, lease_token = NULL, lease_owner = NULL,
        invoke_attempts = 0, undelivered_since = NULL, ready_at = now(), version = r.version + 1,
        history_snapshot = NULL, history_invocation = NULL
    WHERE r.id = p_run AND r.project_id = p_project AND r.lease_token = p_token
      AND r.status IN ('running', 'cancelling')
    RETURNING r.generation INTO run_continue.generation;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    WITH dropped AS (
        DELETE FROM steps s WHERE s.run_id = p_run RETURNING s.callback_id
    ),
    cancelled AS (
        UPDATE callbacks c SET status = 'cancelled', completed_at = now()
        FROM dropped
        WHERE c.run_id = p_run AND c.id = dropped.callback_id AND c.status = 'pending'
    )
    SELECT count(*) INTO run_continue.steps FROM dropped;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION run_continue(uuid, uuid, text, jsonb) IS 'The restart transition of continue_as_new: the next generation starts, due now, with no steps.';

CREATE FUNCTION run_resume(p_run uuid, p_project uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The resume transition: a run set aside by a pause is due again, as of when it was
    -- created (the claims take the resumed runs higher priority first, then oldest; one whose
    -- workflow or app is still paused is set aside again when claimed). Answers whether it was
    -- set aside. Touches only this run's row.
    UPDATE runs SET paused = false, ready_at = least(created_at, deadline_at)
    WHERE id = p_run AND project_id = p_project AND paused;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION run_resume(uuid, uuid) IS 'The resume transition: a run set aside by a pause is due again.';

CREATE FUNCTION run_move(p_run uuid, p_project uuid, p_deployment uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_app uuid;
BEGIN
    -- The move transition: a run not ended goes to deployment p_deployment of its own app (its
    -- next invocation goes to that deployment's URL). Answers whether it moved (false: ended,
    -- not found, or the deployment is not its app's). Touches only this run's row.
    SELECT d.app_id INTO v_app FROM deployments d WHERE d.id = p_deployment;
    UPDATE runs r SET deployment = p_deployment
    WHERE r.id = p_run AND r.project_id = p_project AND r.status IN ('running', 'cancelling')
      AND r.app_id = v_app;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION run_move(uuid, uuid, uuid) IS 'The move transition: a run not ended goes to another deployment of its app.';

CREATE FUNCTION run_repair(p_run uuid, p_project uuid, p_reason text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The repair transition: a run not ended found with no way forward is woken: due now, no
    -- lease, run.repaired {reason} in its history. Answers whether it was repaired. Touches
    -- only this run's row and history.
    UPDATE runs SET ready_at = now(), wake_seq = wake_seq + 1, lease_token = NULL,
                    lease_owner = NULL
    WHERE id = p_run AND project_id = p_project AND ended_at IS NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM append_run_events(p_run, p_project, jsonb_build_array(jsonb_build_object(
        'type', 'run.repaired', 'data', jsonb_build_object('reason', p_reason))));
    RETURN true;
END
$$;
COMMENT ON FUNCTION run_repair(uuid, uuid, text) IS 'The repair transition: a run with no way forward is due now, with run.repaired in its history.';

CREATE FUNCTION run_hold(p_run uuid, p_project uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The hold transition: a due run whose workflow's concurrency cap has no room is held (no
    -- lease, due at its deadline, to be ended then) until release_held makes it due again.
    -- Touches only this run's row.
    UPDATE runs SET held = true, ready_at = deadline_at, lease_token = NULL, lease_owner = NULL
    WHERE id = p_run AND project_id = p_project AND NOT held;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION run_hold(uuid, uuid) IS 'The hold transition: a run over its concurrency cap waits, held, until released.';

CREATE FUNCTION run_unhold(p_run uuid, p_project uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The release of a held run: its concurrency cap has room, it is due now. Touches only
    -- this run's row.
    UPDATE runs SET ready_at = now(), held = false
    WHERE id = p_run AND project_id = p_project AND held;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION run_unhold(uuid, uuid) IS 'A held run released: its concurrency cap has room, it is due now.';

CREATE FUNCTION run_defer(p_run uuid, p_project uuid, p_at timestamptz) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The deferral of a run not yet started by its workflow's rate limit: due at p_at, never
    -- past its deadline. Touches only this run's row.
    UPDATE runs SET ready_at = least(p_at, deadline_at)
    WHERE id = p_run AND project_id = p_project AND started_at IS NULL;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION run_defer(uuid, uuid, timestamptz) IS 'A run not yet started deferred by its rate limit: due later.';

CREATE FUNCTION run_gather_input(p_run uuid, p_project uuid, p_input jsonb, p_append boolean)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_item jsonb := jsonb_build_array(p_input);
    v_object boolean := jsonb_typeof(p_input) = 'object';
BEGIN
    -- A run still gathering starts (not yet due, never leased, not started) takes one more
    -- start's input: a debounce's last start's input replaces it (p_append false; the
    -- concurrency and rate limit keys are read from it as insert_run reads them), a batch's
    -- event data is appended to the list (p_append true). Answers whether the run still
    -- gathers. Touches only this run's row.
    UPDATE runs SET
        input = CASE WHEN p_append THEN coalesce(input, '[]'::jsonb) || v_item
                     ELSE p_input END,
        concurrency_key = CASE WHEN p_append THEN concurrency_key
                               WHEN v_object
                               THEN p_input ->> (options ->> 'concurrencyKey') END,
        rate_key = CASE WHEN p_append THEN rate_key
                        WHEN v_object
                        THEN p_input ->> (options -> 'rateLimit' ->> 'key') END
    WHERE id = p_run AND project_id = p_project AND status = 'running' AND ready_at IS NULL
      AND lease_token IS NULL AND started_at IS NULL;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION run_gather_input(uuid, uuid, jsonb, boolean) IS 'A gathering run takes one more start''s input (a debounce''s replaces it, a batch''s is appended).';

CREATE FUNCTION run_fire(p_run uuid, p_project uuid, p_events jsonb) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now timestamptz := now();
    v_deadline timestamptz;
BEGIN
    -- The fire transition of a gathering: the run that gathered starts is due now, its time
    -- limit counted from now, with p_events (run.debounced or run.batched) in its history.
    -- Answers whether the run still gathered. Touches only this run's row and history.
    SELECT v_now + make_interval(secs => (options ->> 'timeoutMs')::double precision / 1000)
    INTO v_deadline FROM runs WHERE id = p_run;
    UPDATE runs SET ready_at = v_now, deadline_at = v_deadline
    WHERE id = p_run AND project_id = p_project AND status = 'running' AND ready_at IS NULL
      AND lease_token IS NULL AND started_at IS NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM append_run_events(p_run, p_project, p_events);
    RETURN true;
END
$$;
COMMENT ON FUNCTION run_fire(uuid, uuid, jsonb) IS 'The fire transition of a gathering: the run is due now, its time limit from now.';

CREATE FUNCTION run_keep_lease(p_run uuid, p_project uuid, p_token text,
                               p_seconds double precision) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    cancelling boolean;
    v_until timestamptz := now() + make_interval(secs => p_seconds);
BEGIN
    -- The heartbeat: the lease p_token still holds is extended by p_seconds, never past the
    -- run's deadline (a run at its time limit comes due, to be ended). Answers whether a cancel
    -- was requested (NULL: the lease was lost). Touches only this run's row.
    UPDATE runs SET ready_at = least(v_until, deadline_at)
    WHERE id = p_run AND project_id = p_project AND lease_token = p_token
    RETURNING coalesce(cancel_requested, false) INTO cancelling;
    RETURN cancelling;
END
$$;
COMMENT ON FUNCTION run_keep_lease(uuid, uuid, text, double precision) IS 'The heartbeat: a lease still held is extended.';

CREATE FUNCTION run_progress(
    p_run uuid, p_project uuid, p_token text, p_invocation uuid, p_events jsonb, p_seq bigint,
    p_digest text, p_logs_dropped integer, p_changes jsonb, p_callbacks jsonb, p_logs jsonb,
    p_max_lines integer, p_max_bytes bigint,
    OUT applied boolean, OUT cancel_requested boolean
) RETURNS SETOF record LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    was record;
    base bigint;
    kept integer;
    kept_bytes bigint;
    dropped integer;
    v_now timestamptz := now();
BEGIN
    -- The progress transition: the invocation p_invocation holding lease p_token commits its
    -- step changes (p_changes: [{ord (1-based; a step's position is the seq of the ord-th of
    -- p_events), name, kind, status, attempt, output, error, ended, delay_ms, timeout_ms,
    -- at_ms, callback_id, child_run_id, event_name, match}]), the callbacks it created
    -- (p_callbacks: [{id, step_name, timeout_ms}]), its history events (p_events, appended
    -- through append_run_events) and its log lines (p_logs: [{ord, at, level, message, fields,
    -- step_name, size}], kept in order while the run's log has room, p_max_lines lines and
    -- p_max_bytes bytes in all; once a line did not fit, none newer is kept; p_logs_dropped
    -- more were dropped by the app). No row (nothing written: the caller must stop) when the
    -- token or the invocation is not the one holding the run, when the run is past its time
    -- limit, or when the call repeats an applied seq with another body (p_digest: a second
    -- execution of the invocation); the same call sent again (same seq and digest: its answer
    -- was lost) answers applied = false and writes nothing. ready_at (indexed) is left alone
    -- so the run's row is updated in place; the heartbeat extends the lease. Touches only this
    -- run's rows.
    -- The fence, the replay check and the update are one statement: its conditions are
    -- checked again on the row's latest version when another transaction updated it first,
    -- and what it answers of the row (the log counts, which only this function changes, and
    -- cancel_requested) is that version's. The last commit's time (a sleep counts from no
    -- earlier) is read by the subquery, which sees the row as it was before this update.
    UPDATE runs r SET
        progress_at = v_now,
        progress_seq = greatest(r.progress_seq, p_seq),
        progress_digest = CASE WHEN p_seq > 0 THEN p_digest ELSE r.progress_digest END,
        logs_dropped = r.logs_dropped + coalesce(p_logs_dropped, 0)
    WHERE r.id = p_run AND r.project_id = p_project AND r.lease_token = p_token
      AND r.invocation_id = p_invocation AND r.status IN ('running', 'cancelling')
      AND (r.deadline_at IS NULL OR r.deadline_at > v_now)
      AND (p_seq = 0 OR r.progress_seq < p_seq)
    RETURNING r.cancel_requested, r.log_lines, r.log_bytes,
              r.logs_dropped - coalesce(p_logs_dropped, 0) AS logs_dropped,
              (SELECT o.progress_at FROM runs o WHERE o.id = p_run) AS progress_at
    INTO was;
    IF NOT FOUND THEN
        -- Not this invocation's any more, past its time limit, or a seq already applied: the
        -- same call again (its answer was lost) is told so; anything else writes nothing.
        SELECT r.cancel_requested INTO was FROM runs r
        WHERE r.id = p_run AND r.project_id = p_project AND r.lease_token = p_token
          AND r.invocation_id = p_invocation AND r.status IN ('running', 'cancelling')
          AND (r.deadline_at IS NULL OR r.deadline_at > v_now)
          AND p_seq <> 0 AND r.progress_seq = p_seq
          AND r.progress_digest IS NOT DISTINCT FROM p_digest;
        IF FOUND THEN
            applied := false;
            cancel_requested := was.cancel_requested;
            RETURN NEXT;
        END IF;
        RETURN;
    END IF;
    cancel_requested := was.cancel_requested;
    IF p_logs IS NOT NULL THEN
        -- Each line's seq in the run's log and whether it fits (the run is locked by the
        -- update: its counts hold), then the counts.
        WITH lines AS (
            SELECT l.*, was.log_lines + l.ord AS seq,
                   was.logs_dropped = 0 AND was.log_lines + l.ord <= p_max_lines
                   AND was.log_bytes + sum(l.size) OVER (ORDER BY l.ord) <= p_max_bytes AS fits
            FROM jsonb_to_recordset(p_logs) AS l(
                ord integer, at timestamptz, level text, message text, fields jsonb,
                step_name text, size integer)
        ),
        ins AS (
            INSERT INTO run_logs (run_id, seq, project_id, at, level, message, fields, step_name)
            SELECT p_run, l.seq, p_project, l.at, l.level, l.message, l.fields, l.step_name
            FROM lines l WHERE l.fits
        )
        SELECT count(*) FILTER (WHERE fits), coalesce(sum(size) FILTER (WHERE fits), 0),
               count(*) FILTER (WHERE NOT fits)
        INTO kept, kept_bytes, dropped
        FROM lines;
        UPDATE runs r SET
            log_lines = r.log_lines + kept,
            log_bytes = r.log_bytes + kept_bytes,
            logs_dropped = r.logs_dropped + dropped
        WHERE r.id = p_run AND (kept > 0 OR dropped > 0);
    END IF;
    base := append_run_events(p_run, p_project, p_events, p_invocation, true);
    IF p_changes IS NOT NULL THEN
    INSERT INTO steps AS t (run_id, project_id, name, kind, status, position, attempt, output,
                            error, ended_at, wake_at, timeout_at, callback_id, child_run_id,
                            event_name, match, started_at)
    SELECT p_run, p_project, x.name, x.kind, x.status, base + x.ord - 1, x.attempt, x.output,
           x.error,
           CASE WHEN x.ended THEN v_now END,
           -- A sleep counts from when the workflow reached it (at_ms, the app's clock) as far
           -- as that lies between the invocation's last commit and now; else from now.
           CASE WHEN x.delay_ms IS NOT NULL
                THEN CASE WHEN x.at_ms IS NULL THEN v_now
                          ELSE greatest(was.progress_at,
                                        least(v_now, to_timestamp(x.at_ms / 1000.0)))
                     END + make_interval(secs => x.delay_ms::double precision / 1000) END,
           CASE WHEN x.timeout_ms IS NOT NULL
                THEN v_now + make_interval(secs => x.timeout_ms::double precision / 1000) END,
           x.callback_id, x.child_run_id, x.event_name, x.match, v_now
    FROM jsonb_to_recordset(coalesce(p_changes, '[]')) AS x(
        ord integer, name text, kind step_kind, status step_status, attempt integer,
        output jsonb, error jsonb, ended boolean, delay_ms bigint, timeout_ms bigint,
        at_ms bigint, callback_id uuid, child_run_id uuid, event_name text, match jsonb)
    ON CONFLICT (run_id, name) DO UPDATE SET
        status = excluded.status, attempt = excluded.attempt, output = excluded.output,
        error = excluded.error, ended_at = excluded.ended_at, wake_at = excluded.wake_at,
        timeout_at = excluded.timeout_at,
        callback_id = coalesce(excluded.callback_id, t.callback_id),
        child_run_id = coalesce(excluded.child_run_id, t.child_run_id),
        event_name = excluded.event_name, match = excluded.match,
        -- (What DO UPDATE sets comes from excluded: Citus plans no parameter there.)
        started_at = CASE WHEN excluded.status = 'running' THEN excluded.started_at
                          ELSE t.started_at END
    WHERE t.status NOT IN ('completed', 'failed', 'cancelled');
    END IF;
    IF p_callbacks IS NOT NULL THEN
    -- A callback's id is derived from its run and step: an ended one comes back only when a
    -- retry runs its step again, and then it waits anew.
    INSERT INTO callbacks (id, project_id, run_id, step_name, created_at, timeout_at)
    SELECT x.id, p_project, p_run, x.step_name, v_now,
           CASE WHEN x.timeout_ms IS NOT NULL
                THEN v_now + make_interval(secs => x.timeout_ms::double precision / 1000) END
    FROM jsonb_to_recordset(coalesce(p_callbacks, '[]')) AS x(
        id uuid, step_name text, timeout_ms bigint)
    ON CONFLICT ON CONSTRAINT callbacks_pkey DO UPDATE SET
        status = 'pending', body = NULL, created_at = excluded.created_at, completed_at = NULL,
        timeout_at = excluded.timeout_at
    WHERE callbacks.status <> 'pending';
    END IF;
    applied := true;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION run_progress(uuid, uuid, text, uuid, jsonb, bigint, text, integer, jsonb, jsonb, jsonb, integer, bigint) IS 'The progress transition: an invocation''s step changes, callbacks, history and log lines committed under its lease, replays answered once.';

CREATE FUNCTION run_end(
    p_run uuid, p_project uuid, p_token text, p_status run_status, p_output jsonb,
    p_error jsonb, p_event run_event_type, p_data jsonb,
    OUT parent_run_id uuid, OUT parent_step text, OUT schedule_id text, OUT status run_status
) RETURNS SETOF record LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    closed jsonb;
BEGIN
    -- The end transition: a run not ended ends with p_status (its output or error), when
    -- p_token is its lease token or is NULL (a cancel, a time limit). Its open steps are
    -- cancelled (and their pending callbacks), its history gets their step.cancelled events
    -- and the end event p_event (with p_data). Answers what the caller must still settle
    -- (its parent, by resolve_child; its schedule); no row when the run was not this token's
    -- or had ended. Touches only this run's rows: the caller (end_runs) cancels its children,
    -- records its alerts (record_run_alerts) and tells the listeners (stepline_ended), from
    -- the caller's session: on Citus this body runs on the run's worker, where nobody listens
    -- and a reference table is not written.
    UPDATE runs r SET
        status = p_status, output = p_output, error = p_error, ended_at = now(),
        ready_at = NULL, lease_token = NULL, lease_owner = NULL, version = r.version + 1
    WHERE r.id = p_run AND r.project_id = p_project
      AND (p_token IS NULL OR r.lease_token = p_token)
      AND r.status IN ('running', 'cancelling')
    RETURNING r.parent_run_id, r.parent_step, r.schedule_id, r.status
    INTO parent_run_id, parent_step, schedule_id, status;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    WITH c AS (
        UPDATE steps s SET status = 'cancelled', ended_at = now()
        WHERE s.run_id = p_run AND s.status IN ('running', 'retrying', 'sleeping', 'waiting')
        RETURNING s.name, s.kind, s.callback_id
    ),
    cancelled_callbacks AS (
        UPDATE callbacks cb SET status = 'cancelled', completed_at = now()
        FROM c
        WHERE cb.run_id = p_run AND cb.id = c.callback_id AND cb.status = 'pending'
    )
    SELECT jsonb_agg(jsonb_build_object('type', 'step.cancelled', 'step_name', c.name,
                                        'data', jsonb_build_object('kind', c.kind))
                     ORDER BY c.name)
    INTO closed FROM c;
    PERFORM append_run_events(p_run, p_project, coalesce(closed, '[]'::jsonb)
        || jsonb_build_array(jsonb_build_object('type', p_event, 'data', p_data)), NULL, true);
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION run_end(uuid, uuid, text, run_status, jsonb, jsonb, run_event_type, jsonb) IS 'The end transition: a run ends, its open steps cancelled, its history told (its alerts by the caller: record_run_alerts); a child''s end wakes its parent by the caller (resolve_child).';

CREATE FUNCTION run_record_state(p_run uuid, p_items jsonb)
RETURNS SETOF text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now timestamptz := now();
    v_xid xid8 := pg_current_xact_id();
BEGIN
    -- Keeps the value of each state step of run p_run that this transaction wrote (p_items:
    -- [{key, step}], the last set of each key) as the key's current value, read from the step
    -- row itself: a set the steps table already had (a call sent again, a replay) wrote no row
    -- now and changes nothing. Answers the keys it set. Touches only this run's rows (on
    -- Citus it runs on the run's worker, whose transaction wrote the steps: their version is
    -- that transaction's id there); the caller wakes the long polls (stepline_state).
    RETURN QUERY
    INSERT INTO run_state AS t (run_id, key, project_id, value, updated_at)
    SELECT p_run, x.key, s.project_id, s.output, v_now
    FROM jsonb_to_recordset(p_items) AS x(key text, step text), steps s
    WHERE s.run_id = p_run AND s.name = x.step AND s.status = 'completed'
      AND s.version = v_xid AND s.output IS NOT NULL
    ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at
    RETURNING t.key;
END
$$;
COMMENT ON FUNCTION run_record_state(uuid, jsonb) IS 'A run''s published state kept from the state steps its transaction wrote (the keys set).';

CREATE FUNCTION record_run_alerts(p_project uuid, p_run uuid, p_workflow text,
                                  p_status run_status, p_error jsonb)
RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    recorded integer;
BEGIN
    -- A run of p_workflow that ended failed or timedOut records one notification per alert
    -- listening for it (run.failed, run.timedOut, and app.unreachable for a failure with code
    -- app_unreachable), at most one per alert, run and type; answers how many it recorded.
    -- (PL/pgSQL: Citus plans a SQL function's INSERT with its parameters in it as a whole,
    -- and refuses it.)
    INSERT INTO alert_notifications (id, project_id, alert_id, type, run_id, data)
    SELECT gen_random_uuid(), p_project, a.id, t.type, p_run,
           jsonb_build_object('workflow', p_workflow, 'status', p_status, 'error', p_error)
    FROM (VALUES
        (CASE p_status WHEN 'failed' THEN 'run.failed' WHEN 'timedOut' THEN 'run.timedOut' END),
        (CASE WHEN p_status = 'failed' AND p_error ->> 'code' = 'app_unreachable'
              THEN 'app.unreachable' END)) AS t (type)
    JOIN alerts a ON a.project_id = p_project AND t.type = ANY (a.types)
                 AND (a.workflow IS NULL OR a.workflow = p_workflow)
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS recorded = ROW_COUNT;
    RETURN recorded;
END
$$;
COMMENT ON FUNCTION record_run_alerts(uuid, uuid, text, run_status, jsonb) IS 'The alerts told of a run''s end (end_runs calls it for each run it ends, from the caller''s session).';

CREATE FUNCTION singleton_id(p_project uuid, p_workflow text, p_key text)
RETURNS uuid LANGUAGE sql IMMUTABLE AS $$
    SELECT md5(jsonb_build_array(p_project, p_workflow, p_key)::text)::uuid
$$;
COMMENT ON FUNCTION singleton_id(uuid, text, text) IS 'The id of a singleton key''s row in run_singletons: a hash of its environment, workflow and value.';

CREATE FUNCTION take_singleton(p_project uuid, p_workflow text, p_key text, p_run uuid)
RETURNS uuid LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_id uuid := singleton_id(p_project, p_workflow, p_key);
    v_holder uuid;
BEGIN
    -- Run p_run takes singleton key p_key of workflow p_workflow (environment p_project), unless
    -- another run not ended holds it: answers that run (and takes nothing), else NULL. No key
    -- (NULL) is never held. The key's row is locked until the caller's transaction ends, so two
    -- takers of one key take turns; each statement sees what the one before it committed. On
    -- Citus this runs on the coordinator: the key's row and the runs may be on other shards.
    IF p_key IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO run_singletons (id, run_id) VALUES (v_id, p_run) ON CONFLICT (id) DO NOTHING;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    SELECT s.run_id INTO v_holder FROM run_singletons s WHERE s.id = v_id FOR UPDATE;
    IF v_holder <> p_run AND EXISTS (
        SELECT 1 FROM runs r
        WHERE r.id = v_holder AND r.ended_at IS NULL AND r.project_id = p_project
          AND r.workflow = p_workflow AND r.singleton_key = p_key) THEN
        RETURN v_holder;
    END IF;
    UPDATE run_singletons SET run_id = p_run WHERE id = v_id;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION take_singleton(uuid, text, text, uuid) IS 'A run takes its singleton key (a start, a retry): NULL when it holds it now, else the run not ended that does.';

CREATE FUNCTION run_begin(
    p_run uuid, p_project uuid, p_token text, p_invocation uuid, p_attempt integer,
    p_deltas boolean, p_lead double precision, p_inline_max integer, p_deployment text
) RETURNS TABLE (
    name text, kind step_kind, status step_status, "position" bigint, attempt integer,
    output jsonb, output_bytes integer, output_digest text, error jsonb, wake_at timestamptz,
    callback_id uuid, child_run_id uuid, callback_status text, blocked boolean,
    wait_s double precision, late_s double precision, history_base uuid,
    history_steps bigint, history_bytes bigint
) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_deployment text;
    v_since pg_snapshot;
    v_base uuid;
    v_again boolean;
    v_now timestamptz := now();
    v_db text := stepline_database_id();
    v_snapshot pg_snapshot;
BEGIN
    -- The begin transition: the invocation p_invocation (attempt p_attempt) of the run leased
    -- to p_token begins, unless the lease went stale (no row: another orchestrator may hold the
    -- run now). What came due is settled (sleeps complete, those ending within p_lead seconds
    -- too, as of their end; event waits past their timeout complete with null; callbacks past
    -- theirs fail as timed out) and the invocation's start is recorded (invocation.started, with
    -- p_deployment, the deployment it goes to, which the caller read with the lease: the run's,
    -- else the app's last known one). Answers the run's
    -- steps in the order they were first recorded (a run with no steps to send: one row whose
    -- name is null): every step (history_base null) when its last invocation is not known or
    -- was not answered by an SDK that reads deltas (history_acked), or p_deltas is false, else
    -- only those written by transactions the snapshot that invocation read under did not see,
    -- the open ones and those settled here; the snapshot taken here is kept for the next
    -- invocation, taken in this database (history_db: not a dump restored elsewhere). Each row
    -- says the size of the whole history (history_steps, history_bytes); wait_s, in how many
    -- seconds the last sleep settled ends (the app must not be called before); blocked marks a
    -- retrying step whose next attempt is not due then; a result over p_inline_max bytes comes
    -- back as null with its output_bytes and output_digest; late_s, for a timer settled here,
    -- how many seconds ago it was due (negative: claimed ahead; only sleeps are settled ahead).
    -- A begin tried again after its commit went through unseen finds its invocation already
    -- begun: it records and settles nothing more and sends every step. Touches only this run's
    -- rows.
    SELECT CASE WHEN coalesce(p_deltas, true) AND r.history_db = v_db
                     AND r.history_acked = r.history_invocation
                     AND r.history_invocation IS DISTINCT FROM p_invocation
                THEN r.history_snapshot END,
           r.history_invocation,
           r.history_invocation IS NOT DISTINCT FROM p_invocation
    INTO v_since, v_base, v_again
    FROM runs r
    WHERE r.id = p_run AND r.project_id = p_project AND r.lease_token = p_token
      AND r.status IN ('running', 'cancelling')
    FOR UPDATE OF r;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_deployment := p_deployment;
    -- (Taken before the steps are read: a step written in between is sent now and again next
    -- time, never missed.)
    v_snapshot := pg_current_snapshot();
    RETURN QUERY
    WITH resolved AS (
        UPDATE steps SET
            status = CASE WHEN steps.kind = 'callback' THEN 'failed' ELSE 'completed' END::step_status,
            error = CASE WHEN steps.kind = 'callback'
                THEN '{"type": "CallbackTimeout", "code": "callback_timeout", "message": "the callback was not completed in time"}'::jsonb END,
            ended_at = greatest(v_now, CASE WHEN steps.status = 'sleeping' THEN steps.wake_at
                                            ELSE steps.timeout_at END)
        WHERE steps.run_id = p_run AND NOT v_again
          AND ((steps.status = 'sleeping'
                AND steps.wake_at <= v_now + make_interval(secs => p_lead))
               OR (steps.status = 'waiting' AND steps.kind IN ('event', 'callback')
                   AND steps.timeout_at <= v_now))
        RETURNING steps.name, steps.kind, steps.callback_id, steps.status, steps.error,
                  steps.ended_at
    ),
    timed_out AS (
        UPDATE callbacks c SET status = 'timedOut', completed_at = resolved.ended_at
        FROM resolved
        WHERE c.run_id = p_run AND c.id = resolved.callback_id AND c.status = 'pending'
    ),
    -- When the invocation may start: now, or when the last sleep settled ends.
    starts AS (
        SELECT greatest(v_now, max(rv.ended_at)) AS at FROM resolved rv
    ),
    evs AS (
        SELECT jsonb_agg(jsonb_build_object('at', x.at, 'type', x.type, 'step_name', x.name,
                                            'invocation_id', x.invocation_id,
                                            'deployment_id', x.deployment_id, 'data', x.data)
                         ORDER BY x.k, x.at, x.name) AS events
        FROM (
            SELECT 0 AS k, rv.ended_at AS at,
                   CASE WHEN rv.kind = 'callback' THEN 'step.failed' ELSE 'step.completed' END
                       AS type,
                   rv.name, NULL::uuid AS invocation_id, NULL::text AS deployment_id,
                   CASE WHEN rv.kind = 'sleep' THEN jsonb_build_object('kind', rv.kind)
                        ELSE jsonb_build_object('kind', rv.kind, 'timedOut', true) END AS data
            FROM resolved rv
            UNION ALL
            SELECT 1, starts.at, 'invocation.started', NULL, p_invocation, v_deployment,
                   jsonb_build_object('attempt', p_attempt)
            FROM starts WHERE NOT v_again
        ) x
    ),
    -- The run's snapshot for the next invocation, and its history (appended once its row is
    -- updated: this reads r).
    r AS (
        UPDATE runs SET history_snapshot = v_snapshot,
                        history_invocation = p_invocation, history_db = v_db
        FROM evs WHERE runs.id = p_run AND evs.events IS NOT NULL
        RETURNING runs.id, evs.events
    ),
    history AS (
        SELECT append_run_events(p_run, p_project, r.events, NULL, true) AS seq FROM r
    ),
    size AS (
        SELECT count(*) AS steps, coalesce(sum(a.output_bytes), 0)::bigint AS bytes
        FROM steps a WHERE a.run_id = p_run
    )
    -- The steps to send as read before this statement, with what it just settled laid over.
    SELECT s.name, s.kind, s.status, s.position, s.attempt, s.output, s.output_bytes,
           s.output_digest, s.error, s.wake_at, s.callback_id, s.child_run_id,
           s.callback_status,
           coalesce(s.status = 'retrying' AND s.wake_at > starts.at, false) AS blocked,
           extract(epoch FROM starts.at - v_now)::double precision AS wait_s, s.late_s,
           CASE WHEN v_since IS NOT NULL THEN v_base END AS history_base,
           size.steps AS history_steps, size.bytes AS history_bytes
    FROM starts
    CROSS JOIN size
    -- (The history is appended: a join the planner cannot drop reads it.)
    CROSS JOIN (SELECT count(*) AS n FROM history) h
    LEFT JOIN LATERAL (
        SELECT s.name, s.kind, coalesce(rv.status, s.status) AS status, s.position, s.attempt,
               CASE WHEN s.output_bytes > p_inline_max THEN NULL ELSE s.output END AS output,
               s.output_bytes, s.output_digest, coalesce(rv.error, s.error) AS error, s.wake_at,
               s.callback_id, s.child_run_id,
               CASE WHEN rv.kind = 'callback' THEN 'timedOut'
                    ELSE (SELECT c.status FROM callbacks c
                          WHERE c.run_id = p_run AND c.id = s.callback_id)
               END AS callback_status,
               CASE WHEN rv.name IS NOT NULL
                    THEN extract(epoch FROM v_now - CASE WHEN s.status = 'sleeping'
                                                         THEN s.wake_at
                                                         ELSE s.timeout_at END)::double precision
               END AS late_s
        FROM steps s
        LEFT JOIN resolved rv ON rv.name = s.name
        WHERE s.run_id = p_run
          AND (v_since IS NULL OR NOT pg_visible_in_snapshot(s.version, v_since)
               OR s.status NOT IN ('completed', 'failed', 'cancelled') OR rv.name IS NOT NULL)
    ) s ON true
    WHERE h.n >= 0
    ORDER BY s.position;
END
$$;
COMMENT ON FUNCTION run_begin(uuid, uuid, text, uuid, integer, boolean, double precision, integer, text) IS 'The begin transition: an invocation of a leased run begins, timers due settled, its start in the history; answers the steps to send.';
