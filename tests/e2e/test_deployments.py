"""Deployments: an app at two URLs at once, each run invoked at the deployment it started on
until it ends or is moved; deleting a deployment with runs on it; pull workers that declare
their deployment."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from typing import Any

import httpx
import pytest

import stepline
from stepline._worker import Worker
from tests.dashboard_forms import Dashboard
from tests.ports import free_port
from tests.support import Stack, app_server, orchestrator_stack, until


def _versioned(version: str, calls: list[str]) -> stepline.Stepline:
    """An app whose ``job`` records which version ran each of its two steps around a sleep."""
    sl = stepline.Stepline("shared-secret")

    @sl.workflow("job")
    async def job(ctx: stepline.Context, input: Any) -> Any:
        def here(step: str) -> str:
            calls.append(f"{version}:{step}")
            return version

        before = await ctx.step("before", lambda: here("before"))
        await ctx.sleep("nap", f"{input}s")
        after = await ctx.step("after", lambda: here("after"))
        return [before, after]

    return sl


async def test_runs_stay_on_their_deployment_until_moved(database_url: str) -> None:
    calls: list[str] = []
    v1, v2 = _versioned("v1", calls), _versioned("v2", calls)
    async with (
        orchestrator_stack(database_url) as stack,
        app_server(v1) as url1,
        app_server(v2) as url2,
    ):
        slug = await stack.register(v1, url1)
        c = stack.client
        (first,) = (await c.list_deployments(slug))["deployments"]
        assert first["url"] == url1 and first["current"] is True
        stays = await c.start_run("job", 2)
        moved = await c.start_run("job", 2)
        bulk = [await c.start_run("job", 2, run_key=f"bulk-{i}") for i in range(2)]
        await until(_counted(calls, "v1:before", 4), "the runs to start on v1")
        assert stays["deployment"] == first["id"]

        created = await c.create_deployment(slug, url2, deployment_id="v2")
        assert created["current"] is True and created["deploymentId"] == "v2"
        assert created["url"] == url2
        listed = (await c.list_deployments(slug))["deployments"]
        assert [d["id"] for d in listed] == [created["id"], first["id"]]
        assert [d["runningRuns"] for d in listed] == [0, 4]
        assert (await c.get_app(slug))["url"] == url2

        fresh = await c.start_run("job", 0)
        assert fresh["deployment"] == created["id"]
        got = await c.move_run(moved["id"], "v2")  # by the id it goes by
        assert got["deployment"] == created["id"]
        op = await c.bulk_runs("move", {"runKey": "bulk-*"}, deployment=created["id"])
        await until(
            lambda: _done(c, op["id"]),
            "the bulk move",
        )
        outputs = {}
        for run in (stays, moved, fresh, *bulk):
            ended = await c.wait_run(run["id"], timeout=30)
            assert ended["status"] == "completed", ended
            outputs[run["id"]] = ended["output"]
        assert outputs[stays["id"]] == ["v1", "v1"]  # v2 became current mid-run: not its code
        assert outputs[moved["id"]] == ["v1", "v2"]
        assert outputs[fresh["id"]] == ["v2", "v2"]
        assert [outputs[r["id"]] for r in bulk] == [["v1", "v2"]] * 2
        assert calls.count("v1:after") == 1 and calls.count("v2:before") == 1
        # Each invocation's history names the deployment it went to.
        events = (await c.list_run_events(stays["id"]))["events"]
        started = [e for e in events if e["type"] == "invocation.started"]
        assert started and all(e["deploymentId"] != "v2" for e in started)


def _counted(calls: list[str], call: str, n: int) -> Any:
    async def probe() -> bool:
        return calls.count(call) >= n

    return probe


async def _done(c: stepline.AsyncClient, op_id: str) -> bool:
    return (await c.get_operation(op_id))["status"] == "completed"


async def test_a_deployment_with_runs_is_not_deleted_by_accident(database_url: str) -> None:
    calls: list[str] = []
    v1, v2 = _versioned("v1", calls), _versioned("v2", calls)
    async with (
        orchestrator_stack(database_url) as stack,
        app_server(v1) as url1,
        app_server(v2) as url2,
    ):
        slug = await stack.register(v1, url1)
        c = stack.client
        (old,) = (await c.list_deployments(slug))["deployments"]
        run = await c.start_run("job", 60)
        await until(_counted(calls, "v1:before", 1), "the run to start")
        new = await c.create_deployment(slug, url2)
        assert new["deploymentId"]  # the id the app answered at its sync
        auth = {"authorization": f"Bearer {stack.api_key}"}
        async with httpx.AsyncClient(base_url=stack.url, headers=auth) as http:
            path = f"/v1/apps/{slug}/deployments"
            refused = await http.delete(f"{path}/{old['id']}")
            assert refused.status_code == 409, refused.text
            assert refused.json()["error"]["details"] == {"runningRuns": 1}
            current = await http.delete(f"{path}/{new['id']}?moveTo=current")
            assert current.status_code == 409  # the current one is never deleted
            bad = await http.delete(f"{path}/{old['id']}?moveTo=elsewhere")
            assert bad.status_code == 422
            assert (await c.get_run(run["id"]))["deployment"] == old["id"]
            done = await http.delete(f"{path}/{old['id']}?moveTo=current")
            assert done.status_code == 204, done.text
            assert (await http.get(f"{path}/{old['id']}")).status_code == 404
            unknown = await http.post(f"/v1/runs/{run['id']}/move", json={"deployment": "nope"})
            assert unknown.status_code == 422
        assert (await c.get_run(run["id"]))["deployment"] == new["id"]
        (only,) = (await c.list_deployments(slug))["deployments"]
        assert only["id"] == new["id"] and only["runningRuns"] == 1


async def test_sync_of_an_unreachable_deployment_changes_nothing(database_url: str) -> None:
    v1 = _versioned("v1", [])
    async with orchestrator_stack(database_url) as stack, app_server(v1) as url1:
        slug = await stack.register(v1, url1)
        auth = {"authorization": f"Bearer {stack.api_key}"}
        async with httpx.AsyncClient(base_url=stack.url, headers=auth) as http:
            path = f"/v1/apps/{slug}/deployments"
            gone = await http.post(path, json={"url": f"http://127.0.0.1:{free_port()}/"})
            assert gone.status_code == 502, gone.text
            missing = await http.post(path, json={})
            assert missing.status_code == 422
        (one,) = (await stack.client.list_deployments(slug))["deployments"]
        assert one["url"] == url1


def _pulled(color: str, done: list[str]) -> stepline.Stepline:
    sl = stepline.Stepline("pull-secret")

    @sl.workflow("paint")
    async def paint(ctx: stepline.Context, input: Any) -> Any:
        done.append(color)
        return color

    return sl


async def test_pull_workers_get_only_their_deployments_runs(database_url: str) -> None:
    done: list[str] = []
    async with orchestrator_stack(database_url) as stack:
        c = stack.client
        slug = await stack.register_pull()
        await c.create_deployment(slug, deployment_id="green")
        green = Worker(
            _pulled("green", done), stack.url, stack.api_key, slug, wait=1.0, deployment="green"
        )
        await green.sync()
        first = await c.start_run("paint", None)
        await c.create_deployment(slug, deployment_id="blue")
        second = await c.start_run("paint", None)
        blue = Worker(
            _pulled("blue", done), stack.url, stack.api_key, slug, wait=1.0, deployment="blue"
        )
        await blue.sync()
        task = asyncio.create_task(blue.run())
        try:
            ended = await c.wait_run(second["id"], timeout=20)
            assert ended["output"] == "blue"
            await asyncio.sleep(1.5)  # a poll or more later, blue has not taken green's run
            assert (await c.get_run(first["id"]))["status"] == "running"
        finally:
            blue.stop()
            await task
        task = asyncio.create_task(green.run())
        try:
            ended = await c.wait_run(first["id"], timeout=20)
            assert ended["output"] == "green"
        finally:
            green.stop()
            await task
        assert done == ["blue", "green"]
        stray = Worker(_pulled("x", done), stack.url, stack.api_key, slug, deployment="red")
        with pytest.raises(Exception, match="404"):
            await stray.run()
        for w in (green, blue, stray):
            await w.aclose()


def _gated(color: str, gate: str, done: list[str]) -> stepline.Stepline:
    """A pull app whose ``paint`` has a concurrency cap or a rate limit (``gate``)."""
    sl = stepline.Stepline("pull-secret")
    gates: dict[str, Any] = (
        {"concurrency": 1}
        if gate == "capped"
        else {"rate_limit": stepline.RateLimit(limit=5, period="1m")}
    )

    @sl.workflow("paint", **gates)
    async def paint(ctx: stepline.Context, input: Any) -> Any:
        done.append(f"{color}:{input}")
        return color

    return sl


@pytest.mark.parametrize("gate", ["capped", "rate"])
async def test_gated_pull_runs_go_only_to_their_deployments_workers(
    database_url: str, gate: str
) -> None:
    done: list[str] = []
    async with orchestrator_stack(database_url) as stack:
        c = stack.client
        slug = await stack.register_pull()
        await c.create_deployment(slug, deployment_id="blue")
        blue = Worker(
            _gated("blue", gate, done), stack.url, stack.api_key, slug, wait=1.0,
            deployment="blue",
        )  # fmt: skip
        await blue.sync()
        old = [await c.start_run("paint", n) for n in (1, 2)]
        await c.create_deployment(slug, deployment_id="green")
        green = Worker(
            _gated("green", gate, done), stack.url, stack.api_key, slug, wait=1.0,
            deployment="green",
        )  # fmt: skip
        await green.sync()
        task = asyncio.create_task(green.run())
        try:
            await asyncio.sleep(2.5)  # polls go by: green takes none of blue's runs
            for run in old:
                assert (await c.get_run(run["id"]))["status"] == "running"
            new = await c.start_run("paint", 3)
            assert (await c.wait_run(new["id"], timeout=20))["output"] == "green"
        finally:
            green.stop()
            await task
        task = asyncio.create_task(blue.run())
        try:
            for run in old:
                assert (await c.wait_run(run["id"], timeout=20))["output"] == "blue"
        finally:
            blue.stop()
            await task
        assert done == ["green:3", "blue:1", "blue:2"]
        for w in (green, blue):
            await w.aclose()


async def _blue_and_green(stack: Stack) -> tuple[str, Any, Any, list[Any]]:
    """A pull app with two runs of ``paint`` on its deployment ``blue``, then ``green`` made
    its current one: its slug, the two deployments and the runs."""
    c = stack.client
    slug = await stack.register_pull()
    blue = await c.create_deployment(slug, deployment_id="blue")
    worker = Worker(_pulled("blue", []), stack.url, stack.api_key, slug, deployment="blue")
    await worker.sync()
    await worker.aclose()
    old = [await c.start_run("paint", n) for n in (1, 2)]
    green = await c.create_deployment(slug, deployment_id="green")
    return slug, blue, green, old


async def test_dashboard_moves_a_deployments_runs_and_deletes_it(database_url: str) -> None:
    async with orchestrator_stack(database_url) as stack, Dashboard(stack.url) as person:
        c = stack.client
        slug, blue, green, old = await _blue_and_green(stack)
        await person.sign_in(stack.api_key)
        apps_page = await person.get("/ui/apps")
        assert f'href="/ui/apps/{slug}"' in apps_page.text
        page = await person.get(f"/ui/apps/{slug}")
        assert page.status_code == 200
        rows = {d: page.text.split(d, 1)[1].split("</tr>", 1)[0] for d in (blue["id"], green["id"])}
        assert ">blue<" in rows[blue["id"]] and '"running-runs">2<' in rows[blue["id"]]
        assert "current" in rows[green["id"]] and '"running-runs">0<' in rows[green["id"]]
        here = f"/ui/apps/{slug}/deployments/{blue['id']}"
        refused = await person.post(f"{here}/delete")
        assert "Not deleted: 2 run(s) not ended" in person.flash(refused)
        unknown = await person.post(f"{here}/move", to="nowhere")
        assert "choose the deployment" in person.flash(unknown)
        moved = await person.post(f"{here}/move", to=green["id"])
        assert "/ui/operations/" in str(moved.url)
        op_id = str(moved.url).rstrip("/").rsplit("/", 1)[1]
        await until(lambda: _done(c, op_id), "the move to end")
        op = await c.get_operation(op_id)
        assert op["action"] == "move" and op["matched"] == 2
        for run in old:
            assert (await c.get_run(run["id"]))["deployment"] == green["id"]
        deleted = await person.post(f"{here}/delete")
        assert person.flash(deleted) == "Deleted deployment blue."
        assert blue["id"] not in deleted.text
        left = [d["id"] for d in (await c.list_deployments(slug))["deployments"]]
        assert blue["id"] not in left and green["id"] in left


async def test_a_bulk_filter_takes_a_deployment_as_the_dashboard_records_it(
    database_url: str,
) -> None:
    """The bulk filter's ``deployment`` takes the runs on one deployment of the app (a dry run
    counts them); an unknown deployment, one of another app or not an id is 422 naming
    ``filter.deployment``; an operation made with it shows the filter as the dashboard's move
    of a deployment's runs records it."""
    async with orchestrator_stack(database_url) as stack, Dashboard(stack.url) as person:
        c = stack.client
        slug, blue, green, old = await _blue_and_green(stack)
        other = await c.create_deployment(await stack.register_pull("other"), deployment_id="x")
        on_blue = {"app": slug, "deployment": blue["id"]}
        dry = await c.bulk_runs("move", on_blue, deployment=green["id"], dry_run=True)
        assert dry["matched"] == 2 and set(dry["sample"]) == {r["id"] for r in old}
        on_green = {"app": slug, "deployment": green["id"]}
        assert (await c.bulk_runs("move", on_green, deployment=blue["id"], dry_run=True)) == {
            "matched": 0,
            "sample": [],
        }
        for bad in (str(uuid.uuid4()), other["id"], "blue"):
            with pytest.raises(stepline.ApiError) as refused:
                await c.bulk_runs("move", {"app": slug, "deployment": bad}, deployment=green["id"])
            assert refused.value.status == 422, bad
            assert list(refused.value.details["fields"]) == ["filter.deployment"], bad
        assert (await c.list_operations())["operations"] == []
        made = await c.bulk_runs("move", on_blue, deployment=green["id"])
        await until(lambda: _done(c, made["id"]), "the move to end")
        for run in old:
            assert (await c.get_run(run["id"]))["deployment"] == green["id"]
        await person.sign_in(stack.api_key)
        back = await person.post(f"/ui/apps/{slug}/deployments/{green['id']}/move", to=blue["id"])
        op_id = str(back.url).rstrip("/").rsplit("/", 1)[1]
        await until(lambda: _done(c, op_id), "the move back to end")
        assert (await c.get_operation(made["id"]))["filter"] == on_blue
        by_dashboard = await c.get_operation(op_id)
        assert by_dashboard["filter"] == on_green and by_dashboard["matched"] == 2
        again = await c.bulk_runs("move", on_blue, deployment=green["id"], dry_run=True)
        assert again["matched"] == 2  # back on blue


def _cli(stack: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STEPLINE_URL": stack.url, "STEPLINE_API_KEY": stack.api_key}
    return subprocess.run(
        [sys.executable, "-m", "stepline_server.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_cli_lists_creates_moves_and_deletes(database_url: str) -> None:
    calls: list[str] = []
    v1, v2 = _versioned("v1", calls), _versioned("v2", calls)
    async with (
        orchestrator_stack(database_url) as stack,
        app_server(v1) as url1,
        app_server(v2) as url2,
    ):
        slug = await stack.register(v1, url1)
        run = await stack.client.start_run("job", 60)
        await until(_counted(calls, "v1:before", 1), "the run to start")
        (old,) = (await stack.client.list_deployments(slug))["deployments"]
        made = await asyncio.to_thread(
            _cli, stack, "apps", "deployments", "create", slug, url2, "--deployment-id", "v2"
        )
        assert made.returncode == 0, made.stderr
        assert "(v2) is current" in made.stdout
        listed = await asyncio.to_thread(_cli, stack, "apps", "deployments", "list", slug)
        assert listed.returncode == 0, listed.stderr
        assert url1 in listed.stdout and url2 in listed.stdout
        refused = await asyncio.to_thread(
            _cli, stack, "apps", "deployments", "delete", slug, old["id"]
        )
        assert refused.returncode != 0 and "1 run(s) not ended" in refused.stderr
        moved = await asyncio.to_thread(_cli, stack, "runs", "move", run["id"], "v2")
        assert moved.returncode == 0, moved.stderr
        assert (await stack.client.get_run(run["id"]))["deployment"] != old["id"]
        gone = await asyncio.to_thread(
            _cli, stack, "apps", "deployments", "delete", slug, old["id"], "--move-to", "current"
        )
        assert gone.returncode == 0, gone.stderr
        assert len((await stack.client.list_deployments(slug))["deployments"]) == 1
