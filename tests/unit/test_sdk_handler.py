"""The SDK's ASGI handler: signature first, error shapes, describe and invoke over HTTP."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

import stepline
from stepline._signing import sign

SECRET = "whsec-test"


class FakeOrchestrator:
    """Just enough of the orchestrator's progress endpoint, as an ASGI app."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.calls: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.app = Starlette(
            routes=[Route("/v1/invocations/{iid}/progress", self.progress, methods=["POST"])]
        )

    async def progress(self, request: Request) -> JSONResponse:
        self.calls.append(await request.json())
        self.auth.append(request.headers.get("authorization"))
        if self.status == 409:
            body = {"error": {"code": "stale_invocation", "message": "stale"}}
            return JSONResponse(body, status_code=409)
        if self.status != 200:
            return JSONResponse({"error": {"code": "internal", "message": "x"}}, self.status)
        return JSONResponse({"cancelRequested": False, "callbacks": {}})


def make_app(orchestrator: FakeOrchestrator | None = None) -> tuple[stepline.Stepline, list[str]]:
    client = None
    if orchestrator is not None:
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=orchestrator.app))
    sl = stepline.Stepline(["new-secret", SECRET], deployment_id="dep-1", http_client=client)
    sl.transport.backoff = 0
    ran: list[str] = []

    @sl.workflow("greet", retries=4, timeout="1h", concurrency=2, schedule="0 * * * *")
    async def greet(ctx: stepline.Context, input: dict[str, str]) -> str:
        ran.append("workflow")
        return await ctx.step("hello", lambda: f"hello {input['name']}")

    return sl, ran


def invoke_body(workflow: str = "greet") -> bytes:
    return json.dumps(
        {
            "kind": "invoke", "runId": "r1", "workflow": workflow, "input": {"name": "ada"},
            "invocationId": "i1", "token": "tok-1", "apiUrl": "http://orch", "steps": [],
        }
    ).encode()  # fmt: skip


async def post(
    sl: stepline.Stepline, body: bytes, signature: str | None = "sign", path: str = "/"
) -> httpx.Response:
    headers = {}
    if signature == "sign":
        signature = sign(body, SECRET)
    if signature is not None:
        headers["Stepline-Signature"] = signature
    transport = httpx.ASGITransport(app=sl.asgi())
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        return await client.post(path, content=body, headers=headers)


@pytest.mark.parametrize(
    "signature",
    [None, sign(invoke_body(), "forged"), sign(invoke_body(), SECRET, int(time.time()) - 3600)],
    ids=["unsigned", "forged", "stale"],
)
async def test_bad_signatures_answer_401_and_run_nothing(signature: str | None) -> None:
    """Unsigned, forged and stale requests get 401 unauthorized and the workflow never runs."""
    sl, ran = make_app()
    response = await post(sl, invoke_body(), signature)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert ran == []


async def test_invalid_json_answers_400() -> None:
    """A signed body that is not JSON answers 400 invalid_json."""
    sl, _ = make_app()
    response = await post(sl, b"{not json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


async def test_unknown_kind_answers_422() -> None:
    """A signed body with an unknown kind answers 422 validation_failed."""
    sl, _ = make_app()
    response = await post(sl, b'{"kind": "explode"}')
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "validation_failed"


async def test_unknown_workflow_answers_404() -> None:
    """Invoking a workflow the app does not host answers 404 workflow_not_found."""
    sl, ran = make_app()
    response = await post(sl, invoke_body("nope"))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "workflow_not_found"
    assert ran == []


async def test_methods_other_than_post() -> None:
    """GET answers the SDK's identity; other methods answer 405."""
    sl, _ = make_app()
    transport = httpx.ASGITransport(app=sl.asgi())
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        got = await client.get("/")
        put = await client.put("/", content=b"{}")
    assert got.json() == {"sdk": "stepline", "version": stepline.__version__}
    assert put.status_code == 405


async def test_describe_lists_workflows_with_options() -> None:
    """describe answers the workflows with retries, timeout, concurrency, schedule, deployment."""
    sl, _ = make_app()
    response = await post(sl, b'{"kind": "describe"}')
    assert response.status_code == 200
    body = response.json()
    assert body["deploymentId"] == "dep-1" and body["protocol"] == 1
    (workflow,) = body["workflows"]
    assert workflow["name"] == "greet"
    assert workflow["retries"]["attempts"] == 4
    assert workflow["timeoutMs"] == 3_600_000 and workflow["concurrency"] == 2
    assert workflow["schedule"]["cron"] == "0 * * * *"


async def test_invoke_runs_the_workflow_with_progress_calls() -> None:
    """An invoke runs the step after a progress call (bearer token) and answers completed."""
    orchestrator = FakeOrchestrator()
    sl, ran = make_app(orchestrator)
    response = await post(sl, invoke_body())
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "completed" and body["output"] == "hello ada"
    assert body["deploymentId"] == "dep-1"
    assert [u["action"] for u in body["updates"]] == ["complete"]
    assert orchestrator.auth == ["Bearer tok-1"]
    assert ran == ["workflow"]
    assert orchestrator.calls[0]["runId"] == "r1"
    assert [u["action"] for u in orchestrator.calls[0]["updates"]] == ["start"]
    await sl.aclose()


async def test_stale_invocation_answers_stale() -> None:
    """A 409 from the progress endpoint makes the invocation answer status stale."""
    orchestrator = FakeOrchestrator(status=409)
    sl, _ = make_app(orchestrator)
    response = await post(sl, invoke_body())
    assert response.status_code == 200
    assert response.json()["status"] == "stale"


async def test_unreachable_orchestrator_answers_503() -> None:
    """Progress calls failing with 5xx are retried, then the invocation answers 503."""
    orchestrator = FakeOrchestrator(status=500)
    sl, _ = make_app(orchestrator)
    response = await post(sl, invoke_body())
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "orchestrator_unavailable"
    assert len(orchestrator.calls) == 4


async def test_handler_does_not_depend_on_its_mount_point() -> None:
    """Mounted under /stepline (Starlette redirects the bare path with 307), it answers the same."""
    sl, _ = make_app()
    app = Starlette(routes=[Mount("/stepline", app=sl.asgi())])
    body = b'{"kind": "describe"}'
    transport = httpx.ASGITransport(app=app)
    headers = {"Stepline-Signature": sign(body, SECRET)}
    async with httpx.AsyncClient(
        transport=transport, base_url="http://app", follow_redirects=True
    ) as client:
        nested = await client.post("/stepline/", content=body, headers=headers)
        redirected = await client.post("/stepline", content=body, headers=headers)
    for response in (nested, redirected):
        assert response.status_code == 200
        assert response.json()["workflows"][0]["name"] == "greet"


async def test_oversized_body_answers_413() -> None:
    """A body over 16 MiB is refused with 413 before any signature work."""
    sl, _ = make_app()
    response = await post(sl, b"x" * (16 * 1024 * 1024 + 1), signature=None)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"


async def test_lifespan_is_acknowledged() -> None:
    """Served alone, the handler completes the ASGI lifespan handshake."""
    sl, _ = make_app()
    messages = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: Any) -> None:
        sent.append(message)

    await sl.asgi()({"type": "lifespan"}, receive, send)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


@pytest.mark.parametrize(
    "signature",
    [f"t={'9' * 400},v1=00", "t=1,v1=\u00e9\u00e9", f"t={int(time.time())},v1=\u00e9"],
    ids=["400-digit-t", "non-ascii-stale", "non-ascii-v1"],
)
async def test_odd_signature_headers_answer_401_not_500(signature: str) -> None:
    """A 400-digit timestamp or a non-ASCII signature is 401 unauthorized, never a crash."""
    sl, ran = make_app()
    transport = httpx.ASGITransport(app=sl.asgi())
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        headers = {"Stepline-Signature": signature.encode()}
        response = await client.post("/", content=invoke_body(), headers=headers)
    assert response.status_code == 401, response.text
    assert ran == []


async def test_replayed_invocation_runs_nothing() -> None:
    """The same signed invocation body sent twice within the window runs the workflow once."""
    sl, ran = make_app(FakeOrchestrator())
    transport = httpx.ASGITransport(app=sl.asgi())
    body = invoke_body()
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        first = await client.post(
            "/", content=body, headers={"Stepline-Signature": sign(body, SECRET)}
        )
        again = await client.post(
            "/",
            content=body,
            headers={"Stepline-Signature": sign(body, SECRET, int(time.time()) - 5)},
        )
        other = body.replace(b'"i1"', b'"i2"')
        forged = await client.post(
            "/", content=other, headers={"Stepline-Signature": sign(body, SECRET)}
        )
    assert first.status_code == 200, first.text
    assert again.status_code == 409 and again.json()["error"]["code"] == "replayed"
    assert forged.status_code == 401  # a signature over another body
    assert ran == ["workflow"]


async def test_an_sdk_failure_answers_500_saying_what_broke() -> None:
    """When the SDK itself fails (here: the httpx client it was given is closed), the 500 says
    the exception's type and message, and carries no traceback of the SDK."""
    orchestrator = FakeOrchestrator()
    sl, _ = make_app(orchestrator)
    assert sl.transport.client is not None
    await sl.transport.client.aclose()
    response = await post(sl, invoke_body())
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "internal"
    assert error["message"].startswith("the SDK handler failed: RuntimeError: ")
    assert "client has been closed" in error["message"]
    assert "Traceback" not in response.text and ".py" not in response.text
