"""The chaos test's sizes: presets, overridden by ``CHAOS_*`` environment variables or flags.

Each flag has a variable (``--runs`` and ``CHAOS_RUNS``, ``--step-ms`` and ``CHAOS_STEP_MS``,
...); a flag wins over its variable, which wins over the preset (``--size``: ``small``, run by
``make test``, or ``default``). ``--stress`` is the lease-stress mode: 1 s leases and steps of
300 to 1500 ms. ``--citus`` runs it on a private Citus cluster (``tests/chaos/citus.py``).
``tests/chaos/README.md`` lists them all.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

__all__ = ["Config", "parse"]


@dataclass(frozen=True)
class Config:
    """One chaos run's sizes."""

    runs: int
    lease_seconds: float
    step_ms: tuple[int, int]
    sleep_ms: tuple[int, int]
    start_seconds: float
    settle_seconds: float
    fail_rate: float = 0.2
    down_seconds: float = 2.0
    app_down_seconds: float = 8.0
    event_lost_seconds: float = 30.0
    seed: int = 1
    stress: bool = False
    keep: bool = False
    size: str = "default"
    citus: bool = False  # on a private Citus cluster (a coordinator and two workers)


PRESETS = {
    "small": Config(
        runs=24, lease_seconds=3, step_ms=(20, 120), sleep_ms=(1000, 2000),
        start_seconds=12, settle_seconds=30, event_lost_seconds=15, app_down_seconds=4,
        size="small",
    ),
    "default": Config(
        runs=300, lease_seconds=5, step_ms=(30, 300), sleep_ms=(1000, 2000),
        start_seconds=75, settle_seconds=120, size="default",
    ),
}  # fmt: skip


def _range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def parse(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """The configuration from ``argv`` flags over ``CHAOS_*`` variables over the preset."""
    env = os.environ if environ is None else environ
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n")[0])
    p.add_argument("--size", choices=sorted(PRESETS), default=env.get("CHAOS_SIZE", "default"))
    p.add_argument("--stress", action="store_true", default=env.get("CHAOS_STRESS") == "1")
    p.add_argument("--runs", type=int, default=env.get("CHAOS_RUNS"))
    p.add_argument("--lease", type=float, default=env.get("CHAOS_LEASE_SECONDS"))
    p.add_argument("--step-ms", type=_range, default=env.get("CHAOS_STEP_MS"))
    p.add_argument("--sleep-ms", type=_range, default=env.get("CHAOS_SLEEP_MS"))
    p.add_argument("--start-seconds", type=float, default=env.get("CHAOS_START_SECONDS"))
    p.add_argument("--settle-seconds", type=float, default=env.get("CHAOS_SETTLE_SECONDS"))
    p.add_argument("--fail-rate", type=float, default=env.get("CHAOS_FAIL_RATE"))
    p.add_argument("--event-lost-seconds", type=float, default=env.get("CHAOS_EVENT_LOST_SECONDS"))
    p.add_argument("--down-seconds", type=float, default=env.get("CHAOS_DOWN_SECONDS"))
    p.add_argument("--app-down-seconds", type=float, default=env.get("CHAOS_APP_DOWN_SECONDS"))
    p.add_argument("--seed", type=int, default=env.get("CHAOS_SEED"))
    p.add_argument("--keep", action="store_true", default=env.get("CHAOS_KEEP") == "1")
    p.add_argument("--citus", action="store_true", default=env.get("CHAOS_CITUS") == "1")
    a = p.parse_args(argv)
    config = PRESETS[a.size]
    if a.stress:
        config = replace(config, stress=True, lease_seconds=1.0, step_ms=(300, 1500))
    return replace(
        config,
        keep=bool(a.keep),
        citus=bool(a.citus),
        runs=config.runs if a.runs is None else int(a.runs),
        lease_seconds=config.lease_seconds if a.lease is None else float(a.lease),
        step_ms=config.step_ms if a.step_ms is None else a.step_ms,
        sleep_ms=config.sleep_ms if a.sleep_ms is None else a.sleep_ms,
        start_seconds=config.start_seconds if a.start_seconds is None else a.start_seconds,
        settle_seconds=config.settle_seconds if a.settle_seconds is None else a.settle_seconds,
        fail_rate=config.fail_rate if a.fail_rate is None else a.fail_rate,
        event_lost_seconds=config.event_lost_seconds
        if a.event_lost_seconds is None
        else a.event_lost_seconds,
        seed=config.seed if a.seed is None else a.seed,
        down_seconds=config.down_seconds if a.down_seconds is None else a.down_seconds,
        app_down_seconds=config.app_down_seconds
        if a.app_down_seconds is None
        else a.app_down_seconds,
    )
