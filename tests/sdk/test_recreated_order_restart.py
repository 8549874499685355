"""Issue 25 item 1 end to end without a server: a real DDP-style run (two recorders, real
DataLoaders over torch's DistributedSampler through ``observed_loader``) resumed on one rank
under another seed. The SDK sends no sample ids for a DistributedSampler order; the core
re-creates them (docs/definitions.md#re-created-orders), and the restart's replayed and
omitted equal what the model received, taken from the labels of the batches."""
from __future__ import annotations

import itertools
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DistributedSampler, TensorDataset  # noqa: E402

from recoverydash.integrations.pytorch import observed_loader  # noqa: E402
from recoverydash.recovery import GenerationRecord, RunInput, analyze  # noqa: E402
from recoverydash.sdk.client import Client  # noqa: E402
from recoverydash.sdk.observe import ObservedRecorder, position_sampler_of  # noqa: E402

N, MICRO = 51, 3
COMPONENTS = ["model", "optimizer", "scheduler", "rng", "data_progress"]
CLOCK = itertools.count(1)


class Capture(Client):
    """A client of one attempt and rank that keeps its completed events (a clock of one
    second per event)."""

    def __init__(self, attempt, rank):
        super().__init__(None, None, "run-r", attempt=attempt, rank=rank)
        self.events: list[dict] = []

    def _push(self, item):
        ev = self.complete(item, 1_700_000_000.0 + next(CLOCK))
        if ev is not None:
            self.events.append(ev)
        return True


def dataset():
    return TensorDataset(torch.arange(N, dtype=torch.float32).unsqueeze(1), torch.arange(N))


def recorder(attempt, rank, world):
    return ObservedRecorder(Capture(attempt, rank), rank=rank, world_size=world,
                            dataset_version="ds-1", heartbeat_interval=0, start_timeout=0)


def generation(update, position):
    objects = [{"uri": f"file:///c/g/{c}", "shard": "rank0", "component": c, "size": 1,
                "sha256": f"{i + 1:064x}"} for i, c in enumerate(COMPONENTS)]
    manifest = {"schema_revision": 1, "generation_id": "g", "update": update, "world_size": 2,
                "required_shards": ["rank0"], "components": COMPONENTS, "objects": objects,
                "data_progress": {"cursor": [{"stratum": "main", "epoch": 0,
                                              "position": position}]},
                "dataset_version": "ds-1", "committed_at": None}
    return GenerationRecord("g", 0, update, started_at=1_700_000_000.0,
                            required_shards=["rank0"], components=COMPONENTS,
                            manifests=[manifest], committed_at=1_700_000_000.5,
                            object_checks={o["uri"]: "ok" for o in objects})


def test_an_observed_ddp_run_resumed_on_one_rank_under_another_seed_is_compared_by_sample():
    """Attempt 0: 2 ranks, seed 7, micro 3, a commit per microbatch; the checkpoint at update 4
    (cursor 24), a crash after update 5. Attempt 1: 1 rank, a fresh DistributedSampler with seed
    8 resumed at 24 (``resume_at``), to the end of epoch 0, then one update of epoch 1."""
    ds = dataset()
    received: list = []  # truth: (attempt, update, epoch, dataset index the model got)
    recorders = []
    for rank in range(2):
        rec = recorder(0, rank, 2)
        loader = observed_loader(rec, ds, batch_size=MICRO, sampler=DistributedSampler(
            ds, num_replicas=2, rank=rank, shuffle=True, seed=7))
        rec.start(resumed_from=None, global_batch_size=2 * MICRO)
        for _i, batch in zip(range(5), loader):
            received += [(0, rec.update + 1, 0, i) for i in rec.observe(batch)[1].tolist()]
            rec.commit()
        recorders.append(rec)
    assert max(c["position"] for r in recorders for c in r.cursor()) == 30
    rec = recorder(1, 0, 1)
    loader = observed_loader(rec, ds, batch_size=MICRO, sampler=DistributedSampler(
        ds, num_replicas=1, rank=0, shuffle=True, seed=8))
    sampler = position_sampler_of(loader)
    assert sampler.resume_at({"stratum": "main", "epoch": 0, "position": 24}) == 24
    rec.start(resumed_from={"generation_id": "g", "update": 4}, global_batch_size=MICRO)
    for batch in loader:
        received += [(1, rec.update + 1, 0, i) for i in rec.observe(batch)[1].tolist()]
        rec.commit()
    sampler.set_epoch(1)
    batch = next(iter(loader))
    received += [(1, rec.update + 1, 1, i) for i in rec.observe(batch)[1].tolist()]
    rec.commit()
    recorders.append(rec)

    events = [ev for r in recorders for ev in r.client.events]
    spans = [s for ev in events if ev["type"] == "update_committed" for s in ev["spans"]]
    assert spans and not any("indices" in s for s in spans)  # nothing but positions was sent
    run = RunInput.from_events(events, run_id="run-r")
    run.generations = [generation(4, 24)]

    lineage = [i for a, u, e, i in received if e == 0 and (a == 1 or u <= 4)]
    feeds = Counter(lineage)
    replays, omissions = sum(c - 1 for c in feeds.values()), N - len(feeds)
    assert len(lineage) == 24 + 27 and (replays, omissions) == (13, 13)

    analysis = analyze(run, now=1_800_000_000.0)
    (restart,) = analysis.restarts
    assert (restart.replayed, restart.omitted, restart.verdict) == \
        (replays, omissions, "replay_and_omission")
    assert "samples_unknown" not in [f.code for f in restart.findings]
    (stratum,) = analysis.strata
    assert (stratum.duplicates, stratum.omissions) == (replays, omissions)
