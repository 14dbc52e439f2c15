"""``db.constraint_name``: a violation's constraint as the schema names it, on plain PostgreSQL
(the field asyncpg reads) and as Citus relays a shard's (in the message, with the shard's id)."""

from __future__ import annotations

import asyncpg

from stepline_server.store import db


def _violation(message: str, constraint: str | None) -> asyncpg.UniqueViolationError:
    exc = asyncpg.UniqueViolationError(message)
    exc.constraint_name = constraint  # type: ignore[attr-defined]
    return exc


def test_the_field_names_it_on_plain_postgresql() -> None:
    exc = _violation("duplicate key", "apps_project_id_name_key")
    assert db.constraint_name(exc) == "apps_project_id_name_key"


def test_a_shards_copy_relayed_in_the_message_names_the_schemas() -> None:
    exc = _violation(
        'duplicate key value violates unique constraint "apps_project_id_name_key_102014"', None
    )
    assert db.constraint_name(exc) == "apps_project_id_name_key"


def test_a_name_ending_in_a_short_number_is_kept_and_none_is_none() -> None:
    assert db.constraint_name(_violation("x", "keys_v2")) == "keys_v2"
    assert db.constraint_name(_violation("no name here", None)) is None
