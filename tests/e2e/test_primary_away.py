"""The primary goes away under a running orchestrator (its server killed, then a promoted
standby found): every request made meanwhile answers ``503 unavailable`` with ``Retry-After``
on the same keep-alive connection, ``/readyz`` says not ready, the loops wait quietly, and
everything works again once a primary is back."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import structlog

from stepline_server.api import patience
from stepline_server.orchestrator import Orchestrator
from tests.dbproxy import proxied
from tests.support import Stack, orchestrator_stack, until

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _peer(response: httpx.Response) -> Any:
    """The client's end of the connection the response came on."""
    return response.extensions["network_stream"].get_extra_info("client_addr")


class _Uvicorn(logging.Handler):
    """Collects what uvicorn logs as errors (``Exception in ASGI application``)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage())


@pytest.fixture
def uvicorn_errors() -> Iterator[list[str]]:
    """What uvicorn logs as errors while the test runs (``Exception in ASGI application``)."""
    handler = _Uvicorn()
    logging.getLogger("uvicorn.error").addHandler(handler)
    yield handler.records
    logging.getLogger("uvicorn.error").removeHandler(handler)


def _calls(o: Orchestrator) -> list[tuple[str, str, Any, dict[str, str]]]:
    """A request on each kind of route: readiness, API reads and writes, keyed and signed
    callbacks, events, the progress fast path."""
    invocation, callback = str(uuid.uuid4()), str(uuid.uuid4())
    token = o.signer.invocation_token(invocation, "lease")
    return [
        ("GET", "/readyz", None, {}),
        ("POST", "/v1/runs", {"workflow": "w", "input": 1}, {}),
        ("GET", "/v1/runs", None, {}),
        ("GET", f"/v1/runs/{uuid.uuid4()}", None, {}),
        ("POST", "/v1/events", {"name": "e", "data": 1}, {}),
        ("POST", f"/v1/callbacks/{callback}", {"ok": 1}, {}),
        ("POST", f"/v1/callbacks/{callback}/{o.signer.signature(callback)}", {"ok": 1}, {}),
        (
            "POST",
            f"/v1/invocations/{invocation}/progress",
            {"runId": str(uuid.uuid4()), "updates": [], "seq": 1},
            {"authorization": f"Bearer {token}"},
        ),
    ]


async def test_requests_while_the_primary_is_away_answer_503_on_a_live_connection(
    database_url: str, monkeypatch: pytest.MonkeyPatch, uvicorn_errors: list[str]
) -> None:
    """Every route asked while the database refuses connections (API routes, signed and keyed
    callbacks, events, the progress fast path, readiness) answers 503 ``unavailable`` with
    ``Retry-After``; the next request on the same connection is answered; uvicorn logs no
    error and no loop crashes."""
    monkeypatch.setattr(patience, "DATABASE_PATIENCE_SECONDS", 0.3)
    async with (
        proxied(database_url) as (proxy, dsn),
        orchestrator_stack(dsn, scheduler_poll_seconds=0.1) as stack,
        httpx.AsyncClient(base_url=stack.url, headers=_key(stack)) as http,
    ):
        assert (await http.get("/v1/runs")).status_code == 200
        assert (await http.get("/readyz")).status_code == 200
        with structlog.testing.capture_logs() as logs:
            await proxy.cut()
            peers = set()
            for method, path, body, extra in _calls(stack.orchestrator):
                response = await http.request(method, path, json=body, headers=extra)
                assert response.status_code == 503, (path, response.text)
                assert response.headers["retry-after"] == "1", path
                assert response.headers.get("connection") != "close", path
                if path != "/readyz":
                    assert response.json()["error"]["code"] == "unavailable", path
                peers.add(_peer(response))
            await until(lambda: _waited(logs, "scheduler"), "the scheduler to wait")
            await proxy.restore()
            after = await until(lambda: _ready(http), "a ready orchestrator after the restore")
            assert (await http.get("/v1/runs")).status_code == 200
        assert peers == {_peer(after)}, "the connection was closed after a 503"
    events = [entry["event"] for entry in logs]
    assert "loop_crashed" not in events, logs
    assert "request_failed" not in events, logs
    assert uvicorn_errors == []


def _key(stack: Stack) -> dict[str, str]:
    return {"authorization": f"Bearer {stack.api_key}"}


async def _waited(logs: list[dict[str, Any]], loop: str) -> bool:
    return any(e["event"] == "loop_waits_for_database" and e["loop"] == loop for e in logs)


async def _ready(http: httpx.AsyncClient) -> httpx.Response | None:
    response = await http.get("/readyz")
    return response if response.status_code == 200 else None


async def test_a_read_only_server_is_unavailable_not_an_error(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connections that reach a read-only server (a standby, the old primary demoted after a
    failover) answer writes 503 ``unavailable`` and readiness 503, until a primary is back."""
    monkeypatch.setattr(patience, "DATABASE_PATIENCE_SECONDS", 0.3)
    name = database_url.rsplit("/", 1)[1]
    async with (
        orchestrator_stack(database_url) as stack,
        httpx.AsyncClient(base_url=stack.url, headers=_key(stack)) as http,
    ):
        assert (await http.post("/v1/events", json={"name": "e"})).status_code == 202
        admin = await stack.conn()
        try:
            await _read_only(admin, name, True)
            await until(lambda: _answers(http, "GET", "/v1/runs", 200), "reads to answer")
            event = await http.post("/v1/events", json={"name": "e"})
            assert event.status_code == 503, event.text
            assert event.json()["error"]["code"] == "unavailable"
            assert event.headers["retry-after"] == "1"
            assert (await http.get("/readyz")).status_code == 503
            await _read_only(admin, name, False)
            await until(lambda: _answers(http, "POST", "/v1/events", 202), "a write again")
            assert (await http.get("/readyz")).status_code == 200
        finally:
            await admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
            await admin.close()


async def _answers(http: httpx.AsyncClient, method: str, path: str, status: int) -> bool:
    body = {"name": "e"} if method == "POST" else None
    response = await http.request(method, path, json=body)
    assert response.status_code in (status, 503), response.text
    return response.status_code == status


async def _read_only(admin: Any, name: str, on: bool) -> None:
    """Make the database read-only (or not) for every new session, and end the sessions there
    are, as a demotion would."""
    value = "on" if on else "off"
    await admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = {value}')
    await admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = $1 AND pid <> pg_backend_pid()",
        name,
    )
