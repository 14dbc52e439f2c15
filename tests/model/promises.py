"""What the model test holds a run's history to (``GET /v1/runs/{id}/events``), as plain
functions of the events and of what the model says: each answers the list of problems found.

- well formed: ``seq`` from 1 without gaps, ``run.started`` first; each invocation started
  once and ended at most once (exactly once, once the run has ended, for a run no fault
  touched), and its step events between the two; in each generation a step completed at most
  once, its attempts starting at 1 and moving on by one; nothing but ``run.retried`` after an
  ending;
- delivered exactly once: the callbacks completed and events received in the history are
  exactly those the model was acknowledged for this run, each once;
- not invoked while paused: no invocation started more than ``PAUSE_SLACK`` after its
  workflow's pause was acknowledged and before its resume was asked (one claimed as the pause
  commits may still start, and one whose start waited for PostgreSQL to restart);
- attempts as the rules say: step ``a`` completed at attempt ``fails + 1`` (for a run no fault
  touched), or failed at the last attempt when it always fails.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

PAUSE_SLACK = 0.5  # seconds
ENDINGS = {"run.completed", "run.failed", "run.cancelled", "run.timedOut"}


def generations(events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The history split at each ``run.continuedAsNew``."""
    parts: list[list[dict[str, Any]]] = [[]]
    for ev in events:
        if ev["type"] == "run.continuedAsNew":
            parts.append([])
        else:
            parts[-1].append(ev)
    return parts


def tries(part: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """Each event with the number of ``run.retried`` before it."""
    out, retried = [], 0
    for ev in part:
        retried += ev["type"] == "run.retried"
        out.append((retried, ev))
    return out


def well_formed(
    events: list[dict[str, Any]], *, ended: bool, touched: bool, begun_twice_ok: bool = False
) -> list[str]:
    """``begun_twice_ok``: an invocation may have two ``invocation.started`` (a known defect
    after a PostgreSQL restart, see test_model.DEFECTS)."""
    problems: list[str] = []
    seqs = [ev["seq"] for ev in events]
    if seqs != list(range(1, len(seqs) + 1)):
        problems.append(f"seq has gaps or repeats: {seqs}")
    if events and events[0]["type"] != "run.started":
        problems.append(f"the history starts with {events[0]['type']}")
    started: dict[str, int] = {}
    finished: dict[str, int] = {}
    for i, ev in enumerate(events):
        inv = str(ev.get("invocationId"))
        if ev["type"] == "invocation.started":
            if inv in started and not begun_twice_ok:
                problems.append(f"invocation {inv} started twice")
            started[inv] = i
        elif ev["type"] == "invocation.ended":
            if inv in finished:
                problems.append(f"invocation {inv} ended twice")
            if inv not in started:
                problems.append(f"invocation {inv} ended without starting")
            finished[inv] = i
        elif "invocationId" in ev and (inv not in started or inv in finished):
            problems.append(f"{ev['type']} of {ev.get('stepName')} outside invocation {inv}")
    if ended and not touched:
        problems += [f"invocation {inv} never ended" for inv in started if inv not in finished]
    for g, part in enumerate(generations(events), 1):
        # A retry runs the run again from its first unfinished step: a step recorded after that
        # one completes again.
        completed = Counter(
            (ev["stepName"], retries)
            for retries, ev in tries(part)
            if ev["type"] == "step.completed"
        )
        problems += [
            f"generation {g}: step {n} completed {k} times" for n, k in completed.items() if k > 1
        ]
        last: dict[str, int] = {}
        for ev in part:
            if ev["type"] == "run.retried":  # a retry tries its failed step from attempt 1
                last.clear()
            if ev["type"] != "step.started":
                continue
            attempt = int(ev.get("data", {}).get("attempt", 1))
            before = last.get(ev["stepName"], 0)
            if attempt not in (before, before + 1) or (before == 0 and attempt != 1):
                problems.append(
                    f"generation {g}: step {ev['stepName']} attempt {attempt} after {before}"
                )
            last[ev["stepName"]] = attempt
    endings = [i for i, ev in enumerate(events) if ev["type"] in ENDINGS]
    for i in endings:
        after = [ev["type"] for ev in events[i + 1 : i + 2]]
        if after and after != ["run.retried"]:
            problems.append(f"{events[i]['type']} followed by {after[0]}")
    return problems


def delivered(events: list[dict[str, Any]], callbacks: list[str], received: list[str]) -> list[str]:
    """The acknowledged callbacks and events (ids) each in the history once, and no other."""
    problems = []
    got_cb = Counter(
        ev["data"]["callbackId"] for ev in events if ev["type"] == "callback.completed"
    )
    got_ev = Counter(ev["data"]["eventId"] for ev in events if ev["type"] == "event.received")
    if got_cb != Counter(callbacks):
        problems.append(f"callbacks completed {dict(got_cb)}, acknowledged {callbacks}")
    if got_ev != Counter(received):
        problems.append(f"events received {dict(got_ev)}, acknowledged {received}")
    return problems


def attempts(events: list[dict[str, Any]], fails: int, last: int) -> list[str]:
    """Step ``a`` of every generation completed at attempt ``fails + 1``, or (always failing)
    failed at attempt ``last``; each failed try before it recorded."""
    problems = []
    for g, part in enumerate(generations(events), 1):
        done = [ev for ev in part if ev.get("stepName") == "a" and ev["type"] == "step.completed"]
        failed = [ev for ev in part if ev.get("stepName") == "a" and ev["type"] == "step.failed"]
        want = fails + 1
        if want > last:
            tries = [int(ev.get("data", {}).get("attempt", 0)) for ev in failed]
            if done or last not in tries:
                problems.append(f"generation {g}: step a should fail at attempt {last}: {tries}")
        elif done and int(done[0].get("data", {}).get("attempt", 0)) != want:
            problems.append(
                f"generation {g}: step a completed at {done[0].get('data')}, not {want}"
            )
    return problems


def not_while_paused(
    events: list[dict[str, Any]],
    pauses: list[tuple[float, float | None]],
    restarts: list[float],
) -> list[str]:
    """No invocation started in a pause (see PAUSE_SLACK), unless PostgreSQL restarted in it
    (a begin claimed before the pause waits for the database, then starts)."""
    problems = []
    for ev in events:
        if ev["type"] != "invocation.started":
            continue
        at = datetime.fromisoformat(ev["at"].replace("Z", "+00:00")).timestamp()
        for start, end in pauses:
            excused = any(start - PAUSE_SLACK <= t <= at for t in restarts)
            if start + PAUSE_SLACK < at and (end is None or at < end) and not excused:
                problems.append(f"invocation {ev.get('invocationId')} started while paused")
    return problems
