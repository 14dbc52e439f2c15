"""The public surface: stepline.__all__ is complete and sorted."""

from __future__ import annotations

import inspect

import stepline

EXPECTED = {
    "ApiError", "AsyncClient", "Batch", "Callback", "CallbackTimeout", "Cancelled",
    "ChildWorkflowFailed", "Client", "Concurrency", "Context", "Debounce", "Encryption",
    "NondeterminismError", "RateLimit", "S3Store", "StateError",
    "Retries", "RetryableError", "StepFailed", "Stepline", "SteplineError", "TerminalError",
    "Worker",
    "__version__", "parse_duration", "protocol", "verify_webhook",
}  # fmt: skip


def test_all_is_sorted() -> None:
    """__all__ is kept in sorted order."""
    assert stepline.__all__ == sorted(stepline.__all__)


def test_all_is_complete_and_importable() -> None:
    """Every public name of the package is in __all__, and every name in __all__ exists."""
    public = {
        name
        for name, value in vars(stepline).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    }
    assert public | {"__version__", "protocol"} == set(stepline.__all__)
    assert set(stepline.__all__) == EXPECTED
    for name in stepline.__all__:
        assert getattr(stepline, name) is not None


def test_version() -> None:
    """The package version is 0.1.0."""
    assert stepline.__version__ == "0.1.0"
