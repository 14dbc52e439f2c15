"""Database rows as the camelCase JSON objects the API, the CLI and the dashboard show."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

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
        "deploymentId": row["deployment_id"],
        "createdAt": ts(row["created_at"]),
        "updatedAt": ts(row["updated_at"]),
        "syncedAt": ts(row["synced_at"]),
    }
    if secret:
        data["signingSecret"] = row["signing_secrets"][0]
    return data


def workflow(row: Record) -> dict[str, Any]:
    options = row["options"] or {}
    return {
        "name": row["name"],
        "app": row["app_slug"],
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
        "error": row["error"],
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
    data: dict[str, Any] = {
        "id": str(row["id"]),
        "traceId": row["id"].hex,  # the run's OpenTelemetry trace id (see tracing.py)
        "workflow": row["workflow"],
        "app": app_slug,
        "status": row["status"],
        "input": row["input"],
        "output": row["output"],
        "error": row["error"],
        "runKey": row["run_key"],
        "parentRunId": str(row["parent_run_id"]) if row["parent_run_id"] else None,
        "scheduleId": row["schedule_id"],
        "scheduledAt": ts(scheduled),
        "startLagMs": int((started - scheduled).total_seconds() * 1000)
        if started and scheduled
        else None,
        "trigger": row["trigger"],
        "eventId": str(row["event_id"]) if row.get("event_id") else None,
        "version": row.get("definition_version"),
        "generation": row.get("generation") or 1,
        "createdAt": ts(row["created_at"]),
        "startedAt": ts(started),
        "endedAt": ts(row["ended_at"]),
    }
    if "deployment_id" in row:  # the run read alone: its last invocation's deployment
        data["deploymentId"] = row["deployment_id"]
    if steps is not None:
        data["steps"] = [step(s, callback_url) for s in steps]
    return data


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
        "response": row["error"] if outcome not in (None, "completed", "suspended") else None,
    }
