"""``stepline dev``: embedded PostgreSQL, the orchestrator and the example app in one process.

It registers and syncs the example app from ``examples/app.py``, prints an API key, runs one
real workflow end to end while printing its steps, and shows how to start more with curl.
"""

from __future__ import annotations

import asyncio
import importlib.util
import shlex
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import uvicorn

import stepline
from stepline_server.asgi import build_app
from stepline_server.cli import servers, tenancy
from stepline_server.cli.runtime import database, run_async
from stepline_server.engine import egress
from stepline_server.orchestrator import Orchestrator
from stepline_server.settings import Settings
from stepline_server.store import apps, keys

APP_NAME = "example"


def _example_module() -> ModuleType:
    """``examples/app.py`` of the working folder, else of the source tree."""
    candidates = [
        Path.cwd() / "examples" / "app.py",
        Path(__file__).resolve().parents[3] / "examples" / "app.py",
    ]
    for path in candidates:
        if path.is_file():
            spec = importlib.util.spec_from_file_location("stepline_example_app", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            return module
    raise SystemExit("examples/app.py was not found: run `stepline dev` from the project folder")


async def _started(server: uvicorn.Server, task: asyncio.Task[None]) -> None:
    while not server.started:
        if task.done():
            task.result()
            raise SystemExit("a server could not start (is the port taken?)")
        await asyncio.sleep(0.02)


async def _dev(settings: Settings, app_port: int, once: bool) -> int:
    module = _example_module()
    sl: stepline.Stepline = module.sl
    async with database(settings) as (dsn, where):
        orch = Orchestrator(settings, dsn)
        api = servers.server(build_app(orch), settings.host, settings.port)
        user_app = servers.server(module.app, "127.0.0.1", app_port)
        servers.stop_on_signals(api, user_app)
        api_task = asyncio.create_task(api.serve())
        await _started(api, api_task)
        app_url = f"http://127.0.0.1:{app_port}/stepline/"
        async with orch.pool.acquire() as conn:
            row = await apps.get_by_name(conn, keys.DEFAULT_PROJECT, APP_NAME)
            if row is None:
                row = await apps.create(conn, keys.DEFAULT_PROJECT, APP_NAME, app_url)
            elif row["url"] != app_url:
                row = await apps.update(conn, keys.DEFAULT_PROJECT, row["id"], app_url, None)
            assert row is not None
            key = await tenancy.dev_key(conn, settings.data_dir)
        sl.signing_secrets = tuple(row["signing_secrets"])
        app_task = asyncio.create_task(user_app.serve())
        await _started(user_app, app_task)
        base = settings.base_url
        try:
            async with stepline.AsyncClient(base, api_key=key) as client:
                synced = await client.sync_app(row["slug"])
                names = ", ".join(w["name"] for w in synced["workflows"])
                print(f"Stepline orchestrator: {base}  ({where})")
                print(f"Example app {row['slug']} at {app_url} with workflows: {names}")
                print(f"API key (dev): {key}")
                print(f"Dashboard: {base}/ui/  (sign in with the key above)\n")
                run_id = await _demo(client)
                print(f"\nSee it: {base}/ui/runs/{run_id}")
                print("Start more runs:")
                print(f"  curl -s -X POST {base}/v1/runs -H 'Authorization: Bearer {key}' \\")
                print("       -H 'content-type: application/json' \\")
                print('       -d \'{"workflow": "onboard-customer", "input": {"userId": "u2"}}\'')
                print(
                    f"  curl -s '{base}/v1/runs/{run_id}?wait=30s' -H 'Authorization: Bearer {key}'"
                )
                print(
                    f"  STEPLINE_URL={base} STEPLINE_API_KEY={key} {stepline_command()} runs list"
                )
                if once:
                    return 0
                print("\nPress Ctrl-C to stop.")
                await asyncio.wait({api_task, app_task}, return_when=asyncio.FIRST_COMPLETED)
                return 0
        finally:
            user_app.should_exit = True
            api.should_exit = True
            await asyncio.gather(api_task, app_task, return_exceptions=True)


def stepline_command() -> str:
    """This ``stepline`` as a shell here runs it: by name when PATH finds this one, else by its
    path (relative to the working folder when under it, e.g. ``.venv/bin/stepline`` after
    ``make dev``, whose virtualenv is not activated)."""
    script = Path(sys.executable).parent / "stepline"  # the virtualenv's, beside its python
    if not script.is_file():
        return f"{shlex.quote(sys.executable)} -m stepline_server.cli.main"
    found = shutil.which("stepline")
    if found is not None and Path(found).resolve() == script.resolve():
        return "stepline"
    try:
        near = script.relative_to(Path.cwd())
    except ValueError:
        return shlex.quote(str(script))
    return shlex.quote(str(near) if len(near.parts) > 1 else f"./{near}")


async def _demo(client: stepline.AsyncClient) -> str:
    """Run the demo workflow while printing its steps; answer its run id."""
    run = await client.start_run("onboard-customer", {"userId": "u1", "coolOff": "2s"})
    print(f"Demo run {run['id']} of onboard-customer started:")
    shown: set[tuple[str, str]] = set()
    while True:
        current = await client.get_run(
            run["id"],
        )
        for step in current.get("steps", []):
            key = (step["name"], step["status"])
            if key not in shown:
                shown.add(key)
                extra = (
                    f" until {step['wakeAt']}"
                    if step.get("wakeAt") and step["status"] == "sleeping"
                    else ""
                )
                print(f"  step {step['name']:<16} {step['kind']:<6} {step['status']}{extra}")
        if current["status"] not in ("running", "cancelling"):
            break
        await asyncio.sleep(0.2)
    print(f"Run {current['status']}: output {current['output']}")
    events = await client.list_run_events(run["id"], limit=500)
    print(
        f"History: {len(events['events'])} events, e.g. "
        + ", ".join(e["type"] for e in events["events"][:6])
        + ", ..."
    )
    return str(run["id"])


def _with_loopback(settings: Settings) -> Settings:
    if settings.app_networks:
        return settings.with_(app_networks=settings.app_networks + egress.LOOPBACK)
    return settings


def run_loop(settings: Settings, args: Any) -> int:
    """``stepline dev MODULE:ATTR`` or ``stepline dev URL`` (``devloop.py``) until Ctrl-C."""
    from stepline_server.cli import devloop

    result = 0

    async def main() -> None:
        nonlocal result
        result = await devloop.serve(_with_loopback(settings), args.app, args)

    run_async(main())
    return result


def run(settings: Settings, *, app_port: int, once: bool) -> int:
    """Run the dev stack until Ctrl-C (or, with ``once``, until the demo run ends).

    Loopback is always allowed (the example app runs there), whatever STEPLINE_APP_NETWORKS
    lists."""
    settings = _with_loopback(settings)
    result = 0

    async def main() -> None:
        nonlocal result
        result = await _dev(settings, app_port, once)

    run_async(main())
    return result
