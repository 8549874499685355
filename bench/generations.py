#!/usr/bin/env python
"""The worker's analysis of 1,000 new updates against the number of generations a run stored
(issue 13: a 1M-update run checkpointing every 500 updates has 2,000 generations).

In one process and one throwaway PostgreSQL database, two runs of bench/scale.py's shape (64
ranks, one update every 2 s, the SDK's heartbeats) with ``BENCH_LEVEL`` absorbed updates
(default 2,000: the first 1,000 through ingest, the rest bulk-built, :func:`scale.bulk_history`)
and ``BENCH_GENERATIONS`` checkpoints each (default ``20,2000``: bench/scale.py's 64-shard,
131-object generations through ingest, every object stored ``ok`` by the verifier's writer),
analysed once by the worker (``runs.analysis.analyze``); then per run 1,000 new updates through
ingest and the worker's analysis of them, timed (median of ``BENCH_REPEAT``, default 2, each
with its own 1,000 new updates), and the ratio of the most generations' time to the fewest's
printed: what the generations cost an analysis that has no new generation to judge.

Run: ``.venv/bin/python bench/generations.py`` (DATABASE_URL's server; the database
``benchgen`` is created and dropped). Note the load (``uptime``) beside the numbers.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ["DATABASE_URL"] = os.environ.get(
    "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/benchgen").rsplit("/", 1)[0] + "/benchgen"

import scale  # noqa: E402  (django.setup() on import)
from django.db import connection  # noqa: E402

LEVEL = int(os.environ.get("BENCH_LEVEL", "2000"))
GENERATIONS = [int(x) for x in os.environ.get("BENCH_GENERATIONS", "20,2000").split(",")]
REPEAT = int(os.environ.get("BENCH_REPEAT", "2"))


def build(n_generations: int) -> tuple:
    """A run of :data:`LEVEL` absorbed updates and ``n_generations`` verified generations,
    analysed once; returns ``(project, run, seconds to build)``."""
    from recoverydash.ingest.actions import ingest_batch
    from recoverydash.runs import analysis as bridge
    from recoverydash.runs.models import Analysis, Project, Run

    t0 = time.perf_counter()
    project = Project.objects.create(name=f"gen{n_generations}")
    ingest_batch(project, [scale.start_event()])
    ingested = min(1000, LEVEL)
    scale.ingest_updates(project, 1, ingested)
    run = Run.objects.get(project=project, run_id=scale.RUN_ID)
    bridge.analyze(run)
    analysis = Analysis.objects.get(run=run)
    ledger = bridge.load_state(analysis.pk, analysis.state)
    if LEVEL > ingested:
        scale.bulk_history(run, ingested + 1, LEVEL, ledger)
        scale.store_state(run, ledger)
    scale.CHECKPOINTS = n_generations
    saved = scale.checkpoints(project, run, LEVEL)
    assert saved == n_generations, (saved, n_generations)
    bridge.analyze(run)
    return project, run, time.perf_counter() - t0


def measure(project, run, level: int) -> list:
    """Seconds of the worker's analysis of 1,000 new updates (ingested first), :data:`REPEAT`
    times, from ``level``."""
    from recoverydash.runs import analysis as bridge

    out = []
    for k in range(REPEAT):
        first = level + 1 + k * scale.NEW
        scale.ingest_updates(project, first, first + scale.NEW - 1)
        run.refresh_from_db()
        t0 = time.perf_counter()
        found = bridge.analyze(run)
        out.append(time.perf_counter() - t0)
        summary = found.result["generations_summary"]
    print(f"  {summary['total']} generations {summary['by_status']}", flush=True)
    return out


def main() -> None:
    from django.core.management import call_command

    scale._use_database("postgres")
    scale._admin('DROP DATABASE IF EXISTS "benchgen"')
    scale._admin('CREATE DATABASE "benchgen"')
    try:
        scale._use_database("benchgen")
        call_command("migrate", verbosity=0)
        runs = {}
        for n in GENERATIONS:
            project, run, took = build(n)
            print(f"built {n} generations at {LEVEL} updates in {took:.0f} s", flush=True)
            runs[n] = (project, run)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        medians = {}
        for n in GENERATIONS:
            times = measure(*runs[n], LEVEL)
            medians[n] = statistics.median(times)
            print(f"{n:>6} generations: analysis of 1,000 new updates "
                  f"{', '.join(f'{t:.2f}' for t in times)} s (median {medians[n]:.2f} s)",
                  flush=True)
        low, high = min(GENERATIONS), max(GENERATIONS)
        print(f"ratio {high} / {low} generations: {medians[high] / medians[low]:.1f}x "
              f"(load {os.getloadavg()[0]:.1f})")
    finally:
        scale._use_database("postgres")
        scale._admin('DROP DATABASE IF EXISTS "benchgen"')


if __name__ == "__main__":
    main()
