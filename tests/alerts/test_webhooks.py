"""Webhook delivery against a local receiver: signatures, retries, permanent refusals."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from recoverydash.alerts.delivery import deliver, due_deliveries, process_flips
from recoverydash.alerts.models import Alert, Delivery, WebhookEndpoint
from recoverydash.alerts.transports import TransportError, check_address
from recoverydash.runs.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(project):
    return Run.objects.create(project=project, run_id="llama-70b")


def fire(run, rule="restart_omission", subject="1"):
    alert = Alert.objects.create(run=run, rule=rule, subject=subject,
                                 dedup_key=f"{run.run_id}:{rule}:{subject}", severity="critical",
                                 summary="Attempt 1 skipped 48 positions")
    from recoverydash.alerts.models import AlertFlip

    AlertFlip.objects.create(alert=alert, new_state="firing", reason="test")
    return alert


def make_due(delivery_pk):
    Delivery.objects.filter(pk=delivery_pk).update(next_attempt_at=timezone.now())


def test_it_signs_the_spec_body_per_standard_webhooks(run, receiver):
    endpoint = WebhookEndpoint.objects.create(project=run.project, url=receiver.url)
    fire(run)
    [pk] = process_flips()
    assert deliver(pk) == "delivered"
    [req] = receiver.requests
    body = Webhook(endpoint.secret).verify(req["body"], req["headers"])
    assert body["version"] == "1"
    assert body["status"] == "firing"
    assert body["alert"]["rule"] == "restart_omission"
    assert body["alert"]["state"] == "firing"
    assert body["run"]["run_id"] == "llama-70b"
    assert body["run"]["url"] == f"{settings.SITE_URL}/p/{run.project.name}/runs/llama-70b/"
    assert req["headers"]["webhook-id"] == Delivery.objects.get(pk=pk).webhook_id


def test_it_retries_after_500_with_the_same_webhook_id(run, receiver):
    WebhookEndpoint.objects.create(project=run.project, url=receiver.url)
    receiver.answers = [500, 503]
    fire(run)
    [pk] = process_flips()
    assert deliver(pk) == "pending"
    delivery = Delivery.objects.get(pk=pk)
    assert delivery.attempts == 1 and delivery.last_status_code == 500
    assert delivery.next_attempt_at > timezone.now()
    assert pk not in due_deliveries()  # backoff: not due yet
    make_due(pk)
    assert deliver(pk) == "pending"
    make_due(pk)
    assert deliver(pk) == "delivered"
    ids = {r["headers"]["webhook-id"] for r in receiver.requests}
    assert len(receiver.requests) == 3 and len(ids) == 1


def test_it_stops_after_410_and_disables_the_endpoint(run, receiver):
    endpoint = WebhookEndpoint.objects.create(project=run.project, url=receiver.url)
    receiver.answers = [410]
    fire(run)
    [pk] = process_flips()
    assert deliver(pk) == "failed"
    endpoint.refresh_from_db()
    assert endpoint.enabled is False
    assert "410" in endpoint.disabled_reason
    make_due(pk)
    assert deliver(pk) == "failed"
    assert len(receiver.requests) == 1
    fire(run, subject="2")
    assert process_flips() == []  # a disabled endpoint gets no new deliveries


def test_it_does_not_retry_a_400_but_keeps_the_error_on_the_endpoint(run, receiver):
    endpoint = WebhookEndpoint.objects.create(project=run.project, url=receiver.url)
    receiver.answers = [400]
    fire(run)
    [pk] = process_flips()
    assert deliver(pk) == "failed"
    endpoint.refresh_from_db()
    assert endpoint.enabled is True and endpoint.last_error.startswith("HTTP 400")


def test_it_sends_a_resolved_notification_once(run, receiver):
    WebhookEndpoint.objects.create(project=run.project, url=receiver.url)
    alert = fire(run)
    for pk in process_flips():
        deliver(pk)
    assert alert.change_state("resolved", reason="cleared") is not None
    assert alert.change_state("resolved", reason="cleared again") is None
    new = process_flips()
    assert len(new) == 1 and process_flips() == []
    deliver(new[0])
    statuses = [json.loads(r["body"])["status"] for r in receiver.requests]
    assert statuses == ["firing", "resolved"]


def test_it_claims_a_flip_once_even_when_processed_twice(run, receiver):
    WebhookEndpoint.objects.create(project=run.project, url=receiver.url)
    fire(run)
    assert len(process_flips()) == 1
    assert process_flips() == []
    assert Delivery.objects.count() == 1


def test_it_sends_nothing_for_a_silenced_alert(run, receiver):
    WebhookEndpoint.objects.create(project=run.project, url=receiver.url)
    alert = fire(run)
    process_flips()
    alert.silenced_until = timezone.now() + timedelta(hours=1)
    alert.save()
    alert.change_state("acknowledged", by="oncall")
    assert process_flips() == []


def test_it_shapes_slack_and_pagerduty_bodies(run, receiver):
    WebhookEndpoint.objects.create(project=run.project, url=receiver.url, kind="slack")
    WebhookEndpoint.objects.create(project=run.project, url=receiver.url, kind="pagerduty",
                                   routing_key="R0UT1NG0000000000000000000000000")
    fire(run)
    for pk in process_flips():
        assert deliver(pk) == "delivered"
    bodies = sorted((json.loads(r["body"]) for r in receiver.requests), key=lambda b: "text" in b)
    pagerduty, slack = bodies
    assert slack["text"].startswith("[FIRING] critical restart_omission on run llama-70b")
    assert pagerduty["event_action"] == "trigger"
    assert pagerduty["routing_key"] == "R0UT1NG0000000000000000000000000"
    assert pagerduty["dedup_key"] == "llama-70b:restart_omission:1"
    assert pagerduty["payload"]["severity"] == "critical"


def test_it_refuses_private_addresses_unless_allowed(settings):
    settings.RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE = False
    for url in ("http://127.0.0.1/x", "http://10.1.2.3/x", "http://[::1]/x",
                "http://169.254.169.254/latest"):
        with pytest.raises(TransportError) as info:
            check_address(url)
        assert info.value.permanent
    with pytest.raises(TransportError):
        check_address("ftp://example.com/x")
    check_address("http://127.0.0.1/x", allow_private=True)


def test_it_marks_a_delivery_to_a_refused_address_failed(run, settings):
    settings.RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE = False
    endpoint = WebhookEndpoint.objects.create(project=run.project, url="http://127.0.0.1:9/x")
    fire(run)
    [pk] = process_flips()
    assert deliver(pk) == "failed"
    endpoint.refresh_from_db()
    assert "127.0.0.1 is a loopback address" in endpoint.last_error
    assert "RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE=true" in endpoint.last_error
