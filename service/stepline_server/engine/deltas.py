"""Who may be sent a history delta: what an answer or a poll says of the SDK behind it.

An app's replicas need not run the same SDK (a rolling deploy, a rollback), and which one
answers an invocation is the load balancer's choice. So a delta goes to a run only after an
answer that declared a protocol version that reads deltas (the SQL that begins invocations
checks it, per run), and in a form an older SDK refuses before running anything; a refused
delta is sent again at once as the whole history.
"""

from __future__ import annotations

from stepline.protocol import DELTAS_PROTOCOL_VERSION

REFUSED_DELTA = (
    "the app refused the history delta it was sent (HTTP 422: an SDK of a protocol before "
    f"{DELTAS_PROTOCOL_VERSION} answered); invoked again at once with the whole history"
)
"""The reason an invocation whose delta was refused gives in the run's history."""


def reads_deltas(version: int | None) -> bool:
    """Whether an SDK that declared protocol ``version`` (None: it declared none) reads history
    deltas in the form the orchestrator sends them."""
    return version is not None and version >= DELTAS_PROTOCOL_VERSION


def declared(header: str | None) -> int | None:
    """The protocol version a ``Stepline-Protocol`` header declares; None when there is none,
    or it is not a version."""
    if header is None or not header.strip().isdigit() or len(header.strip()) > 6:
        return None
    return int(header.strip())


def refused(sent_delta: bool, http_status: int | None) -> bool:
    """Whether an invocation's answer says the app could not read the delta it carried: an SDK
    from before deltas came in their form refuses the request as invalid (422) and runs
    nothing, so it is sent again at once with the whole history."""
    return sent_delta and http_status == 422
