"""``stepline dev MODULE:ATTR`` or ``stepline dev URL``: the orchestrator beside a user's app,
re-synced whenever its code changes.

With ``MODULE:ATTR`` (the app's :class:`stepline.Stepline`) the app is served by a child
process on ``127.0.0.1:--app-port`` (``devapp.py``), started again on every change; with a
loopback URL the app is one the user runs (with ``STEPLINE_SIGNING_SECRET`` set to the dev
secret) and reloads itself. Either way it is registered under ``--name`` with the dev secret,
synced, and watched (watchfiles, Python files only): after each change it is synced again and
the dev loop prints which workflows were added, removed or had their options changed, then
which runs in flight ``stepline replay-check`` says the new code would break.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import watchfiles

import stepline
from stepline_server.asgi import build_app
from stepline_server.cli import devapp, servers
from stepline_server.cli.runtime import database
from stepline_server.orchestrator import Orchestrator
from stepline_server.settings import Settings
from stepline_server.store import apps, keys

# For this machine only: the app of a dev loop signs with it, so an app the user runs can be
# started with it once and for all. Never use it for an orchestrator others can reach.
DEV_SECRET = "whsec_stepline_dev_only"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
WATCH_TICK_MS = 500  # the watcher wakes this often with no change (and first says it watches)
RELOAD_GRACE = 1.0  # after a change, how long an app reached by URL is given to reload


class DevError(Exception):
    """What the user asked for cannot be done; the message says why."""


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def check_url(url: str) -> str:
    """``url`` when it points at loopback; :class:`DevError` otherwise."""
    host = urlsplit(url).hostname or ""
    if host not in LOOPBACK_HOSTS:
        raise DevError(f"stepline dev reaches apps on loopback only, not {host or url!r}")
    return url


def changes(before: Mapping[str, dict[str, Any]], after: Mapping[str, dict[str, Any]]) -> list[str]:
    """What a sync changed, one line each: workflows added, removed, and each option changed
    (schemas are named, not printed)."""
    lines = [f"  + added {name}" for name in sorted(after.keys() - before.keys())]
    lines += [
        f"  - removed {name} (no longer in the code; its runs in flight cannot go on)"
        for name in sorted(before.keys() - after.keys())
    ]
    for name in sorted(before.keys() & after.keys()):
        old, new = before[name], after[name]
        for option in sorted(old.keys() | new.keys()):
            a, b = old.get(option), new.get(option)
            if a == b:
                continue
            if option.endswith("Schema"):
                lines.append(f"  ~ changed {name}: {option}")
            elif isinstance(a, dict) and isinstance(b, dict):  # e.g. retries: the fields that moved
                lines += [
                    f"  ~ changed {name}: {option}.{k} {_show(a.get(k))} -> {_show(b.get(k))}"
                    for k in sorted(a.keys() | b.keys())
                    if a.get(k) != b.get(k)
                ]
            else:
                lines.append(f"  ~ changed {name}: {option} {_show(a)} -> {_show(b)}")
    return lines


def _show(value: Any) -> str:
    return "-" if value is None else json.dumps(value, separators=(", ", ": "))


def watched(target: str, explicit: list[str]) -> list[Path]:
    """The folders to watch: ``--watch`` ones, else the target module's (its package's) folder,
    else (for a URL) the working folder."""
    if explicit:
        return [Path(p).resolve() for p in explicit]
    if is_url(target):
        return [Path.cwd()]
    top = target.partition(":")[0].split(".")[0]
    for base in [Path.cwd(), *map(Path, sys.path)]:
        if (base / top).is_dir():
            return [(base / top).resolve()]
        if (base / f"{top}.py").is_file():
            return [base.resolve()]
    return [Path.cwd()]


class Loop:
    """One dev loop: the orchestrator's client, the app's slug and what it hosted last."""

    def __init__(
        self,
        client: stepline.AsyncClient,
        base: str,
        key: str,
        slug: str,
        check: str | None,
        stop: asyncio.Event,
    ) -> None:
        self.client, self.base, self.key, self.slug, self.check = client, base, key, slug, check
        self.stop = stop  # set on Ctrl-C: no more retries
        self.hosted: dict[str, dict[str, Any]] | None = None

    async def registered(self) -> dict[str, dict[str, Any]]:
        page = await self.client.list_workflows(limit=500)
        return {w["name"]: w["options"] for w in page["workflows"] if w["app"] == self.slug}

    async def sync(self, *, patient: bool) -> bool:
        """Sync the app and print what changed; with ``patient``, retry while it (re)starts."""
        before = self.hosted if self.hosted is not None else await self.registered()
        tries = int(devapp.READY_SECONDS / 0.5) if patient else 1
        for attempt in range(tries):
            try:
                answer = await self.client.sync_app(self.slug)
                break
            except stepline.ApiError as exc:
                taken = exc.code == "invalid_state"  # another app has one of its workflows
                if taken or attempt + 1 >= tries or self.stop.is_set():
                    _say(f"Not synced: {exc.message}")
                    if "signature" in exc.message:
                        _say(f"  start the app with STEPLINE_SIGNING_SECRET={DEV_SECRET}")
                    return False
                await asyncio.sleep(0.5)
        self.hosted = {w["name"]: w["options"] for w in answer["workflows"]}
        names = ", ".join(sorted(self.hosted)) or "none"
        _say(f"Synced {answer['app']['name']}: workflows {names}")
        for line in changes(before, self.hosted) or ["  (no workflow changed)"]:
            _say(line)
        await self.replay_check()
        return True

    async def replay_check(self) -> None:
        """Print which running runs the code now would break (``stepline replay-check``)."""
        if self.check is None:
            return
        argv = [self.check, "--status", "running", "--json", "--url", self.base]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "import sys; from stepline.cli.replaycheck import main; sys.exit(main(sys.argv[1:]))",
            *argv,
            "--api-key",
            self.key,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        try:
            report = json.loads(out)
        except ValueError:
            _say("replay-check did not run: " + err.decode(errors="replace").strip()[-500:])
            return
        if not report["checked"]:
            _say("replay-check: no runs in flight")
            return
        _say(
            f"replay-check: {report['checked']} run(s) in flight: {report['ok']} ok, "
            f"{report['differs']} would break, {report['warn']} warn"
        )
        for item in report["runs"]:
            if item["result"] != "ok":
                _say(f"  {item['result']} {item['runId']} {item['workflow']}: {item['summary']}")


async def _changes(paths: list[Path], stop: asyncio.Event) -> AsyncIterator[set[str]]:
    """The names of the Python files each save changed, until ``stop``. "Watching" is printed
    once the watch is in place (its first wake-up), so no save made after it is missed."""
    flt = watchfiles.PythonFilter(ignore_paths=[Path.cwd() / ".stepline"])
    announced = False
    async for batch in watchfiles.awatch(
        *paths, watch_filter=flt, stop_event=stop, yield_on_timeout=True, rust_timeout=WATCH_TICK_MS
    ):
        if not announced:
            announced = True
            _say("Watching " + ", ".join(map(str, paths)) + " for changes; Ctrl-C to stop.")
        if batch:
            yield {Path(p).name for _, p in batch}


def _say(line: str) -> None:
    print(line, flush=True)


async def _app_row(orch: Orchestrator, name: str, url: str) -> Any:
    """The dev app ``name`` at ``url`` signing with the dev secret, made or updated."""
    async with orch.pool.acquire() as conn:
        row = await apps.get_by_name(conn, keys.DEFAULT_PROJECT, name)
        if row is not None and DEV_SECRET not in row["signing_secrets"]:
            raise DevError(
                f"an app named {name!r} exists with its own signing secret; choose another"
                " name with --name"
            )
        if row is None:
            row = await apps.create(conn, keys.DEFAULT_PROJECT, name, url, DEV_SECRET)
        elif row["url"] != url:
            row = await apps.update(conn, keys.DEFAULT_PROJECT, row["id"], url, None)
        assert row is not None
        key = await keys.create_key(conn, "dev")
    return row, key


async def serve(settings: Settings, target: str, options: Any) -> int:
    """The dev loop until Ctrl-C (or, with ``options.once``, after the first sync)."""
    child = None if is_url(target) else devapp.ChildApp(target, options.app_port, DEV_SECRET)
    try:
        url = check_url(target) if child is None else child.url
    except DevError as exc:
        print(f"stepline dev: {exc}", file=sys.stderr)
        return 1
    name = options.name or ("dev" if child is None else target.partition(":")[0].split(".")[0])
    check = options.check or (None if child is None else target)
    stop = asyncio.Event()
    async with database(settings) as (dsn, where):
        orch = Orchestrator(settings, dsn)
        api = servers.server(build_app(orch), settings.host, settings.port)
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            api.should_exit = True
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        api_task = asyncio.create_task(api.serve())
        try:
            while not api.started:
                if api_task.done():
                    api_task.result()
                    raise DevError("the orchestrator could not start (is the port taken?)")
                await asyncio.sleep(0.02)
            row, key = await _app_row(orch, name, url)
            base = settings.base_url
            _say(f"Stepline orchestrator: {base}  ({where})")
            _say(f"Dashboard: {base}/ui/  API key (dev): {key}")
            _say(f"App {name} ({row['slug']}) at {url}, signing secret {DEV_SECRET}")
            async with stepline.AsyncClient(base, api_key=key) as client:
                dev = Loop(client, base, key, row["slug"], check, stop)
                synced = False
                if child is not None:
                    child.start()
                    if not await child.ready():
                        _say("The app did not start; fix it and save again.")
                    else:
                        synced = await dev.sync(patient=True)
                else:
                    synced = await dev.sync(patient=True)
                if options.once:
                    return 0 if synced else 1
                async for files in _changes(watched(target, options.watch), stop):
                    _say(f"\nChanged: {', '.join(sorted(files))}")
                    if child is not None:
                        await child.stop()
                        child.start()
                        if not await child.ready():
                            _say("The app did not start; fix it and save again.")
                            continue
                    else:  # the user's own server reloads itself: give it a moment
                        await asyncio.sleep(RELOAD_GRACE)
                    await dev.sync(patient=True)
            return 0
        except (DevError, httpx.HTTPError) as exc:
            print(f"stepline dev: {exc}", file=sys.stderr)
            return 1
        finally:
            if child is not None:
                await child.stop()
            api.should_exit = True
            with contextlib.suppress(Exception):
                await api_task
