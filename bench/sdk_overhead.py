"""What the trainer SDK costs a training loop, with the data ledger *observed*.

1. The observation path, per sample recorded: a real ``DataLoader`` (no worker processes, so every
   step of the path runs on the training thread: the ``PositionSampler`` draw, the
   ``ObservedDataset`` tag, ``ObservedCollate``'s batch tag, ``recorder.observe(batch)`` per
   microbatch and the amortised ``recorder.commit()``) against the same loader without
   observation; median over interleaved blocks of (observed - bare) / samples. Also the cost of
   one ``observe`` + amortised ``commit`` call, and of the counting fallback's ``consumed`` +
   ``commit``.
   With worker processes the draw's pickling moves to the loader's feeder thread and the tag to the
   workers; the training thread keeps ``observe`` and ``commit``.
2. Update-time overhead of a small CPU training loop, A/A/B design in one process:

   - the step: MLP 256-1024-1024-10, microbatch 32, accumulation 4, one torch thread: about
     13-20 ms per optimizer update here (4 microbatches of 3-5 ms), each microbatch taken from a
     ``DataLoader`` over an in-memory dataset (no workers). That is 50-75 updates and thousands of
     samples recorded a second, more than any real data-parallel trainer commits (GPU updates take
     0.1-2 s), so the SDK's event rate, and with it its per-second background work, is at its
     plausible worst while the step stays a real forward/backward/optimizer step;
   - variants: ``bare`` (plain DataLoader, no SDK), ``control`` (bare again: the A/A noise floor),
     ``sdk`` (the observed loader, ``observe`` per microbatch, ``commit`` per update),
     ``counted`` (plain DataLoader with the counting fallback), ``metrics`` (one add_scalar per
     microbatch: tensorboard's SummaryWriter when installed, else a stand-in doing what it does
     on the caller's thread);
   - one *window* = ``n`` updates of the variant, then ``g`` bare updates that let the variant's
     background work (the SDK's sender, the metrics writer) finish inside the window (``g`` covers
     more than one ``flush_interval``), timed as a whole: background work is charged to the variant
     that caused it, never to its neighbour;
   - each round runs every variant's window once, in a fresh random order; a variant's overhead in
     a round is (its window time - the bare window time) / (the bare time of its ``n`` updates);
     the bench prints the median over rounds and the interquartile range.
   - the event sink is a separate process (like the real server): an HTTP server in the
     trainer's own interpreter would charge its request parsing to the SDK.
   - besides wall and training-thread CPU time, each window measures the time the training
     thread was *blocked*: wall - its CPU time - its run-queue wait (Linux schedstat). The loop
     does no I/O, so that is time spent waiting for the GIL held by another thread of this
     process (the SDK's sender, the metrics writer): the one way a background thread slows the
     loop beyond its own calls, and a number other processes on the machine cannot inflate.

   The sender thread's CPU time is read from its thread clock and reported per second.
Ratios are printed last: the observation path per sample against its 2 us target, the SDK's
overhead estimated from its parts (the observation path of one update's samples, timed in part 1,
plus the GIL waits it adds, over the update time) against the 0.5% target, and the wall and CPU
medians of the A/A/B comparison beside the A/A control, which shows what this machine can
resolve. ``--flush-interval 0.05`` multiplies the sender's wake-ups by 20 to expose their cost.
3. Packing: the per-sample cost for packed sequences recorded in tokens, through Megatron-Core's
   ``GPTDataset`` wrapped in ``ObservedMegatronDataset`` (each sequence's token range, its
   identities deferred to the sender thread): the batch's tag, ``ObservedCollate``, ``observe``
   and the amortised ``commit`` minus torch's ``default_collate`` of the same samples, fetched
   once beforehand (the dataset's own ``__getitem__``, the same calls either way, would drown
   the difference in its jitter); its ratio uses part 2's update time.
Usage: ``.venv/bin/python bench/sdk_overhead.py [--quick] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MICRO, ACCUM = 32, 4


class _Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like a production server

    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"accepted": 0, "duplicates": 0}'
        self.send_response(202)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve_sink() -> int:
    """Run the sink (``--sink``): print the port, serve until killed."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    srv.daemon_threads = True
    print(srv.server_address[1], flush=True)
    srv.serve_forever()
    return 0


def start_sink() -> tuple[subprocess.Popen, str]:
    """The sink in its own process; returns (process, base URL)."""
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--sink"],
                         stdout=subprocess.PIPE, text=True)
    port = int(p.stdout.readline())
    return p, f"http://127.0.0.1:{port}"


def make_client(url: str, spool: str, max_queue: int = 10_000, **kw):
    from recoverydash.sdk import Client

    return Client(url, "bench", "bench-run", attempt=0, rank=3, spool_dir=spool,
                  max_queue=max_queue, **kw)


def make_counting(client):
    from recoverydash.sdk import CountingRecorder

    return CountingRecorder(client, rank=3, world_size=64, dataset_length=10**9,
                            dataset_version="bench", heartbeat_interval=30.0)


def make_observed(client):
    from recoverydash.sdk import ObservedRecorder

    return ObservedRecorder(client, rank=3, world_size=64, dataset_version="bench",
                            heartbeat_interval=30.0, start_timeout=0)


def loaders(rec, n: int = 4096, features: int = 256):
    """(bare DataLoader, observed DataLoader) over the same in-memory dataset, both shuffled by a
    seeded RandomSampler, microbatch MICRO, no worker processes."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler, TensorDataset

    from recoverydash.integrations.pytorch import observed_loader

    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(n, features, generator=g), torch.randint(0, 10, (n,),
                                                                            generator=g))
    bare = DataLoader(ds, batch_size=MICRO, drop_last=True,
                      sampler=RandomSampler(ds, generator=torch.Generator().manual_seed(1)))
    seen = observed_loader(rec, ds, batch_size=MICRO, drop_last=True, shuffle=True, seed=1)
    return bare, seen


class Forever:
    """Batches of a loader, epoch after epoch."""

    def __init__(self, loader):
        self.loader = loader
        self.it = iter(loader)

    def next(self):
        try:
            return next(self.it)
        except StopIteration:
            self.it = iter(self.loader)
            return next(self.it)


def bench_observation(url: str, spool: str, blocks: int, updates_per_block: int) -> dict:
    """Microseconds: ``per_sample`` (observed loader + observe + commit, minus the bare loader, per
    sample), ``observe_call`` (one observe + amortised commit, per microbatch), ``counted_call``
    (the fallback's consumed + amortised commit, per microbatch)."""
    # These loops commit thousands of updates a second, far beyond any trainer; the queue is
    # sized to hold the whole burst so every call takes the normal path.
    total = blocks * updates_per_block
    client = make_client(url, spool, max_queue=3 * total + 10)
    rec = make_observed(client)
    bare, seen = loaders(rec)
    bare_it, seen_it = Forever(bare), Forever(seen)
    per_sample, observe_call = [], []
    update = 0
    for _ in range(blocks):
        t0 = time.perf_counter_ns()
        for _ in range(updates_per_block):
            for _ in range(ACCUM):
                bare_it.next()
        t1 = time.perf_counter_ns()
        for _ in range(updates_per_block):
            for _ in range(ACCUM):
                rec.observe(seen_it.next())
            rec.commit()
        t2 = time.perf_counter_ns()
        batches = [seen_it.next() for _ in range(updates_per_block * ACCUM)]
        t3 = time.perf_counter_ns()
        for i, b in enumerate(batches):
            rec.observe(b)
            if i % ACCUM == ACCUM - 1:
                rec.commit()
        t4 = time.perf_counter_ns()
        update += 2 * updates_per_block
        per_sample.append(((t2 - t1) - (t1 - t0)) / (updates_per_block * ACCUM * MICRO) / 1000)
        observe_call.append((t4 - t3) / (updates_per_block * ACCUM) / 1000)
    counting = make_counting(client)
    counted_call = []
    for _ in range(blocks):
        t0 = time.perf_counter_ns()
        for _ in range(updates_per_block):
            for _ in range(ACCUM):
                counting.consumed(MICRO)
            update += 1
            counting.commit(update)
        counted_call.append((time.perf_counter_ns() - t0) / (updates_per_block * ACCUM) / 1000)
    client.flush(120)
    c = client.counters()
    assert c["dropped"] == 0 and c["sent"] == 3 * total, c
    client.close(1)
    return {"per_sample": statistics.median(per_sample),
            "observe_call": statistics.median(observe_call),
            "counted_call": statistics.median(counted_call)}


def megatron_source(folder: str, seq: int = 128):
    """A Megatron-Core ``GPTDataset`` over 2,000 synthetic documents (single-process gloo group:
    its builder asks the process group who writes the index cache)."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.FileStore(os.path.join(folder, "store"), 1),
                                rank=0, world_size=1)
    prefix = os.path.join(folder, "docs")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    rng = np.random.default_rng(0)
    for _ in range(2000):
        n = int(rng.integers(50, 400))
        builder.add_document(torch.arange(n, dtype=torch.int32), [n])
    builder.finalize(prefix + ".idx")

    class Tok:
        eod, pad, vocab_size = 0, -1, 1 << 20
        unique_identifiers = {"class": "bench"}

    config = GPTDatasetConfig(random_seed=1, sequence_length=seq, blend=([prefix], None),
                              split="100,0,0", tokenizer=Tok(), reset_position_ids=False,
                              reset_attention_mask=False, eod_mask_loss=False,
                              create_attention_mask=False,
                              path_to_cache=os.path.join(folder, "cache"))
    return BlendedMegatronDatasetBuilder(GPTDataset, [3000, 0, 0], lambda: True,
                                         config).build()[0]


def bench_packing(url: str, spool: str, tmp: str, blocks: int, updates_per_block: int) -> dict:
    """Microseconds per packed sequence recorded in tokens (docs/definitions.md#units), on the
    training thread: what ``ObservedMegatronDataset`` and the recorder add to a microbatch of
    Megatron ``GPTDataset`` samples (the batch's tag: token ranges and deferred identities from
    the indices; the ``TaggedList``; ``ObservedCollate`` around torch's ``default_collate``;
    ``observe``; the amortised ``commit``), minus ``default_collate`` of the same samples alone;
    median over interleaved blocks. The samples are fetched once beforehand: the dataset's own
    ``__getitem__`` is the same calls with and without recoverydash, and at 30-1000 us a sample
    its jitter would drown a difference of a microsecond. The identities are resolved on the
    sender thread (``DeferredIdentities``), not here. Empty without megatron-core."""
    try:
        source = megatron_source(tmp)
    except ImportError:
        return {}
    from torch.utils.data import default_collate

    from recoverydash.integrations.megatron import ObservedMegatronDataset
    from recoverydash.sdk.observe import ObservedCollate, TaggedList

    total = blocks * updates_per_block
    client = make_client(url, spool, max_queue=2 * total + 10)
    rec = make_observed(client)
    observed = ObservedMegatronDataset(source, units="tokens")
    collate = ObservedCollate()
    per_block = updates_per_block * ACCUM
    stride = len(source) // MICRO * MICRO
    batches = [list(range(k * MICRO % stride, k * MICRO % stride + MICRO))
               for k in range(per_block)]
    samples = [[source[i] for i in idx] for idx in batches]  # fetched once, both sides
    for idx, got in zip(batches[:ACCUM * 4], samples, strict=False):  # caches warm
        default_collate(got)
        items = TaggedList(got)
        items.tag = observed.tag(idx)
        rec.observe(collate(items))
    rec.discard()
    per_sample, per_sample_cpu = [], []
    for _ in range(blocks):
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        for got in samples:
            default_collate(got)
        t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        for k, (idx, got) in enumerate(zip(batches, samples, strict=True)):
            items = TaggedList(got)
            items.tag = observed.tag(idx)
            rec.observe(collate(items))
            if k % ACCUM == ACCUM - 1:
                rec.commit()
        t2, c2 = time.perf_counter_ns(), time.thread_time_ns()
        per_sample.append(((t2 - t1) - (t1 - t0)) / (per_block * MICRO) / 1000)
        per_sample_cpu.append(((c2 - c1) - (c1 - c0)) / (per_block * MICRO) / 1000)
    client.flush(120)
    client.close(1)
    return {"per_sample": statistics.median(per_sample),
            "per_sample_cpu": statistics.median(per_sample_cpu),
            "seq": int(source.config.sequence_length)}


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


def _thread_cpu(thread) -> float:
    """CPU seconds of another thread of this process (Linux thread clock), or nan."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (AttributeError, OSError, TypeError):
        return float("nan")


def _runq_wait_ns() -> int:
    """Nanoseconds this thread has waited on a run queue (Linux schedstat), or 0."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def bench_training(url: str, spool: str, tmp: str, rounds: int, n: int, gap: int, **client_kw):
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    client = make_client(url, spool, **client_kw)
    rec = make_observed(client)
    counting = make_counting(client)
    bare, seen = loaders(rec)
    feeds = {"bare": Forever(bare), "seen": Forever(seen)}
    writer, writer_name = scalar_writer(tmp)
    loss_fn = torch.nn.CrossEntropyLoss()
    state = {"update": 0, "micro": 0}

    def one_update(variant: str) -> float:
        t0 = time.perf_counter()
        for _ in range(ACCUM):
            state["micro"] += 1
            if variant == "sdk":
                x, y = rec.observe(feeds["seen"].next())
            else:
                x, y = feeds["bare"].next()
            loss = loss_fn(model(x), y)
            loss.backward()
            if variant == "counted":
                counting.consumed(MICRO)
            elif variant == "metrics":
                writer.add_scalar("loss", 0.5, state["micro"])
        opt.step()
        opt.zero_grad()
        state["update"] += 1
        if variant == "sdk":
            rec.commit(state["update"])
        elif variant == "counted":
            counting.commit(state["update"])
        return time.perf_counter() - t0

    def window(variant: str) -> tuple[float, float, float, float]:
        """(seconds of the whole window, seconds of its first n updates, training-thread CPU
        seconds of the whole window, seconds the training thread was blocked: neither running
        nor waiting for a CPU, i.e. waiting for the GIL, since the loop does no I/O)."""
        t0, c0, q0 = time.perf_counter(), time.thread_time(), _runq_wait_ns()
        first = sum(one_update(variant) for _ in range(n))
        for _ in range(gap):
            one_update("bare")
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        return wall, first, cpu, wall - cpu - (_runq_wait_ns() - q0) / 1e9

    variants = ("bare", "control", "sdk", "counted", "metrics")
    for v in variants:  # warm up (and start the sender and writer threads)
        window(v)
    sender = client._worker.thread
    rng = random.Random(1)
    over: dict = {v: [] for v in variants[1:]}
    over_cpu: dict = {v: [] for v in variants[1:]}
    blocked: dict = {v: [] for v in variants}  # microseconds per update of the window
    upd_ms = []
    cpu0, t_run0 = _thread_cpu(sender), time.perf_counter()
    for _ in range(rounds):
        order = list(variants)
        rng.shuffle(order)
        got = {v: window(v) for v in order}
        bare_total, bare_first, bare_cpu, _ = got["bare"]
        for v in variants:
            blocked[v].append(got[v][3] / (n + gap) * 1e6)
        upd_ms.append(bare_first / n * 1000)
        for v in variants[1:]:
            over[v].append((got[v][0] - bare_total) / bare_first)
            # CPU: the same normalisation (n updates' share of the bare window's CPU time)
            over_cpu[v].append((got[v][2] - bare_cpu) / (bare_cpu * n / (n + gap)))
    sender_cpu = (_thread_cpu(sender) - cpu0) / (time.perf_counter() - t_run0)
    client.flush(10)
    c = client.counters()
    writer.close()
    return over, over_cpu, blocked, statistics.median(upd_ms), sender_cpu, writer_name, c


def _q(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few seconds, for smoke tests")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--flush-interval", type=float, default=None,
                    help="the sender's flush_interval (default: the client's); a small value "
                    "multiplies the sender's wake-ups to expose their cost")
    ap.add_argument("--sink", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sink:
        return serve_sink()
    from recoverydash.sdk.options import ClientOptions

    flush_s = args.flush_interval or ClientOptions().flush_interval
    client_kw = {"flush_interval": flush_s} if args.flush_interval else {}
    blocks, per_block, rounds, n = (10, 20, 2, 20) if args.quick else (60, 50, 8, 100)
    rounds = args.rounds or rounds
    sink, url = start_sink()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            spool = os.path.join(tmp, "spool")
            calls = bench_observation(url, spool, blocks, per_block)
            packing = bench_packing(url, os.path.join(tmp, "spool-packing"), tmp, blocks,
                                    per_block)
            if packing:
                print(f"packed sequences in tokens (Megatron GPTDataset, {packing['seq']} "
                      f"tokens each: ObservedMegatronDataset tag, ObservedCollate, observe, "
                      f"amortised commit) minus default_collate of the same samples: "
                      f"median {packing['per_sample']:.3f} us per sequence (training thread "
                      f"CPU: {packing['per_sample_cpu']:.3f} us, what a loaded machine's "
                      f"run-queue waits do not inflate)")
            call_us = calls["observe_call"]
            print(f"observation path (PositionSampler draw, ObservedDataset tag, ObservedCollate, "
                  f"observe, amortised commit) minus the bare DataLoader: median "
                  f"{calls['per_sample']:.3f} us per sample recorded over {blocks} blocks of "
                  f"{per_block} updates x {ACCUM} microbatches of {MICRO}")
            print(f"observe(batch) + amortised commit: median {call_us:.3f} us per microbatch; "
                  f"counting fallback consumed + amortised commit: median "
                  f"{calls['counted_call']:.3f} us per microbatch")
            # the gap covers 1.5 flush intervals at 15 ms per update (more when updates are slower)
            gap = 10 if args.quick else max(40, int(1.5 * flush_s / 0.015))
            n = min(n, gap) if args.flush_interval else n
            over, over_cpu, blocked, upd_ms, sender_cpu, writer_name, counters = bench_training(
                url, spool, tmp, rounds, n, gap, **client_kw)
    finally:
        sink.kill()
        sink.wait()
    print(f"update time (MLP 256-1024-1024-10, microbatch {MICRO}, accumulation {ACCUM}, 1 torch "
          f"thread): median {upd_ms:.2f} ms bare. {rounds} rounds of one window per variant in "
          f"random order; window = {n} updates of the variant + {gap} bare updates "
          f"(sender flush_interval {flush_s:g} s); overhead = extra window time / bare time of "
          f"{n} updates:")
    labels = (("sdk", "with recoverydash SDK (observed)"),
              ("counted", "with the counting fallback"),
              ("metrics", f"with {writer_name} (same calls)"),
              ("control", "bare loop again (A/A control)"))
    for k, label in labels:
        q1, med, q3 = _q(over[k])
        c1, cmed, c3 = _q(over_cpu[k])
        print(f"  {label:<44} wall median {med * 100:+7.3f}% IQR [{q1 * 100:+.3f}%, "
              f"{q3 * 100:+.3f}%]   training cpu median {cmed * 100:+7.3f}% IQR "
              f"[{c1 * 100:+.3f}%, {c3 * 100:+.3f}%]")
    print("  training thread blocked (GIL waits; wall - cpu - run-queue wait), us per update, "
          "median over rounds: " + ", ".join(f"{v} {statistics.median(blocked[v]):.1f}"
                                             for v in ("bare", "control", "sdk", "counted",
                                                       "metrics")))
    print(f"  SDK sender thread CPU: {sender_cpu * 1000:.3f} ms per second of training "
          f"({sender_cpu * 100:.3f}% of one core); events sent {counters['sent']}, "
          f"dropped {counters['dropped']}")
    sdk = _q(over["sdk"])
    ctl = _q(over["control"])
    sdk_c = _q(over_cpu["sdk"])
    ctl_c = _q(over_cpu["control"])
    # the observation path of one update's samples (draw, tag, collate, observe, commit)
    bound = calls["per_sample"] * 1e-6 * ACCUM * MICRO / (upd_ms / 1000)
    gil = (statistics.median(blocked["sdk"]) - statistics.median(blocked["bare"])) * 1e-6 \
        * (n + gap) / n / (upd_ms / 1000)  # per SDK update, over the update time
    parts = bound + max(0.0, gil)
    print("ratios:")
    per = calls["per_sample"]
    print(f"  per sample recorded / 2 us target          {per / 2:.3f}  "
          f"({'ok' if per < 2 else 'OVER'})")
    print(f"  observation path / update time             {bound * 100:.3f}%")
    print(f"  SDK GIL waits added / update time          {gil * 100:+.3f}%")
    print(f"  SDK overhead from its parts                {parts * 100:.3f}%  "
          f"({'ok' if parts < 0.005 else 'OVER'} vs 0.5% target)")
    if packing:
        pk = packing["per_sample"]
        pk_parts = pk * 1e-6 * ACCUM * MICRO / (upd_ms / 1000) + max(0.0, gil)
        print(f"  packed sequence recorded / 2 us target     {pk / 2:.3f}  "
              f"({'ok' if pk < 2 else 'OVER'})")
        print(f"  packing: overhead from its parts           {pk_parts * 100:.3f}%  "
              f"({'ok' if pk_parts < 0.005 else 'OVER'} vs 0.5% target)")
    print(f"  SDK overhead, wall (median, IQR)           {sdk[1] * 100:+.3f}%  "
          f"[{sdk[0] * 100:+.3f}%, {sdk[2] * 100:+.3f}%]")
    print(f"  A/A control, wall (median, IQR)            {ctl[1] * 100:+.3f}%  "
          f"[{ctl[0] * 100:+.3f}%, {ctl[2] * 100:+.3f}%]")
    print(f"  SDK overhead, training cpu (median, IQR)   {sdk_c[1] * 100:+.3f}%  "
          f"[{sdk_c[0] * 100:+.3f}%, {sdk_c[2] * 100:+.3f}%]")
    print(f"  A/A control, training cpu (median, IQR)    {ctl_c[1] * 100:+.3f}%  "
          f"[{ctl_c[0] * 100:+.3f}%, {ctl_c[2] * 100:+.3f}%]")
    met = statistics.median(over["metrics"])
    if met > 0:
        print(f"  SDK overhead / {writer_name} overhead   {sdk[1] / met:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
