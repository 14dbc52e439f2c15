"""The ``workflow`` label of the orchestrator's metrics takes a bounded set of values."""

from __future__ import annotations

from stepline_server.metrics import MAX_WORKFLOW_LABELS, OTHER_WORKFLOW, Metrics


def _workflows(m: Metrics, metric: str) -> set[str]:
    return {
        s.labels["workflow"]
        for family in m.registry.collect()
        for s in family.samples
        if s.name == metric
    }


def test_workflows_past_the_bound_count_as_other() -> None:
    """The first names keep their label; runs of later workflows count under ``_other``, in
    the counters and the histograms alike, so a label set cannot grow without bound."""
    m = Metrics()
    for i in range(MAX_WORKFLOW_LABELS + 50):
        m.run_started(f"wf-{i}", "api")
        m.run_ended(f"wf-{i}", "completed", 1.5)
    started = _workflows(m, "stepline_runs_started_total")
    assert len(started) == MAX_WORKFLOW_LABELS + 1 and OTHER_WORKFLOW in started
    assert "wf-0" in started and f"wf-{MAX_WORKFLOW_LABELS}" not in started
    durations = _workflows(m, "stepline_run_duration_seconds_count")
    assert durations == started
