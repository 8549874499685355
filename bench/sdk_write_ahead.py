"""What the SDK's write-ahead (``Client(write_ahead_s=)``) costs the sender thread, per event.

A large job's rank flushes every up to 60 s; events queued for ``write_ahead_s`` (2 s) are written
to the spool's write-ahead file meanwhile, so a SIGKILL loses at most that bound. The sender then
does, per batch of ``batch_max_events`` (500) events arriving at ``rate`` events a second (75: the
plausible worst of ``bench/sdk_overhead.py``): one write-ahead every ``write_ahead_s`` of the
whole batch so far (encode the new events, gzip the batch, write one file, delete the previous
one), and at the send the gzip of the batch and the file's deletion. Without the write-ahead it
encodes and gzips the batch once at the send. Both flows are run here in this thread, on the
worker's own methods (``Worker._take``, ``_write_ahead``, ``delivery.batch_body``,
``DiskSpool.drop_ahead``), with
the network left out (the same request either way), interleaved over rounds; the thread CPU time
(``time.thread_time``) and wall time per event are medians over rounds. The training thread's
side is one attribute test per ``emit`` and one wake of the sender per write-ahead, not timed.

Usage: ``.venv/bin/python bench/sdk_write_ahead.py [--rounds N] [--rate 75] [--bound 2]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def event(u: int) -> dict:
    return {"type": "update_committed", "update": u, "event_id": f"bench-run:0:3:u{u}",
            "spans": [{"stratum": "main", "epoch": 0, "ranges": [[u * 128, u * 128 + 128]]}],
            "samples": 128, "tokens": 262144}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--rate", type=float, default=75.0, help="events a second")
    ap.add_argument("--bound", type=float, default=2.0, help="write_ahead_s")
    args = ap.parse_args()
    from recoverydash.sdk.client import Client
    from recoverydash.sdk.delivery import batch_body

    tmp = tempfile.mkdtemp(prefix="rd-wa-")
    # a URL that is never contacted: the flows below call the sender's methods directly and no
    # emit starts the thread
    c = Client("http://127.0.0.1:9", "bench", "bench-run", attempt=0, rank=3, spool_dir=tmp,
               flush_interval=60.0, write_ahead_s=args.bound, handle_sigterm=False)
    w = c._worker  # the sender's worker: its queue, batching and write-ahead
    n = w.batch_max_events
    per_tick = max(1, int(args.rate * args.bound))
    u = 0

    def fill(k: int):
        nonlocal u
        now = time.time()
        for _ in range(k):
            u += 1
            w._buf.append((event(u), now))

    def plain() -> tuple[float, float]:
        fill(n)
        w0, c0 = time.perf_counter(), time.thread_time()
        batch_body(w._take())
        return time.thread_time() - c0, time.perf_counter() - w0

    def write_ahead() -> tuple[float, float]:
        cpu = wall = 0.0
        while len(w._ahead) < n:
            fill(min(per_tick, n - len(w._ahead)))
            w0, c0 = time.perf_counter(), time.thread_time()
            w._write_ahead()
            cpu, wall = cpu + time.thread_time() - c0, wall + time.perf_counter() - w0
        w0, c0 = time.perf_counter(), time.thread_time()
        batch_body(w._ahead)  # the send's gzip (its events were encoded by the write-ahead)
        w.spool.drop_ahead(w._ahead_file)
        cpu, wall = cpu + time.thread_time() - c0, wall + time.perf_counter() - w0
        w._ahead, w._ahead_bytes, w._ahead_file, w._inflight = [], 0, None, 0
        return cpu, wall

    plain(), write_ahead()  # warm up
    rows = {"plain": [], "write_ahead": []}
    for r in range(args.rounds):
        for name in (("plain", "write_ahead") if r % 2 else ("write_ahead", "plain")):
            rows[name].append(plain() if name == "plain" else write_ahead())
    files = [e for e in os.listdir(w.spool.folder) if ".batch" in e]
    shutil.rmtree(tmp, ignore_errors=True)
    assert files == [], files  # every write-ahead file was deleted
    med = {k: (statistics.median(x[0] for x in v) / n * 1e6,
               statistics.median(x[1] for x in v) / n * 1e6) for k, v in rows.items()}
    ticks = -(-n // per_tick)
    print(f"batch {n} events, {per_tick} events per write-ahead ({args.rate:g}/s x "
          f"{args.bound:g} s): {ticks} write-aheads per batch, {args.rounds} rounds")
    for k, (cpu, wall) in med.items():
        print(f"  {k:12s} sender CPU {cpu:6.2f} us/event   wall {wall:6.2f} us/event")
    extra = med["write_ahead"][0] - med["plain"][0]
    print(f"write-ahead adds {extra:.2f} us of sender CPU per event "
          f"(x{med['write_ahead'][0] / med['plain'][0]:.2f} of the plain flow), "
          f"{extra * args.rate / 1000:.3f} ms of sender CPU per second at {args.rate:g} events/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
