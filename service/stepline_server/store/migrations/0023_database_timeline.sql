-- A promotion (a failover to a standby) keeps the cluster's system identifier, yet under
-- asynchronous replication what the old primary committed after the last record the standby
-- received is gone, and the new timeline may give its transaction ids to others: a history
-- snapshot taken before says nothing true of the transactions after. The database's identity
-- names its timeline too, so after a promotion every run's next invocation gets every step
-- (and the app lets go of the history and the parked execution it kept).
CREATE OR REPLACE FUNCTION stepline_database_id() RETURNS text LANGUAGE sql STABLE AS $$
    SELECT (SELECT system_identifier FROM pg_control_system())::text || '/'
           || (SELECT oid FROM pg_database WHERE datname = current_database())::text || '/'
           || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)
$$;
COMMENT ON FUNCTION stepline_database_id() IS 'This database''s identity: the cluster''s system identifier, the database''s oid and the timeline (on a primary). A dump restored elsewhere, a logical copy, or a standby promoted has another.';
