"""What follows an analysis: evaluate the run's alert rules and hand new flips to delivery.

The alerts sit above the runs: this module calls ``recoverydash.runs.analysis`` and nothing
below calls back, so the analysis knows nothing of alerts. The Celery tasks ``analyze_run`` and
``evaluate_all_alerts`` (``workers.tasks``) are two lines around :func:`analyze_and_alert` and
:func:`evaluate_all`; tests call these directly.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from recoverydash.alerts.delivery import process_flips
from recoverydash.alerts.rules import evaluate_run
from recoverydash.runs.analysis import AnalysisFailed, analyze, analyze_queued
from recoverydash.runs.models import Analysis, Run
from recoverydash.runs.queue import DELIVER_WEBHOOK, enqueue

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


def evaluate_all(limit: int = 2000, refresh_after_s: float = 60.0) -> int:
    """Periodic: evaluate the alert rules of every run that has not ended (the time-based ones,
    ``checkpoint_stale`` and ``run_silent``, change without new events). A run whose analysis is
    older than ``refresh_after_s`` seconds is analysed again first, so its stored health and
    seconds-since figures follow the clock. At most ``limit`` runs; returns the number of runs
    evaluated."""
    stale = timezone.now() - timedelta(seconds=refresh_after_s)
    count = 0
    for run in (Run.objects.select_related("analysis", "project")
                .filter(analysis__isnull=False).exclude(analysis__health="ended")[:limit]):
        try:  # one run's failure must not stop the others' alerts
            if run.analysis.computed_at < stale and run.analysis.error_seq < run.ingest_seq:
                analyze(run)
            notify(run)
            count += 1
        except AnalysisFailed:
            continue
        except Exception:
            log.exception("run %s: alert evaluation failed", run.pk)
    return count
