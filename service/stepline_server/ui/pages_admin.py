"""Pages beside runs: workflows (pause, resume), apps (sync now, pause, resume), schedules
(pause, resume, trigger), events (send one) and keys."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from starlette.responses import Response

from stepline_server.application import actions, appsync, payloads, serialize
from stepline_server.engine import access
from stepline_server.store import apps, keys, received_events, schedules
from stepline_server.store.db import Record
from stepline_server.ui import permissions
from stepline_server.ui.web import Req

EVENTS_SHOWN = 100  # the newest events received, on the events page


async def workflows_page(r: Req) -> Response:
    async with r.orch.read_pool.acquire() as conn:
        rows = await apps.workflows_page(conn, r.pid, None, 500)
        names = {a["slug"]: a["name"] for a in await apps.page(conn, r.pid, None, 500)}
    return r.page(
        "workflows.html",
        title="Workflows",
        workflows=[serialize.workflow(w) for w in rows],
        app_names=names,
    )


async def apps_page(r: Req) -> Response:
    async with r.orch.read_pool.acquire() as conn:
        rows = await apps.page(conn, r.pid, None, 500)
    return r.page("apps.html", title="Apps", apps=[serialize.app(a) for a in rows])


async def sync_app(r: Req) -> Response:
    async with r.orch.pool.acquire() as conn:
        row = await apps.get(conn, r.pid, r.request.path_params["app"])
    if row is None:
        return r.back("/ui/apps", "There is no such app.")
    if row["kind"] == "pull":
        message = f"{row['name']} is a pull app: its workers sync it as they start."
        return r.back("/ui/apps", message)
    try:
        done = await appsync.sync(r.orch, row)
    except (appsync.SyncFailed, apps.WorkflowsTaken) as exc:
        return r.back("/ui/apps", f"Not synced: {exc}")
    except ValidationError as exc:
        return r.back("/ui/apps", f"Not synced: {exc.errors()[0]['msg']}")
    names = ", ".join(n for n, _ in done.workflows) or "no workflows"
    return r.back("/ui/apps", f"Synced {row['name']}: {names}.")


async def change_workflow(r: Req) -> Response:
    """Pause or resume a workflow (the action the path names)."""
    name, action = r.request.path_params["name"], r.request.url.path.rsplit("/", 1)[1]
    async with r.orch.pool.acquire() as conn:
        paused = action != "resume"
        row = await actions.set_workflow_paused(r.orch, conn, r.pid, name, paused=paused)
    if row is None:
        return r.back("/ui/workflows", "There is no such workflow.")
    if not paused:
        return r.back("/ui/workflows", f"Resumed {name}: its waiting runs go on.")
    return r.back("/ui/workflows", f"Paused {name}: none of its runs is invoked until resumed.")


async def change_app(r: Req) -> Response:
    """Pause or resume an app (the action the path names)."""
    action = r.request.url.path.rsplit("/", 1)[1]
    async with r.orch.pool.acquire() as conn:
        row = await apps.get(conn, r.pid, r.request.path_params["app"])
        if row is not None:
            paused = action != "resume"
            row = await actions.set_app_paused(r.orch, conn, r.pid, row["id"], paused=paused)
    if row is None:
        return r.back("/ui/apps", "There is no such app.")
    if action == "resume":
        return r.back("/ui/apps", f"Resumed {row['name']}: its waiting runs go on.")
    return r.back("/ui/apps", f"Paused {row['name']}: none of its runs is invoked until resumed.")


async def schedules_page(r: Req) -> Response:
    async with r.orch.read_pool.acquire() as conn:
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
                run = await actions.trigger_schedule(r.orch, conn, r.pid, sid, now)
                if run is None:
                    return r.back("/ui/schedules", "There is no such schedule.")
                return r.back(f"/ui/runs/{run['id']}", f"Schedule {sid} triggered this run.")
            change = {"pause": schedules.pause, "resume": schedules.resume}.get(action)
            if change is None:
                return r.back("/ui/schedules", "Unknown action.")
            row = await change(conn, r.pid, sid, now)
        except (schedules.InvalidTransition, schedules.WorkflowGone) as exc:
            return r.back("/ui/schedules", f"Not done: {exc}")
    if row is None:
        return r.back("/ui/schedules", "There is no such schedule.")
    actions.schedules_changed(r.orch)
    return r.back("/ui/schedules", f"Schedule {sid} is {row['status']}.")


async def events_page(r: Req) -> Response:
    """The send form, and the events received (kept a day) with the runs each resumed and
    started."""
    async with r.orch.read_pool.acquire() as conn:
        received = [_event(e) for e in await received_events.recent(conn, r.pid, EVENTS_SHOWN)]
        ids = {uuid.UUID(i) for e in received for i in e["resumed"] + e["started"]}
        found = await received_events.runs_named(conn, r.pid, sorted(ids))
    named = {str(x["id"]): {"workflow": x["workflow"], "status": x["status"]} for x in found}
    return r.page("events.html", title="Events", received=received, runs=named)


def _event(row: Record) -> dict[str, Any]:
    answer = row["answer"] or {}
    return {
        "id": str(row["id"]),
        "name": row["name"],
        "data": row["data"],
        "key": row["key"],
        "receivedAt": serialize.ts(row["received_at"]),
        "resumed": list(answer.get("matched", [])),
        "started": list(answer.get("started", [])),
    }


async def send_event(r: Req) -> Response:
    name = r.form.get("name", "").strip()
    if not 1 <= len(name) <= 256:
        return r.back("/ui/events", "Not sent: an event needs a name (at most 256 characters).")
    try:
        data = payloads.parse_text(r.form.get("data") or "null", what="the data")
    except payloads.BadPayload as exc:
        return r.back("/ui/events", f"Not sent: {exc.message}.")
    async with r.orch.pool.acquire() as conn:
        _, sent = await actions.send_event(r.orch, conn, r.pid, name, data)
    return r.back(
        "/ui/events",
        f"Event {name} sent: {len(sent.matched)} waiting run(s) resumed, "
        f"{len(sent.started)} started.",
    )


async def keys_page(r: Req, made: dict[str, str] | None = None, status: int = 200) -> Response:
    """The keys an admin key manages (its environment's; an owner key's: every environment's),
    and, once, a key just made."""
    assert r.viewer is not None
    if not permissions.is_admin(r.viewer):
        return r.page("error.html", 403, title="Refused", message="Keys are for admin keys.")
    owner = permissions.is_owner(r.viewer)
    async with r.orch.pool.acquire() as conn:
        if owner and r.viewer.project_uuid is not None:
            rows = await keys.project_keys(conn, r.viewer.project_uuid)
            environments = [e["name"] for e in await keys.environments(conn, r.viewer.project_uuid)]
        else:
            rows = await keys.environment_keys(conn, r.pid)
            environments = [r.viewer.environment]
    roles = [role for role in access.ROLE_RANK if access.may_grant(r.viewer.role, role)]
    return r.page(
        "keys.html",
        status,
        title="Keys",
        keys=[_key(k) for k in rows],
        roles=list(reversed(roles)),
        environments=environments,
        environment=r.viewer.environment,
        owner=owner,
        made=made,
    )


def _key(row: Record) -> dict[str, object]:
    return {
        "id": str(row["id"]),
        "name": row["name"],
        "role": row["role"],
        "environment": row["environment"],
        "prefix": row["prefix"],
        "createdAt": serialize.ts(row["created_at"]),
    }


async def create_key(r: Req) -> Response:
    """An admin makes a key of its environment (an owner of any environment of the project);
    the key is shown once, in the answer to this form, and is never put in a cookie."""
    assert r.viewer is not None
    if not permissions.is_admin(r.viewer):
        return r.page("error.html", 403, title="Refused", message="Keys are for admin keys.")
    name = r.form.get("name", "").strip() or "dashboard"
    role = r.form.get("role", "read")
    environment = r.form.get("environment") or r.viewer.environment
    if not access.may_grant(r.viewer.role, role) or len(name) > 128:
        return r.back("/ui/keys", "Not made: choose a role you may grant, and a shorter name.")
    env_id = r.pid
    async with r.orch.pool.acquire() as conn:
        if environment != r.viewer.environment:
            env = None
            if permissions.is_owner(r.viewer) and r.viewer.project_uuid is not None:
                env = await keys.find_environment(conn, r.viewer.project_uuid, environment)
            if env is None:
                return r.back("/ui/keys", "Not made: an admin key makes keys of its environment.")
            env_id = env["id"]
        _, key = await keys.insert_key(conn, name, env_id, role)
    made = {"name": name, "role": role, "environment": environment, "key": key}
    return await keys_page(r, made, 201)


async def revoke_key(r: Req) -> Response:
    """An admin revokes a key of its environment (an owner of any environment; an admin never
    an owner key): refused from then on, everywhere, and its dashboard sessions end."""
    assert r.viewer is not None
    if not permissions.is_admin(r.viewer):
        return r.page("error.html", 403, title="Refused", message="Keys are for admin keys.")
    key_id = uuid.UUID(r.request.path_params["keyId"])  # checked before (params.py)
    owner = permissions.is_owner(r.viewer)
    async with r.orch.pool.acquire() as conn:
        done = await keys.revoke_key(
            conn,
            key_id,
            None if owner else r.pid,
            project_id=r.viewer.project_uuid,
            protected=access.protected_from(r.viewer.role),
        )
    return r.back("/ui/keys", "Key revoked." if done else "There is no such key.")
