"""Screenshots of the dashboard after the demo, in headless Chromium (Debian's, driven by
Playwright; no browser download), and a check that each fault shows where an on-call person looks:
the run page names the restart verdict (or the abandoned generation) and that the data ledger was
observed, and the restart page shows the replayed / omitted counts, every number of it the
recovery API's (``recoverydash.dashboard.agreement``)."""

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
    if scenario.restart.get("units") == "tokens":  # the counts are named in their unit
        words.append("tokens")
    return words


WIDTHS = ((1440, 900), (390, 844))  # a laptop and a phone


def _shoot(page, folder: Path, name: str) -> list[str]:
    """Full-page screenshots of the current page at each width of ``WIDTHS``:
    ``<name>-1440.png`` and ``<name>-390.png``."""
    paths = []
    for width, height in WIDTHS:
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_timeout(500)  # Plotly's responsive relayout
        path = folder / f"{name}-{width}.png"
        page.screenshot(path=str(path), full_page=True)
        paths.append(str(path))
    page.set_viewport_size({"width": WIDTHS[0][0], "height": WIDTHS[0][1]})
    return paths


def capture(url: str, user: str, password: str, runs, pages: dict, folder: Path,
            answers: dict | None = None) -> list[dict]:
    """Sign in, then screenshot the fleet and alerts pages and each run's page and restart page
    at 1440 px and 390 px (``<page>-<width>.png``; runs as ``run-<key>``, ``restart-<key>``).

    ``pages``: run_id -> run page URL; ``answers``: run_id -> its ``/recovery`` answer, whose
    restart every number of the restart page must equal (``dashboard.agreement``). Returns one
    record per run with the screenshot paths and what is missing from its pages (expected words,
    a number that is not the API's, or a console error of the browser), empty when the page
    tells the fault. Raises RuntimeError when Playwright or Chromium is not available."""
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
        page = browser.new_page(viewport={"width": WIDTHS[0][0], "height": WIDTHS[0][1]})
        errors: list = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}/login/")
        page.fill("input[name=username]", user)
        page.fill("input[name=password]", password)
        page.click("button[type=submit], input[type=submit]")
        page.wait_for_load_state("networkidle")
        shots = []
        for name, path in (("fleet", "/"), ("alerts", "/alerts/")):
            page.goto(f"{url}{path}")
            page.wait_for_load_state("networkidle")
            shots += _shoot(page, folder, name)
        if errors:
            records.append({"key": "*", "missing": [f"console error: {e}" for e in errors],
                            "shots": shots})
        for s in runs:
            errors.clear()
            link = pages.get(s.run_id)
            if not link:
                records.append({"key": s.key, "missing": ["run page"], "shots": []})
                continue
            page.goto(link)
            page.wait_for_load_state("networkidle")
            text = page.inner_text("body").lower()
            shots = _shoot(page, folder, f"run-{s.key}")
            missing = [w for w in expected_words(s) if w.lower() not in text]
            if s.restart:
                page.goto(f"{link}restarts/1/")
                page.wait_for_load_state("networkidle")
                shots += _shoot(page, folder, f"restart-{s.key}")
                restart_text = page.inner_text("body").lower()
                for field in ("replayed", "omitted"):
                    value = s.restart.get(field)
                    if value is not None and f"{value:,}" not in restart_text:
                        missing.append(f"{field} {value} on the restart page")
                    unit = s.restart.get("units")
                    if unit and f"{field} {unit}" not in restart_text:
                        missing.append(f"'{field} {unit}' on the restart page")
                item = next((r for r in ((answers or {}).get(s.run_id) or {}).get("restarts")
                             or [] if r.get("attempt") == 1), None)
                if answers is not None:
                    from recoverydash.dashboard.agreement import disagreements

                    missing += ([f"restart page against the API: {d}"
                                 for d in disagreements(page.content(), item)]
                                if item else ["no restart of attempt 1 in the API answer"])
            missing += [f"console error: {e}" for e in errors]
            records.append({"key": s.key, "missing": missing, "shots": shots})
        browser.close()
    return records
