"""Screenshots of the dashboard after the demo, in headless Chromium (Debian's, driven by
Playwright; no browser download), and a check that each fault shows where an on-call person looks:
the run page names the restart verdict (or the abandoned generation) and that the data ledger was
observed, and the restart page shows the replayed / omitted counts."""

from __future__ import annotations

from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-gpu"]


def expected_words(scenario) -> list[str]:
    """Words the run page of a scenario must show (besides the run id)."""
    words = ["data ledger of attempt 1: observed"]  # the ranks record observed positions
    verdict = scenario.restart.get("verdict")
    if verdict:
        words.append(verdict.replace("_", " "))
    for status, _reason in scenario.generations.values():
        words.append(status)
    return words


def capture(url: str, user: str, password: str, runs, pages: dict, folder: Path) -> list[dict]:
    """Sign in, then screenshot the fleet page and each run's page and restart page at 1280 px.

    ``pages``: run_id -> run page URL. Returns one record per run with the screenshot paths and
    the expected words missing from its pages (empty when the page tells the fault). Raises
    RuntimeError when Playwright or Chromium is not available."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:  # the dev extra is not installed
        raise RuntimeError(f"playwright is not installed: {exc}") from None
    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"{CHROMIUM} not found (make browser installs Debian's chromium)")
    folder.mkdir(parents=True, exist_ok=True)
    records = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{url}/login/")
        page.fill("input[name=username]", user)
        page.fill("input[name=password]", password)
        page.click("button[type=submit], input[type=submit]")
        page.wait_for_load_state("networkidle")
        page.goto(f"{url}/")
        page.screenshot(path=str(folder / "fleet.png"), full_page=True)
        for s in runs:
            link = pages.get(s.run_id)
            if not link:
                records.append({"key": s.key, "missing": ["run page"], "shots": []})
                continue
            page.goto(link)
            page.wait_for_load_state("networkidle")
            shot = folder / f"run-{s.key}.png"
            page.screenshot(path=str(shot), full_page=True)
            page.screenshot(path=str(folder / f"run-{s.key}-top.png"))  # what one screen shows
            text = page.inner_text("body").lower()
            shots = [str(shot)]
            missing = [w for w in expected_words(s) if w.lower() not in text]
            if s.restart:
                page.goto(f"{link}restarts/1/")
                page.wait_for_load_state("networkidle")
                shot = folder / f"restart-{s.key}.png"
                page.screenshot(path=str(shot), full_page=True)
                shots.append(str(shot))
                restart_text = page.inner_text("body").lower()
                for field in ("replayed", "omitted"):
                    value = s.restart.get(field)
                    if value is not None and f"{value}" not in restart_text:
                        missing.append(f"{field} {value} on the restart page")
            records.append({"key": s.key, "missing": missing, "shots": shots})
        browser.close()
    return records
