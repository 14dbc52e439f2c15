"""An app's page: its deployments, each with its running runs; moving a deployment's runs to
another (the bulk action ``move``) and deleting a deployment no run is on."""

from __future__ import annotations

from starlette.responses import RedirectResponse, Response

from stepline_server.application import actions, serialize
from stepline_server.engine import bulk as rules
from stepline_server.engine import ids
from stepline_server.store import apps, deployments, operations
from stepline_server.store.db import Record
from stepline_server.ui import permissions
from stepline_server.ui.web import Req


async def app_page(r: Req) -> Response:
    """``GET /ui/apps/{app}``: the app and its deployments, newest first."""
    async with r.orch.read_pool.acquire() as conn:
        row = await apps.get(conn, r.pid, r.request.path_params["app"])
        if row is None:
            return r.page("error.html", 404, title="Not found", message="There is no such app.")
        rows = await deployments.listed(conn, row["id"])
    return r.page(
        "app.html",
        title=row["name"],
        app=serialize.app(row),
        deployments=[serialize.deployment(d) for d in rows],
    )


async def _chosen(r: Req) -> tuple[Record, Record] | str:
    """The app and the deployment the path names, or why there is none."""
    async with r.orch.pool.acquire() as conn:
        app = await apps.get(conn, r.pid, r.request.path_params["app"])
        if app is None:
            return "There is no such app."
        found = await deployments.get(conn, app["id"], r.request.path_params["deployment"])
    if found is None:
        return f"{app['name']} has no such deployment."
    return app, found


async def move_runs(r: Req) -> Response:
    """``POST /ui/apps/{app}/deployments/{deployment}/move``: an operation moves the runs on
    the deployment (not ended) to the deployment the form names (``to``); its progress."""
    chosen = await _chosen(r)
    if isinstance(chosen, str):
        return r.back("/ui/apps", chosen)
    app, source = chosen
    here = f"/ui/apps/{app['slug']}"
    async with r.orch.pool.acquire() as conn:
        target = await deployments.get(conn, app["id"], r.form.get("to", "")[:128])
        if target is None:
            return r.back(here, "Nothing was done: choose the deployment to move the runs to.")
        if target["id"] == source["id"]:
            return r.back(here, "Nothing was done: the runs are on that deployment already.")
        action = rules.Action.MOVE
        rules.check_deployment(action, str(target["id"]))
        selection = rules.select(
            action,
            status=None,
            run_key=None,
            trigger=None,
            created_after=None,
            created_before=None,
            app=app["slug"],
            on_deployment=str(source["id"]),
        )
        recorded = {"app": app["slug"], "deployment": str(source["id"])}
        row = await operations.create(
            conn, ids.new_id(), r.pid, action.value, recorded, selection, app["id"], target["id"]
        )
    actions.operation_queued(r.orch)
    return RedirectResponse(f"/ui/operations/{row['id']}", 303)


async def delete(r: Req) -> Response:
    """``POST /ui/apps/{app}/deployments/{deployment}/delete`` (admin): delete a deployment
    that is not the current one and has no runs not ended on it."""
    if r.viewer is None or not permissions.is_admin(r.viewer):
        return r.back("/ui/apps", "Only an admin key may delete a deployment.")
    chosen = await _chosen(r)
    if isinstance(chosen, str):
        return r.back("/ui/apps", chosen)
    app, found = chosen
    here = f"/ui/apps/{app['slug']}"
    name = found["deployment_id"] or str(found["id"])
    async with r.orch.pool.acquire() as conn:
        try:
            await deployments.delete(conn, app["id"], found, move=False)
        except deployments.IsCurrent as exc:
            return r.back(here, f"Not deleted: {exc}.")
        except deployments.RunsLeft as exc:
            return r.back(here, f"Not deleted: {exc}; move them first.")
    return r.back(here, f"Deleted deployment {name}.")
