"""The REST client of the ``/v1`` resources (openapi.yaml): Client, AsyncClient and ApiError.

Every endpoint is written once, on ``_Api``, as a sans-I/O ``_Request``; the two clients only
send it (blocking or awaiting) and decode the answer. ``_Api`` is generic over what its methods
return, so ``Client.get_run`` returns a dict and ``AsyncClient.get_run`` an awaitable of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Generic, Self, TypedDict, TypeVar, Unpack, cast
from urllib.parse import quote, urlencode

import httpx

from stepline import _http, _json, protocol
from stepline._durations import Duration, parse_duration
from stepline._errors import SteplineError
from stepline._payloads import Codec, PayloadError, Payloads, S3Store

UNAVAILABLE_PAUSE = 0.5
"""Seconds ``wait_run`` waits before asking again after ``503 unavailable``."""

JSON = dict[str, Any]
_D = TypeVar("_D")  # a JSON object, or an awaitable of one
_N = TypeVar("_N")  # None, or an awaitable of None
_I = TypeVar("_I")  # an iterator of JSON objects, sync or async

ENDED_STATUSES = frozenset({"completed", "failed", "cancelled", "timedOut"})
_MAX_WAIT = 60.0  # the server caps one long poll at 60 s
_READ_MARGIN = 10.0  # so a long poll's read timeout always exceeds its wait
_NO_BODY: Any = object()
_clock = time.monotonic  # module-level so tests can drive wait_run's deadline


class ApiError(SteplineError):
    """The API answered a non-2xx status; ``code`` is the stable snake_case code of openapi.yaml."""

    def __init__(
        self, status: int, code: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.details: dict[str, Any] = details or {}

    def __str__(self) -> str:
        return f"{self.code} (HTTP {self.status}): {self.message}"

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.status, self.code, self.message, self.details)

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        """Parse ``{"error": {code, message, details}}``, or fall back to ``http_<status>``."""
        return cls.from_answer(response.status_code, response.content, response.reason_phrase)

    @classmethod
    def from_answer(cls, status: int, body: bytes, reason: str = "") -> ApiError:
        """:meth:`from_response` for an answer already read: its status and body."""
        try:
            payload = _json.loads(body)
        except ValueError:
            payload = None
        error = payload.get("error") if isinstance(payload, dict) else None
        if isinstance(error, dict) and isinstance(error.get("code"), str):
            details = error.get("details")
            return cls(
                status,
                error["code"],
                str(error.get("message") or ""),
                details if isinstance(details, dict) else {},
            )
        text = body.decode("utf-8", "replace").strip() or reason
        return cls(status, f"http_{status}", text)


@dataclass(frozen=True)
class _Request:
    """One API call, before any I/O."""

    method: str
    path: str  # relative to the base URL, or absolute (a signed callback URL)
    params: dict[str, str] = field(default_factory=dict)
    body: Any = _NO_BODY
    auth: bool = True
    read_timeout: float | None = None
    run: bool = False  # the answer is a run: decode its values (a client with a codec)
    state: str | None = None  # the answer is one state value ("one") or a run's ("all")


def _path(*segments: str) -> str:
    return "/v1/" + "/".join(quote(str(s), safe="") for s in segments)


def _params(**values: object) -> dict[str, str]:
    return {
        k: _iso(v) if isinstance(v, datetime) else str(v)
        for k, v in values.items()
        if v is not None
    }


def _compact(**values: Any) -> JSON:
    return {k: v for k, v in values.items() if v is not None}


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _iso(value: datetime) -> str:
    if value.tzinfo is None:  # naive datetimes are taken as UTC, like the API's times
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _decode(response: httpx.Response) -> Any:
    if not response.is_success:
        raise ApiError.from_response(response)
    if response.status_code == 204 or not response.content:
        return None
    return response.json()


def _next_page(request: _Request, page: JSON) -> _Request | None:
    cursor = page.get("nextCursor")
    return replace(request, params={**request.params, "cursor": str(cursor)}) if cursor else None


class RunFilters(TypedDict, total=False):
    """The filters of ``list_runs`` and ``iter_runs``; naive datetimes are taken as UTC."""

    workflow: str | None
    status: str | None
    run_key: str | None
    created_after: datetime | str | None
    created_before: datetime | str | None
    limit: int | None


def _filtered(resource: str, filters: Mapping[str, Any], cursor: str | None) -> _Request:
    """A page of ``resource`` (``runs``, ``events``) that matches ``filters``."""
    params = _params(cursor=cursor, **{_camel(k): v for k, v in filters.items()})
    return _Request("GET", _path(resource), params)


class EventFilters(TypedDict, total=False):
    """The filters of ``list_events`` and ``iter_events``; naive datetimes are taken as UTC."""

    name: str | None
    created_after: datetime | str | None
    created_before: datetime | str | None
    limit: int | None


class _Waiter:
    """The plan of ``wait_run``: long polls of at most 60 s until the run ends or time is up."""

    def __init__(self, run_id: str, timeout: Duration) -> None:
        self.path = _path("runs", run_id)
        self.deadline = _clock() + parse_duration(timeout)

    def next_request(self) -> _Request:
        wait = min(_MAX_WAIT, max(0.0, self.deadline - _clock()))
        if wait <= 0:
            return _Request("GET", self.path)
        text = f"{int(wait)}s" if wait.is_integer() else f"{math.ceil(wait * 1000)}ms"
        return _Request("GET", self.path, {"wait": text}, read_timeout=wait + _READ_MARGIN)

    def done(self, run: JSON) -> bool:
        return run.get("status") in ENDED_STATUSES or _clock() >= self.deadline


class _StateWaiter:
    """The plan of ``get_state``: long polls of at most 60 s until the key is set or the wait
    is spent."""

    def __init__(self, run_id: str, key: str, wait: Duration | None) -> None:
        problem = protocol.state_key_problem(key)
        if problem is not None:
            raise ValueError(problem)
        self.path = _path("runs", run_id, "state", key)
        self.deadline = _clock() + (0.0 if wait is None else parse_duration(wait))

    def next_request(self) -> _Request:
        wait = min(_MAX_WAIT, max(0.0, self.deadline - _clock()))
        if wait <= 0:
            return _Request("GET", self.path, state="one")
        text = f"{int(wait)}s" if wait.is_integer() else f"{math.ceil(wait * 1000)}ms"
        params = {"wait": text}
        return _Request("GET", self.path, params, read_timeout=wait + _READ_MARGIN, state="one")

    def again(self, exc: ApiError) -> bool:
        """Whether to poll again after ``exc``: the key is not set yet, the run goes on and
        the wait is not spent (or the orchestrator's database restarts)."""
        if exc.status == 503:
            return True
        ended = exc.details.get("runStatus") in ENDED_STATUSES
        return exc.status == 404 and "key" in exc.details and not ended and _clock() < self.deadline


def _state_holders(answer: JSON, kind: str | None) -> list[tuple[JSON, str]]:
    """Where the state values of an answer are: its ``value``, or each of its keys."""
    if kind == "one":
        return [(answer, "value")]
    return [(answer, key) for key in answer] if kind == "all" else []


class _Api(Generic[_D, _N, _I]):
    """Every endpoint, once; subclasses decide how a ``_Request`` is sent."""

    _http: httpx.Client | httpx.AsyncClient

    def __init__(
        self,
        api_key: str | None,
        timeout: float,
        codec: Codec | None = None,
        store: S3Store | None = None,
    ) -> None:
        self._payloads = Payloads(codec, store)
        key = api_key if api_key is not None else os.environ.get("STEPLINE_API_KEY")
        self._auth = {"Authorization": f"Bearer {key}"} if key else {}
        self._timeout = timeout

    def _content(self, req: _Request) -> tuple[bytes | None, dict[str, str]]:
        """The request's JSON body (None when it has none) and its own headers."""
        headers = dict(self._auth) if req.auth else {}
        if req.body is _NO_BODY:
            return None, headers
        headers["Content-Type"] = "application/json"
        return _json.dumps(req.body), headers  # pydantic models as their JSON

    def _build(self, req: _Request) -> httpx.Request:
        content, headers = self._content(req)
        timeout = httpx.Timeout(self._timeout, read=max(self._timeout, req.read_timeout or 0.0))
        return self._http.build_request(
            req.method,
            req.path,
            params=req.params or None,
            content=content,
            headers=headers,
            timeout=timeout,
        )

    def _json(self, req: _Request) -> _D:
        raise NotImplementedError

    def _none(self, req: _Request) -> _N:
        raise NotImplementedError

    def _wait(self, waiter: _Waiter) -> _D:
        raise NotImplementedError

    def _iterate(self, req: _Request, key: str) -> _I:
        raise NotImplementedError

    # apps

    def create_app(self, name: str, url: str | None = None, *, kind: str = "push") -> _D:
        """Register a push app at ``url``, or (``kind="pull"``, no URL) a pull app whose
        workers poll for its invocations (``stepline worker``); the answer carries its
        ``signingSecret``, shown only once."""
        body = {"name": name, **_compact(url=url), **({"kind": kind} if kind != "push" else {})}
        return self._json(_Request("POST", _path("apps"), body=body))

    def list_apps(self, limit: int | None = None, cursor: str | None = None) -> _D:
        """One page of apps: ``{"apps": [...], "nextCursor": ...}``."""
        return self._json(_Request("GET", _path("apps"), _params(limit=limit, cursor=cursor)))

    def get_app(self, id_or_slug: str) -> _D:
        """One app, by UUID or ``wfa_…`` slug."""
        return self._json(_Request("GET", _path("apps", id_or_slug)))

    def update_app(self, id_or_slug: str, *, url: str | None = None, name: str | None = None) -> _D:
        """Change an app's URL or name."""
        body = _compact(url=url, name=name)
        return self._json(_Request("PATCH", _path("apps", id_or_slug), body=body))

    def delete_app(self, id_or_slug: str) -> _N:
        """Remove an app."""
        return self._none(_Request("DELETE", _path("apps", id_or_slug)))

    def sync_app(self, id_or_slug: str, *, take_over: bool = False) -> _D:
        """Have the orchestrator ask the app which workflows it hosts, and register them;
        ``take_over``: move to it those another app registered (refused, 409, otherwise)."""
        params = _params(takeOver="true" if take_over else None)
        return self._json(_Request("POST", _path("apps", id_or_slug, "sync"), params))

    def list_deployments(self, id_or_slug: str) -> _D:
        """The app's deployments, newest first: ``{"deployments": [...]}``."""
        return self._json(_Request("GET", _path("apps", id_or_slug, "deployments")))

    def create_deployment(
        self, id_or_slug: str, url: str | None = None, *, deployment_id: str | None = None
    ) -> _D:
        """Register and sync another deployment of the app at ``url`` (a pull app: none, and
        its ``deployment_id``); it becomes the current one, where new runs start."""
        body = _compact(url=url, deploymentId=deployment_id)
        return self._json(_Request("POST", _path("apps", id_or_slug, "deployments"), body=body))

    def delete_deployment(
        self, id_or_slug: str, deployment: str, *, move_to: str | None = None
    ) -> _N:
        """Delete a deployment of the app; refused (409) while runs are on it, unless
        ``move_to="current"`` moves them to the current deployment first."""
        params = _params(moveTo=move_to)
        path = _path("apps", id_or_slug, "deployments", deployment)
        return self._none(_Request("DELETE", path, params))

    def move_run(self, run_id: str, deployment: str) -> _D:
        """Move a run not ended to another deployment of its app (its id or deploymentId):
        its next invocation goes there."""
        body = {"deployment": deployment}
        return self._json(_Request("POST", _path("runs", run_id, "move"), body=body))

    def list_workflows(self, *, limit: int | None = None, cursor: str | None = None) -> _D:
        """One page of registered workflows: ``{"workflows": [...], "nextCursor": ...}``."""
        return self._json(_Request("GET", _path("workflows"), _params(limit=limit, cursor=cursor)))

    def pause_workflow(self, name: str) -> _D:
        """Stop invoking the workflow's runs (they may still be started and woken)."""
        return self._json(_Request("POST", _path("workflows", name, "pause")))

    def resume_workflow(self, name: str) -> _D:
        """Invoke the workflow's runs again, the waiting ones in their usual order."""
        return self._json(_Request("POST", _path("workflows", name, "resume")))

    def pause_app(self, id_or_slug: str) -> _D:
        """Stop invoking the app's runs (they may still be started and woken)."""
        return self._json(_Request("POST", _path("apps", id_or_slug, "pause")))

    def resume_app(self, id_or_slug: str) -> _D:
        """Invoke the app's runs again, the waiting ones in their usual order."""
        return self._json(_Request("POST", _path("apps", id_or_slug, "resume")))

    # runs

    def start_run(
        self,
        workflow: str,
        input: Any = None,
        *,
        run_key: str | None = None,
        priority: int | None = None,
    ) -> _D:
        """Start a run (or get the existing one of ``run_key`` when workflow and input match).
        ``priority`` (-100 to 100, default 0): among due runs of the workflow, higher first."""
        body = {
            "workflow": workflow,
            "input": self._payloads.seal_input(input),
            **_compact(runKey=run_key, priority=priority),
        }
        return self._json(_Request("POST", _path("runs"), body=body))

    def get_run(self, run_id: str) -> _D:
        """One run, with its steps."""
        return self._json(_Request("GET", _path("runs", run_id), run=True))

    def wait_run(self, run_id: str, timeout: Duration = 60) -> _D:
        """The run once it has ended, or as it is when ``timeout`` is spent."""
        return self._wait(_Waiter(run_id, timeout))

    def get_all_state(self, run_id: str) -> _D:
        """The state the run published (``ctx.set_state``): ``{key: value}``, each key's
        current value."""
        return self._json(_Request("GET", _path("runs", run_id, "state"), state="all"))

    def list_runs(self, *, cursor: str | None = None, **filters: Unpack[RunFilters]) -> _D:
        """One page of runs, newest first: ``{"runs": [...], "nextCursor": ...}``."""
        return self._json(_filtered("runs", filters, cursor))

    def iter_runs(self, **filters: Unpack[RunFilters]) -> _I:
        """Every run matching the filters, following ``nextCursor`` page after page."""
        return self._iterate(_filtered("runs", filters, None), "runs")

    def cancel_run(self, run_id: str) -> _D:
        """Request cancellation; the run goes ``cancelling``, then ``cancelled``."""
        return self._json(_Request("POST", _path("runs", run_id, "cancel")))

    def retry_run(self, run_id: str, *, from_step: str | None = None) -> _D:
        """Run a failed, cancelled or timed-out run again, from ``from_step`` when given."""
        body = _compact(fromStep=from_step)
        return self._json(_Request("POST", _path("runs", run_id, "retry"), body=body))

    def list_run_events(
        self,
        run_id: str,
        *,
        after: int | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> _D:
        """One page of the run's history (events with ``seq > after``)."""
        params = _params(after=after, limit=limit, cursor=cursor)
        return self._json(_Request("GET", _path("runs", run_id, "events"), params))

    def iter_run_events(self, run_id: str, *, after: int | None = None) -> _I:
        """The run's whole history in order, following ``nextCursor``."""
        req = _Request("GET", _path("runs", run_id, "events"), _params(after=after))
        return self._iterate(req, "events")

    def list_run_logs(
        self,
        run_id: str,
        *,
        after: int | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> _D:
        """One page of the run's log lines (``seq > after``), with ``logsDropped``."""
        params = _params(after=after, limit=limit, cursor=cursor)
        return self._json(_Request("GET", _path("runs", run_id, "logs"), params))

    def iter_run_logs(self, run_id: str, *, after: int | None = None) -> _I:
        """The run's log lines in order, following ``nextCursor``."""
        req = _Request("GET", _path("runs", run_id, "logs"), _params(after=after))
        return self._iterate(req, "logs")

    def list_run_invocations(
        self, run_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> _D:
        """One page of the run's invocations, oldest first: how each began and ended."""
        params = _params(limit=limit, cursor=cursor)
        return self._json(_Request("GET", _path("runs", run_id, "invocations"), params))

    def iter_run_invocations(self, run_id: str) -> _I:
        """The run's invocations in order, following ``nextCursor``."""
        return self._iterate(_Request("GET", _path("runs", run_id, "invocations")), "invocations")

    def get_run_replay(self, run_id: str) -> _D:
        """The run's input and recorded steps as an invocation carries them (for replays)."""
        return self._json(_Request("GET", _path("runs", run_id, "replay")))

    # callbacks and events

    def complete_callback(self, id_or_url: str, body: Any) -> _D:
        """Complete a waiting callback; a full (signed) URL is POSTed to without the API key."""
        sealed = self._payloads.seal_input(body)
        if id_or_url.startswith(("http://", "https://")):
            return self._json(_Request("POST", id_or_url, body=sealed, auth=False))
        return self._json(_Request("POST", _path("callbacks", id_or_url), body=sealed))

    def get_callback(self, callback_id: str) -> _D:
        """A callback: ``pending``, ``completed`` or ``timedOut``, with its body."""
        return self._json(_Request("GET", _path("callbacks", callback_id)))

    def send_event(self, name: str, data: Any = None, *, id: str | None = None) -> _D:
        """Send an event: every run waiting for ``name`` whose match fields equal ``data``
        resumes, and every workflow declared ``on_event=name`` starts a run. With ``id``, a
        second send of that id within a day does nothing again and answers the first."""
        body = {"name": name, "data": self._payloads.seal_input(data), **_compact(id=id)}
        return self._json(_Request("POST", _path("events"), body=body))

    def list_events(self, *, cursor: str | None = None, **filters: Unpack[EventFilters]) -> _D:
        """One page of the events received (kept a day), newest first:
        ``{"events": [...], "nextCursor": ...}``."""
        return self._json(_filtered("events", filters, cursor))

    def iter_events(self, **filters: Unpack[EventFilters]) -> _I:
        """Every event received that matches the filters, following ``nextCursor``."""
        return self._iterate(_filtered("events", filters, None), "events")

    # schedules

    def create_schedule(
        self,
        workflow: str,
        cron: str,
        *,
        timezone: str = "UTC",
        input: Any = None,
        overlap: str | None = None,
        misfire: str | None = None,
        **options: Any,
    ) -> _D:
        """Create a cron schedule; extra ``options`` are sent with camelCase keys."""
        body = {
            "workflow": workflow,
            "cron": cron,
            "timezone": timezone,
            **_compact(
                input=None if input is None else self._payloads.seal_input(input),
                overlap=overlap,
                misfire=misfire,
            ),
            **{_camel(k): v for k, v in options.items()},
        }
        return self._json(_Request("POST", _path("schedules"), body=body))

    def list_schedules(self, *, limit: int | None = None, cursor: str | None = None) -> _D:
        """One page of schedules: ``{"schedules": [...], "nextCursor": ...}``."""
        return self._json(_Request("GET", _path("schedules"), _params(limit=limit, cursor=cursor)))

    def iter_schedules(self) -> _I:
        """Every schedule, page after page."""
        return self._iterate(_Request("GET", _path("schedules"), _params(limit=500)), "schedules")

    def get_schedule(self, schedule_id: str) -> _D:
        """One schedule."""
        return self._json(_Request("GET", _path("schedules", schedule_id)))

    def update_schedule(self, schedule_id: str, **changes: Any) -> _D:
        """Change a schedule; keys are sent camelCased, ``None`` values included."""
        body = {_camel(k): v for k, v in changes.items()}
        return self._json(_Request("PATCH", _path("schedules", schedule_id), body=body))

    def delete_schedule(self, schedule_id: str) -> _N:
        """Remove a schedule."""
        return self._none(_Request("DELETE", _path("schedules", schedule_id)))

    def pause_schedule(self, schedule_id: str) -> _D:
        """Stop firing until resumed."""
        return self._json(_Request("POST", _path("schedules", schedule_id, "pause")))

    def resume_schedule(self, schedule_id: str) -> _D:
        """Fire again from the next tick."""
        return self._json(_Request("POST", _path("schedules", schedule_id, "resume")))

    def trigger_schedule(self, schedule_id: str) -> _D:
        """Start a run of the schedule now; answers the run."""
        return self._json(_Request("POST", _path("schedules", schedule_id, "trigger")))

    def bulk_runs(
        self,
        action: str,
        filter: Mapping[str, Any],
        *,
        from_step: str | None = None,
        deployment: str | None = None,
        dry_run: bool = False,
    ) -> _D:
        """Cancel (``"cancel"``) or retry (``"retry"``, ``"retryFromStep"`` with ``from_step``)
        every run ``filter`` matches, or move them (``"move"``) to ``deployment``: an operation,
        worked in the background; with ``dry_run``, ``{"matched": n, "sample": [...]}`` and
        nothing changes."""
        body = _compact(
            action=action, filter=dict(filter), fromStep=from_step, deployment=deployment
        )
        if dry_run:
            body["dryRun"] = True
        return self._json(_Request("POST", _path("runs", "bulk"), body=body))

    def list_operations(self, *, limit: int | None = None, cursor: str | None = None) -> _D:
        """One page of bulk operations, newest first."""
        return self._json(
            _Request("GET", _path("operations"), params=_params(limit=limit, cursor=cursor))
        )

    def get_operation(self, operation_id: str) -> _D:
        """A bulk operation: its status, counters and first errors."""
        return self._json(_Request("GET", _path("operations", operation_id)))

    def cancel_operation(self, operation_id: str) -> _D:
        """Stop a bulk operation; what it did stays done."""
        return self._json(_Request("POST", _path("operations", operation_id, "cancel")))

    # alerts (admin keys)

    def create_alert(
        self,
        name: str,
        on: list[str],
        destination: Mapping[str, str],
        *,
        workflow: str | None = None,
    ) -> _D:
        """An alert sending ``on``'s types (``run.failed``, …) to ``destination``
        (``{"type": "webhook" | "slack", "url": …}``); a webhook's answer carries its
        ``secret``, shown only once."""
        body = {"name": name, "on": on, "destination": dict(destination)}
        body.update(_compact(workflow=workflow))
        return self._json(_Request("POST", _path("alerts"), body=body))

    def list_alerts(self, *, limit: int | None = None, cursor: str | None = None) -> _D:
        """One page of alerts: ``{"alerts": [...], "nextCursor": ...}``."""
        return self._json(_Request("GET", _path("alerts"), _params(limit=limit, cursor=cursor)))

    def get_alert(self, alert_id: str) -> _D:
        """One alert."""
        return self._json(_Request("GET", _path("alerts", alert_id)))

    def update_alert(self, alert_id: str, **changes: Any) -> _D:
        """Change an alert (``name``, ``on``, ``workflow``, ``destination``)."""
        body = {_camel(k): v for k, v in changes.items()}
        return self._json(_Request("PATCH", _path("alerts", alert_id), body=body))

    def delete_alert(self, alert_id: str) -> _N:
        """Remove an alert and its deliveries."""
        return self._none(_Request("DELETE", _path("alerts", alert_id)))

    def test_alert(self, alert_id: str) -> _D:
        """Send an ``alert.test`` notification now; answers its delivery (pending)."""
        return self._json(_Request("POST", _path("alerts", alert_id, "test")))

    def list_alert_deliveries(
        self, alert_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> _D:
        """One page of an alert's notifications, newest first, with how each was delivered."""
        params = _params(limit=limit, cursor=cursor)
        return self._json(_Request("GET", _path("alerts", alert_id, "deliveries"), params))

    # projects, environments and keys (an admin key)

    def list_projects(self) -> _D:
        """The key's project: ``{"projects": [...]}``."""
        return self._json(_Request("GET", _path("projects")))

    def list_environments(self) -> _D:
        """The environments of the key's project: ``{"environments": [...]}``."""
        return self._json(_Request("GET", _path("environments")))

    def create_environment(self, name: str) -> _D:
        """Add an environment to the key's project."""
        return self._json(_Request("POST", _path("environments"), body={"name": name}))

    def list_keys(self) -> _D:
        """The active keys of the key's environment: ``{"keys": [...]}`` (never the secrets)."""
        return self._json(_Request("GET", _path("keys")))

    def create_key(self, name: str, *, role: str = "admin", environment: str | None = None) -> _D:
        """Make an API key (``role`` ``admin``, ``write`` or ``read``) for the key's
        environment or ``environment`` of its project; the answer's ``key`` is shown once."""
        body = {"name": name, "role": role, **_compact(environment=environment)}
        return self._json(_Request("POST", _path("keys"), body=body))

    def revoke_key(self, key_id: str) -> _N:
        """Revoke a key: it is refused from then on."""
        return self._none(_Request("DELETE", _path("keys", key_id)))


def _http_options(base_url: str, timeout: float, headers: Mapping[str, str] | None) -> JSON:
    headers = {"User-Agent": "stepline-python", **(headers or {})}
    return {"base_url": base_url, "timeout": timeout, "headers": headers}


class Client(_Api[JSON, None, Iterator[JSON]]):
    """Blocking client of the Stepline API; the key defaults to ``STEPLINE_API_KEY``.

    ``codec`` (a :class:`stepline.Encryption`): inputs it sends (runs', events' data,
    callbacks' bodies, schedules') are encrypted, and the runs ``get_run`` and ``wait_run``
    answer come decrypted; ``store`` (a :class:`stepline.S3Store`): values stored by the app
    are read back from it (docs/payloads.md)."""

    _http: httpx.Client

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
        codec: Codec | None = None,
        store: S3Store | None = None,
    ) -> None:
        super().__init__(api_key, timeout, codec, store)
        self._http = httpx.Client(**_http_options(base_url, timeout, headers), transport=transport)

    def _json(self, req: _Request) -> JSON:
        answer = cast(JSON, _decode(self._http.send(self._build(req))) or {})
        for holder, name in _state_holders(answer, req.state):
            if self._payloads.active and protocol.envelope_kind(holder[name]) is not None:
                with contextlib.suppress(PayloadError, OSError):
                    holder[name] = self._payloads.decode_sync(holder[name])
        return self._payloads.open_run_sync(answer) if req.run else answer

    def get_state(self, run_id: str, key: str, *, wait: Duration | None = None) -> Any:
        """The current value of the run's state ``key``; with ``wait`` (a duration), waits
        that long at most for the key to be set. Raises :class:`ApiError` (``404``) when the
        run has no such key (after the wait; at once when the run has ended)."""
        waiter = _StateWaiter(run_id, key, wait)
        while True:
            try:
                return self._json(waiter.next_request())["value"]
            except ApiError as exc:
                if not waiter.again(exc):
                    raise
                if exc.status == 503:
                    time.sleep(UNAVAILABLE_PAUSE)

    def _none(self, req: _Request) -> None:
        _decode(self._http.send(self._build(req)))

    def _wait(self, waiter: _Waiter) -> JSON:
        while True:
            try:
                run = self._json(waiter.next_request())
            except ApiError as exc:
                if exc.status != 503:
                    raise
                time.sleep(UNAVAILABLE_PAUSE)  # the orchestrator's database is restarting
                continue
            if waiter.done(run):
                return cast(JSON, self._payloads.open_run_sync(run))

    def _iterate(self, req: _Request, key: str) -> Iterator[JSON]:
        page_req: _Request | None = req
        while page_req is not None:
            page = self._json(page_req)
            yield from page.get(key) or []
            page_req = _next_page(page_req, page)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncClient(_Api[Awaitable[JSON], Awaitable[None], AsyncIterator[JSON]]):
    """The same API as :class:`Client`, with ``async`` methods and ``async for`` iterators.

    Without a ``transport`` it sends over :mod:`stepline._http` directly (a fraction of httpx's
    CPU per request, which counts when an app starts many runs); network errors are still
    raised as ``httpx`` exceptions. With one, every request goes through ``httpx``."""

    _http: httpx.AsyncClient

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
        codec: Codec | None = None,
        store: S3Store | None = None,
    ) -> None:
        super().__init__(api_key, timeout, codec, store)
        options = _http_options(base_url, timeout, headers)
        self._direct = _http.HttpClient(timeout=timeout) if transport is None else None
        self._base = str(httpx.URL(base_url)).rstrip("/")
        self._headers: dict[str, str] = options["headers"]
        self._http = httpx.AsyncClient(
            **options, transport=transport or _http.AsyncTransport(timeout)
        )

    async def _send(self, req: _Request) -> Any:
        if self._direct is None:
            return _decode(await self._http.send(self._build(req)))
        url = req.path if "://" in req.path else self._base + req.path
        if req.params:
            url += ("&" if "?" in url else "?") + urlencode(req.params)
        content, own = self._content(req)
        headers = {**self._headers, **own}
        timeout = max(self._timeout, req.read_timeout or 0.0)
        try:
            answer = await self._direct.request(
                req.method,
                url,
                content or b"",
                headers,
                timeout=timeout,
                idempotent=req.method in _http.SAFE_METHODS,
            )
        except _http.HttpError as exc:
            request = httpx.Request(req.method, url)
            if str(exc) == "timed out":
                raise httpx.ReadTimeout(str(exc), request=request) from None
            raise httpx.ConnectError(str(exc), request=request) from None
        if not 200 <= answer.status < 300:
            raise ApiError.from_answer(answer.status, answer.body)
        if answer.status == 204 or not answer.body:
            return None
        return _json.loads(answer.body)

    async def _json(self, req: _Request) -> JSON:
        answer = cast(JSON, await self._send(req) or {})
        for holder, name in _state_holders(answer, req.state):
            if self._payloads.active and protocol.envelope_kind(holder[name]) is not None:
                with contextlib.suppress(PayloadError, OSError):
                    holder[name] = await self._payloads.decode(holder[name])
        return cast(JSON, await self._payloads.open_run(answer)) if req.run else answer

    async def get_state(self, run_id: str, key: str, *, wait: Duration | None = None) -> Any:
        """:meth:`Client.get_state`, without blocking."""
        waiter = _StateWaiter(run_id, key, wait)
        while True:
            try:
                return (await self._json(waiter.next_request()))["value"]
            except ApiError as exc:
                if not waiter.again(exc):
                    raise
                if exc.status == 503:
                    await asyncio.sleep(UNAVAILABLE_PAUSE)

    async def _none(self, req: _Request) -> None:
        await self._send(req)

    async def _wait(self, waiter: _Waiter) -> JSON:
        while True:
            try:
                run = await self._json(waiter.next_request())
            except ApiError as exc:
                if exc.status != 503:
                    raise
                await asyncio.sleep(UNAVAILABLE_PAUSE)  # the orchestrator's database restarts
                continue
            if waiter.done(run):
                return cast(JSON, await self._payloads.open_run(run))

    async def _iterate(self, req: _Request, key: str) -> AsyncIterator[JSON]:
        page_req: _Request | None = req
        while page_req is not None:
            page = await self._json(page_req)
            for item in page.get(key) or []:
                yield item
            page_req = _next_page(page_req, page)

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._direct is not None:
            await self._direct.aclose()
        await self._http.aclose()
        await self._payloads.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
