"""Complete a callback by request (the API's ``POST /v1/callbacks/...`` and the dashboard's
form) and take the run it wakes at once."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from stepline_server.application import at_once
from stepline_server.store import waits

if TYPE_CHECKING:
    from stepline_server.orchestrator import Orchestrator


async def complete_callback(
    o: Orchestrator, callback_id: uuid.UUID, project_id: uuid.UUID | None, body: Any
) -> waits.Completed:
    """Complete the callback with ``body`` (in environment ``project_id``; None for a signed
    URL, which names it alone); its run is leased to this orchestrator in the same
    transaction when its dispatcher has room. What it did: see
    :class:`stepline_server.store.waits.Completed`."""
    with at_once.taking(o) as now:
        async with o.pool.acquire() as conn:
            done = await waits.complete_callback(
                conn, callback_id, project_id, body, notify=now.notify, lease=now.lease
            )
        if done.completed or done.repeated:  # else nothing moved: no run is due
            now.take(done.taken)
    return done
