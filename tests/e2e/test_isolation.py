"""Every route of openapi.yaml walked with keys of two projects, two environments and three
roles: another scope's resource is 404, a write with a read key is 403 and changes nothing, an
admin route is 403 to a write key, and the owner's key gets the documented 2xx."""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path
from typing import Any

import httpx
import yaml

import stepline
from stepline_server.store import keys
from tests.support import Stack, app_server, orchestrator_stack

SPEC = yaml.safe_load((Path(__file__).parents[2] / "openapi.yaml").read_text())
METHODS = ("get", "post", "put", "patch", "delete")
# Operations authenticated by something else than an API key (or nothing).
NOT_BY_KEY = {
    "getHealth",
    "getReadiness",
    "getMetrics",
    "completeCallbackSigned",
    "reportProgress",
    "getStepResult",
    "getInvocationSteps",
    "beatInvocation",
    "answerInvocation",
}
# The owner walk's order: reads, then writes, then what ends or deletes a resource.
LAST = [
    "cancelRun",
    "deleteDeployment",
    "deleteSchedule",
    "deleteAlert",
    "revokeKey",
    "pauseApp",
    "resumeApp",
    "deleteApp",
]


def operations() -> list[tuple[str, str, str, dict[str, Any]]]:
    """(operationId, METHOD, path, operation) for every operation in openapi.yaml."""
    found = []
    for path, item in SPEC["paths"].items():
        for method in METHODS:
            if method in item:
                op = item[method]
                found.append((op["operationId"], method.upper(), path, op))
    return found


def by_key(op: dict[str, Any]) -> bool:
    security = op.get("security", SPEC.get("security"))
    return bool(security) and any("apiKey" in s for s in security)


def admin_only(op: dict[str, Any]) -> bool:
    return str(op.get("summary", "")).endswith(("(admin)", "(owner)"))


def owner_only(op: dict[str, Any]) -> bool:
    return str(op.get("summary", "")).endswith("(owner)")


def example(op: dict[str, Any]) -> Any:
    body = op.get("requestBody") or {}
    if "$ref" in body:
        body = SPEC["components"]["requestBodies"][body["$ref"].rsplit("/", 1)[1]]
    return (body.get("content") or {}).get("application/json", {}).get("example")


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def _key(stack: Stack, role: str, environment: uuid.UUID) -> str:
    async with stack.orchestrator.pool.acquire() as conn:
        return await keys.create_key(conn, role, environment, role)


class Owner:
    """The resources of the owning environment, and the request each operation makes."""

    def __init__(self, http: httpx.AsyncClient, admin: str, app_url: str) -> None:
        self.http, self.admin, self.app_url = http, admin, app_url
        self.ids: dict[str, str] = {}
        self.made = 0

    async def _post(self, path: str, body: Any) -> dict[str, Any]:
        answer = await self.http.post(path, json=body, headers=_auth(self.admin))
        assert answer.status_code < 300, (path, answer.text)
        return answer.json()  # type: ignore[no-any-return]

    async def setup(self, sl: stepline.Stepline) -> None:
        app = await self._post("/v1/apps", {"name": "owned", "url": self.app_url})
        sl.signing_secrets = (app["signingSecret"],)  # the app learns its secret, then syncs
        self.ids["app"] = app["slug"]
        await self._post(f"/v1/apps/{app['slug']}/sync", None)
        # Two more deployments of the app: the runs start on the second (current), the first
        # (deleted last) is left with none, and runs move to the second.
        for name in ("deployment", "moveTo"):
            made = await self._post(f"/v1/apps/{app['slug']}/deployments", {"url": self.app_url})
            self.ids[name] = made["id"]
        pulled = await self._post("/v1/apps", {"name": "pulled", "kind": "pull"})
        self.ids["pullApp"] = pulled["slug"]
        for name in ("runId", "cancelRun"):
            run = await self._post("/v1/runs", {"workflow": "waiter", "input": {}})
            self.ids[name] = run["id"]
            self.ids.setdefault("callbackId", await self._callback(run["id"]))
        failed = await self._post("/v1/runs", {"workflow": "doomed", "input": {}})
        self.ids["failedRun"] = failed["id"]
        await self._until(failed["id"], lambda r: r["status"] == "failed")
        schedule = await self._post(
            "/v1/schedules", {"workflow": "waiter", "cron": "0 0 1 1 *", "timezone": "UTC"}
        )
        self.ids["scheduleId"] = schedule["id"]
        key = await self._post("/v1/keys", {"name": "victim", "role": "read"})
        self.ids["keyId"] = key["id"]
        self.ids["key"] = "progress"  # a state key the waiting runs set
        self.ids["name"] = "doomed"  # a workflow (pause, resume): its one run has ended
        op = await self._post(
            "/v1/runs/bulk",
            {"action": "cancel", "filter": {"workflow": "doomed", "status": "running"}},
        )
        self.ids["operationId"] = op["id"]
        alert = await self._post(
            "/v1/alerts",
            {"name": "owned", "on": ["run.failed"], "workflow": "nothing-fails",
             "destination": {"type": "webhook", "url": self.app_url}},
        )  # fmt: skip
        self.ids["alertId"] = alert["id"]

    async def _until(self, run_id: str, ok: Any) -> dict[str, Any]:
        for _ in range(300):
            got = await self.http.get(f"/v1/runs/{run_id}", headers=_auth(self.admin))
            if ok(got.json()):
                return got.json()  # type: ignore[no-any-return]
            await asyncio.sleep(0.05)
        raise AssertionError(f"run {run_id} never got there")

    async def _callback(self, run_id: str) -> str:
        run = await self._until(
            run_id, lambda r: any(s.get("callbackId") for s in r.get("steps", []))
        )
        return next(str(s["callbackId"]) for s in run["steps"] if s.get("callbackId"))

    def request(self, op_id: str, method: str, path: str, op: dict[str, Any]) -> tuple[str, Any]:
        """The URL and body ``op_id`` is called with on the owner's resources."""
        params = dict(self.ids)
        if op_id in ("retryRun", "cancelRun", "moveRun"):  # moveRun: a run still waiting
            params["runId"] = self.ids["failedRun" if op_id == "retryRun" else "cancelRun"]
        if op_id == "pollInvocations":  # a pull app's, answered at once
            params["app"] = self.ids["pullApp"]
            path += "?wait=0"
        url = re.sub(r"\{(\w+)\}", lambda m: params[m.group(1)], path)
        self.made += 1
        bodies: dict[str, Any] = {
            "createApp": {"name": f"made{self.made}", "url": self.app_url},
            "updateApp": {"name": "owned"},
            "startRun": {"workflow": "waiter", "input": {}},
            "createSchedule": {"workflow": "waiter", "cron": "0 0 1 1 *", "timezone": "UTC"},
            "updateSchedule": {"cron": "0 0 2 1 *"},
            "retryRun": {},
            "syncApp": None,  # a push app's sync takes no body
            "createEnvironment": {"name": f"env{self.made}"},
            "createKey": {"name": f"k{self.made}", "role": "read"},
            "bulkRuns": {
                "action": "cancel",
                "filter": {"workflow": "doomed", "status": "running"},
                "dryRun": True,
            },
            "createAlert": {
                "name": f"a{self.made}",
                "on": ["run.failed"],
                "workflow": "nothing-fails",
                "destination": {"type": "webhook", "url": self.app_url},
            },
            "updateAlert": {"name": "renamed"},
            "createDeployment": {"url": self.app_url},
            "moveRun": {"deployment": self.ids["moveTo"]},
        }
        return url, bodies.get(op_id, example(op))

    async def snapshot(self) -> list[Any]:
        """What the environment holds, as its admin sees it."""
        seen = []
        for path in ("/v1/apps", "/v1/runs", "/v1/schedules", "/v1/keys", "/v1/environments"):
            answer = await self.http.get(path, headers=_auth(self.admin))
            assert answer.status_code == 200, answer.text
            seen.append(answer.json())
        for rid in (self.ids["runId"], self.ids["cancelRun"], self.ids["failedRun"]):
            got = await self.http.get(f"/v1/runs/{rid}", headers=_auth(self.admin))
            seen.append({k: v for k, v in got.json().items() if k != "updatedAt"})
        return seen


def waiting_app() -> stepline.Stepline:
    sl = stepline.Stepline("isolation-placeholder")

    @sl.workflow("waiter")
    async def waiter(ctx: stepline.Context, input: Any) -> Any:
        await ctx.set_state("progress", {"done": 1})
        cb = await ctx.callback("answer")
        return await cb.wait()

    @sl.workflow("doomed", retries=stepline.Retries(attempts=1))
    async def doomed(ctx: stepline.Context, input: Any) -> None:
        raise RuntimeError("always")

    return sl


async def test_every_route_keeps_scopes_and_roles_apart(database_url: str) -> None:
    """For every API-key operation of openapi.yaml: keys of another environment and of another
    project get 404 for the owner's resources; a read key gets 403 on every write and the
    environment is unchanged; a write key gets 403 on admin routes; the owner gets 2xx."""
    ops = operations()
    assert {o for o, _, _, op in ops if not by_key(op)} == NOT_BY_KEY
    sl = waiting_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        async with stack.orchestrator.pool.acquire() as conn:
            staging = await keys.find_environment(conn, keys.DEFAULT_PROJECT, "staging")
            other = await keys.create_project(conn, "other")
            assert staging is not None and other is not None
        prod = keys.DEFAULT_PROJECT
        admin, write, read = [await _key(stack, r, prod) for r in ("admin", "write", "read")]
        project_owner = await _key(stack, "owner", prod)
        strangers = [
            await _key(stack, "admin", staging["id"]),
            await _key(stack, "admin", other["id"]),
        ]
        async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
            owner = Owner(http, admin, app_url)
            await owner.setup(sl)
            checked: set[str] = set()
            for op_id, method, path, op in ops:
                if not by_key(op):
                    continue
                url, body = owner.request(op_id, method, path, op)
                kwargs: dict[str, Any] = {} if body is None else {"json": body}
                if "{" in path:
                    for key in strangers:
                        answer = await http.request(method, url, headers=_auth(key), **kwargs)
                        assert answer.status_code == 404, (op_id, answer.text)
                        assert answer.json()["error"]["code"] == "not_found"
                if method != "GET":
                    before = await owner.snapshot()
                    refused = (read, write) if admin_only(op) else (read,)
                    for key in (*refused, admin) if owner_only(op) else refused:
                        answer = await http.request(method, url, headers=_auth(key), **kwargs)
                        assert answer.status_code == 403, (op_id, answer.text)
                        assert answer.json()["error"]["code"] == "forbidden"
                    assert await owner.snapshot() == before, op_id
                elif admin_only(op):
                    answer = await http.get(url, headers=_auth(write))
                    assert answer.status_code == 403, (op_id, answer.text)
                checked.add(op_id)
            order = sorted(
                (o for o in ops if by_key(o[3])),
                key=lambda o: (LAST.index(o[0]) if o[0] in LAST else -1, o[1] != "GET"),
            )
            for op_id, method, path, op in order:
                url, body = owner.request(op_id, method, path, op)
                kwargs = {} if body is None else {"json": body}
                key = project_owner if owner_only(op) else admin if admin_only(op) else write
                answer = await http.request(method, url, headers=_auth(key), **kwargs)
                if op_id == "cancelOperation" and answer.status_code == 409:
                    # The owner's operation (nothing to do) ended before it could be cancelled:
                    # the route found it and refused for its state, as the contract says.
                    assert answer.json()["error"]["code"] == "invalid_state", answer.text
                    continue
                assert 200 <= answer.status_code < 300, (op_id, answer.text)
                assert str(answer.status_code) in op["responses"], (op_id, answer.status_code)
    assert checked == {o for o, _, _, op in ops if by_key(op)}
