"""Server time to render the run page and its chart data for a long run.

A run of 1,000,000 updates, 2,000 generations and 20 restarts (21 attempts), fabricated
directly as rows and a stored analysis in the shape the recovery core writes (the fields of
docs/ingest-v1.md#recovery, ``costs``, and ``charts``: the committed cursor bounded per attempt,
the sawtooth of seconds since the last restorable generation from the core's ``tslrc_sawtooth``),
so no ledger is ingested. Measured through
Django's test client in one process, median of 20 requests each:

- the run page and ``charts.json`` with the figure cache cleared before every request (the cost
  of building every figure from the stored analysis and the tables);
- the same with the cache warm (what the 10 s poller and a second viewer pay);
- the worst case: the analysis holding a sawtooth of 1,000,000 points (``charts.tslrc`` of
  500,000 restorable generations) and a committed cursor of 1,000,000 points, downsampled on the
  server;
- baseline in the same process: the login page (a trivial template) and the run page with the
  charts built from the same 1,000,000-point series *without* downsampling (what sending
  everything would cost the server, before the browser even starts).

Run: ``.venv/bin/python bench/dashboard.py`` (DATABASE_URL defaults to the local PostgreSQL; a
throwaway test database is created and dropped). Prints the medians; the last line is the run
page's cold median against the 300 ms target.
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

from django.core.cache import cache  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402
from django.urls import reverse  # noqa: E402

from recoverydash.recovery.figures import tslrc_sawtooth  # noqa: E402

UPDATES = 1_000_000
GENERATIONS = 2_000
RESTARTS = 20
REQUESTS = 20
T0 = datetime(2026, 1, 1, tzinfo=UTC)
SECONDS_PER_UPDATE = 2.0


def iso(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def fabricate():
    """Rows and a stored analysis of a 1,000,000-update run; returns (client, run, result)."""
    from django.contrib.auth import get_user_model

    from recoverydash.alerts.models import Alert
    from recoverydash.runs.models import Analysis, Attempt, Generation, Membership, Project, Run

    project = Project.objects.create(name="bench")
    user = get_user_model().objects.create_user("bench", password="bench-password")
    Membership.objects.create(project=project, user=user)
    end = UPDATES * SECONDS_PER_UPDATE
    run = Run.objects.create(project=project, run_id="llama-1m", first_event_at=T0,
                             last_event_at=T0 + timedelta(seconds=end), ingest_seq=10_000,
                             contract={"max_checkpoint_age_s": 3600})
    per_attempt = UPDATES // (RESTARTS + 1)
    attempts = []
    for k in range(RESTARTS + 1):
        start_u = k * per_attempt
        attempts.append(Attempt(
            run=run, attempt=k, started_at=T0 + timedelta(seconds=start_u * SECONDS_PER_UPDATE),
            world_size=64, dataset_version="v1", global_batch_size=4096,
            ended_at=None if k == RESTARTS else
            T0 + timedelta(seconds=(start_u + per_attempt) * SECONDS_PER_UPDATE),
            end_reason="" if k == RESTARTS else "failed",
            end_update=None if k == RESTARTS else start_u + per_attempt,
            last_update=start_u + per_attempt,
            resumed_from=None if k == 0 else {"generation_id": f"g{start_u}", "update": start_u,
                                               "cursor": []}))
    Attempt.objects.bulk_create(attempts)
    every = UPDATES // GENERATIONS
    gens, items = [], []
    for i in range(GENERATIONS):
        u = (i + 1) * every
        status = "rejected" if i % 97 == 5 else "restorable"
        reasons = [{"code": "shard_missing", "detail": "rank63 never written"}] \
            if status == "rejected" else []
        committed = T0 + timedelta(seconds=u * SECONDS_PER_UPDATE + 30)
        gens.append(Generation(
            run=run, generation_id=f"g{u}", attempt=min(u // per_attempt, RESTARTS), update=u,
            started_at=committed - timedelta(seconds=30), committed_at=committed, status=status,
            reasons=reasons, manifest={"data_progress": {"cursor": [
                {"stratum": f"s{s}", "epoch": 0, "position": u * 1024} for s in range(4)]}}))
        items.append({"generation_id": f"g{u}", "attempt": min(u // per_attempt, RESTARTS),
                      "update": u, "status": status, "reasons": reasons})
    Generation.objects.bulk_create(gens, batch_size=500)
    restarts = [{
        "attempt": k, "resumed_from": f"g{k * per_attempt}", "resumed_update": k * per_attempt,
        "world_size_before": 64, "world_size_after": 64,
        "expected_cursor": [{"stratum": f"s{s}", "epoch": 0, "position": k * per_attempt * 1024}
                            for s in range(4)],
        "resume_cursor": [{"stratum": f"s{s}", "epoch": 0, "position": k * per_attempt * 1024}
                          for s in range(4)],
        "replayed": 0, "omitted": 0 if k % 7 else 48, "recomputed": 4096, "lost_updates": 120,
        "lost_seconds": 240.0, "recovery_seconds": 300.0,
        "verdict": "exact" if k % 7 else "omission", "findings": []}
        for k in range(1, RESTARTS + 1)]
    charts = {"committed_cursor": [{"attempt": k, "points": [
        {"time": iso(u * SECONDS_PER_UPDATE), "update": u,
         "cursor": [{"stratum": f"s{s}", "epoch": 0, "position": u * 1024} for s in range(4)]}
        for u in range(k * per_attempt + 1, (k + 1) * per_attempt + 1, per_attempt // 200)]}
        for k in range(RESTARTS + 1)], "fetched": [],
        "tslrc": tslrc_sawtooth([(g["update"], T0.timestamp() + g["update"] * SECONDS_PER_UPDATE
                                  + 30) for g in items if g["status"] == "restorable"],
                                T0.timestamp(), T0.timestamp() + end + 60)}
    result = {
        "run_id": run.run_id, "health": "ok",
        "last_restorable": {"generation_id": f"g{UPDATES}", "update": UPDATES,
                            "committed_at": iso(end + 30)},
        "seconds_since_last_restorable": 60.0, "updates_at_risk": 0,
        "generations": items, "restarts": restarts,
        "strata": [{"stratum": f"s{s}", "consumed": UPDATES * 1024, "duplicates": 0,
                    "omissions": 48 * 3, "duplicate_rate": 0.0,
                    "omission_rate": 144 / (UPDATES * 1024)} for s in range(4)],
        "costs": {"goodput": 0.96, "mtbf_seconds": end / RESTARTS, "median_save_seconds": 30.0,
                  "young_interval_seconds": (2 * 30 * end / RESTARTS) ** 0.5,
                  "observed_interval_seconds": every * SECONDS_PER_UPDATE},
        "charts": charts, "first_event_at": T0.isoformat(), "ended_at": None,
    }
    Analysis.objects.create(run=run, ingest_seq=10_000, health="ok", result=result)
    for k in range(1, RESTARTS + 1, 7):
        Alert.objects.create(run=run, rule="restart_omission", subject=str(k),
                             dedup_key=f"llama-1m:restart_omission:{k}", severity="critical",
                             summary=f"Attempt {k} skipped 48 positions.")
    client = Client()
    client.force_login(user)
    return client, run, result


def full_series(charts: dict) -> dict:
    """``charts`` with 1,000,000-point series: a sawtooth of 500,000 restorable generations
    (one every 2 updates) and a committed cursor of one attempt with a point per update."""
    t0 = T0.timestamp()
    tslrc = tslrc_sawtooth([(u, t0 + u * SECONDS_PER_UPDATE) for u in range(2, UPDATES, 2)],
                           t0, t0 + UPDATES * SECONDS_PER_UPDATE)
    committed = [{"attempt": 0, "points": [
        {"time": iso(u * SECONDS_PER_UPDATE), "update": u,
         "cursor": [{"stratum": "s0", "epoch": 0, "position": u * 1024}]}
        for u in range(1, UPDATES + 1)]}]
    return dict(charts, tslrc=tslrc, committed_cursor=committed)


def median_ms(fn, n: int = REQUESTS, clear: bool = False) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(n):
        if clear:
            cache.clear()
        started = time.perf_counter()
        response = fn()
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.status_code
        size = len(response.content)
    return statistics.median(times), size


def main() -> None:
    setup_test_environment()
    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        from recoverydash.dashboard import charts
        from recoverydash.runs.models import Analysis

        client, run, result = fabricate()
        page = reverse("run", args=[run.project.name, run.run_id])
        data = reverse("run_charts", args=[run.project.name, run.run_id])
        client.get(page)  # warm imports and template loading
        rows = []
        rows.append(("run page, figures built per request", *median_ms(
            lambda: client.get(page), clear=True)))
        rows.append(("charts.json, figures built per request", *median_ms(
            lambda: client.get(data), clear=True)))
        rows.append(("run page, figure cache warm", *median_ms(lambda: client.get(page))))
        rows.append(("fleet page", *median_ms(lambda: client.get("/"))))
        anonymous = Client()
        rows.append(("baseline: login page (trivial template)", *median_ms(
            lambda: anonymous.get("/login/?next=/"))))

        full = dict(result, charts=full_series(result["charts"]))
        Analysis.objects.filter(run=run).update(result=full)
        rows.append(("run page, +1M-point series stored, per request", *median_ms(
            lambda: client.get(page), n=5, clear=True)))
        rows.append(("run page, +1M-point series stored, cache warm", *median_ms(
            lambda: client.get(page))))
        original = charts.downsample, charts.downsample_gapped, charts.thin
        # baseline: the same figures without downsampling
        charts.downsample = lambda xs, ys, max_points=0: (list(xs), list(ys))
        charts.downsample_gapped = lambda xs, ys, max_points=0: (list(xs), list(ys))
        charts.thin = lambda items, max_points=0: list(items)
        try:
            cache.clear()
            built = charts.build_run_figures(run)
            points = sum(charts.points_in(f) for f in built.values())
            rows.append(("baseline: run page, 1M-point series NOT downsampled", *median_ms(
                lambda: client.get(page), n=3, clear=True)))
        finally:
            charts.downsample, charts.downsample_gapped, charts.thin = original
        cache.clear()
        bounded = sum(charts.points_in(f) for f in charts.build_run_figures(run).values())

        width = max(len(r[0]) for r in rows)
        print(f"run: {UPDATES:,} updates, {GENERATIONS:,} generations, {RESTARTS} restarts; "
              f"median of {REQUESTS} requests (5 or 3 for the 1M-point rows)")
        for name, ms, size in rows:
            print(f"  {name:<{width}}  {ms:8.1f} ms  {size / 1024:8.0f} KiB")
        print(f"  points sent with downsampling: {bounded:,}; without: {points:,}")
        cold = rows[0][1]
        print(f"run page median {cold:.1f} ms (figures built per request; target < 300 ms), "
              f"baseline login page {rows[4][1]:.1f} ms, ratio {cold / rows[4][1]:.1f}x")
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
