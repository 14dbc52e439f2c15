"""The dashboard in a real browser (Debian's Chromium driven by Playwright) against a real
orchestrator and app: sign in, find and read runs, act on them, and stay safe while doing so."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import stepline
from stepline_server.store import keys
from tests.support import Stack, app_server, orchestrator_stack, worker

playwright_api = pytest.importorskip("playwright.async_api")

CHROMIUM = (
    os.environ.get("STEPLINE_CHROMIUM")
    or shutil.which("chromium")
    or shutil.which("chromium-browser")
    or shutil.which("google-chrome")
)
NO_CHROMIUM = "no chromium on PATH (`make browser` installs it; or set STEPLINE_CHROMIUM)"
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
DOCS = Path(__file__).resolve().parents[2] / "docs"
# Keep the headless browser from calling anywhere but the orchestrator under test.
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
HTML = "<script>window.pwned = 1</script><b id=bold>bold</b><img src=x onerror=alert(1)>"
page_log = logging.getLogger("tests.dashboard")


def build_app(state: dict[str, bool]) -> stepline.Stepline:
    sl = stepline.Stepline("whsec_ui_test")

    @sl.workflow("onboard")
    async def onboard(ctx: stepline.Context, input: dict[str, Any]) -> dict[str, Any]:
        account = await ctx.step("create-account", lambda: {"id": "acct-" + input["user"]})
        await ctx.sleep("cool-off", "10ms")
        mail = await ctx.step("send-welcome", lambda: f"mail to {input['user']}")
        return {"account": account["id"], "mail": mail}

    @sl.workflow("approve")
    async def approve(ctx: stepline.Context, input: Any) -> Any:
        cb = await ctx.callback("approval", timeout="1h")
        decision = await cb.wait()
        return {"approved": decision.get("approved")}

    @sl.workflow("charge", retries=stepline.Retries(attempts=1))
    async def charge(ctx: stepline.Context, input: Any) -> str:
        await ctx.step("load", lambda: "loaded")

        def pay() -> str:
            if not state.get("fixed"):
                raise stepline.TerminalError("card declined")
            return "paid"

        return await ctx.step("pay", pay)

    @sl.workflow("logged")
    async def logged(ctx: stepline.Context, input: Any) -> None:
        ctx.log.info("starting " + HTML, html=HTML)

        def render() -> str:
            page_log.warning("rendered " + HTML)
            return "ok"

        await ctx.step("render", render)
        await ctx.sleep("nap", "10ms")
        ctx.log.error("after the nap")

    @sl.workflow("renewing")
    async def renewing(ctx: stepline.Context, input: Any) -> Any:
        n = int(input or 0)
        await ctx.step("count", lambda: n)
        if n < 2:
            ctx.continue_as_new(n + 1)
        return n

    @sl.workflow("echo-html")
    async def echo_html(ctx: stepline.Context, input: Any) -> Any:
        return await ctx.step("render", lambda: {"html": HTML})

    return sl


@dataclass
class Env:
    stack: Stack
    state: dict[str, bool]
    browser: Any
    page: Any

    @property
    def client(self) -> stepline.AsyncClient:
        return self.stack.client

    async def sign_in(self) -> None:
        await self.page.goto(self.stack.url + "/ui/")
        await self.page.fill("input[name=key]", self.stack.api_key)
        await self.page.click("button:has-text('Sign in')")
        await self.page.wait_for_url("**/ui/runs")

    async def until(self, run_id: str, check: Any) -> dict[str, Any]:
        for _ in range(200):
            run = await self.client.get_run(run_id)
            if check(run):
                return run
            await asyncio.sleep(0.05)
        raise AssertionError(f"run {run_id} never got there: {run}")


@pytest.fixture
async def env(database_url: str) -> AsyncIterator[Env]:
    """An orchestrator and app on loopback, and a headless Chromium page."""
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
            yield Env(stack, state, browser, page)
        finally:
            await browser.close()


def waiting_callback(run: dict[str, Any]) -> bool:
    return bool(run["steps"]) and run["steps"][0]["status"] == "waiting"


async def test_sign_in_find_a_run_by_run_key_and_read_its_steps(env: Env) -> None:
    """Signing in with a key leads to the runs list; searching a runKey finds the run, whose
    page shows each step with its kind, status and output, and the run's output."""
    page = env.page
    await page.goto(env.stack.url + "/ui/runs/rows")
    assert page.url.endswith("/ui/login")
    for user in ("u1", "u2", "u3"):
        run = await env.client.start_run("onboard", {"user": user}, run_key=f"signup-{user}")
        await env.client.wait_run(run["id"], timeout=20)
    await env.sign_in()
    await page.fill("input[name=q]", "signup-u2")
    await page.press("input[name=q]", "Enter")
    await page.wait_for_url("**q=signup-u2**")
    rows = page.locator("#rows tr")
    assert await rows.count() == 1
    assert "signup-u2" in await rows.first.inner_text()
    await rows.first.locator("a").click()
    await page.wait_for_selector("#run-status")
    assert await page.inner_text("#run-status") == "completed"
    steps = page.locator("tr.step")
    names = [await steps.nth(i).get_attribute("data-step") for i in range(await steps.count())]
    assert names == ["create-account", "cool-off", "send-welcome"]
    assert "sleep" in await page.inner_text("tr.step[data-step=cool-off]")
    assert "acct-u2" in await page.inner_text("#run-output")
    assert "invocation.started" in await page.inner_text("table.history")
    if os.environ.get("STEPLINE_SCREENSHOTS"):
        await page.screenshot(path=str(DOCS / "dashboard-run.png"), full_page=True)
        await page.goto(env.stack.url + "/ui/runs")
        await page.screenshot(path=str(DOCS / "dashboard-runs.png"))


async def test_the_runs_list_refreshes_by_itself(env: Env) -> None:
    """A run started after the list was opened appears in it without a reload."""
    await env.sign_in()
    assert "No runs match" in await env.page.inner_text("#rows")
    run = await env.client.start_run("onboard", {"user": "late"}, run_key="late-1")
    await env.page.wait_for_selector("#rows >> text=late-1", timeout=10_000)
    await env.client.wait_run(run["id"], timeout=20)


async def test_complete_a_callback_from_the_run_page_and_watch_the_run_end(env: Env) -> None:
    """The run page shows a waiting callback's URL and a form; completing it with a JSON body
    ends the run, and the page shows it ending without a reload."""
    run = await env.client.start_run("approve", None)
    current = await env.until(run["id"], waiting_callback)
    await env.sign_in()
    page = env.page
    await page.goto(f"{env.stack.url}/ui/runs/{run['id']}")
    assert await page.inner_text("#run-status") == "running"
    assert current["steps"][0]["callbackUrl"] in await page.inner_text("tr.detail")
    await page.fill("form.callback textarea", '{"approved": true}')
    await page.click("button:has-text('Complete approval')")
    await page.wait_for_selector(".flash >> text=Callback completed")
    await page.wait_for_selector("#run-status:has-text('completed')", timeout=15_000)
    assert '"approved": true' in await page.inner_text("#run-output")


async def test_retry_a_failed_run_from_a_step(env: Env) -> None:
    """A failed run's page shows its error with the traceback; retrying from the failed step
    (once the code is fixed) completes it."""
    run = await env.client.start_run("charge", None)
    await env.client.wait_run(run["id"], timeout=20)
    await env.sign_in()
    page = env.page
    await page.goto(f"{env.stack.url}/ui/runs/{run['id']}")
    assert await page.inner_text("#run-status") == "failed"
    error = await page.inner_text(".error-box")
    assert "card declined" in error and "Traceback" in error
    env.state["fixed"] = True
    await page.select_option("select[name=fromStep]", "pay")
    await page.click("button:has-text('Retry from step')")
    await page.wait_for_selector("#run-status:has-text('completed')", timeout=15_000)
    ended = await env.client.get_run(run["id"])
    assert ended["output"] == "paid"


async def test_a_forged_form_post_is_refused(env: Env) -> None:
    """A POST carrying the session cookie but not its CSRF token is refused (403) and changes
    nothing; the session cookie is HttpOnly and SameSite=Strict."""
    run = await env.client.start_run("approve", None)
    await env.until(run["id"], waiting_callback)
    await env.sign_in()
    cookie = next(c for c in await env.page.context.cookies() if c["name"] == "stepline_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    url = f"{env.stack.url}/ui/runs/{run['id']}/cancel"
    for form in ({}, {"_csrf": "forged"}):
        answer = await env.page.request.post(url, form=form, max_redirects=0)
        assert answer.status == 403
        assert "CSRF" in await answer.text()
    assert (await env.client.get_run(run["id"]))["status"] == "running"
    async with httpx.AsyncClient() as plain:  # no session at all: sent to sign in
        answer = await plain.post(url, data={"_csrf": "x"})
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/login"


async def test_a_step_output_holding_html_renders_as_text(env: Env) -> None:
    """HTML in a step's output is shown as text: no element is made, no script runs, and
    every page carries a strict Content-Security-Policy."""
    run = await env.client.start_run("echo-html", None)
    await env.client.wait_run(run["id"], timeout=20)
    await env.sign_in()
    page = env.page
    answer = await page.goto(f"{env.stack.url}/ui/runs/{run['id']}")
    csp = answer.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    await page.click("tr.detail details.out summary")
    assert HTML in await page.inner_text(".step-output")
    assert await page.locator("#bold").count() == 0
    assert await page.evaluate("window.pwned") is None


async def test_the_run_page_shows_its_log_lines_beside_the_steps_as_text(env: Env) -> None:
    """The run page lists the run's log lines (each once, with level, step and fields) and
    each step's own lines in its row; HTML in a line is text. A schedule's SLA is on the
    schedules page."""
    run = await env.client.start_run("logged", None)
    await env.client.wait_run(run["id"], timeout=20)
    await env.client.create_schedule("logged", "0 0 1 1 *", sla="90s")
    await env.sign_in()
    page = env.page
    await page.goto(f"{env.stack.url}/ui/runs/{run['id']}")
    rows = page.locator("#logs tr.log")
    assert await rows.count() == 3
    texts = [await rows.nth(i).inner_text() for i in range(3)]
    assert "starting " + HTML in texts[0] and "info" in texts[0].lower()
    assert "rendered " + HTML in texts[1] and "render" in texts[1]
    assert "after the nap" in texts[2] and "error" in texts[2].lower()
    assert "tests.dashboard" in texts[1]
    await page.click("tr.detail details.step-logs summary")
    assert "rendered " + HTML in await page.inner_text("tr.detail details.step-logs")
    assert await page.locator("#bold").count() == 0
    assert await page.evaluate("window.pwned") is None
    await page.goto(f"{env.stack.url}/ui/schedules")
    assert await page.inner_text("td.sla") == "1 min 30 s"


async def test_the_run_page_says_which_generation_a_continued_run_is_in(env: Env) -> None:
    """A run that continued as new twice shows generation 3 and only that generation's
    steps."""
    run = await env.client.start_run("renewing", 0)
    done = await env.client.wait_run(run["id"], timeout=20)
    assert done["status"] == "completed" and done["generation"] == 3
    await env.sign_in()
    await env.page.goto(f"{env.stack.url}/ui/runs/{run['id']}")
    assert (await env.page.inner_text("#run-generation")).startswith("3 (continued as new 2 times")
    assert await env.page.locator("#history-warning").count() == 0


async def test_pages_read_without_javascript(env: Env) -> None:
    """With JavaScript off, signing in, the runs list and a run's page (with its priority) all
    work."""
    run = await env.client.start_run("onboard", {"user": "nojs"}, priority=7)
    await env.client.wait_run(run["id"], timeout=20)
    context = await env.browser.new_context(java_script_enabled=False)
    page = await context.new_page()
    env.page = page
    await env.sign_in()
    assert run["id"][-12:] in await page.inner_text("#rows")
    for name in ("workflows", "apps", "schedules", "events", "keys"):
        await page.click(f"nav >> text={name.title()}")
        await page.wait_for_url(f"**/ui/{name}")
    await page.goto(f"{env.stack.url}/ui/runs/{run['id']}")
    assert await page.inner_text("#run-status") == "completed"
    assert "Priority\n7" in await page.inner_text(".facts")
    await context.close()


async def test_a_read_key_sees_no_action_and_the_server_refuses(env: Env) -> None:
    """A read key's pages have no action buttons, and its posts (with a valid CSRF token) are
    refused (403) and change nothing."""
    run = await env.client.start_run("approve", None)
    await env.until(run["id"], waiting_callback)
    async with env.stack.orchestrator.pool.acquire() as conn:
        reader = await keys.create_key(conn, "reader", role="read")
    page = env.page
    await page.goto(env.stack.url + "/ui/")
    await page.fill("input[name=key]", reader)
    await page.click("button:has-text('Sign in')")
    await page.wait_for_url("**/ui/runs")
    await page.goto(f"{env.stack.url}/ui/runs/{run['id']}")
    assert await page.inner_text("#run-status") == "running"
    for action in ("cancel", "retry", "complete"):
        assert await page.locator(f"form[action*='/{action}']").count() == 0, action
    token = await page.get_attribute("input[name=_csrf]", "value")
    assert token
    answer = await page.request.post(
        f"{env.stack.url}/ui/runs/{run['id']}/cancel", form={"_csrf": token}, max_redirects=0
    )
    assert answer.status == 403
    assert (await env.client.get_run(run["id"]))["status"] == "running"


async def test_an_admin_makes_and_revokes_a_key_from_the_keys_page(env: Env) -> None:
    """On the keys page an admin makes a read key (shown once) that then works on the API, and
    revokes it, after which the API refuses it."""
    await env.sign_in()
    page = env.page
    await page.goto(env.stack.url + "/ui/keys")
    await page.fill("input[name=name]", "viewer")
    await page.select_option("select[name=role]", "read")
    await page.click("button:has-text('Make key')")
    await page.wait_for_url("**/ui/keys")
    text = await page.inner_text("body")
    key = next(word for word in text.split() if word.startswith("sl_"))
    async with stepline.AsyncClient(env.stack.url, api_key=key) as reader:
        assert "runs" in await reader.list_runs()
        row = page.locator("tr", has_text="viewer")
        await row.locator("button:has-text('Revoke')").click()
        await page.wait_for_url("**/ui/keys")
        assert await page.locator("tr", has_text="viewer").count() == 0
        for _ in range(40):  # the orchestrator remembers a key for at most half a second
            try:
                await reader.list_runs()
            except stepline.ApiError as exc:
                assert exc.status == 401
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the revoked key still works")


async def test_an_event_sent_from_the_events_page_is_taken(env: Env) -> None:
    """The events page sends an event and says what it did."""
    await env.sign_in()
    page = env.page
    await page.goto(env.stack.url + "/ui/events")
    await page.fill("input[name=name]", "nobody.waits")
    await page.fill("textarea[name=data]", '{"x": 1}')
    await page.click("form[action='/ui/events'] button")
    await page.wait_for_url("**/ui/events")
    assert "Event nobody.waits sent: 0 waiting run(s) resumed, 0 started." in await page.inner_text(
        "body"
    )


async def test_a_pull_app_and_a_run_waiting_for_its_worker(env: Env) -> None:
    """The apps page shows a pull app's kind and no sync button for it; a run of it that no
    worker has taken says on its page that it waits for a worker."""
    sl = stepline.Stepline("whsec_ui_pull")

    @sl.workflow("pulled")
    async def pulled(ctx: stepline.Context, input: Any) -> str:
        return str(await ctx.step("only", lambda: "ok"))

    app = await env.client.create_app("workers", kind="pull")
    async with worker(env.stack, sl, app["slug"]):
        pass  # synced, then gone
    run = await env.client.start_run("pulled", None)
    await env.sign_in()
    page = env.page
    await page.goto(f"{env.stack.url}/ui/apps")
    row = page.locator("tr", has_text="workers")
    assert "pull" in await row.inner_text() and "synced by its workers" in await row.inner_text()
    assert await row.locator("button:has-text('Sync')").count() == 0
    assert await row.locator("button:has-text('Pause')").count() == 1
    await page.goto(f"{env.stack.url}/ui/runs/{run['id']}")
    assert "Waiting for a worker" in await page.inner_text("#waiting-for-worker")


async def test_pause_a_workflow_from_its_page_and_see_it_on_a_waiting_run(env: Env) -> None:
    """A write key pauses a workflow on the Workflows page: it shows paused, a run started then
    is not invoked and its page says the workflow is paused; resumed from the same page, the
    run goes on and completes."""
    await env.sign_in()
    page = env.page
    await page.goto(env.stack.url + "/ui/workflows")
    row = page.locator("tr", has_text="onboard")
    await row.locator("button:has-text('Pause')").click()
    await page.wait_for_selector(".flash >> text=Paused onboard")
    assert await page.locator("tr", has_text="onboard").locator(".badge.warn").count() == 1
    run = await env.client.start_run("onboard", {"user": "paused"})
    other = await env.client.start_run("echo-html", None)
    await env.client.wait_run(other["id"], timeout=20)  # the dispatcher had its chance
    assert (await env.client.get_run(run["id"]))["steps"] == []
    await page.goto(f"{env.stack.url}/ui/runs/{run['id']}")
    assert "Paused" in await page.inner_text(".paused-banner")
    await page.goto(env.stack.url + "/ui/workflows")
    await page.locator("tr", has_text="onboard").locator("button:has-text('Resume')").click()
    await page.wait_for_selector(".flash >> text=Resumed onboard")
    done = await env.client.wait_run(run["id"], timeout=20)
    assert done["status"] == "completed"
    await page.goto(f"{env.stack.url}/ui/runs/{run['id']}")
    assert await page.locator(".paused-banner").count() == 0
