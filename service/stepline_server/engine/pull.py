"""Pull apps' rules: which app registrations are valid, and what a worker's poll may ask."""

from __future__ import annotations

from stepline.wire import parse_duration

MAX_POLL_WAIT = 60.0
DEFAULT_POLL_WAIT = 30.0
MAX_POLL_LIMIT = 100


class BadParam(ValueError):
    """A poll parameter that is not valid; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def poll_params(wait: str | None, limit: str | None) -> tuple[float, int]:
    """A poll's wait (seconds, at most a minute; 30 s when not given) and how many
    invocations it takes at most (1 to 100; 1 when not given)."""
    seconds = DEFAULT_POLL_WAIT
    if wait is not None:
        try:
            seconds = parse_duration(wait)  # never negative: a sign is refused as malformed
        except ValueError as exc:
            raise BadParam("wait", str(exc)) from None
    count = 1
    if limit is not None:
        if not limit.isdigit() or not 1 <= int(limit) <= MAX_POLL_LIMIT:
            raise BadParam("limit", f"limit must be a whole number from 1 to {MAX_POLL_LIMIT}")
        count = int(limit)
    return min(seconds, MAX_POLL_WAIT), count


def registration_problem(kind: str, url: str | None) -> tuple[str, str] | None:
    """Why an app of ``kind`` with ``url`` cannot be registered (the field and a sentence),
    or None: a push app needs the URL the orchestrator calls, a pull app has none."""
    if kind == "push" and url is None:
        return "url", "a push app needs the URL of its handler (or register it with kind 'pull')"
    if kind == "pull" and url is not None:
        return "url", "a pull app has no URL: its workers poll the orchestrator"
    return None


MAX_WORKER_NAME = 100


def worker_name(header: str | None, client: tuple[str, int] | None) -> str:
    """Who sent a pull app's answer, for the invocation's ``request``: the name its worker gave
    (printable, at most 100 characters), else the address it came from."""
    if header:
        name = "".join(ch for ch in header if ch.isprintable()).strip()[:MAX_WORKER_NAME]
        if name:
            return name
    if client is not None:
        return f"a worker at {client[0]}"
    return "a worker"
