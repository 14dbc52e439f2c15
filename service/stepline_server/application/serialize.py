"""Database rows as the camelCase JSON objects the API, the CLI and the dashboard show."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from stepline_server.engine import error_codes
from stepline_server.engine.timing import timing
from stepline_server.store.db import Record


def ts(value: datetime | None) -> str | None:
    """RFC 3339 in UTC."""
    if value is None:
        return None
    return value.isoformat().replace("+00:00", "Z")


def app(row: Record, *, secret: bool = False) -> dict[str, Any]:
    data = {
        "id": str(row["id"]),
        "slug": row["slug"],
        "name": row["name"],
        "url": row["url"],
        "kind": row["kind"],
        "deploymentId": row["deployment_id"],
        "createdAt": ts(row["created_at"]),
        "updatedAt": ts(row["updated_at"]),
        "syncedAt": ts(row["synced_at"]),
        "lastPolledAt": ts(row["polled_at"]),
        "protocolVersion": row["protocol_version"],
        "sdkVersion": row["sdk_version"],
        "paused": row["paused_at"] is not None,
        "pausedAt": ts(row["paused_at"]),
    }
    if secret:
        data["signingSecret"] = row["signing_secrets"][0]
    return data


def deployment(row: Record) -> dict[str, Any]:
    """One deployment of an app, with how many runs not ended are on it (when counted)."""
    data: dict[str, Any] = {
        "id": str(row["id"]),
        "deploymentId": row["deployment_id"],
        "url": row["url"],
        "current": row["current"],
        "createdAt": ts(row["created_at"]),
    }
    if "running_runs" in row:
        data["runningRuns"] = row["running_runs"]
    return data


def workflow(row: Record) -> dict[str, Any]:
    options = row["options"] or {}
    return {
        "name": row["name"],
        "app": row["app_slug"],
        "appName": row.get("app_name"),
        "paused": row["paused_at"] is not None,
        "pausedAt": ts(row["paused_at"]),
        "options": options,
        "inputSchema": options.get("inputSchema"),
        "outputSchema": options.get("outputSchema"),
        "version": row["version"],
        "syncedAt": ts(row["synced_at"]),
    }


CallbackUrl = Callable[[str], str]
"""The signed URL that completes a callback, given its id."""


def step(row: Record, callback_url: CallbackUrl | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": row["name"],
        "kind": row["kind"],
        "status": row["status"],
        "attempt": row["attempt"],
        "startedAt": ts(row["started_at"]),
        "endedAt": ts(row["ended_at"]),
        "output": row["output"],
        "error": error_codes.with_code(row["error"], error_codes.STEP_FAILED),
    }
    if row["kind"] == "sleep" or row["status"] == "retrying":
        data["wakeAt"] = ts(row["wake_at"])
    if row["callback_id"] is not None:
        data["callbackId"] = str(row["callback_id"])
        if callback_url is not None:
            data["callbackUrl"] = callback_url(str(row["callback_id"]))
    if row["child_run_id"] is not None:
        data["childRunId"] = str(row["child_run_id"])
    if row["timeout_at"] is not None:
        data["timeoutAt"] = ts(row["timeout_at"])
    return data


def run(
    row: Record,
    app_slug: str | None = None,
    steps: list[Record] | None = None,
    callback_url: CallbackUrl | None = None,
) -> dict[str, Any]:
    started, scheduled = row["started_at"], row["scheduled_at"]
    sla_ms = row.get("schedule_sla_ms")
    timed = timing(scheduled, started, row["ended_at"], sla_ms, datetime.now(UTC))
    data: dict[str, Any] = {
        "id": str(row["id"]),
        "traceId": row["id"].hex,  # the run's OpenTelemetry trace id (see tracing.py)
        "workflow": row["workflow"],
        "app": app_slug,
        "appName": row.get("app_name"),
        "status": row["status"],
        "input": row["input"],
        "output": row["output"],
        "error": error_codes.with_code(row["error"], error_codes.WORKFLOW_FAILED),
        "runKey": row["run_key"],
        "parentRunId": str(row["parent_run_id"]) if row["parent_run_id"] else None,
        "scheduleId": row["schedule_id"],
        "scheduledAt": ts(scheduled),
        "startLagMs": timed.start_lag_ms,
        "e2eMs": timed.e2e_ms,
        "slaMs": sla_ms,
        "slaBreached": timed.sla_breached,
        "trigger": row["trigger"],
        "eventId": row.get("event_key") or (str(row["event_id"]) if row.get("event_id") else None),
        "version": row.get("definition_version"),
        "generation": row.get("generation") or 1,
        "priority": row.get("priority", 0),
        "createdAt": ts(row["created_at"]),
        "startedAt": ts(started),
        "endedAt": ts(row["ended_at"]),
        "logLines": row.get("log_lines", 0),
        "logsDropped": row.get("logs_dropped", 0),
    }
    if row.get("pull"):  # a pull app's run: whether it is due with no worker running it
        ready = row.get("ready_at")
        data["waitingForWorker"] = (
            row["status"] in ("running", "cancelling")
            and row.get("lease_token") is None
            and ready is not None
            and ready <= datetime.now(UTC)
        )
    if "deployment" in row:  # the deployment the run is pinned to (invoked at)
        data["deployment"] = str(row["deployment"]) if row["deployment"] else None
    if "deployment_id" in row:  # the run read alone: its last invocation's deployment
        data["deploymentId"] = row["deployment_id"]
    if steps is not None:
        data["steps"] = [step(s, callback_url) for s in steps]
    return data


def replay_step(row: Record, now: datetime, callback_url: CallbackUrl) -> dict[str, Any]:
    """A recorded step as an invocation carries it (``stepline.protocol.StepRecord``): what a
    replay of the run reads, ``blocked`` when its next attempt is not due at ``now``."""
    step: dict[str, Any] = {
        "name": row["name"],
        "kind": row["kind"],
        "status": row["status"],
        "position": row["position"],
        "attempt": row["attempt"],
        "output": row["output"],
        "error": row["error"],
        "wakeAt": ts(row["wake_at"]),
        "callbackId": None,
        "callbackUrl": None,
        "childRunId": str(row["child_run_id"]) if row["child_run_id"] is not None else None,
        "timedOut": row["callback_id"] is not None and row["callback_status"] == "timedOut",
        "blocked": row["status"] == "retrying"
        and row["wake_at"] is not None
        and row["wake_at"] > now,
    }
    if row["callback_id"] is not None:
        step["callbackId"] = str(row["callback_id"])
        step["callbackUrl"] = callback_url(str(row["callback_id"]))
    return step


def replay(
    row: Record, steps: list[Record], now: datetime, callback_url: CallbackUrl
) -> dict[str, Any]:
    """What a replay of a run starts from: its input and recorded steps, in recorded order."""
    return {
        "runId": str(row["id"]),
        "workflow": row["workflow"],
        "status": row["status"],
        "input": row["input"],
        "cancelRequested": row["cancel_requested"],
        "version": row.get("definition_version"),
        "deploymentId": row.get("deployment_id"),
        "steps": [replay_step(s, now, callback_url) for s in steps],
    }


def event(row: Record) -> dict[str, Any]:
    data: dict[str, Any] = {"seq": row["seq"], "at": ts(row["at"]), "type": row["type"]}
    for key, col in (
        ("stepName", "step_name"),
        ("deploymentId", "deployment_id"),
        ("httpStatus", "http_status"),
        ("durationMs", "duration_ms"),
        ("data", "data"),
    ):
        if row[col] is not None:
            data[key] = row[col]
    if row["invocation_id"] is not None:
        data["invocationId"] = str(row["invocation_id"])
    return data


def received_event(row: Record) -> dict[str, Any]:
    """An event received, as its send answered it (its sender's id, else its own), with its
    name, data and time."""
    answer = row["answer"] or {}
    return {
        "id": row["key"] if row["key"] is not None else str(row["id"]),
        "name": row["name"],
        "data": row["data"],
        "createdAt": ts(row["received_at"]),
        "matchedRuns": len(answer.get("matched", [])),
        "startedRuns": answer.get("started", []),
    }


def log_line(row: Record) -> dict[str, Any]:
    """One line of a run's log."""
    return {
        "seq": row["seq"],
        "at": ts(row["at"]),
        "level": row["level"],
        "message": row["message"],
        "fields": row["fields"],
        "stepName": row["step_name"],
    }


def callback(row: Record, url: str) -> dict[str, Any]:
    return {
        "id": str(row["id"]),
        "runId": str(row["run_id"]),
        "stepName": row["step_name"],
        "status": row["status"],
        "body": row["body"],
        "url": url,
        "createdAt": ts(row["created_at"]),
        "completedAt": ts(row["completed_at"]),
        "timeoutAt": ts(row["timeout_at"]),
    }


def schedule(row: Record) -> dict[str, Any]:
    """A schedule; ``nextFireAt`` is null unless it is active."""
    return {
        "id": row["id"],
        "workflow": row["workflow"],
        "cron": row["cron"],
        "timezone": row["timezone"],
        "input": row["input"],
        "overlap": row["overlap"],
        "misfire": row["misfire"],
        "status": row["status"],
        "source": row["source"],
        "disableAfter": row["disable_after"],
        "slaMs": row["sla_ms"],
        "consecutiveFailures": row["consecutive_failures"],
        "nextFireAt": ts(row["next_fire_at"]) if row["status"] == "active" else None,
        "lastFireAt": ts(row["last_fire_at"]),
        "version": row["version"],
        "createdAt": ts(row["created_at"]),
        "updatedAt": ts(row["updated_at"]),
    }


def project(row: Record) -> dict[str, Any]:
    return {"id": str(row["id"]), "name": row["name"], "createdAt": ts(row["created_at"])}


def environment(row: Record) -> dict[str, Any]:
    return {"id": str(row["id"]), "name": row["name"], "createdAt": ts(row["created_at"])}


def key(row: Record, environment: str) -> dict[str, Any]:
    """An API key as listed: never the key itself (only its first characters)."""
    return {
        "id": str(row["id"]),
        "name": row["name"],
        "role": row["role"],
        "environment": environment,
        "prefix": row["prefix"],
        "createdAt": ts(row["created_at"]),
    }


def invocation(row: Record) -> dict[str, Any]:
    """One invocation of a run, from its history: how it ended (null while it runs) and, when
    it did not succeed, why (``response``)."""
    outcome = row["outcome"]
    return {
        "id": str(row["id"]) if row["id"] else None,
        "attempt": row["attempt"],
        "startedAt": ts(row["started_at"]),
        "endedAt": ts(row["ended_at"]),
        "durationMs": row["duration_ms"],
        "outcome": outcome,
        "httpStatus": row["http_status"],
        "deploymentId": row["deployment_id"],
        "request": row["request"],
        "response": row["error"] if outcome not in (None, "completed", "suspended") else None,
    }


def operation(row: Record, errors: list[Record] | None = None) -> dict[str, Any]:
    """A bulk operation; with ``errors``, its first errors too."""
    data: dict[str, Any] = {
        "id": str(row["id"]),
        "action": row["action"],
        "filter": row["filter"],
        "fromStep": row["from_step"],
        "deployment": str(row["deployment"]) if row["deployment"] else None,
        "status": row["status"],
        "matched": row["matched"],
        "succeeded": row["succeeded"],
        "failed": row["failed"],
        "skipped": row["skipped"],
        "createdAt": ts(row["created_at"]),
        "endedAt": ts(row["ended_at"]),
    }
    if errors is not None:
        data["errors"] = [
            {"runId": str(e["run_id"]), **(e["error"] or {}), "at": ts(e["done_at"])}
            for e in errors
        ]
    return data
