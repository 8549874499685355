"""torchdata's ``StatefulDataLoader`` (worker processes included) with the observed ledger.

Three lines (a complete script: ``examples/train_torchdata.py``)::

    rec = ObservedRecorder(rd.init(url, token, run_id), dataset_version="ds-v1")
    loader = observed_loader(rec, dataset, batch_size=8, shuffle=True, seed=0, num_workers=2)
    ... batch = rec.observe(batch) before the model, rec.commit() after optimizer.step() ...

The loader is tracked by the recorder: ``rec.state_dict()`` (which ``save_generation(...,
recorder=rec)`` writes as the rank's data progress) holds ``loader.state_dict()`` taken at the
checkpoint's optimizer boundary, and ``rec.load_state_dict(progress)`` restores it: one call.
The ``PositionSampler`` inside is stateful for torchdata: its state (epoch, draws made, the
generator state at the epoch's start) re-creates the same order and skips exactly the draws the
loader had delivered; batches that were only prefetched by the workers are drawn again and
delivered (recomputed after a crash, never omitted). A loader whose state is not restored starts
the epoch from its beginning and the ledger shows the replay as it happened.
"""

from __future__ import annotations

from typing import Any

from recoverydash.sdk.observe import ObservedRecorder


def observed_loader(recorder: ObservedRecorder, dataset: Any, *, batch_size: int | None = 1,
                    shuffle: bool = False, sampler: Any = None, batch_sampler: Any = None,
                    collate_fn=None, stratum: str = "main", seed: int | None = None,
                    name: str = "train", **kwargs) -> Any:
    """A ``torchdata.stateful_dataloader.StatefulDataLoader`` over ``dataset`` whose batches
    carry their positions, tracked by ``recorder`` under ``name`` (its state is part of
    ``recorder.state_dict()``).

    Arguments as ``recoverydash.integrations.pytorch.observed_loader``; ``shuffle=True`` without
    a sampler uses torchdata's stateful ``RandomSampler`` with a generator seeded by ``seed``.
    kwargs: every other StatefulDataLoader argument (``num_workers``, ``pin_memory``,
    ``persistent_workers``, ``prefetch_factor``, ``snapshot_every_n_steps``, ...). Raises
    ImportError without torchdata."""
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import BatchSampler, RandomSampler

    from recoverydash.integrations._loaders import build

    return build(StatefulDataLoader, recorder, dataset, default_random=RandomSampler,
                 batch_sampler_cls=BatchSampler,
                 batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                 batch_sampler=batch_sampler, collate_fn=collate_fn, stratum=stratum, seed=seed,
                 name=name, kw=kwargs)
