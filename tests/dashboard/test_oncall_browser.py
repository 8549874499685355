"""What an on-call person does on the run and restart pages, in headless Chromium (Debian's
/usr/bin/chromium): see which generation to resume and why the newer one is not, see which ids a
restart replayed (highlighted), switch the time range (every time chart follows, zoom too), read
the pages at a 390 px phone width with no element overlapping another (bounding boxes), and no
console error on any page of a restarted run and of a run with no generation."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from tests.dashboard.test_browser import CHROMIUM, browser, shutil  # noqa: F401 (fixture)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not shutil.which(CHROMIUM), reason="no /usr/bin/chromium (make browser)"),
]

TIME_CHARTS = ("generations", "tslrc", "cursors")


def signed_in(browser, live_server, user, **context):
    from django.test import Client

    c = Client()
    c.force_login(user)
    ctx = browser.new_context(**{"viewport": {"width": 1440, "height": 900}, **context})
    ctx.add_cookies([{"name": "sessionid", "value": c.cookies["sessionid"].value,
                      "url": live_server.url}])
    page = ctx.new_page()
    errors: list = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return page, errors


@pytest.fixture
def no_generation_run(client, full_token, project):
    """A live run of one attempt that has committed ten updates and saved no checkpoint."""
    from recoverydash.runs.models import Run
    from tests.dashboard.conftest import analyse

    start = datetime.now(timezone.utc) - timedelta(minutes=12)

    def at(minutes):
        return (start + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")

    base = {"run_id": "no-checkpoint-yet", "attempt": 0}
    events = [dict(base, event_id="s", type="attempt_started", time=at(0), world_size=1,
                   dataset_version="v1", global_batch_size=8)]
    events += [dict(base, event_id=f"u{u}", type="update_committed", time=at(u), update=u,
                    spans=[{"stratum": "main", "epoch": 0, "ranges": [[8 * (u - 1), 8 * u]]}],
                    samples=8) for u in range(1, 11)]
    events.append(dict(base, event_id="h", type="heartbeat", time=at(11), update=10,
                       fetched=[{"stratum": "main", "epoch": 0, "position": 88}]))
    r = client.post("/api/v1/events", data=json.dumps({"events": events}),
                    content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {full_token}")
    assert r.status_code == 202, r.content
    return analyse(Run.objects.get(run_id="no-checkpoint-yet"))


def wait_charts(page):
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length === 7")
    page.wait_for_timeout(300)


def x_ranges(page) -> dict:
    return page.evaluate("""() => Object.fromEntries(Array.from(
        document.querySelectorAll('.plot[data-figure]')).filter(el => el.layout &&
        el.layout.xaxis && el.layout.xaxis.type === 'date').map(el =>
        [el.dataset.figure, el.layout.xaxis.range.map(window.rdTime)]))""")


def test_it_shows_which_generation_to_resume_and_why_the_newer_one_is_not(
        browser, live_server, s2_run, owner):
    from recoverydash.runs.models import Generation

    page, errors = signed_in(browser, live_server, owner)
    page.goto(f"{live_server.url}/runs/{s2_run.pk}/")
    answer = page.locator(".answers .answer").first.inner_text()
    assert "Yes, from g1250" in answer
    # the generations table names every generation with its status and reasons
    statuses = dict(Generation.objects.filter(run=s2_run).values_list("generation_id", "status"))
    assert statuses["g1250"] == "restorable"
    body = page.inner_text("body")
    for gid, status in statuses.items():
        assert gid in body and status in body
    assert errors == []


def test_it_highlights_the_ids_a_restart_replayed(browser, live_server, known_run, owner):
    from recoverydash.runs.models import AuditWindow

    for w in AuditWindow.objects.filter(run=known_run, attempt=1, update=1251):
        w.sample_ids = [f"s{1249 * 64 + w.accum_slot * 16 + w.rank}", "s99999"]
        w.save()
    page, errors = signed_in(browser, live_server, owner)
    page.goto(f"{live_server.url}/runs/{known_run.pk}/restarts/1/")
    replayed = page.locator("#first-window .window-table .id-replayed")
    assert replayed.count() == 4
    assert sorted(replayed.all_inner_texts()) == ["s79936", "s79937", "s79952", "s79953"]
    style = replayed.first.evaluate(
        "el => [getComputedStyle(el).backgroundColor, getComputedStyle(el).fontWeight]")
    plain = page.locator("#first-window .window-table .id-other").first.evaluate(
        "el => getComputedStyle(el).backgroundColor")
    assert style[0] != plain and int(style[1]) >= 600  # highlighted, not just coloured text
    assert page.locator('[data-count="replayed-ids"]').inner_text() == "4"
    assert errors == []


def test_switching_the_time_range_moves_every_time_chart(browser, live_server,
                                                         no_generation_run, owner):
    page, errors = signed_in(browser, live_server, owner)
    page.goto(f"{live_server.url}/runs/{no_generation_run.pk}/")
    wait_charts(page)
    ranges = x_ranges(page)
    assert set(ranges) == {"tslrc", "cursors"}  # no generation: that chart is an empty state
    assert len({tuple(r) for r in ranges.values()}) == 1
    full = next(iter(ranges.values()))
    assert 11 * 60e3 <= full[1] - full[0] <= 14 * 60e3

    page.click("button[data-range='1h']")
    page.wait_for_timeout(300)
    assert {tuple(r) for r in x_ranges(page).values()} == {tuple(full)}  # a 12 min run: all of it
    assert page.get_attribute("button[data-range='1h']", "aria-pressed") == "true"

    # zoom the cursor chart to its last 5 minutes: the TSLRC chart follows
    page.evaluate("""() => { const el = document.querySelector('[data-figure=cursors]');
        const r = el.layout.xaxis.range.map(window.rdTime);
        return Plotly.relayout(el, {'xaxis.range': [new Date(r[1] - 300e3).toISOString(),
                                                     new Date(r[1]).toISOString()]}); }""")
    page.wait_for_timeout(400)
    zoomed = x_ranges(page)
    assert len({tuple(round(v / 1000) for v in r) for r in zoomed.values()}) == 1, zoomed
    assert abs((zoomed["tslrc"][1] - zoomed["tslrc"][0]) - 300e3) < 2e3
    assert "Zoomed:" in page.inner_text("#range-note")
    # the y axis follows the data in view: the cursor's last 5 minutes start above 0 positions
    y = page.evaluate("document.querySelector('[data-figure=tslrc]').layout.yaxis.range")
    assert y[1] < 3600  # scaled to the sawtooth, not to the 60-minute limit
    page.click("button[data-range='all']")
    page.wait_for_timeout(300)
    assert {tuple(r) for r in x_ranges(page).values()} == {tuple(full)}
    # remembered per browser
    page.click("button[data-range='6h']")
    page.reload()
    wait_charts(page)
    assert page.get_attribute("button[data-range='6h']", "aria-pressed") == "true"
    assert errors == []


OVERLAPS = """() => {
  const sel = 'h1, h2, h3, .crumbs, .lede, .stat, .range-picker button, .range-label, figcaption,'
    + ' .plot, .chart-title, .table-wrap, .card > p, .answer > p, .freshness, .button, .topbar a,'
    + ' .signout, .footer, .modebar-container';
  const els = Array.from(document.querySelectorAll(sel)).filter(el => {
    const r = el.getBoundingClientRect(); const s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none';
  });
  const out = [];
  for (let i = 0; i < els.length; i++) for (let j = i + 1; j < els.length; j++) {
    const a = els[i], b = els[j];
    if (a.contains(b) || b.contains(a)) continue;
    const p = a.getBoundingClientRect(), q = b.getBoundingClientRect();
    const w = Math.min(p.right, q.right) - Math.max(p.left, q.left);
    const h = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
    if (w > 1 && h > 1) out.push([a.tagName + '.' + a.className + ' ' + (a.textContent || '').slice(0, 30),
                                  b.tagName + '.' + b.className + ' ' + (b.textContent || '').slice(0, 30)]);
  }
  // inside each chart: the legend never covers tick labels, no label outside the chart, and
  // the drawing stays inside its card
  document.querySelectorAll('.js-plotly-plot').forEach(plot => {
    const box = plot.getBoundingClientRect();
    const card = plot.closest('.chart').getBoundingClientRect();
    plot.querySelectorAll('.main-svg, .legend').forEach(el => {
      const r = el.getBoundingClientRect();
      if (r.bottom > card.bottom + 1 || r.right > card.right + 1 || r.top < card.top - 1)
        out.push(['outside its card: ' + el.getAttribute('class'), plot.dataset.figure]);
    });
    const legend = plot.querySelector('.legend');
    const ticks = Array.from(plot.querySelectorAll('.xtick text, .ytick text, .g-xtitle, .g-ytitle, .bartext, .annotation-text'));
    ticks.forEach(t => {
      const r = t.getBoundingClientRect();
      if (r.width === 0) return;
      if (r.left < box.left - 1 || r.right > box.right + 1)
        out.push(['label cut: ' + t.textContent, plot.dataset.figure]);
      if (legend) { const l = legend.getBoundingClientRect();
        const w = Math.min(l.right, r.right) - Math.max(l.left, r.left);
        const h = Math.min(l.bottom, r.bottom) - Math.max(l.top, r.top);
        if (w > 1 && h > 1) out.push(['legend over ' + t.textContent, plot.dataset.figure]); }
    });
  });
  return out;
}"""


@pytest.mark.parametrize("which", ["run", "restart", "run-resized"])
def test_at_phone_width_no_element_overlaps_another(browser, live_server, s2_run, owner, which):
    if which == "run-resized":  # opened on a laptop, then narrowed to a phone's width
        page, errors = signed_in(browser, live_server, owner)
        page.goto(f"{live_server.url}/runs/{s2_run.pk}/")
        wait_charts(page)
        page.set_viewport_size({"width": 390, "height": 844})
        page.wait_for_timeout(600)
        which = "run"
    else:
        page, errors = signed_in(browser, live_server, owner,
                                 viewport={"width": 390, "height": 844}, is_mobile=True,
                                 has_touch=True)
    url = f"{live_server.url}/runs/{s2_run.pk}/" + ("restarts/1/" if which == "restart" else "")
    if page.url != url:
        page.goto(url)
    if which == "run":
        wait_charts(page)
        # the mode bar is hidden on a phone and chart titles are the page's, above each plot
        assert page.locator(".modebar-container .modebar").count() == 0 or \
            page.locator(".modebar").first.is_hidden()
        assert page.locator(".chart-title").count() == 7
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert page.evaluate(OVERLAPS) == []
    # a table wider than the phone scrolls inside its box and says so
    wide = page.evaluate("""() => Array.from(document.querySelectorAll('.table-wrap')).filter(
        w => w.scrollWidth > w.clientWidth + 1).map(w => [w.classList.contains('scrolls'),
        !!(w.nextElementSibling && w.nextElementSibling.classList.contains('scroll-hint') &&
           w.nextElementSibling.offsetHeight > 0)])""")
    assert all(flags == [True, True] for flags in wide), wide
    assert errors == []


def test_no_console_error_on_any_page_of_a_restarted_run_and_of_a_run_with_no_generation(
        browser, live_server, s2_run, no_generation_run, owner):
    page, errors = signed_in(browser, live_server, owner)
    pages = ["/", "/alerts/", f"/runs/{s2_run.pk}/", f"/runs/{s2_run.pk}/restarts/1/",
             f"/runs/{s2_run.pk}/generations/g1250/", f"/runs/{s2_run.pk}/contract/",
             f"/runs/{no_generation_run.pk}/", f"/runs/{no_generation_run.pk}/contract/"]
    for path in pages:
        page.goto(live_server.url + path)
        if "/runs/" in path and path.count("/") == 3:
            wait_charts(page)
        for width in (1440, 390):
            page.set_viewport_size({"width": width, "height": 900})
            page.wait_for_timeout(250)
        page.set_viewport_size({"width": 1440, "height": 900})
        assert errors == [], (path, errors)
    page.goto(f"{live_server.url}/runs/{no_generation_run.pk}/")
    wait_charts(page)
    empty = page.locator("[data-figure=generations]")
    assert "is-empty" in empty.get_attribute("class")
    assert "No checkpoint reported yet" in empty.inner_text()


def test_local_time_is_shown_beside_utc_and_the_choice_is_remembered(browser, live_server,
                                                                     s2_run, owner):
    page, errors = signed_in(browser, live_server, owner, timezone_id="Europe/Berlin")
    page.goto(f"{live_server.url}/runs/{s2_run.pk}/generations/g1250/")
    stamp = page.locator("time.ts").first
    assert stamp.inner_text() == "2026-11-01 00:21:01 UTC (2026-11-01 01:21 GMT+1)"
    page.click("[data-time-toggle]")
    assert stamp.inner_text() == "2026-11-01 00:21:01 UTC"
    page.reload()
    assert page.locator("time.ts").first.inner_text() == "2026-11-01 00:21:01 UTC"
    assert errors == []
