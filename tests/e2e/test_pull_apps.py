"""Pull apps end to end: a worker polls a real orchestrator over HTTP and runs its workflows."""

from __future__ import annotations

import stepline
from tests.support import orchestrator_stack, worker


def make_app(counts: dict[str, int]) -> stepline.Stepline:
    sl = stepline.Stepline("secret-pull")

    @sl.workflow("double")
    async def double(ctx: stepline.Context, input: int) -> int:
        def work() -> int:
            counts[f"w{input}"] = counts.get(f"w{input}", 0) + 1
            return input * 2

        return await ctx.step("work", work)  # type: ignore[no-any-return]

    return sl


async def test_a_pull_app_runs_a_workflow(database_url: str) -> None:
    """A pull app registered without URL, synced by its worker, runs a run to completion."""
    counts: dict[str, int] = {}
    sl = make_app(counts)
    async with orchestrator_stack(database_url) as stack:
        slug = await stack.register_pull("pulled")
        async with worker(stack, sl, slug):
            run = await stack.client.start_run("double", 21)
            done = await stack.client.wait_run(run["id"], timeout=20)
        assert done["status"] == "completed", done
        assert done["output"] == 42
        assert counts == {"w21": 1}
        app = await stack.client.get_app(slug)
        assert app["kind"] == "pull" and app["url"] is None and app["lastPolledAt"]
