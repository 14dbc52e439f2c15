"""Routes for a run's published state: all of it, or one key with a long poll (``?wait=``).

A long poll holds no database connection while it waits: it reads, lets the connection go,
and waits on the ``stepline_state`` notification (any orchestrator's listener hears a set
committed through another), looking again now and then in case the listener was away.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from stepline.protocol import state_key_problem
from stepline_server.api.context import orch, path_uuid, project, wait_seconds
from stepline_server.api.errors import NotFound, ValidationFailed
from stepline_server.api.responses import json_response
from stepline_server.application import serialize
from stepline_server.engine import runs as rules
from stepline_server.store import runs, state
from stepline_server.store.db import Record

"""The longest ``?wait=`` a read of a key waits (a longer one is cut to this)."""
RECHECK_SECONDS = 5.0  # a long poll reads again at least this often


async def get_state(request: Request) -> Response:
    """``{key: value}``: every key the run published, each with its current value."""
    pid = await project(request)
    run_id = path_uuid(request, "runId", "run")
    async with orch(request).read_pool.acquire() as conn:
        if await runs.get(conn, pid, run_id) is None:
            raise NotFound(f"no run with id {run_id}")
        return json_response(state.as_dict(await state.of_run(conn, pid, run_id)))


async def get_state_key(request: Request) -> Response:
    """One key's current value (``{key, value, updatedAt}``); with ``?wait=`` (at most 60 s)
    waits for the key to be set; ``404`` when it is not after the wait (at once when the run
    has ended)."""
    pid = await project(request)
    run_id = path_uuid(request, "runId", "run")
    key = request.path_params["key"]
    problem = state_key_problem(key)
    if problem is not None:
        raise ValidationFailed(problem, {"fields": {"key": problem}})
    wait = wait_seconds(request)
    o = orch(request)
    deadline = time.monotonic() + wait
    while True:
        with o.state_waiters.watch(str(run_id)) as changed:
            async with o.pool.acquire() as conn:  # the primary: a set just committed is seen
                run = await runs.get(conn, pid, run_id)
                if run is None:
                    raise NotFound(f"no run with id {run_id}")
                found = await state.value(conn, pid, run_id, key)
            if found is not None:
                return json_response(_value_json(found))
            left = deadline - time.monotonic()
            if left <= 0 or run["status"] in rules.ENDED:
                raise NotFound(
                    f"run {run_id} has no state {key!r}",
                    {"runId": str(run_id), "key": key, "runStatus": run["status"]},
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(left, RECHECK_SECONDS))


def _value_json(row: Record) -> dict[str, Any]:
    return {"key": row["key"], "value": row["value"], "updatedAt": serialize.ts(row["updated_at"])}
