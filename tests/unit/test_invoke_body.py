"""The invoke request built straight from rows is exactly what the protocol models produce."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from stepline.protocol import PROTOCOL_VERSION, InvokeRequest, StepRecord, dump
from stepline_server.invoke.body import invoke_body
from stepline_server.invoke.urls import CallbackSigner
from tests.claims import claim

API = "http://orchestrator.test"
SIGNER = CallbackSigner(["secret"])


def step_row(name: str, kind: str, status: str, position: int, **kw: Any) -> dict[str, Any]:
    row = {
        "name": name,
        "kind": kind,
        "status": status,
        "position": position,
        "attempt": 1,
        "output": None,
        "error": None,
        "wake_at": None,
        "callback_id": None,
        "callback_status": None,
        "child_run_id": None,
    }
    return row | kw


def a_run() -> dict[str, Any]:
    """A claimed run of ``wf`` with no input (its invocation's fields)."""
    return {
        "id": uuid.uuid4(),
        "workflow": "wf",
        "input": None,
        "invocation_id": uuid.uuid4(),
        "lease_token": "tok",
        "cancel_requested": False,
    }


def through_models(run: dict[str, Any], steps: list[dict[str, Any]], attempt: int) -> Any:
    """The body as the protocol models would make it (the reference)."""
    records = []
    for s in steps:
        data: dict[str, Any] = {k: s[k] for k in ("name", "kind", "status", "position")}
        data |= {"attempt": s["attempt"], "output": s["output"], "error": s["error"]}
        if s["wake_at"] is not None:
            data["wakeAt"] = s["wake_at"].isoformat()
        if s["callback_id"] is not None:
            data["callbackId"] = str(s["callback_id"])
            data["callbackUrl"] = SIGNER.url(API, str(s["callback_id"]))
            data["timedOut"] = s["callback_status"] == "timedOut"
        if s["child_run_id"] is not None:
            data["childRunId"] = str(s["child_run_id"])
        if "blocked" in s:
            data["blocked"] = s["blocked"]
        records.append(StepRecord.model_validate(data))
    request = InvokeRequest(
        runId=str(run["id"]),
        workflow=run["workflow"],
        input=run["input"],
        invocationId=str(run["invocation_id"]),
        token=SIGNER.invocation_token(str(run["invocation_id"]), run["lease_token"]),
        apiUrl=API,
        attempt=attempt,
        cancelRequested=run["cancel_requested"],
        steps=records,
        protocolVersion=PROTOCOL_VERSION,
    )
    body = dump(request)
    for row, step in zip(steps, body["steps"], strict=True):
        if "blocked" not in row:
            del step["blocked"]  # rows that say nothing of a retry's delay send no "blocked"
    return body


STEPS = [
    step_row("a", "run", "completed", 1, output={"n": [1, 2.5, "é"], "none": None}),
    step_row("b", "run", "failed", 2, attempt=3,
             error={"type": "ValueError", "message": "bad", "code": "x", "extra": 1}),
    step_row("c", "run", "retrying", 3, error={"type": "E", "message": "m"},
             wake_at=datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)),
    step_row("d", "sleep", "sleeping", 4, wake_at=datetime(2026, 1, 2, tzinfo=UTC)),
    step_row("e", "callback", "waiting", 5, callback_id=uuid.uuid4(), callback_status="pending"),
    step_row("f", "callback", "failed", 6, callback_id=uuid.uuid4(), callback_status="timedOut",
             error={"type": "CallbackTimeout", "message": "late", "code": "callback_timeout"}),
    step_row("g", "invoke", "waiting", 7, child_run_id=uuid.uuid4()),
    step_row("h", "value", "completed", 8, output=0),
    step_row("i", "event", "completed", 9, output=False),
]  # fmt: skip


@pytest.mark.parametrize("run_input", [None, {"user": "u1"}, [1, 2], 0, ""])
@pytest.mark.parametrize("steps", [[], STEPS], ids=["no-steps", "every-kind"])
def test_body_matches_the_protocol_models(run_input: Any, steps: list[dict[str, Any]]) -> None:
    run = {
        "id": uuid.uuid4(),
        "workflow": "wf",
        "input": run_input,
        "invocation_id": uuid.uuid4(),
        "lease_token": "tok",
        "cancel_requested": bool(steps),
    }
    built = invoke_body(claim(run), steps, attempt=2, api_url=API, signer=SIGNER)
    assert built == through_models(run, steps, 2)
    assert list(built) == list(through_models(run, steps, 2))
    InvokeRequest.model_validate(built)  # and the SDK reads it back


def test_a_delta_comes_in_a_form_only_an_sdk_that_reads_deltas_takes() -> None:
    """With a base, the steps come as ``{"historyBase", "changes"}``: today's SDK reads them as
    the changes over that base; a ``steps`` that is not a list is what an SDK from before this
    form refuses (422) rather than take the changes for the whole history."""
    run = a_run()
    base = uuid.uuid4()
    built = invoke_body(
        claim(run), STEPS[:2], attempt=1, api_url=API, signer=SIGNER, history_base=base
    )
    assert set(built["steps"]) == {"historyBase", "changes"} and "historyBase" not in built
    read = InvokeRequest.model_validate(built)
    assert read.history_base == str(base)
    assert [s.name for s in read.steps] == ["a", "b"]
    whole = invoke_body(claim(run), STEPS[:2], attempt=1, api_url=API, signer=SIGNER)
    assert isinstance(whole["steps"], list) and "historyBase" not in whole


def test_state_steps_go_only_to_an_app_of_a_protocol_with_published_state() -> None:
    """A run's ``state`` steps are in the history sent to an app of protocol 4 (the version it
    declared at its sync, or a pull worker's), and left out for one of protocol 3 or none: its
    SDK would refuse the kind, and its code never sets state."""
    run = a_run()
    steps = [
        step_row("$state:phase", "state", "completed", 0, output="first"),
        step_row("a", "run", "completed", 1, output=1),
    ]

    def names(synced: int | None, **kw: Any) -> list[str]:
        built = invoke_body(
            claim(run | {"app_protocol": synced}), steps, attempt=1, api_url=API,
            signer=SIGNER, **kw,
        )  # fmt: skip
        return [s["name"] for s in built["steps"]]

    assert names(4) == ["$state:phase", "a"]
    assert names(3) == names(None) == ["a"]
    assert names(3, app_protocol=4) == ["$state:phase", "a"]  # a pull worker's own version
    assert names(4, app_protocol=3) == ["a"]
