"""Real answers of the orchestrator validate against openapi.yaml's response schemas."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

import stepline
from tests.support import Stack, app_server, orchestrator_stack

SPEC = yaml.safe_load((Path(__file__).resolve().parents[2] / "openapi.yaml").read_text())
REGISTRY = Registry().with_resource("spec", Resource.from_contents(SPEC, DRAFT202012))


def check(method: str, template: str, response: httpx.Response) -> None:
    """Validate ``response`` against the spec's schema for that route and status."""
    operation = SPEC["paths"][template][method.lower()]
    documented = operation["responses"][str(response.status_code)]
    if "$ref" in documented:
        documented = SPEC["components"]["responses"][documented["$ref"].rsplit("/", 1)[1]]
    content = documented.get("content", {}).get("application/json")
    if content is None:
        assert not response.content or response.status_code == 204
        return
    schema = {
        "$ref": "spec#/"
        + "/".join(
            [
                "paths",
                template.replace("/", "~1"),
                method.lower(),
                "responses",
                str(response.status_code),
                "content",
                "application~1json",
                "schema",
            ]
        )
    }
    if "$ref" in operation["responses"][str(response.status_code)]:
        name = operation["responses"][str(response.status_code)]["$ref"].rsplit("/", 1)[1]
        schema = {"$ref": f"spec#/components/responses/{name}/content/application~1json/schema"}
    validator = jsonschema.Draft202012Validator(schema, registry=REGISTRY)
    errors = sorted(validator.iter_errors(response.json()), key=lambda e: list(e.path))
    assert not errors, f"{method} {template} {response.status_code}: " + "; ".join(
        f"{list(e.path)}: {e.message}" for e in errors[:5]
    )


async def call(stack: Stack, method: str, path: str, template: str, **kw: Any) -> Any:
    async with httpx.AsyncClient(base_url=stack.url) as http:
        response = await http.request(
            method, path, headers={"authorization": f"Bearer {stack.api_key}"}, **kw
        )
    check(method, template, response)
    return response.json() if response.content else None


async def test_answers_match_the_contract(database_url: str) -> None:
    """Apps, workflows, runs, history, callbacks, events, schedules and errors answer as
    documented (a callback body that cannot be stored is a documented 422)."""
    sl = stepline.Stepline("contract")

    @sl.workflow("wf")
    async def wf(ctx: stepline.Context, input: Any) -> Any:
        cb = await ctx.callback("cb", timeout="1m")
        await ctx.step("s", lambda: 1)
        return await cb.wait()

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        app = await call(stack, "POST", "/v1/apps", "/v1/apps", json={"name": "a", "url": url})
        await call(stack, "GET", "/v1/apps", "/v1/apps")
        await call(stack, "GET", f"/v1/apps/{app['slug']}", "/v1/apps/{app}")
        await call(stack, "PATCH", f"/v1/apps/{app['slug']}", "/v1/apps/{app}", json={"url": url})
        await stack.orchestrator.pool.execute(
            "UPDATE apps SET signing_secrets = '{contract}' WHERE slug = $1", app["slug"]
        )
        await call(stack, "POST", f"/v1/apps/{app['slug']}/sync", "/v1/apps/{app}/sync")
        await call(stack, "GET", "/v1/workflows", "/v1/workflows")
        run = await call(stack, "POST", "/v1/runs", "/v1/runs", json={"workflow": "wf"})
        await call(stack, "GET", "/v1/runs", "/v1/runs")
        waiting = await stack.client.wait_run(run["id"], timeout=2)
        while not any(s.get("callbackId") for s in waiting["steps"]):
            waiting = await stack.client.get_run(run["id"])
        cb_id = next(s["callbackId"] for s in waiting["steps"] if s.get("callbackId"))
        replay = f"/v1/runs/{run['id']}/replay"
        history = await call(stack, "GET", replay, "/v1/runs/{runId}/replay")
        first = history["steps"][0]
        assert (first["name"], first["status"]) == ("cb", "waiting")
        assert first["callbackUrl"] and first["callbackId"] == cb_id
        await call(stack, "GET", f"/v1/callbacks/{cb_id}", "/v1/callbacks/{callbackId}")
        await call(
            stack, "POST", f"/v1/callbacks/{cb_id}", "/v1/callbacks/{callbackId}", json="\x00"
        )  # 422: a body that cannot be stored
        await call(
            stack, "POST", f"/v1/callbacks/{cb_id}", "/v1/callbacks/{callbackId}", json={"ok": True}
        )
        await call(
            stack, "POST", f"/v1/callbacks/{cb_id}", "/v1/callbacks/{callbackId}", json={"ok": True}
        )  # 409
        await stack.client.wait_run(run["id"], timeout=20)
        await call(stack, "GET", f"/v1/runs/{run['id']}?wait=1s", "/v1/runs/{runId}")
        await call(stack, "GET", f"/v1/runs/{run['id']}/events", "/v1/runs/{runId}/events")
        await call(stack, "GET", replay, "/v1/runs/{runId}/replay")
        await call(stack, "GET", f"/v1/runs/{uuid.uuid4()}/replay", "/v1/runs/{runId}/replay")
        await call(stack, "POST", f"/v1/runs/{run['id']}/cancel", "/v1/runs/{runId}/cancel")
        await call(stack, "POST", f"/v1/runs/{run['id']}/retry", "/v1/runs/{runId}/retry")
        bulk = {"action": "cancel", "filter": {"workflow": "wf", "status": ["running"]}}
        await call(stack, "POST", "/v1/runs/bulk", "/v1/runs/bulk", json=bulk | {"dryRun": True})
        op = await call(stack, "POST", "/v1/runs/bulk", "/v1/runs/bulk", json=bulk)
        await call(stack, "POST", "/v1/runs/bulk", "/v1/runs/bulk", json={"action": "x"})  # 422
        await call(stack, "GET", "/v1/operations", "/v1/operations")
        one_op = f"/v1/operations/{op['id']}"
        await call(stack, "GET", one_op, "/v1/operations/{operationId}")
        await call(stack, "POST", one_op + "/cancel", "/v1/operations/{operationId}/cancel")
        await call(stack, "POST", one_op + "/cancel", "/v1/operations/{operationId}/cancel")
        await call(stack, "POST", "/v1/events", "/v1/events", json={"name": "e", "data": {}})
        await call(stack, "POST", "/v1/runs", "/v1/runs", content=b"{")  # 400
        await call(stack, "POST", "/v1/runs", "/v1/runs", json={"workflow": "nope"})  # 404
        sched = await call(
            stack,
            "POST",
            "/v1/schedules",
            "/v1/schedules",
            json={"workflow": "wf", "cron": "0 3 * * *", "timezone": "UTC"},
        )
        one = f"/v1/schedules/{sched['id']}"
        await call(stack, "GET", "/v1/schedules", "/v1/schedules")
        await call(stack, "GET", one, "/v1/schedules/{scheduleId}")
        await call(stack, "PATCH", one, "/v1/schedules/{scheduleId}", json={"cron": "@daily"})
        await call(stack, "POST", one + "/pause", "/v1/schedules/{scheduleId}/pause")
        await call(stack, "POST", one + "/resume", "/v1/schedules/{scheduleId}/resume")
        await call(stack, "POST", one + "/trigger", "/v1/schedules/{scheduleId}/trigger")
        await call(
            stack,
            "POST",
            "/v1/schedules",
            "/v1/schedules",
            json={"workflow": "wf", "cron": "bad", "timezone": "UTC"},
        )  # 422
        await call(stack, "DELETE", one, "/v1/schedules/{scheduleId}")
        await call(stack, "DELETE", f"/v1/apps/{app['slug']}", "/v1/apps/{app}")
