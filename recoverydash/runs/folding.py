"""Folded ledger rows: the parts of consecutive data-parallel ranks of one update in one row.

A :class:`~recoverydash.runs.models.LedgerRow` holds the parts of ``ranks`` consecutive ranks
``rank .. rank + ranks - 1`` of one ``(attempt, update)``: the stored ``spans`` are rank
``rank``'s, and rank ``rank + k``'s are the same spans with every range's start and stop moved by
``k * rank_shift`` positions (the step stays). That is the DistributedSampler shape, where rank
r's part is a strided range ``[start + r, stop + r, W]``: 64 ranks of an update cost one row
instead of 64. Ranks fold only when each one's report is *exactly* (``==`` on the wire values)
the previous rank's moved by the same shift, with the same time, samples and tokens, and no span
holds sample ids; every other part is a row of its own (``ranks`` 1, ``rank_shift`` 0). So
:func:`unfold` gives back each rank's report as it was sent, and every reader (the analysis, the
restart page) sees the per-rank reports it would have seen without folding: a rank absent from
the update is absent from every row, two ranks reporting one position still both report it.

Within one batch (:func:`fold`) times must be equal; across batches (:func:`join`, stored rows
with a batch's) they are not compared and the joined row keeps the earliest (the analysis keeps
only the earliest report time per update; docs/ingest-v1.md#update_aggregate).

Pure functions (no Django); ``runs.models`` and ``ingest.actions`` use them.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

#: Rank under which a report with a null rank (a coordinator's global view) is stored; never
#: folded (the same value as ``runs.models.GLOBAL_RANK``).
GLOBAL_RANK = -1


def foldable(spans: Any) -> bool:
    """Whether ``spans`` (wire spans, already validated) can be moved by a shift: a list of
    dicts each with a list of ``ranges`` of ints and no ``ids``."""
    if type(spans) is not list or not spans:
        return False
    for span in spans:
        if type(span) is not dict or "ids" in span:
            return False
        ranges = span.get("ranges")
        if type(ranges) is not list or not ranges:
            return False
        for item in ranges:  # unrolled: called for every part of every update ingested
            if type(item) is not list:
                return False
            n = len(item)
            if n == 3:
                if type(item[0]) is not int or type(item[1]) is not int \
                        or type(item[2]) is not int:
                    return False
            elif n != 2 or type(item[0]) is not int or type(item[1]) is not int:
                return False
    return True


def shifted(spans: list, shift: int) -> list:
    """``spans`` (foldable) with every range's start and stop moved by ``shift`` positions (a new
    list; the input is unchanged)."""
    if not shift:
        return spans
    out = []
    for span in spans:
        copy = dict(span)
        copy["ranges"] = [[item[0] + shift, item[1] + shift, *item[2:]]
                          for item in span["ranges"]]
        out.append(copy)
    return out


def unfold(rank: int, ranks: int, rank_shift: int, spans: list) -> Iterator[tuple[int, list]]:
    """``(rank, spans)`` of every rank a stored row holds, in rank order: ``rank + k`` with
    ``spans`` moved by ``k * rank_shift`` for ``k`` in ``0 .. ranks - 1`` (one pair for a row of
    one rank, its spans as stored)."""
    if ranks <= 1:
        yield rank, spans
        return
    for k in range(ranks):
        yield rank + k, shifted(spans, k * rank_shift)


def fold(parts: dict, ok: dict | None = None) -> list[tuple[int, int, int, dict]]:
    """Fold the parts of one ``(attempt, update)``: ``parts`` is ``{rank: entry}``, an entry a
    dict with ``time``, ``spans``, ``samples`` and ``tokens``. Returns ``(rank, ranks,
    rank_shift, entry)`` per row to store, ranks ascending: each maximal run of consecutive ranks
    whose reports are each the previous one's moved by one shift (same time, samples, tokens;
    foldable spans, see the module docstring) is one row holding the first rank's entry; every
    other part is a row of one rank (shift 0). :func:`unfold` of the rows gives back ``parts``
    exactly.

    ``ok``: if given (a dict), filled with ``{rank: whether that rank's entry may fold}`` (not
    the global rank, :func:`foldable` spans), each part's spans walked once; the caller may
    hand it on to :func:`join` (as a segment's ``ok``)."""
    out: list[tuple[int, int, int, dict]] = []
    order = sorted(parts)
    if ok is None:
        ok = {}
    for rank in order:
        ok[rank] = rank != GLOBAL_RANK and foldable(parts[rank]["spans"])
    count = len(order)
    i = 0
    while i < count:
        rank = order[i]
        entry = parts[rank]
        n, shift = 1, 0
        if ok[rank]:
            time, samples, tokens = entry["time"], entry["samples"], entry["tokens"]
            spans = entry["spans"]
            first = spans[0]["ranges"][0]
            while i + n < count and order[i + n] == rank + n:
                nxt = parts[rank + n]
                if not ok[rank + n] or nxt["time"] != time or nxt["samples"] != samples \
                        or nxt["tokens"] != tokens:
                    break
                then_spans = nxt["spans"]
                then = then_spans[0]["ranges"][0]
                step = then[0] - first[0]
                if n > 1 and step != shift:
                    break
                # The first range's stop moves by the step too (a necessary condition of the
                # comparison below, which builds the moved spans: most refusals end here).
                if then[1] - first[1] != step or shifted(spans, step) != then_spans:
                    break
                shift = step
                spans, first = then_spans, then
                n += 1
        if n == 1:
            shift = 0
        out.append((rank, n, shift, entry))
        i += n
    return out


def _first_start(spans: list) -> int:
    return spans[0]["ranges"][0][0]


def join(segments: list[dict]) -> list[tuple[list[int], int]]:
    """Chains of ``segments`` that together are one folded row, as ``(indices, shift)``: a segment
    is a dict with ``rank``, ``ranks``, ``shift`` (0 for one rank), ``spans`` (its first rank's),
    ``samples`` and ``tokens`` (a stored row or a batch's entry of one ``(attempt, update)``), and
    optionally ``ok`` (whether it may fold at all: not the global rank and :func:`foldable` spans,
    as :func:`fold` answers it; computed here when absent). Returns lists of indices into
    ``segments``, each in rank order, that cover consecutive ranks without overlap and whose reports
    are each the previous rank's moved by one shift: the chain's first segment's spans moved by
    ``k * shift`` are rank ``rank + k``'s report, exactly as each segment gives it (same samples and
    tokens, foldable spans, never the global rank; times are not compared: a row keeps the earliest,
    see ``ingest.actions``). Every segment is in exactly one chain (a chain of one when it continues
    nothing). Greedy in rank order; a rank in two segments (a rank's own later report beside a
    folded row) is two chains' business, never united here."""
    order = sorted(range(len(segments)), key=lambda i: (segments[i]["rank"],
                                                        segments[i]["ranks"]))
    chains: list[dict] = []
    by_end: dict[int, list[dict]] = {}
    for i in order:
        seg = segments[i]
        ok = seg.get("ok")
        if ok is None:
            ok = seg["rank"] != GLOBAL_RANK and foldable(seg["spans"])
        placed = False
        for chain in by_end.get(seg["rank"], []) if ok else []:
            head = segments[chain["members"][0]]
            if head["samples"] != seg["samples"] or head["tokens"] != seg["tokens"]:
                continue
            shift = chain["shift"]
            if shift is None:
                shift = _first_start(seg["spans"]) - _first_start(head["spans"])
            if seg["ranks"] > 1 and seg["shift"] != shift:
                continue
            # The first range's start and stop moved by the chain's reach: necessary for the
            # comparison after it, which builds the moved spans (most refusals end here).
            move = chain["ranks"] * shift
            first, then = head["spans"][0]["ranges"][0], seg["spans"][0]["ranges"][0]
            if then[0] - first[0] != move or then[1] - first[1] != move \
                    or shifted(head["spans"], move) != seg["spans"]:
                continue
            by_end[seg["rank"]].remove(chain)
            chain["members"].append(i)
            chain["ranks"] += seg["ranks"]
            chain["shift"] = shift
            by_end.setdefault(chain["rank"] + chain["ranks"], []).append(chain)
            placed = True
            break
        if placed:
            continue
        chain = {"rank": seg["rank"], "ranks": seg["ranks"], "members": [i],
                 "shift": seg["shift"] if seg["ranks"] > 1 else None}
        chains.append(chain)
        if ok:
            by_end.setdefault(seg["rank"] + seg["ranks"], []).append(chain)
    return [(c["members"], c["shift"] or 0) for c in chains]
