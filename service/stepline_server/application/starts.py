"""Start a run by request (the API's ``POST /v1/runs``) and take it at once: check its
workflow and input, gather it when the workflow is debounced, answer the run its key or
singleton key already names, and count it in ``stepline_runs_started_total``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stepline_server.application import at_once, reads
from stepline_server.engine import gathering, inputs
from stepline_server.store import apps, gatherings, runs
from stepline_server.store.db import Conn, Record

if TYPE_CHECKING:
    from stepline_server.orchestrator import Orchestrator


class Refused(Exception):
    """The run cannot be started: ``code`` is the error code of openapi.yaml
    (``not_found``, ``validation_failed``, ``run_key_conflict``, ``internal``), ``details``
    its details."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}


@dataclass(frozen=True)
class Started:
    """The run as ``GET /v1/runs/{id}`` reads it; ``created``: this start created it (else
    it is the run its key names, ``deduplicated``, or the debounced run that absorbed it,
    ``debounced``)."""

    answer: dict[str, Any]
    created: bool


async def start_run(o: Orchestrator, new: runs.NewRun, *, again: bool = False) -> Started:
    """Start ``new`` (trigger ``api``); ``again``: a try before this one was cut off at its
    commit, so the run it may have kept is looked for first (and answered as created).
    Raises :class:`Refused`."""
    with at_once.taking(o) as now:
        async with o.pool.acquire() as conn, conn.transaction():
            kept = await runs.get(conn, new.project_id, new.id) if again else None
            # (A keyed run's id is its key's: the run kept may be another start's of the same
            # key, this one's answer when it started the same, none of this one's otherwise.)
            if kept is not None and (new.run_key is None or _same_start(kept, new)):
                o.metrics.run_started(new.workflow, "api")
                answer = await reads.run_json(conn, kept, callback_url=reads.callback_url(o))
                return Started(answer, True)
            wf = await apps.workflow(conn, new.project_id, new.workflow)
            if wf is None:
                raise Refused(
                    "not_found", f"no workflow named {new.workflow!r}; sync the app that hosts it"
                )
            problems = inputs.input_problems((wf["options"] or {}).get("inputSchema"), new.input)
            if problems:
                raise Refused(
                    "validation_failed",
                    f"the input does not match {new.workflow!r}'s input schema: "
                    + ", ".join(problems),
                    {"fields": problems},
                )
            spec = gathering.spec_of(wf["options"])
            if spec is not None and spec.kind == gathering.DEBOUNCE:
                return await _debounce(o, conn, spec, new)
            row, created = await _create(conn, wf, new, notify=now.notify)
            if not created:  # the run its key or singleton key names, read as GET does
                found = await runs.get(conn, new.project_id, row["id"])
                if found is None:  # deleted in between (its app, or retention)
                    raise Refused("internal", "the run could not be created; try again")
                answer = await reads.run_json(
                    conn, found, callback_url=reads.callback_url(o), limits=reads.history_limits(o)
                )
                return Started(answer | {"deduplicated": True}, False)
            taken = await now.take_now(conn, row["id"])
        now.take(taken)
    o.metrics.run_started(new.workflow, "api")
    paused = wf["paused_at"] is not None or wf["app_paused_at"] is not None
    return Started(reads.new_run_json(row, paused=paused, limits=reads.history_limits(o)), True)


async def _debounce(o: Orchestrator, conn: Conn, spec: gathering.Spec, new: runs.NewRun) -> Started:
    """A start of a debounced workflow: the run it opens (created) or the run already
    gathering its key's starts, given this start's input (``debounced: true``)."""
    problems = gathering.start_problems(spec, new.run_key)
    if problems:
        raise Refused("validation_failed", next(iter(problems.values())), {"fields": problems})
    got = await gatherings.gather(conn, spec, new)
    if got is None:
        raise Refused(
            "not_found", f"no workflow named {new.workflow!r}; sync the app that hosts it"
        )
    found = await runs.get(conn, new.project_id, got.run_id)
    if found is None:
        raise Refused("internal", "the run could not be created; try again")
    answer = await reads.run_json(
        conn, found, callback_url=reads.callback_url(o), limits=reads.history_limits(o)
    )
    if got.created is not None:
        o.metrics.run_started(new.workflow, "api")
        return Started(answer, True)
    o.metrics.debounce_absorbed(new.workflow)
    return Started(answer | {"debounced": True}, False)


async def _keyed(conn: Conn, new: runs.NewRun) -> Record | None:
    """The run ``new``'s key names: read by its id (the key's, one shard on Citus), else by
    the key (a run keyed before ids were derived from keys has another id)."""
    assert new.run_key is not None
    found = await runs.get(conn, new.project_id, new.id)
    if found is not None and found["run_key"] == new.run_key:
        return found
    return await runs.by_key(conn, new.project_id, new.run_key)


def _same_start(existing: Record, new: runs.NewRun) -> bool:
    """Whether ``existing`` (the run ``new``'s key names) was started as ``new`` is: the same
    workflow and input (a run continued as new is named by the input it was started with)."""
    first = existing["first_input"]
    started_with = existing["input"] if first is None else first
    return bool(existing["workflow"] == new.workflow and started_with == new.input)


async def _create(conn: Conn, wf: Record, new: runs.NewRun, *, notify: bool) -> tuple[Record, bool]:
    """The run created (and True), or (and False) the existing run its key names when that has
    the same workflow and input (its id is ``new``'s: both are the key's), or the active run of
    its singleton key; ``run_key_conflict`` when the key names another run."""
    for _ in range(3):
        row = await runs.insert(conn, new, notify=notify)
        if row is not None:
            return row, True
        if new.run_key is not None:
            existing = await _keyed(conn, new)
            if existing is not None:
                if _same_start(existing, new):
                    return existing, False
                raise Refused(
                    "run_key_conflict",
                    f"run key {new.run_key!r} belongs to run {existing['id']} with a different"
                    " workflow or input",
                    {"runId": str(existing["id"])},
                )
        field = (wf["options"] or {}).get("singletonKey")
        if isinstance(field, str):
            active = await runs.active_singleton(
                conn, new.project_id, new.workflow, new.input, field
            )
            if active is not None:
                return active, False
        # What stood in the way ended or went away in between: try again.
    raise Refused("internal", "the run could not be created; try again")
