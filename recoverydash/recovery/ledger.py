"""The data ledger: compact per-attempt state, how it absorbs reports, and how it is stored.

The lineage across attempts is :mod:`.lineage`; counting (docs/definitions.md#counting) is
:mod:`.counting`. This module answers their questions about one attempt's updates (positions of a
segment, its frontier, its first positions, update counts and times) from runs and bitmaps.

:class:`Ledger` holds every `update_committed` report of a run in compact form, per attempt:

* *runs* ``[rank, key, slot, u0, u1, a, adv, m, s]``: one data-parallel rank's ``slot``-th range of
  a position key, repeated over updates ``u0..u1`` and advancing by ``adv`` positions per update
  (see :mod:`.positions`). A rank that reports the same shape every update costs one run for the
  whole attempt, whatever the number of updates;
* *pieces*: ``{key: {(update, rank): BitMap64}}`` for what is not a run (sample ids, overlapping
  ranges of one report, reports united after a re-send);
* per rank a bitmap of absorbed updates, the attempt's updates (64-bit bitmaps, updates below
  2**63), and the first report time of every update, in chunks of 64 consecutive updates (far
  apart updates cost a chunk each, never the gap between them).

Incremental contract. :meth:`Ledger.absorb` takes new :class:`~.inputs.LedgerRecord` objects in
O(1) each (amortised) and in any order; a record whose ``(attempt, update, rank)`` is already
absorbed is united with what is there (an identical re-send is a no-op, new positions split the run
and become a piece), so the absorbed state always equals the state built from all records at once.
Nothing ever needs a full re-read of the ledger. Groups of reports that continue the previous
update's group exactly (the DistributedSampler shape, W ranks x one range per key) take a batch
fast path (:class:`_Lane`) that compares each report with a template in C and extends the runs
once per call; it yields the same state as the general path (tests/recovery/
test_absorb_fast_path.py). :meth:`Ledger.to_bytes` /
:meth:`Ledger.from_bytes` store and load the state as one value (a zlib-compressed JSON head with
serialized roaring bitmaps, then the per-update times as raw bytes); :meth:`Ledger.to_parts` /
:meth:`Ledger.from_parts` as a head and blocks of 4,096 updates' times, giving only the blocks
written since the load, so that what a caller stores per analysis does not grow with the run.
The analysis reads the ledger only through runs and bitmaps, so its cost grows with the number of
runs, pieces, generations and attempts, not with the number of updates.
"""
from __future__ import annotations

import base64
import json
import math
import sys
import zlib
from array import array
from dataclasses import dataclass, field
from itertools import count as _steps
from operator import attrgetter
from typing import Any, cast

from pyroaring import BitMap, BitMap64

from .counting import KeyCount
from .heartbeats import HeartbeatFold
from .inputs import LedgerRecord
from .positions import (
    MAX_RANGE_LENGTH,
    POSITION_LIMIT,
    add_group,
    identity_position,
    index_set,
    range_positions,
    span_key,
    wire_range,
)

RANK, KEY, SLOT, U0, U1, A, ADV, M, S = range(9)
_RANK, _SPANS, _UPDATE, _ATTEMPT, _TIME = map(attrgetter, ("rank", "spans", "update", "attempt",
                                                          "time"))
#: Rank under which a report with a null rank (a coordinator's global view) is kept.
COORDINATOR_RANK = -1
#: Upper bound (exclusive) of an update number in a ledger record (like positions: 64-bit
#: bitmaps of updates); a larger one raises ValueError.
UPDATE_LIMIT = 2 ** 63
#: Report times are kept in chunks of 2**TIME_SHIFT consecutive updates (see AttemptLedger).
TIME_SHIFT = 6
TIME_MASK = (1 << TIME_SHIFT) - 1
_EMPTY_CHUNK = array("d", [math.inf]) * (1 << TIME_SHIFT)
#: :meth:`Ledger.to_parts` stores times in blocks of 2**TIME_BLOCK_SHIFT chunks (4,096
#: consecutive updates, at most 32 KiB); a block is given to be written again only when one of
#: its times changed (``AttemptLedger.dirty``).
TIME_BLOCK_SHIFT = 6
_BLOCK_SHIFT = TIME_SHIFT + TIME_BLOCK_SHIFT  # update >> _BLOCK_SHIFT: its block
#: dataset indices below this are packed with their update's offset in its block
#: (:attr:`AttemptLedger.idents`); larger ones are kept per update (``wide``)
_IDENT_LIMIT = 2 ** 32
_IDENT_MASK = (1 << _BLOCK_SHIFT) - 1
#: First 8 bytes of a format 6 time block that also holds dataset indices (a chunk index is
#: never negative): then the length of the indices' part (8 bytes), that part (zlib JSON), and
#: the block's times as before.
_IDENT_MARK = (-1).to_bytes(8, "little", signed=True)
#: Format of :meth:`Ledger.to_bytes`. 4 adds the heartbeat fold (:mod:`.heartbeats`): a state of
#: an older format loads (``state_format`` says which) but holds no heartbeats, so the worker
#: rebuilds it from the rows. 5 holds what 4 holds, laid out so that the per-update times are
#: raw bytes outside the compressed JSON head (and the update bitmaps run-length optimised):
#: writing and reading them is a copy, not a base64 + JSON + zlib pass over the history.
#: 6 is format 5 in parts (:meth:`Ledger.to_parts`): a head, and the times in blocks of
#: 4,096 updates, each written again only when it changed: what the worker stores.
_FORMAT = 6
STATE_FORMAT = _FORMAT
#: The oldest format that holds everything an incremental caller needs (the heartbeat fold):
#: a state of it or newer is continued (and written again in :data:`STATE_FORMAT`), an older
#: one rebuilt from the rows.
CONTINUED_FORMAT = 4
#: First bytes of a format 5 state and of a format 6 head (a zlib stream, formats 1-4, starts
#: otherwise).
_MAGIC = b"RDLS\x05"
_MAGIC6 = b"RDLS\x06"


@dataclass
class AttemptLedger:
    """Compact ledger of one attempt (see the module docstring)."""

    runs: list = field(default_factory=list)
    pieces: dict = field(default_factory=dict)
    absorbed: dict = field(default_factory=dict)
    updates: BitMap64 = field(default_factory=BitMap64)
    #: earliest report time per update, in chunks: ``{update >> TIME_SHIFT: array("d")}`` of
    #: 2**TIME_SHIFT slots (inf: not reported). Consecutive updates cost 8 bytes each, and far
    #: apart updates one chunk each, whatever the gap between them.
    times: dict = field(default_factory=dict)
    open: dict = field(default_factory=dict)
    #: blocks of ``times`` (chunk index >> TIME_BLOCK_SHIFT) written since the state was loaded
    #: by :meth:`Ledger.from_parts` (every block of a state built or loaded otherwise): what
    #: :meth:`Ledger.to_parts` gives to be stored again
    dirty: set = field(default_factory=set, compare=False, repr=False)
    #: the dataset indices the reports named (a span's ``indices``, docs/ingest-v1.md#3-
    #: positions-spans-and-cursors), ranks united: ``{key: {block: BitMap64}}``, per block of
    #: 4,096 updates (``update >> _BLOCK_SHIFT``, the time blocks) the packed values
    #: ``(update & 4095) << 32 | index`` of its indices below 2**32 ...
    idents: dict = field(default_factory=dict)
    #: ... and ``{key: {update: BitMap64}}`` of larger indices
    wide: dict = field(default_factory=dict)
    #: ``{key: {rank: BitMap64 of updates}}``: which reports of the key carried indices
    ident_ranks: dict = field(default_factory=dict)
    _groups: dict | None = None

    def note_indices(self, key: tuple, update: int, rank: int, indices: BitMap64) -> None:
        """Keep the dataset ``indices`` rank ``rank`` reported for ``key`` at ``update`` (united
        with what the update holds)."""
        self.ident_ranks.setdefault(key, {}).setdefault(rank, BitMap64()).add(update)
        if not indices:
            return
        block = update >> _BLOCK_SHIFT
        self.dirty.add(block)
        if indices.max() >= _IDENT_LIMIT:
            small = BitMap64(i for i in indices if i < _IDENT_LIMIT)
            self.wide.setdefault(key, {}).setdefault(update, BitMap64()).update(
                i for i in indices if i >= _IDENT_LIMIT)
            indices = small
        if indices:
            packed = self.idents.setdefault(key, {}).get(block)
            moved = indices.shift((update & _IDENT_MASK) << 32)
            if packed is None:
                self.idents[key][block] = moved
            else:
                packed |= moved

    def indices_in(self, key: tuple, after: int, upto: int | None) -> BitMap64:
        """The dataset indices the reports of ``key`` named in updates ``after < u <= upto``
        (``upto`` None: no bound), ranks united."""
        out = BitMap64()
        hi = math.inf if upto is None else upto
        for block, packed in self.idents.get(key, {}).items():
            first = block << _BLOCK_SHIFT
            last = first + _IDENT_MASK
            if last <= after or first > hi:
                continue
            if after < first and last <= hi:
                out.update(v & 0xFFFFFFFF for v in packed)
            else:
                lo, top = max(after + 1, first) - first, min(hi, last) - first
                out.update(v & 0xFFFFFFFF for v in packed if lo <= v >> 32 <= top)
        for update, bitmap in self.wide.get(key, {}).items():
            if after < update <= hi:
                out |= bitmap
        return out

    def unindexed(self, key: tuple, after: int, upto: int | None) -> int:
        """How many reports ``(update, rank)`` of ``key`` in updates ``after < u <= upto``
        carried positions but no ``indices`` (0: every one named its samples)."""
        hi = math.inf if upto is None else upto
        by_rank: dict = {}
        for run in self.runs:
            if run[KEY] == key and run[U0] <= hi and run[U1] > after:
                mine = by_rank.setdefault(run[RANK], BitMap64())
                mine.add_range(max(run[U0], after + 1), int(min(run[U1], hi)) + 1)
        for (update, rank) in self.pieces.get(key, {}):
            if after < update <= hi:
                by_rank.setdefault(rank, BitMap64()).add(update)
        named = self.ident_ranks.get(key, {})
        return sum(len(updates - named[rank]) if rank in named else len(updates)
                   for rank, updates in by_rank.items())

    def note_time(self, update: int, when: float) -> None:
        """Keep the earliest report time of ``update`` (a NaN time is never kept)."""
        index = update >> TIME_SHIFT
        chunk = self.times.get(index)
        if chunk is None:
            chunk = self.times[index] = _EMPTY_CHUNK * 1
            self.dirty.add(index >> TIME_BLOCK_SHIFT)
        if when < chunk[update & TIME_MASK]:
            chunk[update & TIME_MASK] = when
            self.dirty.add(index >> TIME_BLOCK_SHIFT)

    def update_time(self, update: int) -> float | None:
        """Earliest report time of ``update`` (POSIX seconds), None if never reported."""
        chunk = self.times.get(update >> TIME_SHIFT)
        if chunk is None or chunk[update & TIME_MASK] == math.inf:
            return None
        return chunk[update & TIME_MASK]

    def complete_top(self, world_size: int | None) -> int | None:
        """The highest update every rank's part of which is in: reported by a coordinator
        (rank None), or by ``world_size`` distinct data-parallel ranks (docs/definitions.md#
        updates-counted-once-complete). None when no update is complete; the highest update
        when ``world_size`` is unknown (every report counts as complete then)."""
        if not self.updates:
            return None
        top = self.updates.max()
        if not world_size:
            return top
        coordinator = self.absorbed.get(COORDINATOR_RANK)
        best = coordinator.max() if coordinator else None
        ranks = [bm for rank, bm in self.absorbed.items() if rank >= 0 and bm]
        if len(ranks) < world_size:
            return best
        # the common case: the newest update or one just below it is complete
        for update in range(top, max(-1, top - 8), -1):
            if best is not None and update <= best:
                return best
            if sum(1 for bm in ranks if update in bm) >= world_size:
                return update
        if len(ranks) == world_size:
            both = ranks[0]
            for bm in ranks[1:]:
                both = both & bm
            found = both.max() if both else None
        else:  # more rank numbers than the world size: count per update, newest first
            updates = self.updates
            found = next((updates[i] for i in range(len(updates) - 1, -1, -1)
                          if sum(1 for bm in ranks if updates[i] in bm) >= world_size), None)
        if best is None or (found is not None and found > best):
            return found
        return best

    def reported_by(self, when: float) -> int | None:
        """The highest update whose earliest report time is at or before ``when`` (POSIX
        seconds), None if none."""
        for index in sorted(self.times, reverse=True):
            chunk = self.times[index]
            if min(chunk) <= when:
                slot = max(i for i, t in enumerate(chunk) if t <= when)
                return (index << TIME_SHIFT) | slot
        return None

    def groups(self) -> dict:
        """Runs grouped by key and geometry: ``{key: [(u0, u1, adv, m, s, starts, nruns)]}``,
        ``starts`` sorted and distinct, ``nruns`` the number of runs (ranks) in the group."""
        if self._groups is None:
            by_shape: dict = {}
            for run in self.runs:
                by_shape.setdefault((run[KEY], run[U0], run[U1], run[ADV], run[M], run[S]),
                                    []).append(run[A])
            groups: dict = {}
            for (key, u0, u1, adv, m, s), starts in by_shape.items():
                groups.setdefault(key, []).append(
                    (u0, u1, adv, m, s, sorted(set(starts)), len(starts)))
            self._groups = groups
        return self._groups

    def keys(self) -> set:
        """Every position key this attempt consumed."""
        return set(self.groups()) | {k for k, p in self.pieces.items() if p}


class Ledger:
    """Compact, serialisable ledger of a run (see the module docstring)."""

    def __init__(self) -> None:
        self.attempts: dict[int, AttemptLedger] = {}
        self.id_strata: set[str] = set()
        #: strata of sample ids of which some id is not an int in [0, 2**63) (hashed to a
        #: position): their ids are no dataset indices, so [0, epoch_length) means nothing there
        self.hashed_strata: set[str] = set()
        #: the run's heartbeats, folded (read cursors, last beat per rank, chart points)
        self.beats = HeartbeatFold()
        #: the format this state was loaded from (:data:`STATE_FORMAT` when built here)
        self.state_format = _FORMAT
        self._segments: dict = {}

    @classmethod
    def from_records(cls, records) -> Ledger:
        """A ledger holding ``records`` (an iterable of LedgerRecord)."""
        ledger = cls()
        ledger.absorb(records)
        return ledger

    def attempt(self, number: int) -> AttemptLedger:
        """The compact ledger of attempt ``number`` (empty if it reported nothing)."""
        state = self.attempts.get(number)
        if state is None:
            state = self.attempts[number] = AttemptLedger()
        return state

    # ----------------------------------------------------------------------------- absorbing
    def absorb(self, records, fast: bool = True) -> int:
        """Absorb LedgerRecords; returns how many were absorbed. O(1) amortised per record for
        the common shape (one range per span, continuing the rank's previous update).

        Records are taken in consecutive groups of one ``(attempt, update)``. When a group
        repeats, shifted by each run's advance, exactly what the same ranks reported in the
        previous group (the DistributedSampler shape: W ranks, each one range per key), it is
        checked against a template in one pass and absorbed by extending the runs, without any
        per-span bookkeeping (see :class:`_Lane`); any other group goes through the general path,
        record by record. ``fast=False`` uses the general path only (same resulting state; kept
        for the tests and as the benchmark's baseline).

        Raises ValueError on a malformed range (see :func:`.positions.wire_range`); the records
        before the malformed one stay absorbed."""
        touched: set = set()
        if not fast:
            try:
                return self._absorb_each(records, touched)
            finally:
                self._invalidate(touched)
        records = records if type(records) is list else list(records)
        count = len(records)
        lanes: dict = {}     # attempt -> _Lane, alive while its groups keep matching
        backoff: dict = {}   # attempt -> [failed tries in a row, groups to skip before the next]
        try:
            i = 0
            while i < count:
                rec = records[i]
                attempt, update = rec.attempt, rec.update
                lane = lanes.get(attempt)
                if lane is not None:
                    j = i + lane.width
                    if update == lane.update + 1 and j <= count and lane.take(records, i, j):
                        i = j
                        continue
                    lane.flush()
                    del lanes[attempt]
                    if lane.taken:
                        backoff.pop(attempt, None)
                    else:
                        _missed(backoff, attempt)
                j = i + 1
                while j < count and records[j].update == update and records[j].attempt == attempt:
                    j += 1
                self._absorb_each(records[i:j], touched)
                wait = backoff.get(attempt)
                if wait is not None and wait[1] > 0:
                    wait[1] -= 1
                else:
                    lane = _Lane.build(self.attempts[attempt], update, records, i, j)
                    if lane is None:
                        _missed(backoff, attempt)
                    else:
                        lanes[attempt] = lane
                        touched.add(attempt)
                i = j
        finally:
            for lane in lanes.values():
                lane.flush()
            self._invalidate(touched)
        return count

    def absorb_plain(self, rows) -> int:
        """Absorb ledger reports given as rows ``(attempt, update, rank, time, spans, stratum,
        epoch, start, stop, step)``; returns how many. A ``stratum`` (a str) stands for the
        common report shape, one span of one range without ``order``, padding or ids:
        ``[{"stratum": stratum, "epoch": epoch, "ranges": [[start, stop]]}]`` (``step`` None)
        or ``[[start, stop, step]]`` (``spans`` is ignored); with ``stratum`` None, ``spans``
        are the wire spans and the other four are ignored.

        Exactly :meth:`absorb` of the same records in the same order (the resulting state is
        the same, byte for byte in :meth:`to_bytes`): :meth:`absorb_folded` of the same rows,
        each holding one rank. Raises what :meth:`absorb` raises; the rows before the
        malformed one stay absorbed."""
        return self.absorb_folded((attempt, update, rank, 1, 0, when, spans, stratum, epoch,
                                   None, start, stop, step)
                                  for attempt, update, rank, when, spans, stratum, epoch, start,
                                  stop, step in rows)

    def absorb_folded(self, rows) -> int:
        """Absorb folded ledger rows (docs/ingest-v1.md#update_aggregate, "Storage")
        ``(attempt, update, rank, ranks, shift, time, spans, stratum, epoch, order, start,
        stop, step)``: one row holds the reports of ranks ``rank .. rank + ranks - 1`` of one
        update, all at ``time``, rank ``rank + k``'s being rank ``rank``'s with every range's
        start and stop moved by ``k * shift`` positions (the step kept); ``rank`` None is the
        coordinator (``ranks`` 1). A ``stratum`` (a str) stands for the common report shape,
        one span of one range without padding, ids or indices, ``order`` None or a str:
        rank ``rank``'s spans are ``[{"stratum": stratum, "epoch": epoch, "ranges": [[start,
        stop]], "order": order}]`` (``step`` None: a two-item range; no ``order`` key when it
        is None) and ``spans`` is ignored; with ``stratum`` None, ``spans`` are rank
        ``rank``'s wire spans and the other five are ignored. Returns how many rank reports
        were absorbed (the sum of ``ranks``).

        Exactly :meth:`absorb` of the unfolded records (each row's ranks in rank order, rows
        in the order given): the resulting state is the same, byte for byte in
        :meth:`to_bytes` (tests/recovery/test_absorb_fast_path.py). A rank's report of the
        common shape that extends its open run by one update does only that, without building
        the record; every other report goes through the general path as its record. And a row
        of the common shape whose ranks each extend their open run, all by one advance (a
        DistributedSampler update's reports folded into one row: :class:`_Band`), makes the
        next update's row of the same ranks, shift and key cost O(1) when it continues them,
        whatever its number of ranks (the runs are extended once per call). Raises what
        :meth:`absorb` raises; the reports before the malformed one stay absorbed."""
        touched: set = set()
        # attempt -> ({(rank, ranks, shift, stratum, epoch, order): _Band}, {rank: _Band}):
        # the bands alive, which never share a rank
        bands: dict = {}
        count = 0
        # set on the first record (``current`` None is no attempt's number)
        current: int | None = None
        state = cast(AttemptLedger, None)
        try:
            for (attempt, update, rank, ranks, shift, when, spans, stratum, epoch, order,
                 start, stop, step) in rows:
                count += ranks
                if bands and _banded(bands, attempt, update, rank, ranks, shift, when, stratum,
                                     epoch, order, start, stop, step):
                    continue
                if attempt != current:
                    current = attempt
                    state = self.attempt(attempt)
                    touched.add(attempt)
                    absorbed, opened = state.absorbed, state.open
                if stratum is None:
                    self._absorb_each(_unfolded(attempt, update, rank, ranks, shift, when, spans),
                                      touched)
                    continue
                key = (stratum, epoch, order)
                stride = 1 if step is None else step
                for mine_rank, lo, hi in ((rank, start, stop),) if ranks == 1 else \
                        zip(range(rank, rank + ranks), _steps(start, shift), _steps(stop, shift)):
                    seen = absorbed.get(mine_rank)  # None for the coordinator (rank None)
                    if seen is not None and 0 <= update < UPDATE_LIMIT and update not in seen \
                            and 0 <= lo < hi < POSITION_LIMIT and stride >= 1 \
                            and hi - lo <= MAX_RANGE_LENGTH:
                        run = opened.get((mine_rank, key, 0))
                        if run is not None and run[U1] == update - 1 and run[S] == stride \
                                and run[M] == (hi - lo + stride - 1) // stride:
                            if run[U1] == run[U0]:
                                run[ADV] = lo - run[A]
                            elif lo != run[A] + (update - run[U0]) * run[ADV]:
                                run = None
                            if run is not None:
                                run[U1] = update
                                state.note_time(update, when)
                                seen.add(update)
                                state.updates.add(update)
                                continue
                    elif seen is not None and update in seen and stride >= 1 and _read_again(
                            state, opened.get((mine_rank, key, 0)), update, lo, hi, stride,
                            when):
                        continue
                    self._absorb_each([LedgerRecord(attempt, update, mine_rank, when, [
                        _common_span(stratum, epoch, order, lo, hi, step)])], touched)
                if ranks > 1 and rank is not None:
                    _keep_band(bands, state, attempt, update, rank, ranks, shift, stratum, epoch,
                               order, start, stop, stride)
        finally:
            for keyed, _owners in bands.values():
                for band in keyed.values():
                    band.flush()
            self._invalidate(touched)
        return count

    def _invalidate(self, touched: set) -> None:
        for number in touched:
            self.attempts[number]._groups = None
        self._segments = {h: v for h, v in self._segments.items() if h[0] not in touched}

    def _absorb_each(self, records, touched: set) -> int:
        """The general path of :meth:`absorb`: record by record, any shape, any order."""
        count = 0
        # set on the first record (``current`` None is no attempt's number)
        current: int | None = None
        state = cast(AttemptLedger, None)
        for rec in records:
            count += 1
            if rec.attempt != current:
                current = rec.attempt
                found = self.attempts.get(current)
                state = found if found is not None else self.attempt(current)
                touched.add(current)
                absorbed, opened, runs = state.absorbed, state.open, state.runs
                last_added = None
            rank = COORDINATOR_RANK if rec.rank is None else rec.rank
            update = rec.update
            if not 0 <= update < UPDATE_LIMIT:
                raise ValueError(f"update {update!r} of attempt {rec.attempt}: need "
                                 f"0 <= update < 2**63")
            chunk = state.times.get(update >> TIME_SHIFT)
            if chunk is not None:
                if rec.time < chunk[update & TIME_MASK]:
                    chunk[update & TIME_MASK] = rec.time
                    state.dirty.add(update >> _BLOCK_SHIFT)
            else:
                state.note_time(update, rec.time)
            seen = absorbed.get(rank)
            if seen is None:
                seen = absorbed[rank] = BitMap64()
            if update in seen:
                self._absorb_again(state, rank, update, rec.spans)
                runs = state.runs
                continue
            seen.add(update)
            if update != last_added:
                state.updates.add(update)
                last_added = update
            spans = rec.spans
            if not spans:
                continue
            if not _extend_plain(opened, runs, rank, update, spans):
                self._absorb_general(state, rank, update, spans)
        return count

    @staticmethod
    def _extend(state: AttemptLedger, rank: int, key: tuple, slot: int, update: int,
                item) -> None:
        start, stop = item[0], item[1]
        step = item[2] if len(item) > 2 else 1
        if not (0 <= start <= stop < POSITION_LIMIT) or step < 1 \
                or stop - start > MAX_RANGE_LENGTH:
            wire_range(item)  # raises with the message
        m = len(range(start, stop, step))
        if m == 0:
            return
        handle = (rank, key, slot)
        run = state.open.get(handle)
        if run is not None and run[U1] == update - 1 and run[M] == m and run[S] == step:
            if run[U1] == run[U0]:
                run[ADV] = start - run[A]
                run[U1] = update
                return
            if start == run[A] + (update - run[U0]) * run[ADV]:
                run[U1] = update
                return
        run = [rank, key, slot, update, update, start, 0, m, step]
        state.runs.append(run)
        state.open[handle] = run

    def _absorb_general(self, state: AttemptLedger, rank: int, update: int, spans) -> None:
        by_key: dict = {}
        for span in spans:
            if span.get("padding"):
                continue
            entry = by_key.setdefault(span_key(span), [[], []])
            if span.get("ids") is not None:
                self._note_ids(span["stratum"], span["ids"])
                entry[1].extend(span["ids"])
            entry[0].extend(span.get("ranges") or ())
        self._note_indices(state, rank, update, spans)
        for key, (ranges, ids) in by_key.items():
            parts = sorted((wire_range(item) for item in ranges), key=lambda r: r.start)
            parts = [r for r in parts if len(r)]
            if not ids and (len(parts) <= 1 or _disjoint(parts)):
                for slot, r in enumerate(parts):
                    self._extend(state, rank, key, slot, update, [r.start, r.stop, r.step])
                continue
            bitmap = BitMap64()
            for r in parts:
                bitmap.update(r)
            bitmap.update(identity_position(i) for i in ids)
            if bitmap:
                state.pieces.setdefault(key, {})[(update, rank)] = bitmap

    @staticmethod
    def _note_indices(state: AttemptLedger, rank: int, update: int, spans) -> None:
        """Keep the ``indices`` of the spans (of positions, not padding) of one report."""
        found: dict = {}
        for span in spans:
            items = span.get("indices")
            if items is None or span.get("padding") or span.get("ranges") is None:
                continue
            found.setdefault(span_key(span), BitMap64()).update(index_set(items))
        for key, indices in found.items():
            state.note_indices(key, update, rank, indices)

    def _note_ids(self, stratum: str, ids) -> None:
        """``stratum`` is reported as sample ids; note when some id is not an int index."""
        self.id_strata.add(stratum)
        if stratum not in self.hashed_strata \
                and not all(type(i) is int and 0 <= i < POSITION_LIMIT for i in ids):
            self.hashed_strata.add(stratum)

    def integer_id_strata(self) -> set:
        """Strata reported as sample ids that are all ints in ``[0, 2**63)`` (their own
        positions, dataset indices): the ones whose ids in ``[0, epoch_length)`` can be owed
        (docs/definitions.md#sample-id-strata)."""
        return self.id_strata - self.hashed_strata

    def _content(self, state: AttemptLedger, rank: int, update: int) -> dict:
        """Positions of one (rank, update) per key, from runs and pieces."""
        out: dict = {}
        for run in state.runs:
            if run[RANK] == rank and run[U0] <= update <= run[U1]:
                start = run[A] + (update - run[U0]) * run[ADV]
                out.setdefault(run[KEY], BitMap64()).update(range_positions(start, run[M],
                                                                           run[S]))
        for key, pieces in state.pieces.items():
            piece = pieces.get((update, rank))
            if piece is not None:
                out.setdefault(key, BitMap64()).update(piece)
        return out

    def _absorb_again(self, state: AttemptLedger, rank: int, update: int, spans) -> None:
        """Unite a report with what the same (attempt, update, rank) already reported."""
        for span in spans:
            if span.get("ids") is not None and not span.get("padding"):
                self._note_ids(span["stratum"], span["ids"])
        self._note_indices(state, rank, update, spans)
        old = self._content(state, rank, update)
        new = _report_bitmaps(spans)
        if all(key in old and bitmap.issubset(old[key]) for key, bitmap in new.items()):
            return
        for key, bitmap in new.items():
            old.setdefault(key, BitMap64()).update(bitmap)
        self._remove(state, rank, update)
        for key, bitmap in old.items():
            state.pieces.setdefault(key, {})[(update, rank)] = bitmap

    @staticmethod
    def _remove(state: AttemptLedger, rank: int, update: int) -> None:
        """Take (rank, update) out of its runs (splitting them) and pieces."""
        kept = []
        for run in state.runs:
            if run[RANK] != rank or not run[U0] <= update <= run[U1]:
                kept.append(run)
                continue
            handle = (run[RANK], run[KEY], run[SLOT])
            was_open = state.open.get(handle) is run
            if was_open:
                del state.open[handle]
            if run[U0] < update:
                left = list(run)
                left[U1] = update - 1
                kept.append(left)
            if update < run[U1]:
                right = list(run)
                right[U0] = update + 1
                right[A] = run[A] + (update + 1 - run[U0]) * run[ADV]
                kept.append(right)
                if was_open:
                    state.open[handle] = right
        state.runs = kept
        for pieces in state.pieces.values():
            pieces.pop((update, rank), None)

    # ----------------------------------------------------------------------------- queries
    def segment(self, number: int, after: int, upto: int | None) -> dict:
        """Positions consumed by attempt ``number`` in updates ``after < u <= upto``:
        ``{key: KeyCount}``. Cached until the next absorb; callers must not mutate the result."""
        handle = (number, after, upto)
        cached = self._segments.get(handle)
        if cached is not None:
            return cached
        out: dict = {}
        state = self.attempts.get(number)
        if state is not None:
            hi = math.inf if upto is None else upto
            for key, groups in state.groups().items():
                for (u0, u1, adv, m, s, starts, nruns) in groups:
                    lo_u, hi_u = max(u0, after + 1), min(u1, hi)
                    if lo_u > hi_u:
                        continue
                    count = out.get(key)
                    if count is None:
                        count = out[key] = KeyCount()
                    n = hi_u - lo_u + 1
                    shift = (lo_u - u0) * adv
                    count.consumed += n * m * nruns
                    add_group(count.positions, n, [a + shift for a in starts], adv, m, s)
            for key, pieces in state.pieces.items():
                for (update, _rank), bitmap in pieces.items():
                    if after < update <= hi:
                        count = out.get(key)
                        if count is None:
                            count = out[key] = KeyCount()
                        count.consumed += len(bitmap)
                        count.positions |= bitmap
        self._segments[handle] = out
        return out

    def identities(self, number: int, key: tuple, after: int, upto: int | None):
        """The dataset indices attempt ``number``'s reports of position key ``key`` named in
        updates ``after < u <= upto`` (a BitMap64, ranks united; docs/ingest-v1.md, a span's
        ``indices``), or None when some report of the key there named none: its samples are
        then unknown."""
        state = self.attempts.get(number)
        if state is None:
            return BitMap64()
        if state.unindexed(key, after, upto):
            return None
        return state.indices_in(key, after, upto)

    def frontier_in(self, number: int, after: int, upto: int | None) -> dict:
        """``{key: max position + 1}`` of attempt ``number`` in updates ``after < u <= upto``,
        computed from run geometry without building bitmaps."""
        out: dict = {}
        state = self.attempts.get(number)
        if state is None:
            return out
        hi = math.inf if upto is None else upto
        for key, groups in state.groups().items():
            for (u0, u1, adv, m, s, starts, _n) in groups:
                lo_u, hi_u = max(u0, after + 1), min(u1, hi)
                if lo_u > hi_u:
                    continue
                top = starts[-1] + (m - 1) * s + max((lo_u - u0) * adv, (hi_u - u0) * adv)
                if top + 1 > out.get(key, 0):
                    out[key] = top + 1
        for key, pieces in state.pieces.items():
            for (update, _rank), bitmap in pieces.items():
                if after < update <= hi and bitmap.max() + 1 > out.get(key, 0):
                    out[key] = bitmap.max() + 1
        return out

    def consumed_key(self, number: int, key: tuple, after: int, upto: int | None) -> bool:
        """Whether attempt ``number`` consumed position key ``key`` in updates
        ``after < u <= upto``, from run geometry and piece keys (no bitmap is built)."""
        state = self.attempts.get(number)
        if state is None:
            return False
        hi = math.inf if upto is None else upto
        for (u0, u1, _adv, _m, _s, _starts, _n) in state.groups().get(key, ()):
            if u0 <= hi and u1 > after:
                return True
        return any(after < update <= hi for (update, _rank) in state.pieces.get(key, {}))

    def first_by_key(self, number: int, after: int, upto: int | None = None) -> dict:
        """``{key: (update, position)}``: attempt ``number``'s first update in
        ``after < u <= upto`` that consumed the key, and the smallest position there."""
        state = self.attempts.get(number)
        if state is None:
            return {}
        hi = math.inf if upto is None else upto
        candidates: dict = {}
        for key, groups in state.groups().items():
            for (u0, u1, adv, _m, _s, starts, _n) in groups:
                if u1 <= after or u0 > hi:
                    continue
                u = max(u0, after + 1)
                candidates.setdefault(key, []).append((u, starts[0] + (u - u0) * adv))
        for key, pieces in state.pieces.items():
            for (update, _rank), bitmap in pieces.items():
                if after < update <= hi:
                    candidates.setdefault(key, []).append((update, bitmap.min()))
        out: dict = {}
        for key, found in candidates.items():
            update = min(u for u, _ in found)
            out[key] = (update, min(p for u, p in found if u == update))
        return out

    def first_positions(self, number: int, after: int) -> dict:
        """Where attempt ``number`` starts each stratum after update ``after``:
        ``{stratum: (update, epoch, position, order)}`` taken at the attempt's first update that
        consumed the stratum, the smallest ``(epoch, position, order)`` there."""
        out: dict = {}
        for (stratum, epoch, order), (update, position) in self.first_by_key(number,
                                                                             after).items():
            item = (update, epoch, position, "" if order is None else order, order)
            best = out.get(stratum)
            if best is None or item < best:
                out[stratum] = item
        return {st: (u, e, p, o) for st, (u, e, p, _, o) in out.items()}

    def last_update(self, number: int) -> int | None:
        """Highest update attempt ``number`` reported, None if none."""
        state = self.attempts.get(number)
        return state.updates.max() if state is not None and state.updates else None

    def updates_in(self, number: int, after: int, upto: int | None) -> int:
        """How many distinct updates attempt ``number`` reported in ``after < u <= upto``."""
        state = self.attempts.get(number)
        if state is None or not state.updates:
            return 0
        hi = state.updates.max() if upto is None else min(upto, state.updates.max())
        if hi <= after:
            return 0
        return state.updates.range_cardinality(after + 1, hi + 1)

    def update_time(self, number: int, update: int) -> float | None:
        """Earliest report time of ``update`` in attempt ``number``."""
        state = self.attempts.get(number)
        return None if state is None else state.update_time(update)

    # ----------------------------------------------------------------------------- storage
    def _head(self, format_: int) -> tuple[bytes, list]:
        """``(head, attempts)``: the zlib-compressed JSON head of format ``format_`` (5: each
        attempt's ``times`` is its chunk count; 6: its ``blocks``, the sorted block numbers)
        and the attempt numbers in the head's order."""
        keys: dict = {}

        def key_id(key):
            if key not in keys:
                keys[key] = len(keys)
            return keys[key]

        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode()

        def packed(bm: BitMap64) -> str:
            bm = bm.copy()
            bm.run_optimize()
            return b64(bm.serialize())

        def absorbed_items(absorbed: dict) -> list:
            # the ranks of a wide job have absorbed the same updates: a rank's bitmap equal
            # to the previous rank's is packed once (the same text, in C instead of a pack)
            out, prev, text = [], None, None
            for rank, bm in absorbed.items():
                if prev is None or bm != prev:
                    prev, text = bm, packed(bm)
                out.append([rank, text])
            return out

        attempts = {}
        for number, state in self.attempts.items():
            open_ids = {id(run) for run in state.open.values()}
            item: dict[str, Any] = {
                "runs": [[r[RANK], key_id(r[KEY]), r[SLOT], r[U0], r[U1], r[A], r[ADV], r[M],
                          r[S], 1 if id(r) in open_ids else 0] for r in state.runs],
                "pieces": [[key_id(key), update, rank, b64(bm.serialize())]
                           for key, pieces in state.pieces.items()
                           for (update, rank), bm in pieces.items()],
                "absorbed": absorbed_items(state.absorbed),
                "updates": packed(state.updates),
            }
            attempts[str(number)] = item
            if state.ident_ranks:
                item["ident_ranks"] = [[key_id(key), rank, packed(bm)]
                                       for key, ranks in state.ident_ranks.items()
                                       for rank, bm in ranks.items()]
            if format_ == 5:
                item["times"] = len(state.times)
                if state.idents or state.wide:
                    item["idents"] = [[key_id(key), block, b64(bm.serialize())]
                                      for key, blocks in state.idents.items()
                                      for block, bm in blocks.items()]
                    item["wide"] = [[key_id(key), update, b64(bm.serialize())]
                                    for key, updates in state.wide.items()
                                    for update, bm in updates.items()]
            else:  # format 6: a block's indices are stored with its times (_ident_part)
                item["blocks"] = sorted({i >> TIME_BLOCK_SHIFT for i in state.times})
        doc = {"format": format_, "byteorder": sys.byteorder, "keys": [list(k) for k in keys],
               "id_strata": sorted(self.id_strata), "hashed_strata": sorted(self.hashed_strata),
               "attempts": attempts, "heartbeats": self.beats.to_doc()}
        head = zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 1)
        return head, list(self.attempts)

    @staticmethod
    def _chunks(state: AttemptLedger, indices: list) -> list:
        """The raw bytes of ``state``'s chunks ``indices`` (sorted): the indices as int64,
        then the chunks (2**TIME_SHIFT float64 each)."""
        times = state.times
        return [array("q", indices).tobytes(), *(times[i].tobytes() for i in indices)]

    def to_bytes(self) -> bytes:
        """Serialise the whole state as one value, format 5: the magic :data:`_MAGIC`, the
        length of the head (8 bytes, little-endian), the head (a zlib-compressed JSON document:
        keys, strata, heartbeat fold, and per attempt its runs, pieces and bitmaps in roaring
        format, run-length optimised), then the times section as raw bytes: per attempt in the
        head's order, its chunk indices (int64) and then their chunks (2**TIME_SHIFT float64
        each), in the byte order the head names (``byteorder``): neither base64 nor JSON nor
        zlib, so that writing and reading them is a copy (8 bytes per update). The worker
        stores :meth:`to_parts` instead (format 6)."""
        head, numbers = self._head(5)
        section: list = []
        for number in numbers:
            state = self.attempts[number]
            section.extend(self._chunks(state, sorted(state.times)))
        return b"".join([_MAGIC, len(head).to_bytes(8, "little"), head, *section])

    def to_parts(self, every: bool = False) -> tuple[bytes, dict]:
        """The state in parts, format :data:`STATE_FORMAT` (6): ``(head, blocks)``. ``head``
        is the magic :data:`_MAGIC6` and the zlib-compressed JSON head (as :meth:`to_bytes`'
        but naming each attempt's time ``blocks``); ``blocks`` is ``{(attempt, block): bytes}``
        (a block: the chunks whose index >> TIME_BLOCK_SHIFT is ``block``, as :meth:`to_bytes`
        lays out an attempt's times) for every block written since :meth:`from_parts` loaded
        the state (``AttemptLedger.dirty``; every block of a state built or loaded otherwise,
        and with ``every``). A caller keeps the blocks it stored before and replaces those
        given: what it writes per analysis is the head plus the blocks that changed, not the
        run's history. Marks the blocks clean."""
        head, numbers = self._head(6)
        blocks: dict = {}
        for number in numbers:
            state = self.attempts[number]
            wanted = {i >> TIME_BLOCK_SHIFT for i in state.times} if every else state.dirty
            if not wanted:
                continue
            by_block: dict = {}
            for index in state.times:
                block = index >> TIME_BLOCK_SHIFT
                if block in wanted:
                    by_block.setdefault(block, []).append(index)
            for block, indices in by_block.items():
                blocks[(number, block)] = b"".join([self._ident_part(state, block),
                                                    *self._chunks(state, sorted(indices))])
            state.dirty = set()
        return _MAGIC6 + head, blocks

    @staticmethod
    def _ident_part(state: AttemptLedger, block: int) -> bytes:
        """The dataset indices of ``block`` (:attr:`AttemptLedger.idents` and ``wide``) as a
        format 6 block's first part: :data:`_IDENT_MARK`, its length, and the zlib-compressed
        JSON ``{"idents": [[key, base64 roaring]], "wide": [[key, update, base64 roaring]]}``;
        empty when the block holds none (the block is then laid out as before indices)."""
        idents = [[list(key), base64.b64encode(blocks[block].serialize()).decode()]
                  for key, blocks in state.idents.items() if block in blocks]
        wide = [[list(key), update, base64.b64encode(bm.serialize()).decode()]
                for key, updates in state.wide.items() for update, bm in updates.items()
                if update >> _BLOCK_SHIFT == block]
        if not idents and not wide:
            return b""
        body = zlib.compress(json.dumps({"idents": idents, "wide": wide},
                                        separators=(",", ":")).encode(), 1)
        return _IDENT_MARK + len(body).to_bytes(8, "little") + body

    @staticmethod
    def _load_ident_part(state: AttemptLedger, block: int, blob) -> memoryview:
        """Read the indices part of a format 6 block into ``state`` (see :meth:`_ident_part`)
        and return the rest of the block (its times). Raises ValueError when unreadable."""
        blob = memoryview(blob)
        if bytes(blob[:8]) != _IDENT_MARK:
            return blob
        size = int.from_bytes(blob[8:16], "little")
        try:
            doc = json.loads(zlib.decompress(blob[16:16 + size]))
            for key, data in doc["idents"]:
                state.idents.setdefault(tuple(key), {})[block] = \
                    BitMap64.deserialize(base64.b64decode(data))
            for key, update, data in doc["wide"]:
                state.wide.setdefault(tuple(key), {})[int(update)] = \
                    BitMap64.deserialize(base64.b64decode(data))
        except (zlib.error, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"ledger state: the indices of time block {block} are "
                             f"unreadable: {exc}") from None
        return blob[16 + size:]

    @classmethod
    def from_parts(cls, head: bytes, blocks) -> Ledger:
        """Load a state written by :meth:`to_parts` (every block it gave so far, the newest
        copy of each): ``head`` and ``blocks``, an iterable of ``(attempt, block, bytes)``. A
        head of an older format (:meth:`from_bytes` reads it; ``blocks`` then ignored) loads
        too. Raises ValueError when a block the head names is missing, one is unreadable, or
        the head is no state. Every block is clean after loading."""
        data = memoryview(head)
        if data[:len(_MAGIC6)] != _MAGIC6:
            ledger = cls.from_bytes(head)
            for state in ledger.attempts.values():
                state.dirty = {i >> TIME_BLOCK_SHIFT for i in state.times}
            return ledger
        doc = cls._load_head(data[len(_MAGIC6):], 6)
        by_attempt: dict = {}
        for attempt, block, blob in blocks:
            by_attempt.setdefault(int(attempt), {})[int(block)] = memoryview(blob)
        ledger = cls._from_doc(doc, 6)
        width = 8 << TIME_SHIFT
        for number, item in doc["attempts"].items():
            state = ledger.attempt(int(number))
            have = by_attempt.get(int(number), {})
            for block in item["blocks"]:
                blob = have.get(block)
                if blob is None:
                    raise ValueError(f"ledger state: time block {block} of attempt {number} "
                                     "is missing")
                blob = cls._load_ident_part(state, block, blob)
                count, rest = divmod(len(blob), 8 + width)
                if rest:
                    raise ValueError(f"ledger state: time block {block} of attempt {number} "
                                     f"is {len(blob)} bytes")
                indices = array("q")
                indices.frombytes(blob[:8 * count])
                offset = 8 * count
                for index in indices:
                    if index >> TIME_BLOCK_SHIFT != block:
                        raise ValueError(f"ledger state: time block {block} of attempt "
                                         f"{number} holds chunk {index}")
                    chunk = state.times[index] = array("d")
                    chunk.frombytes(blob[offset:offset + width])
                    offset += width
            state.dirty = set()
        return ledger

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> Ledger:
        """Load a state written by :meth:`to_bytes` (format 5), or by format 4 (one
        zlib-compressed JSON document, times base64 in it), 3 (the same without the heartbeat
        fold), 2 (also without ``hashed_strata``) or 1 (32-bit update bitmaps and one dense
        array of times); a format 6 state is in parts (:meth:`from_parts`). ``state_format`` of
        the result names the format read: below :data:`CONTINUED_FORMAT` the heartbeat fold is
        empty, and a caller that absorbs heartbeats incrementally must rebuild the state from
        its rows (the worker does); a state of :data:`CONTINUED_FORMAT` or above holds
        everything and is continued. Raises ValueError on bytes that are no state, on another
        format, and on a format 1 or 2 state holding sample-id strata: it does not say whether
        their ids were ints, so the caller rebuilds the state from the ledger rows (the worker
        does)."""
        data = memoryview(data)
        if data[:len(_MAGIC6)] == _MAGIC6:
            raise ValueError("a ledger state of format 6 is stored in parts: Ledger.from_parts")
        section = None
        if data[:len(_MAGIC)] == _MAGIC:
            start = len(_MAGIC) + 8
            size = int.from_bytes(data[len(_MAGIC):start], "little")
            head, section = data[start:start + size], data[start + size:]
        else:
            head = data
        doc = cls._load_head(head, 5 if section is not None else None)
        version = doc.get("format")
        if version not in (1, 2, 3, 4, 5) or (version == 5) != (section is not None):
            raise ValueError(f"unknown ledger state format {version!r}")
        if version < 3 and doc["id_strata"]:
            raise ValueError(f"ledger state format {version} holds sample-id strata but not "
                             f"which have non-integer ids; rebuild it from the ledger rows")
        ledger = cls._from_doc(doc, version)
        offset = 0
        width = 8 << TIME_SHIFT
        body = section if section is not None else memoryview(b"")  # format 5: its section
        for number, item in doc["attempts"].items():
            state = ledger.attempt(int(number))
            if version >= 5:
                count = item["times"]
                indices = array("q")
                indices.frombytes(body[offset:offset + 8 * count])
                offset += 8 * count
                times = state.times
                for index in indices:
                    chunk = times[index] = array("d")
                    chunk.frombytes(body[offset:offset + width])
                    offset += width
            elif version >= 2:
                for index, blob in item["times"]:
                    chunk = state.times[index] = array("d")
                    chunk.frombytes(base64.b64decode(blob))
            else:
                dense = array("d")
                dense.frombytes(base64.b64decode(item["times"]))
                for at, when in enumerate(dense):
                    if when != math.inf:
                        state.note_time(item["time_base"] + at, when)
            state.dirty = {i >> TIME_BLOCK_SHIFT for i in state.times}
        return ledger

    @staticmethod
    def _load_head(head, version: int | None) -> dict:
        """The JSON head (a dict) of a zlib stream; with ``version`` (5, 6: the formats whose
        times are raw bytes) it must be of that format and this machine's byte order. Raises
        ValueError otherwise."""
        try:
            doc = json.loads(zlib.decompress(head))
        except (zlib.error, ValueError) as exc:
            raise ValueError(f"not a ledger state: {exc}") from None
        if not isinstance(doc, dict):
            raise ValueError("not a ledger state: no document")
        if version is not None:
            if doc.get("format") != version:
                raise ValueError(f"unknown ledger state format {doc.get('format')!r}")
            if doc.get("byteorder") != sys.byteorder:
                raise ValueError(f"ledger state written on a {doc.get('byteorder')}-endian "
                                 "machine")
        return doc

    @classmethod
    def _from_doc(cls, doc: dict, version: int) -> Ledger:
        """A ledger of everything a head of format ``version`` holds but the times."""

        def updates(blob: str) -> BitMap64:
            if version >= 2:
                return BitMap64.deserialize(base64.b64decode(blob))
            out = BitMap64()
            out.update(BitMap.deserialize(base64.b64decode(blob)))
            return out

        keys = [(k[0], k[1], k[2]) for k in doc["keys"]]
        ledger = cls()
        ledger.id_strata = set(doc["id_strata"])
        ledger.hashed_strata = set(doc.get("hashed_strata") or ())
        ledger.state_format = version
        if version >= 4:
            ledger.beats = HeartbeatFold.from_doc(doc["heartbeats"])
        for number, item in doc["attempts"].items():
            state = ledger.attempt(int(number))
            for rank, kid, slot, u0, u1, a, adv, m, s, is_open in item["runs"]:
                run = [rank, keys[kid], slot, u0, u1, a, adv, m, s]
                state.runs.append(run)
                if is_open:
                    state.open[(rank, keys[kid], slot)] = run
            for kid, update, rank, blob in item["pieces"]:
                state.pieces.setdefault(keys[kid], {})[(update, rank)] = \
                    BitMap64.deserialize(base64.b64decode(blob))
            prev, loaded = None, cast(BitMap64, None)  # set by the first rank's text
            for rank, blob in item["absorbed"]:  # equal texts decoded once (see _head)
                if blob != prev:
                    prev, loaded = blob, updates(blob)
                    state.absorbed[rank] = loaded
                else:
                    state.absorbed[rank] = loaded.copy()
            state.updates = updates(item["updates"])
            for kid, rank, blob in item.get("ident_ranks") or ():
                state.ident_ranks.setdefault(keys[kid], {})[rank] = updates(blob)
            for kid, block, blob in item.get("idents") or ():
                state.idents.setdefault(keys[kid], {})[block] = \
                    BitMap64.deserialize(base64.b64decode(blob))
            for kid, update, blob in item.get("wide") or ():
                state.wide.setdefault(keys[kid], {})[update] = \
                    BitMap64.deserialize(base64.b64decode(blob))
        return ledger


def _missed(backoff: dict, attempt: int) -> None:
    """A failed fast-path try for ``attempt``: skip 0, 1, 3, 7, ... (at most 63) groups before
    the next, so that input that never fits costs the general path plus a bounded overhead (the
    first miss is free: a stream's first group opens its runs, the second gives their advance)."""
    entry = backoff.get(attempt)
    if entry is None:
        entry = backoff[attempt] = [0, 0]
    entry[1] = min(2 ** entry[0] - 1, 63)
    entry[0] += 1


def _plain_span(span, keys: set, opened: dict, rank: int, update: int):
    """For :meth:`_Lane.build`: ``(copy, item, run, room)`` of one span of rank ``rank``'s
    record at ``update`` when it is plain (see :class:`_Lane`) and its key is not in ``keys``
    (added to them): a copy of the span whose one range is ``item`` (a copy too), the open
    slot-0 run it extends, and how many more updates the lane may take before that range would
    leave [0, 2**63) (the general path raises there, so the lane must not accept it;
    ``POSITION_LIMIT`` when the run does not move). None when it is not plain."""
    if type(span) is not dict or "ids" in span or "indices" in span or span.get("padding"):
        return None
    ranges = span.get("ranges")
    if type(ranges) is not list or len(ranges) != 1:
        return None
    item = ranges[0]
    if type(item) is not list or not 2 <= len(item) <= 3 \
            or any(type(x) is not int for x in item):
        return None
    start, stop = item[0], item[1]
    step = item[2] if len(item) > 2 else 1
    if not (0 <= start < stop < POSITION_LIMIT) or step < 1 or stop - start > MAX_RANGE_LENGTH:
        return None
    key = (span["stratum"], span.get("epoch", 0), span.get("order"))
    if key in keys:
        return None
    keys.add(key)
    run = opened.get((rank, key, 0))
    if run is None or run[U1] != update or run[U0] >= update or run[S] != step \
            or run[M] != (stop - start + step - 1) // step \
            or run[A] + (update - run[U0]) * run[ADV] != start:
        return None
    adv = run[ADV]
    room = POSITION_LIMIT
    if adv > 0:
        room = (POSITION_LIMIT - 1 - stop) // adv
    elif adv < 0:
        room = start // -adv
    copy = dict(span)
    mine = list(item)
    copy["ranges"] = [mine]
    return copy, mine, run, room


class _Lane:
    """Fast path of :meth:`Ledger.absorb` for one attempt, alive during one absorb call.

    Built from a group of records of one ``(attempt, update)`` that the general path has just
    absorbed, when every record of it is *plain*: a distinct int rank whose highest absorbed
    update is this one, spans that are dicts without ``ids`` or padding, each one range
    ``[start, stop]`` or ``[start, stop, step]`` (a list of ints) of a distinct key, and that range
    is the latest update of the rank's open slot-0 run of that key, a run of at least two updates
    (so its advance ``adv`` is known). The lane keeps, per record, a copy of its spans (the
    *template*).

    The next group is accepted iff it has the same length, the same ranks in the same order,
    the next update, the same attempt, and spans equal (``==``, the comparison the general path
    makes) to the template with every range shifted by its run's ``adv``. That is exactly the
    case in which the general path would extend each of those runs by one update and touch
    nothing else, so the lane extends them (deferred: :meth:`flush` sets ``U1`` and marks the
    updates absorbed, one ``add_range`` per rank). No rank of the lane can have absorbed an
    update above ``update`` meanwhile: the lane dies (flushed first) before the general path
    touches its attempt again.
    """

    __slots__ = ("adv", "advs", "attempt", "base", "items", "ranks", "room", "runs", "state",
                 "taken", "template", "update", "width")
    # the slots' types (mypy reads them; a slotted class has no class attributes of these names)
    adv: int | None
    advs: list
    attempt: int
    base: int
    items: list
    ranks: list
    room: int
    runs: list
    state: AttemptLedger
    taken: int
    template: list
    update: int
    width: int

    @classmethod
    def build(cls, state: AttemptLedger, update: int, records: list, i: int, j: int):
        """A lane continuing ``records[i:j]`` (one group, already absorbed), or None."""
        absorbed, opened = state.absorbed, state.open
        room = POSITION_LIMIT
        ranks: list = []
        distinct: set = set()
        template: list = []
        items: list = []
        advs: list = []
        runs: list = []
        for rec in records[i:j]:
            rank = rec.rank
            if type(rank) is not int or rank in distinct:
                return None
            distinct.add(rank)
            ranks.append(rank)
            seen = absorbed.get(rank)
            if seen is None or seen.max() != update:
                return None
            spans = rec.spans
            if type(spans) is not list:
                return None
            row = []
            keys: set = set()
            for span in spans:
                plain = _plain_span(span, keys, opened, rank, update)
                if plain is None:
                    return None
                copy, mine, run, span_room = plain
                room = min(room, span_room)
                row.append(copy)
                items.append(mine)
                advs.append(run[ADV])
                runs.append(run)
            template.append(row)
        if not ranks:
            return None
        # updates the lane may take before one leaves [0, 2**63) (the general path raises there)
        room = min(room, UPDATE_LIMIT - 1 - update)
        lane = cls()
        lane.state = state
        lane.attempt = records[i].attempt
        lane.width = j - i
        lane.update = lane.base = update
        lane.taken = 0
        lane.room = room
        lane.ranks = ranks
        lane.template = template
        lane.items = items
        lane.advs = advs
        lane.adv = advs[0] if advs and advs.count(advs[0]) == len(advs) else None
        lane.runs = runs
        return lane

    def take(self, records: list, i: int, j: int) -> bool:
        """Absorb ``records[i:j]`` if it is the template's next group (see the class docstring);
        False leaves the state as it was and the lane unusable (flush it and drop it)."""
        if self.taken >= self.room:
            return False
        adv = self.adv
        if adv is not None:
            for item in self.items:
                item[0] += adv
                item[1] += adv
        else:
            for item, adv in zip(self.items, self.advs):
                item[0] += adv
                item[1] += adv
        update = self.update + 1
        group = records[i:j]
        # C-level passes; the spans comparison is where the time goes (~0.15 us per span)
        if list(map(_RANK, group)) != self.ranks or list(map(_SPANS, group)) != self.template \
                or list(map(_UPDATE, group)) != [update] * self.width \
                or list(map(_ATTEMPT, group)) != [self.attempt] * self.width:
            return False
        # the earliest time, with the general path's comparison (a NaN time is never kept):
        # min() skips NaN unless it comes first
        low = min(map(_TIME, group))
        if low != low:  # noqa: PLR0124 (NaN)
            low = math.inf
            for when in map(_TIME, group):
                low = min(low, when)
        chunk = self.state.times.get(update >> TIME_SHIFT)
        if chunk is not None:
            if low < chunk[update & TIME_MASK]:
                chunk[update & TIME_MASK] = low
                self.state.dirty.add(update >> _BLOCK_SHIFT)
        else:
            self.state.note_time(update, low)
        self.update = update
        self.taken += 1
        return True

    def flush(self) -> None:
        """Write the deferred part of the accepted groups into the state."""
        if self.update == self.base:
            return
        first, last = self.base + 1, self.update
        for run in self.runs:
            run[U1] = last
        absorbed = self.state.absorbed
        for rank in self.ranks:
            absorbed[rank].add_range(first, last + 1)
        self.state.updates.add_range(first, last + 1)
        self.base = last


def _drop_bands(mine: tuple, rank: int, ranks: int) -> None:
    """Flush and drop the bands of ``mine`` (``(bands by row key, band by rank)`` of one
    attempt, :meth:`Ledger.absorb_folded`) that hold any of ranks ``rank .. rank + ranks - 1``:
    what absorbs those ranks next sees their state whole. O(ranks) plus the dropped bands'."""
    keyed, owners = mine
    for k in range(ranks):
        band = owners.get(rank + k)
        if band is None:
            continue
        band.flush()
        for other in range(band.rank, band.rank + band.ranks):
            del owners[other]
        keyed.pop(band.key)


def _moved(spans: list, shift: int) -> list:
    """``spans`` (wire spans of ranges) with every range's start and stop moved by ``shift``
    positions, the step kept (a new list; ``spans`` unchanged): the report of the rank
    ``shift // rank_shift`` ranks after the first of a folded row."""
    if not shift:
        return spans
    out = []
    for span in spans:
        copy = dict(span)
        copy["ranges"] = [[item[0] + shift, item[1] + shift, *item[2:]] for item in span["ranges"]]
        out.append(copy)
    return out


def _extend_plain(opened: dict, runs: list, rank: int, update: int, spans: list) -> bool:
    """The fast path of :meth:`Ledger._absorb_each` for one rank's report at ``update`` (not
    absorbed before): when every span is one range of its own key (the common report shape),
    extend each key's open slot-0 run by it (the run extension of ``Ledger._extend``, inlined:
    this loop runs once per span) or open a new run, and return True; False, with nothing
    changed, when the report has another shape (the general path absorbs it). Raises
    ValueError on a malformed range, as the general path does."""
    keys = []
    for span in spans:
        ranges = span.get("ranges")
        if ranges is None or len(ranges) != 1 or "ids" in span or span.get("padding") \
                or "indices" in span:
            return False
        keys.append((span["stratum"], span.get("epoch", 0), span.get("order")))
    if len(keys) > 1 and len(set(keys)) != len(keys):
        return False
    for key, span in zip(keys, spans):
        item = span["ranges"][0]
        start, stop = item[0], item[1]
        step = item[2] if len(item) > 2 else 1
        if start < 0 or stop < start or stop >= POSITION_LIMIT or step < 1 \
                or stop - start > MAX_RANGE_LENGTH:
            wire_range(item)  # raises with the message
        m = (stop - start + step - 1) // step
        if m == 0:
            continue
        handle = (rank, key, 0)
        run = opened.get(handle)
        if run is not None and run[U1] == update - 1 and run[M] == m \
                and run[S] == step:
            if run[U1] == run[U0]:
                run[ADV] = start - run[A]
                run[U1] = update
                continue
            if start == run[A] + (update - run[U0]) * run[ADV]:
                run[U1] = update
                continue
        run = [rank, key, 0, update, update, start, 0, m, step]
        runs.append(run)
        opened[handle] = run
    return True


def _read_again(state: AttemptLedger, run: list | None, update: int, lo: int, hi: int,
                stride: int, when: float) -> bool:
    """For :meth:`Ledger.absorb_folded`: a rank's part of ``update`` read again (a folded row
    that grew, re-read whole), one range ``[lo, hi)`` of step ``stride``, at ``when``. When its
    open slot-0 ``run`` already holds exactly these positions at this update, absorbing it again
    only keeps the earlier time (what ``_absorb_again`` finds without walking every run): done
    here, True. False: the general path absorbs it."""
    if run is not None and run[U0] <= update <= run[U1] and run[S] == stride \
            and run[M] == (hi - lo + stride - 1) // stride \
            and lo == run[A] + (update - run[U0]) * run[ADV]:
        state.note_time(update, when)
        return True
    return False


def _banded(bands: dict, attempt: int, update: int, rank: int | None, ranks: int, shift: int,
            when: float, stratum: str | None, epoch: int, order: str | None, start: int,
            stop: int, step: int | None) -> bool:
    """For :meth:`Ledger.absorb_folded`, with bands alive: True when a band of the row's ranks,
    shift and key takes the row (:meth:`_Band.take`); else False, the bands that hold any of
    its ranks dropped first (flushed), so that its ranks see the state they hold."""
    mine = bands.get(attempt)
    if mine is None:
        return False
    band = mine[0].get((rank, ranks, shift, stratum, epoch, order)) \
        if stratum is not None else None
    if band is not None and band.take(update, when, start, stop, step):
        return True
    if rank is not None:
        _drop_bands(mine, rank, ranks)
    return False


def _unfolded(attempt: int, update: int, rank: int | None, ranks: int, shift: int,
              when: float, spans: list) -> list:
    """The records of a folded row of any shape (``spans``: rank ``rank``'s wire spans): one
    per rank, rank ``rank + k``'s spans moved by ``k * shift``."""
    if ranks <= 1:
        return [LedgerRecord(attempt, update, rank, when, spans)]
    if rank is None:
        raise ValueError(f"a folded row of {ranks} ranks of update {update} names no first rank")
    return [LedgerRecord(attempt, update, rank + k, when, _moved(spans, k * shift))
            for k in range(ranks)]


def _common_span(stratum: str, epoch: int, order: str | None, lo: int, hi: int,
                 step: int | None) -> dict:
    """The wire span of a folded row's common shape: one range ``[lo, hi]`` (``[lo, hi,
    step]`` with a step), an ``order`` key only when there is one."""
    span = {"stratum": stratum, "epoch": epoch,
            "ranges": [[lo, hi] if step is None else [lo, hi, step]]}
    if order is not None:
        span["order"] = order
    return span


def _keep_band(bands: dict, state: AttemptLedger, attempt: int, update: int, rank: int,
               ranks: int, shift: int, stratum: str, epoch: int, order: str | None, start: int,
               stop: int, stride: int) -> None:
    """After a multi-rank row of the common shape: keep the band that continues it
    (:meth:`_Band.build`) in ``bands``, under its key and as the owner of its ranks."""
    band = _Band.build(state, update, rank, ranks, shift, (stratum, epoch, order), start, stop,
                       stride)
    if band is not None:
        keyed, owners = bands.setdefault(attempt, ({}, {}))
        keyed[(rank, ranks, shift, stratum, epoch, order)] = band
        for k in range(ranks):
            owners[rank + k] = band


class _Band:
    """Fast path of :meth:`Ledger.absorb_folded` for the ranks of one folded row, alive during
    one call.

    Built after a row of the common shape holding ranks ``rank .. rank + ranks - 1`` of update
    ``u`` (moved by ``shift`` rank to rank) was absorbed rank by rank, when each of those ranks'
    open slot-0 run of the row's key ends at ``u``, began before ``u`` (its advance is known),
    has the row's step and length, holds the rank's range of that row at ``u``, and all of them
    have one advance ``adv``; and no rank has absorbed an update above ``u``. Then the row of the
    same ranks, shift and key at ``u + 1`` whose first rank's range is the one at ``u`` moved by
    ``adv`` (same length and step) is exactly the case in which the per-rank path extends each
    of those runs by one update and touches nothing else: the band keeps the update's earliest
    time and defers the rest (:meth:`flush` sets each run's end and marks the updates absorbed,
    one ``add_range`` per rank). Every rank's range must lie in ``[0, 2**63)`` (the lowest start
    and the highest stop are checked), else the per-rank path takes the row and raises as
    :meth:`Ledger.absorb` does. The band is flushed and dropped before any other row holding
    one of its ranks is absorbed; rows of other ranks leave it alive (they touch none of its
    ranks' runs, absorbed updates or pieces; the attempt's update bitmap and times they share
    are a union and minima, the same in any order).
    """

    __slots__ = ("adv", "base", "high", "key", "low", "rank", "ranks", "runs", "start", "state",
                 "step", "update", "width")
    # the slots' types (mypy reads them; a slotted class has no class attributes of these names)
    adv: int
    base: int
    high: int
    key: tuple
    low: int
    rank: int
    ranks: int
    runs: list
    start: int
    state: AttemptLedger
    step: int | None
    update: int
    width: int

    @classmethod
    def build(cls, state: AttemptLedger, update: int, rank: int, ranks: int, shift: int,
              key: tuple, start: int, stop: int, step: int) -> _Band | None:
        """A band continuing the row just absorbed (see the class docstring), or None."""
        if step < 1 or stop <= start:
            return None
        m = (stop - start + step - 1) // step
        opened, absorbed = state.open, state.absorbed
        runs = []
        adv: int | None = None
        for k in range(ranks):
            run = opened.get((rank + k, key, 0))
            if run is None or run[U1] != update or run[U0] >= update or run[S] != step \
                    or run[M] != m:
                return None
            if adv is None:
                adv = run[ADV]
            elif run[ADV] != adv:
                return None
            if run[A] + (update - run[U0]) * adv != start + k * shift:
                return None
            seen = absorbed.get(rank + k)
            if seen is None or seen.max() != update:
                return None
            runs.append(run)
        if adv is None:  # no rank
            return None
        band = cls()
        band.state, band.runs, band.rank, band.ranks = state, runs, rank, ranks
        band.key = (rank, ranks, shift) + key  # its row key in Ledger.absorb_folded
        band.base = band.update = update
        band.start, band.adv, band.width, band.step = start, adv, stop - start, step
        band.low, band.high = min(0, (ranks - 1) * shift), max(0, (ranks - 1) * shift)
        return band

    def take(self, update: int, when: float, start: int, stop: int, step: int | None) -> bool:
        """Absorb the row of the band's ranks at ``update`` if it continues them (see the class
        docstring); False leaves the state as it was."""
        if update != self.update + 1 or start != self.start + self.adv \
                or stop - start != self.width or (1 if step is None else step) != self.step \
                or start + self.low < 0 or stop + self.high >= POSITION_LIMIT \
                or update >= UPDATE_LIMIT:
            return False
        self.state.note_time(update, when)
        self.update, self.start = update, start
        return True

    def flush(self) -> None:
        """Write the deferred part of the rows taken into the state."""
        if self.update == self.base:
            return
        first, last = self.base + 1, self.update
        for run in self.runs:
            run[U1] = last
        absorbed = self.state.absorbed
        for rank in range(self.rank, self.rank + self.ranks):
            absorbed[rank].add_range(first, last + 1)
        self.state.updates.add_range(first, last + 1)
        self.base = last


def _disjoint(parts: list[range]) -> bool:
    """Whether sorted ranges share no position."""
    union = BitMap64()
    for r in parts:
        union.update(r)
    return len(union) == sum(len(r) for r in parts)


def _report_bitmaps(spans) -> dict:
    from .positions import report_positions
    return report_positions(spans)
