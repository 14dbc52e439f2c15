"""The progress call's refusals, answered ahead of Starlette's routing: openapi.yaml's error shape
for each, and nothing written."""

from __future__ import annotations

import uuid

import httpx

from tests.support import orchestrator_stack


async def test_bad_progress_calls_get_clear_json_errors(database_url: str) -> None:
    """Each bad progress call gets its own code in the error shape; a token the orchestrator
    made answers stale, a wrong one 401 before the body is read, and so does any token on a
    path whose invocation id is not a UUID (no token is made for it; the contract has no 404)."""
    async with orchestrator_stack(database_url) as stack:
        invocation = str(uuid.uuid4())
        path = f"/v1/invocations/{invocation}/progress"
        token = stack.orchestrator.signer.invocation_token(invocation, str(uuid.uuid4()))
        auth = {"authorization": f"Bearer {token}"}
        wrong = {"authorization": "Bearer some-token"}
        good = {"runId": str(uuid.uuid4()), "updates": []}
        async with httpx.AsyncClient(base_url=stack.url) as http:
            cases = [
                (await http.post("/v1/invocations/nope/progress", json=good, headers=auth), 401,
                 "unauthorized"),
                (await http.post(path, json=good), 401, "unauthorized"),
                (await http.post(path, content=b"{not json", headers=auth), 400, "invalid_json"),
                (await http.post(path, content=b"", headers=auth), 400, "invalid_json"),
                (await http.post(path, json=[1, 2], headers=auth), 422, "validation_failed"),
                (await http.post(path, json={"runId": "r", "updates": [{"name": "x"}]},
                                 headers=auth), 422, "validation_failed"),
                (await http.post(path, json={**good, "runId": "not-a-uuid"}, headers=auth), 422,
                 "validation_failed"),
                (await http.post(path, json=good, headers=auth), 409, "stale_invocation"),
                (await http.post(path, content=b" " * (16 * 1024 * 1024 + 1), headers=auth), 413,
                 "payload_too_large"),
                (await http.get(path, headers=auth), 405, "method_not_allowed"),
                (await http.post(path, json=good, headers=wrong), 401, "unauthorized"),
                (await http.post(path, content=b" " * (15 * 1024 * 1024), headers=wrong), 401,
                 "unauthorized"),
                (await http.post(f"/v1/invocations/{uuid.uuid4()}/progress", json=good,
                                 headers=auth), 401, "unauthorized"),
            ]  # fmt: skip
            for answer, status, code in cases:
                assert answer.status_code == status, answer.text
                assert answer.headers["content-type"] == "application/json"
                assert answer.json()["error"]["code"] == code
                assert answer.json()["error"]["message"]
            fields = cases[5][0].json()["error"]["details"]["fields"]
            assert any("kind" in f for f in fields)
        # The orchestrator is still healthy, and nothing was written.
        page = await stack.client.list_runs()
        assert page["runs"] == []
