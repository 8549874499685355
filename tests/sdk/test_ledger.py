"""CountingRecorder against torch's own DistributedSampler (no process group needed: num_replicas
and rank are given), plus the cursor and resume helpers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
from torch.utils.data import DistributedSampler

from recoverydash.sdk.client import Client
from recoverydash.sdk.ledger import (
    CountingRecorder,
    SkipFirst,
    order_digest,
    padded_length,
    resume_skip,
    resumed_from,
)


class CaptureClient(Client):
    """A client that keeps the completed events instead of sending them."""

    def __init__(self, rank=None):
        super().__init__(None, None, "run-t", attempt=0, rank=rank)
        self.events: list[dict] = []

    def _push(self, item):
        ev = self.complete(item, 0.0)  # what the sender thread would build
        if ev is not None:
            self.events.append(ev)
        return True

    def of(self, kind):
        return [e for e in self.events if e["type"] == kind]


def positions(span):
    out = []
    for item in span["ranges"]:
        out.extend(range(*item))
    return out


def torch_padded_list(n, w, seed, epoch, shuffle, drop_last):
    """DistributedSampler's global index list before slicing, rebuilt the way torch builds it."""
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        idx = torch.randperm(n, generator=g).tolist()
    else:
        idx = list(range(n))
    total = padded_length(n, w, drop_last)
    if not drop_last:
        pad = total - len(idx)
        idx += (idx * (pad // len(idx) + 1))[:pad]
    return idx[:total]


def run_ranks(n, w, micro, accum, epochs, drop_last, seed=7):
    """Every rank of a W-rank run: microbatches of ``micro``, a commit every ``accum``."""
    ds = list(range(n))
    clients, samplers = [], []
    for r in range(w):
        sampler = DistributedSampler(ds, num_replicas=w, rank=r, shuffle=True, seed=seed,
                                     drop_last=drop_last)
        client = CaptureClient(rank=r)
        rec = CountingRecorder.for_sampler(client, sampler, dataset_version="ds-1",
                                         heartbeat_interval=0)
        update = 0
        micro_count = 0
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            idx = list(sampler)
            for i in range(0, len(idx), micro):
                rec.consumed(len(idx[i:i + micro]))
                micro_count += 1
                if micro_count % accum == 0:
                    update += 1
                    rec.commit(update)
        if micro_count % accum:
            rec.commit(update + 1)
        clients.append(client)
        samplers.append(sampler)
    return clients, samplers


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 90), w=st.integers(1, 5), micro=st.integers(1, 4),
       accum=st.integers(1, 4), drop_last=st.booleans())
def test_every_position_of_every_epoch_is_covered_once(n, w, micro, accum, drop_last):
    if drop_last and n < w:
        return  # DistributedSampler yields nothing
    clients, _ = run_ranks(n, w, micro, accum, epochs=2, drop_last=drop_last)
    total = padded_length(n, w, drop_last)
    for epoch in (0, 1):
        seen, padding = [], []
        for c in clients:
            for ev in c.of("update_committed"):
                for span in ev["spans"]:
                    if span["epoch"] != epoch:
                        continue
                    assert span["stratum"] == "main"
                    assert span["order"] == order_digest(seed=7, epoch=epoch, dataset_length=n,
                                                         shuffle=True, dataset_version="ds-1")
                    (padding if span.get("padding") else seen).extend(positions(span))
        assert sorted(seen + padding) == list(range(total))        # each position exactly once
        assert sorted(padding) == list(range(min(n, total), total))  # padding marked, only it


@pytest.mark.parametrize("drop_last", [False, True])
def test_rank_positions_index_the_padded_permuted_list(drop_last):
    n, w = 23, 4
    clients, samplers = run_ranks(n, w, micro=2, accum=4, epochs=1, drop_last=drop_last)
    padded = torch_padded_list(n, w, seed=7, epoch=0, shuffle=True, drop_last=drop_last)
    for r, (c, sampler) in enumerate(zip(clients, samplers)):
        mine = [p for ev in c.of("update_committed") for s in ev["spans"] for p in positions(s)]
        assert [padded[p] for p in sorted(mine)] == list(sampler)  # position -> same sample
        assert all(p % w == r for p in mine)


def test_a_microbatch_is_one_strided_range_and_contiguous_ones_merge():
    c = CaptureClient(rank=2)
    rec = CountingRecorder(c, rank=2, world_size=8, dataset_length=1000, heartbeat_interval=0)
    for _ in range(4):
        rec.consumed(2)
    rec.commit(1)
    (ev,) = c.of("update_committed")
    assert ev["event_id"] == "run-t:0:2:u1" and ev["rank"] == 2 and ev["samples"] == 8
    assert ev["spans"] == [{"stratum": "main", "epoch": 0, "ranges": [[2, 66, 8]],
                            "order": rec.order()}]


def test_read_cursor_runs_ahead_of_the_committed_cursor():
    """docs/definitions.md#worked-example: 8 ranks, micro 2, accum 4; 3 microbatches read after
    update 1,250."""
    rec = CountingRecorder(CaptureClient(), rank=0, world_size=8, dataset_length=10**6,
                         heartbeat_interval=0)
    for update in range(1, 1251):
        for _ in range(4):
            rec.consumed(2)
        rec.commit(update)
    for _ in range(3):
        rec.consumed(2)
    assert rec.cursor() == [{"stratum": "main", "epoch": 0, "position": 80_000}]
    assert rec.fetched_cursor() == [{"stratum": "main", "epoch": 0, "position": 80_048}]
    rec.heartbeat()
    hb = rec.client.of("heartbeat")[-1]
    assert hb["update"] == 1250 and hb["fetched"][0]["position"] == 80_048
    assert rec.state_dict()["samples_committed"] == 80_000


def test_the_recorder_follows_the_samplers_epoch():
    ds = list(range(10))
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=1)
    c = CaptureClient(rank=1)
    rec = CountingRecorder.for_sampler(c, sampler, heartbeat_interval=0)
    rec.consumed(3)
    sampler.set_epoch(1)
    rec.consumed(2)  # an update straddling the epoch boundary: two spans
    rec.commit(1)
    spans = c.of("update_committed")[0]["spans"]
    assert [(s["epoch"], s["ranges"]) for s in spans] == [(0, [[1, 7, 2]]), (1, [[1, 5, 2]])]
    assert spans[0]["order"] != spans[1]["order"]
    assert rec.cursor() == [{"stratum": "main", "epoch": 1, "position": 4}]


def test_order_names_the_permutation_not_the_world_size():
    a = order_digest(seed=1, epoch=0, dataset_length=100, shuffle=True)
    assert a == order_digest(seed=1, epoch=0, dataset_length=100, shuffle=True)
    assert a != order_digest(seed=1, epoch=1, dataset_length=100, shuffle=True)
    assert a != order_digest(seed=2, epoch=0, dataset_length=100, shuffle=True)
    assert a != order_digest(seed=1, epoch=0, dataset_length=101, shuffle=True)
    assert a != order_digest(seed=1, epoch=0, dataset_length=100, shuffle=True,
                             dataset_version="v2")
    r4 = CountingRecorder(CaptureClient(), rank=0, world_size=4, dataset_length=100, seed=1)
    r8 = CountingRecorder(CaptureClient(), rank=0, world_size=8, dataset_length=100, seed=1)
    assert r4.order() == r8.order() == a


def test_a_repeated_commit_never_reuses_an_event_id():
    c = CaptureClient(rank=0)
    rec = CountingRecorder(c, rank=0, world_size=1, dataset_length=10, heartbeat_interval=0)
    rec.consumed(1)
    rec.commit(1)
    rec.consumed(1)
    rec.commit(1)
    ids = [e["event_id"] for e in c.of("update_committed")]
    assert len(set(ids)) == 2 and ids[0] == "run-t:0:0:u1"


def test_the_recorder_never_raises():
    rec = CountingRecorder(CaptureClient(), rank=0, world_size=2, dataset_length=10)
    rec.consumed("three")  # nonsense in: the report cannot be built, and that is all
    rec.commit(1)
    assert rec.client.counters()["failed"] == 1
    rec.consumed(2)
    assert rec.commit(2) is True
    assert [e["update"] for e in rec.client.of("update_committed")] == [2]


@given(p=st.integers(0, 500), w_old=st.integers(1, 8), w_new=st.integers(1, 8))
@settings(max_examples=60, deadline=None)
def test_resuming_at_a_cursor_continues_exactly_there_for_any_world_size(p, w_old, w_new):
    p = p - p % w_old  # a committed cursor of the old run: a whole number of rank-rounds
    starts = []
    for r in range(w_new):
        epoch, skip = resume_skip({"epoch": 3, "position": p}, rank=r, world_size=w_new)
        assert epoch == 3
        starts.append(r + skip * w_new)
    # from each new rank's first position on, stride W: together exactly the positions >= p
    bound = p + 3 * w_new
    covered = sorted(q for s in starts for q in range(s, bound, w_new))
    assert covered == list(range(p, bound))


def test_an_exhausted_epoch_resumes_at_the_next_one():
    assert resume_skip({"epoch": 0, "position": 40}, rank=1, world_size=4, per_rank=10) == (1, 0)
    assert resume_skip({"epoch": 0, "position": 36}, rank=1, world_size=4, per_rank=10) == (0, 9)


def test_restore_and_skip_first_resume_the_sampler_mid_epoch():
    ds = list(range(50))
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3)
    sampler.set_epoch(1)
    full = list(sampler)
    rec = CountingRecorder.for_sampler(CaptureClient(rank=1), sampler, heartbeat_interval=0)
    skip = rec.restore([{"stratum": "main", "epoch": 1, "position": 20}], update=5)
    assert skip == 10 and rec.update == 5 and rec.cursor()[0]["position"] == 20
    wrapped = SkipFirst(sampler, skip, rec.epoch)
    assert len(wrapped) == len(full) - 10
    assert list(wrapped) == full[10:]
    assert list(wrapped) == full  # only once
    rec.consumed(2)
    rec.commit(6)
    assert rec.client.of("update_committed")[0]["spans"][0]["ranges"] == [[21, 25, 2]]


def test_resumed_from_reads_a_manifest():
    m = {"generation_id": "g5", "update": 5,
         "data_progress": {"cursor": [{"stratum": "main", "epoch": 0, "position": 40}]}}
    assert resumed_from(m) == {"generation_id": "g5", "update": 5,
                               "cursor": [{"stratum": "main", "epoch": 0, "position": 40}]}
    assert resumed_from(None) is None
