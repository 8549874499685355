"""Mosaic Streaming's ``StreamingDataset`` with the observed ledger: positions in the stream's
global sample space, one stratum per stream of a mixture. Its lines (five in the
complete loop ``examples/streaming_train.py``, marked ``# recoverydash``:
docs/integrations/streaming.md)::

    dataset = observe_streaming(StreamingDataset(streams=..., batch_size=b, ...))
    loader = StreamingDataLoader(dataset, batch_size=b, collate_fn=ObservedCollate())
    ... batch = rec.observe(batch) before the model, rec.commit(update) after optimizer.step() ...

Positions. Streaming lays out each epoch's samples in one global order that does not depend on
the number of ranks or workers (its elastic determinism): the resampled sample space of the
mixture (``resample_streams``: each stream's proportion, repeat or choose of the epoch), divided
over ``num_canonical_nodes`` and read across them (``get_partitions``), then shuffled
(``get_shuffle``). ``state_dict(num_samples)`` saves how many samples of that order were
consumed (``sample_in_epoch``), and a resumed run, on any number of ranks, drops exactly those
before partitioning the rest. The position of a sample is its place in that order, counted per
stream: stream ``s``'s ``k``-th sample of the epoch is position ``k`` of stratum ``s`` (its
``epoch_length`` is the stream's share of the epoch), so positions are global, a 4 -> 3 -> 6
rank elastic restart is compared position by position, and a restore that starts the epoch over
is a replay of exactly the positions fed again. Each span also carries the samples' identities
(``indices``: the sample's index within its stream), by which the server compares two orders
(another seed, canonical node count or mixture).

How: each worker's partition is computed by Streaming itself (``_get_work``); the observer
computes, with the same Streaming functions and the same arguments, which position of the global
order each entry of that partition is, and tags every sample it yields. The samples a worker
yields are its partition in order (``-1`` entries skipped), so the tag is what was delivered.
Where ``epoch_size`` is not a multiple of ``num_canonical_nodes``, Streaming repeats a few
samples to even out its rows: a repeat is sent as ``padding`` (never counted). Supported
batching: ``random`` (Streaming's default); another ``batching_method`` is iterated unchanged and
logged (nothing recorded). Cost: a few arrays of ``epoch_size`` integers per worker and epoch,
as Streaming's own partition.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from recoverydash.sdk.observe import Draw, Iteration, Tagged

log = logging.getLogger("recoverydash.integrations")


def streaming_base() -> Any:
    """Mosaic Streaming's ``streaming.base`` (``StreamingDataset``, ``Stream``, ``MDSWriter``,
    ``StreamingDataLoader``). ``import streaming`` also imports its vision and text helpers, which
    need torchvision; where torchvision cannot be imported (a CPU-only torch from PyPI's index
    has no matching torchvision build) the package is registered without running its
    ``__init__`` and ``streaming.base`` is imported alone. Raises ImportError without
    mosaicml-streaming."""
    import importlib
    import importlib.util
    import sys
    import types

    try:
        return importlib.import_module("streaming.base")
    except ImportError as e:
        spec = importlib.util.find_spec("streaming")
        if spec is None or not spec.submodule_search_locations:
            raise
        log.info("recoverydash: importing streaming.base without streaming's __init__ (%r)", e)
        for name in [m for m in sys.modules if m == "streaming" or m.startswith("streaming.")]:
            del sys.modules[name]
        package = types.ModuleType("streaming")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["streaming"] = package
        return importlib.import_module("streaming.base")


class _EpochOrder:
    """One epoch's global order: for every position of the canonical order (its index ``g``),
    the stream, the position within the stream, whether it is a repeat (padding), and the
    sample's index within its stream; the stream digests and lengths."""

    def __init__(self, ds: Any, epoch: int):
        import numpy as np

        streaming_base()
        from streaming.base.partition import get_partitions
        from streaming.base.shuffle import get_shuffle

        n = int(ds.epoch_size)
        units, small_per_big = ds.resample_streams(epoch)
        order = get_partitions(ds.partition_algo, n, ds.num_canonical_nodes, 1, 1, 1, 1, 0,
                               None).reshape(-1)
        order = order[order >= 0]
        shuffled = order
        if ds.shuffle:
            shuffle = get_shuffle(ds.shuffle_algo, units, ds.num_canonical_nodes,
                                  ds.shuffle_seed, epoch, ds.shuffle_block_size)
            shuffled = shuffle[order]
        small = small_per_big[shuffled]
        offsets = np.asarray(ds.sample_offset_per_stream, dtype=np.int64)
        stream = np.searchsorted(offsets, small, side="right") - 1
        # the big ids Streaming repeats to even out short rows: later occurrences are padding
        uniq, first = np.unique(order, return_index=True)
        padding = np.ones(len(order), dtype=bool)
        padding[first] = False
        self.big_first = np.full(n + 1, -1, dtype=np.int64)
        self.big_first[uniq] = first
        self.repeated = np.zeros(n + 1, dtype=bool)
        counts = np.bincount(order, minlength=n + 1)
        self.repeated[:] = counts > 1
        self.order = order
        self.padding = padding
        self.stream = stream
        self.index = small - offsets[stream]
        within = np.zeros(len(order), dtype=np.int64)
        self.lengths: list[int] = []
        self.digests: list[str] = []
        for s in range(len(offsets)):
            real = (stream == s) & ~padding
            within[real] = np.arange(int(real.sum()), dtype=np.int64)
            self.lengths.append(int(real.sum()))
            doc = np.ascontiguousarray(self.index[real], dtype=np.int64).tobytes()
            self.digests.append(hashlib.sha256(b"%d:" % epoch + doc).hexdigest()[:32])
        # a repeat takes the position of the sample it repeats, marked padding
        rep = np.nonzero(padding)[0]
        if len(rep):
            within[rep] = within[first[np.searchsorted(uniq, order[rep])]]
        self.within = within

    def rows(self, ds: Any, sample_in_epoch: int, world: Any, worker: Any) -> Any:
        """The canonical positions of ``worker``'s partition entries after ``sample_in_epoch``
        (-1 where Streaming pads the partition), in the order the worker reads them."""
        import numpy as np
        from streaming.base.partition import get_partitions

        full = get_partitions(ds.partition_algo, int(ds.epoch_size), ds.num_canonical_nodes,
                              world.num_nodes, world.ranks_per_node, world.workers_per_rank,
                              ds.batch_size, sample_in_epoch, ds.initial_physical_nodes)
        live = full >= 0
        pos = np.where(live, self.big_first[np.where(live, full, len(self.big_first) - 1)], -1)
        twice = live & self.repeated[np.where(live, full, len(self.repeated) - 1)]
        if twice.any():  # a repeated sample: its occurrences take its positions in read order
            where = np.argwhere(twice)
            keys = np.lexsort((where[:, 4], where[:, 2], where[:, 1], where[:, 0], where[:, 3]))
            taken: dict = {}
            for w in where[keys]:
                big = int(full[tuple(w)])
                if big not in taken:
                    places = np.nonzero(self.order == big)[0]
                    taken[big] = [int(p) for p in places if p >= sample_in_epoch]
                left = taken[big]
                pos[tuple(w)] = left.pop(0) if left else -1
        return pos[worker.node, worker.rank_of_node, worker.worker_of_rank].reshape(-1)


class _Observer:
    """What :func:`observe_streaming` puts on a dataset: the strata names, and per iteration (in
    each worker process) the partition being read and how far."""

    def __init__(self, names: list[str]):
        self.names = names
        self.seen: dict = {}

    def __getstate__(self) -> dict:
        return {"names": self.names, "seen": {}}

    def start(self, ds: Any, epoch: int, sample_in_epoch: int, ids: Any) -> None:
        self.seen = {}
        if ds.batching_method != "random":
            log.warning("recoverydash: Streaming batching_method %r is not supported: positions "
                        "are not recorded", ds.batching_method)
            return
        try:
            order = _EpochOrder(ds, epoch)
            world = ds._parallel_worker_world  # what Streaming partitioned for
            self.seen = {"epoch": epoch, "order": order, "ids": ids, "next": 0,
                         "positions": order.rows(ds, sample_in_epoch, world, world), "its": {}}
        except Exception as e:  # noqa: BLE001 - observing never stops the epoch
            log.warning("recoverydash: Streaming's order could not be computed: %r", e)

    def tag(self, ds: Any, sample: Any) -> Any:
        seen = self.seen
        if not seen:
            return sample
        ids, j = seen["ids"], seen["next"]
        while j < len(ids) and ids[j] == -1:  # Streaming skips them (_each_sample_id)
            j += 1
        g = int(seen["positions"][j]) if j < len(ids) else -1
        seen["next"] = j + 1
        order: _EpochOrder = seen["order"]
        s = int(order.stream[g]) if g >= 0 else 0
        # g < 0: a repeat Streaming added to fill its partition: padding, never counted
        padding = bool(order.padding[g]) if g >= 0 else True
        key = (s, padding)
        it = seen["its"].get(key)
        if it is None:
            it = seen["its"][key] = Iteration(
                self.names[s], seen["epoch"], order.digests[s], length=order.lengths[s],
                padding_from=0 if padding else None,
                info={"algorithm": "streaming.StreamingDataset", "units": "samples",
                      "shuffle": bool(ds.shuffle), "seed": int(ds.shuffle_seed)})
        if g < 0:
            return Tagged(sample, Draw(-1, 0, it))
        return Tagged(sample, Draw(int(order.index[g]), int(order.within[g]), it))


class _GetWork:
    """The dataset's ``_get_work``, then the observer told which partition is read."""

    def __init__(self, ds: Any, observer: _Observer):
        self.ds, self.observer = ds, observer

    def __call__(self, epoch: int, sample_in_epoch: int) -> Any:
        ids = type(self.ds)._get_work(self.ds, epoch, sample_in_epoch)
        self.observer.start(self.ds, epoch, sample_in_epoch, ids)
        return ids


class _GetItem:
    """The dataset's ``__getitem__`` as its iteration calls it (``map(self.__getitem__, ...)``,
    in partition order), with the sample's position attached."""

    def __init__(self, ds: Any, observer: _Observer):
        self.ds, self.observer = ds, observer

    def __call__(self, sample_id: int) -> Any:
        return self.observer.tag(self.ds, type(self.ds).__getitem__(self.ds, sample_id))


def observe_streaming(dataset: Any, *, names: list[str] | None = None) -> Any:
    """Make a ``StreamingDataset`` carry its samples' global positions (module doc), in place,
    before its first iteration: it stays a ``StreamingDataset`` (``StreamingDataLoader``,
    ``state_dict`` and ``load_state_dict`` are Streaming's, unchanged), and every sample its
    iteration yields is a ``Tagged`` sample for :class:`~recoverydash.sdk.observe.ObservedCollate`.
    names: the stratum of each stream (default: the basename of its ``local`` folder, made
    unique). Returns the dataset. Raises ValueError when ``names`` does not name every stream.
    Indexing the dataset by hand while it iterates would shift the tags (the iteration's own
    calls are counted)."""
    names = list(names) if names else _names(dataset)
    if len(names) != len(dataset.streams):
        raise ValueError(f"{len(dataset.streams)} streams, {len(names)} names")
    observer = _Observer(names)
    dataset._get_work = _GetWork(dataset, observer)
    dataset.__getitem__ = _GetItem(dataset, observer)  # the iteration's map(self.__getitem__)
    dataset.recoverydash_strata = names
    return dataset


def streaming_cursor(dataset: Any, state: dict) -> list[dict]:
    """The ledger cursor of a Streaming resumption state (``StreamingDataLoader.state_dict()`` or
    ``dataset.state_dict(num_samples, from_beginning)``: ``epoch`` and ``sample_in_epoch``): per
    stream, its positions among the first ``sample_in_epoch`` samples of that epoch's global
    order, ``[{"stratum", "epoch", "position"}]``; the data progress of a checkpoint that holds
    this state. Raises KeyError for a state without ``epoch`` / ``sample_in_epoch``."""
    epoch = int(state["epoch"])
    n = int(state["sample_in_epoch"])
    order = _EpochOrder(dataset, epoch)
    n = max(0, min(n, len(order.order)))
    names = getattr(dataset, "recoverydash_strata", None) or _names(dataset)
    out = []
    for s, name in enumerate(names):
        real = (order.stream[:n] == s) & ~order.padding[:n]
        out.append({"stratum": name, "epoch": epoch, "position": int(real.sum())})
    return out


def _names(dataset: Any) -> list[str]:
    import os

    out: list[str] = []
    for i, st in enumerate(dataset.streams):
        base = os.path.basename(str(getattr(st, "local", "") or "").rstrip("/")) or f"stream{i}"
        name, n = base, 1
        while name in out:
            n += 1
            name = f"{base}-{n}"
        out.append(name)
    return out


__all__ = ["observe_streaming", "streaming_base", "streaming_cursor"]
