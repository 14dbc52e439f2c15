"""The SDK's side channel: step progress committed while an invocation runs.

The answer has :class:`stepline.protocol.ProgressResponse`'s shape. The call is made once per
step, so :class:`ProgressFastPath` answers it ahead of Starlette's routing and request objects;
the route in ``app.py`` (the same :func:`commit_progress`) serves it when the app is mounted
without the wrapper.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import TYPE_CHECKING, Any

import orjson
import structlog
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from stepline import wire
from stepline.protocol import ProgressRequest
from stepline_server.api import patience
from stepline_server.api.context import orch
from stepline_server.api.errors import (
    ApiError,
    InvalidJson,
    PayloadTooLarge,
    StaleInvocation,
    Unauthorized,
    Unavailable,
    ValidationFailed,
    error_body,
    error_headers,
    from_validation,
)
from stepline_server.api.responses import json_response
from stepline_server.application import actions
from stepline_server.engine.steps import InvalidUpdate, plan_updates
from stepline_server.store import db
from stepline_server.store import progress as step_progress

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from stepline_server.orchestrator import Orchestrator

log = structlog.get_logger("stepline.api")

MAX_PROGRESS_BODY = 16 * 1024 * 1024
MAX_RESULT_BYTES = 1024 * 1024
PROGRESS_ROUTE = "/v1/invocations/{invocationId}/progress"


def authorize(o: Orchestrator, invocation: str, authorization: str) -> tuple[uuid.UUID, str]:
    """The invocation's id and lease from the path and the bearer token, checked before the
    body is read. A token this orchestrator did not make for that invocation is
    ``401 unauthorized``; a token it made, for an invocation that no longer owns the run, is
    refused later as ``409 stale_invocation`` (the SDK stops running the workflow on it)."""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("send the invocation's token as 'Authorization: Bearer <token>'")
    try:
        invocation_id = uuid.UUID(invocation)
    except ValueError:  # no token is made for an id that is not one
        raise Unauthorized("the token is not this invocation's") from None
    lease = o.signer.lease_of(str(invocation_id), token.strip())
    if lease is None:
        raise Unauthorized("the token is not this invocation's")
    return invocation_id, lease


async def commit_progress(
    o: Orchestrator, invocation_id: uuid.UUID, lease: str, raw: bytes
) -> dict[str, Any]:
    """Commit a progress call (``raw``, its body) for the invocation holding the run."""
    if not raw.strip():
        raise InvalidJson("the request body is empty; send a JSON object")
    try:
        call = ProgressRequest.model_validate_json(raw)  # parsed and checked in one pass
    except ValidationError as exc:
        problems = exc.errors()
        if problems[0]["type"] == "json_invalid":
            raise InvalidJson(f"the request body is not valid JSON: {problems[0]['msg']}") from None
        if problems[0]["type"] == "model_type":
            raise ValidationFailed("the request body must be a JSON object") from None
        raise from_validation(exc) from None
    if len(raw) > MAX_RESULT_BYTES:
        _check_result_sizes(call)  # a small body cannot hold a large result
    _check_storable(call)
    try:
        run_id = uuid.UUID(call.run_id)
        plan = plan_updates(
            call.run_id, call.updates, call.logs, call.logs_dropped, generation=call.generation
        )
    except (ValueError, InvalidUpdate) as exc:
        raise ValidationFailed(str(exc)) from None
    digest = hashlib.blake2b(raw, digest_size=16).hexdigest()
    item = step_progress.Progress(run_id, lease, invocation_id, plan, seq=call.seq, digest=digest)
    done = await _apply(o, item)
    if done is None:
        raise StaleInvocation("this invocation no longer owns the run; stop running it")
    base = o.settings.base_url
    callbacks = {
        name: {"id": cid, "url": o.signer.url(base, cid)} for cid, name, _ in plan.callbacks
    }
    return {"cancelRequested": done.row["cancel_requested"], "callbacks": callbacks}


async def _apply(o: Orchestrator, item: step_progress.Progress) -> step_progress.Committed | None:
    """Commit the call, waiting out a database that is briefly away (a restart, a failover)
    rather than failing the step: the call is fenced by its lease and de-duplicated by its seq
    and digest, so a try whose commit was lost comes back as applied."""
    return await patience.patiently(lambda _again: actions.apply_progress(o, item), "progress")


def _check_storable(call: ProgressRequest) -> None:
    """Refuse (422, nothing committed) an update or a log line PostgreSQL cannot store or the
    invocation body could not carry back: NUL characters, deep nesting, integers past 64
    bits."""
    for update in call.updates:
        problem = wire.payload_problem(update.output) or wire.payload_problem(
            update.model_dump(mode="python", exclude={"output"})
        )
        if problem:
            raise ValidationFailed(
                f"step {update.name!r} cannot be stored: {problem}", {"step": update.name}
            )
    for n, line in enumerate(call.logs):
        problem = wire.payload_problem(line.message) or wire.payload_problem(line.fields)
        if problem or (line.step_name and "\x00" in line.step_name):
            raise ValidationFailed(
                f"log line {n} cannot be stored: {problem or 'NUL in stepName'}",
                {"fields": {f"logs.{n}": problem or "NUL in stepName"}},
            )


def _check_result_sizes(call: ProgressRequest) -> None:
    """Refuse a step result over the 1 MiB limit (the SDK checks it too)."""
    for update in call.updates:
        if update.output is not None and len(orjson.dumps(update.output)) > MAX_RESULT_BYTES:
            raise PayloadTooLarge(
                f"the result of step {update.name!r} is larger than 1 MiB", {"step": update.name}
            )


async def progress(request: Request) -> Response:
    o = orch(request)
    authorization = request.headers.get("authorization", "")
    invocation_id, lease = authorize(o, request.path_params["invocationId"], authorization)
    raw = await _read_body(request.receive, request.headers.get("content-length"))
    return json_response(await commit_progress(o, invocation_id, lease, raw))


class ProgressFastPath:
    """ASGI wrapper: ``POST /v1/invocations/{id}/progress`` is answered here, everything else
    by ``app`` (whose lifespan sets ``state.orchestrator``)."""

    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            parts = scope["path"].split("/")
            if len(parts) == 5 and parts[1:3] == ["v1", "invocations"] and parts[4] == "progress":
                await self._progress(scope, receive, send, parts[3])
                return
        await self.app(scope, receive, send)

    async def _progress(self, scope: Scope, receive: Receive, send: Send, invocation: str) -> None:
        status = 200
        extra: dict[str, str] = {}
        headers = dict(scope["headers"])
        try:
            o = self.state.orchestrator
            authorization = headers.get(b"authorization", b"").decode("latin-1")
            invocation_id, lease = authorize(o, invocation, authorization)
            raw = await _read_body(receive, headers.get(b"content-length", b"").decode("latin-1"))
            answer = await commit_progress(o, invocation_id, lease, raw)
        except ApiError as exc:
            status, answer, extra = exc.status, error_body(exc), error_headers(exc)
        except db.UNAVAILABLE as exc:  # still away after the patience: the SDK tries again
            log.warning("request_unavailable", route=PROGRESS_ROUTE, error=str(exc))
            away = Unavailable()
            status, answer, extra = away.status, error_body(away), error_headers(away)
        except Exception:
            log.exception("request_failed", route=PROGRESS_ROUTE)
            status, answer = 500, error_body(ApiError())
        content = orjson.dumps(answer)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(content)).encode()),
                    *((k.encode(), v.encode()) for k, v in extra.items()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": content})


async def _read_body(receive: Receive, declared: str | None) -> bytes:
    """The whole body, refused past ``MAX_PROGRESS_BODY`` (``declared``: its Content-Length)."""
    too_large = f"the request body is larger than {MAX_PROGRESS_BODY} bytes"
    if declared and declared.isdigit() and int(declared) > MAX_PROGRESS_BODY:
        raise PayloadTooLarge(too_large)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break  # the client went away
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_PROGRESS_BODY:
            raise PayloadTooLarge(too_large)
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(chunks)
