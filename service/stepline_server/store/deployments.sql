-- Which deployment of an app the orchestrator expects: the one it last answered or synced with.

-- name: app_answered_with
-- An invocation's answer named deployment $2: the app's next invocations expect it (their
-- invocation.started events carry it), as a sync would have recorded it.
UPDATE apps SET deployment_id = $2
WHERE id = $1 AND deployment_id IS DISTINCT FROM $2;
