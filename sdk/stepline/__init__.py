"""Stepline: durable workflows for Python web apps, pushed to your app by an orchestrator."""

from __future__ import annotations

from stepline import protocol
from stepline._client import ApiError, AsyncClient, Client
from stepline._context import Callback, Context
from stepline._definitions import Batch, Concurrency, Debounce, RateLimit, Retries
from stepline._durations import parse_duration
from stepline._errors import (
    CallbackTimeout,
    Cancelled,
    ChildWorkflowFailed,
    NondeterminismError,
    RetryableError,
    StateError,
    StepFailed,
    SteplineError,
    TerminalError,
)
from stepline._payloads import Encryption, S3Store
from stepline._version import __version__
from stepline._webhooks import verify_webhook
from stepline._worker import Worker
from stepline._workflow import Stepline

__all__ = [
    "ApiError",
    "AsyncClient",
    "Batch",
    "Callback",
    "CallbackTimeout",
    "Cancelled",
    "ChildWorkflowFailed",
    "Client",
    "Concurrency",
    "Context",
    "Debounce",
    "Encryption",
    "NondeterminismError",
    "RateLimit",
    "Retries",
    "RetryableError",
    "S3Store",
    "StateError",
    "StepFailed",
    "Stepline",
    "SteplineError",
    "TerminalError",
    "Worker",
    "__version__",
    "parse_duration",
    "protocol",
    "verify_webhook",
]
