#!/usr/bin/env python
"""Ingest into ONE run from several web processes (issue 13, build 3): is a run still
serialised by its row lock?

For 1, 2 and 4 gunicorn sync workers (``BENCH_WORKER_COUNTS``, default ``1,2,4``), on a
throwaway PostgreSQL database (as ``bench/ingest.py``):

1. ``2 x workers`` client threads post batches of 1,000 ``update_committed`` events of 64 ranks
   (one strided span each, as the SDK sends them) into one run, interleaved (client c sends
   batches c, c + clients, ...), for ``BENCH_SECONDS`` (default 8);
2. the same clients then post the same amount into one run each (nothing shared: the baseline
   of this machine, in the same process, right after);
3. prints events/s and rank-updates/s of both and their ratio. A ratio near 1 says one run
   takes what the web processes can take; under the old run-row lock held for the whole
   transaction it fell with every process added (issue 13 measured 8 ms of lock per 1-event
   request and 72 ms per 1,000 events: at most about 13,900 events/s into one run, whatever the
   number of processes; printed beside).

``BENCH_AGGREGATE=1`` sends the same rank-updates as ``update_aggregate`` events (every rank's
spans of one update in one event; docs/ingest-v1.md#update_aggregate) instead.

Run: ``.venv/bin/python bench/ingest_one_run.py``. The machine's other load shows in both
columns; compare the ratio, not the absolute rates, between machines.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ingest import BATCH, PER_RANK, WORLD, bench_database, start_server, stop_server

SECONDS = float(os.environ.get("BENCH_SECONDS", "8"))
WORKER_COUNTS = [int(x) for x in os.environ.get("BENCH_WORKER_COUNTS", "1,2,4").split(",")]
AGGREGATE = os.environ.get("BENCH_AGGREGATE", "") not in ("", "0")
#: Issue 13's measurement of the run-row lock design (2 cores, PostgreSQL): the ceiling of
#: events/s into one run, whatever the number of web processes.
OLD_CEILING = 13_900
T = "2026-11-01T00:00:05.250+00:00"


def rank_updates(run_id: str, batch_no: int) -> list[dict]:
    """Batch ``batch_no`` of a run as per-rank events: 1,000 rank-updates (rank = i % 64)."""
    out = []
    gbs = WORLD * PER_RANK
    for i in range(batch_no * BATCH, (batch_no + 1) * BATCH):
        update, rank = 1 + i // WORLD, i % WORLD
        base = (update - 1) * gbs
        out.append({"event_id": f"{run_id}-{update}-{rank}", "type": "update_committed",
                    "run_id": run_id, "attempt": 0, "time": T, "rank": rank, "update": update,
                    "samples": PER_RANK, "spans": [{"stratum": "main", "epoch": 0,
                                                    "ranges": [[base + rank, base + gbs, WORLD]]}]})
    return out


def aggregates(run_id: str, batch_no: int) -> list[dict]:
    """The same 1,000 rank-updates per batch as update_aggregate events (64 ranks each), so
    about 16 events per batch (batches cover whole updates: 1,024 rank-updates)."""
    per_batch = BATCH // WORLD + 1
    out = []
    gbs = WORLD * PER_RANK
    for update in range(1 + batch_no * per_batch, 1 + (batch_no + 1) * per_batch):
        base = (update - 1) * gbs
        out.append({"event_id": f"{run_id}-{update}", "type": "update_aggregate",
                    "run_id": run_id, "attempt": 0, "time": T, "update": update,
                    "world_size": WORLD,
                    "ranks": [{"rank": r, "samples": PER_RANK,
                               "spans": [{"stratum": "main", "epoch": 0,
                                          "ranges": [[base + r, base + gbs, WORLD]]}]}
                              for r in range(WORLD)]})
    return out


def updates_in(body: list[dict]) -> int:
    return sum(len(e["ranks"]) if e["type"] == "update_aggregate" else 1 for e in body)


def send(port: int, token: str, runs: list[str], clients: int, seconds: float,
         first: int) -> tuple[int, int, float]:
    """``clients`` threads posting for ``seconds``; client c posts into ``runs[c % len(runs)]``
    batches first + c, first + c + clients, ... Returns (events, rank-updates, seconds)."""
    url = f"http://127.0.0.1:{port}/api/v1/events"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    make = aggregates if AGGREGATE else rank_updates
    per_client = int(seconds * 6) + 3  # more than a client gets through on 2 cores
    bodies = {c: [make(runs[c % len(runs)], first + c + k * clients) for k in range(per_client)]
              for c in range(clients)}
    raw = {c: [json.dumps({"events": b}).encode() for b in bodies[c]] for c in range(clients)}
    stop = threading.Event()
    counts = [[0, 0] for _ in range(clients)]
    finished: list[float] = []
    errors: list[str] = []

    def client(c: int) -> None:
        with httpx.Client(timeout=120) as session:
            for body, events in zip(raw[c], bodies[c]):
                if stop.is_set():
                    return
                r = session.post(url, content=body, headers=headers)
                if r.status_code != 202 or r.json()["accepted"] != len(events):
                    errors.append(f"{r.status_code} {r.text[:300]}")
                    stop.set()
                    return
                counts[c][0] += len(events)
                counts[c][1] += updates_in(events)
        finished.append(time.perf_counter())  # ran out of batches before the time was up

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = (max(finished) if len(finished) == clients else time.perf_counter()) - started
    if errors:
        raise SystemExit(f"ingest failed: {errors[0]}")
    return sum(c[0] for c in counts), sum(c[1] for c in counts), elapsed


def main() -> int:
    with bench_database("recoverydash_bench_one") as (name, _url, env, token):
        server = None
        rows = []
        try:
            kind = "update_aggregate (64 ranks per event)" if AGGREGATE else "update_committed"
            print(f"PostgreSQL database {name}; batches of {kind} events, 1,000 rank-updates each, "
                  f"{WORLD} ranks; {SECONDS:.0f} s per measurement; {os.cpu_count()} cores")
            for workers in WORKER_COUNTS:
                server, port = start_server(env, workers)
                clients = 2 * workers
                send(port, token, [f"warm-{workers}"], clients, 1.5, 0)
                one = send(port, token, [f"one-{workers}"], clients, SECONDS, 0)
                many = send(port, token, [f"many-{workers}-{c}" for c in range(clients)], clients,
                            SECONDS, 0)
                stop_server(server)
                server = None
                rows.append((workers, clients, one, many))
            print(f"{'web processes':>13} {'clients':>7} {'one run ev/s':>13} "
                  f"{'rank-upd/s':>11} {'a run each rank-upd/s':>22} {'one/each':>9} "
                  f"{'old ceiling ev/s':>17}")
            for workers, clients, one, many in rows:
                one_ev, one_ru = one[0] / one[2], one[1] / one[2]
                many_ru = many[1] / many[2]
                print(f"{workers:>13} {clients:>7} {one_ev:>13,.0f} {one_ru:>11,.0f} "
                      f"{many_ru:>22,.0f} {one_ru / many_ru:>9.2f} {OLD_CEILING:>17,}")
            best = max(r[2][1] / r[2][2] for r in rows)
            print(f"target: at least 50,000 rank-updates/s into one run with 4 web processes; "
                  f"best measured {best:,.0f}")
            return 0
        finally:
            stop_server(server)


if __name__ == "__main__":
    sys.exit(main())
