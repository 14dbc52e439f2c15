"""The invariants a chaos run must keep, checked from the API, the app's records and the log.

What each row checks (see also README.md):

- every start was acknowledged (no start gave up after its retry budget), every acknowledged
  run is found, no run key has two runs, and every acknowledged run completed with the output
  its input and the bodies the driver sent determine;
- no step recorded twice: one ``step.completed`` per step in the history, step names unique in
  ``GET /v1/runs/{id}``; no recorded step ran again: no execution in the app's records began
  after the history's ``step.completed`` of that step;
- no acknowledged callback body or event lost: each acknowledged body is the output of its wait
  step (and in the run's output), and no acknowledged event left its wait waiting for
  ``event_lost_seconds``;
- no two invocations of a run at once: from the app's records, two step executions of one run
  by different invocations that overlap in time, and two invocations of one run in flight at
  the app together (the second one begun by an orchestrator although another held the run).
  Such an overlap is *excused* (counted, not a failure) when the orchestrator of the earlier
  invocation was killed between the two beginnings, or the app was killed: a lease must
  expire for the run to move on without a dead holder, and its in-flight step cannot be
  recalled;
- no invocation the orchestrators did not record: every invocation the app began has an
  ``invocation.started`` with its id in the run's history;
- no deadlock: ``deadlock detected`` lines in the PostgreSQL log.

Rows marked ``info`` count what helps the diagnosis and never fail.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tests.chaos import app as chaos_app

if TYPE_CHECKING:
    from tests.chaos.driver import Ledger
    from tests.chaos.scenario import Fault

__all__ = ["Observed", "Report", "Row", "check"]


@dataclass
class Observed:
    """What was read back after the load: runs, histories, listed runs, the app's records."""

    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    histories: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    listed: list[dict[str, Any]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Row:
    name: str
    expected: str
    observed: str
    ok: bool | None  # None: information only

    @property
    def verdict(self) -> str:
        return "info" if self.ok is None else ("PASS" if self.ok else "FAIL")


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    samples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(row.ok is not False for row in self.rows)

    def failed(self) -> list[str]:
        return [row.name for row in self.rows if row.ok is False]

    def add(self, name: str, expected: str, observed: Any, ok: bool | None) -> None:
        self.rows.append(Row(name, expected, str(observed), ok))

    def sample(self, name: str, text: str) -> None:
        found = self.samples.setdefault(name, [])
        if len(found) < 5:
            found.append(text)

    def table(self) -> str:
        width = max(len(r.name) for r in self.rows)
        exp = max(len(r.expected) for r in self.rows)
        obs = max(len(r.observed) for r in self.rows)
        lines = [f"{'invariant':<{width}}  {'expected':>{exp}}  {'observed':>{obs}}  verdict"]
        lines.append("-" * len(lines[0]))
        for r in self.rows:
            lines.append(
                f"{r.name:<{width}}  {r.expected:>{exp}}  {r.observed:>{obs}}  {r.verdict}"
            )
        for name, texts in self.samples.items():
            lines.append(f"{name}:")
            lines.extend(f"    {t}" for t in texts)
        lines.append(
            "RESULT: " + ("PASS" if self.ok else "FAIL (" + ", ".join(self.failed()) + ")")
        )
        return "\n".join(lines)


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class Interval:
    run: str
    inv: str
    orch: str
    begin: float
    end: float
    what: str
    closed: bool


def _intervals(
    records: list[dict[str, Any]], kind: str, app_kills: list[float], now: float
) -> list[Interval]:
    """Pair each begin/start record with its end; an unended one ends at the next app kill."""
    opening = "begin" if kind == "invoke" else "start"
    open_: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    found: list[Interval] = []

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r.get("run"), r.get("inv"), r.get("step"), r.get("pid"))

    def interval(r: dict[str, Any], end: float, closed: bool) -> Interval:
        what = str(r.get("step") or "invocation")
        return Interval(
            str(r["run"]), str(r.get("inv")), str(r.get("orch")), r["at"], end, what, closed
        )

    for r in sorted((r for r in records if r.get("kind") == kind), key=lambda r: r["at"]):
        if r["phase"] == opening:
            open_[key(r)].append(r)
        elif r["phase"] == "end" and open_[key(r)]:
            found.append(interval(open_[key(r)].pop(0), r["at"], True))
    for pending in open_.values():
        for r in pending:
            end = next((k for k in app_kills if k >= r["at"]), now)
            found.append(interval(r, end, False))
    return found


def _overlaps(
    intervals: list[Interval], faults: list[Fault], names: dict[str, str]
) -> tuple[list[tuple[Interval, Interval]], list[tuple[Interval, Interval]]]:
    """Pairs of one run's intervals of different invocations that overlap: (unexcused, excused)."""
    by_run: dict[str, list[Interval]] = defaultdict(list)
    for iv in intervals:
        by_run[iv.run].append(iv)
    bad: list[tuple[Interval, Interval]] = []
    excused: list[tuple[Interval, Interval]] = []
    for ivs in by_run.values():
        ivs.sort(key=lambda iv: iv.begin)
        for n, first in enumerate(ivs):
            for second in ivs[n + 1 :]:
                if second.begin >= first.end:
                    break
                if second.inv == first.inv:
                    continue
                holder = names.get(first.orch, first.orch)
                killed = any(
                    first.begin - 0.5 <= f.began <= second.begin
                    and (f.kind == "kill-app" or holder in f.targets)
                    for f in faults
                )
                (excused if killed else bad).append((first, second))
    return bad, excused


def _describe(pair: tuple[Interval, Interval], faults: list[Fault]) -> str:
    a, b = pair
    during = [f.kind for f in faults if a.begin - 1 <= f.began <= b.begin + 1]
    return (
        f"run {a.run}: {a.what} of {a.inv[:8]} ({a.orch}) {a.begin:.2f}-{a.end:.2f}, "
        f"{b.what} of {b.inv[:8]} ({b.orch}) from {b.begin:.2f}"
        + (f"; faults near: {', '.join(during)}" if during else "")
    )


def check(
    ledger: Ledger,
    observed: Observed,
    faults: list[Fault],
    deadlocks: int,
    api_retries: int,
    names: dict[str, str] | None = None,
) -> Report:
    """The table of invariants for one chaos run."""
    names = names or {}
    report = Report()
    planned = len(ledger.runs)
    acked = [e for e in ledger.runs if e.run_id is not None]
    report.add("starts acknowledged (201/200)", str(planned), len(acked), len(acked) == planned)
    for e in ledger.runs:
        if e.run_id is None:
            report.sample("starts not acknowledged", f"{e.plan.key}: {'; '.join(e.problems)[:200]}")
    found = [e for e in acked if e.run_id in observed.runs]
    report.add("acknowledged runs found", str(len(acked)), len(found), len(found) == len(acked))
    keys = Counter(r.get("runKey") for r in observed.listed)
    dupes = sum(1 for n in keys.values() if n > 1)
    report.add("run keys with two runs", "0", dupes, dupes == 0)

    statuses: Counter[str] = Counter()
    right = 0
    for e in found:
        assert e.run_id is not None
        run = observed.runs[e.run_id]
        statuses[str(run.get("status"))] += 1
        if run.get("status") == "completed" and run.get("output") == chaos_app.expected_output(
            e.plan.input
        ):
            right += 1
        elif run.get("status") == "completed":
            report.sample("wrong outputs", f"{e.run_id}: {str(run.get('output'))[:200]}")
        else:
            error = run.get("error") or {}
            waiting = [s["name"] for s in run.get("steps") or [] if s.get("status") != "completed"]
            report.sample(
                "runs not completed",
                f"{e.run_id} {run.get('status')}: {error.get('code')} "
                f"{str(error.get('message'))[:150]} (open steps: {waiting})",
            )
    report.add("runs completed, right output", str(len(acked)), right, right == len(acked))
    report.add("run statuses", "-", dict(statuses), None)
    codes = Counter(
        str((observed.runs[e.run_id].get("error") or {}).get("code"))
        for e in found
        if e.run_id and observed.runs[e.run_id].get("status") == "failed"
    )
    if codes:
        report.add("failed runs by error code", "-", dict(codes), None)

    twice = 0
    received = 0
    completed_at: dict[tuple[str, str], float] = {}
    for run_id, events in observed.histories.items():
        counts = Counter(ev.get("stepName") for ev in events if ev.get("type") == "step.completed")
        for step, n in counts.items():
            if n > 1:
                twice += 1
                report.sample("steps recorded twice", f"{run_id} {step}: {n} step.completed")
        names_in_run = Counter(s["name"] for s in observed.runs[run_id].get("steps") or [])
        twice += sum(1 for n in names_in_run.values() if n > 1)
        if any(ev.get("type") == "event.received" for ev in events):
            received += 1
        for ev in events:
            if ev.get("type") == "step.completed" and ev.get("stepName"):
                completed_at.setdefault((run_id, str(ev["stepName"])), _ts(str(ev["at"])))
    report.add("steps recorded twice", "0", twice, twice == 0)
    again = 0
    for r in observed.records:
        if r.get("kind") == "step" and r.get("phase") == "start":
            done = completed_at.get((str(r.get("run")), str(r.get("step"))))
            if done is not None and r["at"] > done:
                again += 1
                report.sample(
                    "recorded steps run again",
                    f"{r.get('run')} {r.get('step')} at {r['at']:.2f}, completed {done:.2f}",
                )
    report.add("recorded steps run again", "0", again, again == 0)

    cb_acked = cb_lost = 0
    for e in found:
        assert e.run_id is not None
        steps = {s["name"]: s for s in observed.runs[e.run_id].get("steps") or []}
        for how, body in e.callbacks.items():
            cb_acked += 1
            step = steps.get(f"cb-{how}", {})
            if step.get("status") != "completed" or step.get("output") != body:
                cb_lost += 1
                report.sample(
                    "callback bodies lost",
                    f"{e.run_id} cb-{how}: step {step.get('status')} {step.get('output')}",
                )
    report.add("acknowledged callback bodies lost", f"0 of {cb_acked}", cb_lost, cb_lost == 0)
    ev_acked = sum(e.event_acks for e in acked)
    ev_lost = sum(e.events_lost for e in acked)
    for e in found:
        assert e.run_id is not None
        evt: dict[str, Any] = next(
            (s for s in observed.runs[e.run_id].get("steps") or [] if s["name"] == "evt"), {}
        )
        want = chaos_app.event_data(e.plan.key, e.plan.i)
        if e.event_acks and not (evt.get("status") == "completed" and evt.get("output") == want):
            ev_lost += 1
            report.sample(
                "events lost", f"{e.run_id}: evt {evt.get('status')} after {e.event_acks} acks"
            )
        elif e.events_lost:
            report.sample(
                "events lost",
                f"{e.run_id}: an acked event left its wait waiting; sent {e.events_lost} more",
            )
    report.add("acknowledged events lost", f"0 of {ev_acked}", ev_lost, ev_lost == 0)
    report.add(
        "events answered matchedRuns 0 while waiting",
        "-",
        sum(e.event_unmatched for e in acked),
        None,
    )
    report.add(
        "histories with event.received", "-", f"{received} of {len(observed.histories)}", None
    )

    now = max([r["at"] for r in observed.records] or [0.0]) + 1.0
    app_kills = sorted(f.began for f in faults if f.kind == "kill-app")
    steps_iv = _intervals(observed.records, "step", app_kills, now)
    bad, excused = _overlaps(steps_iv, faults, names)
    report.add("overlapping steps of two invocations", "0", len(bad), not bad)
    report.add("  the same, after the holder was killed", "-", len(excused), None)
    for pair in bad:
        report.sample("overlapping steps", _describe(pair, faults))
    inv_iv = _intervals(observed.records, "invoke", app_kills, now)
    bad_inv, excused_inv = _overlaps(inv_iv, faults, names)
    report.add("invocations begun while another held the run", "0", len(bad_inv), not bad_inv)
    report.add("  the same, after the holder was killed", "-", len(excused_inv), None)
    for pair in bad_inv:
        report.sample("concurrent invocations", _describe(pair, faults))
    ends = [r for r in observed.records if r.get("kind") == "invoke" and r.get("phase") == "end"]
    stale = {str(r.get("inv")) for r in ends if r.get("outcome") == "stale"}
    worked = {str(r.get("inv")) for r in observed.records if r.get("kind") == "step"}
    started = {
        (run_id, str(ev.get("invocationId")))
        for run_id, events in observed.histories.items()
        for ev in events
        if ev.get("type") == "invocation.started"
    }
    unrecorded = {
        (str(r.get("run")), str(r.get("inv")))
        for r in observed.records
        if r.get("kind") == "invoke" and r.get("phase") == "begin"
    } - started
    for run_id, inv in sorted(unrecorded)[:5]:
        report.sample("invocations missing from the history", f"{run_id}: {inv}")
    report.add("app invocations without invocation.started", "0", len(unrecorded), not unrecorded)
    report.add("invocations answered stale", "-", len(stale), None)
    report.add("  of which had run a step", "-", len(stale & worked), None)
    refused = sum(
        1 for r in observed.records if r.get("kind") == "invoke" and r.get("phase") == "refused"
    )
    report.add("invocations answered 503 (injected)", "-", refused, None)
    report.add("deadlocks in the PostgreSQL log", "0", deadlocks, deadlocks == 0)
    report.add("driver API calls retried", "-", api_retries, None)
    return report
