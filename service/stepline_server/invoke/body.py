"""The ``invoke`` request's JSON, built straight from the claimed run and its step rows.

It is what ``stepline.protocol.dump(InvokeRequest(...))`` gives (camelCase names, no null
fields), without building and validating pydantic models for what the store itself wrote: it
runs once per step sent. A result
the store did not read (over its inline limit) goes as an ``outputRef``: the app fetches it
when replay reads it. An app of a protocol before published state gets no ``state`` steps:
its SDK does not know the kind and would refuse the whole request, and its code never sets
state, so they are not part of its replay (a rollback while a run that published is in flight).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from stepline.protocol import (
    INLINE_RESULT_BYTES,
    PROTOCOL_VERSION,
    STATE_PROTOCOL_VERSION,
    StepKind,
)
from stepline_server.engine.transitions import Claim
from stepline_server.invoke.urls import CallbackSigner


def invoke_body(
    run: Claim,
    steps: Sequence[Mapping[str, Any]],
    *,
    attempt: int,
    api_url: str,
    signer: CallbackSigner,
    history_base: uuid.UUID | None = None,
    app_protocol: int | None = None,
) -> dict[str, Any]:
    """The request for ``run`` (a claimed row) with its ``steps`` (rows in recorded order):
    all of them, or with ``history_base`` only those that changed since the history invocation
    ``history_base`` was sent, as ``{"historyBase", "changes"}`` (the app lays them over the one
    it kept; an SDK from before this form refuses it rather than take it for the whole).
    ``app_protocol``: the protocol version of what is invoked (None: the one the run's app
    declared at its last sync); before published state, the run's ``state`` steps are left
    out."""
    steps = readable(steps, run.app_protocol if app_protocol is None else app_protocol)
    body: dict[str, Any] = {
        "kind": "invoke",
        "runId": str(run.id),
        "workflow": run.workflow,
        "input": run.input,
        "invocationId": str(run.invocation_id),
        "token": signer.invocation_token(str(run.invocation_id), run.lease_token),
        "apiUrl": api_url,
        "attempt": attempt,
        "cancelRequested": run.cancel_requested,
        "steps": [step_json(s, api_url, signer) for s in steps],
        "generation": run.generation,
        "protocolVersion": PROTOCOL_VERSION,  # so the SDK knows what it may send (state steps)
    }
    if history_base is not None:
        body["steps"] = {"historyBase": str(history_base), "changes": body["steps"]}
    if body["input"] is None:
        del body["input"]
    return body


def readable(
    steps: Sequence[Mapping[str, Any]], protocol: int | None
) -> Sequence[Mapping[str, Any]]:
    """The ``steps`` (rows) an SDK of protocol version ``protocol`` (None: it declared none,
    version 1) reads: all of them, or all but the ``state`` steps before published state."""
    if protocol is not None and protocol >= STATE_PROTOCOL_VERSION:
        return steps
    return [s for s in steps if s["kind"] != StepKind.STATE.value]


def step_json(row: Mapping[str, Any], api_url: str, signer: CallbackSigner) -> dict[str, Any]:
    """A step row as the app gets it (a ``StepRecord``)."""
    step: dict[str, Any] = {
        "name": row["name"],
        "kind": row["kind"],
        "status": row["status"],
        "position": row["position"],
        "attempt": row["attempt"],
    }
    if row["output"] is not None:
        step["output"] = row["output"]
    elif (row.get("output_bytes") or 0) > INLINE_RESULT_BYTES and row.get("output_digest"):
        step["outputRef"] = {"size": row["output_bytes"], "digest": f"md5:{row['output_digest']}"}
    error = row["error"]
    if error is not None:
        step["error"] = {"type": error.get("type", "Error"), "message": error.get("message", "")}
        if error.get("code") is not None:
            step["error"]["code"] = error["code"]
    if row["wake_at"] is not None:
        step["wakeAt"] = row["wake_at"].isoformat()
    if row["callback_id"] is not None:
        callback_id = str(row["callback_id"])
        step["callbackId"] = callback_id
        step["callbackUrl"] = signer.url(api_url, callback_id)
    if row["child_run_id"] is not None:
        step["childRunId"] = str(row["child_run_id"])
    step["timedOut"] = row["callback_id"] is not None and row["callback_status"] == "timedOut"
    if row.get("blocked"):
        step["blocked"] = True  # a retrying step whose next attempt is not due yet
    return step
