"""Benchmark of the recovery core (issue 3): a synthetic run of 1,000,000 updates over 4 strata
with 5 restarts, 64 data-parallel ranks reporting strided spans (rank r of W owns r, r+W, ...),
2 positions per rank per stratum per update, 4 epochs per stratum, a generation every 5,000
updates, restart 2 replays one global batch and restart 4 skips one.

Run: .venv/bin/python bench/analysis.py

What each timing covers:
* core full analysis: ``analyze(run, now, ledger)`` from the compact per-attempt ledger state
  (runs, bitmaps); building that state from 64 million report objects is not timed at full size
  (the state is built directly from the run plan, as a worker keeps it between analyses);
* core absorb: ``Ledger.absorb`` of 1,000 new updates = 64,000 LedgerRecords with 4 spans each
  (256,000 spans), then the same analysis again. Median of 7 repetitions, each on a fresh copy of
  the state (``Ledger.from_bytes``), interleaved with the same-process baseline: the general,
  record-by-record path (``absorb(records, fast=False)``, the path before the batch fast path),
  which must give the same state byte for byte. The load average is printed beside;
* brute-force model: the Python-sets model of tests/recovery/recovery_oracle.py is far too slow
  and too large at full size (512 million positions), so it runs on 1/1000 of the run (1,000
  updates, same ranks and strata) and its time is scaled by 1,000 (linear in positions); the core
  is timed on that same small run from records and must give the same figures.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from pyroaring import BitMap64

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "recovery"))

from recoverydash.recovery import (  # noqa: E402
    AttemptRecord,
    GenerationRecord,
    Ledger,
    LedgerRecord,
    RunInput,
    analyze,
)
from recoverydash.recovery.ledger import AttemptLedger  # noqa: E402

STRATA = ["web", "code", "books", "math"]
RANKS = 64
PER_RANK = 2
B = RANKS * PER_RANK          # positions per stratum per update
COMPONENTS = ["model", "optimizer", "scheduler", "rng", "data_progress"]
SHARDS = ["rank0", "rank1", "rank2", "rank3"]


class Plan:
    """The run: attempts k = 0..5, attempt k commits updates (lo_k, hi_k] with position shift
    s_k."""

    def __init__(self, updates: int):
        self.updates = updates
        self.every = max(1, updates // 200)                 # generation interval, in updates
        self.epoch_length = B * max(1, updates // 4)         # 4 epochs per stratum
        resume = [0] + [self.every * round(updates * k / (6 * self.every)) for k in range(1, 6)]
        overrun = max(1, self.every // 2)
        self.attempts = []
        shift = 0
        for k in range(6):
            if k == 2:
                shift -= B   # restart 2 resumes one global batch early: replay
            if k == 4:
                shift += B   # restart 4 resumes one global batch late: omission
            hi = resume[k + 1] + overrun if k < 5 else updates
            self.attempts.append((k, resume[k], hi, shift))
        self.start = {}
        t = 1_000_000.0
        for k, lo, hi, _ in self.attempts:
            self.start[k] = t
            t += (hi - lo) * 1.0 + 180.0

    def index(self, shift: int, update: int) -> int:
        return (update - 1) * B + shift

    def cursor(self, shift: int, update: int) -> list:
        """The stream's next position after ``update`` (per stratum, same for all)."""
        idx = update * B + shift
        e, p = divmod(idx, self.epoch_length)
        return [{"stratum": s, "epoch": e, "position": p} for s in STRATA]

    def time(self, k: int, lo: int, update: int) -> float:
        return self.start[k] + (update - lo) * 1.0

    def run_input(self) -> RunInput:
        attempts, generations = [], []
        for k, lo, hi, shift in self.attempts:
            record = AttemptRecord(
                k, started_at=self.start[k] - 60.0, world_size=RANKS, dataset_version="ds",
                global_batch_size=B * len(STRATA),
                sampler={"epoch_length": {s: self.epoch_length for s in STRATA}},
                resumed_from=None if k == 0 else {
                    "generation_id": f"g{k - 1}-{lo}", "update": lo,
                    "cursor": self.cursor(shift, lo)},
                last_event_at=self.time(k, lo, hi) + 2.0)
            if k < 5:
                record.ended_at = self.time(k, lo, hi) + 2.0
                record.end_reason, record.end_update = "failed", hi
                record.end_fetched = [dict(c, position=c["position"] + B // 2)
                                      for c in self.cursor(shift, hi)]
            attempts.append(record)
            for u in range(lo + self.every - lo % self.every, hi + 1, self.every):
                gid = f"g{k}-{u}"
                objects = [{"uri": f"s3://ckpt/{gid}/{sh}/{c}", "shard": sh, "component": c,
                            "size": 1 << 20, "sha256": f"{hash((gid, sh, c)) & (2**256 - 1):064x}"}
                           for sh in SHARDS for c in COMPONENTS]
                manifest = {"schema_revision": 1, "generation_id": gid, "update": u,
                            "world_size": RANKS, "required_shards": SHARDS,
                            "components": COMPONENTS, "objects": objects,
                            "data_progress": {"cursor": self.cursor(shift, u)},
                            "dataset_version": "ds", "committed_at": None}
                committed = self.time(k, lo, u) + 0.8
                generations.append(GenerationRecord(
                    gid, k, u, started_at=committed - 20.0, required_shards=SHARDS,
                    components=COMPONENTS, manifests=[manifest], committed_at=committed,
                    object_checks={o["uri"]: "ok" for o in objects}))
        return RunInput("bench", attempts, [], [], generations, first_event_at=self.start[0] - 60)

    def records(self, k: int, lo: int, first: int, last: int, shift: int):
        """LedgerRecords of attempt k for updates first..last (64 ranks x 4 strata spans)."""
        out = []
        for u in range(first, last + 1):
            e, p = divmod(self.index(shift, u), self.epoch_length)
            when = self.time(k, lo, u)
            for r in range(RANKS):
                out.append(LedgerRecord(k, u, r, when, [
                    {"stratum": s, "epoch": e, "ranges": [[p + r, p + B, RANKS]]}
                    for s in STRATA]))
        return out

    def all_records(self):
        out = []
        for k, lo, hi, shift in self.attempts:
            out += self.records(k, lo, lo + 1, hi, shift)
        return out

    def compact_ledger(self) -> Ledger:
        """The Ledger state absorb() would build, constructed directly from the plan."""
        ledger = Ledger()
        for k, lo, hi, shift in self.attempts:
            state = AttemptLedger()
            ledger.attempts[k] = state
            u = lo + 1
            while u <= hi:
                e, p = divmod(self.index(shift, u), self.epoch_length)
                end = min(hi, (e + 1) * self.epoch_length // B - shift // B)
                while self.index(shift, end) // self.epoch_length != e:
                    end -= 1
                for s in STRATA:
                    key = (s, e, None)
                    for r in range(RANKS):
                        run = [r, key, 0, u, end, p + r, B, PER_RANK, RANKS]
                        state.runs.append(run)
                        state.open[(r, key, 0)] = run
                u = end + 1
            state.updates = BitMap64()
            state.updates.add_range(lo + 1, hi + 1)
            state.absorbed = {r: BitMap64(state.updates) for r in range(RANKS)}
            for u in range(lo + 1, hi + 1):
                state.note_time(u, self.time(k, lo, u))
        return ledger


def timed(fn, repeat=1):
    """(median seconds over ``repeat`` calls, the last result)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def load() -> str:
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def model_figures(run):
    from recovery_oracle import Model
    model = Model(run)
    return model.strata(max(model.attempts)), model.restarts()


def main() -> None:
    scale = 1000
    small = Plan(1_000_000 // scale)
    small_run = small.run_input()
    small_run.ledger = small.all_records()
    now_small = small.time(5, small.attempts[5][1], small.updates) + 10
    print(f"small run (1/{scale}): {len(small_run.ledger):,} ledger records, "
          f"{len(small_run.generations)} generations")
    core_small_s, core_small = timed(lambda: analyze(small_run, now_small), repeat=5)
    assert analyze(small_run, now_small, ledger=small.compact_ledger()).to_dict() == \
        core_small.to_dict(), "the compact builder must equal absorb()"
    model_small_s, (model_strata, model_restarts) = timed(lambda: model_figures(small_run))
    assert [s.to_dict() for s in core_small.strata] == model_strata
    for mine, want in zip(core_small.restarts, model_restarts):
        assert (mine.replayed, mine.omitted, mine.recomputed, mine.verdict) == \
            (want["replayed"], want["omitted"], want["recomputed"], want["verdict"])
    print(f"  core (absorb + analyze from records) {core_small_s * 1000:8.1f} ms; "
          f"brute-force model {model_small_s * 1000:9.1f} ms; figures agree")

    plan = Plan(1_000_000)
    run = plan.run_input()
    build_s, ledger = timed(plan.compact_ledger)
    last_k, last_lo, last_hi, last_shift = plan.attempts[-1]
    now = plan.time(last_k, last_lo, last_hi) + 10
    positions = sum((hi - lo) * B * len(STRATA) for _, lo, hi, _ in plan.attempts)
    runs = sum(len(s.runs) for s in ledger.attempts.values())
    print(f"\nfull run: {plan.updates:,} lineage updates, "
          f"{sum(hi - lo for _, lo, hi, _ in plan.attempts):,} reported, {RANKS} ranks, "
          f"{len(STRATA)} strata, 5 restarts: {positions:,} positions in "
          f"{positions // (B * len(STRATA)) * RANKS:,} (update, rank) reports; "
          f"compact state: {runs:,} runs (built from the plan in {build_s:.2f} s)")
    blob_s, blob = timed(ledger.to_bytes)
    load_s, _ = timed(lambda: Ledger.from_bytes(blob))
    full_s, analysis = timed(lambda: analyze(run, now, ledger=Ledger.from_bytes(blob)), repeat=5)
    print(f"  core full analysis (load state + analyze), median of 5: {full_s:.3f} s "
          f"[state {len(blob) / 1e6:.1f} MB, to_bytes {blob_s:.3f} s, from_bytes {load_s:.3f} s]")
    for r in analysis.restarts:
        print(f"    restart {r.attempt}: {r.verdict:9s} replayed {r.replayed:4d} omitted "
              f"{r.omitted:4d} recomputed {r.recomputed:5d} lost {r.lost_updates} updates")
    print("    strata: " + ", ".join(f"{s.stratum} dup {s.duplicates} om {s.omissions}"
                                      for s in analysis.strata))
    print(f"    last restorable {analysis.last_restorable.generation_id}, "
          f"{analysis.updates_at_risk} updates at risk, health {analysis.health}")

    new = plan.records(last_k, last_lo, last_hi + 1, last_hi + 1000, last_shift)
    one_span = [LedgerRecord(r.attempt, r.update, r.rank, r.time, r.spans[:1]) for r in new]

    def absorb_medians(records, repeat=7):
        """Median seconds of absorb (fast path) and of the general path, interleaved, each
        repetition on a fresh copy of the state; both must build the same state."""
        times = {True: [], False: []}
        states = {}
        for _ in range(repeat):
            for fast in (True, False):
                state = Ledger.from_bytes(blob)
                t0 = time.perf_counter()
                state.absorb(records, fast=fast)
                times[fast].append(time.perf_counter() - t0)
                states[fast] = state
        assert states[True].to_bytes() == states[False].to_bytes(), "fast path != general path"
        return statistics.median(times[True]), statistics.median(times[False]), times, states[True]

    load_before = load()
    absorb_s, general_s, absorb_all, state = absorb_medians(new)
    one_s, one_general_s, _, _ = absorb_medians(one_span)
    load_after = load()
    reanalyse_s, after = timed(lambda: analyze(run, now + 1000, ledger=state), repeat=3)
    assert after.strata[0].consumed == analysis.strata[0].consumed + 1000 * B
    print(f"  core absorb of 1,000 updates ({len(new):,} records, 4 spans each), median of 7, "
          f"fresh state each: {absorb_s * 1000:.1f} ms "
          f"[{', '.join(f'{t * 1000:.0f}' for t in absorb_all[True])}]; general path "
          f"{general_s * 1000:.1f} ms [{', '.join(f'{t * 1000:.0f}' for t in absorb_all[False])}]"
          f"; same state; re-analysis after it: {reanalyse_s * 1000:.1f} ms")
    print(f"  core absorb of 1,000 updates ({len(new):,} records, 1 span each), median of 7: "
          f"{one_s * 1000:.1f} ms; general path {one_general_s * 1000:.1f} ms")
    print(f"  ({load_before} before the absorb timings, {load_after} after; 2 shared cores)")

    model_full_est = model_small_s * scale
    print(f"\nbrute-force model, estimated for the full run (1/{scale} run x {scale}): "
          f"{model_full_est:,.0f} s; for 1,000 new updates it recomputes everything, "
          f"the same {model_full_est:,.0f} s")
    print("(timings on a shared machine: the load of other processes inflates them; medians)")
    print("\nratios (brute-force model / core):")
    print(f"  same small run, full analysis:      {model_small_s / core_small_s:10.1f} x")
    print(f"  full run, full analysis (est.):     {model_full_est / full_s:10.1f} x   "
          f"[core {full_s:.3f} s, target 5 s]")
    print(f"  full run, absorb 1,000 updates:     {model_full_est / absorb_s:10.1f} x   "
          f"[core {absorb_s * 1000:.1f} ms with 4 spans per report, {one_s * 1000:.1f} ms "
          f"with 1; target 100 ms]")
    print("ratio (general path / batch fast path, same process, same records, same state):")
    print(f"  absorb 1,000 updates, 4 spans:      {general_s / absorb_s:10.1f} x   "
          f"[{general_s * 1000:.1f} ms -> {absorb_s * 1000:.1f} ms; {load_after}]")


if __name__ == "__main__":
    main()
