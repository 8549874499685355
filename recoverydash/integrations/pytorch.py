"""Plain PyTorch loops: a ``torch.utils.data.DataLoader`` whose samples carry their positions.

Three lines (a complete script: ``examples/train_plain.py``)::

    rec = ObservedRecorder(rd.init(url, token, run_id), dataset_version="ds-v1")
    loader = observed_loader(rec, dataset, sampler=DistributedSampler(dataset), batch_size=8)
    for batch in loader:
        x, y = rec.observe(batch)                        # where the batch reaches the model
        loss_fn(model(x), y).backward()
        if boundary: optimizer.step(); rec.commit()      # at the optimizer boundary

Resuming: ``save_generation(..., recorder=rec)`` stores ``rec.state_dict()`` as the rank's data
progress; after ``load_generation`` returns it, ``rec.load_state_dict(progress["data_progress"])``
makes the sampler's next iteration of the saved epoch start at the committed cursor (pass
``cursor=plan["cursor"]`` when the world size changed). A loop that restarts its loader at the
epoch's start instead is *observed* doing so: its replay reaches the dashboard as it happened.
"""

from __future__ import annotations

from typing import Any

from recoverydash.sdk.observe import ObservedRecorder


def observed_loader(recorder: ObservedRecorder, dataset: Any, *, batch_size: int | None = 1,
                    shuffle: bool = False, sampler: Any = None, batch_sampler: Any = None,
                    collate_fn=None, stratum: str = "main", seed: int | None = None,
                    **kwargs) -> Any:
    """A ``torch.utils.data.DataLoader`` over ``dataset`` whose batches carry their positions.

    dataset: map-style (wrapped in ``ObservedDataset``; the sampler in a ``PositionSampler``
    tracked by ``recorder``), or an ``ObservedIterableDataset``. sampler / batch_sampler /
    shuffle: as DataLoader's (``shuffle=True`` without a sampler: a ``RandomSampler`` with a
    generator seeded by ``seed``, so the order can be named and re-created). collate_fn: yours
    (default ``default_collate``), wrapped in ``ObservedCollate``. kwargs: every other DataLoader
    argument (``num_workers``, ``pin_memory``, ``persistent_workers``, ``prefetch_factor``, ...).
    Raises ValueError/TypeError as DataLoader does for bad arguments."""
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    from recoverydash.integrations._loaders import build

    return build(DataLoader, recorder, dataset, default_random=RandomSampler,
                 batch_sampler_cls=BatchSampler,
                 batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                 batch_sampler=batch_sampler, collate_fn=collate_fn, stratum=stratum, seed=seed,
                 name=None, kw=kwargs)
