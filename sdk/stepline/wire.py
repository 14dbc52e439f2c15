"""What the orchestrator shares with the SDK: the wire's JSON rules, durations (read, and
written in words), request signing and the keep-alive HTTP client for progress calls and
invocations.

The server imports these names from here and never from the SDK's private modules, so the SDK may
rearrange its insides without breaking the orchestrator; ``__all__`` is the whole promise.
"""

from __future__ import annotations

from stepline._durations import in_words, parse_duration, to_ms
from stepline._http import HttpClient, HttpError
from stepline._json import MAX_DEPTH, loads, payload_problem, payload_problem_at
from stepline._signing import sign

__all__ = [
    "MAX_DEPTH",
    "HttpClient",
    "HttpError",
    "in_words",
    "loads",
    "parse_duration",
    "payload_problem",
    "payload_problem_at",
    "sign",
    "to_ms",
]
