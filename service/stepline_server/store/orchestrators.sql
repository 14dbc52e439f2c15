-- The orchestrators' own beats: which are alive, and since when each has reached the database.

-- name: orchestrator_seen
-- Orchestrator $1 beats: it has been up and reaching the database for the last $2 seconds.
INSERT INTO orchestrators (owner, serving_since, seen_at)
VALUES ($1, now() - make_interval(secs => $2::double precision), now())
ON CONFLICT (owner) DO UPDATE SET serving_since = excluded.serving_since,
                              seen_at = excluded.seen_at;

-- name: forget_orchestrators
-- Rows of orchestrators unseen for a day (they stopped long ago).
DELETE FROM orchestrators WHERE seen_at < now() - interval '1 day';
