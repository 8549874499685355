#!/usr/bin/env python
"""Re-created DistributedSampler orders (issue 25 item 1, docs/definitions.md#re-created-orders):
what deriving sample identities from an order costs the analysis.

What it does, for epochs of ``BENCH_ORDER_SIZES`` samples (default 100,000 and 1,000,000):

1. **permutation**: ``recoverydash.recovery.samplers.randperm(n, seed)`` from a cold cache,
   against ``torch.randperm(n, generator=...).tolist()`` when torch is importable (else against
   ``list(range(n))`` shuffled by ``random.shuffle``); then a memoized call;
2. **analysis**: ``analyze`` of a run whose attempt 0 feeds the first half of an epoch of n
   under seed 7 and crashes, and attempt 1 resumes at the half under seed 8 and feeds the rest
   (updates of 1,000 samples), so the epoch is compared by identity: once with the identities
   re-created from the orders (what the SDK sends: no ``indices``), once with every span carrying
   its ``indices`` (the baseline: what an order that is not re-created must send). Both answers
   are checked equal; the ratio is re-created / reported.

Run: ``.venv/bin/python bench/recreated_orders.py`` (about a minute at the defaults).
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recoverydash.recovery import (  # noqa: E402
    AttemptRecord,
    GenerationRecord,
    LedgerRecord,
    RunInput,
    analyze,
)
from recoverydash.recovery.samplers import (  # noqa: E402
    SAMPLER_ALGORITHM,
    clear_cache,
    order_digest,
    randperm,
)

SIZES = [int(x) for x in os.environ.get("BENCH_ORDER_SIZES", "100000,1000000").split(",")]
BATCH = 1000
COMPONENTS = ["model", "optimizer", "scheduler", "rng", "data_progress"]


def best(fn, repeat=3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def baseline_perm(n: int):
    try:
        import torch
    except ImportError:
        def shuffled():
            xs = list(range(n))
            random.Random(7).shuffle(xs)
            return xs
        return "random.shuffle(list(range(n)))", shuffled

    def torch_perm():
        g = torch.Generator()
        g.manual_seed(7)
        return torch.randperm(n, generator=g).tolist()
    return "torch.randperm(n).tolist()", torch_perm


def run_of(n: int, indices: bool) -> RunInput:
    """Seed 7 for [0, n/2) of epoch 0, crash; seed 8 from n/2 to the end; then epoch 1."""
    orders = {seed: order_digest(seed=seed, epoch=0, dataset_length=n, shuffle=True,
                                 dataset_version="ds") for seed in (7, 8)}
    half = n // 2 // BATCH * BATCH
    records, u = [], 0
    for seed, lo, hi, attempt in ((7, 0, half, 0), (8, half, n, 1)):
        perm = randperm(n, seed) if indices else None
        for start in range(lo, hi, BATCH):
            u += 1
            stop = min(start + BATCH, hi)
            span = {"stratum": "main", "epoch": 0, "order": orders[seed],
                    "ranges": [[start, stop]]}
            if perm is not None:
                span["indices"] = sorted(perm[start:stop])
            records.append(LedgerRecord(attempt, u, 0, float(u), [span]))
    records.append(LedgerRecord(1, u + 1, 0, float(u + 1),
                                [{"stratum": "main", "epoch": 1, "ranges": [[0, BATCH]]}]))
    saved = half // BATCH
    sampler = {"algorithm": SAMPLER_ALGORITHM, "shuffle": True, "drop_last": False,
               "epoch_length": {"main": n}}
    attempts = [AttemptRecord(0, started_at=0.0, world_size=1, dataset_version="ds",
                              global_batch_size=BATCH, sampler={**sampler, "seed": 7},
                              ended_at=float(saved) + 0.5, end_reason="failed"),
                AttemptRecord(1, started_at=float(saved) + 1, world_size=1, dataset_version="ds",
                              global_batch_size=BATCH, sampler={**sampler, "seed": 8},
                              resumed_from={"generation_id": "g", "update": saved})]
    objects = [{"uri": f"file:///c/{c}", "shard": "rank0", "component": c, "size": 1,
                "sha256": f"{i + 1:064x}"} for i, c in enumerate(COMPONENTS)]
    manifest = {"schema_revision": 1, "generation_id": "g", "update": saved, "world_size": 1,
                "required_shards": ["rank0"], "components": COMPONENTS, "objects": objects,
                "data_progress": {"cursor": [{"stratum": "main", "epoch": 0, "position": half}]},
                "dataset_version": "ds", "committed_at": None}
    gen = GenerationRecord("g", 0, saved, started_at=float(saved) - 0.5,
                           required_shards=["rank0"], components=COMPONENTS,
                           manifests=[manifest], committed_at=float(saved),
                           object_checks={o["uri"]: "ok" for o in objects})
    return RunInput("bench-orders", attempts, records, [], [gen], first_event_at=0.0)


def restart_of(run: RunInput):
    r = analyze(run, now=1e9).restarts[0]
    return r.replayed, r.omitted, r.verdict


def main() -> None:
    for n in SIZES:
        name, base = baseline_perm(n)
        t_base = best(base)

        def cold(n=n):
            clear_cache()
            randperm(n, 7)
        t_cold = best(cold)
        t_hot = best(lambda n=n: randperm(n, 7), repeat=5)
        print(f"n={n:>9,}: randperm cold {t_cold * 1e3:8.1f} ms, memoized {t_hot * 1e6:6.1f} us; "
              f"{name} {t_base * 1e3:7.1f} ms; ratio {t_cold / t_base:5.1f}")
        derived, reported = run_of(n, indices=False), run_of(n, indices=True)
        answer = restart_of(derived)
        assert answer == restart_of(reported), (answer, restart_of(reported))

        def analyse_cold(run=derived):
            clear_cache()
            restart_of(run)
        t_derived = best(analyse_cold)
        t_reported = best(lambda run=reported: restart_of(run))
        print(f"            analysis (replayed, omitted, verdict) = {answer}: re-created "
              f"{t_derived:6.2f} s, reported indices {t_reported:6.2f} s; ratio "
              f"{t_derived / t_reported:5.2f}")


if __name__ == "__main__":
    main()
