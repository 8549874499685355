"""The Drills page in headless Chromium (Debian's /usr/bin/chromium): a passing drill of the DDP
example and a failing one of a broken trainer, as the drill runner reports them; the rows, their
links to the drill runs, and a screenshot at 1280 px (test-artifacts/drills-1280.png)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from recoverydash.runs.models import Membership, Run
from recoverydash.sdk.drill import result_event

from .test_drills_server import REPORT, envelope, point, post

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
PASSWORD = "drills-page-password-1"

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(not shutil.which(CHROMIUM), reason="no /usr/bin/chromium")]


def test_the_drills_page_in_a_browser(live_server, client, project, ingest_token):
    from django.contrib.auth.models import User

    user = User.objects.create_user("olivia", password=PASSWORD)
    Membership.objects.create(project=project, user=user)
    g4 = "u000000004-a0"
    good = [point("before_shards"), point("during_shard"), point("before_commit"),
            point("after_commit", expected=g4, restored=g4,
                  state={"match": True, "first_mismatch": None, "updates_compared": 4},
                  cost={"lost_updates": 0, "restore_seconds": 0.21}),
            point("corrupt_after_commit", cost={"lost_updates": 3, "restore_seconds": 0.35})]
    events = [envelope({"type": "attempt_started", "world_size": 2, "dataset_version": "v",
                        "drill": {"drill_id": "d1", "role": "control"}}, "d1-control", 0)]
    events += [envelope(result_event(REPORT, d), d["run_id"]) for d in good]
    broken = dict(REPORT, drill_id="d2", config_digest="0e1f2a3b4c5d6e7f",
                  control={"run_id": "d2-control"})
    bad = point("before_commit", passed=False, run_id="d2-before-commit", first_divergence={
        "update": 3, "rank": 0, "index": 0, "control": ["main", 0, 32],
        "drill": ["main", 0, 48]}, state={"match": False, "first_mismatch": 3,
                                          "updates_compared": 0},
        server={"verdict": "omission", "replayed": 0, "omitted": 16, "recomputed": 16},
        failures=["the consumed sequence diverges from the control's",
                  "the state after the resume differs from the control's",
                  "the server's verdict is 'omission'"])
    events.append(envelope(result_event(broken, bad), "d2-before-commit"))
    assert post(client, ingest_token, events).status_code == 202
    run = Run.objects.select_related("project").get(run_id="d2-before-commit")
    run_page = f"/p/{run.project.name}/runs/{run.run_id}/"

    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-background-networking", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{live_server.url}/login/")
        page.fill("input[name=username]", "olivia")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.click("nav >> text=Drills")
        assert page.url.endswith("/drills/")
        text = page.inner_text("main") if page.locator("main").count() else page.inner_text("body")
        assert "✔ passed" in text and "✖ failed" in text
        assert "update 3, rank 0, #0" in text and "control main:0:32 · drill main:0:48" in text
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "drills-1280.png"), full_page=True)
        page.click(f"a[href='{run_page}']")
        assert page.url.endswith(run_page)
        browser.close()
