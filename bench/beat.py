#!/usr/bin/env python
"""One periodic alert evaluation over 10,000 runs (issue 13: a beat cycle within its period,
every run reached).

10,000 runs not ended (``BENCH_RUNS``), each with an attempt row and a stored analysis computed
by the core, all older than the refresh age, fabricated as rows in a throwaway PostgreSQL
database. ``alerts.evaluation.evaluate_all`` runs with its chunks in this one process
(``CELERY_TASK_ALWAYS_EAGER``: the work two worker processes would share, done by one), with the
default refresh budget (the 500 oldest analyses analysed again) and, as the baseline in the same
process, without re-analysis. Prints the runs reached and the seconds against the beat period
(30 s, ``workers.celery.BEAT_SCHEDULE``).

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

RUNS = int(os.environ.get("BENCH_RUNS", "10000"))
PERIOD_S = 30.0


def fabricate() -> list:
    from recoverydash.runs import analysis as bridge
    from recoverydash.runs.models import Analysis, Attempt, Project, Run

    project = Project.objects.create(name="fleet")
    started = timezone.now() - timedelta(hours=3)
    runs = Run.objects.bulk_create([Run(project=project, run_id=f"run{i:05d}", ingest_seq=1,
                                        first_event_at=started, last_received_at=started)
                                    for i in range(RUNS)], batch_size=2000)
    Attempt.objects.bulk_create([Attempt(run=r, attempt=0, started_at=started, world_size=8,
                                         last_event_at=started) for r in runs], batch_size=2000)
    bridge.analyze(runs[0])
    template = Analysis.objects.get(run=runs[0])
    old = timezone.now() - timedelta(minutes=10)
    Analysis.objects.all().delete()
    Analysis.objects.bulk_create([Analysis(run=r, result=template.result, health=template.health,
                                           state=template.state, ingest_seq=1, computed_at=old)
                                  for r in runs], batch_size=2000)
    return runs


def main() -> None:
    from django.test.utils import setup_test_environment

    from recoverydash.alerts import evaluation

    setup_test_environment()
    settings.CELERY_TASK_ALWAYS_EAGER = True
    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        fabricate()
        reached = []
        real = evaluation.notify

        def counted(run):
            reached.append(run.pk)
            real(run)

        with mock.patch.object(evaluation, "notify", side_effect=counted):
            t0 = time.perf_counter()
            count = evaluation.evaluate_all()
            cycle = time.perf_counter() - t0
            first = len(set(reached))
            reached.clear()
            t0 = time.perf_counter()
            evaluation.evaluate_all(refresh_budget=0)
            baseline = time.perf_counter() - t0
        print(f"{RUNS:,} runs not ended: a cycle reached {first:,} ({count:,} evaluated) in "
              f"{cycle:.1f} s with the 500 oldest analysed again, {baseline:.1f} s without "
              f"re-analysis (baseline, same process, {len(set(reached)):,} reached); one process "
              f"doing what the workers share; beat period {PERIOD_S:g} s "
              f"({cycle / PERIOD_S:.2f} of it)")
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
