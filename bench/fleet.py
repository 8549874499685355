"""Server time of the fleet page at 1,000 and 10,000 runs.

Runs are fabricated as rows (a run, its stored analysis in the shape the recovery core writes
the small keys the fleet reads plus a chart series of 2,000 points per run so the stored
results are not trivially small, two attempts, and open alerts on one run in ten: critical on one
in fifty), so nothing is ingested. Measured through Django's test client in one process, 30
requests each after two warm-up requests, the p50 and p95 of:

- ``GET /`` (the default "needs attention" view, attention order, first page of 50);
- ``GET /?view=all`` (every run in attention order, first page);
- ``GET /?view=all&sort=-last_event&page=20`` (another sort, a later page);
- baseline in the same process: listing the same runs' ids and names
  (``Run.objects.values_list("pk", "run_id")``), what any page that shows every run pays before
  it computes anything.

Run: ``.venv/bin/python bench/fleet.py`` (DATABASE_URL defaults to the local PostgreSQL; a
throwaway test database is created and dropped). Prints one line per measurement with its ratio
to the baseline, and a last line per size against the 300 ms target.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recoverydash.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402

SIZES = (1_000, 10_000)
REQUESTS = 30
TARGET_MS = 300.0
SERIES_POINTS = 2_000


def fabricate(project, start: int, count: int) -> None:
    """``count`` more runs numbered from ``start`` (bulk inserts, no per-run query)."""
    from recoverydash.alerts.models import Alert
    from recoverydash.runs.models import Analysis, Attempt, Run, clock_columns, clock_of

    now = datetime.now(UTC)
    runs = [Run(project=project, run_id=f"run-{i:05d}", first_event_at=now - timedelta(hours=6),
                last_event_at=now - timedelta(seconds=i % 900),
                last_received_at=now - timedelta(seconds=i % 900), ingest_seq=10)
            for i in range(start, start + count)]
    Run.objects.bulk_create(runs, batch_size=1000)
    runs = list(Run.objects.filter(run_id__in=[r.run_id for r in runs]).order_by("pk"))
    health = ("ok", "ok", "ok", "at_risk", "failing", "ended")
    series = [[k * 10, float(k % 600)] for k in range(SERIES_POINTS)]
    analyses, attempts, alerts = [], [], []
    for n, run in enumerate(runs):
        i = start + n
        word = health[i % len(health)]
        committed = now - timedelta(seconds=(i * 37) % 7200)
        analyses.append(Analysis(run=run, ingest_seq=10, health=word, result=(result := {
            "health": word, "first_event_at": run.first_event_at.isoformat(),
            "ended_at": now.isoformat() if word == "ended" else None,
            "last_restorable": {"generation_id": f"g{i}", "update": 1000 + i,
                                "committed_at": committed.isoformat()},
            "updates_at_risk": i % 50,
            "restarts": [{"attempt": 1, "verdict": "exact", "replayed": 0, "omitted": 0}],
            "charts": {"tslrc": series}}), clock=(clock := clock_of(result)),
            **clock_columns(clock)))
        attempts += [Attempt(run=run, attempt=0, ended_at=now - timedelta(hours=3)),
                     Attempt(run=run, attempt=1,
                             ended_at=now if word == "ended" else None)]
        if i % 10 == 0:
            severity = "critical" if i % 50 == 0 else "warning"
            alerts.append(Alert(run=run, rule="checkpoint_stale",
                                dedup_key=f"{run.run_id}:checkpoint_stale:", severity=severity,
                                summary="stale"))
    Analysis.objects.bulk_create(analyses, batch_size=500)
    Attempt.objects.bulk_create(attempts, batch_size=1000)
    Alert.objects.bulk_create(alerts, batch_size=1000)


def percentiles(fn, n: int = REQUESTS) -> tuple[float, float]:
    for _ in range(2):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(round(0.95 * len(times))) - 1)]


def main() -> None:
    setup_test_environment()
    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        from django.contrib.auth import get_user_model

        from recoverydash.runs.models import Project, Run

        project = Project.objects.create(name="bench")
        user = get_user_model().objects.create_superuser("bench", "b@example.com", "pw")
        client = Client()
        client.force_login(user)
        have = 0
        for size in SIZES:
            fabricate(project, have, size - have)
            have = size
            with connection.cursor() as cur:
                cur.execute("ANALYZE")

            def get(path):
                response = client.get(path)
                assert response.status_code == 200, response.status_code
                return response

            base50, base95 = percentiles(lambda: list(Run.objects.values_list("pk", "run_id")))
            print(f"{size:>6} runs  baseline: list every run's id        "
                  f"p50 {base50:7.1f} ms  p95 {base95:7.1f} ms")
            worst = 0.0
            for label, path in (("GET / (needs attention)", "/"),
                                ("GET /?view=all", "/?view=all"),
                                ("GET /?view=all&sort=-last_event&page=20",
                                 "/?view=all&sort=-last_event&page=20")):
                p50, p95 = percentiles(lambda path=path: get(path))
                worst = max(worst, p95)
                size_kb = len(get(path).content) / 1024
                print(f"{size:>6} runs  {label:<38} p50 {p50:7.1f} ms  p95 {p95:7.1f} ms  "
                      f"({p50 / base50:.1f}x baseline, {size_kb:.0f} KiB)")
            print(f"{size:>6} runs  worst p95 {worst:.1f} ms against the {TARGET_MS:.0f} ms "
                  f"target: {'met' if worst < TARGET_MS else 'MISSED'}")
    finally:
        connection.close()
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
