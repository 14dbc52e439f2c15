"""The orchestrator's configuration, read once from the environment into a frozen object."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from stepline.wire import to_ms
from stepline_server import authlimits
from stepline_server.engine.egress import parse_networks


@dataclass(frozen=True)
class Settings:
    """Everything the orchestrator can be configured with (``STEPLINE_*`` and ``DATABASE_URL``)."""

    database_url: str | None = None
    # A replica for lists, searches, the dashboard's pages and metrics (None: the primary).
    database_read_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8400
    data_dir: Path = Path(".stepline")
    log_level: str = "info"
    public_url: str | None = None
    workers: int = 1  # orchestrator processes sharing the port (``stepline serve``)
    # The run loop.
    lease_seconds: float = 20.0
    invoke_timeout_seconds: float = 300.0
    describe_timeout_seconds: float = 10.0  # a sync asking an app what it hosts
    max_inflight: int = (
        64  # invocations calling apps at once (runs waiting for a sleep to end do not count)
    )
    poll_seconds: float = 2.0
    # Runs are claimed and begun this long before a sleep of theirs ends, and their app called
    # when it ends, so that the claim's and the begin's time does not make the sleep late.
    timer_lead_seconds: float = 0.05
    # Delivery failures (the app could not be invoked) are retried for this long.
    delivery_window_seconds: float = 24 * 3600.0
    delivery_backoff_max_seconds: float = 300.0  # the longest pause between two tries
    body_timeout_seconds: float = 30.0  # each part of a request body must arrive this soon
    retention_days: float = 30.0
    # The most steps and bytes of step results one generation of a run may hold; past either
    # the run fails with history_limit_exceeded (engine.history).
    history_max_steps: int = 10_000
    history_max_bytes: int = 64 * 1024 * 1024
    # Logs: "auto" (for people in a terminal, JSON lines otherwise), "console" or "json".
    log_format: str = "auto"
    # Schedules.
    scheduler_poll_seconds: float = 1.0
    misfire_grace_seconds: float = 60.0
    # The edge: failed authentications a client address may make in a minute before its
    # failures are answered 429, those all addresses may make before every failure is slowed
    # (held auth_failure_delay_seconds) and answered 429 (stepline_server.authlimits), the
    # proxies (CIDRs) whose X-Forwarded-For names the client, and the networks (CIDRs) app URLs
    # may point to (empty: every address but link-local ones).
    auth_failure_limit: int = 20
    auth_failure_budget: int = 200
    auth_failure_delay_seconds: float = 1.0
    trusted_proxies: tuple[str, ...] = ()
    app_networks: tuple[str, ...] = ()
    # Bulk operations: the most runs acted on per batch (and kept due or being invoked at
    # once), and the least rest between two batches.
    bulk_batch_size: int = 10
    bulk_rest_seconds: float = 0.1

    @property
    def base_url(self) -> str:
        """Where apps and callers reach this orchestrator (the base of callback URLs)."""
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    def with_(self, **changes: object) -> Settings:
        """A copy with some fields changed."""
        return replace(self, **changes)  # type: ignore[arg-type]


def from_env(env: Mapping[str, str] | None = None) -> Settings:
    """Read the settings from ``env`` (default: the process environment)."""
    e = os.environ if env is None else env
    s = Settings()
    return Settings(
        database_url=e.get("DATABASE_URL") or None,
        database_read_url=e.get("STEPLINE_DATABASE_READ_URL") or None,
        host=e.get("STEPLINE_HOST", s.host),
        port=int(e.get("STEPLINE_PORT", s.port)),
        data_dir=Path(e.get("STEPLINE_DATA_DIR", str(s.data_dir))),
        log_level=e.get("STEPLINE_LOG_LEVEL", s.log_level).lower(),
        public_url=e.get("STEPLINE_PUBLIC_URL") or None,
        log_format=e.get("STEPLINE_LOG_FORMAT", s.log_format).lower(),
        workers=max(1, int(e.get("STEPLINE_WORKERS", s.workers))),
        lease_seconds=float(e.get("STEPLINE_LEASE_SECONDS", s.lease_seconds)),
        invoke_timeout_seconds=float(e.get("STEPLINE_INVOKE_TIMEOUT", s.invoke_timeout_seconds)),
        describe_timeout_seconds=float(
            e.get("STEPLINE_DESCRIBE_TIMEOUT", s.describe_timeout_seconds)
        ),
        max_inflight=int(e.get("STEPLINE_MAX_INFLIGHT", s.max_inflight)),
        poll_seconds=float(e.get("STEPLINE_POLL_SECONDS", s.poll_seconds)),
        timer_lead_seconds=float(e.get("STEPLINE_TIMER_LEAD_SECONDS", s.timer_lead_seconds)),
        retention_days=float(e.get("STEPLINE_RETENTION_DAYS", s.retention_days)),
        history_max_steps=int(e.get("STEPLINE_HISTORY_MAX_STEPS", s.history_max_steps)),
        history_max_bytes=int(e.get("STEPLINE_HISTORY_MAX_BYTES", s.history_max_bytes)),
        delivery_window_seconds=_seconds(
            e.get("STEPLINE_DELIVERY_WINDOW"), s.delivery_window_seconds
        ),
        delivery_backoff_max_seconds=_seconds(
            e.get("STEPLINE_DELIVERY_BACKOFF_MAX"), s.delivery_backoff_max_seconds
        ),
        body_timeout_seconds=_seconds(e.get("STEPLINE_BODY_TIMEOUT"), s.body_timeout_seconds),
        scheduler_poll_seconds=float(
            e.get("STEPLINE_SCHEDULER_POLL_SECONDS", s.scheduler_poll_seconds)
        ),
        misfire_grace_seconds=float(
            e.get("STEPLINE_MISFIRE_GRACE_SECONDS", s.misfire_grace_seconds)
        ),
        auth_failure_limit=max(1, int(e.get("STEPLINE_AUTH_FAILURE_LIMIT", s.auth_failure_limit))),
        auth_failure_budget=max(
            1, int(e.get("STEPLINE_AUTH_FAILURE_BUDGET", s.auth_failure_budget))
        ),
        auth_failure_delay_seconds=_seconds(
            e.get("STEPLINE_AUTH_FAILURE_DELAY"), s.auth_failure_delay_seconds
        ),
        trusted_proxies=_proxies(e.get("STEPLINE_TRUSTED_PROXIES", "")),
        app_networks=_networks(e.get("STEPLINE_APP_NETWORKS", "")),
        bulk_batch_size=max(1, int(e.get("STEPLINE_BULK_BATCH_SIZE", s.bulk_batch_size))),
        bulk_rest_seconds=float(e.get("STEPLINE_BULK_REST_SECONDS", s.bulk_rest_seconds)),
    )


def _networks(raw: str) -> tuple[str, ...]:
    """``STEPLINE_APP_NETWORKS``: CIDRs separated by commas or spaces; ValueError for a bad one."""
    values = tuple(n for n in raw.replace(",", " ").split() if n)
    parse_networks(values)
    return values


def _proxies(raw: str) -> tuple[str, ...]:
    """``STEPLINE_TRUSTED_PROXIES``: CIDRs separated by commas or spaces; ValueError for a bad
    one."""
    values = tuple(n for n in raw.replace(",", " ").split() if n)
    authlimits.parse_proxies(values)
    return values


def _seconds(raw: str | None, default: float) -> float:
    """A duration setting (``"24h"``, ``"90s"``, ``"1h30m"`` or a number of seconds)."""
    if raw is None or not raw.strip():
        return default
    return to_ms(raw.strip()) / 1000


@dataclass(frozen=True)
class OperatorSettings:
    """Where the operator commands (``stepline runs …``) reach an orchestrator, and with what."""

    url: str = "http://127.0.0.1:8400"
    api_key: str | None = None


def operator_from_env(env: Mapping[str, str] | None = None) -> OperatorSettings:
    """``STEPLINE_URL`` and ``STEPLINE_API_KEY`` from ``env`` (default: the process's)."""
    e = os.environ if env is None else env
    return OperatorSettings(
        url=e.get("STEPLINE_URL") or OperatorSettings.url,
        api_key=e.get("STEPLINE_API_KEY") or None,
    )
