"""Routes for runs: start, read (with long poll), search, cancel, retry, history, logs,
replay."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import Response

from stepline_server import actions, reads, serialize
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
from stepline_server.engine import bulk, gathering, ids, inputs
from stepline_server.engine import runs as rules
from stepline_server.store import apps, gatherings, leases, runs, waits
from stepline_server.store.db import Conn, Record

if TYPE_CHECKING:
    from stepline_server.orchestrator import Orchestrator

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
        id=ids.new_id(),
        project_id=pid,
        workflow=body.workflow,
        input=body.input,
        run_key=body.run_key,
        priority=body.priority,
    )
    return await patience.patiently(lambda again: _start(o, pid, body, new, again), "start")


async def _start(
    o: Orchestrator, pid: uuid.UUID, body: RunStart, new: runs.NewRun, again: bool
) -> Response:
    """Start ``new``; ``again``: a try before this one was cut off at its commit, so the run
    it may have kept is looked for first (and answered as created)."""
    # This orchestrator's dispatcher takes the run at once (created leased to it, when it has
    # room); the others hear of it only when it has none.
    notify = o.dispatcher.tell_others()
    with o.dispatcher.slot() as slot:
        async with o.pool.acquire() as conn, conn.transaction():
            kept = await runs.get(conn, pid, new.id) if again else None
            if kept is not None:
                o.metrics.run_started(body.workflow, "api")
                answer = await reads.run_json(conn, kept, callback_url=reads.callback_url(o))
                return json_response(answer, 201)
            wf = await apps.workflow(conn, pid, body.workflow)
            if wf is None:
                raise NotFound(f"no workflow named {body.workflow!r}; sync the app that hosts it")
            problems = inputs.input_problems((wf["options"] or {}).get("inputSchema"), body.input)
            if problems:
                raise ValidationFailed(
                    f"the input does not match {body.workflow!r}'s input schema: "
                    + ", ".join(problems),
                    {"fields": problems},
                )
            spec = gathering.spec_of(wf["options"])
            if spec is not None and spec.kind == gathering.DEBOUNCE:
                return await _debounce(o, conn, spec, body, new)
            row = await _create(conn, wf, body, new, notify=notify)
            if row["id"] != new.id:  # the run its key or singleton key names, read as GET does
                found = await runs.get(conn, pid, row["id"])
                if found is None:  # deleted in between (its app, or retention)
                    raise ApiError("the run could not be created; try again")
                answer = await reads.run_json(
                    conn, found, callback_url=reads.callback_url(o), limits=reads.history_limits(o)
                )
                return json_response(answer | {"deduplicated": True}, 200)
            taken = await leases.take_now(conn, row["id"], slot.lease) if slot.lease else None
        slot.take(taken)
    o.metrics.run_started(body.workflow, "api")
    paused = wf["paused_at"] is not None or wf["app_paused_at"] is not None
    return json_response(
        reads.new_run_json(row, paused=paused, limits=reads.history_limits(o)), 201
    )


async def _debounce(
    o: Orchestrator,
    conn: Conn,
    spec: gathering.Spec,
    body: RunStart,
    new: runs.NewRun,
) -> Response:
    """A start of a debounced workflow: the run it opens (``201``) or the run already gathering
    its key's starts, given this start's input (``200``, ``debounced: true``)."""
    problems = gathering.start_problems(spec, body.run_key)
    if problems:
        raise ValidationFailed(next(iter(problems.values())), {"fields": problems})
    got = await gatherings.gather(conn, spec, new)
    if got is None:
        raise NotFound(f"no workflow named {body.workflow!r}; sync the app that hosts it")
    found = await runs.get(conn, new.project_id, got.run_id)
    if found is None:
        raise ApiError("the run could not be created; try again")
    answer = await reads.run_json(
        conn, found, callback_url=reads.callback_url(o), limits=reads.history_limits(o)
    )
    if got.created is not None:
        o.metrics.run_started(body.workflow, "api")
        return json_response(answer, 201)
    o.metrics.debounce_absorbed(body.workflow)
    return json_response(answer | {"debounced": True}, 200)


async def _create(
    conn: Conn,
    wf: Record,
    body: RunStart,
    new: runs.NewRun,
    *,
    notify: bool,
) -> Record:
    """The run created, or the existing run its key names when that has the same workflow and
    input, or the active run of its singleton key; 409 when the key names another run."""
    for _ in range(3):
        row = await runs.insert(conn, new, notify=notify)
        if row is not None:
            return row
        if body.run_key is not None:
            existing = await runs.by_key(conn, new.project_id, body.run_key)
            if existing is not None:
                # A run continued as new is named by the input it was started with.
                first = existing["first_input"]
                started_with = existing["input"] if first is None else first
                if existing["workflow"] == body.workflow and started_with == body.input:
                    return existing
                raise RunKeyConflict(
                    f"run key {body.run_key!r} belongs to run {existing['id']} with a different"
                    " workflow or input",
                    {"runId": str(existing["id"])},
                )
        field = (wf["options"] or {}).get("singletonKey")
        if isinstance(field, str):
            active = await runs.active_singleton(
                conn, new.project_id, body.workflow, body.input, field
            )
            if active is not None:
                return active
        # What stood in the way ended or went away in between: try again.
    raise ApiError("the run could not be created; try again")


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
            row = await waits.cancel(conn, pid, run_id)
        except rules.RuleError as exc:
            raise InvalidState(str(exc)) from None
        if row is None:
            raise NotFound(f"no run with id {run_id}")
        o.dispatcher.wake()
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
