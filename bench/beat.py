#!/usr/bin/env python
"""One periodic alert evaluation over 1,000 and 10,000 runs (issue 13: a beat cycle within its
period, every run reached).

Runs not ended (``BENCH_RUNS``, default ``1000,10000``), each with an attempt of 8 ranks that
last reported 3 h ago and a stored analysis computed by the core (no restorable checkpoint for
3 h), fabricated as rows in a throwaway PostgreSQL database. ``alerts.evaluation.evaluate_all``
runs with its chunks in this one process (``CELERY_TASK_ALWAYS_EAGER``: the work two worker
processes share, done by one): the first cycle opens ``checkpoint_stale`` and ``run_silent`` on
every run (each run through the full evaluation: the worst case; measured up to
``BENCH_MASS_OPEN_UPTO`` runs, above it the same alerts are bulk-created), the second finds nothing
changed (the steady state: the clock-driven rules computed for every run from stored columns),
the third after 10 % of the runs' ranks reported again (their ``run_silent`` resolves). The
refresh budget's analyses are requested from the workers, not run in the cycle: their worker cost
is measured apart (one analysis of a fabricated run, times the budget). Prints the seconds and the
runs reached against the beat period (30 s, ``workers.celery.BEAT_SCHEDULE``).

Run: ``.venv/bin/python bench/beat.py``.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recoverydash.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/benchbeat")
os.environ.setdefault("CELERY_BROKER_URL", "memory://")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

SIZES = [int(n) for n in os.environ.get("BENCH_RUNS", "1000,10000").split(",")]
PERIOD_S = 30.0
RANKS = 8
#: Up to this many runs the first cycle (every run through the full evaluation, opening its
#: alerts: ~45 ms a run here) is measured; above it the open alerts are bulk-copied from the
#: smaller fleet's first run (run the smaller size first) and the steady cycles measured.
MASS_OPEN_UPTO = int(os.environ.get("BENCH_MASS_OPEN_UPTO", "1000"))


def fabricate(count: int, tag: str) -> list:
    from recoverydash.runs import analysis as bridge
    from recoverydash.runs.models import Analysis, Attempt, Project, RankSeen, Run

    project = Project.objects.create(name=f"fleet{tag}")
    started = timezone.now() - timedelta(hours=3)
    runs = Run.objects.bulk_create([Run(project=project, run_id=f"run{i:05d}", ingest_seq=1,
                                        first_event_at=started, last_received_at=started)
                                    for i in range(count)], batch_size=2000)
    attempts = Attempt.objects.bulk_create([Attempt(run=r, attempt=0, started_at=started,
                                                    world_size=RANKS, last_event_at=started)
                                            for r in runs], batch_size=2000)
    RankSeen.objects.bulk_create([RankSeen(attempt=a, reporter=str(r), seen_at=started)
                                  for a in attempts for r in range(RANKS)], batch_size=5000)
    bridge.analyze(runs[0])
    template = Analysis.objects.get(run=runs[0])
    old = timezone.now() - timedelta(minutes=10)
    Analysis.objects.filter(run__in=runs).delete()
    from recoverydash.alerts.models import Alert

    Alert.objects.filter(run__in=runs).delete()
    Analysis.objects.bulk_create([Analysis(run=r, result=template.result, health=template.health,
                                           state=template.state, ingest_seq=1, computed_at=old,
                                           clock=template.clock,
                                           clock_since_s=template.clock_since_s,
                                           clock_ended_s=template.clock_ended_s)
                                  for r in runs], batch_size=2000)
    return runs


def analysis_cost(runs) -> float:
    """Seconds of one full analysis with nothing new (what each refresh costs a worker)."""
    from recoverydash.runs import analysis as bridge

    t0 = time.perf_counter()
    for run in runs[:10]:
        bridge.analyze(run)
    return (time.perf_counter() - t0) / 10


def cycle(evaluation, reached) -> tuple[float, int, int]:
    reached.clear()
    t0 = time.perf_counter()
    count = evaluation.evaluate_all()
    return time.perf_counter() - t0, count, len(reached)


def measure(count: int, template: list) -> list:
    from recoverydash.alerts import evaluation
    from recoverydash.alerts.models import Alert
    from recoverydash.runs.models import Attempt, RankSeen

    runs = fabricate(count, str(count))
    if count > MASS_OPEN_UPTO:  # the steady state built in bulk: each run's two alerts open
        Alert.objects.bulk_create([
            Alert(run=r, rule=a.rule, subject=a.subject, subjects=a.subjects,
                  dedup_key=f"{r.run_id}:{a.rule}:", severity=a.severity, summary=a.summary,
                  opened_at=a.opened_at, last_seen_at=a.last_seen_at)
            for r in runs for a in template], batch_size=2000)
    full = []
    real = evaluation.evaluate_runs

    def counted(runs, now=None):
        full.extend(run.pk for run in runs)
        return real(runs, now=now)

    with mock.patch.object(evaluation, "evaluate_runs", side_effect=counted), \
            mock.patch("recoverydash.runs.analysis.request_analysis", return_value=True):
        first, n1, f1 = cycle(evaluation, full) if count <= MASS_OPEN_UPTO else (None, 0, 0)
        steady, n2, f2 = cycle(evaluation, full)
        back = [r.pk for r in runs[::10]]
        RankSeen.note({pk: [str(r) for r in range(RANKS)] for pk in Attempt.objects
                       .filter(run_id__in=back).values_list("pk", flat=True)}, timezone.now())
        some, n3, f3 = cycle(evaluation, full)
    firing = Alert.objects.filter(run__in=runs, state="firing").count()
    opened = list(Alert.objects.filter(run=runs[1], state="firing"))  # not among those back
    per = analysis_cost(runs[-10:])
    budget = settings.RECOVERYDASH_BEAT_REFRESH_BUDGET
    print(f"{count:,} runs not ended, {RANKS} ranks each (one process doing what the workers "
          f"share; beat period {PERIOD_S:g} s):")
    for name, took, n, f in (("first cycle, every run opens 2 alerts", first, n1, f1)
                             if first is not None else ("(2 alerts a run opened in bulk)", None, 0, 0),
                             ("steady cycle, nothing changed", steady, n2, f2),
                             ("10 % of the runs report again", some, n3, f3)):
        if took is None:
            print(f"  {name}")
            continue
        print(f"  {name:40s} {took:6.2f} s  reached {n:,}  in full {f:,}  "
              f"{took / count * 1e6:7.0f} us/run  ({took / PERIOD_S:.2f} of the period)")
    print(f"  open firing alerts after: {firing:,}; refresh budget {budget} analyses a cycle "
          f"requested from the workers at {per * 1000:.0f} ms each = {budget * per:.1f} s of "
          f"worker time per {PERIOD_S:g} s ({budget * per / (2 * PERIOD_S):.0%} of 2 workers)")
    runs[0].project.delete()  # the next size's fleet alone
    return opened


def main() -> None:
    from django.test.utils import setup_test_environment

    setup_test_environment()
    settings.CELERY_TASK_ALWAYS_EAGER = True
    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        template: list = []
        for count in SIZES:
            template = measure(count, template)
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
