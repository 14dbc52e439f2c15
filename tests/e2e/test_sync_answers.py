"""A sync's error quotes what the app answered only when the answer speaks the protocol: a URL
pointing at another service (the orchestrator itself, here) learns nothing of its answers."""

from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest

import stepline
from stepline._worker import Worker, WorkerError
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


def _order_app(answer: str) -> stepline.Stepline:
    sl = stepline.Stepline("secret-lam")

    @sl.workflow("lam-order")
    async def order(ctx: stepline.Context, input: object) -> str:
        return answer

    @sl.workflow(f"lam-{answer}")
    async def own(ctx: stepline.Context, input: object) -> str:
        return answer

    return sl


async def test_a_sync_takes_another_apps_workflow_only_when_asked(database_url: str) -> None:
    """Syncing an app that hosts a workflow another app registered is ``409`` naming that app,
    and changes nothing (its own new workflows included); with ``takeOver=true`` it moves the
    workflow and its answer lists what moved; a pull app's worker is refused the same way,
    unless it was started to take over."""
    cold, warm = _order_app("cold"), _order_app("warm")
    async with (
        orchestrator_stack(database_url) as stack,
        app_server(cold) as cold_url,
        app_server(warm) as warm_url,
    ):
        cold_slug = await stack.register(cold, cold_url, "lamcold")
        warm_slug = await _store(stack, "lamwarm", warm_url, "secret-lam")
        auth = {"authorization": f"Bearer {stack.api_key}"}
        async with httpx.AsyncClient(base_url=stack.url, headers=auth, timeout=30) as http:
            refused = await http.post(f"/v1/apps/{warm_slug}/sync")
            assert refused.status_code == 409, refused.text
            check("POST", "/v1/apps/{app}/sync", refused)
            error = refused.json()["error"]
            assert error["code"] == "invalid_state" and "lamcold" in error["message"]
            assert "takeOver" in error["message"]
            assert error["details"]["workflows"] == [
                {"name": "lam-order", "app": cold_slug, "appName": "lamcold"}
            ]
            hosts = {
                w["name"]: w["app"] for w in (await stack.client.list_workflows())["workflows"]
            }
            assert hosts == {"lam-order": cold_slug, "lam-cold": cold_slug}
            assert (await stack.client.get_app(warm_slug))["syncedAt"] is None
            run = await stack.client.start_run("lam-order")
            assert (await stack.client.wait_run(run["id"], timeout=20))["output"] == "cold"

            moved = await http.post(f"/v1/apps/{warm_slug}/sync", params={"takeOver": "true"})
            assert moved.status_code == 200, moved.text
            check("POST", "/v1/apps/{app}/sync", moved)
            assert moved.json()["movedWorkflows"] == [{"name": "lam-order", "fromApp": cold_slug}]
            hosts = {
                w["name"]: w["app"] for w in (await stack.client.list_workflows())["workflows"]
            }
            assert hosts == {"lam-order": warm_slug, "lam-cold": cold_slug, "lam-warm": warm_slug}
            run = await stack.client.start_run("lam-order")
            assert (await stack.client.wait_run(run["id"], timeout=20))["output"] == "warm"

            again = await http.post(f"/v1/apps/{warm_slug}/sync")
            assert again.status_code == 200 and again.json()["movedWorkflows"] == []
            back = await http.post(f"/v1/apps/{cold_slug}/sync")
            assert back.status_code == 409 and "lamwarm" in back.json()["error"]["message"]
            bad = await http.post(f"/v1/apps/{warm_slug}/sync", params={"takeOver": "yes"})
            assert bad.status_code == 422, bad.text

        pulled = await stack.register_pull("lampull")
        w = Worker(_order_app("pull"), stack.url, stack.api_key, pulled)
        try:
            with pytest.raises(WorkerError, match="lamwarm"):
                await w.sync()
        finally:
            await w.aclose()
        assert (await stack.client.get_app(pulled))["syncedAt"] is None
        w = Worker(_order_app("pull"), stack.url, stack.api_key, pulled, take_over=True)
        try:
            synced = await w.sync()
        finally:
            await w.aclose()
        assert synced["movedWorkflows"] == [{"name": "lam-order", "fromApp": warm_slug}]
