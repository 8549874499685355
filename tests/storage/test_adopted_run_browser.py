"""An adopted run in headless Chromium (Debian's /usr/bin/chromium): a torchtitan folder with a
restorable step, a truncated one and an uncommitted one, adopted by the worker's discovery task,
then its run page, a rejected generation's page and the locations page, as the on-call person
sees them. Screenshots go to test-artifacts/adopted-*.png."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest

from recoverydash.runs.models import Run
from recoverydash.storage.models import KIND_ADOPT
from tests.checkpoints.conftest import dcp_save, truncate
from tests.dashboard.conftest import PASSWORD, owner  # noqa: F401  (fixture)

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not shutil.which(CHROMIUM), reason="no /usr/bin/chromium"),
]


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG from its IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_an_adopted_run_shows_its_generations_with_statuses_and_reasons(
        project, owner, tmp_path, declare_location, live_server, settings):  # noqa: F811
    settings.CELERY_TASK_ALWAYS_EAGER = True
    root = tmp_path / "llama-adopted"
    root.mkdir()
    for step in (10, 20, 30):
        dcp_save(root, step)
    truncate(root / "step-20" / "__0_0.distcp", 100)
    os.remove(root / "step-30" / ".metadata")
    declare_location(project, root, kind=KIND_ADOPT, format="dcp")
    from workers.tasks import discover_manifests

    discover_manifests.apply().get()
    run = Run.objects.get(run_id="adopted-llama-adopted")

    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-background-networking", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{live_server.url}/login/")
        page.fill("#id_username", owner.username)
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{live_server.url}/")

        page.goto(f"{live_server.url}/p/{run.project.name}/runs/{run.run_id}/")
        answer = page.locator(".answers .answer").first.inner_text()
        assert "Yes, from step-10" in answer
        rows = page.locator("section:has(h2:text('Recent generations')) tbody tr")
        assert [r.inner_text().split("\t")[0].strip() for r in rows.all()] == \
            ["step-30", "step-20", "step-10"]
        texts = [" ".join(r.inner_text().split()) for r in rows.all()]
        assert "pending" in texts[0]
        assert "rejected size_mismatch size_mismatch" in texts[1]
        assert "restorable" in texts[2]
        adopted = page.locator(".adopted-from").inner_text()
        assert f"Adopted from the dcp checkpoints in file://{root.resolve()}" in adopted
        attempts = page.locator("section:has(h2:text('Attempts')) tbody").inner_text()
        assert "no trainer events" in attempts and "● running" not in attempts
        shot = ARTIFACTS / "adopted-run-1280.png"
        page.screenshot(path=str(shot), full_page=True)

        page.goto(f"{live_server.url}/p/{run.project.name}/runs/{run.run_id}/generations/step-20/")
        body = page.content()
        assert "Adopted from a dcp checkpoint" in body
        assert "step-20/__0_0.distcp: 100 bytes, its structure declares" in body
        assert "data position unknown: the dcp checkpoint records no data cursor" in body
        # the DCP file holds model and optimizer items: both cells are its check, none absent
        header = page.locator("table.matrix thead").inner_text().lower()
        row = page.locator("table.matrix tbody tr").first.locator("td").all_inner_texts()
        by_component = dict(zip(header.split()[2:], [" ".join(t.split()) for t in row[1:]]))
        assert by_component["model"] == "✖ size mismatch"
        assert by_component["optimizer"] == "✖ size mismatch"
        gen_shot = ARTIFACTS / "adopted-generation-1280.png"
        page.screenshot(path=str(gen_shot), full_page=True)

        page.goto(f"{live_server.url}/projects/{project.pk}/locations/")
        link = page.locator(".adopted a")
        assert link.inner_text() == "adopted-llama-adopted"
        page.screenshot(path=str(ARTIFACTS / "adopted-locations-1280.png"), full_page=True)
        browser.close()
    width, height = png_size(shot)
    assert width == 1280 and height >= 900
    assert png_size(gen_shot)[0] == 1280
