"""Pages for runs: sign in and out, the runs list (live), a run's page (live) and its actions."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from starlette.responses import RedirectResponse, Response

from stepline_server.application import actions, callbacks, payloads, reads, serialize
from stepline_server.authlimits import AuthFailures
from stepline_server.engine import bulk
from stepline_server.engine import runs as rules
from stepline_server.store import apps, keys, runs, sessions, state
from stepline_server.ui import timeline
from stepline_server.ui.web import Req

PAGE = 50
LOG_LINES = 1000  # a run keeps at most this many: the page shows them all
STATUSES = [s.value for s in rules.RunStatus]


async def login_form(r: Req) -> Response:
    if r.viewer is not None:
        return RedirectResponse("/ui/runs", 303)
    return r.page("login.html", title="Sign in")


async def login(r: Req) -> Response:
    """Sign in with an API key: a new server-side session (its id in the cookie, with a fresh
    CSRF token)."""
    key = r.form.get("key", "").strip()
    async with r.orch.pool.acquire() as conn:
        found = await keys.find_key(conn, key) if key and len(key) <= 512 else None
        if found is None:
            return await _refused_sign_in(r)
        if r.session.session_id is not None:
            await sessions.end(conn, r.session.session_id)
        r.session.renew(await sessions.start(conn, found["id"]))
    return RedirectResponse("/ui/runs", 303)


async def _refused_sign_in(r: Req) -> Response:
    """A key that is not valid: counted like the API's failed authentications, and past the
    limits answered 429 (a valid key still signs in)."""
    failures: AuthFailures = r.shared.state.auth_failures
    request = r.request
    peer = request.client.host if request.client else ""
    verdict = failures.failed(failures.client(peer, request.headers.get("x-forwarded-for")))
    await failures.hold(verdict)
    if verdict.retry_after is None:
        return r.page("login.html", 401, title="Sign in", error="That API key is not valid.")
    error = (
        "That API key is not valid, and too many sign-ins failed lately: wait"
        f" {verdict.retry_after} seconds before trying another one."
    )
    response = r.page("login.html", 429, title="Sign in", error=error)
    response.headers["retry-after"] = str(verdict.retry_after)
    return response


async def logout(r: Req) -> Response:
    """Sign out: the session row is deleted, so a copy of the cookie no longer works."""
    if r.session.session_id is not None:
        async with r.orch.pool.acquire() as conn:
            await sessions.end(conn, r.session.session_id)
    r.session.renew(None)
    return RedirectResponse("/ui/login", 303)


async def home(r: Req) -> Response:
    return RedirectResponse("/ui/runs", 303)


def _local_time(raw: str | None) -> datetime | None:
    """A ``datetime-local`` field (read as UTC) or an RFC 3339 time; None when not one."""
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _filters(r: Req) -> tuple[runs.RunFilter, dict[str, str]]:
    """The list's filters from the query, and the query that repeats them."""
    q = r.request.query_params
    kept = {k: q[k] for k in ("workflow", "status", "runKey", "after", "before", "q") if q.get(k)}
    status = kept.get("status")
    if status not in STATUSES:
        kept.pop("status", None)
        status = None
    raw = kept.get("runKey") or kept.get("q")
    try:  # a key, or a prefix ending with '*', as the API's list and bulk filters take it
        run_key, prefix = bulk.run_key_of(raw)
    except bulk.FilterError:
        run_key, prefix = raw, None  # no run has such a key: nothing is listed
    f = runs.RunFilter(
        workflow=kept.get("workflow"),
        status=status,
        run_key=run_key,
        run_key_prefix=prefix,
        created_after=_local_time(kept.get("after")),
        created_before=_local_time(kept.get("before")),
    )
    return f, kept


def _cursor(raw: str | None) -> tuple[datetime, uuid.UUID] | None:
    at, _, ident = (raw or "").partition("|")
    try:
        return datetime.fromisoformat(at), uuid.UUID(ident)
    except ValueError:
        return None


async def _rows(r: Req) -> dict[str, Any]:
    f, kept = _filters(r)
    before = _cursor(r.request.query_params.get("page"))
    async with r.orch.read_pool.acquire() as conn:
        rows = await runs.search(conn, r.pid, f, before, PAGE + 1)
        items = [await reads.run_json(conn, row, with_steps=False) for row in rows[:PAGE]]
        workflows = [w["name"] for w in await apps.workflows_page(conn, r.pid, None, 500)]
    older = None
    if len(rows) > PAGE:
        last = rows[PAGE - 1]
        older = urlencode({**kept, "page": f"{last['created_at'].isoformat()}|{last['id']}"})
    return {
        "runs": items,
        "filters": kept,
        "query": urlencode(
            {**kept, **({"page": p} if (p := r.request.query_params.get("page")) else {})}
        ),
        "older": older,
        "workflows": workflows,
        "statuses": STATUSES,
        "live": before is None,
    }


async def runs_page(r: Req) -> Response:
    q = r.request.query_params.get("q", "").strip()
    if q:
        try:
            run_id = uuid.UUID(q)
        except ValueError:
            run_id = None
        if run_id is not None:
            async with r.orch.pool.acquire() as conn:
                if await runs.get(conn, r.pid, run_id) is not None:
                    return RedirectResponse(f"/ui/runs/{run_id}", 303)
    return r.page("runs.html", title="Runs", **await _rows(r))


async def runs_rows(r: Req) -> Response:
    return r.page("_rows.html", **await _rows(r))


async def _run(r: Req) -> dict[str, Any] | None:
    try:
        run_id = uuid.UUID(r.request.path_params["runId"])
    except ValueError:
        return None
    async with r.orch.pool.acquire() as conn:
        row = await runs.get(conn, r.pid, run_id)
        if row is None:
            return None
        run = await reads.run_json(conn, row, callback_url=reads.callback_url(r.orch))
        events = [serialize.event(e) for e in await runs.events(conn, r.pid, run_id, 0, 2000)]
        lines = [serialize.log_line(x) for x in await runs.logs(conn, r.pid, run_id, 0, LOG_LINES)]
        children = [s["childRunId"] for s in run["steps"] if s.get("childRunId")]
        app = await apps.get(conn, r.pid, run["app"]) if run["app"] else None
        published = await state.of_run(conn, r.pid, run_id)
    step_logs: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        if line["stepName"]:
            step_logs.setdefault(line["stepName"], []).append(line)
    return {
        "logs": lines,
        "step_logs": step_logs,
        "run": run,
        "app_name": app["name"] if app else None,
        "unreachable": timeline.unreachable(run, events),
        "ended": run["status"] in rules.ENDED,
        "events": events,
        "invocations": timeline.invocations(events),
        "bars": timeline.bars(run),
        "tries": timeline.try_bars(run, timeline.tries(events)),
        "children": children,
        "waiting": [s for s in run["steps"] if s.get("callbackId") and s["status"] == "waiting"],
        "state": [dict(row) for row in published],
    }


def _missing(r: Req) -> Response:
    return r.page("error.html", 404, title="Not found", message="There is no such run.")


async def run_page(r: Req) -> Response:
    data = await _run(r)
    if data is None:
        return _missing(r)
    return r.page("run.html", title=f"Run {data['run']['id']}", **data)


async def run_live(r: Req) -> Response:
    data = await _run(r)
    if data is None:
        return _missing(r)
    return r.page("_run_live.html", **data)


async def cancel(r: Req) -> Response:
    run_id = r.request.path_params["runId"]
    async with r.orch.pool.acquire() as conn:
        try:
            row = await actions.cancel_run(r.orch, conn, r.pid, uuid.UUID(run_id))
        except (rules.RuleError, ValueError) as exc:
            return r.back(f"/ui/runs/{run_id}", f"Not cancelled: {exc}")
    if row is None:
        return _missing(r)
    return r.back(f"/ui/runs/{run_id}", "Cancellation requested.")


async def retry(r: Req) -> Response:
    run_id = r.request.path_params["runId"]
    from_step = r.form.get("fromStep") or None
    async with r.orch.pool.acquire() as conn:
        try:
            row = await actions.retry_run(r.orch, conn, r.pid, uuid.UUID(run_id), from_step)
        except (rules.RuleError, ValueError) as exc:
            return r.back(f"/ui/runs/{run_id}", f"Not retried: {exc}")
    if row is None:
        return _missing(r)
    where = f" from step {from_step}" if from_step else ""
    return r.back(f"/ui/runs/{run_id}", f"Retrying{where}.")


async def complete_callback(r: Req) -> Response:
    back = r.form.get("back", "/ui/runs")
    if not back.startswith("/ui/"):
        back = "/ui/runs"
    cid = uuid.UUID(r.request.path_params["callbackId"])  # checked before (params.py)
    try:
        body = payloads.parse_text(r.form.get("body") or "null", what="the body")
    except payloads.BadPayload as exc:
        return r.back(back, f"Not completed: {exc.message}.")
    done = await callbacks.complete_callback(r.orch, cid, r.pid, body)
    if done.callback is None:
        return r.back(back, "Not completed: there is no such callback.")
    if done.repeated:  # the same body again, as the API answers it
        return r.back(back, "Callback already completed with this body.")
    if not done.completed:
        return r.back(back, f"Not completed: the callback is already {done.callback['status']}.")
    return r.back(back, "Callback completed.")
