"""What the plain and torchdata loader builders share."""

from __future__ import annotations

from typing import Any

from recoverydash.sdk.observe import ObservedCollate, ObservedDataset, ObservedRecorder


def build(loader_cls, recorder: ObservedRecorder, dataset: Any, *, default_random,
          batch_sampler_cls, batch_size,
          shuffle: bool, sampler, batch_sampler, collate_fn, stratum: str, seed: int | None,
          name: str | None, kw: dict):
    """``loader_cls`` over ``dataset`` with positions carried (see the public builders)."""
    from torch.utils.data import IterableDataset, SequentialSampler

    collate = ObservedCollate(collate_fn)
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
        if sampler is not None or batch_sampler is not None or shuffle:
            raise ValueError("an iterable dataset has no sampler: wrap it in "
                             "ObservedIterableDataset(dataset, key=...) so that each sample "
                             "says where it comes from")
        loader = loader_cls(dataset, batch_size=batch_size, collate_fn=collate, **kw)
    else:
        if batch_sampler is not None:
            wrapped = recorder.sampler(batch_sampler, stratum=stratum)
            loader = loader_cls(ObservedDataset(dataset), batch_sampler=wrapped,
                                collate_fn=collate, **kw)
        else:
            if sampler is None:
                if shuffle:
                    import torch

                    g = torch.Generator()
                    g.manual_seed(int(seed) if seed is not None else
                                  int(torch.empty((), dtype=torch.int64).random_().item()))
                    sampler = default_random(dataset, generator=g)
                else:
                    sampler = SequentialSampler(dataset)
            elif shuffle:
                raise ValueError("sampler option is mutually exclusive with shuffle")
            if batch_size is None:  # no auto-collation: one draw per sample
                wrapped = recorder.sampler(sampler, stratum=stratum)
                loader = loader_cls(ObservedDataset(dataset), sampler=wrapped, batch_size=None,
                                    collate_fn=collate, **kw)
            else:  # the batches are drawn here, each carrying its positions as a range
                drop_last = kw.pop("drop_last", False)
                wrapped = recorder.sampler(batch_sampler_cls(sampler, batch_size, drop_last),
                                           stratum=stratum)
                loader = loader_cls(ObservedDataset(dataset), batch_sampler=wrapped,
                                    collate_fn=collate, **kw)
    if name is not None:
        recorder.track(loader, name)
    return loader
