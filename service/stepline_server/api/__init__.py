"""The REST API: routes, auth, errors, pagination; rules come from engine, data from store."""
