"""LISTEN for wake-ups on a connection of its own, reconnecting when it drops."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

from stepline_server.store import db

log = structlog.get_logger("stepline.listener")

CHANNEL = "stepline_wake"
ENDED_CHANNEL = "stepline_ended"
SCHEDULE_CHANNEL = "stepline_schedule"  # a buffered schedule tick may start now
STATE_CHANNEL = "stepline_state"  # a run published state (payload: its id)


def _wake_callback(wake: Callable[[], None]) -> Callable[..., None]:
    def _wake(*_: Any) -> None:
        wake()

    return _wake


def _ended_callback(on_ended: Callable[[str], None]) -> Callable[..., None]:
    def _ended(_conn: Any, _pid: Any, _channel: Any, payload: Any) -> None:
        on_ended(str(payload))

    return _ended


async def listen(
    dsn: str,
    on_notify: Callable[[], None],
    on_ended: Callable[[str], None] | None = None,
    *,
    on_connected: Callable[[], None] | None = None,
    on_schedule: Callable[[], None] | None = None,
    on_state: Callable[[str], None] | None = None,
    retry_seconds: float = 1.0,
) -> None:
    """Call ``on_notify`` for every NOTIFY on the wake channel, ``on_ended`` with the id of
    every run that ended, ``on_schedule`` when a schedule came due early (its buffered tick
    may start), ``on_state`` with the id of every run that published state, ``on_connected``
    each time it starts listening (what it missed while away is unknown); loops still poll
    without them."""
    lost = False  # warned of this outage already: one warning, not one a try
    while True:
        conn = None
        try:
            conn = await db.connect(dsn)
            await conn.add_listener(CHANNEL, _wake_callback(on_notify))
            if on_ended is not None:
                await conn.add_listener(ENDED_CHANNEL, _ended_callback(on_ended))
            if on_schedule is not None:
                await conn.add_listener(SCHEDULE_CHANNEL, _wake_callback(on_schedule))
            if on_state is not None:
                await conn.add_listener(STATE_CHANNEL, _ended_callback(on_state))
            log.info("listener_connected")
            lost = False
            on_notify()  # anything that came due while we were away
            if on_connected is not None:
                on_connected()
            while not conn.is_closed():
                await asyncio.sleep(retry_seconds * 5)
                await conn.execute("SELECT 1")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not lost:
                log.warning("listener_lost", error=str(exc))
            lost = True
        finally:
            if conn is not None and not conn.is_closed():
                await conn.close()
        await asyncio.sleep(retry_seconds)
