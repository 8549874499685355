"""What the trainer SDK costs a training loop.

1. Median cost of one ledger record call, in microseconds: ``recorder.consumed(b)`` per
   microbatch plus the amortised ``recorder.commit(update)`` (one per 4 microbatches, which builds
   the spans and queues ``update_committed`` for the sender thread, here posting to a local
   HTTP sink so the sender really runs).
2. Update time of a small CPU training loop (MLP 256-1024-1024-10, microbatch 32, accumulation 4; one torch
   thread) in three variants interleaved update by update (so machine noise hits all alike):
   bare; with the SDK (consumed per microbatch, commit per update); with a metrics logger making
   the same number of calls (one per microbatch). Medians of wall-clock time and of the training
   thread's CPU time (``time.thread_time``: what other processes on a shared machine cannot
   inflate; the sender thread's own work is excluded there and included in wall time).
   The metrics logger is ``torch.utils.tensorboard.SummaryWriter.add_scalar`` when tensorboard is
   installed; otherwise (this venv) a stand-in that does what add_scalar does on the caller's
   thread: build a record (``json.dumps`` of tag, value, step, wall time) and ``put_nowait`` it on
   a queue drained by a writer thread into a file.

Ratios are printed last. Targets: under 5 us per call, under 1% step-time overhead.
Usage: ``.venv/bin/python bench/sdk_overhead.py [--quick]`` (1-2 minutes; --quick: seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from recoverydash.sdk import Client, LedgerRecorder

MICRO, ACCUM = 32, 4


class _Sink(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"accepted": 0, "duplicates": 0}'
        self.send_response(202)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def start_sink() -> tuple[ThreadingHTTPServer, str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def make_recorder(url: str, spool: str, max_queue: int = 10_000) -> LedgerRecorder:
    client = Client(url, "bench", "bench-run", attempt=0, rank=3, spool_dir=spool,
                    max_queue=max_queue)
    return LedgerRecorder(client, rank=3, world_size=64, dataset_length=10**9,
                          dataset_version="bench", heartbeat_interval=30.0)


def bench_record_call(url: str, spool: str, blocks: int, updates_per_block: int) -> float:
    """Median over blocks of (time of updates_per_block x (ACCUM consumed + 1 commit)) / calls."""
    # This loop commits ~200,000 updates a second, far beyond any trainer (a few a second), and
    # faster than the sender drains; the queue is sized to hold the whole burst so every call
    # takes the normal path (a full queue would drop, which is also cheap).
    rec = make_recorder(url, spool, max_queue=blocks * updates_per_block + 1)
    per_call = []
    update = 0
    for _ in range(blocks):
        t0 = time.perf_counter_ns()
        for _ in range(updates_per_block):
            rec.consumed(MICRO)
            rec.consumed(MICRO)
            rec.consumed(MICRO)
            rec.consumed(MICRO)
            update += 1
            rec.commit(update)
        per_call.append((time.perf_counter_ns() - t0) / (updates_per_block * ACCUM) / 1000)
    rec.client.flush(60)
    c = rec.client.counters()
    assert c["dropped"] == 0 and c["sent"] == blocks * updates_per_block, c
    rec.client.close(1)
    return statistics.median(per_call)


class StandInScalarWriter:
    """What SummaryWriter.add_scalar does on the caller's thread: build an event record and hand
    it to a writer thread through a queue (the thread writes it to a file)."""

    def __init__(self, path: str):
        self.q: queue.Queue = queue.Queue(100_000)
        self.f = open(path, "w")
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        while True:
            item = self.q.get()
            if item is None:
                return
            self.f.write(item + "\n")

    def add_scalar(self, tag, value, global_step=None):
        try:
            self.q.put_nowait(json.dumps({"tag": tag, "value": float(value), "step": global_step,
                                          "wall_time": time.time()}))
        except queue.Full:
            pass

    def close(self):
        self.q.put(None)


def scalar_writer(tmp: str):
    try:
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(os.path.join(tmp, "tb")), "torch.utils.tensorboard.SummaryWriter"
    except Exception as e:  # tensorboard not installed
        print(f"note: torch.utils.tensorboard unavailable ({type(e).__name__}: {e}); "
              "using the stand-in (json.dumps + queue.put_nowait to a writer thread)")
        return StandInScalarWriter(os.path.join(tmp, "scalars.jsonl")), "stand-in add_scalar"


def bench_training(url: str, spool: str, tmp: str, updates: int):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    xs = torch.randn(ACCUM * 8, MICRO, 256)
    ys = torch.randint(0, 10, (ACCUM * 8, MICRO))
    rec = make_recorder(url, spool)
    writer, writer_name = scalar_writer(tmp)
    loss_fn = torch.nn.CrossEntropyLoss()
    state = {"update": 0, "micro": 0}

    def one_update(variant: str) -> tuple[float, float]:
        """(wall seconds, training-thread CPU seconds) of one optimizer update."""
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(ACCUM):
            i = state["micro"] % len(xs)
            state["micro"] += 1
            loss = loss_fn(model(xs[i]), ys[i])
            loss.backward()
            if variant == "sdk":
                rec.consumed(MICRO)
            elif variant == "metrics":
                writer.add_scalar("loss", 0.5, state["micro"])
        opt.step()
        opt.zero_grad()
        state["update"] += 1
        if variant == "sdk":
            rec.commit(state["update"])
        return time.perf_counter() - t0, time.thread_time() - c0

    # "control" is the bare loop again under another name: its difference from "bare" is the
    # noise floor of this machine at this moment (an A/A test).
    variants = ("bare", "sdk", "metrics", "control")
    k = len(variants)
    for i in range(4 * k):  # warm up
        one_update(variants[i % k])
    wall: dict = {v: [] for v in variants}
    cpu: dict = {v: [] for v in variants}
    for i in range(updates * k):  # round robin, update by update, rotating the order each round
        v = variants[(i + i // k) % k]
        w, c = one_update(v)
        wall[v].append(w)
        cpu[v].append(c)
    rec.client.flush(10)
    c = rec.client.counters()
    writer.close()
    return ({v: statistics.median(wall[v]) for v in variants},
            {v: statistics.median(cpu[v]) for v in variants}, writer_name, c)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few seconds, for smoke tests")
    args = ap.parse_args()
    blocks, per_block, updates = (30, 200, 60) if args.quick else (200, 500, 600)
    srv, url = start_sink()
    with tempfile.TemporaryDirectory() as tmp:
        spool = os.path.join(tmp, "spool")
        call_us = bench_record_call(url, spool, blocks, per_block)
        print(f"ledger record call (consumed + amortised commit, accumulation {ACCUM}): "
              f"median {call_us:.3f} us per call over {blocks} blocks of {per_block} updates")
        wall, cpu, writer_name, counters = bench_training(url, spool, tmp, updates)
    srv.shutdown()
    print(f"update time (MLP 256-1024-1024-10, microbatch {MICRO}, accumulation {ACCUM}, 1 torch "
          f"thread), median of {updates} updates per variant, variants interleaved update by "
          f"update; wall clock and training-thread CPU time:")
    labels = (("bare", "bare loop"), ("sdk", "with recoverydash SDK"),
              ("metrics", f"with {writer_name} (same call count)"),
              ("control", "bare loop again (A/A control: noise floor)"))
    for k, label in labels:
        print(f"  {label:<48} wall {wall[k] * 1000:8.3f} ms   cpu {cpu[k] * 1000:8.3f} ms")
    print(f"  SDK events: sent {counters['sent']}, dropped {counters['dropped']}")
    over = {k: {"wall": (wall[k] - wall["bare"]) / wall["bare"],
                "cpu": (cpu[k] - cpu["bare"]) / cpu["bare"]} for k in ("sdk", "metrics", "control")}
    bound = call_us * 1e-6 * ACCUM / wall["bare"]  # the SDK's own cost per update
    print("ratios:")
    print(f"  record call / 5 us target                 {call_us / 5:.3f}  "
          f"({'ok' if call_us < 5 else 'OVER'})")
    print(f"  SDK update-time overhead, wall             {over['sdk']['wall'] * 100:+.3f}%")
    print(f"  SDK update-time overhead, training cpu     {over['sdk']['cpu'] * 100:+.3f}%")
    print(f"  control (A/A noise floor), wall / cpu     {over['control']['wall'] * 100:+.3f}% / "
          f"{over['control']['cpu'] * 100:+.3f}%")
    print(f"  SDK cost per update / update time (bound)  {bound * 100:.3f}%  "
          f"({'ok' if bound < 0.01 else 'OVER'} vs 1% target)")
    print(f"  {writer_name} overhead, wall     {over['metrics']['wall'] * 100:+.3f}%")
    print(f"  {writer_name} overhead, cpu      {over['metrics']['cpu'] * 100:+.3f}%")
    sdk_c = wall["sdk"] - wall["bare"]
    met_c = wall["metrics"] - wall["bare"]
    if met_c > 0:
        print(f"  SDK overhead / {writer_name} overhead (wall) {sdk_c / met_c:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
