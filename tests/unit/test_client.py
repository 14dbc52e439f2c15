"""Unit tests of the REST client: both clients against a fake API on ``httpx.MockTransport``."""

from __future__ import annotations

import inspect
import json
import pickle
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
import pytest

from stepline import _client
from stepline._client import ApiError, AsyncClient, Client
from stepline._durations import parse_duration
from stepline._errors import SteplineError

BASE = "http://stepline.test"
Handler = Callable[[httpx.Request], httpx.Response]


@dataclass
class FakeApi:
    """A stand-in for the orchestrator: records requests, answers from routes or echoes."""

    requests: list[httpx.Request] = field(default_factory=list)
    routes: dict[tuple[str, str], Handler] = field(default_factory=dict)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        route = self.routes.get((request.method, request.url.path))
        if route is not None:
            return route(request)
        if request.method == "DELETE":
            return httpx.Response(204)
        return httpx.Response(200, json={"path": request.url.path})

    @property
    def last(self) -> httpx.Request:
        return self.requests[-1]


@dataclass
class Harness:
    """One client (sync or async) wired to a fake API, driven the same way in every test."""

    fake: FakeApi
    client: Client | AsyncClient

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self.client, method)(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result

    async def collect(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        items = getattr(self.client, method)(*args, **kwargs)
        if hasattr(items, "__aiter__"):
            return [item async for item in items]
        return list(items)


def make_client(kind: str, fake: FakeApi, api_key: str | None = "sk-test") -> Client | AsyncClient:
    transport = httpx.MockTransport(fake)
    if kind == "sync":
        return Client(BASE, api_key, transport=transport)
    return AsyncClient(BASE, api_key, transport=transport)


async def close(client: Client | AsyncClient) -> None:
    if isinstance(client, AsyncClient):
        await client.aclose()
    else:
        client.close()


@pytest.fixture(params=["sync", "async"])
async def api(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    fake = FakeApi()
    client = make_client(request.param, fake)
    yield Harness(fake, client)
    await close(client)


def body_of(request: httpx.Request) -> Any:
    return json.loads(request.content) if request.content else None


NOW = datetime(2024, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
CASES: list[tuple[str, tuple[Any, ...], dict[str, Any], str, str, dict[str, str], Any]] = [
    ("create_app", ("shop", "http://shop/sl"), {}, "POST", "/v1/apps", {},
     {"name": "shop", "url": "http://shop/sl"}),
    ("list_apps", (), {"limit": 10, "cursor": "c1"}, "GET", "/v1/apps",
     {"limit": "10", "cursor": "c1"}, None),
    ("get_app", ("wfa_1",), {}, "GET", "/v1/apps/wfa_1", {}, None),
    ("update_app", ("wfa_1",), {"url": "http://new"}, "PATCH", "/v1/apps/wfa_1", {},
     {"url": "http://new"}),
    ("delete_app", ("wfa_1",), {}, "DELETE", "/v1/apps/wfa_1", {}, None),
    ("sync_app", ("wfa_1",), {}, "POST", "/v1/apps/wfa_1/sync", {}, None),
    ("list_workflows", (), {}, "GET", "/v1/workflows", {}, None),
    ("start_run", ("onboard", {"userId": "u1"}), {"run_key": "signup-u1"}, "POST", "/v1/runs",
     {}, {"workflow": "onboard", "input": {"userId": "u1"}, "runKey": "signup-u1"}),
    ("start_run", ("onboard",), {}, "POST", "/v1/runs", {}, {"workflow": "onboard", "input": None}),
    ("get_run", ("r1",), {}, "GET", "/v1/runs/r1", {}, None),
    ("list_runs", (), {"workflow": "onboard", "status": "failed", "run_key": "k",
                       "created_after": NOW, "created_before": "2024-06-01T00:00:00Z",
                       "limit": 5, "cursor": "c9"}, "GET", "/v1/runs",
     {"workflow": "onboard", "status": "failed", "runKey": "k",
      "createdAfter": "2024-05-01T12:00:00Z", "createdBefore": "2024-06-01T00:00:00Z",
      "limit": "5", "cursor": "c9"}, None),
    ("cancel_run", ("r1",), {}, "POST", "/v1/runs/r1/cancel", {}, None),
    ("retry_run", ("r1",), {"from_step": "charge"}, "POST", "/v1/runs/r1/retry", {},
     {"fromStep": "charge"}),
    ("retry_run", ("r1",), {}, "POST", "/v1/runs/r1/retry", {}, {}),
    ("list_run_events", ("r1",), {"after": 7, "limit": 100}, "GET", "/v1/runs/r1/events",
     {"after": "7", "limit": "100"}, None),
    ("get_run_replay", ("r1",), {}, "GET", "/v1/runs/r1/replay", {}, None),
    ("complete_callback", ("cb1", {"ok": True}), {}, "POST", "/v1/callbacks/cb1", {},
     {"ok": True}),
    ("get_callback", ("cb1",), {}, "GET", "/v1/callbacks/cb1", {}, None),
    ("send_event", ("kyc.approved", {"userId": "u1"}), {}, "POST", "/v1/events", {},
     {"name": "kyc.approved", "data": {"userId": "u1"}}),
    ("create_schedule", ("report", "0 9 * * *"), {"timezone": "Europe/Paris", "overlap": "skip",
                                                 "max_catch_up": 3}, "POST", "/v1/schedules",
     {}, {"workflow": "report", "cron": "0 9 * * *", "timezone": "Europe/Paris",
          "overlap": "skip", "maxCatchUp": 3}),
    ("list_schedules", (), {}, "GET", "/v1/schedules", {}, None),
    ("get_schedule", ("wfs_1",), {}, "GET", "/v1/schedules/wfs_1", {}, None),
    ("update_schedule", ("wfs_1",), {"cron": "0 8 * * *", "misfire_policy": None}, "PATCH",
     "/v1/schedules/wfs_1", {}, {"cron": "0 8 * * *", "misfirePolicy": None}),
    ("delete_schedule", ("wfs_1",), {}, "DELETE", "/v1/schedules/wfs_1", {}, None),
    ("pause_schedule", ("wfs_1",), {}, "POST", "/v1/schedules/wfs_1/pause", {}, None),
    ("resume_schedule", ("wfs_1",), {}, "POST", "/v1/schedules/wfs_1/resume", {}, None),
    ("trigger_schedule", ("wfs_1",), {}, "POST", "/v1/schedules/wfs_1/trigger", {}, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("method", "args", "kwargs", "verb", "path", "query", "body"),
    CASES,
    ids=[f"{case[0]}-{i}" for i, case in enumerate(CASES)],
)
async def test_request_matches_contract(
    api: Harness,
    method: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    verb: str,
    path: str,
    query: dict[str, str],
    body: Any,
) -> None:
    """Each method sends openapi.yaml's verb, path, query, JSON body and bearer key."""
    result = await api.call(method, *args, **kwargs)
    sent = api.fake.last
    assert (sent.method, sent.url.path, dict(sent.url.params)) == (verb, path, query)
    assert body_of(sent) == body
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert result == (None if verb == "DELETE" else {"path": path})


async def test_path_segments_are_quoted(api: Harness) -> None:
    """Ids are URL-quoted so a slash or space cannot change the path."""
    await api.call("get_app", "a/b c")
    assert api.fake.last.url.raw_path == b"/v1/apps/a%2Fb%20c"


async def test_error_shape_becomes_api_error(api: Harness) -> None:
    """A non-2xx answer in the error shape of openapi.yaml raises ApiError with its fields."""
    error = {"code": "run_key_conflict", "message": "Run key taken.", "details": {"runId": "r0"}}
    api.fake.routes["POST", "/v1/runs"] = lambda r: httpx.Response(409, json={"error": error})
    with pytest.raises(ApiError) as caught:
        await api.call("start_run", "onboard", {}, run_key="k")
    err = caught.value
    assert (err.status, err.code, err.message, err.details) == (409, *error.values())
    assert str(err) == "run_key_conflict (HTTP 409): Run key taken."
    assert isinstance(err, SteplineError)
    assert pickle.loads(pickle.dumps(err)).details == {"runId": "r0"}


async def test_other_error_bodies_fall_back_to_http_code(api: Harness) -> None:
    """A non-2xx answer without the error shape raises ApiError ``http_<status>`` with the text."""
    api.fake.routes["GET", "/v1/runs/r1"] = lambda r: httpx.Response(502, text="Bad gateway")
    with pytest.raises(ApiError) as caught:
        await api.call("get_run", "r1")
    assert (caught.value.status, caught.value.code, caught.value.message) == (
        502,
        "http_502",
        "Bad gateway",
    )
    assert caught.value.details == {}


async def test_signed_url_completion_sends_no_key(api: Harness) -> None:
    """A full callback URL is POSTed to as is, query kept, without the API key."""
    url = "https://hooks.example.com/v1/callbacks/cb1?sig=abc&exp=9"
    await api.call("complete_callback", url, {"approved": True})
    sent = api.fake.last
    assert str(sent.url) == url
    assert "authorization" not in sent.headers
    assert body_of(sent) == {"approved": True}


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_api_key_falls_back_to_environment(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ``api_key`` the client uses STEPLINE_API_KEY, and sends no header without either."""
    fake = FakeApi()
    monkeypatch.setenv("STEPLINE_API_KEY", "sk-env")
    client = make_client(kind, fake, api_key=None)
    await Harness(fake, client).call("list_workflows")
    await close(client)
    assert fake.last.headers["authorization"] == "Bearer sk-env"
    monkeypatch.delenv("STEPLINE_API_KEY")
    client = make_client(kind, fake, api_key=None)
    await Harness(fake, client).call("list_workflows")
    await close(client)
    assert "authorization" not in fake.last.headers


def run_route(clock: list[float], statuses: list[str]) -> Handler:
    """A GET /v1/runs/r1 that spends the asked wait on ``clock`` and answers the next status."""

    def answer(request: httpx.Request) -> httpx.Response:
        clock[0] += parse_duration(request.url.params.get("wait", "0"))
        status = statuses.pop(0) if len(statuses) > 1 else statuses[0]
        return httpx.Response(200, json={"id": "r1", "status": status})

    return answer


async def test_wait_run_polls_until_the_run_ends(
    api: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """wait_run repeats 60 s long polls, each with a longer read timeout, until the run ends."""
    clock = [0.0]
    monkeypatch.setattr(_client, "_clock", lambda: clock[0])
    api.fake.routes["GET", "/v1/runs/r1"] = run_route(clock, ["running", "running", "completed"])
    run = await api.call("wait_run", "r1", timeout="1h")
    assert run["status"] == "completed"
    assert [r.url.params["wait"] for r in api.fake.requests] == ["60s"] * 3
    assert all(r.extensions["timeout"]["read"] > 60 for r in api.fake.requests)


async def test_wait_run_returns_the_run_when_time_is_spent(
    api: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """wait_run shortens its last poll to the time left and then answers the running run."""
    clock = [0.0]
    monkeypatch.setattr(_client, "_clock", lambda: clock[0])
    api.fake.routes["GET", "/v1/runs/r1"] = run_route(clock, ["running"])
    run = await api.call("wait_run", "r1", timeout=timedelta(seconds=90.5))
    assert run["status"] == "running"
    assert [r.url.params["wait"] for r in api.fake.requests] == ["60s", "30500ms"]


def paged_route(key: str, pages: dict[str | None, tuple[list[int], str | None]]) -> Handler:
    """A list endpoint serving ``pages`` by cursor, as ``{key: [...], "nextCursor": ...}``."""

    def answer(request: httpx.Request) -> httpx.Response:
        items, next_cursor = pages[request.url.params.get("cursor")]
        return httpx.Response(200, json={key: [{"n": n} for n in items], "nextCursor": next_cursor})

    return answer


async def test_iter_runs_follows_cursors_keeping_filters(api: Harness) -> None:
    """iter_runs yields every run across pages and keeps its filters on each page request."""
    pages = {None: ([1, 2], "c2"), "c2": ([3], "c3"), "c3": ([], None)}
    api.fake.routes["GET", "/v1/runs"] = paged_route("runs", pages)
    runs = await api.collect("iter_runs", status="failed", created_after=datetime(2024, 1, 1))
    assert [r["n"] for r in runs] == [1, 2, 3]
    assert [dict(r.url.params) for r in api.fake.requests] == [
        {"status": "failed", "createdAfter": "2024-01-01T00:00:00Z", **cursor}
        for cursor in ({}, {"cursor": "c2"}, {"cursor": "c3"})
    ]


async def test_iter_run_events_reads_the_whole_history(api: Harness) -> None:
    """iter_run_events yields the events of every page in order."""
    pages = {None: ([1, 2], "e2"), "e2": ([3, 4], None)}
    api.fake.routes["GET", "/v1/runs/r1/events"] = paged_route("events", pages)
    events = await api.collect("iter_run_events", "r1")
    assert [e["n"] for e in events] == [1, 2, 3, 4]
    assert len(api.fake.requests) == 2


async def test_clients_close_as_context_managers() -> None:
    """Leaving ``with`` / ``async with`` closes the underlying connection pool."""
    transport = httpx.MockTransport(FakeApi())
    with Client(BASE, "k", transport=transport) as sync_client:
        pass
    async with AsyncClient(BASE, "k", transport=transport) as async_client:
        pass
    assert sync_client._http.is_closed and async_client._http.is_closed


def test_naive_datetimes_are_utc() -> None:
    """Naive datetimes in filters are taken as UTC; aware ones are converted to it."""
    assert _client._iso(datetime(2024, 1, 1, 9, 30)) == "2024-01-01T09:30:00Z"
    assert _client._iso(datetime(2024, 1, 1, 9, 30, tzinfo=UTC)) == "2024-01-01T09:30:00Z"
