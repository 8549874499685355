"""The dashboard in headless Chromium (Debian's /usr/bin/chromium, never a downloaded browser):
sign in, fleet, the s2 run with rendered Plotly charts, its restart with 48 omitted positions,
acknowledging an alert. Screenshots of every page at 1280 px and 375 px go to test-artifacts/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.dashboard.conftest import PASSWORD

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
#: the tallest page shot whole and in parts (a longer one: its first screen)
MAX_SHOT_HEIGHT = 16000

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not shutil.which(CHROMIUM), reason="no /usr/bin/chromium (make browser)"),
]


def shoot(page, name: str) -> None:
    """Full-page screenshots at 1280 px and at a 375 px phone width."""
    ARTIFACTS.mkdir(exist_ok=True)
    for width, height in ((1280, 900), (375, 812)):
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_timeout(400)  # let Plotly's responsive relayout settle
        total = page.evaluate("document.documentElement.scrollHeight")
        if total > MAX_SHOT_HEIGHT:  # Chromium hangs on a full-page shot some 40,000 px tall
            page.evaluate("window.scrollTo(0, 0)")
            page.screenshot(path=str(ARTIFACTS / f"{name}-{width}.png"))  # its top
            continue
        page.screenshot(path=str(ARTIFACTS / f"{name}-{width}.png"), full_page=True)
        part_height = 1400 if width > 400 else 900
        if total > part_height * 1.4:  # long pages also in readable parts
            for i, top in enumerate(range(0, total, part_height)):
                page.screenshot(path=str(ARTIFACTS / f"{name}-{width}-part{i + 1}.png"),
                                full_page=True, clip={"x": 0, "y": top, "width": width,
                                                      "height": min(part_height, total - top)})
    page.set_viewport_size({"width": 1280, "height": 900})
    page.wait_for_timeout(200)


def test_on_call_walkthrough(browser, live_server, s2_run, owner):
    requests = []
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.on("request", lambda r: requests.append(r.url))
    page.goto(f"{live_server.url}/login/")
    shoot(page, "login")
    page.fill("#id_username", owner.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    assert page.locator("text=s2-omission").count() == 1
    shoot(page, "fleet")

    page.click("a.run-link")
    page.wait_for_selector(".js-plotly-plot")
    page.wait_for_function(
        "document.querySelectorAll('.js-plotly-plot').length === 7 && "
        "document.querySelector('.js-plotly-plot').data.length > 0")
    traces = page.evaluate("Array.from(document.querySelectorAll('.js-plotly-plot'))"
                           ".map(el => el.data.length)")
    assert all(n > 0 for n in traces), traces
    assert "48" in page.locator(".answers").inner_text()
    shoot(page, "run")

    page.click("text=Cursors, findings and audit windows of this restart")
    page.wait_for_selector("h1:has-text('Restart: attempt 1')")
    omitted = page.locator(".stat", has_text="omitted positions").locator(".stat-n").inner_text()
    assert omitted == "48"
    assert "48 positions ahead: skipped" in page.content()
    shoot(page, "restart")

    page.goto(f"{live_server.url}/p/alpha/runs/{s2_run.run_id}/generations/g1250/")
    assert "Objects (40)" in page.content()
    shoot(page, "generation")

    page.goto(f"{live_server.url}/alerts/")
    item = page.locator(".alert-item", has_text="restart_omission")
    assert item.get_attribute("data-state") == "firing"
    shoot(page, "alerts")
    item.locator("button", has_text="Acknowledge").click()
    page.wait_for_selector(".msg.success")
    assert "acknowledged" in page.locator(".msg.success").inner_text()
    page.goto(f"{live_server.url}/alerts/?state=acknowledged")
    acked = page.locator(".alert-item", has_text="restart_omission")
    assert acked.get_attribute("data-state") == "acknowledged"
    assert "acknowledged by olivia" in acked.inner_text()
    shoot(page, "alerts-acknowledged")

    page.goto(f"{live_server.url}/p/alpha/runs/{s2_run.run_id}/contract/")
    shoot(page, "contract")
    page.goto(f"{live_server.url}/projects/")
    page.fill("input[name=name]", "trainer")
    page.click("text=Create token")
    assert page.locator("#new-token").inner_text().startswith("rdt_")
    shoot(page, "project")

    outside = [u for u in requests if not u.startswith(live_server.url) and
               not u.startswith("data:")]
    assert outside == [], outside  # every asset served locally


def test_the_run_page_refreshes_itself_without_a_reload(browser, live_server, s2_run, owner):
    from django.test import Client

    c = Client()
    c.force_login(owner)
    cookie = c.cookies["sessionid"].value
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_cookies([{"name": "sessionid", "value": cookie, "url": live_server.url}])
    page = context.new_page()
    page.clock.install()
    page.goto(f"{live_server.url}/p/alpha/runs/{s2_run.run_id}/")
    page.wait_for_selector(".js-plotly-plot")
    page.evaluate("window.__marker = 1")
    from recoverydash.alerts.models import Alert

    Alert.objects.filter(run=s2_run).update(summary="Changed while you were watching.")
    page.clock.run_for(11_000)
    page.wait_for_selector("text=Changed while you were watching.")
    assert page.evaluate("window.__marker") == 1  # same document: no reload
    context.close()
