"""What PostgreSQL cannot store never reaches it: NUL characters and ids that cannot be ids in
paths and queries (API and dashboard alike), the dashboard's JSON forms checked exactly as
their REST routes, and bodies sent to routes that take none."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

import stepline
from tests.dashboard_forms import Dashboard
from tests.e2e.test_durable_waits import step_in, step_of
from tests.e2e.test_openapi_responses import check
from tests.support import app_server, orchestrator_stack


def _app() -> stepline.Stepline:
    sl = stepline.Stepline("secret-edge-inputs")

    @sl.workflow("wait")
    async def wait(ctx: stepline.Context, input: Any) -> Any:
        cb = await ctx.callback("cb", timeout="5m")
        return await cb.wait()

    @sl.workflow("hear")
    async def hear(ctx: stepline.Context, input: Any) -> Any:
        return await ctx.wait_for_event("go", event="go", timeout="5m")

    return sl


def _nested_text(depth: int) -> str:
    return "[" * depth + "]" * depth


# JSON that REST refuses; each must be refused by the dashboard's forms as well.
BAD_JSON = {
    "a NUL": '{"a": "x\\u0000y"}',
    "a 30-digit integer": "123456789012345678901234567890",
    "300 levels": _nested_text(300),
    "100,000 levels": _nested_text(100_000),
    "NaN": "NaN",
    "1e400": "1e400",
    "-Infinity": '{"v": -Infinity}',
    "a NaN beside a long integer": "[NaN, 123456789012345678901234567890]",
}


async def test_nul_in_a_path_or_query_parameter_is_refused_on_every_route(
    database_url: str,
) -> None:
    """A NUL in a path or query parameter, or an id that cannot be one, is a 4xx in the API's
    error shape (a page in the dashboard), never a 500, on the routes the probe found."""
    async with orchestrator_stack(database_url) as stack:
        auth = {"authorization": f"Bearer {stack.api_key}"}
        async with httpx.AsyncClient(base_url=stack.url, headers=auth) as http:
            for path, template in [
                ("/v1/runs?workflow=a%00b", "/v1/runs"),
                ("/v1/runs?runKey=%00", "/v1/runs"),
                ("/v1/apps?x%00=1", "/v1/apps"),
                ("/healthz?probe=%00", "/healthz"),
            ]:
                answer = await http.get(path)
                assert answer.status_code == 422, (path, answer.text)
                check("GET", template, answer)  # a status openapi.yaml documents
                assert answer.json()["error"]["code"] == "validation_failed"
                assert answer.json()["error"]["details"]["fields"], answer.text
            for method, path, template in [
                ("GET", "/v1/apps/a%00b", "/v1/apps/{app}"),
                ("POST", "/v1/apps/a%00b/sync", "/v1/apps/{app}/sync"),
                ("GET", "/v1/runs/not-a-run-id", "/v1/runs/{runId}"),
                ("GET", "/v1/schedules/wfs_%00", "/v1/schedules/{scheduleId}"),
                ("POST", "/v1/schedules/nope/pause", "/v1/schedules/{scheduleId}/pause"),
                ("GET", "/v1/callbacks/%00", "/v1/callbacks/{callbackId}"),
                ("DELETE", "/v1/keys/%00", "/v1/keys/{keyId}"),
                (
                    "POST",
                    "/v1/invocations/%00/heartbeat",
                    "/v1/invocations/{invocationId}/heartbeat",
                ),
            ]:
                answer = await http.request(method, path)
                assert answer.status_code == 404, (path, answer.text)
                assert answer.json()["error"]["code"] == "not_found", answer.text
                check(method, template, answer)
        async with Dashboard(stack.url) as ui:
            await ui.sign_in(stack.api_key)
            for path in [
                "/ui/runs?workflow=%00",
                "/ui/runs?q=a%00",
                "/ui/runs?runKey=%00",
                "/ui/runs/rows?workflow=%00",
            ]:
                page = await ui.get(path)
                assert page.status_code == 422, (path, page.text[:300])
                assert "NUL" in page.text
            for path in ["/ui/schedules/wfs_%00/trigger", "/ui/apps/a%00/sync"]:
                page = await ui.post(path)
                assert page.status_code == 404, (path, page.text[:300])
                assert "Not found" in page.text
            page = await ui.get("/ui/runs/%00")
            assert page.status_code == 404
            assert (await ui.get("/ui/runs")).status_code == 200  # still signed in, working


async def test_dashboard_forms_refuse_what_their_rest_routes_refuse(database_url: str) -> None:
    """A callback or event form with a NUL, a 30-digit integer, JSON 300 or 100,000 levels
    deep, NaN, 1e400 or -Infinity shows the error and changes nothing, as REST does."""
    sl = _app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        waiting = await stack.client.start_run("wait", None)
        hearing = await stack.client.start_run("hear", None)
        run = await step_in(stack, waiting["id"], "cb", "waiting")
        cid = step_of(run, "cb")["callbackId"]
        await step_in(stack, hearing["id"], "go", "waiting")
        auth = {"authorization": f"Bearer {stack.api_key}"}
        async with (
            Dashboard(stack.url) as ui,
            httpx.AsyncClient(base_url=stack.url, headers=auth) as http,
        ):
            await ui.sign_in(stack.api_key)
            await ui.get(f"/ui/runs/{waiting['id']}")
            for what, text in BAD_JSON.items():
                rest = await http.post(
                    f"/v1/callbacks/{cid}",
                    content=text.encode(),
                    headers={"content-type": "application/json"},
                )
                assert rest.status_code in (400, 422), (what, rest.text)
                page = await ui.post(
                    f"/ui/callbacks/{cid}", body=text, back=f"/ui/runs/{waiting['id']}"
                )
                assert page.status_code == 200, (what, page.text[:300])
                assert ui.flash(page).startswith("Not completed: the body "), (what, ui.flash(page))
                event = await ui.post("/ui/events", name="go", data=text)
                assert ui.flash(event).startswith("Not sent: the data "), (what, ui.flash(event))
            page = await ui.post("/ui/events", name="g\x00o", data="1")
            assert page.status_code == 422 and "NUL" in page.text
            callback = (await http.get(f"/v1/callbacks/{cid}")).json()
            assert callback["status"] == "pending", callback
            for run_id in (waiting["id"], hearing["id"]):
                assert (await stack.client.get_run(run_id))["status"] == "running"
            # What REST accepts, the form accepts too.
            page = await ui.post(
                f"/ui/callbacks/{cid}", body=json.dumps({"n": 2**64 - 1}), back="/ui/runs"
            )
            assert ui.flash(page) == "Callback completed."
            # The same body again is taken as the API takes it; another body is refused.
            page = await ui.post(
                f"/ui/callbacks/{cid}", body=json.dumps({"n": 2**64 - 1}), back="/ui/runs"
            )
            assert ui.flash(page) == "Callback already completed with this body."
            page = await ui.post(f"/ui/callbacks/{cid}", body="2", back="/ui/runs")
            assert ui.flash(page).startswith("Not completed: the callback is already completed")
            ended = await stack.client.wait_run(waiting["id"], timeout=20)
            assert ended["output"] == {"n": 2**64 - 1}


async def test_routes_that_take_no_body_refuse_one(database_url: str) -> None:
    """Cancel, sync, rotate-secret, pause, resume, trigger and the deletes answer 400
    ``body_not_allowed`` to a body (and change nothing); none, or ``{}``, is accepted."""
    sl = _app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        slug = await stack.register(sl, url)
        run = await stack.client.start_run("wait", None)
        schedule = await stack.client.create_schedule("wait", "0 0 1 1 *")
        auth = {"authorization": f"Bearer {stack.api_key}"}
        body = b'{"please": "ignore me"}'
        async with httpx.AsyncClient(base_url=stack.url, headers=auth) as http:
            sid = schedule["id"]
            for method, path, template in [
                ("POST", f"/v1/runs/{run['id']}/cancel", "/v1/runs/{runId}/cancel"),
                ("POST", f"/v1/apps/{slug}/sync", "/v1/apps/{app}/sync"),
                ("POST", f"/v1/apps/{slug}/rotate-secret", "/v1/apps/{app}/rotate-secret"),
                ("POST", f"/v1/schedules/{sid}/pause", "/v1/schedules/{scheduleId}/pause"),
                ("POST", f"/v1/schedules/{sid}/resume", "/v1/schedules/{scheduleId}/resume"),
                ("POST", f"/v1/schedules/{sid}/trigger", "/v1/schedules/{scheduleId}/trigger"),
                ("DELETE", f"/v1/schedules/{sid}", "/v1/schedules/{scheduleId}"),
                ("DELETE", f"/v1/apps/{slug}", "/v1/apps/{app}"),
            ]:
                answer = await http.request(method, path, content=body)
                assert answer.status_code == 400, (path, answer.text)
                assert answer.json()["error"]["code"] == "body_not_allowed", answer.text
                check(method, template, answer)
            assert (await stack.client.get_run(run["id"]))["status"] == "running"
            assert (await stack.client.get_schedule(schedule["id"]))["status"] == "active"
            assert (await http.get(f"/v1/apps/{slug}")).status_code == 200
            pause = await http.post(f"/v1/schedules/{schedule['id']}/pause", content=b"{}")
            assert pause.status_code == 200, pause.text
            assert (await http.post(f"/v1/runs/{run['id']}/cancel")).status_code == 202


async def test_progress_with_a_bad_token_is_refused_before_its_body_arrives(
    database_url: str,
) -> None:
    """The progress route answers 401 to a wrong token while a 15 MiB body it announced has
    not been sent at all: the body is never read."""
    async with orchestrator_stack(database_url) as stack:
        host, port = stack.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v1/invocations/00000000-0000-4000-8000-000000000000/progress HTTP/1.1\r\n"
            b"Host: x\r\nAuthorization: Bearer nope\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {15 * 1024 * 1024}\r\n\r\n".encode()
        )
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 10)
        assert status.startswith(b"HTTP/1.1 401"), status
        writer.close()


async def test_a_dashboard_path_with_no_page_answers_a_page(database_url: str) -> None:
    """A path under /ui/ that no page serves (a run id ending in a newline, found by fuzzing)
    is a 404 page in HTML like the dashboard's others, not plain text."""
    async with orchestrator_stack(database_url) as stack, Dashboard(stack.url) as ui:
        await ui.sign_in(stack.api_key)
        for path in ["/ui/runs/abc%0A", "/ui/schedules/wfs_1/pause%0A", "/ui/nothing-here"]:
            page = await ui.get(path)
            assert page.status_code == 404, (path, page.text[:200])
            assert page.headers["content-type"].startswith("text/html"), path
            assert "Not found" in page.text
