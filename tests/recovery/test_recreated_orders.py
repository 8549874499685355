"""Orders the server re-creates (docs/definitions.md#re-created-orders; issue 25 item 1): the
sample identities of a ``DistributedSampler`` order derived from the order's settings, proven
equal to torch's own ``randperm`` and ``DistributedSampler``, and restarts that change the order
compared by those identities with the truth taken from torch's samplers."""
from __future__ import annotations

from collections import Counter

import pytest
from pyroaring import BitMap64

from recoverydash.recovery import (
    AttemptRecord,
    GenerationRecord,
    LedgerRecord,
    RunInput,
    analyze,
    samplers,
)
from recoverydash.recovery.samplers import (
    RANDPERM_LIMIT,
    RECREATED_LENGTH_LIMIT,
    SAMPLER_ALGORITHM,
    RecreatedOrder,
    _words_python,
    _words_stdlib,
    distributed_indices,
    order_digest,
    randperm,
    recreated_order,
)

torch = pytest.importorskip("torch")
from torch.utils.data import DistributedSampler  # noqa: E402

SEEDS = [0, 1, 7, 42, 2**31 - 1, 2**32 - 1, 2**32, 2**32 + 7, 123456789123, 2**63 - 1,
         2**64 - 1, -1, -5, -2**63]


def torch_randperm(n, seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return torch.randperm(n, generator=g).tolist()


def test_randperm_is_torchs_randperm_on_cpu():
    """Every length 0-80 and some up to 100,000, over seeds that wrap, are negative or at the
    ends of what torch takes, and seed + epoch for epochs 0-2 (DistributedSampler's seed)."""
    checked = 0
    for n in [*range(81), 127, 128, 255, 256, 623, 624, 625, 1000, 4096, 4097, 65_537]:
        for seed in SEEDS:
            for epoch in range(3):
                if seed + epoch >= 2**64:
                    continue
                assert list(randperm(n, seed + epoch)) == torch_randperm(n, seed + epoch), \
                    (n, seed, epoch)
                checked += 1
    for seed in (0, 7, 2**32 + 3):
        assert list(randperm(100_000, seed)) == torch_randperm(100_000, seed)
    assert checked == 92 * (len(SEEDS) * 3 - 2)  # 2**64 - 1 + epoch 1, 2: refused


def test_randperm_refuses_what_torch_refuses_or_what_it_does_not_recreate():
    for seed in (2**64, -2**63 - 1):
        with pytest.raises(ValueError):
            torch.Generator().manual_seed(seed)
        with pytest.raises(ValueError, match="outside"):
            randperm(5, seed)
    with pytest.raises(ValueError, match="64-bit branch"):  # refused before any work
        randperm(RANDPERM_LIMIT, 0)
    assert RANDPERM_LIMIT == 214_748_364
    with pytest.raises(TypeError):
        randperm(5, True)


def test_the_brute_force_models_randperm_is_torchs_too():
    """tests/recovery/recovery_oracle.py writes the permutation out on its own (the property
    tests compare the core with it on re-created orders)."""
    from recovery_oracle import torch_randperm as model_randperm

    for n in (0, 1, 2, 17, 40, 700):
        for seed in (0, 3, 2**32 + 9):
            assert model_randperm(n, seed) == torch_randperm(n, seed)


def test_the_standard_librarys_generator_is_the_reference_mt19937():
    """The MT19937 words drawn through ``random.Random`` equal the reference algorithm written
    out (across several regenerations of the state), and the published check values."""
    for seed in (0, 1, 5489, 2**32 - 1):
        whole = list(_words_python(seed, 2_000, chunk=2_000))
        for chunk in (1, 7, 624, 2_000, 4_096):  # drawn in pieces, the stream is the same
            assert list(_words_stdlib(seed, 2_000, chunk)) == whole
            assert list(_words_python(seed, 2_000, chunk)) == whole
    assert _words_python(5489, 1)[0] == 3499211612


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 10, 21, 64, 101])
def test_distributed_indices_are_torchs_distributed_sampler(n):
    """Each rank's share, for world sizes 1-5 and 8, with and without shuffle and drop_last,
    padding that repeats the whole list more than once (n < world size) included."""
    for seed in (0, 7, -3, 2**40 + 1):
        for epoch in (0, 1, 4):
            for shuffle in (True, False):
                for drop_last in (True, False):
                    for world in (1, 2, 3, 4, 5, 8):
                        for rank in range(world):
                            s = DistributedSampler(range(n), num_replicas=world, rank=rank,
                                                   shuffle=shuffle, seed=seed,
                                                   drop_last=drop_last)
                            s.set_epoch(epoch)
                            assert distributed_indices(
                                n, seed=seed, epoch=epoch, shuffle=shuffle, drop_last=drop_last,
                                num_replicas=world, rank=rank) == list(s), \
                                (n, seed, epoch, shuffle, drop_last, world, rank)


def test_the_order_digest_is_the_sdks():
    from recoverydash.sdk.ledger import order_digest as sdk_digest

    for seed in (0, 7, -1, 2**63):
        for version in (None, "ds-v3", "unknown"):
            for shuffle in (True, False):
                kw = dict(seed=seed, epoch=3, dataset_length=1000, shuffle=shuffle,
                          dataset_version=version)
                assert order_digest(**kw) == sdk_digest(**kw)


def sampler_of(seed, length, shuffle=True, algorithm=SAMPLER_ALGORITHM):
    return {"algorithm": algorithm, "seed": seed, "shuffle": shuffle, "drop_last": False,
            "epoch_length": {"main": length}, "ledger": "observed"}


def test_an_order_is_recreated_only_when_the_declared_settings_name_it():
    """The attempt's sampler settings must hash to the order's name (with its dataset version,
    or none); anything else is not re-created."""
    digest = order_digest(seed=7, epoch=2, dataset_length=50, shuffle=True,
                          dataset_version="ds")
    unversioned = order_digest(seed=7, epoch=2, dataset_length=50, shuffle=True)
    a = AttemptRecord(0, dataset_version="ds", sampler=sampler_of(7, 50))
    assert recreated_order(digest, "main", 2, [a]) == RecreatedOrder(50, 7, 2, True)
    assert recreated_order(unversioned, "main", 2, [a]) == RecreatedOrder(50, 7, 2, True)
    assert recreated_order(digest, "main", 1, [a]) is None           # another epoch
    assert recreated_order(digest, "other", 2, [a]) is None          # no length of the stratum
    assert recreated_order(None, "main", 2, [a]) is None
    for bad in (sampler_of(8, 50), sampler_of(7, 51), sampler_of(7, 50, shuffle=False),
                sampler_of(7, 50, algorithm="torch.utils.data.RandomSampler"),
                {**sampler_of(7, 50), "seed": "7"}, {**sampler_of(7, 50), "epoch_length": 50},
                {}):
        assert recreated_order(digest, "main", 2, [AttemptRecord(0, dataset_version="ds",
                                                                 sampler=bad)]) is None
    assert recreated_order(digest, "main", 2, [AttemptRecord(0, sampler=sampler_of(8, 50)), a]) \
        == RecreatedOrder(50, 7, 2, True)


def test_a_recreated_order_names_the_samples_of_its_positions_and_of_a_cursor():
    order = RecreatedOrder(30, 7, 1, True)
    perm = torch_randperm(30, 8)
    assert order.identities(BitMap64([0, 5, 29])) == BitMap64([perm[0], perm[5], perm[29]])
    assert order.identities(BitMap64([20]), prefix=3) == BitMap64(perm[:3] + [perm[20]])
    assert order.identities(BitMap64([30])) is None            # not a position of the list
    assert order.identities(BitMap64(), prefix=31) is None
    assert RecreatedOrder(30, 7, 1, False).identities(BitMap64([4]), 2) == BitMap64([0, 1, 4])


def test_memoized_permutations_hold_at_most_the_cache_bound(monkeypatch):
    monkeypatch.setattr(samplers, "CACHE_ELEMENTS", 10)
    samplers.clear_cache()
    first = randperm(6, 1)
    assert randperm(6, 1) is first and randperm(6, 2**32 + 1) is first  # one MT19937 seed
    second = randperm(6, 2)                                              # 12 > 10: first goes
    assert randperm(6, 2) is second and randperm(6, 1) is not first
    assert list(randperm(6, 1)) == list(first) and randperm(11, 0) is not randperm(11, 0)
    samplers.clear_cache()


def test_an_epoch_longer_than_the_limit_is_not_recreated():
    """Its samples stay unknown (no permutation of 16,777,217 is made); unshuffled, the index
    is the position at any length."""
    assert RECREATED_LENGTH_LIMIT == 2**24
    assert RecreatedOrder(2**24 + 1, 7, 0, True).identities(BitMap64([0, 5])) is None
    assert RecreatedOrder(2**40, 7, 0, False).identities(BitMap64([2**39]), 2) == \
        BitMap64([0, 1, 2**39])


# --- restarts compared by re-created identities, truth from torch's samplers ------------------

COMPONENTS = ["model", "optimizer", "scheduler", "rng", "data_progress"]


def generation(gid, attempt, update, position, when, world_size):
    objects = [{"uri": f"file:///c/{gid}/{c}", "shard": "rank0", "component": c, "size": 1,
                "sha256": f"{i + 1:064x}"} for i, c in enumerate(COMPONENTS)]
    manifest = {"schema_revision": 1, "generation_id": gid, "update": update,
                "world_size": world_size, "required_shards": ["rank0"],
                "components": COMPONENTS, "objects": objects,
                "data_progress": {"cursor": [{"stratum": "main", "epoch": 0,
                                              "position": position}]},
                "dataset_version": "ds", "committed_at": None}
    return GenerationRecord(gid, attempt, update, started_at=when - 0.5,
                            required_shards=["rank0"], components=COMPONENTS,
                            manifests=[manifest], committed_at=when,
                            object_checks={o["uri"]: "ok" for o in objects})


class Attempt:
    """One launch of a DDP trainer over torch's ``DistributedSampler``: ``world`` ranks, each
    feeding ``micro`` samples per update (one microbatch per update), recorded as the SDK's
    observed recorder reports them: per rank one strided range under the order's digest, no
    ``indices``, positions past the dataset length in a ``padding`` span. ``fed`` keeps the
    truth: ``(update, epoch, dataset index, padding)`` of every sample the model received."""

    def __init__(self, number, world, seed, n, micro, declared=True):
        self.number, self.world, self.seed, self.n, self.micro = number, world, seed, n, micro
        self.records: list = []
        self.fed: list = []
        self.sampler = sampler_of(seed, n) if declared else {"epoch_length": {"main": n}}

    def run(self, epoch, first_update, updates=None, skip_to=0, t=0.0):
        """Updates of ``epoch`` from position ``skip_to`` (each rank skips the draws below it,
        as ``PositionSampler.resume_at``), ``updates`` of them or to the end of the epoch;
        returns the last update."""
        shares, skips = [], []
        for rank in range(self.world):
            s = DistributedSampler(range(self.n), num_replicas=self.world, rank=rank,
                                   shuffle=True, seed=self.seed)
            s.set_epoch(epoch)
            skip = max(0, -(-(skip_to - rank) // self.world))
            shares.append(list(s)[skip:])
            skips.append(skip)
        u = first_update - 1
        order = order_digest(seed=self.seed, epoch=epoch, dataset_length=self.n, shuffle=True,
                             dataset_version="ds")
        k = 0
        while any(k < len(share) for share in shares) and (updates is None
                                                          or u < first_update - 1 + updates):
            u += 1
            for rank, share in enumerate(shares):
                took = share[k:k + self.micro]
                if not took:
                    continue
                positions = [rank + self.world * (skips[rank] + k + j)
                             for j in range(len(took))]
                real = [p for p in positions if p < self.n]
                spans = [{"stratum": "main", "epoch": epoch, "order": order,
                          "ranges": [[real[0], real[-1] + 1, self.world]]}] if real else []
                if len(real) < len(positions):
                    spans.append({"stratum": "main", "epoch": epoch, "order": order,
                                  "padding": True, "ranges": [[p, p + 1] for p in positions
                                                              if p >= self.n]})
                self.records.append(LedgerRecord(self.number, u, rank, t + u, spans))
                self.fed += [(u, epoch, i, p >= self.n) for p, i in zip(positions, took,
                                                                       strict=True)]
            k += self.micro
        return u

    def record(self, **kw):
        return AttemptRecord(self.number, started_at=kw.pop("started_at"), world_size=self.world,
                             dataset_version="ds", micro_batch_size=self.micro,
                             grad_accum_steps=1, sampler=self.sampler, **kw)


def truth(fed_before_save, fed_after, n):
    """From the samples torch's samplers fed in epoch 0 on k's lineage: (replayed, omitted) =
    (extra feeds of a sample, padding aside; dataset indices never fed)."""
    feeds = Counter(i for _u, e, i, pad in fed_before_save + fed_after if e == 0 and not pad)
    return sum(c - 1 for c in feeds.values()), n - len(feeds)


def restart_run(n, seed0, seed1, world0=2, world1=1, micro=3, saved_at=4, crash_after=5,
                resume_at=None, declared=True):
    """Attempt 0: ``world0`` ranks, seed ``seed0``, epoch 0, saves at update ``saved_at`` and
    crashes after ``crash_after``. Attempt 1: a fresh ``DistributedSampler(num_replicas=world1,
    seed=seed1)`` resumed at position ``resume_at`` (default: the saved cursor) of epoch 0, run
    to the end of the epoch, then one update of epoch 1. Returns (RunInput, truth)."""
    a0 = Attempt(0, world0, seed0, n, micro, declared)
    a0.run(0, 1, updates=crash_after)
    cursor = saved_at * micro * world0
    a1 = Attempt(1, world1, seed1, n, micro, declared)
    last = a1.run(0, saved_at + 1, skip_to=cursor if resume_at is None else resume_at, t=100)
    a1.run(1, last + 1, updates=1, t=100)
    attempts = [a0.record(started_at=0.0, ended_at=50.0, end_reason="failed",
                          end_update=crash_after),
                a1.record(started_at=60.0, resumed_from={"generation_id": "g",
                                                         "update": saved_at})]
    run = RunInput("recreated", attempts, a0.records + a1.records, [],
                   [generation("g", 0, saved_at, cursor, saved_at + 0.5, world0)],
                   first_event_at=0.0)
    kept = [f for f in a0.fed if f[0] <= saved_at]
    return run, truth(kept, a1.fed, n)


def outcome(run):
    analysis = analyze(run, now=1000.0)
    (restart,) = analysis.restarts
    (stratum,) = analysis.strata
    return restart, stratum


def test_ddp_on_two_ranks_resumed_on_one_under_another_seed_is_compared_by_sample():
    """Issue 25 item 1: seed 7 on 2 ranks saves after 24 samples (update 4 of 6 samples) of an
    epoch of 51 and crashes; a fresh DistributedSampler(num_replicas=1, seed=8) resumes at
    position 24 of its own order and feeds it to the end. The digests differ, no report named
    its samples, and the server re-creates both permutations: replayed and omitted are the
    samples torch's samplers fed twice and never, on the restart and in the strata."""
    run, (replays, omissions) = restart_run(51, 7, 8)
    assert (replays, omissions) == (13, 13)
    restart, stratum = outcome(run)
    assert (restart.replayed, restart.omitted, restart.verdict) == \
        (13, 13, "replay_and_omission")
    assert [f.code for f in restart.findings] == ["replay", "omission", "world_size_changed",
                                                  "global_batch_changed", "order_changed"]
    assert (stratum.duplicates, stratum.omissions) == (13, 13)


def test_ddp_resumed_on_one_rank_with_the_same_seed_at_the_cursor_is_exact():
    """The same seed on 1 rank names the same order (world size is not part of it): positions
    compare directly and the restart is exact, as torch's samplers say."""
    run, (replays, omissions) = restart_run(51, 7, 7)
    assert (replays, omissions) == (0, 0)
    restart, stratum = outcome(run)
    assert (restart.replayed, restart.omitted, restart.verdict) == (0, 0, "exact")
    assert (stratum.duplicates, stratum.omissions) == (0, 0)


def test_lightning_ddp_resumed_on_one_process_under_another_seed_from_the_epoch_start():
    """Lightning restarts the epoch of a map-style loader: the new order (seed 3) from position
    0, so every sample trained before the save is fed again and none is omitted."""
    run, (replays, omissions) = restart_run(40, 7, 3, resume_at=0)
    assert (replays, omissions) == (24, 0)
    restart, stratum = outcome(run)
    assert (restart.replayed, restart.omitted, restart.verdict) == (24, 0, "replay")
    assert (stratum.duplicates, stratum.omissions) == (24, 0)


@pytest.mark.parametrize("seeds", [(0, 1), (7, 2**32 + 7 + 1), (5, 99), (-4, 11)])
@pytest.mark.parametrize("n,world0,world1,micro", [(37, 2, 1, 2), (64, 4, 2, 3), (29, 3, 4, 1)])
def test_restarts_under_another_order_equal_what_torchs_samplers_fed(seeds, n, world0, world1,
                                                                     micro):
    """Other shapes: world sizes up and down, padded epochs, seeds that differ by 2**32 + 1
    (one apart for MT19937), negative seeds. Truth from torch's samplers, the restart and the
    strata agree with it."""
    run, (replays, omissions) = restart_run(n, *seeds, world0=world0, world1=world1,
                                            micro=micro, saved_at=3, crash_after=4)
    restart, stratum = outcome(run)
    assert (restart.replayed, restart.omitted) == (replays, omissions)
    assert (stratum.duplicates, stratum.omissions) == (replays, omissions)
    assert "samples_unknown" not in [f.code for f in restart.findings]


def test_an_order_the_attempts_do_not_declare_stays_unverified_with_the_words():
    """The same run with samplers that do not declare algorithm and seed: the orders are not
    re-created, the samples unknown, the restart unverified, never exact."""
    run, _truth = restart_run(51, 7, 8, declared=False)
    restart, _stratum = outcome(run)
    assert (restart.replayed, restart.omitted, restart.verdict) == (0, 0, "unverified")
    assert [(f.code, f.detail) for f in restart.findings][-1] == (
        "samples_unknown", "order changed and sample ids were not recorded: replay and "
        "omission unknown (main epoch 0)")
