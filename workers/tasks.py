"""Celery tasks: two lines around plain functions that tests call directly.

Every task is idempotent by its natural key (a run, a generation, a delivery), acknowledged late,
requeued if its worker dies, and time-limited (``task_soft_time_limit`` / ``task_time_limit`` in
``workers.celery``). Only errors that may pass are retried (``autoretry_for``): a
database that is briefly unreachable, a storage service that throttles. A user's
misconfiguration (a bad bucket, a refused webhook address) is stored as a state and shown, never
retried in a loop. Imports happen inside the task bodies so the broker can load this module
cheaply.

A periodic task that fans out (one task per chunk of runs or per generation) sends its tasks
inside ``runs.queue.fan_out(its beat period)``: each expires at the next cycle, so a backlog
behind slow workers holds at most one cycle of them, and the one a worker drops as expired is
sent again by a later cycle (each task says which: the next one, or the first after the mark
its sender leaves has lapsed).
"""

from __future__ import annotations

from celery import shared_task
from django.db import InterfaceError, OperationalError

from recoverydash.checkpoints.objects import TransientStorageError  # pure module, no Django

TRANSIENT = (OperationalError, InterfaceError, ConnectionError, TimeoutError,
             TransientStorageError)


def cycle_s(task_name: str) -> float:
    """Seconds between two runs of the periodic task ``task_name`` (its
    ``workers.celery.BEAT_SCHEDULE`` entry, the one place periods are set). KeyError if it is
    not periodic."""
    from workers.celery import BEAT_SCHEDULE

    for entry in BEAT_SCHEDULE.values():
        if entry["task"] == task_name:
            return float(entry["schedule"])
    raise KeyError(task_name)


RETRY = {"autoretry_for": TRANSIENT, "retry_backoff": 2, "retry_backoff_max": 120,
         "retry_jitter": True, "max_retries": 8}


@shared_task(name="workers.tasks.analyze_run", **RETRY)
def analyze_run(run_pk: int) -> None:
    """Bring the run's stored analysis up to date, then evaluate its alerts. First, the
    manifests of generations its attempts resumed that the server does not hold are looked for
    in the run's storage locations (``ingest.discovery.look_up_resumed``,
    docs/definitions.md#resume-from-a-generation-the-server-had-not-seen); a lookup that fails
    never stops the analysis."""
    from recoverydash.alerts.evaluation import analyze_and_alert
    from recoverydash.ingest.discovery import look_up_resumed

    look_up_resumed(run_pk)
    analyze_and_alert(run_pk)


@shared_task(name="workers.tasks.verify_generation", **RETRY)
def verify_generation(generation_pk: int, recheck_before: str | None = None) -> None:
    """Check the objects of a committed generation in storage (those not checked yet, or all
    last checked before ``recheck_before``), then re-analyse its run."""
    from recoverydash.storage.verification import verify_generation as verify

    verify(generation_pk, recheck_before)


@shared_task(name="workers.tasks.verify_object", **RETRY)
def verify_object(object_pk: int, before: str) -> None:
    """Read and hash one large object of a committed generation (sent with time limits that
    scale with its size), then re-analyse its run; nothing when it was checked after
    ``before``."""
    from recoverydash.storage.verification import verify_one

    verify_one(object_pk, before)


@shared_task(name="workers.tasks.deliver_webhook", **RETRY)
def deliver_webhook(delivery_pk: int) -> None:
    """Send one webhook delivery if it is due (retries are scheduled in the row, not here)."""
    from recoverydash.alerts.delivery import deliver

    deliver(delivery_pk)


@shared_task(name="workers.tasks.notify_flips", **RETRY)
def notify_flips() -> None:
    """Make the deliveries of alert flips whose group wait is over, and send each."""
    from recoverydash.alerts.delivery import notify_flips as notify
    from recoverydash.runs.queue import DELIVER_WEBHOOK, enqueue

    for pk in notify():
        enqueue(DELIVER_WEBHOOK, pk)


@shared_task(name="workers.tasks.send_test_webhook", acks_late=True, soft_time_limit=60,
             time_limit=90)
def send_test_webhook(endpoint_pk: int, webhook_id: str) -> None:
    """Send the test notification a person asked for from the project page (never retried:
    the answer, good or bad, is what they asked to see)."""
    from recoverydash.alerts.delivery import send_test

    send_test(endpoint_pk, webhook_id)


@shared_task(name="workers.tasks.sweep_runs", **RETRY)
def sweep_runs() -> None:
    """Enqueue analysis for runs whose stored analysis is behind their events."""
    from recoverydash.runs.analysis import sweep
    from recoverydash.runs.queue import fan_out

    # A dropped analyze_run is sent again once its debounce mark (request_analysis, a minute)
    # lapses, by the first cycle after that, if the run is still behind.
    with fan_out(cycle_s(sweep_runs.name)):
        sweep()


@shared_task(name="workers.tasks.evaluate_all_alerts", **RETRY)
def evaluate_all_alerts() -> None:
    """Evaluate the clock-driven alert rules of every analysed run not ended: one
    ``evaluate_alerts_chunk`` task per chunk of runs, every run reached each cycle; then request
    at most RECOVERYDASH_BEAT_REFRESH_BUDGET stale analyses (``analyze_run`` tasks)."""
    from recoverydash.alerts.evaluation import evaluate_all
    from recoverydash.runs.queue import fan_out

    # The chunks are a keyset walk over every live run in primary-key order, no mark: the next
    # cycle sends the same runs again. A dropped refresh (analyze_run) is requested again once
    # its debounce mark lapses (a minute), by refresh_stale's oldest-first order.
    with fan_out(cycle_s(evaluate_all_alerts.name)):
        evaluate_all()


@shared_task(name="workers.tasks.evaluate_alerts_chunk", **RETRY)
def evaluate_alerts_chunk(run_pks: list[int], refresh_pks: list[int]) -> None:
    """Evaluate the alert rules of a chunk of runs: the clock-driven ones of every run from
    stored columns, the full evaluation only where alerts change (idempotent). ``refresh_pks``
    (messages of an older beat; now always empty): analyses requested first."""
    from recoverydash.alerts.evaluation import evaluate_chunk

    evaluate_chunk(run_pks, refresh_pks)


@shared_task(name="workers.tasks.compact_raw_rows", **RETRY)
def compact_raw_rows() -> None:
    """Delete absorbed raw update and heartbeat rows past their retention, in bounded batches
    (docs/retention.md)."""
    from recoverydash.runs.compaction import compact

    compact()


@shared_task(name="workers.tasks.deliver_due", **RETRY)
def deliver_due() -> None:
    """Create deliveries for new flips and send every delivery whose attempt is due."""
    from recoverydash.alerts.delivery import deliver_due as send_due

    send_due()


@shared_task(name="workers.tasks.discover_manifests", **RETRY)
def discover_manifests() -> None:
    """List every enabled storage location and ingest committed manifests not seen yet."""
    from recoverydash.ingest.discovery import discover_all

    discover_all()


@shared_task(name="workers.tasks.recheck_storage", **RETRY)
def recheck_storage() -> None:
    """Enqueue a re-verification of each run's last restorable generation that is due."""
    from recoverydash.runs.queue import fan_out
    from recoverydash.storage.verification import recheck

    # recheck marks a generation's verified_at when it sends: a dropped re-verification is sent
    # again when that mark is due again (RECOVERYDASH_RECHECK_S or _ENDED_S), not next cycle.
    with fan_out(cycle_s(recheck_storage.name)):
        recheck()


@shared_task(name="workers.tasks.sweep_verifications", **RETRY)
def sweep_verifications() -> None:
    """Re-queue verifications left unfinished (a worker killed mid-verification)."""
    from recoverydash.runs.queue import fan_out
    from recoverydash.storage.verification import sweep_unverified

    # sweep_unverified marks check_started_at when it sends: a dropped verification is sent
    # again after RECOVERYDASH_VERIFY_STALE_S, by the first cycle after that.
    with fan_out(cycle_s(sweep_verifications.name)):
        sweep_unverified()
