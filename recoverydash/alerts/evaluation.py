"""What follows an analysis: evaluate the run's alert rules and hand new flips to delivery.

The alerts sit above the runs: this module calls ``recoverydash.runs.analysis`` and nothing
below calls back, so the analysis knows nothing of alerts. The Celery tasks ``analyze_run`` and
``evaluate_all_alerts`` (``workers.tasks``) are two lines around :func:`analyze_and_alert` and
:func:`evaluate_all`; tests call these directly.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from recoverydash.alerts.delivery import process_flips
from recoverydash.alerts.rules import evaluate_run
from recoverydash.runs.analysis import AnalysisFailed, analyze, analyze_queued
from recoverydash.runs.models import Analysis, Run
from recoverydash.runs.queue import DELIVER_WEBHOOK, EVALUATE_ALERTS_CHUNK, enqueue

log = logging.getLogger(__name__)


def analyze_and_alert(run_pk: int) -> Analysis | None:
    """The ``analyze_run`` task: the run's queued analysis (``runs.analysis.analyze_queued``),
    whose alert rules are evaluated in the transaction that stores it (:func:`evaluate_stored`),
    and the delivery of what flipped once that commits. Returns the Analysis row, or None (run
    gone, or inputs refused: nothing is evaluated then)."""
    return analyze_queued(run_pk)


def evaluate_stored(sender, run: Run, analysis: Analysis, **kwargs) -> None:
    """Receiver of ``runs.analysis.analysis_stored``: evaluate the run's alert rules inside the
    transaction that stores ``analysis`` (so ``pending_analysis`` turns false only together
    with the alerts of that analysis, docs/ingest-v1.md#recovery), and enqueue the deliveries
    of the new flips once it commits."""
    fresh = Run.objects.select_related("project").get(pk=run.pk)
    fresh.analysis = analysis
    if evaluate_run(fresh):
        transaction.on_commit(_deliver)


def _deliver() -> None:
    for pk in process_flips():
        enqueue(DELIVER_WEBHOOK, pk)


def notify(run: Run) -> None:
    """Evaluate the run's alert rules and enqueue a webhook delivery for each new flip."""
    run = Run.objects.select_related("analysis", "project").get(pk=run.pk)
    if evaluate_run(run):
        _deliver()


def evaluate_all(chunk: int = 200, refresh_after_s: float = 60.0,
                 refresh_budget: int = 500) -> int:
    """Periodic: evaluate the alert rules of every run that has not ended (the time-based ones,
    ``checkpoint_stale`` and ``run_silent``, change without new events), fanned out in chunks of
    ``chunk`` runs in primary-key order (one ``evaluate_alerts_chunk`` task each), so every run
    is reached every cycle whatever the number of runs; nothing is sliced off.

    A run whose analysis is older than ``refresh_after_s`` seconds is analysed again first, so
    its stored health and seconds-since figures follow the clock; at most ``refresh_budget``
    per cycle, the oldest analyses first (the rules themselves compare the stored figures with
    the clock, so a run waiting for its refresh still gets its time-based alerts).

    Returns the number of runs evaluated here (``CELERY_TASK_ALWAYS_EAGER``: the chunks run in
    this process) or handed to the workers."""
    stale = timezone.now() - timedelta(seconds=refresh_after_s)
    live = (Analysis.objects.exclude(health="ended"))
    refresh = set(live.filter(computed_at__lt=stale).order_by("computed_at", "run_id")
                  .values_list("run_id", flat=True)[:refresh_budget])
    count, after = 0, 0
    while True:
        pks = list(live.filter(run_id__gt=after).order_by("run_id")
                   .values_list("run_id", flat=True)[:chunk])
        if not pks:
            return count
        after = pks[-1]
        again = [pk for pk in pks if pk in refresh]
        if settings.CELERY_TASK_ALWAYS_EAGER:
            count += evaluate_chunk(pks, again)
        elif enqueue(EVALUATE_ALERTS_CHUNK, pks, again):
            count += len(pks)


def evaluate_chunk(pks: list[int], refresh: list[int] = ()) -> int:
    """The ``evaluate_alerts_chunk`` task: evaluate the alert rules of runs ``pks`` (run primary
    keys), analysing those in ``refresh`` again first unless their inputs were refused since.
    One run's failure never stops the others. Returns how many were evaluated."""
    refresh = set(refresh)
    count = 0
    for run in Run.objects.select_related("analysis", "project").filter(pk__in=pks) \
            .order_by("pk"):
        try:  # one run's failure must not stop the others' alerts
            if run.pk in refresh and run.analysis.error_seq < run.ingest_seq:
                analyze(run)
            notify(run)
            count += 1
        except AnalysisFailed:
            continue
        except Exception:
            log.exception("run %s: alert evaluation failed", run.pk)
    return count
