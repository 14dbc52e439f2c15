"""Pages beside runs: workflows, apps (sync now), schedules (pause, resume, trigger), events
(send one) and keys."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

from pydantic import ValidationError
from starlette.responses import Response

from stepline_server import appsync, serialize
from stepline_server.store import apps, schedules, waits
from stepline_server.ui import permissions
from stepline_server.ui.web import Req


async def workflows_page(r: Req) -> Response:
    async with r.orch.pool.acquire() as conn:
        rows = await apps.workflows_page(conn, r.pid, None, 500)
    return r.page(
        "workflows.html", title="Workflows", workflows=[serialize.workflow(w) for w in rows]
    )


async def apps_page(r: Req) -> Response:
    async with r.orch.pool.acquire() as conn:
        rows = await apps.page(conn, r.pid, None, 500)
    return r.page("apps.html", title="Apps", apps=[serialize.app(a) for a in rows])


async def sync_app(r: Req) -> Response:
    async with r.orch.pool.acquire() as conn:
        row = await apps.get(conn, r.pid, r.request.path_params["app"])
    if row is None:
        return r.back("/ui/apps", "There is no such app.")
    try:
        done = await appsync.sync(r.orch, row)
    except appsync.SyncFailed as exc:
        return r.back("/ui/apps", f"Not synced: {exc}")
    except ValidationError as exc:
        return r.back("/ui/apps", f"Not synced: {exc.errors()[0]['msg']}")
    names = ", ".join(n for n, _ in done.workflows) or "no workflows"
    return r.back("/ui/apps", f"Synced {row['name']}: {names}.")


async def schedules_page(r: Req) -> Response:
    async with r.orch.pool.acquire() as conn:
        rows = await schedules.page(conn, r.pid, None, 500)
    return r.page(
        "schedules.html", title="Schedules", schedules=[serialize.schedule(s) for s in rows]
    )


async def change_schedule(r: Req) -> Response:
    sid, action = r.request.path_params["scheduleId"], r.request.path_params["action"]
    now = datetime.now(UTC)
    async with r.orch.pool.acquire() as conn:
        try:
            if action == "trigger":
                run = await schedules.trigger(conn, r.pid, sid, now)
                if run is None:
                    return r.back("/ui/schedules", "There is no such schedule.")
                r.orch.dispatcher.wake()
                return r.back(f"/ui/runs/{run['id']}", f"Schedule {sid} triggered this run.")
            change = {"pause": schedules.pause, "resume": schedules.resume}.get(action)
            if change is None:
                return r.back("/ui/schedules", "Unknown action.")
            row = await change(conn, r.pid, sid, now)
        except (schedules.InvalidTransition, schedules.WorkflowGone) as exc:
            return r.back("/ui/schedules", f"Not done: {exc}")
    if row is None:
        return r.back("/ui/schedules", "There is no such schedule.")
    r.orch.scheduler.wake()
    return r.back("/ui/schedules", f"Schedule {sid} is {row['status']}.")


async def events_page(r: Req) -> Response:
    return r.page("events.html", title="Events")


async def send_event(r: Req) -> Response:
    name = r.form.get("name", "").strip()
    if not 1 <= len(name) <= 256:
        return r.back("/ui/events", "Not sent: an event needs a name (at most 256 characters).")
    try:
        data = json.loads(r.form.get("data") or "null")
    except ValueError as exc:
        return r.back("/ui/events", f"Not sent: the data must be JSON ({exc}).")
    async with r.orch.pool.acquire() as conn:
        matched = await waits.send_event(conn, uuid.uuid4(), r.pid, name, data)
    if matched:
        r.orch.dispatcher.wake()
    return r.back("/ui/events", f"Event {name} sent: {len(matched)} waiting run(s) resumed.")


async def keys_page(r: Req) -> Response:
    assert r.viewer is not None
    if not permissions.is_admin(r.viewer):
        return r.page("error.html", 403, title="Refused", message="Keys are for admin keys.")
    return r.page("keys.html", title="Keys")
