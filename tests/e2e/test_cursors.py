"""Every list refuses a cursor it did not give out, however crafted, as 422 naming ``cursor``."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import httpx
import orjson

from tests.support import Stack, orchestrator_stack

TIME = "2024-05-01T12:00:00.123456+00:00"
ID = str(uuid.uuid4())


def _cursor(values: Any) -> str:
    """A cursor made the way the API makes them, around any JSON."""
    data = values if isinstance(values, bytes) else orjson.dumps(values)
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


# Refused by every list: not base64, not JSON, not a list, or a list of the wrong length.
ANY_LIST = [
    "garbage",
    "%%%%",
    "é",
    _cursor(b"not json"),
    _cursor(b"\xff\xfe"),
    _cursor(b'["\\ud800"]'),
    _cursor({"a": 1}),
    _cursor("just a string"),
    _cursor(None),
    _cursor([]),
    _cursor([TIME, ID, 3]),
    _cursor([[[[[[[[[[]]]]]]]]]]),
]
# Refused by the lists whose cursor is a creation time and a UUID.
TIME_AND_ID = [
    _cursor([1, 2]),
    _cursor(["yesterday", ID]),
    _cursor([TIME, "not-a-uuid"]),
    _cursor([TIME, 42]),
    _cursor([TIME, None]),
    _cursor(["2024-05-01T12:00:00", ID]),  # no time zone
    _cursor(["0001-01-01T00:00:00+14:00", ID]),  # before year 1 in UTC
    _cursor(["99999-01-01T00:00:00+00:00", ID]),
    _cursor(f'[99999999999999999999999, "{ID}"]'.encode()),
    _cursor([TIME + "\x00", ID]),
    _cursor([{"t": TIME}, ID]),
]
SCHEDULES = [
    _cursor([1, 2]),
    _cursor(["yesterday", "wfs_x"]),
    _cursor([TIME, 42]),
    _cursor([TIME, None]),
    _cursor([TIME, "wfs_\x00"]),
    _cursor([TIME, "x" * 5000]),
    _cursor(["0001-01-01T00:00:00+14:00", "wfs_x"]),
]
WORKFLOWS = [
    _cursor([5]),
    _cursor([None]),
    _cursor([True]),
    _cursor(["a\x00b"]),
    _cursor([["name"]]),
    _cursor(["x" * 5000]),
]
EVENTS = [
    _cursor(["5"]),
    _cursor([-1]),
    _cursor([1.5]),
    _cursor([True]),
    _cursor([None]),
    _cursor([2**63]),  # past a bigint
    _cursor([18446744073709551615]),
    _cursor(b"[99999999999999999999999]"),
]


async def _refused(http: httpx.AsyncClient, path: str, cursors: list[str]) -> None:
    for cursor in cursors:
        response = await http.get(path, params={"cursor": cursor})
        assert response.status_code == 422, (path, cursor, response.text)
        error = response.json()["error"]
        assert error["code"] == "validation_failed", (path, cursor, error)
        assert "cursor" in error["details"]["fields"], (path, cursor, error)


def _client(stack: Stack) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {stack.api_key}"}
    return httpx.AsyncClient(base_url=stack.url, headers=headers)


async def test_every_list_refuses_crafted_cursors(database_url: str) -> None:
    """Apps, runs, workflows, schedules and a run's events answer a cursor that is not one they
    gave out (bad base64 or JSON, wrong shape or types, a non-UUID id, a time out of range, a
    huge number, a NUL) with 422 validation_failed naming ``cursor``, never a 500."""
    async with orchestrator_stack(database_url) as stack, _client(stack) as http:
        await _refused(http, "/v1/apps", ANY_LIST + TIME_AND_ID)
        await _refused(http, "/v1/runs", ANY_LIST + TIME_AND_ID)
        await _refused(http, "/v1/schedules", ANY_LIST + SCHEDULES)
        await _refused(http, "/v1/workflows", ANY_LIST + WORKFLOWS)
        await _refused(http, f"/v1/runs/{uuid.uuid4()}/events", ANY_LIST + EVENTS)


async def test_apps_page_by_the_cursors_they_give_out(database_url: str) -> None:
    """The cursor of one page of apps gives the next page, and the last page has none."""
    async with orchestrator_stack(database_url) as stack, _client(stack) as http:
        for name in ("first", "second", "third"):
            created = await http.post(
                "/v1/apps", json={"name": name, "url": f"http://127.0.0.1:9/{name}"}
            )
            assert created.status_code == 201, created.text
        names, cursor = [], None
        while True:
            params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
            page = (await http.get("/v1/apps", params=params)).json()
            names += [app["name"] for app in page["apps"]]
            cursor = page["nextCursor"]
            if cursor is None:
                break
        assert sorted(names) == ["first", "second", "third"] and len(names) == 3
