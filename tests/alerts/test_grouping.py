"""One open alert per (run, rule) listing its subjects; flips carry the alert as it was."""

from __future__ import annotations

from datetime import timedelta

import pytest

from recoverydash.alerts.delivery import flip_payload, process_flips, transport_for
from recoverydash.alerts.models import Alert, AlertFlip, Delivery, RuleRunbook, WebhookEndpoint
from recoverydash.alerts.rules import evaluate_run, group_summary, natural_key
from recoverydash.runs.models import Analysis, Run
from tests.alerts.test_rules import T0, restart, result

pytestmark = pytest.mark.django_db

NOW = T0 + timedelta(minutes=5)


def rejected(*updates, code="stale_state"):
    return [{"generation_id": f"g{u}", "attempt": 0, "update": u, "status": "rejected",
             "reasons": [{"code": code, "detail": "x"}]} for u in updates]


def make_run(project, res, run_id="sgd"):
    run = Run.objects.create(project=project, run_id=run_id, first_event_at=T0,
                             last_received_at=NOW)
    Analysis.objects.create(run=run, result=res, health="at_risk")
    return Run.objects.select_related("analysis", "project").get(pk=run.pk)


def set_result(run, res):
    Analysis.objects.filter(run=run).update(result=res)
    return Run.objects.select_related("analysis", "project").get(pk=run.pk)


def test_it_groups_five_rejected_generations_into_one_alert_in_natural_order(project):
    # the order the analysis lists them in (40, 50, 60, 20, 30) is not the order shown
    res = result(generations=[result()["generations"][0]] + rejected(140, 150, 160, 120, 130))
    run = make_run(project, res)
    flips = evaluate_run(run, now=NOW)
    [alert] = Alert.objects.filter(run=run, rule="generation_rejected")
    assert [f.alert_id for f in flips] == [alert.pk]
    assert [s["subject"] for s in alert.subjects] == ["g120", "g130", "g140", "g150", "g160"]
    assert {s["kind"] for s in alert.subjects} == {"generation"}
    assert alert.summary == ("5 generations rejected: stale_state "
                             "(g120, g130, g140, g150, g160)")
    assert alert.dedup_key == "sgd:generation_rejected:" and alert.subject == "g120"


def test_it_keeps_one_alert_and_its_key_as_subjects_come_and_go(project):
    run = make_run(project, result(generations=rejected(20)))
    [opened] = [f for f in evaluate_run(run, now=NOW) if f.alert.rule == "generation_rejected"]
    alert = opened.alert
    assert alert.summary == "Generation g20 (update 20) is rejected: stale_state."
    run = set_result(run, result(generations=rejected(20, 30, 100)))
    [grew] = [f for f in evaluate_run(run, now=NOW) if f.alert.rule == "generation_rejected"]
    assert (grew.alert_id, grew.old_state, grew.new_state) == (alert.pk, "firing", "firing")
    assert grew.change == {"added": ["g30", "g100"], "removed": []}
    alert.refresh_from_db()
    assert [s["subject"] for s in alert.subjects] == ["g20", "g30", "g100"]
    assert alert.summary == "3 generations rejected: stale_state (g20, g30, g100)"
    assert alert.dedup_key == "sgd:generation_rejected:" and alert.subject == "g20"
    assert Alert.objects.filter(run=run, rule="generation_rejected").count() == 1
    # g20 superseded by nothing, but no longer rejected: the list follows what holds now
    run = set_result(run, result(generations=rejected(30)))
    evaluate_run(run, now=NOW)
    alert.refresh_from_db()
    assert [s["subject"] for s in alert.subjects] == ["g30"] and alert.state == "firing"
    run = set_result(run, result())
    [flip] = evaluate_run(run, now=NOW)
    assert flip.alert_id == alert.pk and flip.new_state == "resolved"


def test_it_adds_a_later_restart_to_the_open_event_alert_and_tells_each_restart_once(project):
    run = make_run(project, result(restarts=[restart(attempt=1, replayed=64, verdict="replay")]))
    [flip] = evaluate_run(run, now=NOW)
    alert = flip.alert
    assert alert.rule == "restart_replay" and [s["subject"] for s in alert.subjects] == ["1"]
    two = [restart(attempt=1, replayed=64, verdict="replay"),
           restart(attempt=2, replayed=32, verdict="replay")]
    run = set_result(run, result(restarts=two))
    [joined] = evaluate_run(run, now=NOW)  # the second restart is told on the open alert
    assert joined.alert_id == alert.pk and joined.change == {"added": ["2"], "removed": []}
    assert evaluate_run(run, now=NOW) == []
    alert.refresh_from_db()
    assert [s["subject"] for s in alert.subjects] == ["1", "2"]
    assert alert.summary == ("2 restarts replayed more than the contract allows "
                             "(attempts 1, 2)")
    alert.change_state("resolved", by="oncall")
    assert evaluate_run(run, now=NOW) == []  # both told; a person resolved them
    three = two + [restart(attempt=3, replayed=8, verdict="replay")]
    run = set_result(run, result(restarts=three))
    [again] = evaluate_run(run, now=NOW)
    assert again.alert_id != alert.pk and again.alert.dedup_key == alert.dedup_key
    assert [s["subject"] for s in again.alert.subjects] == ["3"]


def test_it_sends_each_flip_as_the_alert_was_at_that_flip(project, receiver):
    run = make_run(project, result(restarts=[restart(omitted=48, verdict="omission")]))
    WebhookEndpoint.objects.create(project=project, url=receiver.url)
    [opened] = evaluate_run(run, now=NOW)
    alert = opened.alert
    process_flips()
    alert.change_state("acknowledged", by="ana")
    process_flips()
    alert.change_state("resolved", by="ana")
    Alert.objects.filter(pk=alert.pk).update(summary="changed after the last flip")
    process_flips()  # each flip's body is the alert as it was at that flip
    bodies = {d.flip.new_state: d.payload for d in Delivery.objects.select_related("flip")
              .filter(flip__change__isnull=True)}
    assert bodies["firing"]["alert"]["state"] == "firing"
    assert bodies["acknowledged"]["alert"]["state"] == "acknowledged"
    assert bodies["acknowledged"]["alert"]["resolved_at"] is None
    assert bodies["resolved"]["alert"]["state"] == "resolved"
    assert bodies["firing"]["alert"]["subjects"] == ["1"]
    assert bodies["firing"]["alert"]["url"].endswith(f"/alerts/{alert.pk}/")


def test_it_keeps_pagerduty_and_alertmanager_keys_when_subjects_grow(project):
    run = make_run(project, result(generations=rejected(20)))
    evaluate_run(run, now=NOW)
    alert = Alert.objects.get(run=run, rule="generation_rejected")
    first = flip_payload(AlertFlip.objects.get(alert=alert))
    run = set_result(run, result(generations=rejected(20, 30, 40, 50, 60)))
    evaluate_run(run, now=NOW)
    alert.refresh_from_db()
    later = flip_payload(alert.change_state("acknowledged", by="ana"))
    assert later["alert"]["subjects"] == ["g20", "g30", "g40", "g50", "g60"]
    pd = WebhookEndpoint(project=project, url="https://events.pagerduty.com/v2/enqueue",
                         kind="pagerduty", routing_key="a" * 32)
    am = WebhookEndpoint(project=project, url="https://am.example/hook", kind="alertmanager")
    assert transport_for(pd).body(first)["dedup_key"] == \
        transport_for(pd).body(later)["dedup_key"] == "sgd:generation_rejected:"
    a1, a2 = transport_for(am).body(first), transport_for(am).body(later)
    assert a1["alerts"][0]["fingerprint"] == a2["alerts"][0]["fingerprint"]
    assert a1["groupKey"] == a2["groupKey"]
    assert a2["alerts"][0]["annotations"]["subjects"] == "g20, g30, g40, g50, g60"


def test_it_carries_the_projects_runbook_of_the_rule(project):
    run = make_run(project, result(generations=rejected(20)))
    RuleRunbook.objects.create(project=project, rule="generation_rejected",
                               url="https://wiki.example/runbooks/rejected")
    evaluate_run(run, now=NOW)
    flip = AlertFlip.objects.get(alert__rule="generation_rejected")
    assert flip_payload(flip)["alert"]["runbook_url"] == "https://wiki.example/runbooks/rejected"
    other = AlertFlip.objects.exclude(pk=flip.pk).first()
    assert other is None or flip_payload(other)["alert"]["runbook_url"] is None


def test_it_resolves_per_subject_alerts_stored_before_grouping(project):
    run = make_run(project, result(generations=rejected(20, 30)))
    old = Alert.objects.create(run=run, rule="generation_rejected", subject="g20",
                               dedup_key="sgd:generation_rejected:g20", severity="warning",
                               summary="old")
    flips = evaluate_run(run, now=NOW)
    old.refresh_from_db()
    assert old.state == "resolved"
    assert {(f.alert.dedup_key, f.new_state) for f in flips} >= {
        ("sgd:generation_rejected:g20", "resolved"), ("sgd:generation_rejected:", "firing")}


def test_it_orders_subjects_with_numbers_as_numbers():
    assert sorted(["g100", "g20", "g3"], key=natural_key) == ["g3", "g20", "g100"]
    items = [{"subject": f"g{i}", "summary": "s", "detail": "a, b" if i else "c"}
             for i in range(10)]
    assert group_summary("generation_rejected", items) == (
        "10 generations rejected: a, b, c (g0, g1, g2, g3, g4, g5, g6, g7, …)")
    assert group_summary("some_new_rule", items[:2]).startswith("2 subjects hold")
