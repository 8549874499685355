"""The on-call tasks in headless Chromium (Debian's /usr/bin/chromium): find the run in trouble
from the fleet (first row), acknowledge, silence and resolve its alert from one view, open the
alert's deep link, and no console error on the way."""

from __future__ import annotations

import shutil

import pytest
from django.urls import reverse

from tests.dashboard.conftest import PASSWORD

CHROMIUM = "/usr/bin/chromium"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not shutil.which(CHROMIUM), reason="no /usr/bin/chromium (make browser)"),
]


def test_it_takes_the_on_call_person_from_the_fleet_to_the_restart(browser, live_server, s2_run,
                                                                   owner, project):
    from recoverydash.alerts.models import Alert
    from recoverydash.runs.models import Analysis, Run

    for i in range(3):  # healthy neighbours the run in trouble must rise above
        calm = Run.objects.create(project=project, run_id=f"a-calm-{i}")
        Analysis.objects.create(run=calm, health="ok", result={"health": "ok"})
    alert = Alert.objects.get(run=s2_run, rule="restart_omission")
    errors = []
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", owner.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")

    first = page.locator("table.fleet tbody tr").first
    assert first.get_attribute("data-run") == "s2-omission"
    page.click("text=All runs")
    assert page.locator("table.fleet tbody tr").first.get_attribute("data-run") == "s2-omission"
    assert page.locator("table.fleet tbody tr").count() == 4
    page.click("a.sort[data-sort=run]")  # sorted by run id, kept in the URL
    assert "sort=run" in page.url and "view=all" in page.url
    assert page.locator("table.fleet tbody tr").first.get_attribute("data-run") == "a-calm-0"

    page.goto(f"{live_server.url}{reverse('alerts')}")
    row = page.locator(f"#alert-{alert.pk}")
    row.locator("button", has_text="Acknowledge").click()
    page.wait_for_selector(".msg.success")
    row = page.locator(f"#alert-{alert.pk}")  # still in the Open list, actions at hand
    assert row.get_attribute("data-state") == "acknowledged"
    row.locator("select[name=seconds]").select_option("3600")
    row.locator("button", has_text="Silence").click()
    page.wait_for_selector(f"#alert-{alert.pk} .silenced svg.icon")
    box = page.locator(f"#alert-{alert.pk} .silenced svg.icon").bounding_box()
    assert box and box["width"] > 4 and box["height"] > 4  # drawn, not an empty glyph box
    page.locator(f"#alert-{alert.pk}").locator("button", has_text="Resolve").click()
    page.wait_for_selector(".msg.success")
    assert page.locator(f"#alert-{alert.pk}").count() == 0
    states = [f.new_state for f in alert.flips.order_by("pk")]
    assert states == ["firing", "acknowledged", "resolved"]

    page.goto(f"{live_server.url}{reverse('alert_detail', args=[alert.pk])}")
    timeline = page.locator("#timeline .flip")
    assert timeline.count() == 3
    assert "resolved by olivia" in timeline.nth(2).inner_text()
    page.click("a.deep-link")  # the restart the alert is about
    page.wait_for_selector("h1:has-text('attempt 1')")
    assert page.url.rstrip("/").endswith("/restarts/1")
    assert errors == [], errors
