-- A run's history is written in one place. The event types are an enum (each value's
-- transition named in the type's comment), and append_run_events is the only writer of
-- run_events and the only place a run's next_seq moves: every transition appends through it.
-- (Changing the column's type rewrites run_events once.)

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

ALTER TABLE run_events ALTER COLUMN type TYPE run_event_type USING type::run_event_type;

CREATE FUNCTION append_run_events(p_run uuid, p_project uuid, p_events jsonb,
                                  p_invocation uuid DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n integer := coalesce(jsonb_array_length(p_events), 0);
    base bigint;
BEGIN
    -- Appends p_events (a JSON array of {type, step_name, invocation_id, deployment_id,
    -- http_status, duration_ms, data, at}; invocation_id defaults to p_invocation, at to now())
    -- to run p_run's history, numbered after its last event; answers the first event's seq
    -- (NULL when p_events is empty or the run is not p_project's). The run's row is updated
    -- (next_seq), so two transactions appending to one run take turns and the seqs have no
    -- gap. The only writer of run_events.
    IF n = 0 THEN
        RETURN NULL;
    END IF;
    UPDATE runs SET next_seq = next_seq + n
    WHERE id = p_run AND project_id = p_project
    RETURNING next_seq - n INTO base;
    IF base IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO run_events (run_id, seq, project_id, at, type, step_name, invocation_id,
                            deployment_id, http_status, duration_ms, data)
    SELECT p_run, base + x.ord - 1, p_project, coalesce(x.at, now()), x.type, x.step_name,
           coalesce(x.invocation_id, p_invocation), x.deployment_id, x.http_status,
           x.duration_ms, x.data
    FROM ROWS FROM (jsonb_to_recordset(p_events) AS (
        type run_event_type, step_name text, invocation_id uuid, deployment_id text,
        http_status integer, duration_ms integer, data jsonb, at timestamptz))
        WITH ORDINALITY AS x(type, step_name, invocation_id, deployment_id, http_status,
                             duration_ms, data, at, ord);
    RETURN base;
END
$$;
COMMENT ON FUNCTION append_run_events(uuid, uuid, jsonb, uuid) IS 'Appends events to a run''s history and answers the first one''s seq: the only writer of run_events and of runs.next_seq.';

CREATE FUNCTION run_wake(p_run uuid, p_project uuid, p_events jsonb DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The wake transition: something outside the run (a callback completed, an event received,
    -- a child's end, a cancel request, a child deleted) moved it. A run not ended is due now,
    -- or, while an invocation holds it, right after that invocation (woken_ready_at: its end
    -- sees wake_seq moved and makes it due), and p_events (what woke it) are appended to its
    -- history. Answers whether the run was woken (false: ended, or not p_project's; nothing is
    -- appended). Touches only this run's row and history: a child's end wakes its parent by the
    -- caller calling this for the parent (store.children.resolve_child).
    UPDATE runs SET wake_seq = wake_seq + 1, ready_at = woken_ready_at(lease_token, ready_at)
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
BEGIN
    -- The suspend transition: the invocation holding lease p_token ended with the run still
    -- running. The lease is released and the run comes due at its earliest timer (a sleep, a
    -- retry, a wait's timeout; its deadline at the latest), or at once when something woke it
    -- while the invocation ran (wake_seq moved since the claim); the next invocation may carry
    -- a delta only after one answered by an SDK that reads them (p_acked). Answers whether the
    -- lease was still p_token's. Touches only this run's row.
    UPDATE runs SET
        lease_token = NULL, lease_owner = NULL, invoke_attempts = 0, undelivered_since = NULL,
        history_acked = CASE WHEN p_acked THEN runs.invocation_id END,
        ready_at = CASE
            WHEN runs.wake_seq <> runs.claimed_wake_seq THEN now()
            ELSE least(runs.deadline_at, (
                SELECT min(coalesce(s.wake_at, s.timeout_at)) FROM steps s
                WHERE s.run_id = p_run AND s.status IN ('sleeping', 'retrying', 'waiting')))
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
BEGIN
    -- The release transition after a delivery failure: the invocation holding lease p_token
    -- could not reach the app. The lease is released and the run, still running, is due again
    -- in p_delay_ms (never past its deadline); the delivery window counts from the first
    -- failure of the streak. Answers the failures counted so far (NULL: the lease was lost).
    -- Touches only this run's row.
    UPDATE runs SET
        lease_token = NULL, lease_owner = NULL, invoke_attempts = invoke_attempts + 1,
        undelivered_since = coalesce(undelivered_since, now()),
        ready_at = least(deadline_at, now() + make_interval(secs => p_delay_ms / 1000))
    WHERE id = p_run AND project_id = p_project AND lease_token = p_token
    RETURNING invoke_attempts INTO attempts;
    RETURN attempts;
END
$$;
COMMENT ON FUNCTION run_release(uuid, uuid, text, double precision) IS 'The release transition after a delivery failure: the lease released, the run due again after a backoff.';
