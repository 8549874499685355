"""Counting (docs/definitions.md#counting): per position key ``(stratum, epoch, order)`` of a
lineage, count(p) is the number of (update, data-parallel rank) pairs that consumed position p;
consumed, duplicates, omissions and their rates per stratum.

:class:`KeyCount` holds one key's positions of a lineage (built by :mod:`.lineage` from the
ledger's runs and bitmaps, never position by position); :func:`.epochs.count_strata` sums
them per stratum through the run's :class:`~.view.RunView`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pyroaring import BitMap64

from .result import StratumEntry

SAMPLES, TOKENS, MIXED = "samples", "tokens", "mixed"
"""The units of a stratum's positions (docs/definitions.md#units): a sample (the default) or a
token of a packed stream (``sampler.units``); ``MIXED`` names a sum over strata of both."""


def below(bitmap: BitMap64, position: int) -> int:
    """How many elements of ``bitmap`` are below ``position``."""
    return bitmap.rank(position - 1) if position > 0 else 0


@dataclass
class KeyCount:
    """Positions of one key in a lineage: ``consumed`` (sum of count(p)), the distinct set of
    reported positions, and ``prefix``: positions ``[0, prefix)`` consumed before tracking began
    (an untracked root's cursor), kept as an interval, never as a bitmap (a cursor may be at
    2**62)."""

    consumed: int = 0
    positions: BitMap64 = field(default_factory=BitMap64)
    prefix: int = 0
    #: positions below ``floor`` are unknown (a lineage with an unknown root started this key
    #: there): neither consumed nor omitted (see :func:`lineage_floors`)
    floor: int = 0
    #: the key is known only from an unknown root's cursor, no tracked update consumed it: what
    #: lies above the cursor was before the resume too, unknown
    #: (docs/definitions.md#unknown-lineage-root)
    pretracked_only: bool = False

    @property
    def distinct(self) -> int:
        return self.prefix + len(self.positions) - below(self.positions, self.prefix)

    def frontier(self) -> int:
        """docs/definitions.md#frontier: max consumed position + 1 (0 when nothing was consumed)."""
        return max(self.prefix, self.positions.max() + 1 if self.positions else 0)

    def gaps(self) -> int:
        """docs/definitions.md#omissions: ``|{floor <= p < frontier : count(p) = 0}|``."""
        top, low = self.frontier(), self.floor
        if top <= low:
            return 0
        covered = max(0, self.prefix - low) + len(self.positions) \
            - below(self.positions, max(low, self.prefix))
        return top - low - covered

    def hits(self, positions: BitMap64) -> int:
        """``|positions & (self.positions | [0, prefix))|``."""
        if not self.prefix:
            return positions.intersection_cardinality(self.positions)
        both = positions & self.positions
        return below(positions, self.prefix) + len(both) - below(both, self.prefix)


@dataclass
class StratumCount:
    """docs/definitions.md#counting, summed over a stratum's epochs and orders."""

    stratum: str
    consumed: int = 0
    distinct: int = 0
    duplicates: int = 0
    omissions: int = 0
    units: str = SAMPLES

    @property
    def duplicate_rate(self) -> float:
        """docs/definitions.md#duplicate-rate: duplicates / consumed (0.0 when nothing was
        consumed)."""
        return self.duplicates / self.consumed if self.consumed else 0.0

    @property
    def omission_rate(self) -> float:
        """docs/definitions.md#omission-rate: omissions / (omissions + distinct consumed) (0.0
        when both are 0)."""
        total = self.omissions + self.distinct
        return self.omissions / total if total else 0.0

    def to_dict(self) -> StratumEntry:
        return {"stratum": self.stratum, "consumed": self.consumed,
                "duplicates": self.duplicates, "omissions": self.omissions,
                "duplicate_rate": self.duplicate_rate, "omission_rate": self.omission_rate,
                "units": self.units}


def units_of(units: list[str]) -> str:
    """docs/definitions.md#units: the unit of a count summed over strata of ``units`` (one
    entry per stratum): that unit when they agree (``SAMPLES`` for none), else ``MIXED``."""
    found = set(units)
    if len(found) > 1:
        return MIXED
    return found.pop() if found else SAMPLES


def unit_word(units: str | None) -> str:
    """docs/definitions.md#units: what a count in ``units`` is called in words (findings, pages,
    alerts): ``"tokens"`` for ``TOKENS``, ``"positions (samples and tokens)"`` for ``MIXED``,
    ``"positions"`` for samples and for a result stored before units existed (None)."""
    if units == TOKENS:
        return "tokens"
    if units == MIXED:
        return "positions (samples and tokens)"
    return "positions"


def duplicates(count: KeyCount) -> int:
    """docs/definitions.md#duplicates: sum max(count(p) - 1, 0) = consumed - distinct."""
    return count.consumed - count.distinct


def epoch_tail(frontier: int, epoch_length: int | None, global_batch: int | None) -> int:
    """docs/definitions.md#omissions, the epoch tail rule: the unconsumed tail
    ``epoch_length - frontier`` of an epoch the lineage moved on from, unless it is shorter
    than one global batch (the drop_last remainder). 0 when ``epoch_length`` is unknown; an
    unknown global batch drops no tail."""
    if epoch_length is None:
        return 0
    tail = epoch_length - frontier
    if tail <= 0 or (global_batch is not None and tail < global_batch):
        return 0
    return tail


def skipped_epochs(epochs) -> int:
    """How many epochs lie strictly between consumed ``epochs`` and are not among them (epochs
    below the lowest one are not skipped: numbering may start anywhere, and an unknown root's
    earlier epochs were before tracking). Arithmetic on the distinct epochs, never a walk."""
    ordered = sorted(set(epochs))
    return sum(b - a - 1 for a, b in zip(ordered, ordered[1:], strict=False))


#: What a stratum's reports name (:func:`stratum_kind`): positions along an order, sample ids
#: that are all ints in [0, 2**63) (dataset indices), or sample ids of which some were hashed.
POSITIONS, INTEGER_IDS, HASHED_IDS = "positions", "integer ids", "hashed ids"


def stratum_kind(ledger, stratum: str) -> str:
    """:data:`POSITIONS`, :data:`INTEGER_IDS` or :data:`HASHED_IDS` for ``stratum`` of
    ``ledger`` (:meth:`.ledger.Ledger.integer_id_strata`)."""
    if stratum not in ledger.id_strata:
        return POSITIONS
    return HASHED_IDS if stratum in ledger.hashed_strata else INTEGER_IDS


def omissions(key: tuple, count: KeyCount, moved_on: bool, epoch_length: int | None,
              global_batch: int | None, kind: str = POSITIONS) -> int:
    """docs/definitions.md#omissions for one position key of a lineage.

    Positions: ``|{floor <= p < frontier : count(p) = 0}|`` (floor 0 unless the lineage's root
    is unknown, see :func:`.lineage.lineage_floors`), plus the epoch tail when the lineage
    ``moved_on`` to a later epoch of the stratum (:func:`epoch_tail`).

    Integer sample ids (docs/definitions.md#sample-id-strata): ids have no order, so nothing is
    owed while the epoch is in progress; once the lineage ``moved_on`` and ``epoch_length`` is
    known, the ids in ``[0, epoch_length)`` never consumed count, under the same tail rule (fewer
    than one global batch of them is the drop_last remainder, by design). Ids of which some were
    hashed are no dataset indices: no omissions."""
    if kind == HASHED_IDS:
        return 0
    if kind == INTEGER_IDS:
        if not moved_on or epoch_length is None or epoch_length <= 0:
            return 0
        return epoch_tail(count.positions.range_cardinality(0, epoch_length), epoch_length,
                          global_batch)
    gap = count.gaps()
    if count.pretracked_only:  # positions before the resume of an unknown root: never owed
        return gap
    return gap + (epoch_tail(count.frontier(), epoch_length, global_batch) if moved_on else 0)
