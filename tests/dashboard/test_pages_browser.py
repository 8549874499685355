"""Every page in headless Chromium (Debian's /usr/bin/chromium) as a person uses it, served as in
production: WhiteNoise with the collected, hashed and compressed static files.

- at 390 px no text, control or chart label is cut off or off-screen (bounding boxes against the
  viewport and every clipping ancestor: a table column in a scrolled-away strip counts), and
  every page is shot at 1440 and 390 px into test-artifacts/pages/;
- the run page's load time with a cold cache is measured and printed (not asserted: a loaded
  machine is no failure), and when its charts are drawn (plotly.js is fetched after the load
  event), with plotly.min.js served brotli-compressed and cached for ever;
- the on-call tasks: pause and resume a run, own and annotate an alert, filter alerts, read the
  change log, compare runs ticked on the fleet, the shared crosshair, the time range in the URL
  and the refresh choice.
"""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from django.urls import reverse
from django.utils import timezone

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "pages"
#: collected static files kept between test runs (compressing plotly.min.js takes a while once)
COLLECTED = REPO / "var" / "test-staticfiles"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not shutil.which(CHROMIUM), reason="no /usr/bin/chromium (make browser)"),
]

#: What a page may show beyond its box: nothing. This script lists the visible leaves (text,
#: controls, chart labels) whose box leaves the viewport's width or any clipping ancestor's box.
CLIPPED_JS = """() => {
  const W = document.documentElement.clientWidth;
  const out = [];
  const leaf = el => ["INPUT", "SELECT", "BUTTON", "TEXTAREA", "IMG"].includes(el.tagName)
    || (el instanceof SVGElement && el.tagName === "text")
    || Array.from(el.childNodes).some(n => n.nodeType === 3 && n.textContent.trim());
  for (const el of document.querySelectorAll("body *")) {
    if (!leaf(el) || el.closest(".sr-only, [hidden], details:not([open]) > :not(summary)"))
      continue;
    const st = getComputedStyle(el);
    if (st.display === "none" || st.visibility === "hidden" || st.opacity === "0") continue;
    const r = el.getBoundingClientRect();
    if (r.width < 1 || r.height < 1) continue;
    let left = 0, right = W, top = -1e9, bottom = 1e9;
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      const s = getComputedStyle(a);
      const clipX = s.overflowX !== "visible", clipY = s.overflowY !== "visible";
      if (!clipX && !clipY) continue;
      const b = a.getBoundingClientRect();
      if (clipX) { left = Math.max(left, b.left); right = Math.min(right, b.right); }
      if (clipY) { top = Math.max(top, b.top); bottom = Math.min(bottom, b.bottom); }
    }
    const tol = 1.5;
    if (r.left < left - tol || r.right > right + tol || r.top < top - tol
        || r.bottom > bottom + tol) {
      const text = (el.textContent || el.value || el.tagName).trim().slice(0, 50);
      out.push(`${el.tagName.toLowerCase()}.${(el.getAttribute("class") || "").split(" ")[0]} ` +
               `"${text}" x ${Math.round(r.left)}..${Math.round(r.right)} of ` +
               `${Math.round(left)}..${Math.round(right)}`);
    }
  }
  if (document.documentElement.scrollWidth > W + 1)
    out.push(`page ${document.documentElement.scrollWidth} px wide`);
  return out;
}"""


@pytest.fixture
def served(settings):
    """The app on a free port with WhiteNoise serving the collected static files (no test
    static handler in front of it), as gunicorn serves it."""
    from django.db import connections
    from django.test.testcases import LiveServerThread

    from recoverydash.dashboard.staticfiles import collect_if_changed

    settings.STATIC_ROOT = COLLECTED
    COLLECTED.mkdir(parents=True, exist_ok=True)
    collect_if_changed()
    thread = LiveServerThread("127.0.0.1", static_handler=lambda app: app,
                              connections_override={c.alias: c for c in connections.all()
                                                    if c.vendor == "sqlite"})
    thread.daemon = True
    thread.start()
    thread.is_ready.wait()
    if thread.error:
        raise thread.error
    yield f"http://127.0.0.1:{thread.port}"
    thread.terminate()


@pytest.fixture
def world(known_run, project, owner, teammate, known_result):
    """known_run (s2: an omission restart, a rejected generation, a firing alert), a twin run to
    compare it with, a paused run, an alert note and owner, a drill result."""
    from recoverydash.alerts.actions import add_note, assign
    from recoverydash.alerts.models import Alert, AlertFlip
    from recoverydash.runs import monitoring
    from recoverydash.runs.models import Analysis, Run

    twin = Run.objects.create(project=project, run_id="s2-twin-with-a-rather-long-run-id",
                              first_event_at=known_run.first_event_at,
                              last_received_at=timezone.now() - timedelta(minutes=3))
    Analysis.objects.create(run=twin, health="ok", result=dict(
        known_result, restarts=[], costs=dict(known_result["costs"], goodput=0.5)))
    calm = Run.objects.create(project=project, run_id="calm-paused",
                              last_received_at=timezone.now() - timedelta(hours=1))
    monitoring.pause(calm, "olivia", "stopped on purpose")
    from recoverydash.runs.models import DrillResult

    for point, passed in (("after_commit", True), ("mid_save", False)):
        DrillResult.objects.create(
            project=project, run=known_run, drill_id="nightly-drill-with-a-long-name",
            config_digest="sha256:0f3c9a", point=point, attempt=1, passed=passed,
            expected_generation="g1250", restored_generation="g1250" if passed else "g1200",
            verdict="exact" if passed else "replay", replayed=0 if passed else 64, omitted=0,
            recomputed=48, failures=[] if passed else [{"code": "wrong_generation",
                                                        "detail": "restored g1200"}],
            reported_at=timezone.now())
    alert = Alert.objects.get(run=known_run)
    AlertFlip.objects.create(alert=alert, old_state="", new_state="firing", reason=alert.summary)
    add_note(alert, "olivia", "resume cursor came from the read cursor file")
    assign(alert, "olivia", teammate.username)
    return {"run": known_run, "twin": twin, "alert": alert, "calm": calm}


def _page(browser, served, user, width=1440, height=900):
    from django.test import Client

    c = Client()
    c.force_login(user)
    context = browser.new_context(viewport={"width": width, "height": height})
    context.add_cookies([{"name": "sessionid", "value": c.cookies["sessionid"].value,
                          "url": served}])
    page = context.new_page()
    errors: list = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.errors = errors
    return page


def _settle(page):
    if page.locator(".plot[data-figure]").count():
        page.wait_for_function("Array.from(document.querySelectorAll('.plot[data-figure]'))"
                               ".every(el => el.classList.contains('js-plotly-plot'))")
    page.wait_for_timeout(500)  # Plotly's responsive relayout


def _paths(world) -> dict:
    run, alert = world["run"], world["alert"]
    args = [run.project.name, run.run_id]
    return {
        "fleet": "/", "fleet-all": "/?view=all&q=s2",
        "run": reverse("run", args=args), "restart": reverse("restart", args=args + [1]),
        "generation": reverse("generation", args=args + ["g1250"]),
        "generation-rejected": reverse("generation", args=args + ["g1255"]),
        "contract": reverse("run_contract", args=args),
        "alerts": reverse("alerts"), "alert": reverse("alert_detail", args=[alert.pk]),
        "changes": reverse("changes"),
        "compare": reverse("compare") + f"?runs=alpha/{run.run_id}&runs=alpha/"
                                        f"{world['twin'].run_id}",
        "drills": reverse("drills_all"), "project": reverse("project", args=[run.project_id]),
        "locations": reverse("locations", args=[run.project_id]),
        "definitions": reverse("docs_page", args=["definitions"]),
    }


def test_every_page_fits_a_phone_without_clipping(browser, served, world, owner):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    found, errors = {}, []
    for name, path in _paths(world).items():
        for width, height in ((1440, 900), (390, 844)):
            page = _page(browser, served, owner, width, height)
            page.goto(served + path)
            _settle(page)
            tall = page.evaluate("document.documentElement.scrollHeight") > 16000
            page.screenshot(path=str(ARTIFACTS / f"{name}-{width}.png"), full_page=not tall)
            if width == 390:
                clipped = page.evaluate(CLIPPED_JS)
                if clipped:
                    found[name] = clipped
            errors += [f"{name} {width}: {e}" for e in page.errors]
            page.context.close()
    (ARTIFACTS / "clipped-390.json").write_text(json.dumps(found, indent=1))
    assert found == {}, {k: v[:5] for k, v in found.items()}  # all of them in clipped-390.json
    assert errors == [], errors


def test_the_run_page_loads_fast_with_a_cold_cache_and_compressed_plotly(browser, served, world,
                                                                         owner):
    page = _page(browser, served, owner)
    answers = {}
    page.on("response", lambda r: answers.__setitem__(r.url, r) if "plotly" in r.url else None)
    page.goto(served + _paths(world)["run"], wait_until="load")
    load_ms = page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd")
    page.wait_for_selector("html[data-charts=drawn]")
    drawn_ms = page.evaluate("performance.now()")
    print(f"\nrun page with a cold cache (Chromium, localhost): load event {load_ms:.0f} ms, "
          f"its 7 charts drawn by {drawn_ms:.0f} ms")
    (plotly,) = answers.values()
    assert ".min." in plotly.url and plotly.url.count(".") >= 4  # plotly.min.<hash>.js
    headers = plotly.all_headers()
    assert headers["content-encoding"] == "br"
    assert headers["cache-control"] == "max-age=315360000, public, immutable"
    assert int(headers["content-length"]) < 1_300_000  # 4.8 MB as is
    page.context.close()


def test_pausing_a_run_from_its_page_shows_it_paused_and_in_the_change_log(browser, served,
                                                                          world, owner):
    page = _page(browser, served, owner)
    page.goto(served + _paths(world)["run"])
    page.click("summary[data-action=pause]")
    page.fill("input[name=note]", "restarting after the holiday")
    page.click("text=Pause until its next event")
    page.wait_for_selector("[data-paused]")
    assert "Monitoring paused by olivia" in page.inner_text("[data-paused]")
    page.click("[data-paused] a:has-text('Change log')")
    first = page.locator("li.change").first
    assert "monitoring paused: restarting after the holiday" in first.inner_text()
    assert "by olivia" in first.inner_text()
    page.go_back()
    page.click("button[data-action=resume]")
    page.wait_for_selector(".msg.success")
    assert page.locator("[data-paused]").count() == 0
    assert page.errors == []


def test_an_on_call_person_owns_annotates_and_filters_alerts(browser, served, world, owner):
    alert = world["alert"]
    page = _page(browser, served, owner)
    page.goto(served + reverse("alert_detail", args=[alert.pk]))
    page.select_option("#owner-select", "me")
    page.click("#owner button:has-text('Assign')")
    page.wait_for_selector(".msg.success")
    assert page.inner_text("[data-owner]") == "olivia"
    page.fill("#id_text", "paging the data team")
    page.click("text=Add note")
    page.wait_for_selector("li.note:has-text('paging the data team')")
    page.goto(served + reverse("alerts"))
    page.select_option("#id_severity", "warning")
    page.click("form.filters button:has-text('Filter')")
    page.wait_for_selector("text=No open alert matches these filters")
    page.select_option("#id_severity", "critical")
    page.select_option("#id_owner", "me")
    page.click("form.filters button:has-text('Filter')")
    item = page.locator(f"#alert-{alert.pk}")
    assert "assigned to olivia" in item.inner_text()
    assert "owner=me" in page.url and "severity=critical" in page.url
    assert page.errors == []


def test_runs_ticked_on_the_fleet_are_compared_on_shared_axes(browser, served, world, owner):
    page = _page(browser, served, owner)
    page.goto(served + "/?view=all")
    for run_id in ("s2-omission", world["twin"].run_id):
        page.check(f"tr[data-run='{run_id}'] input.compare-pick")
    page.click("text=Compare the ticked runs")
    page.wait_for_selector(".plot[data-figure=risk].js-plotly-plot")
    names = page.evaluate("document.querySelector('.plot[data-figure=risk]').data"
                          ".filter(t => !t.name.endsWith(' limit')).map(t => t.name)")
    assert names == ["s2-omission", world["twin"].run_id]
    rows = page.locator("table.compare-table tbody tr")
    assert rows.count() == 2
    assert page.errors == []


def test_the_crosshair_the_range_in_the_url_and_the_refresh_choice(browser, served, world,
                                                                   owner):
    page = _page(browser, served, owner)
    url = served + _paths(world)["run"]
    page.goto(url)
    _settle(page)
    drag = page.locator(".plot[data-figure=tslrc] .nsewdrag").first
    drag.scroll_into_view_if_needed()
    # the pixel of a point of the sawtooth: where a person would point
    x_px = page.evaluate("""() => {
      const el = document.querySelector('.plot[data-figure=tslrc]');
      const ax = el._fullLayout.xaxis, t = el.data[0];
      return ax.l2p(ax.d2l(t.x[Math.floor(t.x.length / 2)]));
    }""")
    box = drag.bounding_box()
    drag.hover(position={"x": x_px, "y": box["height"] / 2})
    # the same moment is marked in the other time charts: a crosshair line at the hovered time
    page.wait_for_function("window.rdCharts.crosshair !== null && "
                           "window.rdCharts.crosshair !== undefined")
    at = page.evaluate("window.rdCharts.crosshair")
    for other in ("generations", "cursors"):
        lines = page.evaluate(f"document.querySelector('.plot[data-figure={other}]').layout"
                              ".shapes.filter(s => s.name === 'crosshair').map(s => s.x0)")
        assert lines == [at], other
    page.hover("h1")  # away: the crosshair goes
    page.wait_for_timeout(500)
    assert page.evaluate("document.querySelector('.plot[data-figure=cursors]').layout.shapes"
                         ".filter(s => s.name === 'crosshair').length") == 0
    page.click("[data-range='6h']")
    assert "range=6h" in page.url
    page.goto(page.url)
    _settle(page)
    assert page.get_attribute("[data-range='6h']", "aria-pressed") == "true"
    page.select_option("select[name=refresh]", "off")
    assert "refresh=off" in page.url
    page.goto(page.url)
    assert page.get_attribute("#live", "data-refresh") == "off"
    assert page.eval_on_selector("select[name=refresh]", "s => s.value") == "off"
    assert page.errors == []


def test_a_search_finds_a_run_the_default_view_hides(browser, served, world, owner):
    page = _page(browser, served, owner)
    page.goto(served + "/")
    page.fill("#id_q", "calm")
    page.click("form.filters button:has-text('Filter')")
    note = page.locator(".hidden-runs")
    assert "None of the 1 run matching “calm”" in note.inner_text()
    note.locator("a").click()
    page.wait_for_selector("tr[data-run='calm-paused']")
    assert "view=all" in page.url and "q=calm" in page.url
    assert "⏸ paused" in page.locator("tr[data-run='calm-paused']").inner_text()
    assert page.errors == []
