"""A subject joining or leaving an open alert is a timeline entry (a flip keeping the state) and a
notification of the alert as it is then, under the same dedup key, to every receiver."""

from __future__ import annotations

import json
from datetime import timedelta
from urllib.parse import unquote

import pytest

from recoverydash.alerts.delivery import TRANSPORTS, deliver, flip_payload, process_flips
from recoverydash.alerts.models import Alert, Delivery, WebhookEndpoint
from recoverydash.alerts.rules import evaluate_run
from recoverydash.alerts.transports import bounded_key
from tests.alerts.test_grouping import NOW, make_run, rejected, set_result
from tests.alerts.test_receivers import GENIE_KEY, ROUTING_KEY, _kind_of, validate
from tests.alerts.test_rules import restart, result

from . import receiver_schemas as schemas

pytestmark = pytest.mark.django_db

FIVE = [120, 130, 140, 150, 160]
SIX = [*FIVE, 170]
KEYS = {"pagerduty": ROUTING_KEY, "opsgenie": GENIE_KEY}


def endpoints(project, url, **fields):
    for kind in TRANSPORTS:
        WebhookEndpoint.objects.create(project=project, url=url, kind=kind, name=kind,
                                       routing_key=KEYS.get(kind, ""), **fields)


def rejected_alert(run) -> Alert:
    return Alert.objects.get(run=run, rule="generation_rejected")


def grow_to_six(project):
    """A run whose open generation_rejected alert lists five generations, its opening flip
    already processed; then a sixth is rejected and the rules evaluated."""
    run = make_run(project, result(generations=rejected(*FIVE)))
    evaluate_run(run, now=NOW)
    process_flips()
    Delivery.objects.all().delete()
    run = set_result(run, result(generations=rejected(*SIX)))
    flips = evaluate_run(run, now=NOW + timedelta(minutes=1))
    return run, flips


def test_it_records_one_entry_and_sends_one_delivery_per_endpoint_when_a_sixth_joins(
        project, receiver):
    endpoints(project, receiver.url)
    run, flips = grow_to_six(project)
    alert = rejected_alert(run)
    [flip] = flips
    assert (flip.alert_id, flip.old_state, flip.new_state) == (alert.pk, "firing", "firing")
    assert flip.change == {"added": ["g170"], "removed": []}
    assert flip.reason == "subjects changed: added g170 (6 subjects now)"
    assert flip.notify is True
    assert flip.snapshot["subjects"] == ["g120", "g130", "g140", "g150", "g160", "g170"]
    assert flip.snapshot["summary"] == ("6 generations rejected: stale_state "
                                        "(g120, g130, g140, g150, g160, g170)")
    assert alert.flips.count() == 2  # opened, then the sixth joined
    created = process_flips()
    assert len(created) == len(TRANSPORTS) == 7  # one endpoint of each kind
    deliveries = Delivery.objects.filter(flip=flip)
    assert {d.endpoint.kind for d in deliveries} == set(TRANSPORTS)
    for d in deliveries:
        assert d.payload["status"] == "firing"
        assert d.payload["dedup_key"] == "sgd:generation_rejected:"
        assert d.payload["change"] == {"added": ["g170"], "removed": []}
        assert len(d.payload["alert"]["subjects"]) == 6
        assert d.payload["alert"]["subject"] == "g120"  # the labels receivers key on stay
    for pk in created:
        assert deliver(pk) == "delivered"
    assert len(receiver.requests) == 7  # one request per endpoint


def test_it_records_nothing_more_when_the_same_evaluation_runs_again(project):
    run, _ = grow_to_six(project)
    assert evaluate_run(run, now=NOW + timedelta(minutes=2)) == []
    assert evaluate_run(run, now=NOW + timedelta(minutes=3)) == []
    assert rejected_alert(run).flips.count() == 2
    # words refined by a later analysis, the same six subjects: no entry either
    run = set_result(run, result(generations=rejected(*SIX, code="shard_missing")))
    assert evaluate_run(run, now=NOW + timedelta(minutes=4)) == []
    assert rejected_alert(run).flips.count() == 2


def test_it_records_a_subject_leaving_while_others_still_hold(project):
    run = make_run(project, result(generations=rejected(20, 30, 40)))
    evaluate_run(run, now=NOW)
    run = set_result(run, result(generations=rejected(20, 40)))
    [flip] = evaluate_run(run, now=NOW + timedelta(minutes=1))
    assert (flip.old_state, flip.new_state) == ("firing", "firing")
    assert flip.change == {"added": [], "removed": ["g30"]}
    assert flip.reason == "subjects changed: removed g30 (2 subjects now)"
    assert flip_payload(flip)["alert"]["subjects"] == ["g20", "g40"]
    run = set_result(run, result(generations=rejected(40, 50)))
    [flip] = evaluate_run(run, now=NOW + timedelta(minutes=2))
    assert flip.change == {"added": ["g50"], "removed": ["g20"]}
    assert flip.reason == "subjects changed: added g50; removed g20 (2 subjects now)"
    run = set_result(run, result())
    [flip] = evaluate_run(run, now=NOW + timedelta(minutes=3))
    assert (flip.old_state, flip.new_state, flip.change) == ("firing", "resolved", None)


def test_it_records_a_second_restart_replaying_on_the_open_event_alert(project):
    replay = {"verdict": "replay", "findings": [{"code": "replay", "detail": ""}]}
    run = make_run(project, result(restarts=[restart(replayed=64, **replay)]))
    evaluate_run(run, now=NOW)
    alert = Alert.objects.get(run=run, rule="restart_replay")
    run = set_result(run, result(restarts=[restart(replayed=64, **replay),
                                           restart(attempt=2, replayed=96, **replay)]))
    [flip] = evaluate_run(run, now=NOW + timedelta(minutes=1))
    assert flip.alert_id == alert.pk and flip.change == {"added": ["2"], "removed": []}
    assert flip.snapshot["subjects"] == ["1", "2"]
    assert evaluate_run(run, now=NOW + timedelta(minutes=2)) == []


def test_it_records_the_entry_of_a_silenced_alert_but_sends_nothing(project, receiver):
    endpoints(project, receiver.url)
    run = make_run(project, result(generations=rejected(*FIVE)))
    evaluate_run(run, now=NOW)
    process_flips()
    Alert.objects.filter(run=run).update(silenced_until=NOW + timedelta(days=3650))
    run = set_result(run, result(generations=rejected(*SIX)))
    [flip] = evaluate_run(run, now=NOW + timedelta(minutes=1))
    assert flip.notify is False and flip.change == {"added": ["g170"], "removed": []}
    assert process_flips() == []
    assert not Delivery.objects.filter(flip=flip).exists()
    flip.refresh_from_db()
    assert flip.processed_at is not None


def test_it_sends_the_change_only_to_endpoints_wanting_the_alerts_severity(project, receiver):
    WebhookEndpoint.objects.create(project=project, url=receiver.url, name="pager",
                                   min_severity="critical")
    WebhookEndpoint.objects.create(project=project, url=receiver.url, name="all")
    _, [flip] = grow_to_six(project)
    process_flips()
    assert [d.endpoint.name for d in Delivery.objects.filter(flip=flip)] == ["all"]


def test_it_keeps_an_acknowledged_alert_acknowledged_when_it_gains_a_subject(project):
    run = make_run(project, result(generations=rejected(*FIVE)))
    evaluate_run(run, now=NOW)
    rejected_alert(run).change_state("acknowledged", by="ana")
    run = set_result(run, result(generations=rejected(*SIX)))
    [flip] = evaluate_run(run, now=NOW + timedelta(minutes=1))
    alert = rejected_alert(run)
    assert alert.state == "acknowledged" and alert.acknowledged_by == "ana"
    assert (flip.old_state, flip.new_state) == ("acknowledged", "acknowledged")
    payload = flip_payload(flip)
    assert payload["status"] == "acknowledged" and payload["alert"]["state"] == "acknowledged"
    pd = TRANSPORTS["pagerduty"](WebhookEndpoint(kind="pagerduty", routing_key=ROUTING_KEY))
    body = pd.body(payload)
    validate(schemas.PAGERDUTY_TRIGGER, body)
    assert body["event_action"] == "trigger" and body["dedup_key"] == "sgd:generation_rejected:"
    am = TRANSPORTS["alertmanager"](WebhookEndpoint(kind="alertmanager", name="am"))
    [item] = am.body(payload)["alerts"]
    assert item["status"] == "firing" and item["annotations"]["state"] == "acknowledged"


def test_it_sends_each_receiver_a_schema_valid_update_under_the_same_key(project, receiver):
    endpoints(project, receiver.url)
    run = make_run(project, result(generations=rejected(*FIVE)))
    evaluate_run(run, now=NOW)
    for pk in process_flips():
        assert deliver(pk) == "delivered"
    run = set_result(run, result(generations=rejected(*SIX)))
    evaluate_run(run, now=NOW + timedelta(minutes=1))
    for pk in process_flips():
        assert deliver(pk) == "delivered"
    seen: dict[str, list] = {}
    for request in receiver.requests:
        body = json.loads(request["body"])
        seen.setdefault(_kind_of(body, request), []).append((request["path"], body))
    assert sorted(seen) == sorted(TRANSPORTS) and all(len(v) == 2 for v in seen.values())
    key = "sgd:generation_rejected:"

    (_, opened), (_, grew) = seen["standard"]
    assert grew["status"] == "firing" and grew["dedup_key"] == opened["dedup_key"] == key
    assert opened["change"] is None
    assert grew["change"] == {"added": ["g170"], "removed": []}
    assert grew["alert"]["subjects"] == ["g120", "g130", "g140", "g150", "g160", "g170"]

    (_, opened), (_, grew) = seen["pagerduty"]
    validate(schemas.PAGERDUTY_TRIGGER, grew)
    assert grew["event_action"] == "trigger"
    assert grew["dedup_key"] == opened["dedup_key"] == bounded_key(key, 255)
    assert grew["payload"]["custom_details"]["change"] == {"added": ["g170"], "removed": []}
    assert len(grew["payload"]["custom_details"]["subjects"]) == 6
    assert grew["payload"]["summary"].startswith("[FIRING, UPDATED] warning generation_rejected")

    (_, opened), (_, grew) = seen["alertmanager"]
    validate(schemas.ALERTMANAGER, grew)
    assert grew["status"] == "firing"
    assert grew["alerts"][0]["fingerprint"] == opened["alerts"][0]["fingerprint"]
    assert grew["groupKey"] == opened["groupKey"]
    annotations = grew["alerts"][0]["annotations"]
    assert annotations["subjects"] == "g120, g130, g140, g150, g160, g170"
    assert annotations["subjects_added"] == "g170" and "subjects_removed" not in annotations
    assert "subjects_added" not in opened["alerts"][0]["annotations"]

    (_, opened), (_, grew) = seen["slack"]
    validate(schemas.SLACK, grew)
    section = grew["blocks"][0]["text"]["text"]
    assert section.startswith("*[FIRING, UPDATED] warning* generation_rejected on run sgd\n"
                              "Subjects added g170.\n6 generations rejected")

    (path, opened), (grew_path, grew) = seen["opsgenie"]
    validate(schemas.OPSGENIE_CREATE, opened)
    validate(schemas.OPSGENIE_FOLLOW_UP, grew)
    assert path == "/hook"
    note_path, _, query = grew_path.partition("?")
    assert query == "identifierType=alias" and note_path.endswith("/notes")
    assert unquote(note_path.removeprefix("/hook/").removesuffix("/notes")) == opened["alias"]
    assert "Subjects added g170." in grew["note"]

    (_, opened), (_, grew) = seen["teams"]
    validate(schemas.TEAMS, grew)
    card = grew["attachments"][0]["content"]
    assert card["body"][0]["text"] == "recoverydash: firing, updated"
    facts = [[i["text"] for i in b["inlines"]] for b in card["body"]
             if b["type"] == "RichTextBlock"]
    assert ["Subjects added: ", "g170"] in facts


def test_it_shows_the_change_on_the_alert_page_timeline(project, client, django_user_model):
    from recoverydash.runs.models import Membership

    run, _ = grow_to_six(project)
    user = django_user_model.objects.create_user("ana", password="pw")
    Membership.objects.create(project=project, user=user)
    client.force_login(user)
    page = client.get(f"/alerts/{rejected_alert(run).pk}/").content.decode()
    assert 'data-kind="subjects"' in page
    assert "subjects changed: added g170 (6 subjects now)" in page
