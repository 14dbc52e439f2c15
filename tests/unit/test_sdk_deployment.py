"""Deployment ids: STEPLINE_DEPLOYMENT_ID first, then the hosting platform's own id, else one
derived from the workflows' code."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import stepline
from stepline import Stepline, protocol
from stepline._deployment import detect_deployment_id

PLATFORM_VARIABLES = (
    "STEPLINE_DEPLOYMENT_ID",
    "VERCEL_DEPLOYMENT_ID",
    "AWS_LAMBDA_FUNCTION_NAME",
    "AWS_LAMBDA_FUNCTION_VERSION",
    "K_REVISION",
    "FLY_MACHINE_VERSION",
    "FLY_IMAGE_REF",
    "RENDER_GIT_COMMIT",
    "RENDER_SERVICE_ID",
)

APP = """
import stepline

sl = stepline.Stepline("s")

@sl.workflow("onboard", retries=3)
async def onboard(ctx: stepline.Context, input: dict) -> dict:
    return {"greeting": GREETING}

@sl.workflow("bill")
async def bill(ctx: stepline.Context, input: dict) -> None:
    await ctx.step("charge", print, "charged")
"""


@pytest.fixture
def no_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PLATFORM_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def load_app(tmp_path: Path, name: str, greeting: str) -> Stepline:
    """Import an app module from a file, as a deployment would."""
    path = tmp_path / f"{name}.py"
    path.write_text(APP.replace("GREETING", repr(greeting)))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sl = module.sl
    assert isinstance(sl, Stepline)
    return sl


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


def test_the_same_code_gives_the_same_id(tmp_path: Path, no_platform: None) -> None:
    """Two imports of identical workflow code get one id, code- and 12 hex digits."""
    first = load_app(tmp_path, "app_one", "hello").deployment_id
    assert re.fullmatch(r"code-[0-9a-f]{12}", first)
    assert load_app(tmp_path, "app_two", "hello").deployment_id == first


def test_changed_code_gives_another_id(tmp_path: Path, no_platform: None) -> None:
    """A workflow whose source changed gives the app another id."""
    before = load_app(tmp_path, "app_before", "hello").deployment_id
    after = load_app(tmp_path, "app_after", "hello, world").deployment_id
    assert after.startswith("code-") and after != before


def test_functions_without_source_are_hashed_by_their_code(no_platform: None) -> None:
    """Workflows made with exec (no source file) still get a stable id that follows the code."""

    def made(constant: int) -> Any:
        scope: dict[str, Any] = {}
        code = f"async def wf(ctx, input):\n    return {constant}\n"
        exec(compile(code, "<generated>", "exec"), scope)
        sl = Stepline("s")
        sl.workflow("wf")(scope["wf"])
        return sl.deployment_id

    assert made(1) == made(1)
    assert made(1) != made(2)
    assert made(1).startswith("code-")


async def test_the_id_follows_workflows_registered_later(no_platform: None) -> None:
    """The id is derived when needed and again after another workflow is registered; it is
    what an invocation's answer carries."""
    sl = Stepline("s")

    @sl.workflow("first")
    async def first(ctx: stepline.Context, input: Any) -> int:
        return 1

    one = sl.deployment_id
    assert sl.deployment_id == one  # kept, not derived on every use

    @sl.workflow("second")
    async def second(ctx: stepline.Context, input: Any) -> int:
        return 2

    two = sl.describe().deployment_id
    assert two is not None and two.startswith("code-") and two != one
    request = protocol.InvokeRequest(
        runId="r", workflow="second", invocationId="i", token="t", apiUrl="http://o"
    )
    answer = await sl.invoke(request)
    assert answer.status == "completed" and answer.deployment_id == two


def test_the_environment_wins_over_the_code(
    tmp_path: Path, no_platform: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """STEPLINE_DEPLOYMENT_ID, when set, is the id whatever the code; a platform id too."""
    monkeypatch.setenv("RENDER_GIT_COMMIT", "abc123")
    assert load_app(tmp_path, "app_render", "hello").deployment_id == "abc123"
    monkeypatch.setenv("STEPLINE_DEPLOYMENT_ID", "v7")
    assert load_app(tmp_path, "app_env", "hello").deployment_id == "v7"
