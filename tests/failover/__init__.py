"""The failover test: the chaos load on a pg_auto_failover formation whose primary dies."""
