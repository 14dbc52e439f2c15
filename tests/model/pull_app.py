"""The model test's pull apps, run by ``stepline worker`` processes: ``tests.model.pull_app:sl``,
the model's workflows named ``pull-…``, and ``tests.model.pull_app:doomed``, another app with
only ``pull-doomed``, whose step kills its worker (``kill -9`` of itself) every time (its own
worker, so that no other run's invocation is lost with it). Each step execution is appended to
the file ``STEPLINE_MODEL_RECORD`` names (one JSON line; every worker appends to the same
file)."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict
from pathlib import Path
from typing import Any

import stepline
from tests.model.app import SECRET, Execution, Executions, build

PREFIX = "pull-"


class Recorded(Executions):
    """Executions kept in the shared file, so that a worker started after another died knows
    what ran before it."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def step(self, run_id: str, name: str, tag: str, gen: int, ok: bool = True) -> None:
        line = json.dumps(asdict(Execution(run_id, name, "", tag, gen, ok))) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def tried(self, tag: str, gen: int, name: str) -> int:
        return sum(1 for e in read(self.path) if (e.tag, e.gen, e.step) == (tag, gen, name))


def read(path: Path) -> list[Execution]:
    """The executions recorded in ``path`` (none when it does not exist yet)."""
    if not path.exists():
        return []
    return [Execution(**json.loads(line)) for line in path.read_text().splitlines() if line]


def recorded() -> Recorded:
    return Recorded(Path(os.environ.get("STEPLINE_MODEL_RECORD", "model-pull.jsonl")))


def make_doomed() -> stepline.Stepline:
    """The app of ``pull-doomed`` alone."""
    ex = recorded()
    sl = stepline.Stepline(SECRET)

    @sl.workflow(PREFIX + "doomed")
    async def doomed_workflow(ctx: stepline.Context, input: dict[str, Any]) -> None:
        def die() -> None:
            ex.step(ctx.run_id, "a", input["tag"], 1)
            os.kill(os.getpid(), signal.SIGKILL)

        await ctx.step("a", die)

    return sl


sl = build(recorded(), prefix=PREFIX)
doomed = make_doomed()
