"""Alerts and their deliveries as the camelCase JSON the API, the CLI and the dashboard show."""

from __future__ import annotations

from typing import Any

from stepline_server.application.serialize import ts
from stepline_server.store.db import Record


def alert(row: Record, *, secret: bool = False) -> dict[str, Any]:
    """An alert; its ``secret`` only when it was just made (or made anew), and only for a
    webhook: Slack bodies are not signed."""
    data: dict[str, Any] = {
        "id": str(row["id"]),
        "name": row["name"],
        "on": list(row["types"]),
        "workflow": row["workflow"],
        "destination": {"type": row["destination_type"], "url": row["url"]},
        "createdAt": ts(row["created_at"]),
        "updatedAt": ts(row["updated_at"]),
    }
    if secret and row["destination_type"] == "webhook":
        data["secret"] = row["secret"]
    return data


def delivery(row: Record) -> dict[str, Any]:
    """A notification of an alert and how its delivery went (``id`` is the notification's)."""
    data = row["data"] or {}
    return {
        "id": str(row["id"]),
        "type": row["type"],
        "status": row["status"],
        "attempts": row["attempts"],
        "lastHttpStatus": row["last_http_status"],
        "lastError": row["last_error"],
        "createdAt": ts(row["created_at"]),
        "deliveredAt": ts(row["delivered_at"]),
        "runId": str(row["run_id"]) if row["run_id"] is not None else None,
        "scheduleId": row["schedule_id"],
        "workflow": data.get("workflow"),
    }
