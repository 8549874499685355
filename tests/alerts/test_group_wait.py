"""Grouping of an alert's notifications (RECOVERYDASH_ALERT_GROUP_WAIT_S,
docs/definitions.md#group-wait): its first flip (the page) goes at once; the flips that follow a
notification of the same alert within the wait are held and go together once it has passed, as
one notification of the alert as it is then: a burst of evidence makes one page and one update."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from recoverydash.alerts import evaluation
from recoverydash.alerts.delivery import process_flips
from recoverydash.alerts.models import AlertFlip, Delivery, WebhookEndpoint
from recoverydash.alerts.rules import evaluate_run
from recoverydash.runs.queue import DELIVER_WEBHOOK, NOTIFY_FLIPS
from tests.alerts.test_grouping import make_run, rejected, set_result
from tests.alerts.test_rules import result

pytestmark = pytest.mark.django_db

WAIT = 5.0


def sent():
    """What the endpoint was sent of the run's generation_rejected alert (its other alerts,
    checkpoint_stale and run_silent of the stored result's old times, are not looked at)."""
    return [(d.payload["status"], d.payload["change"], d.payload["alert"]["subjects"])
            for d in Delivery.objects.filter(flip__alert__rule="generation_rejected")
            .order_by("pk")]


def evaluate(run, *steps, at):
    """Evaluate ``run`` at each of ``steps`` (lists of rejected updates), 1 s apart from ``at``
    (an analysis a second, the debounce); returns the run."""
    for i, updates in enumerate(steps):
        run = set_result(run, result(generations=rejected(*updates)))
        evaluate_run(run, now=at + timedelta(seconds=i))
    return run


@pytest.fixture
def run(project):
    WebhookEndpoint.objects.create(project=project, url="https://hooks.example/a", name="a")
    return make_run(project, result(generations=rejected(20)))


def test_the_first_flip_of_an_alert_is_sent_at_once(run):
    t0 = timezone.now()
    evaluate(run, [20], at=t0)
    process_flips(group_wait_s=WAIT, now=t0)
    assert sent() == [("firing", None, ["g20"])]


def test_a_burst_after_the_page_is_one_update_with_the_net_change(run):
    t0 = timezone.now()
    run = evaluate(run, [20], at=t0)
    process_flips(group_wait_s=WAIT, now=t0)
    # verification decides one generation after another: three analyses within the wait
    run = evaluate(run, [20, 30], [20, 30, 40], [20, 40, 50], at=t0 + timedelta(seconds=1))
    assert process_flips(group_wait_s=WAIT, now=t0 + timedelta(seconds=3)) == []  # held
    process_flips(group_wait_s=WAIT, now=timezone.now() + timedelta(seconds=WAIT))
    assert sent() == [("firing", None, ["g20"]),
                      ("firing", {"added": ["g40", "g50"], "removed": []},
                       ["g20", "g40", "g50"])]
    assert not AlertFlip.objects.filter(alert__rule="generation_rejected",
                                        processed_at__isnull=True).exists()


def test_a_subject_that_joins_and_leaves_within_the_wait_is_not_told(run):
    t0 = timezone.now()
    run = evaluate(run, [20], at=t0)
    process_flips(group_wait_s=WAIT, now=t0)
    evaluate(run, [20, 30], [20], at=t0 + timedelta(seconds=1))
    process_flips(group_wait_s=WAIT, now=timezone.now() + timedelta(seconds=WAIT))
    assert sent() == [("firing", None, ["g20"])]
    assert not AlertFlip.objects.filter(processed_at__isnull=True,
                                        alert__rule="generation_rejected").exists()


def test_a_flip_long_after_the_last_notification_goes_at_once(run):
    t0 = timezone.now() - timedelta(minutes=5)
    run = evaluate(run, [20], at=t0)
    process_flips(group_wait_s=WAIT, now=t0)
    AlertFlip.objects.update(processed_at=t0)
    evaluate(run, [20, 30], at=timezone.now())
    process_flips(group_wait_s=WAIT)
    assert [s[1] for s in sent()] == [None, {"added": ["g30"], "removed": []}]


def test_an_evaluation_sends_the_page_and_a_task_for_what_it_held(run, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.RECOVERYDASH_ALERT_GROUP_WAIT_S = WAIT
    with mock.patch.object(evaluation, "enqueue", return_value=True) as enqueue:
        evaluate(run, [20], at=timezone.now())
        evaluation._deliver()
        delivered = [c.args for c in enqueue.call_args_list]
        enqueue.reset_mock()
        evaluate(run, [20, 30], at=timezone.now())
        evaluation._deliver()
        held = enqueue.call_args_list
    # the page at once (its delivery's task), and for the next flip only the task sent after
    # the wait; no delivery made for it yet
    assert [name for name, *_ in delivered if name == DELIVER_WEBHOOK]
    assert [(c.args, c.kwargs) for c in held] == [((NOTIFY_FLIPS,), {"countdown": WAIT})]
    assert [s[0] for s in sent()] == ["firing"]
