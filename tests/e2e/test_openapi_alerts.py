"""The alert routes' real answers, and a real webhook notification, validate against
openapi.yaml's schemas."""

from __future__ import annotations

import uuid

import jsonschema

from tests.e2e.test_openapi_responses import REGISTRY, call
from tests.receiver import Receiver
from tests.support import orchestrator_stack


async def test_alert_answers_and_notifications_match_the_contract(database_url: str) -> None:
    """Create, list, read, change, test, deliveries and delete answer as documented (errors
    included), and the body a webhook receives is an AlertNotification."""
    async with Receiver().running() as rx, orchestrator_stack(database_url) as stack:
        made = await call(
            stack,
            "POST",
            "/v1/alerts",
            "/v1/alerts",
            json={
                "name": "ops",
                "on": ["run.failed"],
                "destination": {"type": "webhook", "url": rx.url},
            },
        )
        one = f"/v1/alerts/{made['id']}"
        await call(stack, "GET", "/v1/alerts", "/v1/alerts")
        await call(stack, "GET", one, "/v1/alerts/{alertId}")
        await call(stack, "PATCH", one, "/v1/alerts/{alertId}", json={"workflow": "wf"})
        await call(stack, "PATCH", one, "/v1/alerts/{alertId}", json={})  # 422
        await call(stack, "POST", one + "/test", "/v1/alerts/{alertId}/test")
        [got] = await rx.until(1)
        await call(stack, "GET", one + "/deliveries", "/v1/alerts/{alertId}/deliveries")
        await call(stack, "POST", "/v1/alerts", "/v1/alerts", content=b"{")  # 400
        await call(stack, "POST", "/v1/alerts", "/v1/alerts", json={"name": "x"})  # 422
        missing = f"/v1/alerts/{uuid.uuid4()}"
        await call(stack, "GET", missing, "/v1/alerts/{alertId}")  # 404
        await call(stack, "POST", missing + "/test", "/v1/alerts/{alertId}/test")  # 404
        await call(stack, "DELETE", one, "/v1/alerts/{alertId}")
        await call(stack, "DELETE", one, "/v1/alerts/{alertId}")  # 404
    schema = {"$ref": "spec#/components/schemas/AlertNotification"}
    validator = jsonschema.Draft202012Validator(schema, registry=REGISTRY)
    assert not list(validator.iter_errors(got.json))
    assert got.json["type"] == "alert.test"
