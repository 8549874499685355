"""The alerts page: the Open list holds firing and acknowledged alerts, bulk actions, the alert
page's timeline and deep links, runbooks, and a refused webhook URL saying why."""

from __future__ import annotations

import pytest
from django.urls import reverse

from recoverydash.alerts.models import Alert, RuleRunbook, WebhookEndpoint
from recoverydash.runs.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def alerts(project):
    run = Run.objects.create(project=project, run_id="sgd")
    made = []
    for rule, subjects, kind in (("generation_rejected", ["g20", "g30"], "generation"),
                                 ("restart_replay", ["1"], "restart"),
                                 ("checkpoint_stale", [""], "run")):
        a = Alert.objects.create(run=run, rule=rule, subject=subjects[0],
                                 subjects=[{"subject": s, "kind": kind, "severity": "warning",
                                            "summary": "x", "detail": ""} for s in subjects],
                                 dedup_key=f"sgd:{rule}:", severity="warning", summary=rule)
        made.append(a)
    return made


def test_it_acts_on_ticked_alerts_in_bulk_and_keeps_acknowledged_ones_open(owner_client, alerts):
    rejected, replay, stale = alerts
    response = owner_client.post(reverse("alert_bulk"), {
        "ids": [rejected.pk, replay.pk], "action": "acknowledge", "next": "/alerts/?state=open"})
    assert response.status_code == 302 and response["Location"] == "/alerts/?state=open"
    page = owner_client.get(reverse("alerts"))
    assert {a.pk: a.state for a in page.context["alerts"]} == {
        rejected.pk: "acknowledged", replay.pk: "acknowledged", stale.pk: "firing"}
    assert page.context["counts"] == {"open": 3, "firing": 1, "acknowledged": 2, "resolved": 0}
    owner_client.post(reverse("alert_bulk"), {"ids": [replay.pk, stale.pk], "action": "silence",
                                              "seconds": 3600})
    assert Alert.objects.filter(silenced_until__isnull=False).count() == 2
    owner_client.post(reverse("alert_bulk"), {"ids": [a.pk for a in alerts],
                                              "action": "resolve"})
    assert set(Alert.objects.values_list("state", flat=True)) == {"resolved"}
    assert [f.new_state for f in rejected.flips.order_by("pk")] == ["acknowledged", "resolved"]


def test_it_leaves_out_alerts_of_other_projects(client, outsider, alerts):
    client.force_login(outsider)
    client.post(reverse("alert_bulk"), {"ids": [alerts[0].pk], "action": "resolve"})
    assert Alert.objects.get(pk=alerts[0].pk).state == "firing"
    assert client.get(reverse("alert_detail", args=[alerts[0].pk])).status_code == 404


def test_it_links_each_subject_and_the_rules_runbook(owner_client, alerts, project):
    rejected, replay, _ = alerts
    RuleRunbook.objects.create(project=project, rule="restart_replay",
                               url="https://wiki.example/replay")
    html = owner_client.get(reverse("alerts")).content.decode()
    run = rejected.run
    assert f'href="{reverse("generation", args=[run.project.name, run.run_id, "g20"])}"' in html
    assert f'href="{reverse("generation", args=[run.project.name, run.run_id, "g30"])}"' in html
    assert f'href="{reverse("restart", args=[run.project.name, run.run_id, 1])}"' in html
    assert 'href="https://wiki.example/replay"' in html
    replay.change_state("acknowledged", by="olivia")
    detail = owner_client.get(reverse("alert_detail", args=[replay.pk])).content.decode()
    assert 'id="timeline"' in detail and "acknowledged by olivia" in detail


def test_it_saves_and_removes_a_runbook_from_the_project_page(owner_client, project):
    url = reverse("runbook_save", args=[project.pk])
    owner_client.post(url, {"rule": "generation_rejected", "url": "https://wiki.example/r"})
    assert RuleRunbook.objects.get(project=project).url == "https://wiki.example/r"
    page = owner_client.get(reverse("project", args=[project.pk])).content.decode()
    assert "https://wiki.example/r" in page
    owner_client.post(url, {"rule": "generation_rejected", "url": ""})
    assert not RuleRunbook.objects.exists()


def test_it_refuses_a_loopback_webhook_url_naming_the_setting(owner_client, project):
    response = owner_client.post(reverse("webhook_create", args=[project.pk]), {
        "name": "local", "url": "http://127.0.0.1:9000/hook", "kind": "standard",
        "min_severity": "info"})
    assert response.status_code == 200 and not WebhookEndpoint.objects.exists()
    errors = " ".join(response.context["webhook_form"].errors["url"])
    assert "127.0.0.1" in errors and "RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE" in errors


def test_the_alerts_page_shows_how_often_each_alerts_rule_flapped_on_its_run(owner_client,
                                                                             alerts):
    rejected, replay, stale = alerts
    # two earlier episodes of generation_rejected on the same run flapped 1 and 2 times
    for flaps in (1, 2):
        Alert.objects.create(run=rejected.run, rule="generation_rejected", subject="g10",
                             dedup_key="sgd:generation_rejected:", severity="warning",
                             summary="earlier", state="resolved", flaps=flaps)
    page = owner_client.get(reverse("alerts"))
    assert {a.rule: a.rule_flaps for a in page.context["alerts"]} == {
        "generation_rejected": 3, "restart_replay": 0, "checkpoint_stale": 0}
    html = page.content.decode()
    assert ('<div class="alert-flaps flapped" title="Times generation_rejected cleared on this '
            'run on a fact already there when it was told (docs/definitions.md#flaps)">'
            '<span class="num">3</span> flaps</div>') in html
    assert '<span class="num">0</span> flaps</div>' in html
    # the resolved list counts them too; the run page's alert rows have no flap column
    resolved = owner_client.get(reverse("alerts") + "?state=resolved")
    assert [a.rule_flaps for a in resolved.context["alerts"]] == [3, 3]
