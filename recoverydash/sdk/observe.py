"""The observed data ledger: the positions of the samples that reached the model, committed at the
optimizer boundary. Positions are carried by the samples, never computed from a count.

How a position travels (every piece is a plain object, so it survives DataLoader worker
processes, prefetch, persistent workers, ``pin_memory``, device moves and StatefulDataLoader
save/restore)::

    batch sampler ──DrawBatch(indices, first position)──▶ ObservedDataset.__getitems__ (worker)
    ──TaggedList(samples, tag)──▶ ObservedCollate (worker) ──batch + BatchTag──▶ main process
    ──observe(batch) / forward hook──▶ pending microbatches ──commit(update)──▶ update_committed

(around a sampler that draws one index at a time, each index is a ``Draw(index, position)`` and
each sample a ``Tagged(sample, draw)``; the ``observed_loader`` builders of
``recoverydash.integrations`` draw whole batches, so no object is made per sample).

* :class:`PositionSampler` wraps the sampler that defines the order (``DistributedSampler``,
  ``RandomSampler``, ``SequentialSampler``, torchdata's samplers, a custom sampler, or a batch
  sampler). The k-th index it draws in an epoch is position ``k`` of that epoch's order (for a
  ``DistributedSampler``, or any sampler given ``rank=``/``world_size=``, rank ``r`` of ``W``
  draws positions ``r + k*W`` of the global padded order,
  docs/ingest-v1.md#3-positions-spans-and-cursors). Anything that skips on top of it (torchdata
  fast-forward, a framework's skip-on-resume, ``resume_at``) skips *draws*: the skipped samples
  are never fetched nor trained, so they never appear in the ledger.
* :class:`ObservedDataset` wraps a map-style dataset: ``dataset[draw]`` returns the sample with its
  draw attached. Indexed with a plain index (a sampler that is not a PositionSampler, e.g. one a
  framework built), the index itself is reported as the sample's *identity* (an ``ids`` span):
  identities are exact, but omissions inside an epoch can then only be counted by the server's
  id-strata rules.
* :class:`ObservedIterableDataset` wraps an iterable dataset whose samples know their own
  ``(partition, offset)``, offset or id (``key=`` returns it): the partition is the stratum.
* :class:`ObservedCollate` wraps the collate function: it collates the bare samples with yours and
  attaches one :class:`BatchTag` (positions, dataset indices, epoch, order) to the batch: under the
  key :data:`BATCH_KEY` of a mapping batch, as the last element of a list/tuple batch, or as
  ``[batch, tag]`` around any other batch.

Contract of :class:`ObservedRecorder` (what integrations build on; every method never raises):

``observe(batch) -> batch``
    Strips the tag and records its positions as one microbatch of the update in progress, then
    returns the batch as the model must see it. Call it where the batch reaches the model (the
    line before ``model(...)``). A batch that carries no tag is returned unchanged and counted
    in ``counters()["unobserved_batches"]`` (logged once): it is never guessed.
``attach(model)``
    The same, as a forward pre-hook with kwargs on ``model`` (``model(**batch)`` with the tag
    under :data:`BATCH_KEY`, or a tagged batch as a positional argument). The tag is removed
    before ``forward`` runs. Forwards without grad (evaluation) strip the tag and record nothing;
    the same batch fed twice within one update is recorded once (an update's ledger is a set).
``record(tag)``, ``strip(batch)``
    The two halves of ``observe`` for code that finds the batch elsewhere (a framework callback).
``commit(update=None) -> bool``
    At the optimizer boundary (after ``optimizer.step()``, scheduler and scaler): sends
    ``update_committed`` with every position recorded since the previous commit (``update``
    default: previous + 1). ``attach_optimizer(optimizer)`` calls it from an optimizer step
    post-hook. ``discard()`` drops the pending microbatches of an update that will not commit
    (a skipped step). Microbatches never committed (a crash) are never reported as consumed.
``start(resumed_from=..., **fields)``
    ``attempt_started``, sent when the first tagged batch is observed (at the latest after
    ``start_timeout`` seconds, or at ``end``/``heartbeat``): its ``resumed_from.cursor`` is then
    what the loader actually delivered first, not what it was asked to do, and ``sampler`` holds
    the order's settings with ``"ledger": "observed"``.
``heartbeat()``, ``end(reason)``
    Carry the read cursor: per tracked sampler, the position after the last index it drew
    (handed to the loader's workers, trained or not), so prefetched work counts as recomputed
    after a restart, never as omitted.
``state_dict()`` / ``load_state_dict(state)``
    The data progress of a checkpoint: the committed cursor per stratum (this rank's frontier),
    the last update, and the state of every loader given to ``track(loader)`` (a torchdata
    ``StatefulDataLoader``): restoring is one call. Samplers without a loader state resume at the
    cursor (``PositionSampler.resume_at``).

Spans: per ``(stratum, epoch, order)`` the positions of an update are sorted and compressed into
ranges with a constant step (a DistributedSampler microbatch is one strided range), so arbitrary
orders stay exact; positions ``>=`` the dataset length of a padded ``DistributedSampler`` epoch go
to a ``padding`` span. Nothing is clipped: an overrun (a position past the epoch), a gap or a
repeat across updates is sent as observed. A position repeated inside one update of one rank
cannot be expressed by spans (the server unites them); it is counted in the event's
``repeated`` field and logged. ``ids_digest`` is the sha256 (32 hex chars) of the JSON list of
the dataset indices (or ids) in the order they reached the model. A span under a named order
also carries ``indices``, the set of dataset indices its positions held (compressed like the
ranges: runs of three or more as ranges, the rest as integers), so that the server compares
samples by identity when a restart changes the order (another seed, world size or sampler); a
DistributedSampler's order is left without them, as the server re-creates its permutation from
the order's seed, epoch and dataset length (docs/ingest-v1.md#3-positions-spans-and-cursors).

Cost on the training thread: a few objects per batch (the draw, the tag) and a list append per
microbatch, about 0.4 us per sample recorded in all with a loader without worker processes; the
spans are built on the sender thread (``bench/sdk_overhead.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from recoverydash.sdk import faults
from recoverydash.sdk.client import Client
from recoverydash.sdk.ledger import (
    SAMPLER_ALGORITHM,
    Reporter,
    order_digest,
    padded_length,
    resume_skip,
)
from recoverydash.sdk.tokens import TokenRanges, identities_of_all, merge

log = logging.getLogger("recoverydash.sdk")

BATCH_KEY = "recoverydash_positions"
"""Key of a mapping batch under which :class:`ObservedCollate` puts the batch's :class:`BatchTag`
(stripped again before the model runs)."""

LEDGER_MODE = "observed"


# --- what travels with the samples ---------------------------------------------------------------

class Iteration:
    """One pass of a :class:`PositionSampler` over one epoch's order (immutable, pickled once per
    batch of draws).

    stratum, epoch, order: the span key (epoch None: the recorder's epoch). ids: the draws'
    indices are sample identities (an ``ids`` span), not positions. rank, world_size: positions are
    ``rank + k*world_size``.
    length: samples of the epoch's order (``epoch_length``: the dataset length for a
    DistributedSampler). padding_from: positions at or past it are DistributedSampler padding
    (None: no padding). info: the sampler's settings for ``attempt_started.sampler``."""

    __slots__ = ("epoch", "ids", "info", "length", "order", "padding_from", "rank", "stratum",
                 "world_size")

    def __init__(self, stratum: str, epoch: int | None, order: str | None, rank: int = 0,
                 world_size: int = 1, length: int | None = None,
                 padding_from: int | None = None, info: dict | None = None, ids: bool = False):
        self.stratum = stratum
        self.ids = ids
        self.epoch = epoch
        self.order = order
        self.rank = rank
        self.world_size = world_size
        self.length = length
        self.padding_from = padding_from
        self.info = info or {}

    def __reduce__(self):
        return (Iteration, (self.stratum, self.epoch, self.order, self.rank, self.world_size,
                            self.length, self.padding_from, self.info, self.ids))

    def __repr__(self):
        return (f"Iteration({self.stratum!r}, epoch={self.epoch}, order={self.order!r}, "
                f"rank={self.rank}/{self.world_size})")


class Draw:
    """One index drawn by a :class:`PositionSampler`: the dataset ``index`` to fetch and the
    ``position`` it holds in ``iteration``'s order. What a dataset wrapped by
    :class:`ObservedDataset` receives instead of a bare index."""

    __slots__ = ("index", "iteration", "position")

    def __init__(self, index: Any, position: int, iteration: Iteration):
        self.index = index
        self.position = position
        self.iteration = iteration

    def __reduce__(self):
        return (Draw, (self.index, self.position, self.iteration))

    def __repr__(self):
        return f"Draw(index={self.index!r}, position={self.position})"


class Tagged:
    """A sample and the draw it came from (inside a worker, between dataset and collate)."""

    __slots__ = ("draw", "sample")

    def __init__(self, sample: Any, draw: Any):
        self.sample = sample
        self.draw = draw

    def __reduce__(self):
        return (Tagged, (self.sample, self.draw))


class DrawBatch(list):
    """The indices of one batch drawn by a :class:`PositionSampler` around a batch sampler: a
    plain list of dataset indices (what the fetcher hands to ``__getitems__``) that also knows the
    position of its first draw (``start``) in ``iteration``'s order; draw ``j`` of the batch holds
    position ``start + j * world_size``. No object per sample: the batch carries its positions
    as a range."""

    __slots__ = ("iteration", "start")
    iteration: Iteration
    start: int

    def __reduce__(self):
        return (_rebuild_draw_batch, (list(self), self.iteration, self.start))

    def positions(self) -> range:
        w = self.iteration.world_size
        return range(self.start, self.start + len(self) * w, w)


def _rebuild_draw_batch(items, iteration, start):
    b = DrawBatch(items)
    b.iteration = iteration
    b.start = start
    return b


class TaggedList(list):
    """The samples of one DrawBatch as ``ObservedDataset.__getitems__`` returns them, with the
    batch's :class:`BatchTag` (inside a worker, between dataset and collate)."""

    __slots__ = ("tag",)
    tag: BatchTag

    def __reduce__(self):
        return (_rebuild_tagged_list, (list(self), self.tag))


def _rebuild_tagged_list(items, tag):
    t = TaggedList(items)
    t.tag = tag
    return t


class BatchTag:
    """The positions of one batch, attached to it by :class:`ObservedCollate`.

    ``groups``: ``[(iteration, positions, ids)]``, one per iteration the batch's draws came from
    (one in practice). ``iteration`` None means the samples had no position: ``ids`` are their
    identities (the dataset indices or the iterable's ids). ``ids`` always lists, in batch order,
    what identifies each sample (the dataset index for a positioned draw). ``wrapped``: the tag
    was put around a batch that is neither a mapping nor a list/tuple (``[batch, tag]``)."""

    __slots__ = ("groups", "recorded", "wrapped")

    def __init__(self, groups: list, wrapped: bool = False):
        self.groups = groups
        self.wrapped = wrapped
        self.recorded: bool | list[BatchTag] = False  # the update's list it was recorded in

    def __reduce__(self):
        return (_rebuild_tag, (self.groups, self.wrapped))

    def __len__(self) -> int:
        return sum(len(ids) for _, _, ids in self.groups)

    def __repr__(self):
        return f"BatchTag({len(self)} samples)"

    @classmethod
    def of(cls, draws: list) -> BatchTag:
        """The tag of a batch whose samples came from ``draws`` (Draws, or bare indices/ids)."""
        first = draws[0] if draws else None
        it: Iteration | None
        if type(first) is Draw:
            it = first.iteration
            if all(type(d) is Draw and d.iteration is it for d in draws):
                return cls([(it, [d.position for d in draws], [d.index for d in draws])])
        groups: list = []
        for d in draws:
            it = d.iteration if type(d) is Draw else None
            if not groups or groups[-1][0] is not it:
                groups.append((it, [], []))
            if it is not None:
                groups[-1][1].append(d.position)
                groups[-1][2].append(d.index)
            else:
                groups[-1][2].append(d)
        return cls(groups)


def _rebuild_tag(groups, wrapped):
    return BatchTag(groups, wrapped)


def attach_tag(batch: Any, tag: BatchTag) -> Any:
    """``batch`` carrying ``tag``: a mapping gets :data:`BATCH_KEY` (a dict is copied only when it
    cannot be assigned to), a list/tuple gets the tag appended, anything else becomes
    ``[batch, tag]``."""
    t = type(batch)
    if t is list:
        batch.append(tag)
        return batch
    if t is tuple:
        return (*batch, tag)
    if t is dict:
        batch[BATCH_KEY] = tag
        return batch
    if isinstance(batch, Mapping):
        try:
            batch[BATCH_KEY] = tag  # type: ignore[index]
            return batch
        except TypeError:
            return {**batch, BATCH_KEY: tag}
    if isinstance(batch, list):
        batch.append(tag)
        return batch
    if isinstance(batch, tuple) and not hasattr(batch, "_fields"):
        return (*batch, tag)
    tag.wrapped = True
    return [batch, tag]


def strip(batch: Any) -> tuple[Any, BatchTag | None]:
    """``(batch without its tag, tag)``; ``(batch, None)`` when it carries none. A mapping is
    copied without :data:`BATCH_KEY` (the caller's object is left as it is); a list/tuple loses
    its last element (``pin_memory`` turns a tuple into a list: the list is what comes back)."""
    t = type(batch)
    if t is list or t is tuple:  # the common case, without the ABC checks below
        if batch and type(batch[-1]) is BatchTag:
            tag = batch[-1]
            return (batch[0] if tag.wrapped and len(batch) == 2 else batch[:-1]), tag
        return batch, None
    if t is dict:
        tag = batch.get(BATCH_KEY)
        if tag is None:
            return batch, None
        clean = dict(batch)
        del clean[BATCH_KEY]
        return clean, tag if type(tag) is BatchTag else None
    if isinstance(batch, Mapping):
        if BATCH_KEY not in batch:
            return batch, None
        tag = batch[BATCH_KEY]
        kept: Any
        try:
            rebuilt: Any = type(batch)  # a Mapping subclass taking a dict, like dict itself
            kept = rebuilt({k: v for k, v in batch.items() if k != BATCH_KEY})
        except Exception:
            kept = {k: v for k, v in batch.items() if k != BATCH_KEY}
        clean = kept
        return clean, tag if isinstance(tag, BatchTag) else None
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[-1], BatchTag):
        tag = batch[-1]
        if tag.wrapped and len(batch) == 2:
            return batch[0], tag
        return batch[:-1], tag
    return batch, None


def strip_in_place(batch: Any) -> BatchTag | None:
    """Remove the tag from a mutable batch (a dict or a list) in place and return it; for
    frameworks that hand the same batch object on to the user's code."""
    if isinstance(batch, Mapping) and BATCH_KEY in batch:
        tag = batch.pop(BATCH_KEY)  # type: ignore[attr-defined]
        return tag if isinstance(tag, BatchTag) else None
    if isinstance(batch, list) and batch and isinstance(batch[-1], BatchTag):
        return batch.pop()
    return None


# --- the dataset, collate and sampler wrappers ----------------------------------------------------

class ObservedDataset:
    """A map-style dataset whose samples carry their draw: ``self[draw]`` is
    ``Tagged(dataset[draw.index], draw)``; ``self[i]`` for a bare index ``i`` is
    ``Tagged(dataset[i], i)`` (``i`` reported as the sample's identity). ``__getitems__`` of the
    wrapped dataset is used when it has one (batched fetching). Other attributes are the wrapped
    dataset's. Use it with :class:`ObservedCollate`."""

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: Any) -> Tagged:
        if type(item) is Draw:
            return Tagged(self.dataset[item.index], item)
        return Tagged(self.dataset[item], item)

    def __getitems__(self, items: list) -> list:
        if type(items) is DrawBatch:  # a batch of draws: no object per sample
            many = getattr(self.dataset, "__getitems__", None)
            out = TaggedList(many(items) if many is not None else
                             [self.dataset[i] for i in items])
            out.tag = BatchTag([(items.iteration, items.positions(), list(items))])
            return out
        indices = [d.index if type(d) is Draw else d for d in items]
        many = getattr(self.dataset, "__getitems__", None)
        samples = many(indices) if many is not None else [self.dataset[i] for i in indices]
        return [Tagged(s, d) for s, d in zip(samples, items)]

    def __getattr__(self, name: str):
        if name == "dataset":  # during unpickling, before __dict__ is set
            raise AttributeError(name)
        return getattr(self.dataset, name)


class ObservedIterableDataset:
    """An iterable dataset whose samples say where they come from: ``key(sample)`` returns an
    offset (int, stratum ``stratum``), a ``(partition, offset)`` pair (the partition is the
    stratum, docs/ingest-v1.md#3-positions-spans-and-cursors) or, with ``ids=True``, the sample's
    identity. Yields ``Tagged`` samples for :class:`ObservedCollate`. The epoch is the recorder's
    (``ObservedRecorder.set_epoch``). ``set_epoch``, ``state_dict`` / ``load_state_dict`` and other
    attributes are forwarded to the wrapped dataset."""

    def __new__(cls, *args, **kwargs):
        # a torch IterableDataset (DataLoader tells the kinds apart by class), built when first
        # used so that importing the SDK does not import torch
        return object.__new__(_torch_iterable_class() if cls is ObservedIterableDataset else cls)

    def __init__(self, dataset: Any, key, *, stratum: str = "main", ids: bool = False,
                 dataset_version: str | None = None):
        self.dataset = dataset
        self.key = key
        self.stratum = stratum
        self.ids = bool(ids)
        self.dataset_version = dataset_version

    def __iter__(self):
        iterations: dict = {}
        key, ids = self.key, self.ids
        algorithm = f"{type(self.dataset).__module__}.{type(self.dataset).__qualname__}"
        for sample in self.dataset:
            k = key(sample)
            if ids:
                it = iterations.get(None)
                if it is None:
                    it = iterations[None] = Iteration(self.stratum, None, None, ids=True,
                                                      info={"algorithm": algorithm})
                yield Tagged(sample, Draw(k, -1, it))
                continue
            if isinstance(k, tuple):
                partition, offset = k
                stratum = str(partition)
            else:
                stratum, offset = self.stratum, k
            it = iterations.get(stratum)
            if it is None:
                it = iterations[stratum] = Iteration(
                    stratum, None, None, info={"algorithm": algorithm, "units": "samples"})
            yield Tagged(sample, Draw(k, int(offset), it))

    def __getattr__(self, name: str):
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


def _torch_iterable_class():
    cls = globals().get("_ObservedIterableTorch")
    if cls is None:
        from torch.utils.data import IterableDataset

        cls = type("_ObservedIterableTorch", (ObservedIterableDataset, IterableDataset),
                   {"__module__": __name__, "__doc__": ObservedIterableDataset.__doc__})
        globals()["_ObservedIterableTorch"] = cls
    return cls


def __getattr__(name: str):
    if name == "_ObservedIterableTorch":  # unpickled in a worker process: build it there too
        return _torch_iterable_class()
    raise AttributeError(name)


class ObservedCollate:
    """Collate function: ``collate_fn`` (default: torch's ``default_collate``) over the bare
    samples, then the batch's :class:`BatchTag` attached (:func:`attach_tag`). Items that are not
    ``Tagged`` (a dataset that is not wrapped) are collated as they are, without a tag. With
    ``batch_size=None`` (no auto-collation) it receives one sample and tags it alone."""

    def __init__(self, collate_fn=None):
        self.convert_fn = collate_fn
        if collate_fn is None:
            from torch.utils.data import default_collate, default_convert

            collate_fn, self.convert_fn = default_collate, default_convert
        self.collate_fn = collate_fn

    def __call__(self, items):
        if type(items) is TaggedList:
            return attach_tag(self.collate_fn(items), items.tag)
        if type(items) is Tagged:  # batch_size=None: one sample (torch's default converts it)
            return attach_tag(self.convert_fn(items.sample), BatchTag.of([items.draw]))
        if not items or type(items[0]) is not Tagged:
            return self.collate_fn(items)
        batch = self.collate_fn([t.sample for t in items])
        return attach_tag(batch, BatchTag.of([t.draw for t in items]))


def _digest(doc: dict) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
                          .encode()).hexdigest()[:32]


def _rng_bytes(state) -> bytes:
    try:
        return bytes(state.numpy().tobytes())
    except Exception:
        return repr(state).encode()


def _is_torchs_distributed_order(sampler: Any) -> bool:
    """Whether a distributed ``sampler`` (``num_replicas``, ``rank``, ``dataset``) is taken to
    draw torch's ``DistributedSampler`` order, the one the server re-creates from the declared
    settings: False for a subclass of torch's that overrides ``__iter__`` (Lightning's
    ``DistributedSamplerWrapper`` maps the order through the sampler it wraps)."""
    try:
        from torch.utils.data import DistributedSampler
    except ImportError:  # pragma: no cover
        return True
    return not isinstance(sampler, DistributedSampler) or \
        type(sampler).__iter__ is DistributedSampler.__iter__


class PositionSampler:
    """Wraps the sampler (or batch sampler) that defines the order; yields :class:`Draw` objects
    (lists of them for a batch sampler) carrying each index's position.

    sampler: any sampler; a ``DistributedSampler`` (anything with ``num_replicas``, ``rank``,
    ``seed``, ``epoch``, ``dataset``) maps draw ``k`` to position ``rank + k*num_replicas`` and
    marks positions ``>= len(dataset)`` as padding (``drop_last=False``). stratum: the ledger's
    stratum. rank, world_size: for a custom sampler that shards by interleaving like
    DistributedSampler (default: 0 and 1, position = draw number). epoch: the epoch of the first
    iteration when the sampler has no ``epoch`` attribute; then every iteration that runs to its
    end moves to the next epoch (``set_epoch`` sets it). dataset_version: part of the order
    digest. recorder: an :class:`ObservedRecorder` that reads this sampler's read cursor.

    The order of an epoch is named by a digest (``order``): a DistributedSampler's is
    :func:`recoverydash.sdk.ledger.order_digest` (seed, epoch, dataset length, shuffle, version:
    the counting recorder's too); a subclass of torch's that overrides ``__iter__`` (Lightning's
    ``DistributedSamplerWrapper``) is declared under its own class and named like another
    sampler, its spans carrying their indices; another sampler's covers its class, length,
    epoch, version and the state of its random generator when the iteration starts
    (``sampler.generator``, else torch's global generator for a ``RandomSampler`` without one,
    the wrapped sampler's for that wrapper), so the same permutation has the same name after a
    restore and another permutation another name.

    Resuming: the iterator is *stateful* for torchdata's ``StatefulDataLoader`` (``state_dict``:
    epoch, draws made, generator state, the inner iterator's state when it has one); restored, it
    re-creates the same order and skips the draws already made (or restores the inner iterator).
    In a plain loop, :meth:`resume_at` makes the next iteration of an epoch start at a cursor.
    """

    def __init__(self, sampler: Any, *, stratum: str = "main", rank: int | None = None,
                 world_size: int | None = None, epoch: int = 0,
                 dataset_version: str | None = None, recorder: ObservedRecorder | None = None):
        self.sampler = sampler
        self.stratum = stratum
        self.dataset_version = dataset_version
        inner = getattr(sampler, "sampler", None) if _is_batch_sampler(sampler) else sampler
        self._index_sampler = inner if inner is not None else sampler
        self.batched = _is_batch_sampler(sampler)
        s = self._index_sampler
        self.distributed = all(hasattr(s, a) for a in ("num_replicas", "rank", "dataset"))
        if self.distributed:
            self.rank = int(s.rank if rank is None else rank)
            self.world_size = int(s.num_replicas if world_size is None else world_size)
        else:
            self.rank = int(rank or 0)
            self.world_size = int(world_size or 1)
        self._epoch = int(epoch)
        self._resume: tuple[int, int] | None = None
        self.current: _PositionIter | None = None
        self._lock = threading.Lock()
        if recorder is not None:
            recorder.track_sampler(self)

    # -- what torch's samplers offer --

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        """Forwarded to the wrapped sampler; also the epoch of the next iteration."""
        self._epoch = int(epoch)
        for s in (self.sampler, self._index_sampler):
            if hasattr(s, "set_epoch"):
                s.set_epoch(epoch)
                break

    @property
    def epoch(self) -> int:
        s = self._index_sampler
        e = getattr(s, "epoch", None)
        return int(e) if isinstance(e, int) else self._epoch

    def __getattr__(self, name: str):
        # never the wrapped sampler's state methods: torchdata would then restore it *and* this
        # sampler's iterator (which re-creates the order and skips the draws itself)
        if name in ("sampler", "_index_sampler", "state_dict", "load_state_dict"):
            raise AttributeError(name)
        return getattr(self.sampler, name)

    def __iter__(self):
        return _PositionIter(self)

    # -- positions, orders, cursors --

    @property
    def dataset_length(self) -> int | None:
        s = self._index_sampler
        try:
            if self.distributed:
                return len(s.dataset)
            return len(s)
        except TypeError:
            return None

    def _iteration(self, epoch: int, rng_digest: str | None) -> Iteration:
        s = self._index_sampler
        n = self.dataset_length
        if self.distributed:
            shuffle, seed = bool(getattr(s, "shuffle", True)), int(getattr(s, "seed", 0))
            drop_last = bool(getattr(s, "drop_last", False))
            padded = padded_length(n or 0, self.world_size, drop_last)
            if _is_torchs_distributed_order(s):
                order = order_digest(seed=seed, epoch=epoch, dataset_length=n or 0,
                                     shuffle=shuffle, dataset_version=self.dataset_version)
                algorithm = SAMPLER_ALGORITHM
            else:  # e.g. Lightning's DistributedSamplerWrapper: its indices go through the
                # sampler it wraps, so the server cannot re-create them: they are reported
                algorithm = f"{type(s).__module__}.{type(s).__qualname__}"
                order = _digest({"algorithm": algorithm, "dataset_length": n,
                                 "dataset_version": self.dataset_version, "epoch": epoch,
                                 "rng": rng_digest, "seed": seed, "shuffle": shuffle})
            info = {"algorithm": algorithm, "seed": seed, "shuffle": shuffle,
                    "drop_last": drop_last, "padded_length": padded}
            return Iteration(self.stratum, epoch, order, self.rank, self.world_size, n,
                             n if padded > (n or 0) else None, info)
        algorithm = f"{type(s).__module__}.{type(s).__qualname__}"
        seed_of: Any = getattr(s, "seed", None)
        doc = {"algorithm": algorithm, "dataset_length": n, "dataset_version":
               self.dataset_version, "epoch": epoch, "rng": rng_digest,
               "seed": seed_of if isinstance(seed_of, int) else None}
        info = {"algorithm": algorithm, "shuffle": rng_digest is not None}
        return Iteration(self.stratum, epoch, _digest(doc), self.rank, self.world_size, n,
                         None, info)

    def _rng(self):
        """(generator to capture or None, whether it is torch's global generator)."""
        s = self._index_sampler
        gen = getattr(s, "generator", None)
        if gen is None and not _is_torchs_distributed_order(s):
            # Lightning's DistributedSamplerWrapper draws its dataset from the sampler it wraps
            wrapped = getattr(getattr(s, "dataset", None), "_sampler", None)
            gen = getattr(wrapped, "generator", None)
        if gen is not None and hasattr(gen, "get_state"):
            return gen, False
        try:
            from torch.utils.data import RandomSampler

            if isinstance(s, RandomSampler) and gen is None:
                return None, True
        except ImportError:  # pragma: no cover
            pass
        return None, False

    def resume_at(self, cursor: list | dict | None) -> int:
        """Make the next iteration of the cursor's epoch start at the cursor (``{"stratum",
        "epoch", "position"}``, or a list with one per stratum: this sampler's is used): it
        skips the draws of positions below it (``ceil((position - rank) / world_size)`` draws,
        so a cursor written by another world size resumes the ranks together at it). Returns the
        draws that will be skipped (0 for no cursor of this stratum). Also sets the epoch."""
        c = cursor
        if isinstance(cursor, list):
            c = next((x for x in cursor if isinstance(x, dict)
                      and x.get("stratum", self.stratum) == self.stratum), None)
        if not isinstance(c, dict) or c.get("stratum", self.stratum) != self.stratum:
            return 0
        epoch, skip = resume_skip(c, rank=self.rank, world_size=self.world_size)
        self.set_epoch(epoch)
        self._resume = (epoch, skip)
        return skip

    def fetched_cursor(self) -> dict | None:
        """The read cursor of the current iteration: ``{"stratum", "epoch", "position",
        "order"}`` (None before any draw). ``position`` is ``draws * world_size``: this rank has
        drawn (handed to the loader) every position of its share below it, ``rank + k *
        world_size`` for ``k < draws``; the server takes the highest over ranks."""
        it = self.current
        if it is None or it.drawn == 0:
            return None
        return {"stratum": self.stratum, "epoch": it.iteration.epoch,
                "position": it.drawn * self.world_size, "order": it.iteration.order}


def position_sampler_of(loader: Any) -> PositionSampler | None:
    """The :class:`PositionSampler` of a loader (its batch sampler, its sampler, or the sampler
    inside its batch sampler), or None."""
    bs = getattr(loader, "batch_sampler", None)
    for s in (bs, getattr(loader, "sampler", None), getattr(bs, "sampler", None)):
        if isinstance(s, PositionSampler):
            return s
    return None


def _is_batch_sampler(s: Any) -> bool:
    try:
        from torch.utils.data import BatchSampler
    except ImportError:  # pragma: no cover
        return False
    return isinstance(s, BatchSampler)


class _PositionIter:
    """One iteration of a PositionSampler (stateful for torchdata)."""

    def __init__(self, owner: PositionSampler):
        self.owner = owner
        self.drawn = 0
        self._start(owner.epoch, None)
        owner.current = self
        # The skip of a resume_at is made at the first draw, not here: a DataLoader with workers
        # creates its sampler iterator twice (in _BaseDataLoaderIter.__init__ and again in
        # _reset) and draws only from the second; a skip taken by the first was lost, and the
        # resumed loader replayed the epoch from its start.
        self._resume_pending = owner._resume if (
            owner._resume is not None and owner._resume[0] == self.iteration.epoch) else None

    def _start(self, epoch: int, rng_state) -> None:
        """Begin the epoch's order (with the generator state ``rng_state`` restored first)."""
        owner = self.owner
        gen, global_rng = owner._rng()
        digest = None
        self._rng_state = None
        self._prefix: list = []
        if gen is not None:
            if rng_state is not None:
                gen.set_state(rng_state)
            self._rng_state = gen.get_state()
            digest = hashlib.sha256(_rng_bytes(self._rng_state)).hexdigest()[:16]
            self.it = iter(owner.sampler)
        elif global_rng:
            import torch

            if rng_state is None:  # the global generator moves on as it would without us
                self._rng_state = torch.get_rng_state()
                self.it = iter(owner.sampler)
                self._prefix = _first(self.it)  # RandomSampler draws its seed at first next()
            else:
                with torch.random.fork_rng(devices=[]):
                    torch.set_rng_state(rng_state)
                    self._rng_state = rng_state.clone()
                    self.it = iter(owner.sampler)
                    self._prefix = _first(self.it)
            digest = hashlib.sha256(_rng_bytes(self._rng_state)).hexdigest()[:16]
        else:
            self.it = iter(owner.sampler)
        self.iteration = owner._iteration(epoch, digest)
        self._inner_stateful = _stateful(self.it)

    def _skip(self, n: int) -> None:
        """Draw (and drop) until ``n`` indices are drawn. A batch that straddles ``n`` keeps its
        part at and past ``n``: it is the next batch delivered (a shorter one)."""
        target = self.drawn + n
        while self.drawn < target:
            try:
                item = self._next_raw()
            except StopIteration:
                break
            if type(item) is DrawBatch and self.drawn > target:
                keep = self.drawn - target
                rest = DrawBatch(item[len(item) - keep:])
                rest.iteration = item.iteration
                rest.start = item.start + (len(item) - keep) * item.iteration.world_size
                self._prefix.append(rest)

    def __iter__(self):
        return self

    def _next_raw(self):
        if self._resume_pending is not None:
            pending, self._resume_pending = self._resume_pending, None
            if self.owner._resume is pending:  # not yet taken by another iteration
                self.owner._resume = None
                self._skip(pending[1])
        if self._prefix:
            item = self._prefix.pop()
            if type(item) is DrawBatch:  # the rest of a batch cut by a skip: already drawn
                return item
        else:
            item = next(self.it)
        owner = self.owner
        if owner.batched:
            out = DrawBatch(item)
            out.iteration = self.iteration
            out.start = owner.rank + self.drawn * owner.world_size
            self.drawn += len(out)
            return out
        d = Draw(item, owner.rank + self.drawn * owner.world_size, self.iteration)
        self.drawn += 1
        return d

    def __next__(self):
        try:
            return self._next_raw()
        except StopIteration:
            owner = self.owner
            if owner.current is self and not hasattr(owner._index_sampler, "epoch"):
                owner._epoch = self.iteration.epoch + 1  # ran to its end: the next epoch
            raise

    # -- torchdata's Stateful protocol --

    def state_dict(self) -> dict:
        sd = {"epoch": self.iteration.epoch, "drawn": self.drawn, "order": self.iteration.order,
              "stratum": self.owner.stratum}
        if self._rng_state is not None:
            sd["rng"] = self._rng_state.clone()
        if self._inner_stateful:
            sd["inner"] = self.it.state_dict()
        return sd

    def load_state_dict(self, sd: dict) -> None:
        owner = self.owner
        if self._resume_pending is not None and owner._resume is self._resume_pending:
            owner._resume = None  # the restored iterator state wins over a cursor
        self._resume_pending = None
        epoch = int(sd.get("epoch", 0))
        if hasattr(owner._index_sampler, "set_epoch"):
            owner._index_sampler.set_epoch(epoch)
        owner._epoch = epoch
        self._start(epoch, sd.get("rng"))
        self.drawn = 0
        if "inner" in sd and self._inner_stateful:
            self.it.load_state_dict(sd["inner"])
            self.drawn = int(sd.get("drawn", 0))
            self._prefix = []
        else:
            self._skip(int(sd.get("drawn", 0)))
        if sd.get("order") and sd["order"] != self.iteration.order:
            log.warning("recoverydash: restored sampler state of epoch %s named order %s, the "
                        "restored sampler produces order %s (reported as observed)", epoch,
                        sd["order"], self.iteration.order)
        owner.current = self


def _first(it) -> list:
    try:
        return [next(it)]
    except StopIteration:
        return []


def _stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and \
        callable(getattr(obj, "load_state_dict", None))


# --- the recorder ---------------------------------------------------------------------------------

class ObservedRecorder(Reporter):
    """The data ledger of one data-parallel rank, from observed positions (module doc: the
    contract).

    client: the sender. rank, world_size: data-parallel rank and world size (default: the
    client's rank, else ``torch.distributed``, else ``$RANK``/``$WORLD_SIZE``, else 0 and 1).
    dataset_version: identity of the data (``attempt_started`` and manifests). heartbeat_interval:
    seconds between heartbeats sent from ``commit`` (0: never). epoch: the epoch of samples
    whose draw names none (iterable datasets, bare indices); ``set_epoch`` moves it.
    start_timeout: seconds ``attempt_started`` waits for the first observed batch.
    id_stratum: the stratum of samples that arrive with a bare dataset index (an
    ObservedDataset behind a sampler that is not a PositionSampler): their indices are ids.

    ``start_defaults``: ``attempt_started`` fields an integration declares for the trainer (e.g.
    the ``contract`` of what its framework's checkpoints hold); a field given to ``start`` wins.
    """

    mode = LEDGER_MODE

    def __init__(self, client: Client, *, rank: int | None = None,
                 world_size: int | None = None, dataset_version: str | None = None,
                 heartbeat_interval: float = 30.0, epoch: int = 0,
                 start_timeout: float = 30.0, id_stratum: str = "main"):
        self.client = client
        self.id_stratum = id_stratum
        r, w = _dist_rank_world()
        client_rank = getattr(client, "rank", None)
        self.rank = int(rank if rank is not None else (client_rank if isinstance(
            client_rank, int) else r))
        self.world_size = int(world_size if world_size is not None else w)
        self.dataset_version = dataset_version
        self.heartbeat_interval = heartbeat_interval
        self.start_timeout = start_timeout
        self.update = 0
        self._epoch = int(epoch)
        self._pending: list[BatchTag] = []
        self._samplers: list[PositionSampler] = []
        self._loaders: dict[str, Any] = {}
        self._frontier: dict[str, tuple[int, int]] = {}   # stratum -> (epoch, position)
        self._observed: dict[tuple, int] = {}              # (stratum, epoch, order) -> max + 1
        self.start_defaults: dict[str, Any] = {}
        self._start_fields: dict | None = None
        self._start_timer: threading.Timer | None = None
        self._start_lock = threading.Lock()
        self._last_heartbeat = time.monotonic()
        self._counters = {"observed_batches": 0, "observed_samples": 0,
                          "unobserved_batches": 0, "committed_updates": 0,
                          "discarded_batches": 0}
        self._errors: set = set()
        faults.install_digest_hook()

    # -- wiring --

    def sampler(self, sampler: Any, *, stratum: str = "main", **kw) -> PositionSampler:
        """A :class:`PositionSampler` around ``sampler`` whose read cursor this recorder reports
        (``kw``: rank, world_size, epoch)."""
        kw.setdefault("dataset_version", self.dataset_version)
        return PositionSampler(sampler, stratum=stratum, recorder=self, **kw)

    def track_sampler(self, sampler: PositionSampler) -> None:
        if sampler not in self._samplers:
            self._samplers.append(sampler)

    def track(self, loader: Any, name: str = "train") -> Any:
        """Put ``loader.state_dict()`` into :meth:`state_dict` under ``loaders[name]`` (a
        torchdata ``StatefulDataLoader``), and restore it in :meth:`load_state_dict`. Its
        PositionSampler (if any) is tracked too. Returns the loader."""
        self._loaders[name] = loader
        s = position_sampler_of(loader)
        if s is not None:
            self.track_sampler(s)
        return loader

    @staticmethod
    def dataset(dataset: Any) -> ObservedDataset:
        """:class:`ObservedDataset` around ``dataset``."""
        return ObservedDataset(dataset)

    @staticmethod
    def collate(collate_fn=None) -> ObservedCollate:
        """:class:`ObservedCollate` around ``collate_fn``."""
        return ObservedCollate(collate_fn)

    def attach(self, model: Any) -> Any:
        """Register the forward pre-hook (with kwargs) that strips the batch's tag and records
        it (module doc). Returns the hook handle (``.remove()``)."""
        return model.register_forward_pre_hook(self._forward_hook, with_kwargs=True)

    def attach_optimizer(self, optimizer: Any) -> Any:
        """Commit at every ``optimizer.step()`` (a step post-hook). Returns the hook handle."""
        return optimizer.register_step_post_hook(lambda *_a, **_k: self.commit())

    def set_epoch(self, epoch: int) -> None:
        """The epoch of samples whose draw names none (iterables, bare indices)."""
        self._epoch = int(epoch)

    @property
    def epoch(self) -> int:
        return self._epoch

    # -- the hot path --

    def observe(self, batch: Any) -> Any:
        """Strip the batch's tag, record it as one microbatch of the update in progress, return
        the batch as the model must see it. Never raises."""
        try:
            clean, tag = strip(batch)
            self.record(tag)
            return clean
        except Exception as e:  # pragma: no cover
            self._log_once("observe", e)
            return batch

    def record(self, tag: BatchTag | None) -> None:
        """Record ``tag`` (from :func:`strip`) as one microbatch of the update in progress; None
        counts an unobserved batch. A tag already recorded for the update in progress is
        ignored (the ledger of an update is a set); fed again in a later update, it is recorded
        again (consumed twice)."""
        try:
            if tag is None:
                self._counters["unobserved_batches"] += 1
                if "unobserved" not in self._errors:
                    self._errors.add("unobserved")
                    log.warning("recoverydash: a batch reached the model without positions (is "
                                "the dataset an ObservedDataset and the collate_fn an "
                                "ObservedCollate?); nothing is recorded for it")
                return
            if tag.recorded is self._pending:  # the same batch twice in one update: once
                return
            tag.recorded = self._pending
            self._pending.append(tag)
            faults.on_record(self)
            self._counters["observed_batches"] += 1
            if self._start_fields is not None:
                self._send_start(tag)
        except Exception as e:  # pragma: no cover
            self._log_once("record", e)

    def strip(self, batch: Any) -> tuple[Any, BatchTag | None]:
        """:func:`strip` (nothing recorded)."""
        return strip(batch)

    def _forward_hook(self, module, args, kwargs):
        try:
            tag = None
            if BATCH_KEY in kwargs:
                kwargs = dict(kwargs)
                tag = kwargs.pop(BATCH_KEY)
            new_args = []
            changed = False
            for a in args:
                if isinstance(a, BatchTag):
                    tag, changed = a, True
                    continue
                if isinstance(a, (Mapping, list, tuple)):
                    clean, t = strip(a)
                    if t is not None:
                        tag, a, changed = t, clean, True
                new_args.append(a)
            if tag is None:
                return None
            if _grad_enabled() and getattr(module, "training", True):
                self.record(tag if isinstance(tag, BatchTag) else None)
            return (tuple(new_args) if changed else args), kwargs
        except Exception as e:  # pragma: no cover
            self._log_once("forward_hook", e)
            return None

    def discard(self) -> int:
        """Drop the microbatches recorded since the last commit (their update will not commit,
        e.g. a step skipped for an overflow). Returns how many."""
        n, self._pending = len(self._pending), []
        self._counters["discarded_batches"] += n
        return n

    def commit(self, update: int | None = None) -> bool:
        """Send ``update_committed`` for ``update`` (default: the previous update + 1) with every
        position recorded since the previous commit. Sends a heartbeat when
        ``heartbeat_interval`` seconds have passed. Returns whether the event was queued."""
        try:
            pending, self._pending = self._pending, []
            update = self.update + 1 if update is None else int(update)
            suffix = self._commit_suffix(update)
            self._counters["committed_updates"] += 1
            frontier, observed, epoch = self._frontier, self._observed, self._epoch
            for tag in pending:
                for it, positions, ids in tag.groups:
                    self._counters["observed_samples"] += len(ids)
                    if it is None or it.ids or not positions:
                        continue
                    e = epoch if it.epoch is None else it.epoch
                    top = _highest(positions) + 1
                    key = (it.stratum, e, it.order)
                    if top > observed.get(key, 0):
                        observed[key] = top
                    if it.padding_from is not None and top > it.padding_from:
                        real = _below(positions, it.padding_from)
                        if not real:
                            continue
                        top = _highest(real) + 1
                    if (e, top) > frontier.get(it.stratum, (-1, -1)):
                        frontier[it.stratum] = (e, top)
            ok = self.client._push(_ObservedReport(self, update, pending, suffix, epoch))
            self._heartbeat_due()
            faults.on_commit(self, update, pending)
            return ok
        except Exception as e:
            self._log_once("commit", e)
            return False

    # -- cursors and state --

    def cursor(self) -> list[dict]:
        """The committed cursor of this rank, per stratum: the highest epoch with committed
        positions and there the position after the highest committed one (padding excluded).
        ``save_generation`` publishes the maximum over ranks (the lineage's frontier)."""
        return [{"stratum": s, "epoch": e, "position": p}
                for s, (e, p) in sorted(self._frontier.items())]

    def fetched_cursor(self) -> list[dict]:
        """The read cursor: per tracked sampler, the position after the last index drawn in its
        current iteration; for other strata, the position after the highest one observed in
        their latest epoch."""
        out, seen = [], set()
        for s in self._samplers:
            c = s.fetched_cursor()
            if c is not None:
                out.append(c)
                seen.add(c["stratum"])
        latest: dict = {}
        for (stratum, epoch, order), top in self._observed.items():
            if stratum in seen:
                continue
            if stratum not in latest or (epoch, top) > latest[stratum][:2]:
                latest[stratum] = (epoch, top, order)
        for stratum, (epoch, top, order) in sorted(latest.items()):
            c = {"stratum": stratum, "epoch": epoch, "position": top}
            if order is not None:
                c["order"] = order
            out.append(c)
        return out

    def state_dict(self) -> dict:
        """The data progress to save with a checkpoint (``save_generation(recorder=...)`` writes
        it as this rank's ``data_progress``): ``ledger`` ("observed"), ``update``, ``cursor``
        (this rank's committed cursor), ``rank``, ``world_size``, ``dataset_version`` and
        ``loaders`` (``{name: loader.state_dict()}`` of the tracked loaders; not JSON when a
        loader's state holds tensors: then the file is a torch.save)."""
        sd = {"ledger": LEDGER_MODE, "update": self.update, "cursor": self.cursor(),
              "rank": self.rank, "world_size": self.world_size,
              "dataset_version": self.dataset_version}
        loaders = {}
        for name, loader in self._loaders.items():
            try:
                loaders[name] = loader.state_dict()
            except Exception as e:
                self._log_once(f"state_dict:{name}", e)
        if loaders:
            sd["loaders"] = loaders
        return sd

    def load_state_dict(self, state: dict | None, *, cursor: list | None = None) -> None:
        """Restore from a checkpoint's data progress (this rank's ``data_progress``, as
        ``load_generation`` returns it): the update; every tracked loader from its saved state;
        every tracked sampler that is not inside a restored loader resumes at ``cursor`` (default:
        the state's cursor; pass the manifest's ``data_progress.cursor`` when the world size
        changed). A state written by another rank or world size (``load_generation`` falls back
        to rank 0's file when the world grew) restores no loader: another rank's loader state
        would replay that rank's share. Never raises (a state it cannot read restores nothing and
        is logged)."""
        try:
            state = state or {}
            self.update = int(state.get("update") or 0)
            restored = set()
            mine = (state.get("rank", self.rank), state.get("world_size", self.world_size)) == \
                (self.rank, self.world_size)
            if not mine and state.get("loaders"):
                log.warning("recoverydash: the data progress is rank %s of %s's, this is rank %s "
                            "of %s: its loader states are not restored (the samplers resume at "
                            "the cursor)", state.get("rank"), state.get("world_size"), self.rank,
                            self.world_size)
            for name, loader in self._loaders.items():
                saved = (state.get("loaders") or {}).get(name) if mine else None
                if saved is None:
                    continue
                loader.load_state_dict(saved)
                sampler = position_sampler_of(loader)
                if sampler is not None:
                    restored.add(id(sampler))
            at = state.get("cursor") if cursor is None else cursor
            for s in self._samplers:
                if id(s) not in restored:
                    s.resume_at(at)
            faults.on_resume(self, at)
        except Exception as e:
            self._log_once("load_state_dict", e)

    def counters(self) -> dict:
        """``observed_batches``, ``observed_samples`` (committed), ``unobserved_batches``,
        ``committed_updates``, ``discarded_batches``."""
        return dict(self._counters)

    # -- attempt events --

    def sampler_info(self, iterations: list[Iteration] | None = None) -> dict:
        """``attempt_started.sampler``: ``ledger`` ("observed"), and from the iterations seen
        (or the tracked samplers) ``algorithm``, ``seed``, ``shuffle``, ``drop_last``,
        ``epoch_length``, ``padded_length`` and ``units`` per stratum."""
        info: dict = {"ledger": LEDGER_MODE}
        its = list(iterations or [])
        for s in self._samplers:
            try:
                its.append(s._iteration(s.epoch, None))
            except Exception:  # pragma: no cover
                pass
        for it in its:
            st = it.stratum
            for k in ("algorithm", "seed", "shuffle", "drop_last"):
                if k in it.info:
                    info.setdefault(k, it.info[k])
            if it.length is not None:
                info.setdefault("epoch_length", {}).setdefault(st, int(it.length))
            if "padded_length" in it.info:
                info.setdefault("padded_length", {}).setdefault(st, it.info["padded_length"])
            info.setdefault("units", {}).setdefault(st, it.info.get("units", "samples"))
        return info

    def start(self, *, resumed_from: dict | None = None, **fields) -> bool:
        """Prepare ``attempt_started`` (world size, dataset version, sampler, ``fields``:
        ``global_batch_size``, ``micro_batch_size``, ``grad_accum_steps``, ``config_digest``,
        ``contract``...; over ``start_defaults``). It is sent with the first observed batch,
        whose positions become ``resumed_from.cursor`` (what the loader delivered, per
        stratum), or after ``start_timeout`` seconds / at ``heartbeat`` / ``end`` with the
        cursor left empty (the server then takes the first positions of the ledger).
        ``resumed_from``: the restored generation (``resumed_from(plan)``) or None for a fresh
        start; its ``update`` becomes this recorder's update. Never raises."""
        try:
            if resumed_from:
                self.update = max(self.update, int(resumed_from.get("update") or 0))
            with self._start_lock:
                self._start_fields = {**self.start_defaults, "resumed_from": resumed_from,
                                      **fields}
            if self.start_timeout and self.start_timeout > 0:
                t = threading.Timer(self.start_timeout, self._send_start, args=(None,))
                t.daemon = True
                self._start_timer = t
                t.start()
            return True
        except Exception as e:
            self._log_once("start", e)
            return False

    def _send_start(self, tag: BatchTag | None) -> bool:
        with self._start_lock:
            fields, self._start_fields = self._start_fields, None
        if fields is None:
            return False
        if self._start_timer is not None and tag is not None:
            self._start_timer.cancel()
        try:
            its = [it for it, _, _ in tag.groups if it is not None] if tag is not None else []
            fields.setdefault("sampler", self.sampler_info(its))
            resumed = fields.pop("resumed_from", None)
            if resumed is not None:
                resumed = {"generation_id": resumed.get("generation_id"),
                           "update": int(resumed.get("update") or 0),
                           "cursor": self._first_cursor(tag) if tag is not None else []}
            return self.client.attempt_started(
                world_size=self.world_size, dataset_version=self.dataset_version or "unknown",
                resumed_from=resumed, rank=self.rank, **fields)
        except Exception as e:
            self._log_once("start", e)
            return False

    def _first_cursor(self, tag: BatchTag) -> list[dict]:
        """Where the loader resumed, per stratum of the first batch: its lowest position, as a
        global cursor (``position - rank`` for interleaved ranks)."""
        out: dict = {}
        for it, positions, _ in tag.groups:
            if it is None or it.ids or not positions:
                continue
            real = positions if it.padding_from is None else _below(positions, it.padding_from)
            if not real:
                continue
            low = real[0] if type(real) is range else \
                real.lowest() if type(real) is TokenRanges else min(real)
            p = low - it.rank if it.world_size > 1 else low
            e = self._epoch if it.epoch is None else it.epoch
            if it.stratum not in out or (e, p) < out[it.stratum][:2]:
                out[it.stratum] = (e, p, it.order)
        return [{"stratum": s, "epoch": e, "position": max(0, p)}
                for s, (e, p, _o) in sorted(out.items())]

    def _before_event(self) -> None:
        if self._start_fields is not None:  # attempt_started before any other event
            self._send_start(None)

    # -- internals --

    def _spans(self, pending: list[BatchTag], epoch: int) -> tuple[list[dict], int, int, list]:
        """(spans, samples, repeated positions, ids in order) of one update's tags.

        A span of positions under a named order carries ``indices``, the dataset indices its
        positions held (docs/ingest-v1.md#3-positions-spans-and-cursors), so that the server can
        compare the samples of two orders when a restart changes the order; except under a
        DistributedSampler's order, whose permutation the server re-creates from the order's
        seed, epoch and length, and for padding."""
        keyed: dict[tuple, list] = {}
        indexed: dict[tuple, list] = {}
        id_keyed: dict[tuple, list] = {}
        tokened: dict[tuple, list] = {}  # token ranges (docs/definitions.md#units)
        tnamed: dict[tuple, list] = {}  # each group's identities: the source's token offsets
        samples = 0
        ordered_ids: list = []
        for tag in pending:
            for it, positions, ids in tag.groups:
                samples += len(ids)
                ordered_ids.extend(ids)
                if it is None or it.ids:
                    stratum = self.id_stratum if it is None else it.stratum
                    e = epoch if it is None or it.epoch is None else it.epoch
                    id_keyed.setdefault((stratum, e), []).extend(ids)
                    continue
                e = epoch if it.epoch is None else it.epoch
                pad = it.padding_from
                if type(positions) is TokenRanges:  # a token iteration's padding: the whole group
                    key = (it.stratum, e, it.order, pad is not None)
                    tokened.setdefault(key, []).extend(positions)
                    tnamed.setdefault(key, []).append(positions.identities)
                    continue
                named = it.order is not None and it.info.get("algorithm") != SAMPLER_ALGORITHM
                if pad is None:
                    key = (it.stratum, e, it.order, False)
                    keyed.setdefault(key, []).extend(positions)
                    if named:
                        indexed.setdefault(key, []).extend(ids)
                else:
                    for p, i in zip(positions, ids, strict=False):
                        key = (it.stratum, e, it.order, p >= pad)
                        keyed.setdefault(key, []).append(p)
                        if named and p < pad:
                            indexed.setdefault(key, []).append(i)
        spans, repeated = _position_spans(keyed, indexed)
        # a key's identities when every group named them (resolved per key, not per group)
        # (padding and unnamed orders send no indices)
        tindexed = {key: found for key, found in
                    ((key, identities_of_all(groups)) for key, groups in tnamed.items()
                     if not key[3] and key[2] is not None) if found is not None}
        more, rep = _token_spans(tokened, tindexed)
        spans += more
        repeated += rep
        more, rep = _id_spans(id_keyed)
        return spans + more, samples, repeated + rep, ordered_ids


def _highest(positions) -> int:
    """The highest of a non-empty list or range of positions (a range: O(1); token ranges: the
    last token held)."""
    if type(positions) is range:
        return positions[-1] if positions.step > 0 else positions[0]
    if type(positions) is TokenRanges:
        return positions.highest()
    return max(positions)


def _below(positions, bound: int):
    """The positions below ``bound`` (a range stays a range)."""
    if type(positions) is range and positions.step > 0:
        return range(positions.start, min(positions.stop, max(bound, positions.start)),
                     positions.step)
    if type(positions) is TokenRanges:
        return positions.below(bound)
    return [p for p in positions if p < bound]


#: At most this many items in one span's ``indices`` (docs/ingest-v1.md): a longer set is sent
#: in several spans of the same key, each with its positions and their indices.
MAX_INDEX_ITEMS = 100_000


def index_items(indices: list) -> list | None:
    """The set of dataset ``indices`` as a span's ``indices`` items: sorted, every run of three
    or more with a constant step as a range ``[start, stop]`` (step 1) or ``[start, stop,
    step]`` (``stop`` is last + 1), other indices as integers. None when an index is not an
    integer in ``[0, 2**63)`` (a dataset keyed otherwise: its samples cannot be named by
    index)."""
    try:
        values = sorted(set(indices))
    except TypeError:
        return None
    if values and (type(values[0]) is not int or values[0] < 0
                   or type(values[-1]) is not int or values[-1] >= 2 ** 63
                   or not all(type(v) is int for v in values)):
        return None
    out: list = []
    i, n = 0, len(values)
    while i < n:
        start = values[i]
        if i + 2 < n:
            step = values[i + 1] - start
            j = i + 1
            while j + 1 < n and values[j + 1] - values[j] == step:
                j += 1
            if j - i >= 2:
                out.append([start, values[j] + 1] if step == 1 else [start, values[j] + 1, step])
                i = j + 1
                continue
        out.append(start)
        i += 1
    return out



def _position_spans(keyed: dict[tuple, list], indexed: dict[tuple, list]
                    ) -> tuple[list[dict], int]:
    """``ObservedRecorder._spans``' spans of positions, ``{(stratum, epoch, order, padding):
    positions}`` with their dataset indices where named: ``(spans, repeated positions)``."""
    spans: list[dict] = []
    repeated = 0
    for key, ps in keyed.items():
        padding = key[3]
        indices = indexed.get(key)
        if indices is not None and len(indices) != len(ps):  # pragma: no cover
            indices = None
        for part, part_indices in _index_parts(ps, indices):
            ranges, rep = compress(part)
            repeated += 0 if padding else rep
            span = _span(key, ranges)
            if part_indices is not None:
                span["indices"] = part_indices
            spans.append(span)
    return spans, repeated


def _span(key: tuple, ranges: list) -> dict:
    """A wire span of ``ranges`` for ``key`` ``(stratum, epoch, order, padding)``: ``order``
    only when named, ``padding`` only when true."""
    stratum, epoch, order, padding = key
    span: dict = {"stratum": stratum, "epoch": epoch, "ranges": ranges}
    if order is not None:
        span["order"] = order
    if padding:
        span["padding"] = True
    return span


def _token_spans(tokened: dict[tuple, list], tindexed: dict[tuple, list]
                 ) -> tuple[list[dict], int]:
    """The spans of token ranges (docs/definitions.md#units) with their identities (the
    source's token offsets) when every group named them: ``(spans, repeated tokens)``."""
    spans: list[dict] = []
    repeated = 0
    for key, rs in tokened.items():
        padding = key[3]
        ranges, rep = merge(rs)
        repeated += 0 if padding else rep
        span = _span(key, ranges)
        identities = tindexed.get(key)
        if identities:
            items = merge(identities)[0]
            if len(items) <= MAX_INDEX_ITEMS:
                span["indices"] = items
        spans.append(span)
    return spans, repeated


def _id_spans(id_keyed: dict[tuple, list]) -> tuple[list[dict], int]:
    """The ``ids`` spans of samples without a position (100,000 ids each): ``(spans, repeated
    ids)``."""
    spans: list[dict] = []
    repeated = 0
    for (stratum, e), ids in id_keyed.items():
        clean = [i if isinstance(i, (int, str)) and not isinstance(i, bool) else str(i)
                 for i in ids]
        repeated += len(clean) - len(set(clean))
        for lo in range(0, len(clean), 100_000):
            spans.append({"stratum": stratum, "epoch": e, "ids": clean[lo:lo + 100_000]})
    return spans, repeated

def _index_parts(positions: list, indices: list | None):
    """``(positions, indices items or None)`` of one span key: the whole key when its indices
    fit one span (:data:`MAX_INDEX_ITEMS`), else the (position, index) pairs in parts of that
    many, so each span says which indices its own positions held."""
    if indices is None:
        yield positions, None
        return
    items = index_items(indices)
    if items is None or len(items) <= MAX_INDEX_ITEMS:
        yield positions, items
        return
    pairs = sorted(zip(positions, indices, strict=True), key=lambda pair: pair[0])
    for lo in range(0, len(pairs), MAX_INDEX_ITEMS):
        part = pairs[lo:lo + MAX_INDEX_ITEMS]
        yield [p for p, _ in part], index_items([i for _, i in part])


def _token_count(pending: list) -> int | None:
    """Tokens the model received in ``pending``'s token groups, padding excluded (None when no
    group is in tokens): the ``tokens`` field of ``update_committed``."""
    n = None
    for tag in pending:
        for it, positions, _ids in tag.groups:
            if type(positions) is TokenRanges:
                n = (n or 0) + (0 if it.padding_from is not None else positions.tokens())
    return n


def compress(positions: list[int]) -> tuple[list[list[int]], int]:
    """Sorted positions as ranges with a constant step (``[start, stop]`` for step 1, else
    ``[start, stop, step]``; ``stop`` is last + 1), greedily from the lowest position; and how many
    positions were repeats (a repeat cannot be expressed by ranges). Exact for any set:
    ``sum(len(range(*r)))`` equals the number of distinct positions."""
    ps = sorted(set(positions))
    repeated = len(positions) - len(ps)
    out: list[list[int]] = []
    i, n = 0, len(ps)
    while i < n:
        start = ps[i]
        if i + 1 == n:
            out.append([start, start + 1])
            break
        step = ps[i + 1] - start
        j = i + 1
        while j + 1 < n and ps[j + 1] - ps[j] == step:
            j += 1
        out.append([start, ps[j] + 1] if step == 1 else [start, ps[j] + 1, step])
        i = j + 1
    return out, repeated


class _ObservedReport:
    """An ``update_committed`` whose spans are built when the sender thread sends it."""

    __slots__ = ("epoch", "pending", "recorder", "suffix", "update")

    def __init__(self, recorder: ObservedRecorder, update: int, pending: list, suffix: str,
                 epoch: int):
        self.recorder = recorder
        self.update = update
        self.pending = pending
        self.suffix = suffix
        self.epoch = epoch

    def materialize(self) -> dict:
        rec = self.recorder
        spans, samples, repeated, ids = rec._spans(self.pending, self.epoch)
        ev = {"type": "update_committed", "update": self.update, "spans": spans,
              "samples": samples, "rank": rec.rank,
              "event_id": rec.client.event_id(self.suffix, rec.rank)}
        tokens = _token_count(self.pending)
        if tokens is not None:
            ev["tokens"] = tokens
        if ids:
            try:
                ev["ids_digest"] = hashlib.sha256(json.dumps(ids, separators=(",", ":"))
                                                  .encode()).hexdigest()[:32]
            except (TypeError, ValueError):  # identities that are not JSON: no digest
                pass
        if repeated:
            ev["repeated"] = repeated
            log.warning("recoverydash: update %d of rank %d consumed %d position(s) twice "
                        "within the update", self.update, rec.rank, repeated)
        return ev


def _grad_enabled() -> bool:
    try:
        import torch

        return torch.is_grad_enabled()
    except ImportError:  # pragma: no cover
        return True


def _dist_rank_world() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:  # pragma: no cover
        pass
    r, w = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    return (int(r) if r.isdigit() else 0), (int(w) if w.isdigit() else 1)
