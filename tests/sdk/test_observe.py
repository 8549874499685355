"""The observed ledger with real torch loaders (no server): positions travel with the samples
through worker processes, prefetch, pin_memory and torchdata's state save/restore, and the
recorder reports exactly the positions that reached the model at committed updates.

Every test keeps its own truth: the dataset indices the model received (the label tensor is the
index), compared with what the recorder sent."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
)

from recoverydash.integrations.pytorch import observed_loader
from recoverydash.sdk.ledger import padded_length
from recoverydash.sdk.observe import (
    BATCH_KEY,
    ObservedIterableDataset,
    ObservedRecorder,
    compress,
    index_items,
    strip,
)

from .test_ledger import CaptureClient, torch_padded_list

N = 22


def dataset(n=N):
    return TensorDataset(torch.arange(n, dtype=torch.float32).unsqueeze(1), torch.arange(n))


def recorder(rank=0, world=1, **kw):
    return ObservedRecorder(CaptureClient(rank=rank), rank=rank, world_size=world,
                            dataset_version="ds-1", heartbeat_interval=0, start_timeout=0, **kw)


def committed(rec, padding=False):
    """{update: sorted positions} from the update_committed events of ``rec``."""
    out = {}
    for ev in rec.client.of("update_committed"):
        ps = []
        for span in ev["spans"]:
            if bool(span.get("padding")) == padding and "ranges" in span:
                for r in span["ranges"]:
                    ps.extend(range(*r))
        out[ev["update"]] = sorted(ps)
    return out


def flat(d):
    return sorted(p for ps in d.values() for p in ps)


@pytest.mark.parametrize("workers", [0, 2])
def test_it_reports_each_ranks_distributed_sampler_positions_through_workers_and_pin_memory(
        workers):
    world, micro, accum = 2, 3, 2
    ds = dataset()
    for rank in range(world):
        rec = recorder(rank, world)
        sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=5)
        loader = observed_loader(rec, ds, sampler=sampler, batch_size=micro, num_workers=workers,
                                 pin_memory=True, persistent_workers=workers > 0)
        received = []  # truth: the dataset indices the model got, in order
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for i, batch in enumerate(loader):
                _x, y = rec.observe(batch)
                received.append((epoch, y.tolist()))
                if i % accum == accum - 1:
                    rec.commit()
            rec.commit()
        evs = rec.client.of("update_committed")
        for epoch in range(2):
            order = torch_padded_list(N, world, 5, epoch, True, False)
            mine = [p for ev in evs for s in ev["spans"] if s["epoch"] == epoch
                    for r in s["ranges"] for p in range(*r)]
            got = [i for e, ys in received if e == epoch for i in ys]
            # every position names the index the model received there, in the sampler's order
            assert sorted(order[p] for p in mine) == sorted(got)
            assert sorted(mine) == list(range(rank, padded_length(N, world, False), world))
        # a DistributedSampler microbatch is one strided range
        first = evs[0]["spans"][0]
        ((start, stop, step),) = first["ranges"]
        assert (start, step) == (rank, world)
        assert list(range(start, stop, step)) == list(range(rank, micro * accum * world, world))


def test_a_distributed_sampler_that_maps_its_order_reports_the_indices_it_fed():
    # Lightning's DistributedSamplerWrapper (what Lightning puts around a sampler of its own
    # under DDP) is a DistributedSampler whose indices go through the wrapped sampler: not
    # torch's order, so not declared as one (the server would re-create other samples) and its
    # spans name the dataset indices the model got
    wrapper = pytest.importorskip(
        "lightning.fabric.utilities.distributed").DistributedSamplerWrapper
    from recoverydash.sdk.ledger import SAMPLER_ALGORITHM, order_digest

    ds = dataset(20)
    inner = RandomSampler(ds, generator=torch.Generator().manual_seed(3))
    rec = recorder(1, 2)
    got = []
    for batch in observed_loader(rec, ds, sampler=wrapper(inner, num_replicas=2, rank=1),
                                 batch_size=5):
        _x, y = rec.observe(batch)
        got.extend(y.tolist())
        rec.commit()
    spans = [s for ev in rec.client.of("update_committed") for s in ev["spans"]]
    assert [sorted(s["indices"]) for s in spans] == [sorted(got[:5]), sorted(got[5:])]
    assert [list(range(*r)) for s in spans for r in s["ranges"]] == \
        [list(range(1, 10, 2)), list(range(11, 20, 2))]
    torchs = order_digest(seed=0, epoch=0, dataset_length=20, shuffle=True,
                          dataset_version="ds-1")
    assert {s["order"] for s in spans} != {torchs}
    info = rec.sampler_info()
    assert info["algorithm"] == "lightning.fabric.utilities.distributed.DistributedSamplerWrapper"
    assert info["algorithm"] != SAMPLER_ALGORITHM


def test_it_reports_distributed_sampler_padding_in_its_own_span():
    ds = dataset(21)                  # 2 ranks: padded to 22, position 21 repeats the head
    rec = recorder(1, 2)
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=False)
    for batch in observed_loader(rec, ds, sampler=sampler, batch_size=4):
        rec.observe(batch)
    rec.commit()
    assert committed(rec) == {1: list(range(1, 21, 2))}
    assert committed(rec, padding=True) == {1: [21]}
    assert rec.cursor() == [{"stratum": "main", "epoch": 0, "position": 20}]


def test_it_records_only_what_reached_the_model_at_a_committed_update():
    rec = recorder()
    loader = observed_loader(rec, dataset(), batch_size=2)
    it = iter(loader)
    rec.observe(next(it))
    rec.observe(next(it))
    rec.commit()                     # update 1: positions 0-3
    next(it)                         # fetched, dropped (a framework's skip): not consumed
    rec.observe(next(it))            # trained ...
    rec.discard()                    # ... but its update was skipped
    rec.observe(next(it))
    rec.commit()                     # update 2: positions 8, 9 only
    rec.observe(next(it))            # trained, never committed (the crash): never reported
    assert committed(rec) == {1: [0, 1, 2, 3], 2: [8, 9]}
    assert rec.cursor() == [{"stratum": "main", "epoch": 0, "position": 10}]
    # the read cursor is what the sampler handed out, trained or not
    assert rec.fetched_cursor()[0]["position"] == 12


def test_it_reports_an_overrun_a_repeat_and_a_gap_as_they_happened():
    rec = recorder()
    ds = dataset(6)

    class Overrun(SequentialSampler):  # yields 8 indices for a dataset of 6: positions 6 and 7
        def __iter__(self):
            return iter([0, 1, 2, 3, 4, 5, 0, 1])

        def __len__(self):
            return 8

    loader = observed_loader(rec, ds, sampler=Overrun(ds), batch_size=2)
    batches = list(loader)
    for b in (batches[0], batches[0], batches[2], batches[3]):  # repeat of 0-1, 2-3 skipped
        rec.observe(b)
        rec.commit()
    assert committed(rec) == {1: [0, 1], 2: [0, 1], 3: [4, 5], 4: [6, 7]}


def test_it_strips_positions_in_a_forward_pre_hook_only_for_training_forwards():
    rec = recorder()
    model = torch.nn.Linear(1, 1)
    seen = []
    rec.attach(model)
    model.register_forward_pre_hook(lambda m, a, k: seen.append(sorted(k)), with_kwargs=True)

    def collate(samples):
        return {"input": torch.stack([s[0] for s in samples])}

    loader = observed_loader(rec, dataset(), batch_size=4, collate_fn=collate)
    it = iter(loader)
    batch = next(it)
    assert BATCH_KEY in batch
    model(**batch)
    model(**batch)                   # the same batch twice: one microbatch
    with torch.no_grad():
        model(**next(it))            # evaluation: stripped, not recorded
    rec.commit()
    assert committed(rec) == {1: [0, 1, 2, 3]}
    assert seen == [["input"], ["input"], ["input"]]


def test_it_skips_batches_a_framework_drops_on_resume_without_recording_them():
    from accelerate.data_loader import skip_first_batches

    rec = recorder()
    loader = observed_loader(rec, dataset(), batch_size=2)
    for batch in skip_first_batches(loader, 3):
        rec.observe(batch)
    rec.commit()
    assert committed(rec) == {1: list(range(6, N))}


def test_it_resumes_a_plain_loop_at_the_committed_cursor_and_observes_it():
    rec = recorder()
    loader = observed_loader(rec, dataset(), batch_size=3)
    for _i, batch in zip(range(3), loader):
        rec.observe(batch)
        rec.commit()
    state = rec.state_dict()
    assert state["cursor"] == [{"stratum": "main", "epoch": 0, "position": 9}]
    again = recorder()
    loader2 = observed_loader(again, dataset(), batch_size=3)
    again.load_state_dict(state)
    again.start(resumed_from={"generation_id": "g", "update": 3, "cursor": []})
    for batch in loader2:
        again.observe(batch)
        again.commit()
    assert flat(committed(again)) == list(range(9, N))
    (started,) = again.client.of("attempt_started")
    assert started["resumed_from"] == {"generation_id": "g", "update": 3,
                                       "cursor": [{"stratum": "main", "epoch": 0,
                                                   "position": 9}]}
    assert started["sampler"]["ledger"] == "observed"
    assert min(committed(again)) == 4


def test_it_names_a_random_order_by_its_generator_and_keeps_positions_contiguous():
    def run(seed):
        rec = recorder()
        loader = observed_loader(rec, dataset(), batch_size=4, shuffle=True, seed=seed)
        ys = []
        for batch in loader:
            ys.extend(rec.observe(batch)[1].tolist())
            rec.commit()
        evs = rec.client.of("update_committed")
        return {s["order"] for e in evs for s in e["spans"]}, flat(committed(rec)), ys

    (o1,), ps1, ys1 = run(1)
    (o1b,), _, ys1b = run(1)
    (o2,), _, ys2 = run(2)
    assert ps1 == list(range(N)) and sorted(ys1) == list(range(N)) and ys1 != list(range(N))
    assert o1 == o1b and ys1 == ys1b and o2 != o1 and ys2 != ys1


def indices_of(rec):
    """{update: sorted dataset indices} from the ``indices`` of the spans ``rec`` sent."""
    out = {}
    for ev in rec.client.of("update_committed"):
        got = []
        for span in ev["spans"]:
            for item in span.get("indices") or []:
                got.extend(range(*item) if isinstance(item, list) else [item])
        out[ev["update"]] = sorted(got)
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_it_sends_the_dataset_indices_of_a_random_orders_positions(workers):
    """Item 1 of issue 25: the positions of a RandomSampler's order travel with the dataset
    indices the model received, so that another seed's order can be compared by sample."""
    rec = recorder()
    loader = observed_loader(rec, dataset(), batch_size=4, shuffle=True, seed=3,
                             num_workers=workers)
    received = {}
    for update, batch in enumerate(loader, start=1):
        received[update] = sorted(rec.observe(batch)[1].tolist())
        rec.commit()
    assert indices_of(rec) == received
    assert flat(indices_of(rec)) == list(range(N))


def test_a_distributed_samplers_positions_carry_no_indices():
    """Its permutation is re-created by the server from seed, epoch and length."""
    rec = recorder(rank=1, world=2)
    ds = dataset()
    loader = observed_loader(rec, ds, batch_size=3,
                             sampler=DistributedSampler(ds, num_replicas=2, rank=1, seed=4))
    for batch in loader:
        rec.observe(batch)
        rec.commit()
    spans = [s for ev in rec.client.of("update_committed") for s in ev["spans"]]
    assert spans and all("indices" not in s and s["order"] for s in spans)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**63 - 1) | st.integers(0, 90), max_size=60))
def test_index_items_name_any_set_of_indices_exactly(indices):
    items = index_items(indices)
    out = [i for item in items for i in (range(*item) if isinstance(item, list) else [item])]
    assert out == sorted(set(indices))
    assert all(isinstance(item, int) or len(range(*item)) >= 3 for item in items)


def test_index_items_name_nothing_for_indices_that_are_not_integers():
    assert index_items([3, "a"]) is None and index_items([True]) is None
    assert index_items([-1, 4]) is None and index_items([]) == []
    assert index_items([5, 1, 2, 3, 9, 11, 13]) == [[1, 4], 5, [9, 14, 2]]


def test_it_counts_positions_of_a_batch_sampler():
    rec = recorder()
    ds = dataset()
    bs = BatchSampler(RandomSampler(ds, generator=torch.Generator().manual_seed(0)), 5, True)
    loader = observed_loader(rec, ds, batch_sampler=bs, num_workers=2)
    for batch in loader:
        rec.observe(batch)
        rec.commit()
    assert flat(committed(rec)) == list(range(20))  # drop_last: 4 batches of 5


def test_it_takes_partition_offsets_and_ids_from_an_iterable_dataset():
    class Stream(IterableDataset):
        def __iter__(self):
            for part in ("p0", "p1"):
                for off in range(3):
                    yield {"x": torch.tensor([float(off)]), "part": part, "off": off}

    rec = recorder()
    ds = ObservedIterableDataset(Stream(), key=lambda s: (s["part"], s["off"]))
    loader = observed_loader(rec, ds, batch_size=2,
                             collate_fn=lambda ss: {"x": torch.stack([s["x"] for s in ss])})
    for batch in loader:
        rec.observe(batch)
    rec.commit()
    (ev,) = rec.client.of("update_committed")
    assert sorted((s["stratum"], tuple(map(tuple, s["ranges"]))) for s in ev["spans"]) == \
        [("p0", ((0, 3),)), ("p1", ((0, 3),))]
    ids = recorder()
    ds = ObservedIterableDataset(Stream(), key=lambda s: f"{s['part']}/{s['off']}", ids=True,
                                 stratum="docs")
    for batch in observed_loader(ids, ds, batch_size=3,
                                 collate_fn=lambda ss: [s["x"] for s in ss]):
        ids.observe(batch)
    ids.commit()
    (ev,) = ids.client.of("update_committed")
    assert ev["spans"] == [{"stratum": "docs", "epoch": 0,
                            "ids": ["p0/0", "p0/1", "p0/2", "p1/0", "p1/1", "p1/2"]}]


def test_it_reports_bare_indices_as_ids_when_the_sampler_carries_no_position():
    from recoverydash.sdk.observe import ObservedCollate, ObservedDataset

    rec = recorder()
    ds = dataset(8)
    loader = DataLoader(ObservedDataset(ds), sampler=RandomSampler(
        ds, generator=torch.Generator().manual_seed(3)), batch_size=4,
        collate_fn=ObservedCollate())
    seen = []
    for batch in loader:
        seen.extend(rec.observe(batch)[1].tolist())
    rec.commit()
    (ev,) = rec.client.of("update_committed")
    assert ev["spans"] == [{"stratum": "main", "epoch": 0, "ids": seen}]


def test_it_counts_a_batch_without_positions_and_never_guesses():
    rec = recorder()
    for batch in DataLoader(dataset(4), batch_size=2):
        assert rec.observe(batch) is batch
    rec.commit()
    assert committed(rec) == {1: []}
    assert rec.counters()["unobserved_batches"] == 2


@pytest.mark.parametrize("workers", [0, 2])
def test_it_continues_exactly_after_statefuldataloader_state_is_restored(workers):
    from recoverydash.integrations.torchdata import observed_loader as stateful_loader

    def make():
        rec = recorder()
        return rec, stateful_loader(rec, dataset(), batch_size=2, shuffle=True, seed=11,
                                    num_workers=workers, prefetch_factor=2 if workers else None)

    rec, loader = make()
    truth = []
    it = iter(loader)
    for _ in range(4):
        truth.extend(rec.observe(next(it))[1].tolist())
        rec.commit()
    saved = rec.state_dict()          # at the optimizer boundary; workers prefetched ahead
    rec.observe(next(it))             # trained, never committed (the crash)
    del it

    restored, loader2 = make()
    restored.load_state_dict(saved)
    for batch in loader2:
        truth.extend(restored.observe(batch)[1].tolist())
        restored.commit()
    assert flat(committed(restored)) == list(range(8, N))   # no replay, no gap
    assert sorted(truth) == list(range(N))                   # every index once

    fresh, loader3 = make()           # the bug: the loader's state was not restored
    replayed = [p for batch in loader3 for p in fresh.observe(batch)[1].tolist()][:8]
    assert replayed == truth[:8]      # the epoch from its start: positions 0-7 again
    assert saved["loaders"]["train"] is not None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=60))
def test_it_compresses_any_set_of_positions_exactly(ps):
    ranges, repeated = compress(ps)
    out = [p for r in ranges for p in range(*r)]
    assert out == sorted(set(ps))
    assert repeated == len(ps) - len(set(ps))
    assert all(len(r) == 2 or r[2] > 1 for r in ranges)


def test_strip_gives_back_the_batch_structure():
    from recoverydash.sdk.observe import BatchTag, attach_tag

    tag = BatchTag([(None, [], [1])])
    assert strip(attach_tag({"a": 1}, tag)) == ({"a": 1}, tag)
    assert strip(attach_tag((1, 2), BatchTag([(None, [], [1])])))[0] == (1, 2)
    t = torch.zeros(2)
    clean, got = strip(attach_tag(t, BatchTag([(None, [], [1])])))
    assert clean is t and got is not None


def test_a_resume_cursor_inside_a_batch_delivers_the_rest_of_that_batch_first():
    rec = recorder()
    loader = observed_loader(rec, dataset(), batch_size=3)
    rec.load_state_dict({"update": 3, "cursor": [{"stratum": "main", "epoch": 0,
                                                  "position": 10}]})
    sizes = []
    for batch in loader:
        sizes.append(len(rec.observe(batch)[1]))
        rec.commit()
    assert flat(committed(rec)) == list(range(10, N))
    assert sizes[:2] == [2, 3]


def test_without_auto_collation_each_sample_carries_its_draw():
    rec = recorder()
    loader = observed_loader(rec, dataset(5), batch_size=None, num_workers=2)
    for sample in loader:
        rec.observe(sample)
    rec.commit()
    assert committed(rec) == {1: [0, 1, 2, 3, 4]}


def test_a_loader_state_of_another_rank_is_not_restored_the_sampler_resumes_at_the_cursor():
    from recoverydash.integrations.torchdata import observed_loader as stateful_loader

    ds = dataset()
    rank0 = recorder(0, 2)
    loader0 = stateful_loader(rank0, ds, batch_size=2, sampler=DistributedSampler(
        ds, num_replicas=2, rank=0, shuffle=False))
    it = iter(loader0)
    for _ in range(2):
        rank0.observe(next(it))
        rank0.commit()
    state = rank0.state_dict()          # rank 0's: positions 0, 2, 4, 6 committed
    rank1 = recorder(1, 2)
    loader1 = stateful_loader(rank1, ds, batch_size=2, sampler=DistributedSampler(
        ds, num_replicas=2, rank=1, shuffle=False))
    rank1.load_state_dict(state, cursor=[{"stratum": "main", "epoch": 0, "position": 8}])
    for batch in loader1:
        rank1.observe(batch)
        rank1.commit()
    assert flat(committed(rank1)) == list(range(9, N, 2))  # its own share from the cursor
