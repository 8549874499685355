"""Poison in the periodic delivery task: one flip whose deliveries cannot be made, or one delivery
that fails in an unexpected way, never stops the notifications of other runs."""

from __future__ import annotations

import pytest

from recoverydash.alerts import delivery
from recoverydash.alerts.models import Alert, AlertFlip, Delivery, WebhookEndpoint
from recoverydash.runs.models import Run

pytestmark = pytest.mark.django_db


def fire(run):
    alert = Alert.objects.create(run=run, rule="restart_omission", subject="1",
                                 dedup_key=f"{run.run_id}:restart_omission:1",
                                 severity="critical", summary="Attempt 1 skipped 48 positions")
    return AlertFlip.objects.create(alert=alert, new_state="firing", reason="test")


@pytest.fixture
def two_runs(project, receiver, settings):
    settings.RECOVERYDASH_ALERT_GROUP_WAIT_S = 0  # the flips are due at once
    WebhookEndpoint.objects.create(project=project, url=receiver.url)
    poisoned = Run.objects.create(project=project, run_id="poisoned")
    healthy = Run.objects.create(project=project, run_id="healthy")
    return fire(poisoned), fire(healthy)


def test_a_flip_whose_payload_fails_is_left_for_the_next_pass_and_the_next_flip_is_sent(
        two_runs, receiver, monkeypatch, caplog):
    bad, good = two_runs
    real = delivery.flip_payload

    def payload(flip, *args):
        if flip.pk == bad.pk:
            raise KeyError("restarts")
        return real(flip, *args)

    monkeypatch.setattr(delivery, "flip_payload", payload)
    assert delivery.deliver_due() == 1
    assert [d.flip_id for d in Delivery.objects.all()] == [good.pk]
    assert Delivery.objects.get().status == "delivered"
    assert [r["path"] for r in receiver.requests] == ["/hook"]
    bad.refresh_from_db()
    assert bad.processed_at is None  # nothing claimed, nothing lost
    assert f"alert flip {bad.pk}: deliveries not created" in caplog.text

    monkeypatch.setattr(delivery, "flip_payload", real)
    assert delivery.deliver_due() == 1
    assert sorted(Delivery.objects.values_list("flip_id", "status")) == [
        (bad.pk, "delivered"), (good.pk, "delivered")]
    assert len(receiver.requests) == 2


def test_a_delivery_that_fails_unexpectedly_does_not_stop_the_others(two_runs, receiver,
                                                                       monkeypatch, caplog):
    bad, good = two_runs
    created = delivery.process_flips()
    assert len(created) == 2
    bad_delivery = Delivery.objects.get(flip=bad).pk
    real = delivery.deliver

    def deliver(pk):
        if pk == bad_delivery:
            raise RuntimeError("database row vanished")
        return real(pk)

    monkeypatch.setattr(delivery, "deliver", deliver)
    assert delivery.deliver_due() == 2
    assert dict(Delivery.objects.values_list("flip_id", "status")) == {
        bad.pk: "pending", good.pk: "delivered"}
    assert len(receiver.requests) == 1
    assert f"webhook delivery {bad_delivery}: not sent" in caplog.text
