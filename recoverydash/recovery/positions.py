"""Position sets on roaring bitmaps (docs/ingest-v1.md section 3; docs/definitions.md#counting).

A *position key* is ``(stratum, epoch, order)``: positions are only compared within one key
(``order`` None when a span names none). Positions are ints in ``[0, 2**63)``; sample identities
(``"ids"`` spans) become positions through :func:`identity_position`.

Run geometry. One data-parallel rank's range for one key, repeated over consecutive updates, is a
*run* ``(u0, u1, a, adv, m, s)``: at update ``u`` in ``[u0, u1]`` the rank consumed
``range(a + (u - u0) * adv, ..., step=s)`` with ``m`` elements. Runs of several ranks with the same
``(u0, u1, adv, m, s)`` form a *group*; a DistributedSampler batch (rank r of W owns r, r+W, ...)
is a group whose starts are W consecutive integers, and its union is one contiguous range, which
:func:`add_group` adds to a bitmap in O(1) instead of position by position.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable

from pyroaring import BitMap64

#: Upper bound (exclusive) of a position, docs/ingest-v1.md#3-positions-spans-and-cursors.
POSITION_LIMIT = 2 ** 63
#: Longest reach ``stop - start`` of one wire range the core accepts (2**30 positions). A range is
#: kept as geometry, but counting builds roaring bitmaps, which need one container per 2**16
#: positions of reach: without a bound, one legal span ``[0, 2**63 - 1]`` needs 2**47 containers.
#: Within it a range costs at most 16,385 containers (about 2 MB contiguous, at most 128 MB for
#: the densest strided ranges), so memory is bounded by the number of reports. Longer ranges raise
#: ValueError (the server refuses them at ingest; one rank's share of one update is far below).
MAX_RANGE_LENGTH = 2 ** 30


def identity_position(identity: int | str) -> int:
    """Map a sample identity (spec 3, ``"ids"``) to a position.

    An int in ``[0, 2**63)`` is its own position. A str is hashed: the first 8 bytes of
    ``blake2b(utf8(identity), digest_size=8)`` read big-endian (an unsigned 64-bit value). Any
    other int is hashed the same way from ``"int:" + decimal``. Raises TypeError for other types.
    """
    if isinstance(identity, bool):
        raise TypeError("a sample identity is an int or a str, not a bool")
    if isinstance(identity, int):
        if 0 <= identity < POSITION_LIMIT:
            return identity
        data = f"int:{identity:d}".encode()
    elif isinstance(identity, str):
        data = identity.encode("utf-8")
    else:
        raise TypeError(f"a sample identity is an int or a str, not {type(identity).__name__}")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def span_key(span: dict) -> tuple:
    """``(stratum, epoch, order)`` of a wire span; epoch defaults to 0, order to None."""
    return (span["stratum"], int(span.get("epoch", 0)), span.get("order"))


def wire_range(item) -> range:
    """A wire range ``[start, stop]`` or ``[start, stop, step]`` as a Python range.

    Raises ValueError when ``0 <= start <= stop < 2**63`` or ``step >= 1`` does not hold, or when
    ``stop - start`` exceeds :data:`MAX_RANGE_LENGTH`."""
    start, stop = int(item[0]), int(item[1])
    step = int(item[2]) if len(item) > 2 else 1
    if not (0 <= start <= stop < POSITION_LIMIT) or step < 1:
        raise ValueError(f"bad range {list(item)!r}: need 0 <= start <= stop < 2**63, step >= 1")
    if stop - start > MAX_RANGE_LENGTH:
        raise ValueError(f"range {list(item)!r} spans {stop - start} positions, more than the "
                         f"{MAX_RANGE_LENGTH} (2**30) the recovery core accepts in one range")
    return range(start, stop, step)


def index_set(items) -> BitMap64:
    """The dataset indices of a span's ``indices`` (docs/ingest-v1.md#3-positions-spans-and-
    cursors) as a set: each item an int in ``[0, 2**63)`` or a range ``[start, stop]`` /
    ``[start, stop, step]`` (:func:`wire_range`'s rules). Raises ValueError on an item that is
    neither (the server refuses it at ingest)."""
    out = BitMap64()
    for item in items:
        if type(item) is int:
            if not 0 <= item < POSITION_LIMIT:
                raise ValueError(f"bad dataset index {item!r}: need 0 <= index < 2**63")
            out.add(item)
        elif isinstance(item, (list, tuple)):
            r = wire_range(item)
            if r.step == 1:
                out.add_range(r.start, r.stop)
            else:
                out.update(r)
        else:
            raise ValueError(f"bad dataset index {item!r}: need an int or a range")
    return out


def report_positions(spans: Iterable[dict]) -> dict[tuple, BitMap64]:
    """Union of one reporter's spans per position key, padding spans excluded (spec 3, 4:
    reports of one data-parallel rank for one update are united). Keys with no position are
    left out."""
    out: dict[tuple, BitMap64] = {}
    for span in spans:
        if span.get("padding"):
            continue
        bitmap = out.get(span_key(span))
        if bitmap is None:
            bitmap = out[span_key(span)] = BitMap64()
        if span.get("ids") is not None:
            bitmap.update(identity_position(i) for i in span["ids"])
        for item in span.get("ranges") or ():
            bitmap.update(wire_range(item))
    return {key: bm for key, bm in out.items() if bm}


def range_positions(a: int, m: int, s: int) -> range:
    """The ``m`` positions ``a, a + s, ...`` as a range."""
    return range(a, a + m * s, s)


def add_group(bitmap: BitMap64, n: int, starts: list[int], adv: int, m: int, s: int) -> None:
    """Add the union of a group of runs to ``bitmap``.

    The group covers ``n`` consecutive updates; each start ``a`` in ``starts`` (sorted, distinct)
    contributes ``range(a + k * adv, ..., step=s)`` of ``m`` positions at its k-th update. Blocks of
    consecutive starts whose per-update union is contiguous (``s == 1``, ``m == 1`` or at least
    ``s`` consecutive starts: the DistributedSampler case) are added as ranges; other runs as
    strided ranges, which pyroaring adds in C.
    """
    i = 0
    count = len(starts)
    while i < count:
        j = i
        while j + 1 < count and starts[j + 1] == starts[j] + 1:
            j += 1
        first, width = starts[i], j - i + 1
        if s == 1 or m == 1 or width >= s:
            span = (m - 1) * s + width
            _add_blocks(bitmap, first, n, adv, span)
        else:
            for a in starts[i:j + 1]:
                if adv == m * s:
                    bitmap.update(range(a, a + n * m * s, s))
                else:
                    for k in range(n):
                        bitmap.update(range_positions(a + k * adv, m, s))
        i = j + 1


def _add_blocks(bitmap: BitMap64, first: int, n: int, adv: int, width: int) -> None:
    """Add ``[first + k*adv, first + k*adv + width)`` for k in ``range(n)``."""
    if n == 1 or adv == 0:
        bitmap.add_range(first, first + width)
    elif 0 < adv <= width:
        bitmap.add_range(first, first + (n - 1) * adv + width)
    elif -width <= adv < 0:
        bitmap.add_range(first + (n - 1) * adv, first + width)
    else:
        for k in range(n):
            bitmap.add_range(first + k * adv, first + k * adv + width)
