"""Alertmanager's habit of a short group wait (RECOVERYDASH_ALERT_GROUP_WAIT_S): an alert's flips
within the wait of its first one not sent yet go out as one notification of the alert as it is
then, so a burst of evidence makes one page; an alert that opened and cleared within it is never
sent."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from recoverydash.alerts import evaluation
from recoverydash.alerts.delivery import process_flips
from recoverydash.alerts.models import AlertFlip, Delivery, WebhookEndpoint
from recoverydash.alerts.rules import evaluate_run
from recoverydash.runs.queue import NOTIFY_FLIPS
from tests.alerts.test_grouping import make_run, rejected, set_result
from tests.alerts.test_rules import result

pytestmark = pytest.mark.django_db

WAIT = 0.5


def burst(project, *steps):
    """Evaluate the run at ``steps`` (lists of rejected updates) one after the other, 0.1 s
    apart, from now; returns the run and the time of the first evaluation."""
    WebhookEndpoint.objects.create(project=project, url="https://hooks.example/a", name="a")
    t0 = timezone.now()
    run = make_run(project, result(generations=rejected(*steps[0])))
    for i, updates in enumerate(steps):
        run = set_result(run, result(generations=rejected(*updates)))
        evaluate_run(run, now=t0 + timedelta(seconds=0.1 * i))
    return run, t0


def sent():
    """What the endpoint was sent of the run's generation_rejected alert (its other alerts,
    checkpoint_stale and run_silent of the stored result's old times, are not looked at)."""
    return [(d.flip.new_state, d.payload["status"], d.payload["change"],
             d.payload["alert"]["subjects"]) for d in Delivery.objects.select_related("flip")
            .filter(flip__alert__rule="generation_rejected").order_by("pk")]


def mine(pks):
    return [pk for pk in pks if Delivery.objects.filter(
        pk=pk, flip__alert__rule="generation_rejected").exists()]


def test_a_burst_of_rejections_within_the_wait_is_one_page(project):
    run, t0 = burst(project, [20], [20, 30], [20, 30, 40])
    assert AlertFlip.objects.filter(alert__rule="generation_rejected").count() == 3
    assert mine(process_flips(group_wait_s=WAIT, now=t0 + timedelta(seconds=0.3))) == []
    assert len(mine(process_flips(group_wait_s=WAIT, now=t0 + timedelta(seconds=WAIT)))) == 1
    # the opening, as the alert is at the newest flip
    assert sent() == [("firing", "firing", None, ["g20", "g30", "g40"])]
    assert not AlertFlip.objects.filter(processed_at__isnull=True).exists()


def test_later_flips_of_a_told_alert_are_one_update_with_the_net_change(project):
    run, t0 = burst(project, [20])
    process_flips(group_wait_s=WAIT, now=t0 + timedelta(seconds=WAIT))
    later = t0 + timedelta(seconds=10)
    for i, updates in enumerate(([20, 30], [20, 30, 40], [20, 40, 50])):
        run = set_result(run, result(generations=rejected(*updates)))
        evaluate_run(run, now=later + timedelta(seconds=0.1 * i))
    process_flips(group_wait_s=WAIT, now=later + timedelta(seconds=WAIT))
    assert sent() == [("firing", "firing", None, ["g20"]),
                      ("firing", "firing", {"added": ["g40", "g50"], "removed": []},
                       ["g20", "g40", "g50"])]


def test_a_subject_that_joins_and_leaves_within_the_wait_is_not_told(project):
    run, t0 = burst(project, [20])
    process_flips(group_wait_s=WAIT, now=t0 + timedelta(seconds=WAIT))
    later = t0 + timedelta(seconds=10)
    for i, updates in enumerate(([20, 30], [20])):
        run = set_result(run, result(generations=rejected(*updates)))
        evaluate_run(run, now=later + timedelta(seconds=0.1 * i))
    process_flips(group_wait_s=WAIT, now=later + timedelta(seconds=WAIT))
    assert sent() == [("firing", "firing", None, ["g20"])]
    assert not AlertFlip.objects.filter(processed_at__isnull=True).exists()


def test_an_alert_that_opens_and_clears_within_the_wait_is_never_sent(project):
    run, t0 = burst(project, [20], [])
    assert [f.new_state for f in AlertFlip.objects.filter(alert__rule="generation_rejected")
            .order_by("pk")] == ["firing", "resolved"]
    assert mine(process_flips(group_wait_s=WAIT, now=t0 + timedelta(seconds=WAIT))) == []
    assert sent() == []
    assert not AlertFlip.objects.filter(processed_at__isnull=True).exists()


def test_an_evaluation_sends_the_notification_task_with_the_wait_as_countdown(project, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.RECOVERYDASH_ALERT_GROUP_WAIT_S = WAIT
    with mock.patch.object(evaluation, "enqueue", return_value=True) as enqueue:
        evaluation._deliver()
    enqueue.assert_called_once_with(NOTIFY_FLIPS, countdown=WAIT)
    # a broker that does not take it: processed at once (the beat is the safety net)
    run, _ = burst(project, [20])
    with mock.patch.object(evaluation, "enqueue", return_value=False):
        evaluation._deliver()
    assert not AlertFlip.objects.filter(processed_at__isnull=True).exists()
    assert [s[:2] for s in sent()] == [("firing", "firing")]
