"""Deployment ids: STEPLINE_DEPLOYMENT_ID first, then the hosting platform's own id."""

from __future__ import annotations

import pytest

from stepline import Stepline
from stepline._deployment import detect_deployment_id


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"STEPLINE_DEPLOYMENT_ID": "v42", "VERCEL_DEPLOYMENT_ID": "dpl_1"}, "v42"),
        ({"VERCEL_DEPLOYMENT_ID": "dpl_1"}, "dpl_1"),
        ({"AWS_LAMBDA_FUNCTION_NAME": "fn", "AWS_LAMBDA_FUNCTION_VERSION": "7"}, "fn:7"),
        ({"AWS_LAMBDA_FUNCTION_NAME": "fn"}, None),
        ({"K_REVISION": "svc-00012-abc"}, "svc-00012-abc"),
        ({"FLY_MACHINE_VERSION": "01H"}, "01H"),
        ({"FLY_IMAGE_REF": "registry.fly.io/app:deploy-1"}, "registry.fly.io/app:deploy-1"),
        ({"RENDER_GIT_COMMIT": "abc123", "RENDER_SERVICE_ID": "srv-1"}, "abc123"),
        ({"RENDER_SERVICE_ID": "srv-1"}, "srv-1"),
        ({"STEPLINE_DEPLOYMENT_ID": "  "}, None),
    ],
)
def test_detect_deployment_id(env: dict[str, str], expected: str | None) -> None:
    """Each platform's variable is recognised, in the documented order."""
    assert detect_deployment_id(env) == expected


def test_stepline_reports_its_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment's deployment id ends up in describe(); an explicit one wins."""
    monkeypatch.setenv("K_REVISION", "rev-9")
    assert Stepline("s").describe().deployment_id == "rev-9"
    assert Stepline("s", deployment_id="mine").describe().deployment_id == "mine"
