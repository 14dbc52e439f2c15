"""JSON sent by a person or a client, parsed and checked one way for every route and form.

Fields the API and the dashboard both take are checked by the same pydantic models, whose
refusals :func:`invalid_fields` words once (``invalid fields: …``, each field named); a URL the
orchestrator is to call is an :data:`AppUrl`.

The API's request bodies (:func:`stepline_server.api.responses.read_json`) and the dashboard's
JSON fields (a callback's body, an event's data) both go through :func:`parse`, so a form
accepts exactly what its REST route does: JSON of at most 1 MiB that can be stored and sent
back unchanged (no NUL characters or lone surrogates, nesting at most 64 levels, integers
within 64 bits, no NaN or Infinity, ``1e400`` included).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import orjson
from pydantic import AfterValidator, Field, ValidationError

from stepline import wire
from stepline_server.engine import egress

MAX_BYTES = 1024 * 1024
# A run of 20 digits may be an integer past 64 bits: such a text is parsed again exactly.
_LONG_NUMBER = re.compile(rb"\d{20}")


class BadPayload(Exception):
    """Why the JSON was refused: ``code`` is the API's (``invalid_json`` for text that is not
    JSON, ``validation_failed`` for JSON that cannot be stored, ``payload_too_large``)."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.details = code, message, details or {}


def parse(raw: bytes, *, what: str = "the request body", limit: int = MAX_BYTES) -> Any:
    """``raw`` (non-empty JSON text) decoded and checked; :class:`BadPayload` when refused."""
    if len(raw) > limit:
        raise BadPayload("payload_too_large", f"{what} is larger than {limit} bytes")
    try:
        data = orjson.loads(raw)  # refuses NaN, Infinity and numbers that overflow (1e400)
        if _LONG_NUMBER.search(raw):  # orjson turns integers past 64 bits into floats
            data = wire.loads(raw)
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise BadPayload("invalid_json", f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        data = [[]] * (wire.MAX_DEPTH + 1)  # refused just below
    found = wire.payload_problem_at(data)
    if found:
        where, problem = found
        raise BadPayload(
            "validation_failed",
            f"{what} cannot be stored: {problem}",
            {"fields": {where or "body": problem}},
        )
    return data


def parse_text(text: str, *, what: str) -> Any:
    """A form field's JSON text, checked as :func:`parse` checks a body."""
    return parse(text.encode("utf-8", "surrogatepass"), what=what)


AppUrl = Annotated[str, Field(max_length=egress.MAX_URL), AfterValidator(egress.app_url)]
"""A URL the orchestrator is to call (an app's, an alert's destination), in the form it sends."""


def invalid_fields(exc: ValidationError) -> BadPayload:
    """A pydantic refusal as ``validation_failed`` naming each bad field (dotted: ``a.b``)."""
    fields = {".".join(str(p) for p in e["loc"]) or "body": e["msg"] for e in exc.errors()}
    names = ", ".join(fields)
    return BadPayload("validation_failed", f"invalid fields: {names}", {"fields": fields})
