"""Which deployment of the app is answering: ``STEPLINE_DEPLOYMENT_ID`` or the platform's id."""

from __future__ import annotations

import os
from collections.abc import Mapping


def detect_deployment_id(environ: Mapping[str, str] | None = None) -> str | None:
    """Return a deployment id from the environment, or ``None`` when nothing identifies one.

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
