"""A run taken at once: the orchestrator that starts a run, or wakes one by completing its
callback, leases it in the same transaction and calls its app without a claim, when its
dispatcher has room (the other orchestrators hear of the run only when it has none).

Every use case that makes a run due by a request goes through :func:`taking`, so the
sequence (tell the others or not, reserve a slot, lease in the transaction, adopt after the
commit) is written once."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

from stepline_server.store import leases
from stepline_server.store.db import Conn

if TYPE_CHECKING:
    from stepline_server.loops.dispatcher import Slot
    from stepline_server.orchestrator import Orchestrator


class AtOnce:
    """One run to take at once: ``notify`` (whether its commit should wake the other
    orchestrators) and ``lease`` (the lease to take it under; None when this dispatcher has no
    room or is not running) go to the write that makes the run due; what it took goes to
    :meth:`take`, after the commit."""

    def __init__(self, notify: bool, slot: Slot) -> None:
        self.notify = notify
        self._slot = slot

    @property
    def lease(self) -> leases.Lease | None:
        return self._slot.lease

    async def take_now(self, conn: Conn, run_id: uuid.UUID) -> leases.Taken | None:
        """Lease run ``run_id`` in the caller's transaction
        (:func:`stepline_server.store.leases.take_now`); None without room."""
        lease = self._slot.lease
        return await leases.take_now(conn, run_id, lease) if lease is not None else None

    def take(self, taken: leases.Taken | None) -> None:
        """After the commit: invoke the run taken, else have the dispatcher claim what is
        due."""
        self._slot.take(taken)


@contextlib.contextmanager
def taking(o: Orchestrator) -> Iterator[AtOnce]:
    """Room in ``o``'s dispatcher for one run, given back on leaving when not taken."""
    notify = o.dispatcher.tell_others()
    with o.dispatcher.slot() as slot:
        yield AtOnce(notify, slot)
