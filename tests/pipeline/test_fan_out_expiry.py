"""A periodic fan-out's tasks expire at the next cycle (``runs.queue.fan_out``, the beat period
of the task that sends them): the messages sent through the real Celery app carry ``expires``
(Celery's header, an ISO time), ``countdown + expires`` seconds from the send; the worker's
request drops an expired one without running it, and runs one not expired."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta
from unittest import mock

import pytest
from celery.worker.request import Request
from django.utils import timezone

import workers.tasks
from recoverydash.alerts import evaluation
from recoverydash.runs import queue
from recoverydash.runs.models import Analysis, Run
from workers.celery import app

from .conftest import point_app_at

pytestmark = pytest.mark.django_db


@pytest.fixture
def memory_queue(settings):
    """This process's Celery app publishing to kombu's in-memory broker, on a queue of this
    test; yields ``take() -> list of kombu messages`` (all queued so far, in order)."""
    saved = (app.conf.broker_url, app.conf.task_default_queue)
    name = f"expiry-{uuid.uuid4().hex}"
    point_app_at("memory://", name, settings)
    conn = app.connection_for_read()
    simple = conn.SimpleQueue(name, no_ack=True)

    def take():
        out = []
        while True:
            try:
                out.append(simple.get(block=False))
            except simple.Empty:
                return out

    yield take
    simple.close()
    conn.release()
    app.conf.broker_url, app.conf.task_default_queue = saved
    app._pool = None
    app.amqp._producer_pool = None


def at(header: str | None) -> datetime | None:
    return None if header is None else datetime.fromisoformat(header)


def within(moment, before, after, seconds):
    """``moment`` is ``seconds`` after some instant between ``before`` and ``after``."""
    return before + timedelta(seconds=seconds) <= moment <= after + timedelta(seconds=seconds)


def test_enqueue_sends_expires_counted_from_when_the_task_is_due(memory_queue):
    before = timezone.now()
    assert queue.enqueue(queue.ANALYZE_RUN, 7, countdown=5.0, expires=30.0)
    assert queue.enqueue(queue.ANALYZE_RUN, 8)
    with queue.fan_out(12.0):
        assert queue.enqueue(queue.VERIFY_GENERATION, 9)
        assert queue.enqueue(queue.VERIFY_GENERATION, 10, expires=3.0)  # its own wins
    assert queue.enqueue(queue.VERIFY_GENERATION, 11)  # the block's value is gone
    after = timezone.now()
    messages = memory_queue()
    assert [(m.headers["task"], m.headers["argsrepr"]) for m in messages] == [
        (queue.ANALYZE_RUN, "(7,)"), (queue.ANALYZE_RUN, "(8,)"),
        (queue.VERIFY_GENERATION, "(9,)"), (queue.VERIFY_GENERATION, "(10,)"),
        (queue.VERIFY_GENERATION, "(11,)")]
    first = messages[0].headers
    assert within(at(first["eta"]), before, after, 5.0)
    assert within(at(first["expires"]), before, after, 35.0)
    assert [m.headers["expires"] for m in messages[1::3]] == [None, None]
    assert within(at(messages[2].headers["expires"]), before, after, 12.0)
    assert within(at(messages[3].headers["expires"]), before, after, 3.0)
    for bad in (0, -1.0):
        with pytest.raises(ValueError):
            queue.enqueue(queue.ANALYZE_RUN, 7, expires=bad)
        with pytest.raises(ValueError), queue.fan_out(bad):
            pass


def test_eager_mode_runs_the_task_and_ignores_expires(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    with mock.patch.object(evaluation, "evaluate_chunk") as chunk:
        assert queue.enqueue(queue.EVALUATE_ALERTS_CHUNK, [1, 2], [], expires=0.001)
    chunk.assert_called_once_with([1, 2], [])


@pytest.fixture
def fleet(project):
    runs = Run.objects.bulk_create([Run(project=project, run_id=f"r{i:03d}") for i in range(450)])
    Analysis.objects.bulk_create([Analysis(run=r, health="ok", computed_at=timezone.now())
                                  for r in runs])
    return runs


def test_each_chunk_of_the_alert_beat_expires_at_its_next_cycle(memory_queue, settings, fleet):
    settings.RECOVERYDASH_BEAT_REFRESH_BUDGET = 0
    before = timezone.now()
    workers.tasks.evaluate_all_alerts()  # the task's body, as the worker runs it
    after = timezone.now()
    messages = memory_queue()
    assert [m.headers["task"] for m in messages] == [queue.EVALUATE_ALERTS_CHUNK] * 3
    assert [len(m.decode()[0][0]) for m in messages] == [200, 200, 50]
    assert [pk for m in messages for pk in m.decode()[0][0]] == [r.pk for r in fleet]
    for m in messages:
        assert m.headers["eta"] is None
        assert within(at(m.headers["expires"]), before, after, 30.0)


@pytest.mark.parametrize("task, inner, period", [
    ("sweep_runs", "recoverydash.runs.analysis.sweep", 15.0),
    ("evaluate_all_alerts", "recoverydash.alerts.evaluation.evaluate_all", 30.0),
    ("recheck_storage", "recoverydash.storage.verification.recheck", 60.0),
    ("sweep_verifications", "recoverydash.storage.verification.sweep_unverified", 60.0),
])
def test_every_periodic_fan_out_sends_in_its_period(memory_queue, task, inner, period):
    def fan():
        queue.enqueue(queue.VERIFY_GENERATION, 1)
        queue.enqueue(queue.ANALYZE_RUN, 2, countdown=1.0)

    before = timezone.now()
    with mock.patch(inner, side_effect=fan):
        getattr(workers.tasks, task)()
    after = timezone.now()
    first, second = memory_queue()
    assert within(at(first.headers["expires"]), before, after, period)
    assert within(at(second.headers["expires"]), before, after, 1.0 + period)
    # not periodic fan-outs: their sends (a webhook, a verification of a new commit) never expire
    assert queue._FAN_OUT_EXPIRES.get() is None


def test_the_runs_sweep_sends_analyses_that_expire_after_the_debounce_and_a_cycle(
        memory_queue, settings, project):
    settings.RECOVERYDASH_ANALYSIS_DEBOUNCE_S = 1.0
    run = Run.objects.create(project=project, run_id="behind", ingest_seq=3)
    before = timezone.now()
    workers.tasks.sweep_runs()
    after = timezone.now()
    (message,) = memory_queue()
    assert (message.headers["task"], message.decode()[0]) == (queue.ANALYZE_RUN, [run.pk])
    assert within(at(message.headers["eta"]), before, after, 1.0)
    assert within(at(message.headers["expires"]), before, after, 16.0)


def test_the_worker_drops_an_expired_chunk_and_runs_one_not_expired(memory_queue):
    assert queue.enqueue(queue.EVALUATE_ALERTS_CHUNK, [1, 2], [], expires=0.05)
    assert queue.enqueue(queue.EVALUATE_ALERTS_CHUNK, [3], [], expires=60.0)
    time.sleep(0.2)
    stale, fresh = memory_queue()
    task = app.tasks[queue.EVALUATE_ALERTS_CHUNK]
    with mock.patch.object(evaluation, "evaluate_chunk") as chunk:
        Request(stale, app=app, task=task).execute()
        chunk.assert_not_called()
        Request(fresh, app=app, task=task).execute()
    chunk.assert_called_once_with([3], [])
