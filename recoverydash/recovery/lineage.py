"""Lineage (docs/definitions.md#lineage): how each attempt started, the chain of committed
updates a model state contains, and a lineage's positions read from the ledger.

A :class:`Lineage` is a tuple of :class:`Segment` (updates ``after < u <= upto`` of one attempt),
newest first; :func:`lineage_of` builds it from the :class:`Resume` of every attempt
(:func:`resolve_resumes`). :func:`lineage_counts` and :func:`lineage_frontier` read its positions
from the :class:`~.ledger.Ledger` (runs and bitmaps, never position by position);
:func:`lineage_floors` says where a lineage with an unknown root started tracking each key.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import cast

from pyroaring import BitMap64

from .counting import KeyCount
from .inputs import AttemptRecord, GenerationRecord


@dataclass(frozen=True)
class Segment:
    """Updates ``after < u <= upto`` of one attempt (``upto`` None: no upper bound)."""

    attempt: int
    after: int
    upto: int | None

    def holds(self, update: int) -> bool:
        return self.after < update and (self.upto is None or update <= self.upto)


@dataclass(frozen=True)
class Resume:
    """How an attempt started. ``kind``: ``fresh`` (update 0), ``generation`` (a generation whose
    writer attempt is known and older), or ``untracked`` (no or unknown generation: the root of
    its lineage, positions behind ``cursor`` consumed before tracking began).
    ``update`` is U: the generation's update for ``generation``, else the declared update."""

    attempt: int
    kind: str
    update: int
    generation_id: str | None = None
    writer: int | None = None
    declared_update: int | None = None
    cursor: tuple = ()
    #: the lower bound (exclusive) of the attempt's own updates when it numbers them from at or
    #: below U (docs/definitions.md#renumbered-updates): its first committed update - 1; None
    #: when it numbers them above U
    renumbered: int | None = None
    #: ``untracked`` only: nothing of the attempt arrived (no ``attempt_started``, no committed
    #: update), it is known only by a generation it wrote, e.g. a manifest found in storage
    #: (docs/definitions.md#resume-from-a-generation-the-server-had-not-seen)
    unseen: bool = False
    #: ``generation`` only: the resumed generation's data cursor (its manifest's
    #: ``data_progress.cursor``), what a lineage through an unseen writer consumed before U
    generation_cursor: tuple = ()

    @property
    def after(self) -> int:
        """Where the attempt's own updates start (exclusive): U, or below it when the attempt
        renumbered its updates (:attr:`renumbered`)."""
        return self.update if self.renumbered is None else self.renumbered


@dataclass(frozen=True)
class Lineage:
    """docs/definitions.md#lineage: the chain of committed updates that a model state contains.
    ``segments`` newest first; ``pretracked`` the root's untracked starting cursors as
    ``(stratum, epoch, position, order)``; ``root`` the attempt the chain starts from;
    ``unknown_root``: the root started from an untracked or unknown state (not fresh)."""

    segments: tuple
    pretracked: tuple = ()
    root: int | None = None
    unknown_root: bool = False

    def holds(self, attempt: int, update: int) -> bool:
        """Whether update ``update`` of attempt ``attempt`` is part of this lineage."""
        return any(seg.attempt == attempt and seg.holds(update) for seg in self.segments)

    def contains_state(self, attempt: int, update: int) -> bool:
        """Whether the state of ``attempt`` at ``update`` (a generation) lies on this lineage:
        some segment of ``attempt`` with ``after <= update <= upto``."""
        return any(seg.attempt == attempt and seg.after <= update
                   and (seg.upto is None or update <= seg.upto) for seg in self.segments)

    def place(self, attempt: int, update: int) -> tuple | None:
        """Where the state of ``attempt`` at ``update`` lies on this lineage, as a sortable
        ``(segment, update)``: the segment's number from the oldest (0) up, then the update; None
        when the state is not on it (:meth:`contains_state`). States are ordered by attempt and
        order of commit, not by update number alone: an attempt that renumbered its updates
        below U (docs/definitions.md#renumbered-updates) is later than every state of the
        lineage it restored."""
        last = len(self.segments) - 1
        for i, seg in enumerate(self.segments):
            if seg.attempt == attempt and seg.after <= update \
                    and (seg.upto is None or update <= seg.upto):
                return (last - i, update)
        return None

    def before_own(self) -> Lineage:
        """The lineage without its newest segment (the restored state's lineage, at or below U)."""
        return Lineage(self.segments[1:], self.pretracked, self.root, self.unknown_root)


def generation_writer(gen: GenerationRecord, attempts, ledger=None) -> int:
    """The attempt that wrote generation ``gen`` (docs/definitions.md#writer-of-a-generation):

    1. the manifest's own ``attempt`` (the SDK writes it; discovery reads it from storage), when
       it names a known attempt;
    2. else the attempt that reported ``checkpoint_started`` or a ``shard_written`` for it (only
       the writer saves);
    3. else (the generation is known only from a ``checkpoint_committed``, e.g. a manifest found
       and reported by the next launch) the newest attempt at or below the reporting one whose
       ledger holds the generation's update: the attempt that committed that update. When none
       does, the reporting attempt.

    ``attempts``: the known attempt numbers (a container); ``ledger``: the run's
    :class:`~.ledger.Ledger` (None: rule 3 falls back to the reporting attempt)."""
    manifest = gen.manifest_head()
    named = manifest.get("attempt") if manifest is not None else None
    if type(named) is int and named in attempts:
        return named
    if gen.started_at is not None or gen.has_shards() or ledger is None:
        return gen.attempt
    update = gen.state_update()
    if type(update) is not int or update <= 0:
        return gen.attempt
    holders = [number for number, state in ledger.attempts.items()
               if number <= gen.attempt and update in state.updates]
    return max(holders) if holders else gen.attempt


def resolve_resumes(attempts: dict[int, AttemptRecord],
                    generations: dict[str, GenerationRecord],
                    writers: dict | None = None, firsts: dict | None = None) -> dict[int, Resume]:
    """How every attempt started (docs/definitions.md#lineage). An attempt with no AttemptRecord is
    fresh when it is the first one, else untracked (its start is unknown). ``writers``:
    ``{generation_id: attempt}`` (:func:`generation_writer`); a generation absent from it was
    written by the attempt that reported it. ``firsts``: ``{attempt: its lowest committed update}``
    (the ledger's); an attempt that resumed at U and whose lowest update is at or below U renumbered
    its updates (docs/definitions.md#renumbered-updates: :attr:`Resume.renumbered`)."""
    out = _resolve(attempts, generations, writers or {}, set(firsts or {}))
    for number, first in (firsts or {}).items():
        resume = out.get(number)
        if resume is not None and resume.kind != "fresh" and first is not None \
                and first <= resume.update:
            out[number] = replace(resume, renumbered=first - 1)
    return out


def data_cursor(gen: GenerationRecord) -> tuple:
    """The generation's data cursor (its manifest's ``data_progress.cursor``), () when it has
    none or no manifest is in."""
    manifest = gen.manifest_head() or {}
    progress = manifest.get("data_progress")
    cursor = progress.get("cursor") if isinstance(progress, dict) else None
    return tuple(c for c in cursor if isinstance(c, dict) and "stratum" in c) \
        if isinstance(cursor, list) else ()


def _resolve(attempts: dict, generations: dict, writers: dict,
             committing: set) -> dict[int, Resume]:
    out: dict[int, Resume] = {}
    first = min(attempts) if attempts else 0
    wrote = set(writers.values()) | {g.attempt for gid, g in generations.items()
                                     if gid not in writers}
    for number, record in attempts.items():
        source = record.resumed_from
        if source is None:
            if record.started_at is None and number not in committing and number in wrote:
                # docs/definitions.md#resume-from-a-generation-the-server-had-not-seen
                out[number] = Resume(number, "untracked", 0, unseen=True)
                continue
            # the first attempt heard of is fresh when it says so (attempt_started) or is
            # attempt 0; numbered above 0 without a word, attempts before it ran unseen
            fresh = record.started_at is not None or number == first == 0
            out[number] = Resume(number, "fresh" if fresh else "untracked", 0)
            continue
        declared = int(source.get("update") or 0)
        cursor = tuple(source.get("cursor") or ())
        gid = source.get("generation_id")
        gen = generations.get(gid) if gid is not None else None
        writer = None if gen is None else writers.get(gid, gen.attempt)
        if gen is not None and writer < number:
            update = gen.state_update()
            out[number] = Resume(number, "generation", declared if update is None else update,
                                 gid, writer, declared, cursor,
                                 generation_cursor=data_cursor(gen))
        else:
            out[number] = Resume(number, "untracked", declared, gid, None, declared, cursor)
    return out


def lineage_of(number: int, resumes: dict[int, Resume], cap: int | None = None) -> Lineage:
    """docs/definitions.md#lineage: attempt ``number``'s own committed updates above U, plus the
    lineage of the attempt that wrote the restored generation restricted to updates at or below U,
    recursively; ``cap`` restricts the whole lineage to updates at or below it."""
    resume = resumes[number]
    own = Segment(number, resume.after, cap)
    if resume.kind == "generation":
        # a cap counts in the attempt's own numbering: below U only when it did not renumber
        limit = resume.update if cap is None or resume.renumbered is not None \
            else min(cap, resume.update)
        parent = lineage_of(cast(int, resume.writer), resumes, limit)  # a generation's writer
        pretracked = parent.pretracked
        if resumes[cast(int, resume.writer)].unseen:
            # nothing of the writer arrived: what it consumed before U is the generation's
            # data cursor (docs/definitions.md#resume-from-a-generation-the-server-had-not-seen)
            pretracked = _pretracked(resume.generation_cursor)
        return Lineage((own,) + parent.segments, pretracked, parent.root, parent.unknown_root)
    if resume.kind != "untracked":
        return Lineage((own,), (), number)
    return Lineage((own,), _pretracked(resume.cursor), number, True)


def _pretracked(cursor) -> tuple:
    """A wire cursor as a lineage's ``pretracked`` ``(stratum, epoch, position, order)``."""
    return tuple((c["stratum"], int(c.get("epoch", 0)), int(c.get("position", 0)),
                  c.get("order")) for c in cursor)


def lineage_floors(ledger, lineage: Lineage) -> dict:
    """``{key: floor}``: where a lineage whose root is unknown started tracking each key.

    docs/definitions.md#lineage: positions behind where an untracked root starts were consumed (or
    not) before tracking began. With a cursor naming the stratum they count as consumed
    (``pretracked``); without one nothing is known about them, so they count neither as consumed nor
    as omitted (no replay or omission can rest on them). The start of a stratum is the lineage's
    first update that consumed it (the lineage's segments are disjoint and ordered by update); every
    key (stratum, epoch, order) consumed at that update gets its smallest position there as floor,
    when no cursor names the stratum, or when a cursor names the (stratum, epoch) but not that order
    (a cursor without ``order`` applies to order None). Empty for a fresh root: a lineage tracked
    from update 0 owes every position below its frontier."""
    if not lineage.unknown_root:
        return {}
    named: dict = {}
    for stratum, epoch, _position, order in lineage.pretracked:
        named.setdefault(stratum, set()).add((epoch, order))
    out: dict = {}
    for stratum, (_update, keys) in _first_keys(ledger, lineage, ids=False).items():
        cursors = named.get(stratum)
        for key, position in keys.items():
            if cursors is None or ((key[1], key[2]) not in cursors
                                   and any(epoch == key[1] for epoch, _ in cursors)):
                out[key] = position
    return out


def _first_keys(ledger, lineage: Lineage, ids: bool) -> dict:
    """``{stratum: (update, {key: smallest position})}``: per stratum of positions (``ids``
    False) or of sample ids (True), the lineage's first update that consumed it (the oldest
    segment that consumed it, there the lowest update) and the keys consumed there."""
    first: dict = {}
    for seg in reversed(lineage.segments):  # oldest first: commit order, not update numbers
        here: dict = {}
        for key, (update, position) in ledger.first_by_key(seg.attempt, seg.after,
                                                           seg.upto).items():
            if (key[0] in ledger.id_strata) != ids or key[0] in first:
                continue
            have = here.get(key[0])
            if have is None or update < have[0]:
                here[key[0]] = (update, {key: position})
            elif update == have[0]:
                have[1][key] = position
        first.update(here)
    return first


def untracked_id_keys(ledger, lineage: Lineage) -> set:
    """Keys ``(stratum, epoch, order)`` of sample-id strata whose ids before tracking began are
    unknown: for a lineage whose root is unknown, the keys each id stratum consumed at the
    lineage's first update of it (the epoch it joined mid-way, with no cursor that could say
    which ids came before). No id of those keys is owed (docs/definitions.md#sample-id-strata,
    as :func:`lineage_floors` for positions). Empty for a fresh root."""
    if not lineage.unknown_root:
        return set()
    return {key for _update, keys in _first_keys(ledger, lineage, ids=True).values()
            for key in keys}


def lineage_counts(ledger, lineage: Lineage) -> dict:
    """``{key: KeyCount}`` of a lineage: every segment's positions, plus the pre-tracking
    positions ``[0, cursor.position)`` of its root, counted once (docs/definitions.md#lineage).
    A key no segment consumed, known only from the root's cursor, is ``pretracked_only``: what
    lies above the cursor is before the resume too, unknown, never omitted
    (docs/definitions.md#unknown-lineage-root)."""
    out: dict = {}
    for seg in lineage.segments:
        for key, count in ledger.segment(seg.attempt, seg.after, seg.upto).items():
            mine = out.get(key)
            if mine is None:
                mine = out[key] = KeyCount(0, BitMap64())
            mine.consumed += count.consumed
            mine.positions |= count.positions
    for stratum, epoch, position, order in lineage.pretracked:
        if stratum in ledger.id_strata or position <= 0:
            continue
        mine = out.get((stratum, epoch, order))
        if mine is None:  # reached only through the unknown root's cursor
            mine = out[(stratum, epoch, order)] = KeyCount(0, BitMap64(), pretracked_only=True)
        mine.consumed += position
        mine.prefix = max(mine.prefix, position)   # an interval: never a bitmap of [0, position)
    for key, floor in lineage_floors(ledger, lineage).items():
        if key in out:
            out[key].floor = floor
    return out


def lineage_frontier(ledger, lineage: Lineage) -> dict:
    """``{key: frontier}`` of a lineage from run geometry (no bitmaps); see lineage_counts."""
    out: dict = {}
    for seg in lineage.segments:
        for key, top in ledger.frontier_in(seg.attempt, seg.after, seg.upto).items():
            if top > out.get(key, 0):
                out[key] = top
    for stratum, epoch, position, order in lineage.pretracked:
        if stratum not in ledger.id_strata and position > out.get((stratum, epoch, order), 0):
            out[(stratum, epoch, order)] = position
    return out


def _best_keys(frontiers: dict, id_strata: set) -> dict:
    """``{stratum: ((epoch, frontier), key)}``: per stratum of positions, the highest epoch it
    reached and there the highest frontier over orders (the first key seen on a tie)."""
    best: dict = {}
    for key, top in frontiers.items():
        stratum = key[0]
        if top <= 0 or stratum in id_strata:
            continue
        have = best.get(stratum)
        if have is None or (key[1], top) > have[0]:
            best[stratum] = ((key[1], top), key)
    return best


def cursor_keys(frontiers: dict, id_strata: set) -> dict:
    """``{stratum: key}``: the position key ``(stratum, epoch, order)`` that gives each
    stratum's cursor (:func:`cursor_of`): the highest epoch the stratum reached, there the
    highest frontier (on a tie between orders, the first in ``frontiers``). Strata of sample
    ids and keys with nothing consumed have none."""
    return {stratum: key for stratum, (_rank, key) in _best_keys(frontiers, id_strata).items()}


def cursor_of(frontiers: dict, id_strata: set) -> list[dict]:
    """The lineage's frontier per stratum as wire cursors (docs/definitions.md#expected-cursor):
    the highest epoch the stratum reached, and there the highest frontier over orders
    (:func:`cursor_keys`). Strata of sample ids have no cursor. Sorted by stratum."""
    return [{"stratum": stratum, "epoch": epoch, "position": top}
            for stratum, ((epoch, top), _key) in sorted(_best_keys(frontiers, id_strata).items())]
