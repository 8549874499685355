"""The data ledger of a PyTorch trainer: which positions each optimizer update consumed.

Two recorders send it (``update_committed``, docs/ingest-v1.md#update_committed):

* ``recoverydash.sdk.observe.ObservedRecorder`` (use this one): the positions travel with the
  samples through the loader and are recorded where the model receives them; nothing is inferred.
* :class:`CountingRecorder` (this module), the fallback for loops that cannot carry positions: it
  *infers* positions from a count of samples and the restored cursor (``r + k*W``), so it reports
  what a ``DistributedSampler`` *should* have delivered, not what it did. A loader that replays or
  skips while the counter is right looks exact. Its ``attempt_started.sampler.ledger`` is
  ``"counted"`` so the dashboard says so.

This module also holds what both share: ``order_digest``, ``padded_length``, ``resume_skip``,
``resumed_from`` and ``SkipFirst``.

Positions (docs/ingest-v1.md#3-positions-spans-and-cursors) index the global sample order of one
epoch of one stratum. For ``torch.utils.data.DistributedSampler`` that order is the padded, permuted
index list *before* it is sliced by rank: rank ``r`` of ``W`` owns positions ``r, r+W, r+2W, ...``,
so this rank's k-th sample of the epoch is position ``r + k*W``, and a microbatch of ``b`` samples
is one strided range ``[r + k*W, r + (k+b)*W, W]``. With ``drop_last=False`` the sampler pads the
list to a multiple of ``W`` by repeating its head: positions ``>= len(dataset)`` are those repeats
and are reported in a separate span marked ``"padding": true`` (they are never duplicates).

Usage, with gradient accumulation (a microbatch is never a "step")::

    rec = CountingRecorder.for_sampler(client, sampler, dataset_version="ds-v3")
    rec.start(global_batch_size=..., resumed_from=None)       # attempt_started
    for epoch in range(E):
        sampler.set_epoch(epoch)                               # the recorder notices the epoch
        for i, batch in enumerate(rec.wrap(loader)):           # or rec.consumed(len(batch))
            loss(batch).backward()
            if (i + 1) % accum == 0:
                optimizer.step(); scheduler.step(); update += 1
                rec.commit(update)                             # update_committed (+ heartbeat)

Cursors: the *committed* cursor (``rec.cursor()``, what a checkpoint's ``data_progress`` must hold)
is ``k_committed * W``: everything below was consumed by committed updates. The *read* cursor
(``rec.fetched_cursor()``, sent in heartbeats as ``fetched``) is ``k_read * W`` where ``k_read``
counts what the loader has handed out, committed or not (docs/definitions.md#worked-example: fetched
80,048, committed 80,000). Both assume data-parallel ranks move in lock step, as DDP requires.

The ``order`` digest of an epoch (``order_digest``) is the first 32 hex chars of sha256 over the
canonical JSON of ``{"algorithm": "torch.utils.data.DistributedSampler", "dataset_length": N,
"dataset_version": V, "epoch": e, "seed": s, "shuffle": b}``. World size and ``drop_last`` are left
out on purpose: they change only the padded tail (positions >= N, marked padding) or how much of
the tail is dropped, never which sample a position below N names, so positions stay comparable
across a world-size change. A different seed, epoch, dataset length or version is another order.

Every public method swallows its own errors (logged once): the ledger must never stop training.
A recorder belongs to one training loop thread.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Iterable, Iterator
from typing import Any

from recoverydash.sdk.client import Client

log = logging.getLogger("recoverydash.sdk")

SAMPLER_ALGORITHM = "torch.utils.data.DistributedSampler"
LEDGER_MODE = "counted"
"""``attempt_started.sampler.ledger`` of this recorder: positions inferred from a count."""


def order_digest(*, seed: int, epoch: int, dataset_length: int, shuffle: bool,
                 dataset_version: str | None = None,
                 algorithm: str = SAMPLER_ALGORITHM) -> str:
    """Name of one epoch's order: 32 hex chars of sha256 over the canonical JSON of the inputs
    that decide which sample each position below ``dataset_length`` holds (see module doc)."""
    doc = {"algorithm": algorithm, "dataset_length": int(dataset_length),
           "dataset_version": dataset_version, "epoch": int(epoch), "seed": int(seed),
           "shuffle": bool(shuffle)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
                          ).hexdigest()[:32]


def padded_length(dataset_length: int, world_size: int, drop_last: bool) -> int:
    """Length of DistributedSampler's index list for one epoch (``total_size``), positions."""
    if drop_last and dataset_length % world_size != 0:
        per_rank = math.ceil((dataset_length - world_size) / world_size)
    else:
        per_rank = math.ceil(dataset_length / world_size)
    return per_rank * world_size


def batch_length(batch: Any) -> int:
    """Samples in a batch: ``shape[0]`` of a tensor, of the first element of a tuple/list, of the
    first value of a dict; else ``len(batch)``. Raises TypeError when none applies."""
    while True:
        shape = getattr(batch, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
        if isinstance(batch, (tuple, list)) and batch \
                and not isinstance(batch[0], (int, float, str)):
            batch = batch[0]
            continue
        if isinstance(batch, dict) and batch:
            batch = next(iter(batch.values()))
            continue
        return len(batch)


class Reporter:
    """What both recorders share: the events around the ledger (heartbeat, attempt_ended), the
    commit's event id and periodic heartbeat, and errors logged once. A subclass has ``client``,
    ``rank``, ``update``, ``heartbeat_interval``, ``_last_heartbeat``, ``_errors`` and
    ``fetched_cursor()``; ``_before_event()`` runs before a heartbeat or attempt_ended."""

    client: Client
    rank: int
    update: int
    heartbeat_interval: float
    _last_heartbeat: float
    _errors: set[str]

    def fetched_cursor(self) -> list[dict[str, Any]]:
        """The read cursor (the subclass's)."""
        raise NotImplementedError

    def _before_event(self) -> None:
        pass

    def _commit_suffix(self, update: int) -> str:
        """The event id suffix of ``update_committed`` for ``update`` (a repeated commit keeps
        both reports: it never reuses an event id), and ``self.update`` moved to it."""
        suffix = f"u{update}" if update > self.update else f"u{update}:{time.time_ns()}"
        self.update = max(self.update, int(update))
        return suffix

    def _heartbeat_due(self) -> None:
        if self.heartbeat_interval and \
                time.monotonic() - self._last_heartbeat >= self.heartbeat_interval:
            self.heartbeat()

    def heartbeat(self) -> bool:
        """``heartbeat`` with the last committed update and the read cursor. Never raises."""
        try:
            self._before_event()
            self._last_heartbeat = time.monotonic()
            return self.client.heartbeat(self.update, self.fetched_cursor(), rank=self.rank)
        except Exception as e:
            self._log_once("heartbeat", e)
            return False

    def end(self, reason: str = "completed", message: str | None = None) -> bool:
        """``attempt_ended`` (reason: completed, failed, preempted, cancelled) with the read
        cursor. Never raises."""
        try:
            self._before_event()
            return self.client.attempt_ended(reason, self.update, fetched=self.fetched_cursor(),
                                             message=message, rank=self.rank)
        except Exception as e:
            self._log_once("end", e)
            return False

    def _log_once(self, where: str, e: Exception):
        if where not in self._errors:
            self._errors.add(where)
            log.warning("recoverydash: ledger %s failed (logged once): %r", where, e)


class CountingRecorder(Reporter):
    """Infers the positions one data-parallel rank consumed from a count of samples (module doc:
    the fallback; ``ObservedRecorder`` observes them) and sends them as ``update_committed``.

    Args:
        client: the sender (``Client``); events carry ``rank`` = this data-parallel rank.
        rank, world_size: data-parallel rank ``r`` and number of data-parallel ranks ``W``.
        dataset_length: ``len(dataset)``, samples (N).
        stratum: name of this sample order (one recorder per stratum).
        seed, shuffle, drop_last: the sampler's settings (they decide padding and the order).
        epoch: epoch at creation. With ``sampler`` given, its ``epoch`` attribute is followed.
        dataset_version: identity of the data (also part of the order digest).
        heartbeat_interval: seconds between heartbeats sent from ``commit`` (0: never).
    """

    def __init__(self, client: Client, *, rank: int, world_size: int, dataset_length: int,
                 stratum: str = "main", seed: int = 0, shuffle: bool = True,
                 drop_last: bool = False, epoch: int = 0, dataset_version: str | None = None,
                 sampler: Any = None, heartbeat_interval: float = 30.0):
        self.client = client
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.dataset_length = int(dataset_length)
        self.stratum = stratum
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.dataset_version = dataset_version
        self.heartbeat_interval = heartbeat_interval
        self._sampler = sampler
        self.total_size = padded_length(self.dataset_length, self.world_size, self.drop_last)
        self.per_rank = self.total_size // self.world_size
        # first k whose position r + k*W is padding (>= N)
        self._k_padding = max(0, -(-(self.dataset_length - self.rank) // self.world_size))
        self.update = 0                # last committed optimizer update
        self._epoch = int(epoch)
        self._order = self._digest(self._epoch)
        self._k_committed = 0          # this rank's samples of the epoch behind committed updates
        self._k_consumed = 0           # ... handed to training (committed or pending)
        self._k_read = 0               # ... handed out by the loader
        self._pending: list[tuple[int, str, int, int]] = []  # (epoch, order, k, n) chunks
        self._last_heartbeat = time.monotonic()
        self._errors: set = set()

    @classmethod
    def for_sampler(cls, client: Client, sampler: Any, *, stratum: str = "main",
                    dataset_version: str | None = None, **kw) -> CountingRecorder:
        """A recorder that reads rank, world size, seed, shuffle, drop_last, epoch and dataset
        length from a ``DistributedSampler`` (any object with those attributes)."""
        return cls(client, rank=sampler.rank, world_size=sampler.num_replicas,
                   dataset_length=len(sampler.dataset), stratum=stratum, seed=sampler.seed,
                   shuffle=sampler.shuffle, drop_last=sampler.drop_last, epoch=sampler.epoch,
                   dataset_version=dataset_version, sampler=sampler, **kw)

    @classmethod
    def for_loader(cls, client: Client, loader: Any, **kw) -> CountingRecorder:
        """A recorder for a ``DataLoader`` (or torchdata ``StatefulDataLoader``) whose ``sampler``
        is a ``DistributedSampler``. Raises TypeError when the loader has no such sampler."""
        sampler = getattr(loader, "sampler", None)
        if sampler is None or not hasattr(sampler, "num_replicas"):
            raise TypeError("the loader's sampler is not a DistributedSampler; build the "
                            "recorder with CountingRecorder(client, rank=..., world_size=..., ...)")
        return cls.for_sampler(client, sampler, **kw)

    # -- the hot path --

    def consumed(self, n: int) -> None:
        """This rank handed ``n`` samples (one microbatch) to training. Cost: about a microsecond;
        never raises."""
        try:
            s = self._sampler
            if s is not None and s.epoch != self._epoch:
                self.set_epoch(s.epoch)
            k = self._k_consumed
            self._pending.append((self._epoch, self._order, k, n))
            k += n
            self._k_consumed = k
            self._k_read = max(self._k_read, k)
        except Exception as e:  # pragma: no cover
            self._log_once("consumed", e)

    def fetched(self, n: int) -> None:
        """The loader handed out ``n`` more samples that are not consumed yet (prefetch you track
        yourself); moves the read cursor only."""
        try:
            self._k_read += n
        except Exception as e:  # pragma: no cover
            self._log_once("fetched", e)

    def wrap(self, loader: Iterable) -> Iterator:
        """Iterate ``loader``, recording each batch as consumed (``batch_length(batch)`` samples)
        when it is handed out. The batches are yielded unchanged."""
        for batch in loader:
            try:
                n = batch_length(batch)
            except Exception as e:
                self._log_once("batch_length", e)
                n = 0
            self.consumed(n)
            yield batch

    def commit(self, update: int) -> bool:
        """Send ``update_committed`` for optimizer update ``update`` (>= 1) with the spans consumed
        since the previous commit. Call it after ``optimizer.step()`` (and scheduler and scaler
        steps) at the accumulation boundary. Sends a heartbeat when ``heartbeat_interval`` seconds
        have passed. Returns whether the event was queued; never raises."""
        try:
            pending, self._pending = self._pending, []
            suffix = self._commit_suffix(update)
            self._k_committed = self._k_consumed
            # the spans are built on the sender thread: the training loop only hands over chunks
            ok = self.client._push(_UpdateReport(self, int(update), pending, suffix))
            self._heartbeat_due()
            return ok
        except Exception as e:
            self._log_once("commit", e)
            return False

    def commit_part(self, update: int) -> dict | None:
        """This rank's part of optimizer update ``update`` for an ``update_aggregate``
        (docs/ingest-v1.md#update_aggregate), instead of sending its own ``update_committed``:
        ``{"rank", "spans", "samples"}`` with the spans consumed since the previous commit, the
        same spans :meth:`commit` would send. Hand it to the reporter that gathers the parts
        (``Client.update_aggregate``). Sends a heartbeat when due. Returns None (logged once)
        on an internal error; never raises."""
        try:
            pending, self._pending = self._pending, []
            self._commit_suffix(update)
            self._k_committed = self._k_consumed
            spans, samples = self._spans(pending)
            self._heartbeat_due()
            return {"rank": self.rank, "spans": spans, "samples": samples}
        except Exception as e:
            self._log_once("commit_part", e)
            return None

    # -- epochs, cursors and state --

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: positions restart at 0 under the new epoch's order. Pending
        (uncommitted) chunks keep the epoch they were consumed in."""
        try:
            self._epoch = int(epoch)
            self._order = self._digest(self._epoch)
            self._k_committed = self._k_consumed = self._k_read = 0
        except Exception as e:  # pragma: no cover
            self._log_once("set_epoch", e)

    @property
    def epoch(self) -> int:
        return self._epoch

    def order(self, epoch: int | None = None) -> str:
        """The order digest of ``epoch`` (default: the current one)."""
        return self._order if epoch is None or epoch == self._epoch else self._digest(epoch)

    def cursor(self) -> list[dict]:
        """The committed cursor ``[{"stratum", "epoch", "position"}]``: next position to deliver
        after the committed updates (``k_committed * W``; an exhausted epoch gives its length)."""
        return [self._cursor(self._k_committed)]

    def fetched_cursor(self) -> list[dict]:
        """The read cursor: ``k_read * W`` (everything the loader handed out, committed or not)."""
        return [self._cursor(self._k_read)]

    def _cursor(self, k: int) -> dict:
        return {"stratum": self.stratum, "epoch": self._epoch,
                "position": min(k, self.per_rank) * self.world_size}

    def restore(self, cursor: list[dict] | dict | None, update: int) -> int:
        """Continue from a checkpoint: committed update ``update`` and data cursor ``cursor`` (a
        manifest's ``data_progress.cursor``). Returns the samples this rank must skip in the
        cursor's epoch (``resume_skip``); the loader must skip exactly those, e.g. with
        ``SkipFirst(sampler, skip)``. Never raises (returns 0 on a cursor it cannot read)."""
        try:
            self.update = int(update)
            c = _pick(cursor, self.stratum)
            if c is None:
                self.set_epoch(self._epoch)
                return 0
            epoch, skip = resume_skip(c, rank=self.rank, world_size=self.world_size,
                                      per_rank=self.per_rank)
            self.set_epoch(epoch)
            self._k_committed = self._k_consumed = self._k_read = skip
            return skip
        except Exception as e:
            self._log_once("restore", e)
            return 0

    def state_dict(self) -> dict:
        """The data progress to save with a checkpoint (JSON-able): cursor, update, order and the
        sampler settings. ``checkpoint.save_generation`` writes it as the ``data_progress``
        component."""
        return {"ledger": LEDGER_MODE, "stratum": self.stratum, "epoch": self._epoch,
                "update": self.update,
                "cursor": self.cursor(), "order": self._order, "rank": self.rank,
                "world_size": self.world_size, "dataset_length": self.dataset_length,
                "seed": self.seed, "shuffle": self.shuffle, "drop_last": self.drop_last,
                "dataset_version": self.dataset_version,
                "samples_committed": self._k_committed * self.world_size}

    def sampler_info(self) -> dict:
        """The ``sampler`` object of ``attempt_started`` (docs/ingest-v1.md#attempt_started,
        recommended fields; ``ledger`` is our extension: ``counted``)."""
        return {"algorithm": SAMPLER_ALGORITHM, "ledger": LEDGER_MODE, "seed": self.seed,
                "shuffle": self.shuffle,
                "drop_last": self.drop_last, "epoch_length": {self.stratum: self.dataset_length},
                "padded_length": {self.stratum: self.total_size},
                "units": {self.stratum: "samples"}}

    # -- attempt events --

    def start(self, *, resumed_from: dict | None = None, **fields) -> bool:
        """``attempt_started`` with this recorder's world size, dataset version and sampler.
        ``fields``: ``global_batch_size``, ``micro_batch_size``, ``grad_accum_steps``,
        ``config_digest``, ``contract``... Never raises."""
        try:
            fields.setdefault("sampler", self.sampler_info())
            return self.client.attempt_started(world_size=self.world_size,
                                               dataset_version=self.dataset_version or "unknown",
                                               resumed_from=resumed_from, rank=self.rank, **fields)
        except Exception as e:
            self._log_once("start", e)
            return False

    # -- internals --

    def _digest(self, epoch: int) -> str:
        return order_digest(seed=self.seed, epoch=epoch, dataset_length=self.dataset_length,
                            shuffle=self.shuffle, dataset_version=self.dataset_version)

    def _spans(self, pending: list[tuple[int, str, int, int]]) -> tuple[list[dict], int]:
        """Chunks (epoch, order, k, n) -> spans: contiguous chunks merge into one strided range;
        positions >= N go to a separate ``padding`` span. Returns (spans, samples)."""
        r, w, kp = self.rank, self.world_size, self._k_padding
        merged: list[list] = []
        samples = 0
        for epoch, order, k, n in pending:
            samples += n
            if n <= 0:
                continue
            last = merged[-1] if merged else None
            if last and last[0] == epoch and last[1] == order and last[2] + last[3] == k:
                last[3] += n
            else:
                merged.append([epoch, order, k, n])
        by_key: dict[tuple, dict] = {}
        spans: list[dict] = []
        for epoch, order, k, n in merged:
            end = min(k + n, self.per_rank)  # a loader cannot hand out more than the epoch holds
            for lo, hi, padding in ((k, min(end, kp), False), (max(k, kp), end, True)):
                if hi <= lo:
                    continue
                rng = [r + lo * w, r + hi * w] if w == 1 else [r + lo * w, r + hi * w, w]
                key = (epoch, order, padding)
                span = by_key.get(key)
                if span is None:
                    span = {"stratum": self.stratum, "epoch": epoch, "ranges": [], "order": order}
                    if padding:
                        span["padding"] = True
                    by_key[key] = span
                    spans.append(span)
                span["ranges"].append(rng)
        return spans, samples

class _UpdateReport:
    """An ``update_committed`` whose spans are built when the sender thread sends it."""

    __slots__ = ("pending", "recorder", "suffix", "update")

    def __init__(self, recorder: CountingRecorder, update: int, pending: list, suffix: str):
        self.recorder = recorder
        self.update = update
        self.pending = pending
        self.suffix = suffix

    def materialize(self) -> dict:
        rec = self.recorder
        spans, samples = rec._spans(self.pending)
        return {"type": "update_committed", "update": self.update, "spans": spans,
                "samples": samples, "rank": rec.rank,
                "event_id": rec.client.event_id(self.suffix, rec.rank)}


# --- resuming ------------------------------------------------------------------------------------

def _pick(cursor, stratum: str) -> dict | None:
    if cursor is None:
        return None
    if isinstance(cursor, dict):
        return cursor if cursor.get("stratum", stratum) == stratum else None
    for c in cursor:
        if isinstance(c, dict) and c.get("stratum") == stratum:
            return c
    return None


def resume_skip(cursor: dict, *, rank: int, world_size: int, per_rank: int | None = None
                ) -> tuple[int, int]:
    """Where rank ``rank`` of ``world_size`` resumes: ``(epoch, samples to skip in that epoch)``.

    cursor: ``{"epoch": e, "position": P}`` (positions below P were consumed). Rank r owns
    positions ``r + j*W``; the first one at or past P is ``j = ceil((P - r) / W)``, so the ranks
    together resume exactly at P even when W differs from the world size that wrote the cursor
    (then ranks may get one sample more or less each: keep the same W for an exact resume).
    When ``per_rank`` (samples per rank per epoch) is given and the skip reaches it, the epoch is
    over: ``(e + 1, 0)``."""
    epoch = int(cursor.get("epoch", 0))
    p = int(cursor.get("position", 0))
    skip = max(0, -(-(p - rank) // world_size))
    if per_rank is not None and skip >= per_rank:
        return epoch + 1, 0
    return epoch, skip


def resumed_from(checkpoint: Any) -> dict | None:
    """The ``resumed_from`` object of ``attempt_started`` for a restored checkpoint.

    checkpoint: a manifest document, a ``Restorable`` from ``select_restorable`` / a plan from
    ``restore_plan`` (anything with ``generation_id``, ``update`` and a cursor), or None for a
    fresh start. Returns ``{"generation_id", "update", "cursor"}`` or None."""
    if checkpoint is None:
        return None
    get = checkpoint.get if isinstance(checkpoint, dict) else \
        (lambda k, d=None: getattr(checkpoint, k, d))
    cursor = get("cursor")
    if cursor is None:
        cursor = (get("data_progress") or {}).get("cursor", [])
    return {"generation_id": get("generation_id"), "update": int(get("update") or 0),
            "cursor": list(cursor or [])}


class SkipFirst:
    """A sampler wrapper that skips the first ``skip`` indices of epoch ``epoch`` (once), so a
    ``DistributedSampler`` resumes mid-epoch at a committed cursor. Other epochs pass through.

        skip = recorder.restore(cursor, update)
        loader = DataLoader(ds, sampler=SkipFirst(sampler, skip, recorder.epoch), ...)

    ``set_epoch`` is forwarded; ``len`` is the number of indices the next iteration yields."""

    def __init__(self, sampler: Any, skip: int, epoch: int):
        self.sampler = sampler
        self.skip = int(skip)
        self.skip_epoch = int(epoch)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def _skipping(self) -> bool:
        return self.skip > 0 and self.sampler.epoch == self.skip_epoch

    def __iter__(self):
        it = iter(self.sampler)
        if self._skipping():
            n, self.skip = self.skip, 0
            for _ in range(n):
                next(it, None)
        return it

    def __len__(self) -> int:
        return len(self.sampler) - (self.skip if self._skipping() else 0)
