"""The Celery app: broker from ``CELERY_BROKER_URL`` (Redis in production), or kombu's filesystem
transport under ``var/broker`` in the embedded default; the beat schedule is defined here, in one
place. Task defaults follow "Celery without tears": acks late, requeue when a worker is lost,
no results stored, a soft and a hard time limit on every task (``RECOVERYDASH_TASK_*``), and an
``expires`` on periodic tasks of about 1.5 periods so a backlog does not run the same periodic job
many times (the tasks a periodic job fans out expire at its next cycle: ``workers.tasks``). The
filesystem broker is kombu's, made safe against torn and bad message files (``workers.broker``).
Webhook deliveries go to their own queue (``recoverydash.runs.queue.ROUTES``); the beat runs
once across hosts (``workers.beat.LockedScheduler``).
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recoverydash.settings")

app = Celery("recoverydash")
app.config_from_object("django.conf:settings", namespace="CELERY")
# The default app in every thread of the process (``set_current`` covers only this one): the
# service sends tasks by name through ``celery.current_app`` (``recoverydash.runs.queue``).
app.set_default()


def _configure() -> None:
    from django.conf import settings

    broker = settings.CELERY_BROKER_URL
    if broker.startswith("filesystem://"):
        from workers.broker import install

        install()
        folder = settings.CELERY_BROKER_DIR
        for sub in ("queue", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        app.conf.broker_transport_options = {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            "control_folder": str(folder / "control"),
            "store_processed": False,
        }
    elif broker.startswith("redis"):
        # A task not acknowledged within this time is given to another worker: longer than
        # the longest verification or analysis.
        app.conf.broker_transport_options = {
            "visibility_timeout": settings.RECOVERYDASH_BROKER_VISIBILITY_TIMEOUT_S}
    from kombu import Queue

    from recoverydash.runs.queue import webhooks_queue

    default = settings.CELERY_TASK_DEFAULT_QUEUE
    app.conf.update(
        # webhook deliveries on a queue of their own (route_task): workers started with
        # -Q celery never take one, so failing receivers cannot hold analysis up. A worker
        # started without -Q takes both.
        task_queues=[Queue(name, routing_key=name) for name in (default,
                                                                webhooks_queue(default))],
        task_routes=(route_task,),
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_soft_time_limit=settings.RECOVERYDASH_TASK_SOFT_TIME_LIMIT_S,
        task_time_limit=settings.RECOVERYDASH_TASK_TIME_LIMIT_S,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        task_always_eager=settings.CELERY_TASK_ALWAYS_EAGER,
        broker_connection_retry_on_startup=True,
        # Ingest enqueues after commit: a broker that is down must cost the request little.
        # The sweep enqueues whatever could not be sent.
        broker_connection_timeout=2.0,
        task_publish_retry_policy={"max_retries": 1, "interval_start": 0,
                                   "interval_step": 0.5, "interval_max": 0.5},
        beat_schedule=BEAT_SCHEDULE,
        # every beat takes the beat lock first: a second one waits instead of doubling the work
        beat_scheduler="workers.beat:LockedScheduler",
        timezone="UTC",
    )


def route_task(name, args=None, kwargs=None, options=None, task=None, **kw):
    """Celery router: the tasks of ``runs.queue.WEBHOOK_TASKS`` go to the webhooks queue beside
    the app's default queue (``runs.queue.webhooks_queue``); the others to the default."""
    from recoverydash.runs.queue import WEBHOOK_TASKS, webhooks_queue

    if name in WEBHOOK_TASKS:
        queue = webhooks_queue(app.conf.task_default_queue)
        return {"queue": queue, "routing_key": queue}
    return None


def _every(seconds: float, task: str) -> dict:
    return {"task": task, "schedule": seconds, "options": {"expires": seconds * 1.5}}


# Periodic work, in one place.
BEAT_SCHEDULE = {
    # runs whose events arrived while the broker was down, or whose analysis failed
    "sweep-runs": _every(15.0, "workers.tasks.sweep_runs"),
    # time-based rules (checkpoint_stale, run_silent) change without new events
    "evaluate-alerts": _every(30.0, "workers.tasks.evaluate_all_alerts"),
    # notifications whose retry is due, and flips not yet turned into deliveries
    "deliver-due": _every(10.0, "workers.tasks.deliver_due"),
    # manifests written to storage whose commit event never arrived
    "discover-manifests": _every(60.0, "workers.tasks.discover_manifests"),
    # each run's last restorable generation, verified again when due (RECOVERYDASH_RECHECK_S,
    # RECOVERYDASH_RECHECK_ENDED_S): retention or a person may have deleted or truncated it
    "recheck-storage": _every(60.0, "workers.tasks.recheck_storage"),
    # raw update / heartbeat rows absorbed into the stored state and past their retention
    # (RECOVERYDASH_RAW_RETENTION_DAYS, docs/retention.md), deleted in bounded batches
    "compact-raw-rows": _every(300.0, "workers.tasks.compact_raw_rows"),
    # generations left committed with objects unchecked (a worker killed mid-verification)
    "sweep-verifications": _every(60.0, "workers.tasks.sweep_verifications"),
}

_configure()
app.autodiscover_tasks(["workers"], related_name="tasks", force=True)
