"""The demo's Megatron-Core run: ``examples/megatron_gpt.py`` (Megatron-Core's ``GPTDataset``
blended over two synthetic sources, its batch-size ramp-up, a pretraining loop on CPU/gloo, the
ledger in tokens) launched twice as a trainer would be: attempt 0 dies after an update, attempt
1 restores the model but not the loader's state (``consumed_samples`` starts at 0 again).

The truth is read from what the model received, independently of recoverydash: every token's
value in the example's data is its offset in its source's stream, and ``--sample-log`` writes the
token values of every microbatch the model got (:func:`token_truth`).

One process, no torchrun (the example makes its own one-rank gloo group): the cheapest of the
three frameworks on a small machine (each launch took 37-120 s on the shared 2-core development
machine, load 7-9)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "megatron_gpt.py"

# The run: 10 updates, a generation every 4, the ramp 4 -> 6 -> 8 samples per update over the
# first 16 samples (Megatron's rampup_batch_size [start, increment, ramp samples]), 32 tokens per
# sample, micro-batch 2, one rank. Updates take 4, 4, 6, 6, 8, 8, ... samples.
SEQ, UPDATES, SAVE_EVERY, CRASH_AFTER = 32, 10, 4, 6
RAMPUP = (4, 2, 16)
CRASH_CODE = 3  # the example's os._exit(3)


def available() -> bool:
    """Whether megatron-core's datasets (the ``frameworks`` extra) and the example are here."""
    try:
        found = importlib.util.find_spec("megatron.core.datasets.gpt_dataset") is not None
    except ModuleNotFoundError:
        found = False
    return found and EXAMPLE.exists()


def ramp_samples(updates: int, start: int = RAMPUP[0], incr: int = RAMPUP[1],
                 ramp: int = RAMPUP[2], final: int = 8, micro: int = 2) -> list[int]:
    """Samples each of the first ``updates`` updates takes from ``consumed_samples`` 0, by
    Megatron's ramp-up rule (``num_microbatches_calculator``: the global batch is ``start +
    incr * (consumed // (ramp / ((final - start) / incr)))`` until ``consumed`` passes ``ramp``,
    then ``final``; an update takes ``global // micro`` whole micro-batches on one rank). The
    demo's expected counts are computed from it; the sample log checks them."""
    per_increment = ramp / ((final - start) // incr)
    out, consumed = [], 0
    for _ in range(updates):
        gbs = final if consumed > ramp else start + incr * int(consumed / per_increment)
        out.append(gbs // micro * micro)
        consumed += out[-1]
    return out


def _env(base: Path) -> dict:
    """A trainer's environment: none of the demo's RECOVERYDASH_* or launcher variables, the
    repository importable, one thread, a spool of its own."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RECOVERYDASH_", "TORCHELASTIC_", "SLURM_", "DJANGO_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1",
               RECOVERYDASH_SPOOL_DIR=str(base / "spool-megatron"))
    return env


def launch(base: Path, url: str, token: str, run_id: str, location: str, *extra: str,
           timeout: float = 300.0) -> subprocess.CompletedProcess:
    """One launch of the example (its stdout and stderr captured)."""
    work = base / "megatron"
    work.mkdir(exist_ok=True)
    args = [sys.executable, str(EXAMPLE), "--url", url, "--token", token, "--run-id", run_id,
            "--location", location, "--data", str(base / "megatron-data"),
            "--updates", str(UPDATES), "--save-every", str(SAVE_EVERY), "--seq", str(SEQ),
            "--rampup", *map(str, RAMPUP), "--sample-log", str(work / f"{run_id}.jsonl"),
            *extra]
    return subprocess.run(args, capture_output=True, text=True, env=_env(base), cwd=work,
                          timeout=timeout, check=False)


def token_truth(log_path: Path, resumed_update: int) -> dict:
    """What the model received, from the sample log (one line per microbatch: attempt, update,
    token value runs), by the definitions of docs/definitions.md#a-restart: ``replayed`` (tokens
    attempt 1 received that attempt 0 had received in the updates up to ``resumed_update``, the
    live lineage), ``recomputed`` (tokens attempt 1 received that attempt 0 had received only in
    the rolled-back updates after it). Units: tokens."""
    lines = [json.loads(x) for x in Path(log_path).read_text().splitlines() if x.strip()]
    lineage: set = set()
    rolled: set = set()
    for x in lines:
        if x["attempt"] == 0:
            into = lineage if x["update"] <= resumed_update else rolled
            for a, b in x["tokens"]:
                into.update(range(a, b))
    received: Counter = Counter()
    for x in lines:
        if x["attempt"] == 1:
            for a, b in x["tokens"]:
                received.update(range(a, b))
    return {"replayed": sum(n for v, n in received.items() if v in lineage),
            "recomputed": sum(n for v, n in received.items()
                              if v in rolled and v not in lineage)}


def run(run_id: str, base: Path, url: str, token: str, location: str, say) -> dict:
    """Attempt 0 (dies after update ``CRASH_AFTER``), then attempt 1 without the loader's
    state; the job record of the demo (exit codes, the generations in storage, the truth)."""
    first = launch(base, url, token, run_id, location, "--crash-at-update", str(CRASH_AFTER))
    on_disk = {g: os.path.exists(os.path.join(location, g, "recoverydash-manifest.json"))
               for g in sorted(os.listdir(location))} if os.path.isdir(location) else {}
    say(f"  attempt 0 (Megatron-Core, 1 rank) exit code {first.returncode}; in storage: "
        + (", ".join(f"{g}{'' if m else ' (no manifest)'}" for g, m in on_disk.items())
           or "nothing"))
    second = launch(base, url, token, run_id, location, "--no-restore-data")
    resumed = next((line for line in second.stdout.splitlines()
                    if line.startswith("attempt 1:")), "attempt 1: (no line)")
    say(f"  attempt 1 (resume without consumed_samples) exit code {second.returncode}: "
        f"{resumed}")
    for proc in (first, second):
        if proc.returncode not in (0, CRASH_CODE):
            say("  " + proc.stderr[-2000:].replace("\n", "\n  "))
    log = base / "megatron" / f"{run_id}.jsonl"
    truth = token_truth(log, SAVE_EVERY) if log.exists() else None
    return {"codes0": [first.returncode], "codes1": [second.returncode], "discovered": None,
            "on_disk": on_disk, "location": location, "truth": truth}
