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

Both shapes are measured, one after the other (``BENCH_KINDS``, default ``per-rank,aggregate``):
per-rank ``update_committed`` events, and the same rank-updates as ``update_aggregate`` events
(every rank's spans of one update in one event; docs/ingest-v1.md#update_aggregate). The web
CPU (user + system of the gunicorn processes, from ``/proc``) is read around each measurement:
printed per rank-update.

Then the cost model of one request with 1 web process (``BENCH_COST_SECONDS``, default 6, per
size): requests of 1 event and of 1,000 events (``update_committed``, 2 clients), each size's web
CPU per request, solved for ``c_req`` (CPU per request whatever it carries) and ``c_ev`` (CPU per
event): ``cpu(1) = c_req + c_ev``, ``cpu(1000) = c_req + 1000 c_ev``; checked against requests of
62 events (what one rank of a 16,384-rank job sends with the SDK's default flush policy: 60
updates and 2 heartbeats per 60 s, recoverydash/sdk/flush.py). And the projection for a
16,384-rank job at one update per second with the SDK's defaults, arithmetic shown, against the
target of 2 web cores (the old default of a 1 s flush per rank beside it). PostgreSQL's own CPU
is not in these figures (web processes only).

Last, what noting one request's rank costs the database at 16,384 ranks (``ranks_seen_write``): the
RankSeen upsert of that rank's row against the jsonb merge of the whole ``rank_seen_at`` map it
replaced, in this process.

This machine may have 2 cores: 4 web processes and their clients then share them, so the 4-process
rows measure contention, not scaling (the bench says so when it sees fewer cores than processes).

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
COST_SECONDS = float(os.environ.get("BENCH_COST_SECONDS", "6"))
WORKER_COUNTS = [int(x) for x in os.environ.get("BENCH_WORKER_COUNTS", "1,2,4").split(",")]
KINDS = os.environ.get("BENCH_KINDS", "per-rank,aggregate").split(",")
#: The projected job (issue 13): ranks, updates per second, the SDK's heartbeat interval (s).
JOB_RANKS, JOB_UPDATES_PER_S, HEARTBEAT_S = 16_384, 1.0, 30.0
TARGET_CORES = 2.0
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
                    "samples": PER_RANK,
                    "spans": [{"stratum": "main", "epoch": 0,
                               "ranges": [[base + rank, base + rank + gbs, WORLD]]}]})
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
                                          "ranges": [[base + r, base + r + gbs, WORLD]]}]}
                              for r in range(WORLD)]})
    return out


def updates_in(body: list[dict]) -> int:
    return sum(len(e["ranks"]) if e["type"] == "update_aggregate" else 1 for e in body)


def small_batches(size: int):
    """A maker of batches of ``size`` per-rank events (the first ``size`` of each 1,000)."""
    def make(run_id: str, batch_no: int) -> list[dict]:
        return rank_updates(run_id, batch_no)[:size]
    return make


def web_cpu(server) -> float:
    """CPU seconds (user + system) of the gunicorn master and its workers so far (``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pids = [server.pid]
    try:
        with open(f"/proc/{server.pid}/task/{server.pid}/children") as f:
            pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def send(port: int, token: str, runs: list[str], clients: int, seconds: float,
         first: int, make=rank_updates, rate: float = 6.0) -> tuple[int, int, float, int]:
    """``clients`` threads posting for ``seconds``; client c posts into ``runs[c % len(runs)]``
    batches first + c, first + c + clients, ... made by ``make`` (about ``rate`` per client per
    second prepared). Returns (events, rank-updates, seconds, requests)."""
    url = f"http://127.0.0.1:{port}/api/v1/events"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    per_client = int(seconds * rate) + 3  # more than a client gets through on 2 cores
    bodies = {c: [make(runs[c % len(runs)], first + c + k * clients) for k in range(per_client)]
              for c in range(clients)}
    raw = {c: [json.dumps({"events": b}).encode() for b in bodies[c]] for c in range(clients)}
    stop = threading.Event()
    counts = [[0, 0, 0] for _ in range(clients)]
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
                counts[c][2] += 1
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
    return (sum(c[0] for c in counts), sum(c[1] for c in counts), elapsed,
            sum(c[2] for c in counts))


def measured(server, *args, **kw) -> tuple[int, int, float, int, float]:
    """:func:`send` with the web CPU seconds it cost appended."""
    before = web_cpu(server)
    out = send(*args, **kw)
    return out + (web_cpu(server) - before,)


def one_run_table(env: dict, token: str, kind: str) -> list[tuple]:
    """Events/s into one run and into a run each, for every web-process count, of one kind."""
    make = aggregates if kind == "aggregate" else rank_updates
    rows = []
    for workers in WORKER_COUNTS:
        server, port = start_server(env, workers)
        try:
            clients = 2 * workers
            send(port, token, [f"warm-{kind}-{workers}"], clients, 1.5, 0, make)
            one = measured(server, port, token, [f"one-{kind}-{workers}"], clients, SECONDS, 0,
                           make)
            many = measured(server, port, token,
                            [f"many-{kind}-{workers}-{c}" for c in range(clients)], clients,
                            SECONDS, 0, make)
        finally:
            stop_server(server)
        rows.append((workers, clients, one, many))
    label = ("update_aggregate (64 ranks per event)" if kind == "aggregate"
             else "per-rank update_committed")
    print(f"\n{label}: batches of ~1,000 rank-updates, {2} clients per web process")
    print(f"{'web processes':>13} {'one run ev/s':>13} {'rank-upd/s':>11} "
          f"{'web CPU us/rank-upd':>20} {'a run each rank-upd/s':>22} {'one/each':>9}")
    for workers, _clients, one, many in rows:
        one_ev, one_ru = one[0] / one[2], one[1] / one[2]
        many_ru = many[1] / many[2]
        print(f"{workers:>13} {one_ev:>13,.0f} {one_ru:>11,.0f} {one[4] / one[1] * 1e6:>20.1f} "
              f"{many_ru:>22,.0f} {one_ru / many_ru:>9.2f}")
    return rows


def one_rank_of(world: int, run_id: str):
    """A maker of the request one rank of a ``world``-rank job sends with the SDK's default
    policy at 16,384 ranks: its 60 updates and 2 heartbeats (batch b: rank b % world)."""
    def make(_run: str, batch_no: int) -> list[dict]:
        rank, k = batch_no % world, batch_no // world  # the rank's k-th request
        out = []
        for u in range(1 + 60 * k, 61 + 60 * k):
            base = (u - 1) * world * PER_RANK
            out.append({"event_id": f"{run_id}-{u}-{rank}", "type": "update_committed",
                        "run_id": run_id, "attempt": 0, "time": T, "rank": rank, "update": u,
                        "samples": PER_RANK, "spans": [{"stratum": "main", "epoch": 0, "ranges": [
                            [base + rank, base + world * PER_RANK, world]]}]})
        out += [{"event_id": f"{run_id}-hb{2 * k + j}-{rank}", "type": "heartbeat",
                 "run_id": run_id, "attempt": 0, "time": T, "rank": rank,
                 "update": 60 * k + 30 * (j + 1)} for j in range(2)]
        return out
    return make


def wide_attempt(server, port: int, token: str, db: str, world: int = JOB_RANKS,
                 clients: int = 1, run_id: str = "wide") -> tuple[float, float]:
    """(web CPU per request, requests/s) of :func:`one_rank_of` into one run whose attempt has
    heard from all ``world`` ranks (its RankSeen rows filled first), from ``clients``
    clients: with 1, the wall time per request is its latency, run lock and database work
    included."""
    import psycopg

    make = one_rank_of(world, run_id)
    send(port, token, [run_id], 1, 0.5, 0, make, 4.0)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO runs_rankseen (attempt_id, reporter, seen_at) SELECT a.id, "
                     "r::text, '2026-12-01T00:00:00+00:00' FROM runs_attempt a, "
                     "generate_series(0, %s) r WHERE a.run_id = (SELECT id FROM runs_run WHERE "
                     "run_id = %s) ON CONFLICT DO NOTHING", (world - 1, run_id))
    ev, _, secs, requests, cpu = measured(server, port, token, [run_id], clients, COST_SECONDS,
                                          1000, make, 40.0)
    print(f"requests of one rank of a {world:,}-rank attempt (60 updates + 2 heartbeats) from "
          f"{clients} client(s) into one run: {requests / secs:,.0f} requests/s "
          f"({ev / secs:,.0f} events/s), web CPU {cpu / requests * 1e3:.2f} ms per request"
          + (f", latency {secs / requests * 1e3:.1f} ms" if clients == 1 else ""))
    return cpu / requests, requests / secs


def wide_one_run(env: dict, token: str, db: str) -> None:
    """The requests of a large job's ranks into ONE run, 2 web processes and 4 clients, at 64
    and at 16,384 ranks: what the run's lock and the attempt's per-rank rows allow, against
    the requests/s the SDK's default sends at 16,384 ranks."""
    from recoverydash.sdk.flush import FlushPolicy

    server, port = start_server(env, 2)
    try:
        rates = {w: wide_attempt(server, port, token, db, w, 4, f"wide-one-{w}")[1]
                 for w in (WORLD, JOB_RANKS)}
    finally:
        stop_server(server)
    need = FlushPolicy(world_size=JOB_RANKS).job_requests()
    print(f"a {JOB_RANKS:,}-rank job sends {need:,.0f} requests/s with the SDK's default; one run "
          f"took {rates[JOB_RANKS]:,.0f} ({rates[WORLD]:,.0f} at {WORLD} ranks)")


def ranks_seen_write(db: str, world: int = JOB_RANKS, reps: int = 200) -> None:
    """What noting one request's reporter costs the database at ``world`` ranks, in this process
    (autocommit, one statement each, ``reps`` requests of ranks 0, 1, ...): the RankSeen upsert
    (``runs.models.RankSeen.note``'s PostgreSQL statement, one row) against the statement it
    replaced, the jsonb merge of the whole ``rank_seen_at`` map (8a8a710), on a scratch table
    holding one ``world``-entry map. Both are written under the run's row lock by ingest."""
    import psycopg

    stamp = "2026-12-01T01:00:00+00:00"
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE bench_old_map (id bigint PRIMARY KEY, rank_seen_at jsonb)")
        conn.execute("INSERT INTO bench_old_map SELECT 1, jsonb_object_agg(r::text, "
                     "'2026-12-01T00:00:00+00:00') FROM generate_series(0, %s) r", (world - 1,))
        [(attempt_pk,)] = conn.execute(
            "SELECT a.id FROM runs_attempt a JOIN runs_run r ON r.id = a.run_id "
            "WHERE r.run_id = %s", (f"wide-one-{world}",)).fetchall()
        conn.execute("INSERT INTO runs_rankseen (attempt_id, reporter, seen_at) SELECT %s, "
                     "r::text, '2026-12-01T00:00:00+00:00' FROM generate_series(0, %s) r "
                     "ON CONFLICT DO NOTHING", (attempt_pk, world - 1))
        old = ("UPDATE bench_old_map AS a SET rank_seen_at = COALESCE(a.rank_seen_at, '{}'::jsonb) "
               "|| COALESCE((SELECT jsonb_object_agg(n.key, n.value) FROM jsonb_each(%s::jsonb) "
               "AS n WHERE NOT jsonb_exists(COALESCE(a.rank_seen_at, '{}'::jsonb), n.key) "
               "OR (a.rank_seen_at ->> n.key) < (n.value #>> '{}')), '{}'::jsonb) WHERE a.id = 1")
        new = ("INSERT INTO runs_rankseen (attempt_id, reporter, seen_at) SELECT p.attempt_id, "
               "p.reporter, %s::timestamptz FROM unnest(%s::bigint[], %s::text[]) AS "
               "p(attempt_id, reporter) ON CONFLICT (attempt_id, reporter) DO UPDATE SET seen_at "
               "= GREATEST(excluded.seen_at, runs_rankseen.seen_at)")
        times = {}
        for name, run in (("old jsonb merge of the map", lambda r: conn.execute(
                              old, (json.dumps({str(r): stamp}),))),
                          ("RankSeen upsert of the rank", lambda r: conn.execute(
                              new, (stamp, [attempt_pk], [str(r)])))):
            for r in range(20):  # warm
                run(r)
            start = time.perf_counter()
            for r in range(reps):
                run(r)
            times[name] = (time.perf_counter() - start) / reps
        size = conn.execute("SELECT pg_column_size(rank_seen_at) FROM bench_old_map").fetchone()[0]
    (old_name, old_s), (new_name, new_s) = times.items()
    print(f"noting one request's rank at {world:,} ranks ({reps} requests, one statement each, "
          f"wall): {old_name} ({size:,} B value) {old_s * 1e3:.2f} ms, {new_name} "
          f"{new_s * 1e3:.2f} ms: {old_s / new_s:.0f} x less")


def cost_model(env: dict, token: str, db: str) -> tuple[float, float, float]:
    """(c_req, c_ev, web CPU of one request of a 16,384-rank job's rank), seconds, with 1 web
    process."""
    server, port = start_server(env, 1)
    per_request = {}
    try:
        wide_cpu, _ = wide_attempt(server, port, token, db)
        for size, rate in ((1, 400.0), (62, 60.0), (1000, 6.0)):
            make = small_batches(size)
            send(port, token, [f"cost-warm-{size}"], 2, 1.0, 0, make, rate)
            ev, _, secs, requests, cpu = measured(server, port, token, [f"cost-{size}"], 2,
                                                  COST_SECONDS, 0, make, rate)
            per_request[size] = cpu / requests
            print(f"requests of {size:>4} event(s): {requests:>6} requests, {ev:>7} events in "
                  f"{secs:.1f} s, web CPU {cpu:.2f} s = {per_request[size] * 1e3:.2f} ms per "
                  f"request")
    finally:
        stop_server(server)
    c_ev = (per_request[1000] - per_request[1]) / 999
    c_req = per_request[1] - c_ev
    print(f"c_ev  = (cpu(1000) - cpu(1)) / 999 = ({per_request[1000] * 1e3:.2f} - "
          f"{per_request[1] * 1e3:.2f}) ms / 999 = {c_ev * 1e6:.1f} us per event")
    print(f"c_req = cpu(1) - c_ev = {c_req * 1e3:.2f} ms per request")
    print(f"check: c_req + 62 c_ev = {(c_req + 62 * c_ev) * 1e3:.2f} ms; measured 62-event "
          f"requests {per_request[62] * 1e3:.2f} ms")
    return c_req, c_ev, wide_cpu


def projection(c_req: float, c_ev: float, c_part: float | None, wide_cpu: float) -> None:
    """Web cores of a 16,384-rank job at one update per second: the SDK's defaults, the old 1 s
    flush, and one update_aggregate reporter (``c_part``: web CPU per rank-update of aggregates,
    measured with 1 web process above; its request cost is inside it)."""
    from recoverydash.sdk.flush import JOB_REQUESTS_PER_S, MAX_INTERVAL_S, FlushPolicy

    policy = FlushPolicy(world_size=JOB_RANKS)
    interval = policy.interval()
    updates = JOB_RANKS * JOB_UPDATES_PER_S
    beats = JOB_RANKS / HEARTBEAT_S
    events = updates + beats
    print(f"\nprojection: {JOB_RANKS:,} ranks, {JOB_UPDATES_PER_S:g} update/s, a heartbeat per "
          f"rank every {HEARTBEAT_S:.0f} s (web CPU only; PostgreSQL's is not counted)")
    for name, requests in (
            (f"SDK default (each rank every min({MAX_INTERVAL_S:g}, max(1, {JOB_RANKS:,} / "
             f"{JOB_REQUESTS_PER_S:g})) = {interval:.0f} s)", policy.job_requests()),
            ("old default (each rank every 1 s)", float(JOB_RANKS))):
        cores = requests * c_req + events * c_ev
        verdict = "within" if cores <= TARGET_CORES else "over"
        print(f"- {name}: {requests:,.1f} requests/s, {events:,.0f} events/s; cores = "
              f"{requests:,.1f} x {c_req * 1e3:.2f} ms + {events:,.0f} x {c_ev * 1e6:.1f} us = "
              f"{requests * c_req:.2f} + {events * c_ev:.2f} = {cores:.2f} ({verdict} the "
              f"{TARGET_CORES:g}-core target)")
    requests = policy.job_requests()
    cores = requests * wide_cpu
    verdict = "within" if cores <= TARGET_CORES else "over"
    print(f"- SDK default, measured directly (requests of one rank of a {JOB_RANKS:,}-rank "
          f"attempt): cores = {requests:,.1f} x {wide_cpu * 1e3:.2f} ms = {cores:.2f} ({verdict} "
          f"the {TARGET_CORES:g}-core target)")
    if c_part is not None:
        # the ranks' own clients still send their heartbeats, on the same policy
        requests = policy.job_requests()
        cores = updates * c_part + requests * c_req + beats * c_ev
        verdict = "within" if cores <= TARGET_CORES else "over"
        print(f"- one update_aggregate reporter per update (ranks send only heartbeats, every "
              f"{interval:.0f} s): cores = {updates:,.0f} parts x {c_part * 1e6:.1f} us + "
              f"{requests:,.1f} x {c_req * 1e3:.2f} ms + {beats:,.0f} x {c_ev * 1e6:.1f} us = "
              f"{cores:.2f} ({verdict} the {TARGET_CORES:g}-core target)")


def main() -> int:
    with bench_database("recoverydash_bench_one") as (name, db, env, token):
        cores = os.cpu_count() or 1
        print(f"PostgreSQL database {name}; {WORLD} ranks; {SECONDS:.0f} s per measurement; "
              f"{cores} cores")
        if max(WORKER_COUNTS) > cores:
            print(f"note: {max(WORKER_COUNTS)} web processes (and their clients) on {cores} "
                  "cores measure contention, not scaling")
        best, c_part = {}, None
        for kind in KINDS:
            rows = one_run_table(env, token, kind)
            best[kind] = max(r[2][1] / r[2][2] for r in rows)
            if kind == "aggregate" and rows[0][0] == 1:
                c_part = rows[0][2][4] / rows[0][2][1]
        for kind, rate in best.items():
            print(f"target: at least 50,000 rank-updates/s into one run with 4 web processes; "
                  f"best measured ({kind}) {rate:,.0f} (the old run-row lock's ceiling: "
                  f"{OLD_CEILING:,} events/s)")
        print(f"\ncost of a request, 1 web process, {COST_SECONDS:.0f} s per size")
        c_req, c_ev, wide_cpu = cost_model(env, token, db)
        projection(c_req, c_ev, c_part, wide_cpu)
        print(f"\none run, 2 web processes, 4 clients, {COST_SECONDS:.0f} s each")
        wide_one_run(env, token, db)
        ranks_seen_write(db)
        return 0


if __name__ == "__main__":
    sys.exit(main())
