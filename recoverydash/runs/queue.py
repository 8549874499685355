"""Work handed to the Celery workers, by task name: the one way the service enqueues.

Nothing in ``recoverydash`` imports ``workers``: a task is sent by the name it is registered
under (``workers/tasks.py`` registers each with ``name=`` one of the constants below, and a test
checks that every name here is a registered task). The Celery app is the one ``workers.celery``
creates and makes the default when Django starts (``workers`` is an installed app, loaded by
name from the settings), so ``celery.current_app`` is configured from the same settings in the
web process, the worker and the tests.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging

from django.conf import settings

log = logging.getLogger(__name__)

ANALYZE_RUN = "workers.tasks.analyze_run"
"""Bring a run's stored analysis up to date, then evaluate its alerts (args: run pk)."""
VERIFY_GENERATION = "workers.tasks.verify_generation"
"""Check the objects of a committed generation in storage (args: generation pk, and optionally
an ISO 8601 time: every object last checked before it is checked again)."""
VERIFY_OBJECT = "workers.tasks.verify_object"
"""Read and hash one large object of a committed generation in a task of its own (args: object
pk, an ISO 8601 time: done unless the object was checked after it), sent by a generation's
verification with a soft time limit that scales with the object's size."""
DELIVER_WEBHOOK = "workers.tasks.deliver_webhook"
"""Send one webhook delivery (args: delivery pk)."""
NOTIFY_FLIPS = "workers.tasks.notify_flips"
"""Make the deliveries of alert flips whose group wait is over, and send each (no args; sent
with the group wait as countdown after an evaluation stored flips)."""

SEND_TEST_WEBHOOK = "workers.tasks.send_test_webhook"
"""Send the test notification a person asked for (args: endpoint pk, webhook id)."""

EVALUATE_ALERTS_CHUNK = "workers.tasks.evaluate_alerts_chunk"
"""Evaluate the alert rules of a chunk of runs (args: run pks, the pks to analyse again
first), fanned out by the periodic ``evaluate_all_alerts``."""

TASK_NAMES = (ANALYZE_RUN, VERIFY_GENERATION, VERIFY_OBJECT, DELIVER_WEBHOOK, NOTIFY_FLIPS,
              SEND_TEST_WEBHOOK, EVALUATE_ALERTS_CHUNK)


WEBHOOKS_QUEUE = "webhooks"
"""The queue of webhook deliveries, their retries and test notifications when the default queue
is Celery's ``celery`` (analysis, verification and the other periodic jobs): a receiver that is
slow or down ties up the workers of this queue only, never analysis (docs/operating.md#queues).
"""
#: The tasks on the webhooks queue (the periodic ``deliver_due`` by name: the beat sends it).
WEBHOOK_TASKS = frozenset({DELIVER_WEBHOOK, NOTIFY_FLIPS, SEND_TEST_WEBHOOK,
                           "workers.tasks.deliver_due"})


def webhooks_queue(default_queue: str) -> str:
    """The webhooks queue beside ``default_queue`` (``CELERY_TASK_DEFAULT_QUEUE``):
    ``webhooks`` beside ``celery``, else ``<default_queue>.webhooks`` (a test or bench on a
    queue of its own keeps its deliveries beside it)."""
    return WEBHOOKS_QUEUE if default_queue == "celery" else f"{default_queue}.webhooks"


_FAN_OUT_EXPIRES: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "fan_out_expires", default=None)


@contextlib.contextmanager
def fan_out(expires: float):
    """Within the block, every :func:`enqueue` that gives no ``expires`` of its own sends its
    task with ``expires`` = this many seconds (> 0). What it is for: a periodic task's fan-out
    (``workers.tasks``, the beat's period of that task), whose tasks are sent again by the next
    cycle, so one left in the queue past it is stale and only piles up behind a slow worker.
    The value holds for the current context only (a thread or a task body), never for the
    tasks it sends when they run."""
    if not expires > 0:
        raise ValueError(f"fan_out expires must be > 0 seconds, got {expires!r}")
    token = _FAN_OUT_EXPIRES.set(float(expires))
    try:
        yield
    finally:
        _FAN_OUT_EXPIRES.reset(token)


def enqueue(task_name: str, *args, countdown: float = 0.0, expires: float | None = None,
            soft_time_limit: float | None = None, time_limit: float | None = None) -> bool:
    """Send the task ``task_name`` (one of ``TASK_NAMES``) with positional ``args``, to run
    ``countdown`` seconds from now (0: at once); returns False (and logs) when the broker cannot
    take it. Never raises for a broker that is down: work that cannot be enqueued now is found
    again by the periodic sweeps.

    ``expires`` (seconds, > 0; default the enclosing :func:`fan_out`'s, else none): a worker
    that takes the task more than ``expires`` seconds after it became due (``countdown`` from
    now) drops it without running it (Celery's ``expires``, sent as ``countdown + expires``
    seconds from now: a delayed task is never expired before it is due). Only for work some
    periodic cycle sends again. ``soft_time_limit`` / ``time_limit`` (seconds): this task's own
    Celery limits instead of the configured defaults (a verification that scales with size).

    With ``CELERY_TASK_ALWAYS_EAGER`` (tests, a single-process embedded use) the task runs here
    and now, and its errors propagate; ``countdown`` and ``expires`` are ignored then."""
    from celery import current_app

    if settings.CELERY_TASK_ALWAYS_EAGER:
        current_app.tasks[task_name].apply(args=args, throw=True)
        return True
    if expires is None:
        expires = _FAN_OUT_EXPIRES.get()
    elif not expires > 0:
        raise ValueError(f"expires must be > 0 seconds, got {expires!r}")
    try:
        limits = {k: v for k, v in (("soft_time_limit", soft_time_limit),
                                    ("time_limit", time_limit)) if v is not None}
        current_app.send_task(task_name, args=args, countdown=countdown or None,
                              expires=None if expires is None else (countdown or 0.0) + expires,
                              **limits)
        return True
    except Exception as exc:  # broker down: kombu raises several types
        log.warning("could not enqueue %s%s: %s", task_name, args, exc)
        return False
