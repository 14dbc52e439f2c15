"""Counters for ``/metrics``: what this orchestrator did since it started (Prometheus text)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

_HELP = {
    "stepline_invocations_total": ("counter", "Invocations ended, by outcome."),
    "stepline_progress_calls_total": (
        "counter",
        "Step updates committed: the SDK's progress calls and invocations' last updates.",
    ),
    "stepline_progress_commits_total": ("counter", "Group commits that wrote progress calls."),
    "stepline_runs_started_total": ("counter", "Runs started through the API."),
}


@dataclass
class Metrics:
    """Monotonic counters, some labelled; gauges are read when rendered."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)

    def inc(self, name: str, label: str = "", by: int = 1) -> None:
        self.counts[(name, label)] += by

    def render(self, gauges: dict[str, tuple[str, float]]) -> str:
        """The Prometheus text format: counters, then the given gauges (help, value)."""
        lines: list[str] = []
        for name, (kind, text) in _HELP.items():
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
            series = [(label, n) for (metric, label), n in self.counts.items() if metric == name]
            for label, n in sorted(series) or [("", 0)]:
                lines.append(f'{name}{{outcome="{label}"}} {n}' if label else f"{name} {n}")
        for name, (text, value) in gauges.items():
            lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name} {value:g}"]
        return "\n".join(lines) + "\n"
