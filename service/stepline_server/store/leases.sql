-- Leasing a run outside the claim loops: a run just started, or just woken by a callback, is
-- given to the orchestrator that handled the request, through the one lease transition.

-- name: lease_now
-- Leases run $1 to $2 for $3 seconds (lease_runs, with the caller's runs in flight $4 and
-- whether lapsed leases may be taken over $5) when nothing gates it: not a pull app's (its
-- workers' polls lease it), not of a workflow with a concurrency cap (claim_capped counts the
-- room), not a rate-limited run not yet started (claim_rate_limited counts the window).
SELECT * FROM lease_runs(
    ARRAY(SELECT id FROM runs
          WHERE id = $1 AND NOT pull AND NOT options ? 'concurrency'
            AND (NOT options ? 'rateLimit' OR started_at IS NOT NULL)),
    $2, $3, $4, $5);
