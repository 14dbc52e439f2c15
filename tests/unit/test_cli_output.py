"""How `stepline runs show` prints a run for a person: the generation of a run that continued
as new, and the history warning of a run near its limit."""

from __future__ import annotations

from typing import Any

from stepline_server.cli.output import run_lines

RUN: dict[str, Any] = {
    "id": "0192f0a0-0000-7000-8000-000000000001",
    "workflow": "loop",
    "status": "running",
    "input": 3,
    "createdAt": "2026-12-01T12:00:00Z",
}


def test_a_first_generation_and_a_small_history_say_nothing_of_either() -> None:
    text = "\n".join(run_lines({**RUN, "generation": 1, "history": {"steps": 2, "bytes": 10}}))
    assert "generation" not in text and "history" not in text


def test_a_continued_run_says_its_generation() -> None:
    lines = run_lines({**RUN, "generation": 4})
    assert "generation 4 (the steps are this generation's)" in lines


def test_a_run_near_its_history_limit_says_so() -> None:
    warning = "8,200 of 10,000 steps: history_limit_exceeded past the limit"
    lines = run_lines({**RUN, "history": {"steps": 8200, "warning": warning}})
    assert f"history   {warning}" in lines
