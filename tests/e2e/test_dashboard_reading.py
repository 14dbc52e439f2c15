"""The dashboard read by a person, in Chromium at 1400 px and 420 px wide: runs told apart by
their ids (full id on hover and copy), no page wider than the screen, workflows' options and
apps' names readable, a running run that says so, SLAs in words, a favicon, the
events received with their runs, a banner for an unreachable app, and read keys without
actions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

import stepline
from stepline_server.store import keys
from tests.e2e.test_dashboard import CHROMIUM, CHROMIUM_ARGS, NO_CHROMIUM
from tests.support import Stack, app_server, orchestrator_stack

playwright_api = pytest.importorskip("playwright.async_api")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)

WIDTHS = (1400, 420)
APP_NAME = "storefront"
PAGES = ("runs", "workflows", "apps", "schedules", "events", "keys")


def build_app() -> stepline.Stepline:
    sl = stepline.Stepline("whsec_ui_reading")

    @sl.workflow("approve", retries=stepline.Retries(attempts=1), timeout="2h")
    async def approve(ctx: stepline.Context, input: Any) -> Any:
        await ctx.step("prepare", lambda: {"long": "x" * 400})
        cb = await ctx.callback("manager-approval-for-the-quarterly-budget", timeout="1h")
        return await cb.wait()

    @sl.workflow("quick", concurrency=stepline.Concurrency(limit=2, key="userId"))
    async def quick(ctx: stepline.Context, input: Any) -> str:
        return str(await ctx.step("only", lambda: "ok"))

    @sl.workflow("welcome", on_event="user.signed_up")
    async def welcome(ctx: stepline.Context, input: Any) -> str:
        return str(await ctx.step("mail", lambda: f"welcome {input['userId']}"))

    @sl.workflow("kyc")
    async def kyc(ctx: stepline.Context, input: Any) -> Any:
        return await ctx.wait_for_event("verdict", event="user.signed_up", match=input)

    return sl


@dataclass
class Env:
    stack: Stack
    page: Any
    context: Any

    @property
    def client(self) -> stepline.AsyncClient:
        return self.stack.client

    async def sign_in(self, key: str | None = None) -> None:
        await self.page.goto(self.stack.url + "/ui/")
        await self.page.fill("input[name=key]", key or self.stack.api_key)
        await self.page.click("button:has-text('Sign in')")
        await self.page.wait_for_url("**/ui/runs")

    async def until(self, run_id: str, check: Any) -> dict[str, Any]:
        for _ in range(300):
            run = await self.client.get_run(run_id)
            if check(run):
                return run
            await asyncio.sleep(0.05)
        raise AssertionError(f"run {run_id} never got there: {run}")

    async def fits(self, width: int, what: str) -> None:
        """The page at ``width`` px: nothing wider than the window, the header's links inside it."""
        await self.page.set_viewport_size({"width": width, "height": 900})
        wide = await self.page.evaluate("document.documentElement.scrollWidth")
        assert wide <= width, f"{what} at {width}px is {wide}px wide"
        for link in await self.page.locator("header.top a, header.top button").all():
            box = await link.bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, (
                f"{what} at {width}px: header item {await link.inner_text()!r} spills: {box}"
            )


@pytest.fixture
async def env(database_url: str) -> AsyncIterator[Env]:
    """An orchestrator and an app named storefront on loopback, and a headless Chromium page
    that may use the clipboard."""
    sl = build_app()
    async with (
        orchestrator_stack(database_url) as stack,
        app_server(sl) as url,
        playwright_api.async_playwright() as p,
    ):
        await stack.register(sl, url, name=APP_NAME)
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = await browser.new_context(viewport={"width": WIDTHS[0], "height": 900})
            await context.grant_permissions(["clipboard-read", "clipboard-write"], origin=stack.url)
            yield Env(stack, await context.new_page(), context)
        finally:
            await browser.close()


def waiting(run: dict[str, Any]) -> bool:
    return any(s["status"] == "waiting" for s in run.get("steps", []))


async def test_runs_are_told_apart_by_their_ids_with_the_whole_id_on_hover_and_copy(
    env: Env,
) -> None:
    """Runs made in the same minute share the start of their ids; the list shows each id's
    tail (all different), the whole id on hover, and a copy button that copies it, at both
    widths, and no page of the dashboard is wider than a 420 px screen or spills its header."""
    made = [await env.client.start_run("quick", {"userId": f"u{i}"}) for i in range(4)]
    for run in made:
        await env.client.wait_run(run["id"], timeout=20)
    await env.sign_in()
    page = env.page
    for width in WIDTHS:
        await page.set_viewport_size({"width": width, "height": 900})
        await page.goto(env.stack.url + "/ui/runs")
        links = page.locator("#rows td.run-id a")
        shown = [await links.nth(i).inner_text() for i in range(await links.count())]
        assert len(shown) == 4 and len(set(shown)) == 4, shown
        titles = {await links.nth(i).get_attribute("title") for i in range(4)}
        assert titles == {r["id"] for r in made}
        for tail in shown:
            made_id(titles, tail)
        row = page.locator("#rows tr").first
        full = await row.locator("td.run-id a").get_attribute("title")
        await row.locator("button.copy").click()
        assert await page.evaluate("navigator.clipboard.readText()") == full
        await env.fits(width, "runs")
    run = made[0]
    for width in WIDTHS:
        for name in PAGES:
            await page.set_viewport_size({"width": width, "height": 900})
            await page.goto(f"{env.stack.url}/ui/{name}")
            await env.fits(width, name)
    waiting_run = await env.client.start_run("approve", None)
    await env.until(waiting_run["id"], waiting)
    for rid in (run["id"], waiting_run["id"]):
        for width in WIDTHS:
            await page.goto(f"{env.stack.url}/ui/runs/{rid}")
            await env.fits(width, f"run {rid}")


def made_id(titles: set[str | None], tail: str) -> str:
    """The one full id that ends with a shown tail."""
    found = [t for t in titles if t and t.endswith(tail.lstrip("…"))]
    assert len(found) == 1, (tail, titles)
    return found[0]


async def test_workflows_show_readable_options_and_runs_show_their_app_by_name(
    env: Env,
) -> None:
    """The workflows page says each option in words (no raw JSON) with the app's name; a
    run's page names its app too."""
    run = await env.client.start_run("quick", {"userId": "u1"})
    await env.client.wait_run(run["id"], timeout=20)
    await env.sign_in()
    page = env.page
    await page.goto(env.stack.url + "/ui/workflows")
    for width in WIDTHS:
        await page.set_viewport_size({"width": width, "height": 900})
        approve = await page.inner_text("tr:has-text('approve')")
        assert "retries" in approve and "1 attempt (no retry)" in approve
        assert "timeout" in approve and "2 h" in approve
        assert "{" not in approve and "Ms" not in approve and "..." not in approve
        quick = await page.inner_text("tr:has-text('quick')")
        assert "at most 2 at once per userId" in quick
        assert "3 attempts, waits 1 s, growing 2x to at most 1 h" in quick
        welcome = await page.inner_text("tr:has-text('welcome')")
        assert "started by event" in welcome and "user.signed_up" in welcome
        assert APP_NAME in approve and "wfa_" not in approve
    await page.goto(f"{env.stack.url}/ui/runs/{run['id']}")
    assert await page.inner_text("#run-app") == APP_NAME


async def test_a_running_run_says_so_and_its_callback_form_label_does_not_wrap(env: Env) -> None:
    """A run waiting on a callback reads "running for …", not "Ended - (took …)"; the label of
    its callback form is one line at 1400 px (a long callback name takes two at 420 px, not
    three). Once completed it says when it ended."""
    run = await env.client.start_run("approve", None)  # its callback's name is long: 2 lines at 420

    await env.until(run["id"], waiting)
    await env.sign_in()
    page = env.page
    await page.goto(f"{env.stack.url}/ui/runs/{run['id']}")
    facts = await page.inner_text(".facts")
    assert "Ended" not in facts and "running for " in await page.inner_text("#run-ended")
    for width in WIDTHS:
        await page.set_viewport_size({"width": width, "height": 900})
        label = page.locator("form.callback .label")
        height = (await label.bounding_box())["height"]
        line = await label.evaluate("e => parseFloat(getComputedStyle(e).lineHeight)")
        lines = round(height / line)
        assert lines == (1 if width > 1000 else 2), f"{lines} lines at {width}px"
    await page.fill("form.callback textarea", '{"ok": true}')
    await page.click("form.callback button")
    await page.wait_for_selector("#run-status:has-text('completed')", timeout=15_000)
    ended = await page.inner_text("#run-ended")
    assert "UTC (took " in ended and ended[:2] == "20"


async def test_slas_read_in_words_and_the_dashboard_has_a_favicon(env: Env) -> None:
    """A schedule's SLA of 30 s reads "30 s" on the schedules page and on its run's page;
    every page links a favicon that the dashboard serves."""
    schedule = await env.client.create_schedule("quick", "0 0 1 1 *", sla="30s")
    run = await env.client.trigger_schedule(schedule["id"])
    await env.client.wait_run(run["id"], timeout=20)
    await env.sign_in()
    page = env.page
    await page.goto(env.stack.url + "/ui/schedules")
    assert await page.inner_text("td.sla") == "30 s"
    await page.goto(f"{env.stack.url}/ui/runs/{run['id']}")
    timing = await page.inner_text("#run-timing")
    assert "SLA 30 s: met" in timing and "30000" not in timing
    icon = await page.get_attribute("link[rel=icon]", "href")
    assert icon
    answer = await page.request.get(env.stack.url + icon)
    assert answer.status == 200 and answer.headers["content-type"].startswith("image/svg+xml")


async def test_the_events_page_lists_events_received_with_the_runs_they_started_and_resumed(
    env: Env,
) -> None:
    """Events sent (by the API and from the page) are listed newest first with the run each
    started and the waiting run each resumed, linked, with their workflow."""
    waiting_run = await env.client.start_run("kyc", {"userId": "u7"})
    await env.until(waiting_run["id"], waiting)
    sent = await env.client.send_event("user.signed_up", {"userId": "u7"})
    started = sent["startedRuns"][0]
    await env.client.wait_run(waiting_run["id"], timeout=20)
    await env.sign_in()
    page = env.page
    await page.goto(env.stack.url + "/ui/events")
    await page.click("details.send summary")
    await page.fill("input[name=name]", "nobody.listens")
    await page.fill("textarea[name=data]", '{"n": 1}')
    await page.click("form[action='/ui/events'] button")
    await page.wait_for_url("**/ui/events")
    rows = page.locator("#received tr.event")
    assert await rows.count() == 2
    newest, first = rows.nth(0), rows.nth(1)
    assert "nobody.listens" in await newest.inner_text()
    assert await newest.locator("td.started").inner_text() == "none"
    assert "user.signed_up" in await first.inner_text()
    assert '"userId":"u7"' in await first.inner_text()
    started_cell = first.locator("td.started")
    assert "welcome" in await started_cell.inner_text()
    assert await started_cell.locator("a").get_attribute("title") == started
    resumed_cell = first.locator("td.resumed")
    assert "kyc" in await resumed_cell.inner_text()
    await resumed_cell.locator("a").click()
    await page.wait_for_url(f"**/ui/runs/{waiting_run['id']}")
    for width in WIDTHS:
        await page.goto(env.stack.url + "/ui/events")
        await env.fits(width, "events")


async def test_a_run_whose_app_is_unreachable_gets_a_banner(env: Env) -> None:
    """A run of an app that stopped answering shows a banner saying its app is unreachable,
    with the reason and how many deliveries failed; a healthy run has none."""
    sl = stepline.Stepline("whsec_ui_gone")

    @sl.workflow("gone-away")
    async def gone_away(ctx: stepline.Context, input: Any) -> str:
        return "never"

    async with app_server(sl) as url:
        await env.stack.register(sl, url, name="gone")
    run = await env.client.start_run("gone-away", None)
    await env.until(run["id"], lambda r: (r.get("deliveryFailures") or 0) >= 1)
    await env.sign_in()
    page = env.page
    await page.goto(f"{env.stack.url}/ui/runs/{run['id']}")
    banner = await page.inner_text("#app-unreachable")
    assert banner.startswith("Its app is unreachable: ")
    assert "delivery attempt(s) failed" in banner
    for width in WIDTHS:
        await env.fits(width, "an unreachable run")
    ok = await env.client.start_run("quick", {"userId": "u1"})
    await env.client.wait_run(ok["id"], timeout=20)
    await page.goto(f"{env.stack.url}/ui/runs/{ok['id']}")
    assert await page.locator("#app-unreachable").count() == 0


async def test_a_read_key_sees_no_action_button_on_any_page(env: Env) -> None:
    """Signed in with a read key, no page has a form that changes anything: the only buttons
    are sign out, copy and the runs list's filter."""
    run = await env.client.start_run("approve", None)
    await env.until(run["id"], waiting)
    await env.client.create_schedule("quick", "0 0 1 1 *")
    await env.client.send_event("user.signed_up", {"userId": "r1"})
    async with env.stack.orchestrator.pool.acquire() as conn:
        reader = await keys.create_key(conn, "reader", role="read")
    await env.sign_in(reader)
    page = env.page
    assert "read only" in await page.inner_text("header.top")
    for path in (*PAGES, f"runs/{run['id']}"):
        await page.goto(f"{env.stack.url}/ui/{path}")
        forms = await page.locator("main form[method=post]").count()
        assert forms == 0, f"/ui/{path} has {forms} action form(s) for a read key"
        buttons = [await b.inner_text() for b in await page.locator("button").all()]
        assert set(buttons) <= {"Sign out", "copy", "Filter"}, (path, buttons)
