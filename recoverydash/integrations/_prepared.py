"""Making a DataLoader that a framework already built carry positions, in place
(``observe_built_loader``; to build one yourself, ``recoverydash.integrations.pytorch``).

Frameworks build the train loader themselves (HF Trainer through ``accelerator.prepare``,
Lightning with the ``DistributedSampler`` it injects), so the integrations cannot pass an
``ObservedDataset`` and an ``ObservedCollate`` to its constructor. ``observe_built_loader`` changes
the built loader before its first iterator exists (the iterator, and the worker processes, read
the dataset, collate function and batch sampler when they are created).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from recoverydash.sdk.observe import (
    ObservedCollate,
    ObservedDataset,
    ObservedRecorder,
    PositionSampler,
)

log = logging.getLogger("recoverydash.integrations")


class _SeededOrder(PositionSampler):
    """A PositionSampler around accelerate's ``SeedableRandomSampler``, whose permutation is a
    function of ``initial_seed + epoch`` (it reseeds its own generator inside ``__iter__``): the
    epoch's order is named by those, so a restarted attempt's permutation of an epoch has the
    same ``order`` as the first attempt's (a generator state taken before ``iter()`` would name
    every launch's differently)."""

    def _rng(self):
        return None, False

    def _iteration(self, epoch, rng_digest):
        it = super()._iteration(epoch, None)
        s = self._index_sampler
        doc = {"algorithm": f"{type(s).__module__}.{type(s).__qualname__}",
               "dataset_length": self.dataset_length, "dataset_version": self.dataset_version,
               "epoch": int(epoch), "seed": int(s.initial_seed)}
        it.order = hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":"))
                                  .encode()).hexdigest()[:32]
        it.info = {**it.info, "seed": int(s.initial_seed), "shuffle": True}
        return it


def observe_built_loader(loader: Any, recorder: ObservedRecorder) -> str:
    """Make a (prepared) map-style DataLoader carry positions to ``recorder``, in place: its
    dataset becomes an ``ObservedDataset``, its ``collate_fn`` an ``ObservedCollate`` around the
    one it has, and the sampler inside its batch sampler (accelerate's ``BatchSamplerShard`` ->
    ``BatchSampler`` -> sampler; the loader's own ``sampler`` without automatic batching) a
    ``PositionSampler``. Returns ``"positions"``, ``"ids"`` (a batch sampler of your own that has
    no ``sampler``: dataset indices are reported as identities) or ``"none"`` (an iterable
    dataset, or nothing could be wrapped; logged). Never raises."""
    try:
        import torch.utils.data as tud

        # accelerate's DataLoaderShard is an adapter around the DataLoader that iterates
        loader = getattr(loader, "base_dataloader", None) or loader
        ds = loader.dataset
        if isinstance(ds, tud.IterableDataset):
            log.warning("recoverydash: the train dataset is iterable: wrap it in "
                        "ObservedIterableDataset to record positions; nothing is recorded")
            return "none"
        if not isinstance(ds, ObservedDataset):
            # DataLoader refuses to re-set ``dataset`` after __init__; the iterator reads it
            # when it is created, so replacing the attribute is enough
            object.__setattr__(loader, "dataset", ObservedDataset(ds))
        if not isinstance(loader.collate_fn, ObservedCollate):
            loader.collate_fn = ObservedCollate(loader.collate_fn)
        # accelerate wraps the BatchSampler that iterates the sampler (BatchSamplerShard,
        # SkipBatchSampler: ``.batch_sampler``); the innermost one is the one to change. Without
        # automatic batching (batch_size=None) the loader iterates ``.sampler`` itself.
        inner = loader.batch_sampler
        while getattr(inner, "batch_sampler", None) is not None:
            inner = inner.batch_sampler
        holder = inner if inner is not None else loader
        sampler = getattr(holder, "sampler", None)
        if sampler is None:  # a batch sampler of your own: its indices are the identities
            return "ids"
        if isinstance(sampler, PositionSampler):
            recorder.track_sampler(sampler)
            return "positions"
        cls = _SeededOrder if hasattr(sampler, "initial_seed") else PositionSampler
        object.__setattr__(holder, "sampler", cls(sampler, recorder=recorder,
                                                  dataset_version=recorder.dataset_version))
        return "positions"
    except Exception as e:  # noqa: BLE001 - never raises into training
        log.warning("recoverydash: the train dataloader could not be observed: %r", e)
        return "none"
