"""Positions in tokens: what a packed sequence carries instead of one position per sample
(docs/definitions.md#units, docs/ingest-v1.md#3-positions-spans-and-cursors).

A packed language-model batch is cut from a stream of documents concatenated in the epoch's
order; its unit of progress is the token, not the sample. A sequence of ``L`` tokens taken at
offset ``o`` of a stratum's stream holds the token positions ``[o, o + L)``; a sequence that packs
the end of one document and the start of the next is still one contiguous range, and a document
consumed in part counts exactly the tokens consumed. :class:`TokenRanges` carries those ranges
through the observed ledger's :class:`~recoverydash.sdk.observe.BatchTag` in place of a list of
sample positions, so a 2,048-token sequence costs one pair, never 2,048 integers; the spans of an
``update_committed`` are then token ranges (``sampler.units`` says ``"tokens"`` for the stratum)
and its ``tokens`` field counts them. Padding tokens that carry no document are a range of their
own under an :class:`~recoverydash.sdk.observe.Iteration` whose ``padding_from`` is 0: they are
sent as a ``padding`` span and never counted.
"""

from __future__ import annotations

from operator import itemgetter

TOKENS = "tokens"

_START, _STOP = itemgetter(0), itemgetter(1)


class TokenRanges(list):
    """Half-open token ranges ``(start, stop)`` of one stratum's stream, in the order the model
    received them (one per packed sequence, or per document piece). Units: tokens.

    ``identities``: the same tokens named by their offsets in the source's own token stream (its
    documents in document order, each ``(document start + offset)``), as half-open ranges: the
    span's ``indices`` (docs/ingest-v1.md#3-positions-spans-and-cursors), by which the server
    compares two orders of the stream (another seed, sequence length or blend). None when the
    loader cannot name them (a restart that would need them is then ``unverified``)."""

    __slots__ = ("identities",)

    def __init__(self, ranges=(), identities: list | DeferredIdentities | None = None):
        super().__init__(ranges)
        self.identities = identities

    def __reduce__(self):
        return (TokenRanges, (list(self), self.identities))

    # sums and extremes over itemgetter maps: C loops, no Python frame per range (the commit of
    # every update reads ``highest``; bench/sdk_overhead.py, packing)

    def tokens(self) -> int:
        """How many tokens the ranges hold, counted with repeats."""
        return sum(map(_STOP, self)) - sum(map(_START, self))

    def highest(self) -> int:
        """The highest token position held (the ranges are not empty)."""
        return max(map(_STOP, self)) - 1

    def lowest(self) -> int:
        """The lowest token position held (the ranges are not empty)."""
        return min(map(_START, self))

    def below(self, bound: int) -> TokenRanges:
        """The parts of the ranges below ``bound``."""
        return TokenRanges(((s, min(e, bound)) for s, e in self if s < bound), self.identities)


class DeferredIdentities:
    """Identities of token ranges computed where the update is sent (the sender thread), not
    where the batch is made: ``items`` (e.g. ``(source, sample)`` pairs) resolved by the function
    registered under ``key`` (:func:`register_identities`) into half-open ``(start, stop)``
    ranges. Pickled as the key and the items, so a worker process's tag resolves in the trainer's
    process; an unknown key resolves to None (no ``indices`` sent).

    ``DeferredIdentities(key, source=s, samples=[p, ...])`` holds the items ``[(s, p), ...]`` of
    one source without building them: ``items`` makes that list on first use (on the sender
    thread, when the update is sent), not on the training thread where the batch is tagged.
    ``samples`` is kept, not copied: it must not change afterwards."""

    __slots__ = ("_items", "_source", "_samples", "key")

    def __init__(self, key: str, items: list | None = None, *, source: object = None,
                 samples: list | None = None):
        self.key = key
        self._source, self._samples = source, samples
        self._items = items if items is not None or samples is not None else []

    @property
    def items(self) -> list:
        """The ``(source, sample)`` items (or whatever the resolver of ``key`` takes)."""
        found = self._items
        if found is None:
            found = self._items = [(self._source, p) for p in self._samples or ()]
        return found

    @items.setter
    def items(self, value: list) -> None:
        self._items = value

    def __reduce__(self):
        return (DeferredIdentities, (self.key, self.items))

    def resolve(self) -> list | None:
        fn = _RESOLVERS.get(self.key)
        if fn is None:
            return None
        try:
            return fn(self.items)
        except Exception:  # noqa: BLE001 - identities are optional; the positions stay exact
            return None


_RESOLVERS: dict = {}


def register_identities(key: str, resolver) -> None:
    """Resolve :class:`DeferredIdentities` of ``key`` with ``resolver(items) -> [(start,
    stop)]``."""
    _RESOLVERS[key] = resolver


def identities_of(ranges: TokenRanges) -> list | None:
    """The identities of ``ranges`` as ``(start, stop)`` ranges (deferred ones resolved), or
    None when they are unknown."""
    found = ranges.identities
    if isinstance(found, DeferredIdentities):
        return found.resolve()
    return found


def identities_of_all(identities: list) -> list | None:
    """The identities of several groups of token ranges (each group's ``identities``: a list of
    ranges, a :class:`DeferredIdentities`, or None) as one list of ``(start, stop)`` ranges, in
    no particular order (a span sends their union, :func:`merge`); None when one group's are
    unknown. The deferred ones of one key are resolved in one call over all their items, so a
    resolver (``register_identities``) must name each item on its own: resolving a list is
    resolving each item and concatenating."""
    out: list = []
    deferred: dict[str, list] = {}
    for found in identities:
        if found is None:
            return None
        if isinstance(found, DeferredIdentities):
            deferred.setdefault(found.key, []).extend(found.items)
        else:
            out.extend(found)
    for key, items in deferred.items():
        got = DeferredIdentities(key, items).resolve()
        if got is None:
            return None
        out.extend(got)
    return out


def merge(ranges: list) -> tuple[list[list[int]], int]:
    """``(ranges, repeated)``: the union of half-open ``(start, stop)`` ranges as sorted,
    disjoint ``[start, stop]`` pairs (touching ranges joined), and how many token positions the
    input held more than once (a repeat inside one update, which spans cannot express). Exact:
    ``sum(stop - start)`` of the union plus ``repeated`` equals the input's token count."""
    out: list[list[int]] = []
    total = 0
    last: list[int] = []
    end = None  # the stop of ``last``, the range appended last
    for start, stop in sorted(ranges):
        if stop <= start:
            continue
        total += stop - start
        if end is not None and start <= end:
            if stop > end:
                last[1] = end = stop
        else:
            last, end = [start, stop], stop
            out.append(last)
    union = sum(map(_STOP, out)) - sum(map(_START, out))
    return out, total - union
