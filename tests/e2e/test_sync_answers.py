"""A sync's error quotes what the app answered only when the answer speaks the protocol: a URL
pointing at another service (the orchestrator itself, here) learns nothing of its answers."""

from __future__ import annotations

import json
from collections import Counter

import httpx

import stepline
from tests.e2e.test_egress import _store, internal_service
from tests.e2e.test_openapi_responses import check
from tests.support import app_server, orchestrator_stack, serve


async def test_a_url_at_another_service_gets_its_status_and_a_fixed_sentence(
    database_url: str,
) -> None:
    """Apps registered at the orchestrator's own ``/v1/runs`` and ``/healthz``, and at a
    service answering the SDK's error shape without speaking the protocol: each sync is
    ``502`` with the status and a fixed sentence, quoting nothing of the answer."""
    calls: Counter[str] = Counter()
    sdk_like = json.dumps({"error": {"code": "leak", "message": "db password is hunter2"}})
    async with (
        orchestrator_stack(database_url) as stack,
        serve(internal_service(calls, status=403, body=sdk_like.encode())) as other,
    ):
        auth = {"authorization": f"Bearer {stack.api_key}"}
        async with httpx.AsyncClient(base_url=stack.url, headers=auth) as http:
            for name, url, status in [
                ("runs", f"{stack.url}/v1/runs", 401),
                ("health", f"{stack.url}/healthz", 405),
                ("other", f"{other}/", 403),
            ]:
                slug = await _store(stack, name, url)
                answer = await http.post(f"/v1/apps/{slug}/sync")
                assert answer.status_code == 502, answer.text
                check("POST", "/v1/apps/{app}/sync", answer)  # documented: app_unreachable
                message = answer.json()["error"]["message"]
                assert f"HTTP {status} with an answer that is not the Stepline SDK's" in message
                for quoted in ("API key", "not allowed", "hunter2", "leak", "unauthorized"):
                    assert quoted not in message, message


async def test_a_refused_signature_says_the_secrets_differ_and_how_to_fix_it(
    database_url: str,
) -> None:
    """An SDK app holding another signing secret: the sync says the app's
    STEPLINE_SIGNING_SECRET does not match and what to do about it."""
    sl = stepline.Stepline("the-apps-own-secret")
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        slug = await _store(stack, "drifted", url, "another-secret")
        async with httpx.AsyncClient(
            base_url=stack.url, headers={"authorization": f"Bearer {stack.api_key}"}
        ) as http:
            answer = await http.post(f"/v1/apps/{slug}/sync")
        assert answer.status_code == 502, answer.text
        message = answer.json()["error"]["message"]
        assert "STEPLINE_SIGNING_SECRET does not match" in message, message
        assert "rotate-secret" in message and "restart the app" in message, message
