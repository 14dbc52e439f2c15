"""The dashboard on a phone (420 px) and a desktop (1400 px), in Chromium: the runs list, a run's
page and the workflows page fit the screen with nothing cut off (tables stack their rows, each
cell named), every column shows on a desktop, fields say what they are for without being cut
off, and a retried step shows each of its tries."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import stepline
from tests.e2e import test_dashboard_reading as reading
from tests.e2e.test_dashboard import CHROMIUM, CHROMIUM_ARGS, NO_CHROMIUM
from tests.support import app_server, orchestrator_stack

playwright_api = pytest.importorskip("playwright.async_api")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)

PHONE, DESKTOP = 420, 1400
RUN_KEY = "order-2026-12-03-customer-4711-checkout-from-the-mobile-shop"

# What sticks out of the page at the window's width: elements past its right edge, and boxes
# whose content is wider than they are (scrolled or clipped), each named by tag and class.
SPILLS = """() => {
  const out = [];
  const name = e => e.tagName.toLowerCase() + (e.className && typeof e.className === 'string'
    ? '.' + e.className.trim().split(/\\s+/).join('.') : '') + (e.name ? `[name=${e.name}]` : '');
  for (const e of document.querySelectorAll('main *')) {
    const r = e.getBoundingClientRect();
    if ((r.width === 0 && r.height === 0) || e.closest('.sr')) continue;  // .sr: for readers
    if (r.right > window.innerWidth + 0.5 || r.left < -0.5) {
      out.push(`${name(e)} spans ${Math.round(r.left)}..${Math.round(r.right)}`);
    }
    const o = getComputedStyle(e).overflowX;
    if (o !== 'visible' && e.scrollWidth > e.clientWidth + 1) {
      out.push(`${name(e)} hides ${e.scrollWidth - e.clientWidth}px (${o})`);
    }
  }
  return out;
}"""

# Fields whose placeholder is wider than the room they give it.
CUT_PLACEHOLDERS = """() => {
  const ctx = document.createElement('canvas').getContext('2d');
  const out = [];
  for (const e of document.querySelectorAll('main input[placeholder]')) {
    const s = getComputedStyle(e);
    ctx.font = s.font;
    const room = e.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
    const need = ctx.measureText(e.placeholder).width;
    if (need > room + 0.5) out.push(`${e.name}: "${e.placeholder}" needs ${need}px of ${room}`);
  }
  return out;
}"""

# Each stacked table's cells that hold something but do not say which column they are.
UNNAMED_CELLS = """() => {
  const out = [];
  for (const t of document.querySelectorAll('main table')) {
    if (getComputedStyle(t).display !== 'block') continue;
    for (const td of t.querySelectorAll('tbody td')) {
      if (td.hasAttribute('colspan') || !td.textContent.trim()) continue;
      const label = getComputedStyle(td, '::before').content;
      if (!label || label === 'none' || label === '""' || label === 'normal') {
        out.push(`${t.className}: ${td.textContent.trim().slice(0, 30)}`);
      }
    }
  }
  return out;
}"""


# A table's cells that lie outside its border (its layout broken), and how it is displayed.
OUTSIDE_ITS_TABLE = """t => {
  const edge = t.getBoundingClientRect();
  const out = getComputedStyle(t).display === 'table' ? [] : [getComputedStyle(t).display];
  for (const td of t.querySelectorAll('td, th')) {
    const r = td.getBoundingClientRect();
    if (r.width && (r.right > edge.right + 1 || r.left < edge.left - 1)) {
      out.push(`${td.textContent.trim().slice(0, 30)}: ${Math.round(r.right)} > ${edge.right}`);
    }
  }
  return out;
}"""


def build_app(tries: dict[str, int]) -> stepline.Stepline:
    sl = stepline.Stepline("whsec_ui_phone")

    @sl.workflow(
        "checkout-with-a-long-workflow-name",
        retries=stepline.Retries(attempts=3, initial_delay="10ms"),
        timeout="7d",
    )
    async def checkout(ctx: stepline.Context, input: Any) -> Any:
        ctx.log.info("checking out the basket", basket=input, channel="mobile-shop-web")

        def charge() -> dict[str, str]:
            tries["charge"] = tries.get("charge", 0) + 1
            if tries["charge"] == 1:
                raise ValueError("the card network timed out")
            return {"receipt": "rcpt-" + "0123456789abcdef" * 6}

        receipt = await ctx.step("charge-the-customer-card", charge)
        await ctx.sleep("let-the-bank-settle", "10ms")
        return await ctx.step("send-the-receipt-by-mail", lambda: receipt)

    return sl


@dataclass
class Env(reading.Env):
    """The reading tests' page, with a folder for its screenshots."""

    shots: Path

    async def at(self, width: int, path: str) -> Any:
        await self.page.set_viewport_size({"width": width, "height": 900})
        await self.page.goto(self.stack.url + path)
        name = path.strip("/").replace("/", "-")
        await self.page.screenshot(path=str(self.shots / f"{name}-{width}.png"), full_page=True)
        return self.page


@pytest.fixture
async def env(database_url: str, tmp_path: Path) -> AsyncIterator[Env]:
    """An orchestrator and app on loopback, a headless Chromium page, and a folder for the
    pages' screenshots (kept by pytest with the test's other files)."""
    sl = build_app({})
    async with (
        orchestrator_stack(database_url) as stack,
        app_server(sl) as url,
        playwright_api.async_playwright() as p,
    ):
        await stack.register(sl, url, name="shop")
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = await browser.new_context(viewport={"width": DESKTOP, "height": 900})
            yield Env(stack, await context.new_page(), context, tmp_path)
        finally:
            await browser.close()


async def finished_run(env: Env) -> dict[str, Any]:
    run = await env.client.start_run(
        "checkout-with-a-long-workflow-name", {"items": ["x" * 80] * 3}, run_key=RUN_KEY
    )
    return await env.client.wait_run(run["id"], timeout=20)


async def test_tables_and_buttons_fit_a_phone_and_every_column_shows_on_a_desktop(
    env: Env,
) -> None:
    """At 420 px the runs list, a run's page (steps, logs, invocations, history) and the
    workflows page have nothing wider than the screen or scrolled out of sight, every button
    and field inside it, and each stacked cell named by its column; at 1400 px each table shows
    all its column headings in one row."""
    run = await finished_run(env)
    assert run["status"] == "completed"
    await env.sign_in()
    pages = {
        "/ui/runs": ["table.list"],
        f"/ui/runs/{run['id']}": ["table.steps", "#logs table", "table.history"],
        "/ui/workflows": ["table.list"],
    }
    for path, tables in pages.items():
        page = await env.at(PHONE, path)
        assert await page.evaluate(SPILLS) == [], f"{path} at {PHONE}px"
        assert await page.evaluate(UNNAMED_CELLS) == [], f"{path} at {PHONE}px"
        for control in await page.locator("main button, main input, main select").all():
            box = await control.bounding_box()
            if box is not None:  # hidden ones (the copy buttons without script) have none
                assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE, (path, box)
        page = await env.at(DESKTOP, path)
        assert await page.evaluate(SPILLS) == [], f"{path} at {DESKTOP}px"
        for selector in tables:
            table = page.locator(selector)
            heads = table.locator("thead th")
            assert await heads.count() >= 5, selector
            tops = {round((await h.bounding_box())["y"]) for h in await heads.all()}
            assert len(tops) == 1, f"{selector}'s headings are not one row at {DESKTOP}px"
            assert await table.evaluate(OUTSIDE_ITS_TABLE) == [], selector
            first = table.locator("tbody tr").first
            cells = first.locator("td")
            lefts = [(await c.bounding_box())["x"] for c in await cells.all()]
            assert lefts == sorted(lefts) and len(set(lefts)) == len(lefts), selector


async def test_the_runs_list_asks_for_a_run_key_once_and_no_field_is_cut_off(env: Env) -> None:
    """The runs list has one field for a runKey (the search), which still finds a run by its
    key; no field's placeholder is cut off at either width."""
    run = await finished_run(env)
    await env.sign_in()
    for width in (DESKTOP, PHONE):
        page = await env.at(width, "/ui/runs")
        fields = page.locator("main input, main select")
        said = [
            " ".join(
                filter(
                    None, [await f.get_attribute(a) for a in ("name", "placeholder", "aria-label")]
                )
            )
            for f in await fields.all()
        ]
        assert len([s for s in said if "runkey" in s.lower()]) == 1, said
        assert await page.evaluate(CUT_PLACEHOLDERS) == [], f"runs at {width}px"
    await page.fill("input[name=q]", RUN_KEY)
    await page.press("input[name=q]", "Enter")
    await page.wait_for_url("**q=order-**")
    assert await page.locator("#rows tr").count() == 1
    assert await page.input_value("input[name=q]") == RUN_KEY
    await page.goto(f"{env.stack.url}/ui/runs?runKey={RUN_KEY}")
    assert await page.input_value("input[name=q]") == RUN_KEY
    assert run["id"] in (await page.locator("#rows a").first.get_attribute("title") or "")
    await page.goto(f"{env.stack.url}/ui/runs?q=order-2026-*")  # a prefix, as the API takes it
    assert await page.locator("#rows tr").count() == 1
    assert run["id"] in (await page.locator("#rows a").first.get_attribute("title") or "")


async def test_a_retried_step_shows_each_try_with_its_outcome_and_error(env: Env) -> None:
    """A step that failed once and then succeeded shows two bars on its timeline and lists
    both tries: the first failed with its error and was retried, the second completed."""
    run = await finished_run(env)
    step = next(s for s in run["steps"] if s["name"] == "charge-the-customer-card")
    assert step["attempt"] == 2
    await env.sign_in()
    page = await env.at(DESKTOP, f"/ui/runs/{run['id']}")
    row = page.locator("tr.step[data-step=charge-the-customer-card]")
    bars = row.locator("td.axis rect")
    assert [await b.get_attribute("class") for b in await bars.all()] == [
        "b-failed",
        "b-completed",
    ]
    lefts = [float(await b.get_attribute("x") or 0) for b in await bars.all()]
    assert lefts[0] < lefts[1]
    tries = page.locator("tr.detail ol.tries li")
    assert await tries.count() == 2
    first, second = await tries.nth(0).inner_text(), await tries.nth(1).inner_text()
    assert first.startswith("try 1") and "failed" in first and "retried" in first
    assert "the card network timed out" in first
    assert second.startswith("try 2") and "completed" in second
    once = page.locator("tr.step[data-step=send-the-receipt-by-mail] td.axis rect")
    assert await once.count() == 1
    assert (
        await page.locator(
            "tr.step[data-step=send-the-receipt-by-mail] + tr.detail ol.tries"
        ).count()
        == 0
    )


async def test_durations_read_in_words(env: Env) -> None:
    """The workflows page says a 7-day timeout as "7 days" and a run's page says how long it
    took in words, never as "7d00h" or "1m30s"."""
    run = await finished_run(env)
    await env.sign_in()
    page = await env.at(DESKTOP, "/ui/workflows")
    options = await page.inner_text("td.options")
    assert "timeout" in options and "7 days" in options and "7d00h" not in options
    assert "waits 10 ms, growing 2x to at most 1 h" in options
    page = await env.at(DESKTOP, f"/ui/runs/{run['id']}")
    ended = await page.inner_text("#run-ended")
    took = ended.split("(took ")[1].rstrip(")")
    assert took.endswith((" ms", " s")), took
