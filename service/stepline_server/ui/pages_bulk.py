"""Pages for bulk actions: cancel or retry the runs selected on the runs list (or every run its
filter matches) after a confirmation that shows the count, then the operation's progress."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from starlette.responses import RedirectResponse, Response

from stepline_server.application import actions, serialize
from stepline_server.engine import bulk as rules
from stepline_server.engine import ids
from stepline_server.store import operations
from stepline_server.ui.web import Req

FILTER_FIELDS = ("workflow", "status", "runKey", "after", "before", "q")
MAX_SELECTED = 500  # runs a page shows at most, so at most this many can be ticked
MAX_TEXT = 256  # a filter field or a step name


def _time(raw: str | None) -> datetime | None:
    """A ``datetime-local`` field (read as UTC) or an RFC 3339 time."""
    if not raw:
        return None
    value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class _Chosen:
    """What the bulk form asks for: the action, the runs (ticked, or the list's filter) and
    the filter as the operation records it."""

    def __init__(self, r: Req, selected: list[str]) -> None:
        form = r.form
        for name in (*FILTER_FIELDS, "fromStep"):
            value = form.get(name) or ""
            if "\x00" in value or len(value) > MAX_TEXT:
                raise rules.FilterError(name, f"{name} is not a text this dashboard takes")
        self.kept = {k: form[k] for k in FILTER_FIELDS if form.get(k)}
        self.from_step = (form.get("fromStep") or "").strip() or None
        action = form.get("action", "")
        if action == "retry" and self.from_step:
            action = rules.Action.RETRY_FROM_STEP.value
        if action not in {a.value for a in rules.Action}:
            raise rules.FilterError("action", "choose cancel or retry")
        self.action = rules.Action(action)
        self.every = form.get("scope") == "filter"
        self.selected = selected
        if not self.every and not selected:
            raise rules.FilterError("run", "tick the runs to act on, or choose every run")
        run_key = self.kept.get("runKey") or self.kept.get("q")
        try:
            after, before = _time(self.kept.get("after")), _time(self.kept.get("before"))
        except ValueError:
            raise rules.FilterError("after", "a created time is not a time") from None
        rules.check_from_step(self.action, self.from_step)
        self.selection = rules.select(
            self.action,
            status=self.kept.get("status"),
            run_key=run_key,
            trigger=None,
            created_after=after,
            created_before=before,
            workflow=self.kept.get("workflow"),
            from_step=self.from_step,
            run_ids=None if self.every else tuple(selected),
        )
        f: dict[str, Any] = {}
        for name, key in (("workflow", "workflow"), ("status", "status"), ("runKey", "runKey")):
            if self.kept.get(key):
                f[name] = self.kept[key]
        if run_key and "runKey" not in f:
            f["runKey"] = run_key
        if after:
            f["createdAfter"] = serialize.ts(after)
        if before:
            f["createdBefore"] = serialize.ts(before)
        if not self.every:
            f["selected"] = len(selected)  # ticked runs, not every run of the filter
        self.filter = f


def _selected(r: Req) -> list[str] | None:
    """The ticked run ids (the form repeats ``run``), or None when one is not a run id."""
    raw = r.form_values("run")
    try:
        return [str(uuid.UUID(x)) for x in raw][:MAX_SELECTED]
    except ValueError:
        return None


def _back(r: Req) -> str:
    kept = {k: r.form[k] for k in FILTER_FIELDS if r.form.get(k)}
    return "/ui/runs" + (f"?{urlencode(kept)}" if kept else "")


async def confirm(r: Req) -> Response:
    """``POST /ui/runs/bulk``: how many runs the action would take, and a form to go ahead."""
    selected = _selected(r)
    if selected is None:
        return r.back(_back(r), "Nothing was done: a ticked run is not a run id.")
    try:
        chosen = _Chosen(r, selected)
    except rules.FilterError as exc:
        return r.back(_back(r), f"Nothing was done: {exc}.")
    async with r.orch.pool.acquire() as conn:
        matched, sample = await operations.match(
            conn, r.pid, chosen.selection, None, rules.SAMPLE_SIZE
        )
    return r.page(
        "bulk_confirm.html",
        title="Confirm",
        chosen=chosen,
        matched=matched,
        sample=sample,
        back=_back(r),
        verb="cancelled" if chosen.action is rules.Action.CANCEL else "retried",
    )


async def start(r: Req) -> Response:
    """``POST /ui/runs/bulk/start``: make the operation and show its progress."""
    selected = _selected(r)
    if selected is None:
        return r.back(_back(r), "Nothing was done: a ticked run is not a run id.")
    try:
        chosen = _Chosen(r, selected)
    except rules.FilterError as exc:
        return r.back(_back(r), f"Nothing was done: {exc}.")
    async with r.orch.pool.acquire() as conn:
        row = await operations.create(
            conn, ids.new_id(), r.pid, chosen.action.value, chosen.filter, chosen.selection, None
        )
    actions.operation_queued(r.orch)
    return RedirectResponse(f"/ui/operations/{row['id']}", 303)


async def _operation(r: Req) -> dict[str, Any] | None:
    try:
        op_id = uuid.UUID(r.request.path_params["operationId"])
    except ValueError:
        return None
    async with r.orch.pool.acquire() as conn:
        row = await operations.get(conn, r.pid, op_id)
        if row is None:
            return None
        errors = await operations.errors(conn, r.pid, op_id, rules.FIRST_ERRORS)
    op = serialize.operation(row, errors)
    done = op["succeeded"] + op["failed"] + op["skipped"]
    return {"op": op, "done": done, "running": op["status"] == "running"}


def _missing(r: Req) -> Response:
    return r.page("error.html", 404, title="Not found", message="There is no such operation.")


async def operation_page(r: Req) -> Response:
    data = await _operation(r)
    if data is None:
        return _missing(r)
    return r.page("operation.html", title=f"Operation {data['op']['id']}", **data)


async def operation_live(r: Req) -> Response:
    data = await _operation(r)
    if data is None:
        return _missing(r)
    return r.page("_operation_live.html", **data)


async def cancel_operation(r: Req) -> Response:
    op_id = r.request.path_params["operationId"]
    try:
        ident = uuid.UUID(op_id)
    except ValueError:
        return _missing(r)
    async with r.orch.pool.acquire() as conn:
        row = await operations.cancel(conn, r.pid, ident)
    message = "Operation cancelled." if row else "Not cancelled: the operation has ended."
    return r.back(f"/ui/operations/{op_id}", message)


async def operations_page(r: Req) -> Response:
    async with r.orch.read_pool.acquire() as conn:
        rows = await operations.page(conn, r.pid, None, 100)
    return r.page(
        "operations.html", title="Operations", operations=[serialize.operation(x) for x in rows]
    )
