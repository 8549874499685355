"""The on-call habits of issue 31 through the server: pausing a run's monitoring (page and admin
API, audited, no page while paused, resumed by the run's next event), notes and owners of
alerts, alert filters by run, rule, severity and owner, the change log across runs, and runs
compared side by side with the core's numbers."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from recoverydash.alerts.models import Alert, AlertFlip, AlertNote
from recoverydash.runs.models import Analysis, ApiToken, MonitoringChange, Run

pytestmark = pytest.mark.django_db


def _pause_url(run, action):
    return reverse("run_pause", args=[run.project.name, run.run_id, action])


def _stale(run):
    """Make the run's last restorable generation older than twice its limit: checkpoint_stale
    holds (critical) at the next evaluation."""
    analysis = Analysis.objects.get(run=run)
    old = (timezone.now() - timedelta(hours=3)).isoformat()
    analysis.result = dict(analysis.result, ended_at=None, health="at_risk",
                           last_restorable=dict(analysis.result["last_restorable"],
                                                committed_at=old))
    analysis.health = "at_risk"
    analysis.save()


def test_a_paused_run_pages_nobody_shows_paused_and_resumes_on_its_next_event(
        owner_client, known_run):
    from recoverydash.alerts.rules import evaluate_run

    _stale(known_run)
    r = owner_client.post(_pause_url(known_run, "pause"), {"note": "stopped for the weekend"})
    assert r.status_code == 302
    known_run.refresh_from_db()
    assert known_run.is_paused and known_run.paused_by == "olivia"
    change = MonitoringChange.objects.get(run=known_run)
    assert (change.paused, change.by, change.note) == (True, "olivia", "stopped for the weekend")
    html = owner_client.get(reverse("run", args=["alpha", known_run.run_id])).content.decode()
    assert "Monitoring paused by olivia" in html and "Resume monitoring" in html
    fleet = owner_client.get("/?view=all").content.decode()
    assert "⏸ paused" in fleet
    assert "s2-omission" not in [r.run.run_id for r in
                                 owner_client.get("/").context["rows"] or []]

    before = AlertFlip.objects.count()
    run = Run.objects.select_related("analysis", "project").get(pk=known_run.pk)
    assert evaluate_run(run) == []  # paused: checkpoint_stale does not open, nothing is sent
    assert AlertFlip.objects.count() == before
    assert not Alert.objects.filter(run=known_run, rule="checkpoint_stale").exists()

    Run.objects.filter(pk=known_run.pk).update(last_received_at=timezone.now())  # an event
    run = Run.objects.select_related("analysis", "project").get(pk=known_run.pk)
    flips = evaluate_run(run)
    assert "checkpoint_stale" in {f.alert.rule for f in flips if f.new_state == "firing"}
    known_run.refresh_from_db()
    assert not known_run.is_paused and known_run.paused_at is None
    resumed = MonitoringChange.objects.filter(run=known_run).order_by("pk").last()
    assert (resumed.paused, resumed.by) == (False, "")
    assert resumed.note == "an event was received: monitoring resumed"


def test_the_resume_button_resumes_and_is_audited(owner_client, known_run):
    owner_client.post(_pause_url(known_run, "pause"))
    owner_client.post(_pause_url(known_run, "resume"), {"note": "back on"})
    known_run.refresh_from_db()
    assert not known_run.is_paused
    assert [(c.paused, c.by, c.note) for c in MonitoringChange.objects.order_by("pk")] == [
        (True, "olivia", ""), (False, "olivia", "back on")]
    assert owner_client.post(_pause_url(known_run, "explode")).status_code == 404


def test_the_admin_api_pauses_and_resumes_a_run(client, known_run, project, other_project):
    admin = ApiToken.issue(project, ["admin"], name="ops")[1]
    url = f"/api/v1/runs/{known_run.run_id}/pause"

    def post(path, token, body=None):
        return client.post(path, json.dumps(body or {}), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {token}")

    r = post(url, admin, {"note": "maintenance"})
    assert r.status_code == 200, r.content
    assert r.json()["changed"] is True and r.json()["paused"] is True
    assert r.json()["paused_by"] == "token ops"
    assert post(url, admin).json()["changed"] is False  # already paused
    r = post(f"/api/v1/runs/{known_run.run_id}/resume", admin)
    assert (r.json()["changed"], r.json()["paused"]) == (True, False)
    assert [(c.paused, c.by, c.note) for c in MonitoringChange.objects.order_by("pk")] == [
        (True, "token ops", "maintenance"), (False, "token ops", "")]
    reader = ApiToken.issue(project, ["read"])[1]
    assert post(url, reader).status_code == 403
    stranger = ApiToken.issue(other_project, ["admin"])[1]
    assert post(url, stranger).status_code == 404


def test_an_alert_takes_notes_and_an_owner_shown_on_its_page_and_in_the_list(
        owner_client, teammate, known_run):
    alert = Alert.objects.get(run=known_run)
    r = owner_client.post(reverse("alert_note", args=[alert.pk]),
                          {"text": "loader state file was not on the shared disk"})
    assert r.status_code == 302
    owner_client.post(reverse("alert_assign", args=[alert.pk]), {"owner": teammate.username})
    alert.refresh_from_db()
    assert alert.assigned_to == teammate.username
    assert [(n.kind, n.author, n.text) for n in AlertNote.objects.order_by("pk")] == [
        ("note", "olivia", "loader state file was not on the shared disk"),
        ("assigned", "olivia", teammate.username)]
    page = owner_client.get(reverse("alert_detail", args=[alert.pk])).content.decode()
    assert "olivia</strong> noted: <span class=\"note-text\">loader state file" in page
    assert f"assigned it to <strong>{teammate.username}</strong>" in page
    listed = owner_client.get(reverse("alerts")).content.decode()
    assert f"assigned to <strong>{teammate.username}</strong>" in listed
    # the same owner again changes nothing; an outsider of the project cannot own it
    owner_client.post(reverse("alert_assign", args=[alert.pk]), {"owner": teammate.username})
    owner_client.post(reverse("alert_assign", args=[alert.pk]), {"owner": "mallory"})
    assert AlertNote.objects.count() == 2
    assert owner_client.post(reverse("alert_note", args=[alert.pk]), {"text": " "}).status_code \
        == 302 and AlertNote.objects.count() == 2


def test_alerts_filter_by_run_rule_severity_and_owner(owner_client, known_run, project):
    other = Run.objects.create(project=project, run_id="b-other")
    Alert.objects.create(run=other, rule="checkpoint_stale", dedup_key="b-other:checkpoint_stale:",
                         severity="warning", summary="old", assigned_to="olivia")

    def rules(**query):
        r = owner_client.get(reverse("alerts"), query)
        return sorted((a.run.run_id, a.rule) for a in r.context["alerts"]), r

    assert len(rules()[0]) == 2
    assert rules(run="s2")[0] == [("s2-omission", "restart_omission")]
    assert rules(rule="checkpoint_stale")[0] == [("b-other", "checkpoint_stale")]
    assert rules(severity="critical")[0] == [("s2-omission", "restart_omission")]
    found, r = rules(owner="me")
    assert found == [("b-other", "checkpoint_stale")]
    assert rules(owner="none")[0] == [("s2-omission", "restart_omission")]
    html = r.content.decode()
    assert "assigned to you" in html and 'data-live="/alerts/?owner=me&amp;state=open"' in html
    assert r.context["counts"]["open"] == 1  # the tabs count under the same filters


def test_the_change_log_lists_flips_acks_notes_pauses_restarts_and_rejections(
        owner_client, known_run, outsider):
    from recoverydash.alerts.actions import acknowledge, add_note
    from recoverydash.runs import monitoring

    alert = Alert.objects.get(run=known_run)
    AlertFlip.objects.create(alert=alert, old_state="", new_state="firing",
                             reason=alert.summary)
    acknowledge(alert, "olivia")
    add_note(alert, "olivia", "on it")
    monitoring.pause(known_run, "olivia", "drill next")
    rows = owner_client.get(reverse("changes")).context["rows"]
    seen = {(c.kind, c.who, c.what.split(":")[0]) for c in rows}
    assert ("acks", "olivia", "restart_omission acknowledged") in seen
    assert ("alerts", "recoverydash", "restart_omission opened (critical)") in seen
    assert ("notes", "olivia", "note on restart_omission") in seen
    assert ("monitoring", "olivia", "monitoring paused") in seen
    assert ("restarts", "the trainer", "attempt 1 started, resumed from g1250 on 8 ranks") \
        in {(c.kind, c.who, c.what) for c in rows}
    assert ("rejections", "recoverydash", "generation g1255 (update 1,255) rejected") in seen
    assert [c.at for c in rows] == sorted((c.at for c in rows), reverse=True)
    acks = owner_client.get(reverse("changes"), {"kind": "acks"}).context["rows"]
    assert [c.what for c in acks] == ["restart_omission acknowledged"]
    assert owner_client.get(reverse("changes"), {"run": "nope"}).context["rows"] == []
    c = Client()
    c.force_login(outsider)
    assert c.get(reverse("changes")).context["rows"] == []


def test_the_compare_page_puts_two_runs_on_shared_axes_with_the_cores_numbers(
        owner_client, known_run, project, known_result):
    twin = Run.objects.create(project=project, run_id="s2-twin",
                              first_event_at=known_run.first_event_at)
    Analysis.objects.create(run=twin, health="ok", result=dict(known_result, restarts=[],
                            costs=dict(known_result["costs"], goodput=0.5)))
    r = owner_client.get(reverse("compare"), {"runs": ["alpha/s2-omission", "alpha/s2-twin",
                                                       "beta/hidden", "alpha/s2-twin"]})
    items = r.context["items"]
    assert [i.run.run_id for i in items] == ["s2-omission", "s2-twin"]
    figures = r.context["figures"]
    risk = [t["name"] for t in figures["risk"]["data"]]
    assert risk[:2] == ["s2-omission", "s2-twin"]
    goodput = figures["goodput"]["data"][0]
    assert goodput["x"] == ["s2-omission", "s2-twin"]
    assert goodput["y"] == [round(100 * known_result["costs"]["goodput"], 2), 50.0]
    bars = {t["name"]: t for t in figures["restarts"]["data"]}
    restart = known_result["restarts"][0]
    assert bars["omitted"]["x"] == ["s2-omission · attempt 1"]
    assert bars["omitted"]["y"] == [restart["omitted"]] and bars["replayed"]["y"] == [
        restart["replayed"]]
    html = r.content.decode()
    assert "a run you cannot see or that does not exist is left out" in html
    one = owner_client.get(reverse("compare"), {"runs": ["alpha/s2-omission"]})
    assert one.context["figures"] == {} and "Choose at least one more run" in \
        one.content.decode()
