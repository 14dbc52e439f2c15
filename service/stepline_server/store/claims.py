"""Leasing due runs and beginning their invocations: the dispatcher's claims (due, capped and
rate-limited runs), the heartbeat that keeps the leases, and what a begun invocation sends."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from stepline.protocol import INLINE_RESULT_BYTES
from stepline_server.engine import rates
from stepline_server.store import citus_loop, db
from stepline_server.store.db import Conn, Q, Record, on_citus


async def claim(
    conn: Conn,
    owner: str,
    lease_seconds: float,
    limit: int,
    lead: float = 0.0,
    *,
    takeovers: bool = True,
    holding: Sequence[uuid.UUID] = (),
) -> list[Record]:
    """Lease up to ``limit`` runs due within ``lead`` seconds to ``owner`` for
    ``lease_seconds`` (:class:`Lease` says what ``takeovers`` and ``holding`` mean), higher
    priority first; see :func:`claim_leased`."""
    return await claim_leased(conn, Lease(owner, lease_seconds, holding, takeovers), limit, lead)


async def claim_leased(conn: Conn, lease: Lease, limit: int, lead: float = 0.0) -> list[Record]:
    """Lease up to ``limit`` runs due within ``lead`` seconds under ``lease``, higher priority
    first; each row's ``due_in`` says in how many seconds it is due. Runs of a workflow with a
    concurrency cap are claimed one workflow at a time under its lock (:func:`claim_capped`),
    and runs of a workflow with a rate limit that have not started yet one rate key value at a
    time under its lock (:func:`claim_rate_limited`). Every claim leases through the one lease
    transition (``lease_runs``): the runs ``lease.holding`` names are never taken again, and
    without ``lease.takeovers`` runs whose lease expired are left to their holders."""
    if on_citus(conn):
        claimed = await citus_loop.claim_due(
            conn, limit, lease.owner, lease.seconds, lead, lease.takeovers, list(lease.holding)
        )
    else:
        claimed = list(
            await conn.fetch(
                Q["claim_due"], limit, lease.owner, lease.seconds, lead, lease.takeovers,
                list(lease.holding),
            )
        )  # fmt: skip
    room = limit - len(claimed)
    if room > 0:
        groups = await conn.fetch(Q["due_gated_groups"])
        claimed += await claim_gated(conn, groups, lease, room)
    return claimed


async def claim_gated(
    conn: Conn,
    groups: list[Record],
    lease: Lease,
    limit: int,
    *,
    scope: PullScope | None = None,
) -> list[Record]:
    """Lease up to ``limit`` runs of the gated ``groups`` (rows of ``due_gated_groups``): a
    capped group under its cap's lock, a rate-limited one under its limit's; only runs in
    ``scope`` when given (a pull worker's poll)."""
    claimed: list[Record] = []
    for group in groups:
        room = limit - len(claimed)
        if room <= 0:
            break
        pid, workflow, key = group["project_id"], group["workflow"], group["key"]
        if group["kind"] == "capped":
            capped = Capped(pid, workflow, key, group["cap"])
            claimed += await claim_capped(conn, capped, lease, room, scope=scope)
        else:
            period = timedelta(milliseconds=group["period_ms"])
            limited = RateLimited(pid, workflow, key, rates.RateLimit(group["cap"], period))
            claimed += await claim_rate_limited(conn, limited, lease, room, scope=scope)
    return claimed


@dataclass(frozen=True)
class Lease:
    """What a claim leases under: its holder, how long a lease lasts, the runs the holder is
    invoking now (never leased again while it does) and whether lapsed leases may be taken
    over (not just after the database was away)."""

    owner: str
    seconds: float
    holding: Sequence[uuid.UUID] = ()
    takeovers: bool = True


@dataclass(frozen=True)
class PullScope:
    """The runs a pull worker's poll may lease: pull app ``app_id``'s runs on ``deployment``
    (None: the app's current one; a run on no deployment counts as on the current one). A gate
    still counts its workflow's runs whatever their deployment."""

    app_id: uuid.UUID
    deployment: uuid.UUID | None = None

    def args(self) -> tuple[uuid.UUID, uuid.UUID | None]:
        """The scope as the gates' queries take it."""
        return self.app_id, self.deployment


def _scope_args(scope: PullScope | None) -> tuple[uuid.UUID | None, uuid.UUID | None]:
    """``scope``'s query arguments; (None, None): any run (the dispatcher's claim)."""
    return scope.args() if scope else (None, None)


@dataclass(frozen=True)
class RateLimited:
    """The runs one rate limit counts: a workflow's, or those of one value of its rate limit
    key (None: the field is missing, or the limit has no key)."""

    project_id: uuid.UUID
    workflow: str
    key: str | None
    rate: rates.RateLimit


async def claim_rate_limited(
    conn: Conn, limited: RateLimited, lease: Lease, limit: int, *, scope: PullScope | None = None
) -> list[Record]:
    """Lease up to ``limit`` of a rate-limited workflow's due runs that have not started yet (of
    one key value), higher priority first, as far as its window has room; the others come due
    when the window lets them start (:func:`stepline_server.engine.rates.start_times`), so no
    dispatcher looks at them before. The window is read and the leases taken under the limit's
    lock, so two orchestrators never both see the same room. Only runs in ``scope`` are
    leased, when given; the window counts and defers the workflow's runs whatever their
    deployment."""
    group = (limited.project_id, limited.workflow, limited.key)
    async with conn.transaction():
        now = await conn.fetchval(Q["lock_rate"], *group)
        period_ms = limited.rate.period.total_seconds() * 1000
        window = await conn.fetchrow(Q["rate_window"], *group, period_ms, now)
        assert window is not None
        times = rates.start_times(limited.rate, window["starts"], now, window["waiting"])
        take = min(limit, rates.room(times, now))
        claimed = await _claim_rate_limited(conn, group, take, lease, scope) if take > 0 else []
        later = times[len(claimed) :]
        if any(t > now for t in later):
            await conn.execute(Q["defer_rate_limited"], *group, later)
        return claimed


async def _claim_rate_limited(
    conn: Conn,
    group: tuple[uuid.UUID, str, str | None],
    take: int,
    lease: Lease,
    scope: PullScope | None,
) -> list[Record]:
    """With the limit's lock held: lease up to ``take`` of ``group``'s due runs not yet
    started (``claim_rate_limited``; on Citus its candidates, each leased on its shard)."""
    if on_citus(conn):
        go = await conn.fetch(Q["citus_rate_limited_candidates"], *group, take, *_scope_args(scope))
        return await _citus_lease(conn, [r["id"] for r in go], lease)
    how = (lease.owner, lease.seconds, list(lease.holding), lease.takeovers, *_scope_args(scope))
    return list(await conn.fetch(Q["claim_rate_limited"], *group, take, *how))


async def _citus_lease(conn: Conn, run_ids: list[uuid.UUID], lease: Lease) -> list[Record]:
    """``run_ids`` leased under ``lease`` on Citus, each on its shard, in the order given."""
    return await citus_loop.lease_runs(
        conn, run_ids, lease.owner, lease.seconds, list(lease.holding), lease.takeovers
    )


@dataclass(frozen=True)
class Capped:
    """The runs one concurrency cap counts: a workflow's, or those of one value of its
    concurrency key (None: the field is missing, or the workflow has no key)."""

    project_id: uuid.UUID
    workflow: str
    key: str | None
    cap: int


async def claim_capped(
    conn: Conn, capped: Capped, lease: Lease, limit: int, *, scope: PullScope | None = None
) -> list[Record]:
    """Lease up to ``limit`` of a capped workflow's due or held runs (of one key value), oldest
    first, as far as its cap has room; hold its other due runs when the cap is full. The count
    and the leases are taken under the cap's lock, so two orchestrators never both see the same
    room. Only runs in ``scope`` are leased, when given; the cap counts and holds the
    workflow's runs whatever their deployment."""
    group = (capped.project_id, capped.workflow, capped.cap)
    holding = list(lease.holding)
    async with conn.transaction():
        await conn.execute(Q["lock_workflow"], capped.project_id, capped.workflow, capped.key)
        if on_citus(conn):
            go = await conn.fetch(
                Q["citus_capped_candidates"], *group, lease.seconds, limit, capped.key,
                lease.takeovers, holding, *_scope_args(scope),
            )  # fmt: skip
            return await _citus_lease(conn, [r["id"] for r in go], lease)
        return list(
            await conn.fetch(
                Q["claim_capped"], *group, lease.owner, lease.seconds, limit, capped.key,
                lease.takeovers, holding, *_scope_args(scope),
            )
        )  # fmt: skip


async def release_held(conn: Conn, capped: Capped | None = None) -> int:
    """Let held runs go as far as their caps have room (only ``capped``'s, when given), each
    cap under its lock; wake the dispatchers."""
    todo = (
        [capped]
        if capped
        else [
            Capped(r["project_id"], r["workflow"], r["concurrency_key"], r["cap"])
            for r in await conn.fetch(Q["held_workflows"])
        ]
    )
    released = 0
    release = db.query(conn, "release_held")
    for c in todo:
        async with conn.transaction():
            await conn.execute(Q["lock_workflow"], c.project_id, c.workflow, c.key)
            released += len(await conn.fetch(release, c.project_id, c.workflow, c.cap, c.key))
    if released:
        await conn.execute(Q["notify_wake"])
    return released


async def next_due_in(conn: Conn, *, takeovers: bool = True) -> float | None:
    """Seconds until the next run comes due (negative when overdue), None when none will;
    without ``takeovers``, expired leases are not counted as due."""
    value = await conn.fetchval(Q["next_due_in"], takeovers)
    return float(value) if value is not None else None


async def backlog(conn: Conn) -> tuple[int, float]:
    """Runs due now and not yet invoked, and how many seconds the oldest has been due."""
    row = await conn.fetchrow(Q["due_backlog"])
    assert row is not None
    return int(row["n"]), float(row["oldest_s"])


async def heartbeat(
    conn: Conn, leases: list[tuple[uuid.UUID, str]], lease_seconds: float
) -> dict[uuid.UUID, bool]:
    """Extend the leases of invocations still in flight; answers each run whose lease held,
    with whether its cancellation was requested."""
    if not leases:
        return {}
    if on_citus(conn):
        return await citus_loop.heartbeat(conn, leases, lease_seconds)
    held = [{"id": str(run_id), "token": token} for run_id, token in leases]
    rows = await conn.fetch(Q["heartbeat"], held, lease_seconds)
    return {row["id"]: row["cancel_requested"] for row in rows}


async def begin_invocations(
    conn: Conn, starts: list[Begin], lead: float = 0.0, inline_max: int = INLINE_RESULT_BYTES
) -> dict[uuid.UUID, Begun]:
    """Begin the invocations of runs just claimed, each only while its claim still holds the
    run: settle the timers and timeouts due within ``lead`` seconds (as of their due times) and
    record the invocation starting. Answers what to send each run begun (a run missing from the
    answer was not begun: its lease is gone): its steps, all of them or only what changed since
    the history its last invocation was sent (see :class:`Begun`). A result over ``inline_max``
    bytes is not read: its row has ``output`` None beside ``output_bytes``. (A claim's group
    begins here in a statement of its own; a run taken at once is leased and begun in one:
    :func:`stepline_server.store.leases.take_now`.)"""
    if not starts:
        return {}
    begun = [
        {
            "run_id": str(b.run_id),
            "token": b.token,
            "invocation_id": str(b.invocation_id),
            "attempt": b.attempt,
            "deltas": b.deltas,
        }
        for b in starts
    ]
    answer: dict[uuid.UUID, Begun] = {}
    if on_citus(conn):
        for run_id, rows in await citus_loop.begin_invocations(conn, begun, lead, inline_max):
            answer[run_id] = Begun.of(rows[0])
            answer[run_id].steps.extend(row for row in rows if row["name"] is not None)
        return answer
    for row in await conn.fetch(Q["begin_invocations"], begun, lead, inline_max):
        run = answer.get(row["run_id"])
        if run is None:
            run = answer[row["run_id"]] = Begun.of(row)
        if row["name"] is not None:
            run.steps.append(row)
    return answer


@dataclass
class Begun:
    """What an invocation begun sends the app. ``steps``: rows in recorded order, every step
    when ``history_base`` is None, else only those that changed since the history invocation
    ``history_base`` was sent (the app keeps that one and lays these over it). ``wait_s``: how
    many seconds the app must not be called yet (until the last timer settled is due). The
    whole history holds ``history_steps`` steps and ``history_bytes`` bytes of results."""

    steps: list[Record]
    wait_s: float
    history_base: uuid.UUID | None
    history_steps: int
    history_bytes: int

    @classmethod
    def of(cls, row: Record) -> Begun:
        """What a begin answered, from its first row (run_begin's shape), its steps to come."""
        return cls(
            steps=[],
            wait_s=row["wait_s"],
            history_base=row["history_base"],
            history_steps=row["history_steps"],
            history_bytes=row["history_bytes"],
        )


@dataclass(frozen=True)
class Begin:
    """An invocation to begin: the run, the lease token its claim holds, and its numbers."""

    run_id: uuid.UUID
    token: str
    invocation_id: uuid.UUID
    attempt: int
    deltas: bool = True  # False: whoever gets it may not read history deltas (whole history)
