"""The alerts page in a real browser (Debian's Chromium driven by Playwright): an admin sees
the alerts, sends a test to a real receiver and sees its delivery; other keys are refused."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from stepline_server.store import keys
from tests.e2e.test_dashboard import CHROMIUM_ARGS
from tests.receiver import Receiver
from tests.support import Stack, orchestrator_stack

playwright_api = pytest.importorskip("playwright.async_api")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (apt-get install -y chromium)"
)


@pytest.fixture
async def browser_page(database_url: str) -> AsyncIterator[tuple[Stack, Any]]:
    async with orchestrator_stack(database_url) as stack, playwright_api.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield stack, await browser.new_page(viewport={"width": 1280, "height": 900})
        finally:
            await browser.close()


async def sign_in(stack: Stack, page: Any, key: str) -> None:
    await page.goto(stack.url + "/ui/")
    await page.fill("input[name=key]", key)
    await page.click("button:has-text('Sign in')")
    await page.wait_for_url("**/ui/runs")


async def test_see_an_alert_send_a_test_and_see_it_delivered(
    browser_page: tuple[Stack, Any],
) -> None:
    """An admin opens Alerts from the menu and sees each alert with its types, workflow and
    destination; sends a test that a real receiver gets, and after a reload sees the
    delivery: alert.test, delivered, one attempt, HTTP 200. Deleting it empties the page."""
    stack, page = browser_page
    async with Receiver().running() as rx:
        await sign_in(stack, page, stack.api_key)
        await page.click("nav a:has-text('Alerts')")
        await page.wait_for_url("**/ui/alerts")
        assert "No alerts." in await page.inner_text("main")
        destination = {"type": "webhook", "url": rx.url}
        on = ["run.failed", "schedule.disabled"]
        await stack.client.create_alert("night shift", on, destination, workflow="checkout")
        await page.reload()
        section = page.locator("section.alert")
        assert await section.locator("h2").inner_text() == "NIGHT SHIFT"
        meta = await section.locator(".meta").inner_text()
        assert "on run.failed, schedule.disabled" in meta and "workflow checkout" in meta
        assert f"webhook {rx.url}" in meta
        assert "Nothing sent yet." in await section.inner_text()
        await page.click("button:has-text('Send a test')")
        await page.wait_for_url("**/ui/alerts")
        assert "Test notification" in await page.inner_text(".flash")
        await rx.until(1)
        for _ in range(100):
            await page.reload()
            row = await page.locator("table.deliveries tbody tr").first.inner_text()
            if "delivered" in row:
                break
            await asyncio.sleep(0.1)
        cells = [c.strip() for c in row.split("\t")]
        assert cells[0] == rx.received[0].json["id"]
        assert cells[1:6] == ["alert.test", "-", "delivered", "1", "HTTP 200"]
        await page.click("button:has-text('Delete')")
        await page.wait_for_url("**/ui/alerts")
        assert "Alert deleted." in await page.inner_text(".flash")
        assert await page.locator("section.alert").count() == 0
    assert (await stack.client.list_alerts())["alerts"] == []


async def test_a_write_key_sees_no_alerts_page(browser_page: tuple[Stack, Any]) -> None:
    """A write key has no Alerts link, and the page itself refuses it."""
    stack, page = browser_page
    conn = await stack.conn()
    try:
        write = await keys.create_key(conn, "w", role="write")
    finally:
        await conn.close()
    await sign_in(stack, page, write)
    assert await page.locator("nav a:has-text('Alerts')").count() == 0
    answer = await page.goto(stack.url + "/ui/alerts")
    assert answer is not None and answer.status == 403
    assert "Alerts are for admin keys." in await page.inner_text("main")


async def test_make_an_alert_on_the_page_and_see_a_refused_url(
    browser_page: tuple[Stack, Any],
) -> None:
    """An admin makes a webhook alert with the page's form: it is listed with its types,
    workflow and destination, and its secret is shown once. A destination the egress rules
    refuse (a link-local address) is not made: the page shows the REST route's message and
    reason for ``destination.url``, word for word, and keeps what was typed."""
    stack, page = browser_page
    await sign_in(stack, page, stack.api_key)
    await page.goto(stack.url + "/ui/alerts")
    url = "http://127.0.0.1:9/hooks/ops"
    await page.fill("input[name=name]", "pager")
    await page.check("input[name=on][value='run.failed']")
    await page.check("input[name=on][value='run.stuck']")
    await page.fill("input[name=workflow]", "checkout")
    await page.select_option("select[name='destination.type']", "webhook")
    await page.fill("input[name='destination.url']", url)
    await page.click("button:has-text('Make alert')")
    await page.wait_for_load_state()
    assert await page.text_content(".made-alert h2") == "Alert pager made"
    secret = await page.inner_text("#new-secret")
    assert secret.startswith("whsec_")
    section = page.locator("section.alert")
    assert await section.count() == 1
    meta = await section.locator(".meta").inner_text()
    assert "on run.failed, run.stuck" in meta and "workflow checkout" in meta
    assert f"webhook {url}" in meta
    (made,) = (await stack.client.list_alerts())["alerts"]
    assert made["name"] == "pager" and made["on"] == ["run.failed", "run.stuck"]
    assert made["destination"] == {"type": "webhook", "url": url} and "secret" not in made

    refused = "http://169.254.169.254/latest/meta-data"
    body = {"name": "meta", "on": ["run.failed"], "destination": {"type": "slack", "url": refused}}
    async with httpx.AsyncClient(base_url=stack.url) as http:
        answer = await http.post(
            "/v1/alerts", json=body, headers={"authorization": f"Bearer {stack.api_key}"}
        )
    assert answer.status_code == 422
    error = answer.json()["error"]
    reason = error["details"]["fields"]["destination.url"]
    assert "link-local or cloud metadata address" in reason
    await page.fill("input[name=name]", "meta")
    await page.check("input[name=on][value='run.failed']")
    await page.select_option("select[name='destination.type']", "slack")
    await page.fill("input[name='destination.url']", refused)
    await page.click("button:has-text('Make alert')")
    await page.wait_for_load_state()
    shown = await page.inner_text(".error-box")
    assert f"Not made: {error['message']}" in shown
    assert f"destination.url: {reason}" in shown
    assert await page.input_value("input[name='destination.url']") == refused
    assert await page.locator("section.alert").count() == 1
    assert len((await stack.client.list_alerts())["alerts"]) == 1
