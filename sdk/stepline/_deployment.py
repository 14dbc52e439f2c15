"""Which deployment of the app is answering: ``STEPLINE_DEPLOYMENT_ID``, the platform's id, or
an id derived from the code of the workflows the app hosts."""

from __future__ import annotations

import hashlib
import inspect
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

CODE_PREFIX = "code-"


def detect_deployment_id(environ: Mapping[str, str] | None = None) -> str | None:
    """Return a deployment id from the environment, or ``None`` when nothing there names one.

    In order: ``STEPLINE_DEPLOYMENT_ID``; Vercel ``VERCEL_DEPLOYMENT_ID``; AWS Lambda
    ``AWS_LAMBDA_FUNCTION_NAME:AWS_LAMBDA_FUNCTION_VERSION``; Cloud Run ``K_REVISION``;
    Fly.io ``FLY_MACHINE_VERSION`` or ``FLY_IMAGE_REF``; Render ``RENDER_GIT_COMMIT`` or
    ``RENDER_SERVICE_ID``.
    """
    env = os.environ if environ is None else environ

    def get(name: str) -> str | None:
        value = env.get(name, "").strip()
        return value or None

    if explicit := get("STEPLINE_DEPLOYMENT_ID"):
        return explicit
    if vercel := get("VERCEL_DEPLOYMENT_ID"):
        return vercel
    function, version = get("AWS_LAMBDA_FUNCTION_NAME"), get("AWS_LAMBDA_FUNCTION_VERSION")
    if function and version:
        return f"{function}:{version}"
    for name in (
        "K_REVISION",
        "FLY_MACHINE_VERSION",
        "FLY_IMAGE_REF",
        "RENDER_GIT_COMMIT",
        "RENDER_SERVICE_ID",
    ):
        if value := get(name):
            return value
    return None


def code_deployment_id(workflows: Iterable[tuple[str, Callable[..., Any]]]) -> str:
    """``code-`` and 12 hex digits of a SHA-256 of the workflows' source, by workflow name:
    the same code gives the same id, changed code another."""
    digest = hashlib.sha256()
    for name, fn in sorted(workflows, key=lambda item: item[0]):
        digest.update(name.encode() + b"\0" + _code_of(fn) + b"\0")
    return CODE_PREFIX + digest.hexdigest()[:12]


def _code_of(fn: Callable[..., Any]) -> bytes:
    try:
        return inspect.getsource(fn).encode()
    except (OSError, TypeError):
        # No source file (made with exec, or a frozen app): the compiled code stands in.
        code = getattr(fn, "__code__", None)
        body = code.co_code + repr(code.co_consts).encode() if code is not None else b""
        return getattr(fn, "__qualname__", repr(fn)).encode() + b"\0" + body
