"""Routes for runs: start, read (with long poll), search, cancel, retry, history, logs,
replay."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import Response

from stepline_server.api import pagination, patience
from stepline_server.api.context import orch, path_uuid, project, wait_seconds
from stepline_server.api.errors import (
    ApiError,
    InvalidState,
    NotFound,
    RunKeyConflict,
    ValidationFailed,
)
from stepline_server.api.responses import json_response, read_model, refuse_body
from stepline_server.application import actions, reads, serialize, starts
from stepline_server.engine import bulk, ids
from stepline_server.engine import runs as rules
from stepline_server.store import runs
from stepline_server.store.db import Record

RECHECK_SECONDS = 5.0  # a long poll reads the run again at least this often


class RunStart(BaseModel):
    workflow: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    input: Any = None
    run_key: str | None = Field(default=None, alias="runKey", pattern=r"^[A-Za-z0-9._:-]{1,128}$")
    priority: int = Field(default=0, ge=rules.MIN_PRIORITY, le=rules.MAX_PRIORITY, strict=True)


class RunRetry(BaseModel):
    from_step: str | None = Field(default=None, alias="fromStep", min_length=1, max_length=256)


async def start_run(request: Request) -> Response:
    pid = await project(request)
    body = await read_model(request, RunStart)
    o = orch(request)
    new = runs.NewRun(
        # A keyed run's id is its key's (ids.run_key_id): a second start finds the first.
        id=ids.run_key_id(pid, body.run_key) if body.run_key is not None else ids.new_id(),
        project_id=pid,
        workflow=body.workflow,
        input=body.input,
        run_key=body.run_key,
        priority=body.priority,
    )
    try:
        started = await patience.patiently(
            lambda again: starts.start_run(o, new, again=again), "start"
        )
    except starts.Refused as exc:
        raise _REFUSALS.get(exc.code, ApiError)(exc.message, exc.details) from None
    return json_response(started.answer, 201 if started.created else 200)


_REFUSALS: dict[str, type[ApiError]] = {
    "not_found": NotFound,
    "validation_failed": ValidationFailed,
    "run_key_conflict": RunKeyConflict,
}


async def get_run(request: Request) -> Response:
    pid = await project(request)
    run_id = path_uuid(request, "runId", "run")
    wait = wait_seconds(request)
    o = orch(request)
    deadline = time.monotonic() + wait
    while True:
        with o.waiters.watch(str(run_id)) as ended:
            async with o.pool.acquire() as conn:
                row = await runs.get(conn, pid, run_id)
                if row is None:
                    raise NotFound(f"no run with id {run_id}")
                left = deadline - time.monotonic()
                if row["status"] in rules.ENDED or left <= 0:
                    return json_response(
                        await reads.run_json(
                            conn,
                            row,
                            callback_url=reads.callback_url(o),
                            limits=reads.history_limits(o),
                        )
                    )
            # The end notification wakes the wait; looking again now and then only covers a
            # listener that lost its connection before it reconnected.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ended.wait(), min(left, RECHECK_SECONDS))


async def list_runs(request: Request) -> Response:
    pid = await project(request)
    q = request.query_params
    status = q.get("status")
    if status is not None and status not in {s.value for s in rules.RunStatus}:
        raise ValidationFailed(f"unknown status {status!r}", {"fields": {"status": status}})
    try:
        exact, prefix = bulk.run_key_of(q.get("runKey"))
    except bulk.FilterError as exc:
        raise ValidationFailed(str(exc), {"fields": {exc.field: str(exc)}}) from None
    f = runs.RunFilter(
        workflow=q.get("workflow"),
        status=status,
        run_key=exact,
        run_key_prefix=prefix,
        created_after=pagination.time_of(request, "createdAfter"),
        created_before=pagination.time_of(request, "createdBefore"),
    )
    limit = pagination.limit_of(request)
    before = pagination.keyset_before(request)
    async with orch(request).read_pool.acquire() as conn:
        found = await runs.search(conn, pid, f, before, limit + 1)
        rows, nxt = pagination.keyset_page(found, limit, "created_at")
        items = [await reads.run_json(conn, r, with_steps=False) for r in rows]
    return json_response({"runs": items, "nextCursor": nxt})


async def cancel_run(request: Request) -> Response:
    pid = await project(request)
    run_id = path_uuid(request, "runId", "run")
    await refuse_body(request)
    o = orch(request)
    async with o.pool.acquire() as conn:
        try:
            row = await actions.cancel_run(o, conn, pid, run_id)
        except rules.RuleError as exc:
            raise InvalidState(str(exc)) from None
        if row is None:
            raise NotFound(f"no run with id {run_id}")
        return json_response(
            await reads.run_json(conn, row, callback_url=reads.callback_url(o)), 202
        )


async def retry_run(request: Request) -> Response:
    pid = await project(request)
    run_id = path_uuid(request, "runId", "run")
    body = await read_model(request, RunRetry, allow_empty=True)
    o = orch(request)
    async with o.pool.acquire() as conn:
        try:
            row = await actions.retry_run(o, conn, pid, run_id, body.from_step)
        except rules.RuleError as exc:
            if exc.code == "validation_failed":
                raise ValidationFailed(str(exc), {"fields": {"fromStep": str(exc)}}) from None
            raise InvalidState(str(exc)) from None
        if row is None:
            raise NotFound(f"no run with id {run_id}")
        return json_response(
            await reads.run_json(conn, row, callback_url=reads.callback_url(o)), 202
        )


async def list_events(request: Request) -> Response:
    pid = await project(request)
    run_id = path_uuid(request, "runId", "run")
    limit = pagination.limit_of(request)
    after = _after(request)
    async with orch(request).pool.acquire() as conn:
        if await runs.get(conn, pid, run_id) is None:
            raise NotFound(f"no run with id {run_id}")
        rows = await runs.events(conn, pid, run_id, after, limit + 1)
    rows, nxt = _seq_page(rows, limit)
    return json_response({"events": [serialize.event(r) for r in rows], "nextCursor": nxt})


async def list_logs(request: Request) -> Response:
    """``GET /v1/runs/{runId}/logs``: the run's log lines in order (``after``/``cursor``: a
    line's seq), with how many lines the run dropped past its cap."""
    pid = await project(request)
    run_id = path_uuid(request, "runId", "run")
    limit = pagination.limit_of(request)
    after = _after(request)
    async with orch(request).pool.acquire() as conn:
        run = await runs.get(conn, pid, run_id)
        if run is None:
            raise NotFound(f"no run with id {run_id}")
        rows = await runs.logs(conn, pid, run_id, after, limit + 1)
    rows, nxt = _seq_page(rows, limit)
    return json_response(
        {
            "logs": [serialize.log_line(r) for r in rows],
            "nextCursor": nxt,
            "logsDropped": run["logs_dropped"],
        }
    )


def _after(request: Request) -> int:
    """The seq a list of a run's history or logs starts after: ``cursor``, else ``after``."""
    raw_after = request.query_params.get("after", "0")
    cursor = pagination.decode(request, pagination.as_seq)
    if not (raw_after.isascii() and raw_after.isdigit() and int(raw_after) < 2**63):
        raise ValidationFailed("after must be a sequence number", {"fields": {"after": raw_after}})
    return int(cursor[0]) if cursor else int(raw_after)


def _seq_page(rows: list[Record], limit: int) -> tuple[list[Record], str | None]:
    """A page of ``limit`` of ``rows`` (read one more, to know whether another page follows)
    and the cursor of the next page: the last history seq shown."""
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, pagination.encode([rows[-1]["seq"]])


async def list_invocations(request: Request) -> Response:
    """``GET /v1/runs/{runId}/invocations``: the run's invocations in order, as the history
    tells them (``after``/``cursor``: a history seq)."""
    pid = await project(request)
    run_id = path_uuid(request, "runId", "run")
    limit = pagination.limit_of(request)
    cursor = pagination.decode(request, pagination.as_seq)
    after = int(cursor[0]) if cursor else 0
    async with orch(request).pool.acquire() as conn:
        if await runs.get(conn, pid, run_id) is None:
            raise NotFound(f"no run with id {run_id}")
        rows = await runs.invocations(conn, pid, run_id, after, limit + 1)
    rows, nxt = _seq_page(rows, limit)
    items = [serialize.invocation(r) for r in rows]
    return json_response({"invocations": items, "nextCursor": nxt})


async def get_replay(request: Request) -> Response:
    """``GET /v1/runs/{runId}/replay``: the run's input and recorded steps as an invocation
    carries them, for ``stepline replay-check`` to replay against other code."""
    pid = await project(request)
    run_id = path_uuid(request, "runId", "run")
    o = orch(request)
    async with o.pool.acquire() as conn:
        row = await runs.get(conn, pid, run_id)
        if row is None:
            raise NotFound(f"no run with id {run_id}")
        steps = await runs.steps(conn, run_id)
    now = datetime.now(UTC)
    return json_response(serialize.replay(row, steps, now, reads.callback_url(o)))
