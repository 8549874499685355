"""Megatron-Core datasets (``GPTDataset``, ``BlendedDataset``) with the observed ledger, in tokens
or samples. Its lines (six in the complete loop ``examples/megatron_gpt.py``, marked
``# recoverydash``: docs/integrations/megatron.md)::

    train_ds = ObservedMegatronDataset(train_ds, units="tokens")     # a GPT or Blended dataset
    loader = DataLoader(train_ds, batch_sampler=your_sampler, collate_fn=ObservedCollate())
    ... batch = rec.observe(batch) before the model, rec.commit(update) after optimizer.step() ...

Positions. Megatron's sample order is already global: sample ``i`` of a ``GPTDataset`` is the
``i``-th of its shuffled sample index (document index -> sample index -> shuffle index), and its
pretraining sampler hands out samples ``consumed_samples, consumed_samples + 1, ...`` in global
batches split by data-parallel rank. The position of what a rank received is therefore read from
the index the dataset was asked for, whatever the world size:

* a ``GPTDataset`` is one stratum (named after its path prefix); a ``BlendedDataset`` has one
  stratum per source, and blended index ``i`` is sample ``dataset_sample_index[i]`` of source
  ``dataset_index[i]`` (each source's samples are drawn in increasing order, so every source's
  stratum is consumed front to back with the blend's proportions);
* ``units="tokens"``: sample ``s`` of a source covers the tokens ``[s * L, (s + 1) * L)`` of that
  source's packed stream (``L`` = ``sequence_length``; the extra label token belongs to the next
  sample), so a restart that replays a sample replays ``L`` tokens and one that resumes inside a
  document counts the document's tokens it consumed (docs/definitions.md#units). A batch-padding
  sample (index ``None``) is padding: sent, never counted. ``units="samples"``: position ``s``.
* the order is the dataset's ``unique_description_hash`` (path, split, seed, sequence length,
  number of samples): a relaunch that rebuilds the same index names the same order; one that
  changes it (another ``train_iters``, seed or blend) names another, and positions are not compared
  across them.

The resume cursor is ``consumed_samples`` (what Megatron saves in its checkpoint as
``consumed_train_samples``): :meth:`ObservedMegatronDataset.cursor` turns it into the ledger's
cursor per stratum, the checkpoint's ``data_progress``. A checkpoint whose ``consumed_samples``
lags its model by a step then names a cursor behind the ledger's, and the server rejects it
(``data_cursor_mismatch``). Batch-size ramp-up (``rampup_batch_size``) changes how many samples an
update takes: the ledger records what each update received, so it follows the ramp; the
attempt declares the ramp's final global batch (:func:`attempt_fields`).

Works without CUDA: the datasets and the compiled index helper (``helpers_cpp``, shipped built in
the wheel) run on CPU; the model and the samplers are the trainer's own.
"""

from __future__ import annotations

import logging
import os
from operator import itemgetter
from typing import Any

from recoverydash.sdk.observe import BatchTag, Iteration, TaggedList
from recoverydash.sdk.tokens import TOKENS, DeferredIdentities, TokenRanges, register_identities

log = logging.getLogger("recoverydash.integrations")

_FIRST, _SECOND = itemgetter(0), itemgetter(1)

SAMPLES = "samples"


class ObservedMegatronDataset:
    """A Megatron ``GPTDataset`` or ``BlendedDataset`` whose batches carry their positions.

    dataset: the dataset Megatron built (``BlendedMegatronDatasetBuilder(...).build()[0]``).
    units: ``"tokens"`` (each sample is ``sequence_length`` token positions) or ``"samples"``.
    names: stratum per source (default: the basename of each source's path prefix, made unique).
    Indexing returns what the dataset returns; ``__getitems__`` (what a DataLoader's fetcher
    calls) returns the samples with the batch's tag, for :class:`~recoverydash.sdk.observe.
    ObservedCollate`. Other attributes are the dataset's."""

    def __init__(self, dataset: Any, *, units: str = TOKENS, names: list[str] | None = None):
        if units not in (TOKENS, SAMPLES):
            raise ValueError(f"units must be 'tokens' or 'samples', got {units!r}")
        self.dataset = dataset
        self.units = units
        self.blended = hasattr(dataset, "dataset_index") and hasattr(dataset, "datasets")
        sources = list(dataset.datasets) if self.blended else [dataset]
        self.sources = sources
        self.names = list(names) if names else _names(sources)
        if len(self.names) != len(sources):
            raise ValueError(f"{len(sources)} sources, {len(self.names)} names")
        self.iterations = [self._iteration(name, s) for name, s in zip(self.names, sources,
                                                                        strict=True)]
        self.padding = [Iteration(it.stratum, 0, it.order, length=it.length, padding_from=0,
                                  info=it.info) for it in self.iterations]
        self._starts: dict[int, Any] = {}  # source -> token offset of each document
        # identities are computed on the sender thread, from (source, sample) pairs
        self._key = "megatron:" + "|".join(it.order or "" for it in self.iterations)
        register_identities(self._key, self._resolve)

    def _iteration(self, name: str, source: Any) -> Iteration:
        length = len(source)
        seq = int(source.config.sequence_length)
        info = {"algorithm": f"{type(source).__module__}.{type(source).__qualname__}",
                "units": self.units, "seed": int(source.config.random_seed),
                "shuffle": True, "sequence_length": seq}
        return Iteration(name, 0, str(source.unique_description_hash), length=length * (
            seq if self.units == TOKENS else 1), info=info)

    # -- the dataset protocol --

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, idx: Any) -> Any:
        return self.dataset[idx]

    def __getitems__(self, indices: list) -> TaggedList:
        out = TaggedList(self.dataset[i] for i in indices)
        out.tag = self.tag(indices)
        return out

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    # -- positions --

    def locate(self, idx: int | None) -> tuple[int, int | None]:
        """``(source, sample)`` of dataset index ``idx`` (``sample`` None for Megatron's batch
        padding index ``None``)."""
        if idx is None:
            return 0, None
        if not self.blended:
            return 0, int(idx)
        ds = self.dataset
        if ds.dataset_index is None:  # memory-mapped on first use
            ds[idx]
        return int(ds.dataset_index[idx]), int(ds.dataset_sample_index[idx])

    def tag(self, indices: list) -> BatchTag:
        """The :class:`BatchTag` of a batch of dataset indices: per stratum, the token ranges (or
        sample positions) the batch holds, in batch order; identities are the dataset indices.
        A batch without Megatron's padding index ``None`` is tagged a source at a time (the
        blend's indices looked up at once), one with it sample by sample; the tags are equal."""
        if None in indices:
            return self._tag_each(indices)
        if self.blended:
            import numpy

            ds = self.dataset
            if ds.dataset_index is None:  # memory-mapped on first use
                ds[indices[0]]
            at = numpy.asarray(indices, dtype=numpy.int64)
            sources = numpy.asarray(ds.dataset_index[at], dtype=numpy.int64).tolist()
            samples = numpy.asarray(ds.dataset_sample_index[at], dtype=numpy.int64).tolist()
        else:  # one source: one group, no grouping
            return BatchTag([self._group(0, list(map(int, indices)), list(indices))])
        order: list[int] = []  # the sources in order of first appearance, as _tag_each groups
        picked: dict[int, list[int]] = {}
        for k, source in enumerate(sources):
            got = picked.get(source)
            if got is None:
                got = picked[source] = []
                order.append(source)
            got.append(k)
        return BatchTag([self._group(source, [samples[k] for k in picked[source]],
                                     [indices[k] for k in picked[source]])
                         for source in order])

    def _group(self, source: int, samples: list[int], ids: list) -> tuple:
        """One group of a :class:`BatchTag`: ``(iteration, token ranges or sample positions,
        ids)`` of ``samples`` (sample numbers of ``source``, none of them padding)."""
        it = self.iterations[source]
        if self.units != TOKENS:
            return it, samples, ids
        seq = int(it.info["sequence_length"])
        # the identities' (source, sample) items are made on the sender thread, when needed
        return it, TokenRanges([(p * seq, p * seq + seq) for p in samples],
                               DeferredIdentities(self._key, source=source, samples=samples)), ids

    def _tag_each(self, indices: list) -> BatchTag:
        """:meth:`tag`, sample by sample (a batch holding padding)."""
        groups: dict[int, tuple[Any, TokenRanges | list[int], list[int]]] = {}
        for idx in indices:
            source, sample = self.locate(idx)
            it = self.iterations[source] if sample is not None else self.padding[source]
            seq = int(it.info["sequence_length"])
            entry = groups.get(id(it))
            if entry is None:
                entry = groups[id(it)] = (it, TokenRanges() if self.units == TOKENS else [], [])
            pos = sample if sample is not None else 0
            drawn = entry[1]
            if isinstance(drawn, TokenRanges):
                drawn.append((pos * seq, (pos + 1) * seq))
                if sample is not None:
                    if not isinstance(drawn.identities, DeferredIdentities):
                        drawn.identities = DeferredIdentities(self._key)
                    drawn.identities.items.append((source, sample))
            else:
                positions: list[int] = drawn
                positions.append(pos)
            entry[2].append(idx if idx is not None else -1)
        return BatchTag(list(groups.values()))

    def _resolve(self, items: list) -> list[tuple[int, int]] | None:
        """The identities of ``(source, sample)`` pairs (:meth:`identities`), on the sender
        thread; None when one cannot be named (logged once)."""
        try:
            out: list[tuple[int, int]] = []
            sources = set(map(_FIRST, items))
            if len(sources) == 1:  # one source (always without a blend): no grouping
                return self._pieces(sources.pop(), list(map(_SECOND, items)))
            by_source: dict[int, list[int]] = {}
            for source, sample in items:
                by_source.setdefault(source, []).append(sample)
            for source, samples in by_source.items():
                out += self._pieces(source, samples)
            return out
        except Exception as e:  # noqa: BLE001 - identities are optional; positions stay exact
            if not getattr(self, "_warned", False):
                self._warned = True
                log.warning("recoverydash: the token identities of Megatron samples are unknown "
                            "(%r); a restart that changes the order is then unverified", e)
            return None

    def _pieces(self, source: int, samples: list[int]) -> list[tuple[int, int]]:
        """:meth:`identities` of many samples of one source at once (numpy, one pass)."""
        import numpy

        ds = self.sources[source]
        if ds.shuffle_index is None:
            ds[samples[0]]
        starts = self._doc_starts(source)
        j = numpy.asarray(ds.shuffle_index[numpy.asarray(samples, dtype=numpy.int64)],
                          dtype=numpy.int64)
        first = numpy.asarray(ds.sample_index[j], dtype=numpy.int64)
        last = numpy.asarray(ds.sample_index[j + 1], dtype=numpy.int64)
        b, b_off, e, e_off = first[:, 0], first[:, 1], last[:, 0], last[:, 1]
        count = e - b + 1
        pos = numpy.repeat(b, count) + (numpy.arange(int(count.sum()))
                                        - numpy.repeat(numpy.cumsum(count) - count, count))
        doc = numpy.asarray(ds.document_index[pos], dtype=numpy.int64)
        lo = numpy.where(pos == numpy.repeat(b, count), numpy.repeat(b_off, count), 0)
        hi = numpy.where(pos == numpy.repeat(e, count), numpy.repeat(e_off, count),
                         starts[doc + 1] - starts[doc])
        keep = hi > lo
        return list(zip((starts[doc] + lo)[keep].tolist(), (starts[doc] + hi)[keep].tolist(),
                        strict=True))

    def _doc_starts(self, source: int) -> Any:
        import numpy

        starts = self._starts.get(source)
        if starts is None:
            ds = self.sources[source]
            lengths = numpy.asarray(ds.dataset.sequence_lengths, dtype=numpy.int64)
            starts = self._starts[source] = numpy.concatenate(([0], numpy.cumsum(lengths)))
        return starts

    def identities(self, source: int, sample: int) -> list[tuple[int, int]]:
        """The tokens of sample ``sample`` of ``source`` as ranges of the source's own token
        stream (every document at its offset in document order, ``IndexedDataset`` sequence
        lengths): the document pieces Megatron's sample, document and shuffle indices name, the
        extra label token excluded. Units: tokens."""
        ds = self.sources[source]
        if ds.shuffle_index is None:  # memory-mapped on first use
            ds[sample]
        starts = self._doc_starts(source)
        j = int(ds.shuffle_index[sample])
        b, b_off = (int(x) for x in ds.sample_index[j])
        e, e_off = (int(x) for x in ds.sample_index[j + 1])
        out = []
        for i in range(b, e + 1):
            doc = int(ds.document_index[i])
            lo = b_off if i == b else 0
            hi = e_off if i == e else int(starts[doc + 1] - starts[doc])
            if hi > lo:
                out.append((int(starts[doc]) + lo, int(starts[doc]) + hi))
        return out

    def cursor(self, consumed_samples: int) -> list[dict]:
        """The ledger cursor of Megatron's resume point ``consumed_samples`` (global samples the
        checkpoint's state has consumed), per stratum: ``{"stratum", "epoch": 0, "position",
        "order"}``, the position in this dataset's units (the next sample times
        ``sequence_length`` for tokens). Raises ValueError past the dataset's end."""
        n = int(consumed_samples)
        if n < 0 or n > len(self.dataset):
            raise ValueError(f"consumed_samples {n} outside [0, {len(self.dataset)}]")
        if self.blended:
            import numpy

            ds = self.dataset
            if ds.dataset_index is None:
                ds[0]
            nxt = numpy.bincount(numpy.asarray(ds.dataset_index[:n], dtype=numpy.int64),
                                 minlength=len(self.sources)).tolist()
        else:
            nxt = [n]
        out = []
        for it, count in zip(self.iterations, nxt, strict=True):
            seq = int(it.info["sequence_length"]) if self.units == TOKENS else 1
            out.append({"stratum": it.stratum, "epoch": 0, "position": int(count) * seq,
                        "order": it.order})
        return out

    def sampler_info(self) -> dict:
        """``attempt_started.sampler`` for these strata: ``units``, ``epoch_length`` (in the
        units), the algorithm, seed and sequence length."""
        first = self.iterations[0].info
        return {"ledger": "observed", "algorithm": first["algorithm"], "seed": first["seed"],
                "shuffle": True, "sequence_length": first["sequence_length"],
                "units": {it.stratum: self.units for it in self.iterations},
                "epoch_length": {it.stratum: int(it.length or 0) for it in self.iterations}}


def _names(sources: list) -> list[str]:
    out: list[str] = []
    for s in sources:
        base = os.path.basename(str(getattr(s, "dataset_path", None) or type(s).__name__))
        name, n = base or "megatron", 1
        while name in out:
            n += 1
            name = f"{base}-{n}"
        out.append(name)
    return out


def attempt_fields(dataset: ObservedMegatronDataset, *, global_batch_size: int,
                   micro_batch_size: int, rampup_batch_size: list[int] | None = None) -> dict:
    """The ``ObservedRecorder.start`` fields of a Megatron run: ``global_batch_size`` in the
    ledger's units (the ramp's final global batch times ``sequence_length`` for tokens: the batch
    that bounds the drop-last remainder at the end of the index, docs/definitions.md#units),
    ``micro_batch_size`` and the sampler description, with ``rampup_batch_size`` ([start,
    increment, ramp samples]) when a ramp-up is configured."""
    sampler = dataset.sampler_info()
    if rampup_batch_size:
        sampler["rampup_batch_size"] = [int(x) for x in rampup_batch_size]
    seq = int(sampler["sequence_length"]) if dataset.units == TOKENS else 1
    return {"global_batch_size": int(global_batch_size) * seq,
            "micro_batch_size": int(micro_batch_size), "sampler": sampler}


__all__ = ["ObservedMegatronDataset", "attempt_fields"]
