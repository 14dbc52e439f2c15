-- Each orchestrator says, while it reaches the database, since when it has without a break: a
-- pull app's lease that lapsed while the orchestrator that gave it was serving was lost by the
-- worker (the user's process), and whichever orchestrator takes the run over counts the loss
-- first; while that orchestrator may beat yet, the lease is left. A lapsed lease of an
-- orchestrator that stopped beating or lost the database is taken over with no count.
CREATE TABLE orchestrators (
    owner text PRIMARY KEY,
    serving_since timestamptz NOT NULL,
    seen_at timestamptz NOT NULL
);
COMMENT ON TABLE orchestrators IS 'The orchestrators that beat lately, one row each (its lease_owner); a row unseen for a day is forgotten.';
COMMENT ON COLUMN orchestrators.serving_since IS 'Since when the orchestrator has been up and reaching the database without a break, as of its last beat.';
COMMENT ON COLUMN orchestrators.seen_at IS 'Its last beat: written every third of a lease while it reaches the database.';

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

CREATE OR REPLACE FUNCTION lease_runs(
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
