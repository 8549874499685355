#!/usr/bin/env python
"""Storage in bytes per rank-update, as ingested and after compaction (issue 13, targets 400 and
50).

What it does, by itself (a few minutes on 2 shared cores):

1. for each of two ways a trainer reports, creates a throwaway PostgreSQL database
   (``bench.ingest.bench_database``: created, migrated, dropped afterwards);
2. ingests the same run through the real ingest path (``ingest.actions.ingest_batch``, the code
   behind the HTTP endpoint, minus HTTP): ``BENCH_UPDATES`` updates (default 2,000) x 64
   data-parallel ranks, one update every 2 s, each rank reporting the SDK's span (one strided
   range with its ``order`` digest) and one heartbeat with its read cursor every 30 s (the SDK's
   rate). ``per-rank``: every rank sends its own ``update_committed`` events, each rank in its
   own batches (``BENCH_BATCH`` updates a batch, default 25) as an SDK process does;
   ``aggregate``: one ``update_aggregate`` per update carrying every rank's part (rank 0 sends
   them, in batches of the same size), the heartbeats as before;
3. measures the live bytes: per table, its live rows copied into a fresh table with the same
   indexes (PostgreSQL never shrinks files without VACUUM FULL, and VACUUM FULL keeps rows
   deleted after the oldest snapshot of any session: either made an earlier "after compaction"
   figure meaningless), the heap with its TOAST (``pg_table_size``) and the indexes
   (``pg_indexes_size``), divided by the rank-updates ingested;
4. analyses the run (the stored ``Analysis.state`` absorbs everything), compacts with the default
   retention (the events are dated 10 days back, so all is old enough: ``runs.compaction.compact``
   until nothing is left to delete) and measures the same;
5. prints both tables and ``Analysis.state`` per rank-update, against the targets.

``BENCH_MODES=per-rank,per-rank-unjoined`` adds the per-rank run without folding ledger rows
across batches and prints the ratio of the two ingest times (same process).

Run: ``.venv/bin/python bench/storage.py``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest import bench_database  # noqa: E402  (bench/ingest.py)

WORLD = 64
UPDATES = int(os.environ.get("BENCH_UPDATES", "2000"))
BATCH = int(os.environ.get("BENCH_BATCH", "25"))
UPDATE_S = 2.0
HEARTBEAT_S = 30.0
PER_RANK = 8  # samples per rank per update
ORDER = "e1875493d62216fc6d36670795049f08"  # the SDK's order digest of the epoch
TABLES = ("runs_event", "runs_ledgerrow", "runs_heartbeat")
#: ``per-rank``, ``aggregate``, and ``per-rank-unjoined`` (per-rank without folding across
#: batches: the baseline of the ingest time, printed as a ratio when both per-rank modes run)
MODES = os.environ.get("BENCH_MODES", "per-rank,aggregate").split(",")
TARGET_INGESTED, TARGET_COMPACTED = 400, 50
T0 = datetime.now(UTC) - timedelta(days=10)


def stamp(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def spans(u: int, rank: int) -> list[dict]:
    """The SDK's span of ``rank`` at update ``u`` (sdk.ledger._spans:
    ``[r + lo*W, r + hi*W, W]``)."""
    lo = (u - 1) * PER_RANK
    return [{"stratum": "main", "epoch": 0, "ranges": [[rank + lo * WORLD,
                                                        rank + (lo + PER_RANK) * WORLD, WORLD]],
             "order": ORDER}]


def eid(rank, suffix: str) -> str:
    return f"bench-run:0:{rank}:{suffix}"  # sdk.client.Client.event_id's shape


def heartbeat(rank: int, u: int) -> dict:
    return {"event_id": eid(rank, f"heartbeat:{u:016x}"), "type": "heartbeat",
            "run_id": "bench-run", "attempt": 0, "rank": rank,
            "time": stamp(u * UPDATE_S + 0.5 + rank / 1000), "update": u,
            "fetched": [{"stratum": "main", "epoch": 0, "position": u * PER_RANK * WORLD}]}


def beats_due(u: int) -> bool:
    every = int(HEARTBEAT_S / UPDATE_S)
    return u % every == 0


def per_rank_batches():
    """Every rank's own batches: its update_committed events (each at its own moment: ranks do
    not report at the same microsecond) and heartbeats, ``BATCH`` updates a batch."""
    for first in range(1, UPDATES + 1, BATCH):
        for rank in range(WORLD):
            batch = []
            for u in range(first, min(first + BATCH, UPDATES + 1)):
                batch.append({"event_id": eid(rank, f"update:{u}"), "type": "update_committed",
                              "run_id": "bench-run", "attempt": 0, "rank": rank,
                              "time": stamp(u * UPDATE_S + rank / 1000), "update": u,
                              "samples": PER_RANK, "spans": spans(u, rank)})
                if beats_due(u):
                    batch.append(heartbeat(rank, u))
            yield batch


def aggregate_batches():
    """Rank 0's batches of one update_aggregate per update; every rank's heartbeats in its own
    batches, as before."""
    for first in range(1, UPDATES + 1, BATCH):
        last = min(first + BATCH, UPDATES + 1)
        yield [{"event_id": eid(0, f"update_aggregate:{u}"), "type": "update_aggregate",
                "run_id": "bench-run", "attempt": 0, "rank": 0, "time": stamp(u * UPDATE_S),
                "update": u, "ranks": [{"rank": r, "spans": spans(u, r), "samples": PER_RANK}
                                       for r in range(WORLD)]}
               for u in range(first, last)]
        for rank in range(WORLD):
            beats = [heartbeat(rank, u) for u in range(first, last) if beats_due(u)]
            if beats:
                yield beats


def start_event() -> dict:
    return {"event_id": eid(0, "attempt_started"), "type": "attempt_started",
            "run_id": "bench-run", "attempt": 0, "rank": 0, "time": stamp(0),
            "world_size": WORLD, "dataset_version": "v1", "global_batch_size": WORLD * PER_RANK}


def live_size(cursor, table: str) -> tuple[int, int]:
    """``(heap with TOAST, indexes)`` bytes the live rows of ``table`` take: copied into a fresh
    table with the same indexes (only visible rows are copied, so neither dead rows nor a
    snapshot held elsewhere count: VACUUM FULL keeps rows deleted after the oldest snapshot of
    the cluster's sessions, which made an earlier "after compaction" figure meaningless)."""
    copy = f"live_{table}"
    cursor.execute(f'CREATE TEMP TABLE "{copy}" AS SELECT * FROM "{table}"')
    cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", [table])
    for (definition,) in cursor.fetchall():
        head, _, tail = definition.partition(" ON ")
        name = head.split()[-1]
        using = tail.split(" USING ", 1)[1]
        cursor.execute(f'CREATE {"UNIQUE " if " UNIQUE " in head + " " else ""}INDEX '
                       f'"live_{name}" ON "{copy}" USING {using}')
    cursor.execute("SELECT pg_table_size(%s), pg_indexes_size(%s)", [copy, copy])
    heap, index = cursor.fetchone()
    cursor.execute(f'DROP TABLE "{copy}"')
    return heap, index


def sizes(connection) -> dict:
    """Live bytes per table (heap + TOAST) and of the three tables' indexes
    (:func:`live_size`), the stored analysis state, and the row counts."""
    with connection.cursor() as cursor:
        out = {}
        index = 0
        for table in TABLES:
            heap, idx = live_size(cursor, table)
            out[table] = heap
            index += idx
        out["indexes"] = index
        # the head and its time blocks (state format 6: runs.models.StateBlock)
        cursor.execute("SELECT coalesce(sum(octet_length(state)), 0) + (SELECT coalesce(sum("
                       "octet_length(data)), 0) FROM runs_stateblock) FROM runs_analysis")
        out["state"] = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM runs_ledgerrow")
        out["ledger rows"] = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM runs_event")
        out["events"] = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM runs_heartbeat")
        out["heartbeats"] = cursor.fetchone()[0]
    return out


@contextlib.contextmanager
def _unjoined():
    """Ingest without folding ledger rows across batches (the baseline of ``per-rank-unjoined``:
    one ledger row per rank-update, as before ``_Projection._join_stored``)."""
    from unittest import mock

    from recoverydash.ingest.actions import _Projection

    with mock.patch.object(_Projection, "_join_stored", lambda self, pending: pending):
        yield


def measure(mode: str) -> dict:
    """Ingest, measure, analyse, compact, measure, in a database of its own."""
    with bench_database(f"recoverydash_storage_{mode.replace('-', '_')}") as (name, url, env, _):
        import django
        from django.db import connections

        os.environ["DATABASE_URL"] = url
        if not getattr(measure, "ready", False):
            os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recoverydash.settings")
            os.environ.setdefault("CELERY_BROKER_URL", "memory://")
            django.setup()
            measure.ready = True
        from django.conf import settings
        from django.db import connection

        connections.close_all()
        settings.DATABASES["default"]["NAME"] = name
        connection.settings_dict["NAME"] = name
        from recoverydash.ingest.actions import ingest_batch
        from recoverydash.runs.analysis import analyze
        from recoverydash.runs.compaction import compact
        from recoverydash.runs.models import Project, Run

        project = Project.objects.create(name=f"bench-{mode}")
        ingest_batch(project, [start_event()])
        started = time.monotonic()
        batches = aggregate_batches() if mode == "aggregate" else per_rank_batches()
        n_batches = 0
        with (_unjoined() if mode == "per-rank-unjoined" else contextlib.nullcontext()):
            for batch in batches:
                ingest_batch(project, batch)
                n_batches += 1
        took = time.monotonic() - started
        ingested = sizes(connection)
        run = Run.objects.get(project=project)
        analyze(run)
        ingested["state"] = sizes(connection)["state"]  # the state once everything is absorbed
        settings.RECOVERYDASH_COMPACTION = True
        deleted = 0
        while True:
            n = compact()
            deleted += n
            if not n:
                break
        compacted = sizes(connection)
        connections.close_all()
        return {"ingested": ingested, "compacted": compacted, "batches": n_batches,
                "seconds": took, "deleted": deleted}


def report(mode: str, got: dict) -> None:
    rank_updates = UPDATES * WORLD
    print(f"\n{mode}: {UPDATES:,} updates x {WORLD} ranks = {rank_updates:,} rank-updates, "
          f"{got['batches']:,} batches ingested in {got['seconds']:.1f} s; "
          f"compaction deleted {got['deleted']:,} rows")
    print(f"{'bytes per rank-update':<24}{'as ingested':>14}{'after compaction':>18}")
    for key, label in (("runs_event", "events"), ("runs_ledgerrow", "ledger rows"),
                       ("runs_heartbeat", "heartbeats"), ("indexes", "indexes")):
        print(f"{label:<24}{got['ingested'][key] / rank_updates:>14.1f}"
              f"{got['compacted'][key] / rank_updates:>18.1f}")
    total = {k: sum(got[k][t] for t in TABLES + ("indexes",)) / rank_updates
             for k in ("ingested", "compacted")}
    print(f"{'total (raw rows)':<24}{total['ingested']:>14.1f}{total['compacted']:>18.1f}"
          f"   targets {TARGET_INGESTED} / {TARGET_COMPACTED}")
    print(f"{'Analysis.state':<24}{got['ingested']['state'] / rank_updates:>14.1f}"
          f"{got['compacted']['state'] / rank_updates:>18.1f}   (once all is absorbed)")
    print(f"{'total with the state':<24}"
          f"{total['ingested'] + got['ingested']['state'] / rank_updates:>14.1f}"
          f"{total['compacted'] + got['compacted']['state'] / rank_updates:>18.1f}")
    print(f"{'rows (events/ledger/hb)':<24}"
          f"{got['ingested']['events']:>6,}/{got['ingested']['ledger rows']:,}/"
          f"{got['ingested']['heartbeats']:,}"
          f"   after: {got['compacted']['events']:,}/{got['compacted']['ledger rows']:,}/"
          f"{got['compacted']['heartbeats']:,}")


def main() -> int:
    print(f"bench/storage.py: live bytes (live rows copied with their indexes; pg_table_size with "
          f"TOAST, pg_indexes_size), heartbeats 1 per rank per {HEARTBEAT_S:.0f} s at 1 update per "
          f"{UPDATE_S:.0f} s, batches of {BATCH} updates")
    got = {}
    for mode in MODES:
        got[mode] = measure(mode)
        report(mode, got[mode])
    if "per-rank" in got and "per-rank-unjoined" in got:
        a, b = got["per-rank"]["seconds"], got["per-rank-unjoined"]["seconds"]
        print(f"\nper-rank ingest with folding across batches / without (same process): "
              f"{a:.1f} / {b:.1f} s = {a / b:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
