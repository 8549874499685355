#!/usr/bin/env python
"""One periodic alert evaluation over 1,000 and 10,000 runs (issue 13: a beat cycle within its
period, every run reached, also when many runs change alerts at once).

Runs not ended (``BENCH_RUNS``, default ``1000,10000``), each with an attempt of 8 ranks that
last reported 3 h ago and a stored analysis computed by the core (no restorable checkpoint
for 3 h), fabricated as rows in a throwaway PostgreSQL database, and one webhook endpoint (each flip
becomes a delivery row; sending it is a ``deliver_webhook`` task of the workers, counted here,
not sent). ``alerts.evaluation.evaluate_all`` runs with its chunks in this one process
(``CELERY_TASK_ALWAYS_EAGER``: the work two worker processes share, done by one): the first
cycle opens ``checkpoint_stale`` and ``run_silent`` on every run (every run through the full
evaluation: the worst case; measured up to ``BENCH_MASS_OPEN_UPTO`` runs, above it the same
alerts are bulk-created, and a first cycle rewrites their words), the second finds nothing
changed (the steady state: the clock-driven rules computed for every run from stored columns),
the third after 10 % of the runs' ranks reported again (their ``run_silent`` resolves: 10 % of
the runs evaluated in full), the fourth after another 20 %, the fifth a minute later (nothing
changes but the durations the open alerts' words give: every open alert's words rewritten, no
run in full). Then the baseline, in the same process: 100 changing runs evaluated one by one as
the beat did before (each run read, evaluated alone, its flips made deliveries one by one)
against 100 others in one chunk, and the ratio. The refresh budget's analyses are requested from
the workers, not run in the cycle: their worker cost is measured apart (one analysis of a
fabricated run, times the budget). Prints the seconds and the runs reached against the beat
period (30 s, ``workers.celery.BEAT_SCHEDULE``).

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


def cycle(evaluation, reached, sent, now=None) -> tuple[float, int, int, int]:
    reached.clear()
    sent.clear()
    t0 = time.perf_counter()
    count = evaluation.evaluate_all(now=now)
    return time.perf_counter() - t0, count, len(reached), len(sent)


def report_again(runs) -> None:
    """Every rank of ``runs`` reports now: their ``run_silent`` resolves at the next cycle."""
    from recoverydash.runs.models import Attempt, RankSeen

    RankSeen.note({pk: [str(r) for r in range(RANKS)] for pk in Attempt.objects
                   .filter(run__in=runs).values_list("pk", flat=True)}, timezone.now())


def one_by_one(runs) -> float:
    """Seconds to evaluate ``runs`` as the beat did before runs were evaluated together: each
    run read with its analysis, evaluated alone (``rules.evaluate_run``) and its flips made
    deliveries flip by flip (``delivery._process_flip``)."""
    from recoverydash.alerts import delivery
    from recoverydash.alerts.models import AlertFlip
    from recoverydash.alerts.rules import evaluate_run
    from recoverydash.runs.models import Run

    t0 = time.perf_counter()
    for run in runs:
        run = Run.objects.select_related("analysis", "project").get(pk=run.pk)
        if evaluate_run(run):
            for pk in AlertFlip.objects.filter(processed_at__isnull=True).order_by("pk") \
                    .values_list("pk", flat=True):
                delivery._process_flip(pk)
    return time.perf_counter() - t0


def together(runs) -> float:
    """Seconds of the beat's chunk task over ``runs`` (all of them changing)."""
    from recoverydash.alerts import evaluation

    t0 = time.perf_counter()
    evaluation.evaluate_chunk([r.pk for r in runs])
    return time.perf_counter() - t0


def measure(count: int, template: list) -> list:
    from recoverydash.alerts import evaluation
    from recoverydash.alerts.models import Alert, Delivery, WebhookEndpoint
    from recoverydash.runs.queue import DELIVER_WEBHOOK

    runs = fabricate(count, str(count))
    # one receiver: each flip becomes a delivery row; sending it is a deliver_webhook task of
    # the workers (counted here, not sent)
    WebhookEndpoint.objects.create(project=runs[0].project, url="https://hooks.example/beat")
    if count > MASS_OPEN_UPTO:  # the steady state built in bulk: each run's two alerts open
        Alert.objects.bulk_create([
            Alert(run=r, rule=a.rule, subject=a.subject, subjects=a.subjects,
                  dedup_key=f"{r.run_id}:{a.rule}:", severity=a.severity, summary=a.summary,
                  opened_at=a.opened_at, last_seen_at=a.last_seen_at)
            for r in runs for a in template], batch_size=2000)
    full, sent = [], []
    real = evaluation.evaluate_runs

    def counted(runs, now=None):
        full.extend(run.pk for run in runs)
        return real(runs, now=now)

    def enqueue(name, *args, **kwargs):
        assert name == DELIVER_WEBHOOK, name
        sent.append(args[0])
        return True

    rows = []
    with mock.patch.object(evaluation, "evaluate_runs", side_effect=counted), \
            mock.patch.object(evaluation, "enqueue", side_effect=enqueue), \
            mock.patch("recoverydash.runs.analysis.request_analysis", return_value=True):
        if count <= MASS_OPEN_UPTO:
            rows.append(("first cycle, every run opens 2 alerts", *cycle(evaluation, full, sent)))
        if count > MASS_OPEN_UPTO:  # the words bulk-copied are older: all of them move
            rows.append(("words of every open alert moved", *cycle(evaluation, full, sent)))
        rows.append(("steady cycle, nothing changed", *cycle(evaluation, full, sent)))
        for picked in (runs[1::10], runs[2::10] + runs[3::10]):  # 10 %, then 20 % others
            report_again(picked)
            rows.append((f"{len(picked):,} runs report again (run_silent resolves)",
                         *cycle(evaluation, full, sent)))
        # the durations the open alerts' words give move by a minute: every one is rewritten
        rows.append(("a minute later, nothing changed but words",
                     *cycle(evaluation, full, sent, timezone.now() + timedelta(seconds=61))))
        alone, grouped = runs[4::10][:100], runs[5::10][:100]
        report_again(alone + grouped)
        before, after = one_by_one(alone), together(grouped)
        per = analysis_cost(runs[-10:])
    firing = Alert.objects.filter(run__in=runs, state="firing").count()
    opened = list(Alert.objects.filter(run=runs[0], state="firing"))  # not among those back
    deliveries = Delivery.objects.filter(endpoint__project=runs[0].project).count()
    budget = settings.RECOVERYDASH_BEAT_REFRESH_BUDGET
    print(f"{count:,} runs not ended, {RANKS} ranks each (one process doing what the workers "
          f"share; beat period {PERIOD_S:g} s):")
    if count > MASS_OPEN_UPTO:
        print("  (2 alerts a run opened in bulk)")
    for name, took, n, f, d in rows:
        print(f"  {name:46s} {took:6.2f} s  reached {n:,}  in full {f:,}  deliveries {d:,}  "
              f"{took / count * 1e6:6.0f} us/run  ({took / PERIOD_S:.2f} of the period)")
    print(f"  100 changing runs evaluated one by one (the path before): {before * 10:.1f} ms a "
          f"run; together (one chunk): {after * 10:.1f} ms a run; ratio {after / before:.2f}")
    print(f"  open firing alerts after: {firing:,}; delivery rows {deliveries:,}; refresh budget "
          f"{budget} analyses a cycle requested from the workers at {per * 1000:.0f} ms each = "
          f"{budget * per:.1f} s of worker time per {PERIOD_S:g} s "
          f"({budget * per / (2 * PERIOD_S):.0%} of 2 workers)")
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
