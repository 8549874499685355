"""The fleet page: attention order, views, sorting, filters in the URL, pages, a fixed number of
queries."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from recoverydash.alerts.models import Alert
from recoverydash.dashboard import queries
from recoverydash.runs.models import Analysis, Attempt, Run

pytestmark = pytest.mark.django_db


def make(project, run_id, *, health="ok", age_s=60, alerts=(), ended=False, silent=False):
    now = timezone.now()
    run = Run.objects.create(project=project, run_id=run_id,
                             first_event_at=now - timedelta(hours=5),
                             last_received_at=now - timedelta(hours=2 if silent else 0, seconds=5))
    committed = (now - timedelta(seconds=age_s)).isoformat()
    Analysis.objects.create(run=run, health=health, result={
        "health": health, "first_event_at": run.first_event_at.isoformat(),
        "last_restorable": {"generation_id": "g1", "update": 1, "committed_at": committed},
        "restarts": []})
    Attempt.objects.create(run=run, attempt=0, ended_at=now if ended else None)
    for i, severity in enumerate(alerts):
        Alert.objects.create(run=run, rule=f"rule{i}", dedup_key=f"{run_id}:rule{i}:",
                             severity=severity, summary="x")
    return run


@pytest.fixture
def fleet(project):
    make(project, "a-ok")
    make(project, "b-five-warnings", alerts=["warning"] * 5)
    make(project, "c-critical", alerts=["critical"], health="failing")
    make(project, "d-stale", age_s=3 * 3600, health="at_risk")
    make(project, "e-ended", health="ended", ended=True, age_s=30)
    make(project, "f-silent", silent=True, age_s=50)


def ids(response):
    return [r.run.run_id for r in response.context["rows"]]


def test_it_puts_the_run_in_trouble_first_and_needs_attention_by_default(owner_client, fleet):
    assert ids(owner_client.get("/")) == ["c-critical", "b-five-warnings", "d-stale"]
    assert ids(owner_client.get("/", {"view": "all"})) == [
        "c-critical", "b-five-warnings", "d-stale", "a-ok", "f-silent", "e-ended"]


def test_it_shows_last_event_and_attempt_state(owner_client, fleet):
    rows = {r.run.run_id: r for r in owner_client.get("/", {"view": "all"}).context["rows"]}
    assert rows["a-ok"].attempt_state == "running" and rows["a-ok"].attempt == 0
    assert rows["e-ended"].attempt_state == "ended"
    assert rows["f-silent"].attempt_state == "silent"
    html = owner_client.get("/", {"view": "all"}).content.decode()
    assert "Last event" in html and 'data-state="silent"' in html


def test_it_sorts_by_any_column_both_ways_and_keeps_filters_in_links(owner_client, fleet):
    assert ids(owner_client.get("/", {"view": "all", "sort": "run"}))[:2] == ["a-ok",
                                                                              "b-five-warnings"]
    assert ids(owner_client.get("/", {"view": "all", "sort": "-run"}))[0] == "f-silent"
    assert ids(owner_client.get("/", {"view": "all", "sort": "age"}))[0] == "d-stale"
    assert ids(owner_client.get("/", {"view": "all", "sort": "alerts"}))[0] == "b-five-warnings"
    assert ids(owner_client.get("/", {"view": "all", "sort": "attempt"}))[-1] == "e-ended"
    html = owner_client.get("/", {"view": "all", "q": "o", "sort": "run"}).content.decode()
    assert 'href="?q=o&amp;view=all&amp;sort=-run"' in html  # reverse the current sort
    assert ids(owner_client.get("/", {"sort": "nonsense"})) == [
        "c-critical", "b-five-warnings", "d-stale"]


def test_it_pages_on_the_server_with_a_fixed_number_of_queries(owner_client, project):
    for i in range(queries.FLEET_PAGE_SIZE + 7):
        make(project, f"r{i:03d}", alerts=["warning"] if i % 2 else [])
    with CaptureQueriesContext(connection) as few:
        first = owner_client.get("/", {"view": "all", "sort": "run"})
    assert len(first.context["rows"]) == queries.FLEET_PAGE_SIZE
    second = owner_client.get("/", {"view": "all", "sort": "run", "page": 2})
    assert ids(second) == [f"r{i:03d}" for i in range(50, 57)]
    assert "Runs 51–57 of 57" in second.content.decode()
    for i in range(57, 120):
        make(project, f"r{i:03d}")
    with CaptureQueriesContext(connection) as more:
        owner_client.get("/", {"view": "all", "sort": "run"})
    assert len(more.captured_queries) == len(few.captured_queries)
    assert ids(owner_client.get("/", {"view": "all", "page": 99}))[0]  # clamped to the last


def test_it_says_when_nothing_needs_attention(owner_client, project):
    make(project, "calm")
    html = owner_client.get("/").content.decode()
    assert "Nothing needs attention" in html and "?view=all" in html


def test_it_keeps_drill_runs_out_of_the_attention_order(owner_client, fleet, project):
    assert queries.drill_field() == "is_drill"
    drill = make(project, "0-drill", alerts=["critical", "critical"], health="failing")
    Run.objects.filter(pk=drill.pk).update(is_drill=True)
    assert "0-drill" not in ids(owner_client.get("/"))
    everything = ids(owner_client.get("/", {"view": "all"}))
    assert everything[0] == "c-critical" and everything[-1] == "0-drill"


def test_a_search_in_needs_attention_says_how_many_matching_runs_the_view_hides(owner_client,
                                                                               project):
    make(project, "team-x-critical", alerts=["critical"], health="failing")
    make(project, "team-x-calm-1")
    make(project, "team-x-calm-2")
    make(project, "other-calm")
    r = owner_client.get("/?q=team-x")
    assert ids(r) == ["team-x-critical"]
    html = r.content.decode()
    assert 'data-hidden="2"' in html
    assert "2 more runs matching “team-x” need no attention and are not listed in this view" in html
    assert "Show all 3 matching runs" in html and "view=all" in html
    r = owner_client.get("/?q=team-x&view=all")  # the same search in the other view finds all
    assert sorted(ids(r)) == ["team-x-calm-1", "team-x-calm-2", "team-x-critical"]
    assert "data-hidden" not in r.content.decode()


def test_a_search_whose_runs_all_need_no_attention_names_them_in_the_empty_view(owner_client,
                                                                               project):
    make(project, "team-x-calm-1")
    make(project, "other-critical", alerts=["critical"], health="failing")
    html = owner_client.get("/?q=calm").content.decode()
    assert 'data-hidden="1"' in html
    assert "None of the 1 run matching “calm”" in html and "this view hides it" in html
    assert "Show the 1 matching run" in html
