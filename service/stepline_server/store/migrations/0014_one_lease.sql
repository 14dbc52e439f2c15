-- One run state machine. A run is leased in one place (lease_runs), whatever path leases it:
-- due runs, capped and rate-limited runs, pull polls, a completed callback's fast path, a run
-- started and invoked at once. The fence (never lease again a run the caller still invokes,
-- never take a live lease, no takeovers just after the database was away) and pausing live
-- inside it, so no caller can forget them. What an invocation is sent (a delta or the whole
-- history) is decided against the database's identity and the app's protocol version.

-- Pausing: while a workflow or its app is paused, none of its runs is leased to be invoked.
ALTER TABLE workflows ADD COLUMN paused_at timestamptz;
COMMENT ON COLUMN workflows.paused_at IS 'When the workflow was paused (NULL: not paused): none of its runs is invoked until it is resumed.';
ALTER TABLE apps ADD COLUMN paused_at timestamptz;
COMMENT ON COLUMN apps.paused_at IS 'When the app was paused (NULL: not paused): none of its runs is invoked until it is resumed.';
ALTER TABLE runs ADD COLUMN paused boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN runs.paused IS 'Due while its workflow or app was paused: set aside (ready_at at its deadline, no lease) until the pause ends.';
CREATE INDEX runs_paused ON runs (project_id, workflow, priority DESC, created_at) WHERE paused;

-- A run continued as new keeps the input it was started with: a start naming its run key with
-- that input answers the run (idempotent), whatever generation it is in.
ALTER TABLE runs ADD COLUMN first_input jsonb;
COMMENT ON COLUMN runs.first_input IS 'The input the run was started with, once it has continued as new (input is then the current generation''s); NULL while it is in its first generation.';

-- The protocol an app speaks, as its last sync declared it (1: whole histories only).
ALTER TABLE apps ADD COLUMN protocol_version integer NOT NULL DEFAULT 1 CHECK (protocol_version >= 1);
COMMENT ON COLUMN apps.protocol_version IS 'The protocol version the app declared at its last sync (1 when it declared none): only features of that version are used when invoking it.';
ALTER TABLE apps ADD COLUMN sdk_version text;
COMMENT ON COLUMN apps.sdk_version IS 'The SDK version the app declared at its last sync.';

-- The database a run's history snapshot was taken in: a snapshot of another cluster (a
-- pg_dump restored, a logical copy) says nothing of this one's transactions.
ALTER TABLE runs ADD COLUMN history_db text;
COMMENT ON COLUMN runs.history_db IS 'stepline_database_id() of the database history_snapshot was taken in: in any other, the next invocation gets every step.';

CREATE FUNCTION stepline_database_id() RETURNS text LANGUAGE sql STABLE AS $$
    SELECT (SELECT system_identifier FROM pg_control_system())::text || '/'
           || (SELECT oid FROM pg_database WHERE datname = current_database())::text
$$;
COMMENT ON FUNCTION stepline_database_id() IS 'This database''s identity: the cluster''s system identifier and the database''s oid. A dump restored elsewhere, or a logical copy, has another.';

-- What every lease answers: one shape for every caller.
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
           taken_over, a.url, a.signing_secrets, a.protocol_version
    FROM apps a WHERE a.id = r.app_id
$$;
COMMENT ON FUNCTION lease_claim_of(runs, double precision, boolean) IS 'A leased run as every lease answers it (lease_runs, and a pull worker''s answer recorded under its lease).';

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
               OR (_takeovers AND r.ready_at IS NOT NULL AND r.ready_at <= now()))
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

CREATE FUNCTION woken_ready_at(lease_token text, ready_at timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN lease_token IS NULL THEN now() ELSE ready_at END
$$;
COMMENT ON FUNCTION woken_ready_at(text, timestamptz) IS 'The wake rule: a run woken from outside (a callback, an event, a child''s end, a cancel) is due now, or, while an invocation holds it, right after that invocation (whose end sees wake_seq moved and makes it due).';

-- The way-forward check reads the runs with no due time only.
CREATE INDEX runs_without_due ON runs (id) WHERE ready_at IS NULL AND ended_at IS NULL;
