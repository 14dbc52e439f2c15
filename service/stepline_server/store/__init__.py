"""PostgreSQL: the pool, named queries, schema and migrations; the only place with SQL."""
