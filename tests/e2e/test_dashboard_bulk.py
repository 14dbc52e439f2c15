"""Bulk actions in the dashboard, in a real browser (Debian's Chromium driven by Playwright):
tick runs or take every run matching the list's filter, confirm with the count, then follow the
operation on its page."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

import stepline
from stepline_server.store import keys
from tests.support import Stack, app_server, orchestrator_stack

playwright_api = pytest.importorskip("playwright.async_api")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (apt-get install -y chromium)"
)
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
]

# Resolves once the runs list's refresh has come due ``n`` times (each is let through or held
# back by the page's own handler, registered before this one).
REFRESHES_DUE = """n => new Promise(resolve => {
  let seen = 0;
  document.addEventListener("htmx:beforeRequest", e => {
    if (e.detail.elt.id === "rows" && ++seen === n) setTimeout(resolve, 300);
  });
})"""


def build_app(state: dict[str, bool]) -> stepline.Stepline:
    sl = stepline.Stepline("whsec_ui_bulk")

    @sl.workflow("charge")
    async def charge(ctx: stepline.Context, input: Any) -> str:
        await ctx.step("load", lambda: "loaded")

        def pay() -> str:
            if not state.get("fixed"):
                raise stepline.TerminalError("card declined")
            return "paid"

        return await ctx.step("pay", pay)

    @sl.workflow("approve")
    async def approve(ctx: stepline.Context, input: Any) -> Any:
        cb = await ctx.callback("approval", timeout="1h")
        return await cb.wait()

    return sl


@dataclass
class Env:
    stack: Stack
    state: dict[str, bool]
    page: Any

    @property
    def client(self) -> stepline.AsyncClient:
        return self.stack.client

    async def sign_in(self, key: str | None = None) -> None:
        await self.page.goto(self.stack.url + "/ui/")
        await self.page.fill("input[name=key]", key or self.stack.api_key)
        await self.page.click("button:has-text('Sign in')")
        await self.page.wait_for_url("**/ui/runs")


@pytest.fixture
async def env(database_url: str) -> AsyncIterator[Env]:
    state: dict[str, bool] = {}
    sl = build_app(state)
    async with (
        orchestrator_stack(database_url) as stack,
        app_server(sl) as url,
        playwright_api.async_playwright() as p,
    ):
        await stack.register(sl, url)
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            yield Env(stack, state, page)
        finally:
            await browser.close()


async def failed(env: Env, n: int) -> list[str]:
    runs = [await env.client.start_run("charge", {"i": i}) for i in range(n)]
    for r in runs:
        assert (await env.client.wait_run(r["id"], timeout=30))["status"] == "failed"
    return [r["id"] for r in runs]


async def test_retry_the_ticked_runs_after_confirming_the_count(env: Env) -> None:
    """Ticking two failed runs and choosing Retry asks to confirm "2 runs will be retried";
    confirming opens the operation's page, which follows it to completed; only the ticked runs
    were retried."""
    ids = await failed(env, 4)
    env.state["fixed"] = True
    await env.sign_in()
    page = env.page
    await page.goto(env.stack.url + "/ui/runs?workflow=charge&status=failed")
    await page.check(f"input[name=run][value='{ids[0]}']")
    await page.evaluate(REFRESHES_DUE, 2)  # two refreshes of the list came due: the tick stays
    assert await page.is_checked(f"input[name=run][value='{ids[0]}']")
    await page.check(f"input[name=run][value='{ids[2]}']")
    await page.click("button:has-text('Retry runs')")
    await page.wait_for_selector("#bulk-count")
    assert "2 runs will be retried" in await page.inner_text("#bulk-count")
    await page.click("button:has-text('Retry 2 runs')")
    await page.wait_for_url("**/ui/operations/*")
    await page.wait_for_selector("#op-status:has-text('completed')", timeout=20_000)
    assert "2 of 2: 2 succeeded, 0 skipped, 0 failed" in await page.inner_text("#op-counts")
    statuses = [(await env.client.wait_run(i, timeout=20))["status"] for i in ids]
    assert statuses == ["completed", "failed", "completed", "failed"]


async def test_cancel_every_run_matching_the_filter(env: Env) -> None:
    """With "every run matching the filter", Cancel takes the running runs of the list's
    filter (not the ended ones), after a confirmation with their count; the operations page
    lists the operation."""
    waiting = [await env.client.start_run("approve", {"i": i}) for i in range(3)]
    await failed(env, 1)
    await env.sign_in()
    page = env.page
    await page.goto(env.stack.url + "/ui/runs?workflow=approve")
    await page.check("input[name=scope][value=filter]")
    await page.click("button:has-text('Cancel runs')")
    await page.wait_for_selector("#bulk-count")
    assert "3 runs will be cancelled" in await page.inner_text("#bulk-count")
    await page.click("button:has-text('Cancel 3 runs')")
    await page.wait_for_selector("#op-status:has-text('completed')", timeout=20_000)
    for r in waiting:
        assert (await env.client.wait_run(r["id"], timeout=20))["status"] == "cancelled"
    await page.click("nav >> text=Operations")
    assert "cancel" in await page.inner_text("table.list tbody")


async def test_nothing_ticked_or_a_read_key(env: Env) -> None:
    """Choosing an action with nothing ticked, or a step name holding a NUL character, says so
    and does nothing; a read key sees no ticks and no bulk buttons."""
    await failed(env, 1)
    await env.sign_in()
    page = env.page
    await page.click("button:has-text('Retry runs')")
    await page.wait_for_selector(".flash")
    assert "tick the runs" in await page.inner_text(".flash")
    await page.check("input[name=scope][value=filter]")
    await page.fill("input[name=fromStep]", "pay\x00")
    await page.click("button:has-text('Retry runs')")
    # Every form is checked before it acts: a NUL in any field is refused with a page saying so.
    await page.wait_for_selector("text=NUL")
    assert (await env.client.list_operations())["operations"] == []
    async with env.stack.orchestrator.pool.acquire() as conn:
        reader = await keys.create_key(conn, "reader", role="read")
    await page.click("button:has-text('Sign out')")
    await env.sign_in(reader)
    assert await page.locator("input[name=run]").count() == 0
    assert await page.locator("button:has-text('Retry runs')").count() == 0
