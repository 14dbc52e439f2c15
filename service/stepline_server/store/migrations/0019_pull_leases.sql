-- The leased runs of each pull app, for a worker's poll that looks for leases their workers
-- lost (lost_pull_leases, pull.sql): a few per worker, however many runs wait for a worker.
CREATE INDEX runs_pull_leased ON runs (app_id, ready_at) WHERE pull AND lease_token IS NOT NULL;
