"""Real torch.distributed: 4 gloo processes on the CPU, a tiny DDP model, DCP saves published by
save_generation, a rank killed mid-save, and a resumed attempt (dist_worker.py is one rank)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from recoverydash.checkpoints.objects import MANIFEST_NAME
from recoverydash.checkpoints.selection import select_restorable
from recoverydash.sdk.ledger import padded_length

from .conftest import REPO, FakeIngest, free_port

pytestmark = pytest.mark.slow

WORLD = 4
N = 203            # samples: 51 per rank, one padding position
MICRO, ACCUM = 3, 4
WORKER = Path(__file__).with_name("dist_worker.py")


def launch(cfg: dict, timeout: float = 90.0, world: int = WORLD) -> list[int]:
    """Run ``world`` ranks of dist_worker.py; returns their exit codes."""
    port = free_port()
    procs = []
    for r in range(world):
        env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(REPO)}
        procs.append(subprocess.Popen([sys.executable, str(WORKER), json.dumps(cfg)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    codes = []
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        codes.append(p.returncode)
    return codes


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three runs sharing one fake ingest server: a clean 2-epoch run; a run whose rank 3 dies
    while generation 8 is saved; the resumed attempt of that run."""
    base = tmp_path_factory.mktemp("dist")
    ingest = FakeIngest()
    common = {"url": ingest.url, "token": "t", "spool": str(base / "spool"), "epochs": 2,
              "accum": ACCUM, "micro": MICRO, "n": N, "ckpt_every": 4}
    out = {}
    for name, extra in [
        ("clean", {"run_id": "clean", "attempt": 0}),
        ("killed", {"run_id": "crash", "attempt": 0, "kill_rank": 3, "kill_update": 8}),
        ("resumed", {"run_id": "crash", "attempt": 1, "resume": True}),
    ]:
        loc = base / ("ckpt-" + extra["run_id"])
        res = base / f"out-{name}"
        res.mkdir()
        cfg = {**common, **extra, "location": str(loc), "out": str(res)}
        codes = launch(cfg)
        results = {int(p.stem[4:]): json.loads(p.read_text()) for p in res.glob("rank*.json")}
        out[name] = {"codes": codes, "location": str(loc), "results": results,
                     "manifests": sorted(os.listdir(loc)) and
                     sorted(d for d in os.listdir(loc) if os.path.exists(loc / d / MANIFEST_NAME)),
                     "folders": sorted(os.listdir(loc)),
                     "selection": select_restorable(str(loc), world_size=WORLD)}
    yield ingest, out
    ingest.stop()


def events(ingest, run_id, kind, attempt=None):
    return [e for e in ingest.stored.values() if e["run_id"] == run_id and e["type"] == kind
            and (attempt is None or e["attempt"] == attempt)]


def positions(span):
    return [p for item in span["ranges"] for p in range(*item)]


def coverage(updates):
    """{(epoch, padding): sorted positions} over update_committed events."""
    out: dict = {}
    for ev in updates:
        for span in ev["spans"]:
            out.setdefault((span["epoch"], bool(span.get("padding"))), []).extend(positions(span))
    return {k: sorted(v) for k, v in out.items()}


def test_a_clean_save_is_restorable(runs):
    ingest, out = runs
    run = out["clean"]
    assert run["codes"] == [0] * WORLD
    assert run["results"][0]["published"] == ["u000000004-a0", "u000000008-a0"]
    sel = select_restorable(run["location"], world_size=WORLD, dataset_version="ds-1",
                            verify_all=True)
    assert sel.generation_id == "u000000008-a0"
    assert [g.status for g in sel.generations] == ["restorable", "restorable"]
    m = sel.manifest
    assert m["required_shards"] == [f"rank{r}" for r in range(WORLD)]
    assert m["components"] == ["model", "optimizer", "scheduler", "rng", "data_progress"]
    assert {o["shard"] for o in m["objects"]} == set(m["required_shards"])
    assert all(o["update"] == 8 and len(o["sha256"]) == 64 for o in m["objects"])
    assert any(o["uri"].endswith(".distcp") for o in m["objects"])
    assert any(o["uri"].endswith("/model/.metadata") for o in m["objects"])
    # 8 updates of 4 microbatches of 3 samples on 4 ranks = 384 = 204 (epoch 0) + 180
    assert m["data_progress"]["cursor"] == [{"stratum": "main", "epoch": 1, "position": 180}]
    assert (m["run_id"], m["attempt"]) == ("clean", 0)
    committed = events(ingest, "clean", "checkpoint_committed")
    assert sorted(e["manifest"]["generation_id"] for e in committed) \
        == ["u000000004-a0", "u000000008-a0"]
    assert len(events(ingest, "clean", "shard_written")) == 2 * WORLD
    assert len(events(ingest, "clean", "checkpoint_started")) == 2


def test_the_ledger_of_two_epochs_with_accumulation_covers_each_position_once(runs):
    ingest, _ = runs
    updates = events(ingest, "clean", "update_committed")
    total = padded_length(N, WORLD, drop_last=False)
    cov = coverage(updates)
    for epoch in (0, 1):
        assert cov[(epoch, False)] == list(range(N))               # each real position once
        assert cov[(epoch, True)] == list(range(N, total))          # padding marked
    # the positions are DistributedSampler's own: rebuild the padded permuted list of epoch 1
    g = torch.Generator()
    g.manual_seed(11 + 1)
    order = torch.randperm(N, generator=g).tolist()
    order += order[:total - N]
    sampler = torch.utils.data.DistributedSampler(list(range(N)), num_replicas=WORLD, rank=2,
                                                  shuffle=True, seed=11)
    sampler.set_epoch(1)
    assert [order[p] for p in range(2, total, WORLD)] == list(sampler)
    # one report per (rank, update), and rank r reports only positions r mod W
    assert len({(e["rank"], e["update"]) for e in updates}) == len(updates)
    assert all(p % WORLD == e["rank"] for e in updates for s in e["spans"] for p in positions(s))
    assert max(e["update"] for e in updates) == 9  # 34 microbatches per rank / 4, rounded up
    started = events(ingest, "clean", "attempt_started")
    assert len(started) == WORLD and started[0]["resumed_from"] is None
    assert started[0]["sampler"]["epoch_length"] == {"main": N}


def test_a_rank_killed_mid_save_publishes_nothing_and_the_previous_generation_is_chosen(runs):
    ingest, out = runs
    run = out["killed"]
    assert run["codes"][3] == 17 and all(c != 0 for c in run["codes"])
    # right after the crash: the half-written generation has files but no manifest
    assert run["folders"] == ["u000000004-a0", "u000000008-a0"]
    assert run["manifests"] == ["u000000004-a0"]
    sel = run["selection"]
    assert sel.generation_id == "u000000004-a0"
    assert [g.generation_id for g in sel.generations] == ["u000000004-a0"]
    assert not [e for e in events(ingest, "crash", "checkpoint_committed", attempt=0)
                if e["manifest"]["generation_id"] == "u000000008-a0"]


def test_a_resumed_run_reports_where_it_resumed_and_continues_exactly(runs):
    ingest, out = runs
    assert out["resumed"]["codes"] == [0] * WORLD
    started = events(ingest, "crash", "attempt_started", attempt=1)
    assert len(started) == WORLD
    # update 4 = 4 x 4 microbatches x 3 samples x 4 ranks = 192 positions of epoch 0
    expected = {"generation_id": "u000000004-a0", "update": 4,
                "cursor": [{"stratum": "main", "epoch": 0, "position": 192}]}
    assert all(e["resumed_from"] == expected for e in started)
    # the resumed attempt publishes its own generations beside the half-written one
    assert out["resumed"]["results"][0]["published"] == ["u000000008-a1"]
    assert select_restorable(out["resumed"]["location"]).generation_id == "u000000008-a1"
    assert len(events(ingest, "crash", "restore_completed", attempt=1)) == 1
    first = [e for e in events(ingest, "crash", "update_committed", attempt=1)
             if e["update"] == 5]
    # update 5: the last microbatch of epoch 0 (from the cursor on), then 3 of epoch 1
    assert min(p for e in first for s in e["spans"] if s["epoch"] == 0 for p in positions(s)) \
        == 192
    # the lineage: attempt 0 up to update 4, then attempt 1: every position exactly once
    lineage = [e for e in events(ingest, "crash", "update_committed", attempt=0)
               if e["update"] <= 4] + events(ingest, "crash", "update_committed", attempt=1)
    cov = coverage(lineage)
    for epoch in (0, 1):
        assert cov[(epoch, False)] == list(range(N))
