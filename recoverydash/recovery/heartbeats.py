"""Heartbeats folded into the incremental state: :class:`HeartbeatFold`.

The analysis needs three things of a run's heartbeats (docs/ingest-v1.md#heartbeat), and none of
them needs the heartbeats themselves once they are absorbed:

* the read cursors of each attempt (docs/definitions.md#recomputed: ``F``, positions below k-1's
  read cursors): only the furthest position per ``(stratum, epoch, order)`` is ever asked for, so
  that is what is kept, per attempt (a cursor without ``order`` is kept under no order and, as
  before, applies to every order of its ``(stratum, epoch)``);
* the last heartbeat of each ``(attempt, rank)`` (time and update), for the silence rules;
* the points of the *fetched* chart (docs/definitions.md#heartbeat-read-cursor-chart): every
  ``stride``-th heartbeat of an attempt in the order absorbed, the stride doubling whenever more
  than ``2 * CHART_POINTS`` would be kept, so an attempt keeps between ``CHART_POINTS`` and
  ``2 * CHART_POINTS`` points whatever its length.

Incremental contract: :meth:`HeartbeatFold.absorb` takes heartbeats one at a time in the order
given; absorbing a sequence in any number of batches yields the same fold as absorbing it at once
(every rule above depends only on the heartbeats before it in that order), and
:meth:`to_doc` / :meth:`from_doc` round-trip it exactly. The worker absorbs heartbeat rows in
``(seq, id)`` order, so its fold equals a rebuild from all rows. Memory: O(attempts x (strata +
ranks + CHART_POINTS)), never O(heartbeats).
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["HeartbeatFold", "CHART_POINTS", "NO_ORDER"]

#: Chart points per attempt: the committed frontier series keeps at most this many, the fetched
#: cursor series between this and twice this.
CHART_POINTS = 200
#: Key part of a read cursor that names no ``order``.
NO_ORDER = None


@dataclass
class _AttemptBeats:
    #: ``{(stratum, epoch, has_order, order): furthest position}``
    fetched: dict = field(default_factory=dict)
    #: ``{rank (None: no rank): [time, update]}`` of the latest heartbeat by time
    last: dict = field(default_factory=dict)
    seen: int = 0
    stride: int = 1
    #: ``[[index, time, rank, update, fetched]]`` in the order absorbed
    points: list = field(default_factory=list)


class HeartbeatFold:
    """What the analysis needs of a run's heartbeats (see the module docstring)."""

    def __init__(self) -> None:
        self.attempts: dict[int, _AttemptBeats] = {}

    def copy(self) -> HeartbeatFold:
        """An independent copy (absorbing into it leaves this fold unchanged)."""
        return HeartbeatFold.from_doc(self.to_doc())

    def absorb(self, beats) -> int:
        """Fold HeartbeatRecords (``attempt``, ``rank``, ``time``, ``update``, ``fetched``: wire
        cursor dicts) in the order given; returns how many. Raises ValueError/TypeError on a
        cursor whose epoch or position is not an integer."""
        count = 0
        for beat in beats:
            count += 1
            state = self.attempts.get(beat.attempt)
            if state is None:
                state = self.attempts[beat.attempt] = _AttemptBeats()
            cursors = list(beat.fetched or [])
            for c in cursors:
                _fold_cursor(state.fetched, c)
            last = state.last.get(beat.rank)
            if last is None or beat.time >= last[0]:
                state.last[beat.rank] = [beat.time, beat.update]
            index = state.seen
            state.seen += 1
            if index % state.stride == 0:
                if len(state.points) >= 2 * CHART_POINTS:
                    state.stride *= 2
                    state.points = [p for p in state.points if p[0] % state.stride == 0]
                if index % state.stride == 0:
                    state.points.append([index, beat.time, beat.rank, beat.update, cursors])
        return count

    def chart_offsets(self, attempt: int, count: int) -> list[int]:
        """The chart points :meth:`absorb` would keep (and still hold after them) of ``count``
        more heartbeats of attempt ``attempt``: their offsets among those ``count`` (0 the
        first), increasing. Depends only on how many were absorbed before and which points are
        kept, never on the heartbeats themselves; the fold is left as it is."""
        state = self.attempts.get(attempt) or _AttemptBeats()
        offsets, stride = _chart_plan(state, count)
        return [i - state.seen for i in offsets if i % stride == 0]

    def chart_rule(self, attempt: int, count: int) -> tuple[int, int]:
        """``(seen, stride)``: of ``count`` more heartbeats of attempt ``attempt``, the chart
        keeps (:meth:`chart_offsets`) exactly those at the offsets ``o`` with ``(seen + o) %
        stride == 0`` (``seen`` the heartbeats absorbed before them, ``stride`` the chart's
        stride after them: an index that is a multiple of the last stride was a multiple of
        every stride before it, so it was kept when it came and never dropped)."""
        state = self.attempts.get(attempt) or _AttemptBeats()
        return state.seen, _chart_plan(state, count)[1]

    def absorb_reduced(self, attempt: int, count: int, last, cursors, points) -> int:
        """Fold ``count`` heartbeats of attempt ``attempt`` given reduced, exactly as
        :meth:`absorb` of the heartbeats themselves in their order would (what a database
        computes with an aggregate instead of sending every row):

        * ``last``: ``(rank, time, update)`` per rank among them of its latest heartbeat by time
          (of equal times the last in the order), ranks in the order of their first heartbeat;
        * ``cursors``: wire cursor dicts whose fold is that of every heartbeat's ``fetched`` in
          the order: e.g. the cursors of each distinct ``fetched`` list in the order of the
          first heartbeat that carried it (a list carried again changes nothing);
        * ``points``: ``(offset, time, rank, update, fetched)`` of each offset
          :meth:`chart_offsets` gave for ``count`` (offset: place among the ``count``), in
          that order.

        Returns ``count``. Raises ValueError when ``points`` are not those offsets, and what
        :meth:`absorb` raises on a cursor whose epoch or position is not an integer."""
        if count <= 0:
            return 0
        state = self.attempts.get(attempt) or _AttemptBeats()
        offsets, stride = _chart_plan(state, count)
        wanted = [i - state.seen for i in offsets if i % stride == 0]
        points = list(points)
        if [p[0] for p in points] != wanted:
            raise ValueError("the chart points given are not those of chart_offsets")
        self.attempts.setdefault(attempt, state)
        for c in cursors:
            _fold_cursor(state.fetched, c)
        for rank, time, update in last:
            held = state.last.get(rank)
            if held is None or time >= held[0]:
                state.last[rank] = [time, update]
        if stride != state.stride:
            state.points = [p for p in state.points if p[0] % stride == 0]
        state.points += [[state.seen + offset, time, rank, update, list(fetched or [])]
                         for offset, time, rank, update, fetched in points]
        state.seen += count
        state.stride = stride
        return count

    # ------------------------------------------------------------------------------- questions
    def fetched(self, attempt: int) -> list:
        """Attempt ``attempt``'s furthest read cursor per ``(stratum, epoch, order)`` as wire
        cursor dicts (``order`` only where the heartbeat named one); empty if none."""
        state = self.attempts.get(attempt)
        if state is None:
            return []
        out = []
        for (stratum, epoch, has_order, order), position in state.fetched.items():
            cursor = {"stratum": stratum, "epoch": epoch, "position": position}
            if has_order:
                cursor["order"] = order
            out.append(cursor)
        return out

    def last_heartbeat(self, attempt: int) -> dict:
        """``{rank: (time, update)}`` of attempt ``attempt``'s latest heartbeat per rank (POSIX
        seconds; rank None for a heartbeat without a rank); empty if none."""
        state = self.attempts.get(attempt)
        return {} if state is None else {r: (t, u) for r, (t, u) in state.last.items()}

    def chart_points(self, attempt: int) -> list:
        """The kept heartbeats of ``attempt`` in time order (ties: the order absorbed):
        ``[(time, rank, update, fetched)]``."""
        state = self.attempts.get(attempt)
        if state is None:
            return []
        return [(p[1], p[2], p[3], p[4]) for p in sorted(state.points, key=lambda p: (p[1], p[0]))]

    # ------------------------------------------------------------------------------- storage
    def to_doc(self) -> dict:
        """A JSON-ready dict of the whole fold."""
        return {str(number): {
            "fetched": [[s, e, h, o, p] for (s, e, h, o), p in state.fetched.items()],
            "last": [[r, t, u] for r, (t, u) in state.last.items()],
            "seen": state.seen, "stride": state.stride, "points": state.points}
            for number, state in self.attempts.items()}

    @classmethod
    def from_doc(cls, doc: dict) -> HeartbeatFold:
        """The fold :meth:`to_doc` wrote."""
        fold = cls()
        for number, item in doc.items():
            state = fold.attempts[int(number)] = _AttemptBeats(
                seen=item["seen"], stride=item["stride"],
                points=[list(p) for p in item["points"]])
            state.fetched = {(s, e, bool(h), o): p for s, e, h, o, p in item["fetched"]}
            state.last = {r: [t, u] for r, t, u in item["last"]}
        return fold


def _fold_cursor(fetched: dict, c) -> None:
    """Keep wire cursor ``c``'s position in ``fetched`` (``{(stratum, epoch, has_order,
    order): furthest position}``) when it is further than the one held."""
    order = c.get("order", NO_ORDER)
    has_order = "order" in c
    if has_order and not isinstance(order, (str, int, float, bool, type(None))):
        return  # an order no position key can equal
    key = (c.get("stratum"), int(c.get("epoch", 0)), has_order, order)
    position = int(c.get("position", 0))
    if position > fetched.get(key, -1):
        fetched[key] = position


def _chart_plan(state: _AttemptBeats, count: int) -> tuple[list[int], int]:
    """The chart rule of :meth:`HeartbeatFold.absorb` run over the indices of ``count`` more
    heartbeats of ``state`` alone: ``(indices appended, the stride after them)``; a point
    (held or appended) is still kept after them when its index is a multiple of that stride.
    Visits only the multiples of the stride (O(points), not O(count))."""
    stride, held = state.stride, len(state.points)
    index, end = state.seen, state.seen + count
    appended: list[int] = []
    index += -index % stride
    while index < end:
        if held >= 2 * CHART_POINTS:
            stride *= 2
            held = sum(1 for p in state.points if p[0] % stride == 0) \
                + sum(1 for i in appended if i % stride == 0)
            if index % stride:
                index += -index % stride
                continue
        appended.append(index)
        held += 1
        index += stride
    return appended, stride
