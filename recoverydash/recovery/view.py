"""One run as the figures read it: :class:`RunView`.

:func:`.analysis.analyze` builds one view per analysis and hands it to every figure (generation
statuses, restarts, counting, costs, chart series) instead of passing callbacks around. The view
caches what several figures ask for (lineages, their counts), so each is computed once per
analysis.
"""
from __future__ import annotations

from .concurrency import live_attempt
from .counting import SAMPLES, TOKENS
from .inputs import AttemptRecord, RunInput
from .ledger import Ledger
from .lineage import (
    Lineage,
    Segment,
    generation_writer,
    lineage_counts,
    lineage_floors,
    lineage_frontier,
    lineage_of,
    resolve_resumes,
    untracked_id_keys,
)
from .samplers import RecreatedOrder, recreated_order

#: Seconds after its first report at which an update counts as settled even though some
#: rank's part of it never arrived (docs/definitions.md#updates-counted-once-complete); the
#: server passes ``RECOVERYDASH_SETTLE_S``.
DEFAULT_SETTLE_SECONDS = 300.0


class RunView:
    """A run's inputs and compact ledger, and the questions the figures ask of them.

    Attributes: ``run`` (RunInput), ``ledger`` (Ledger), ``attempts`` (``{number:
    AttemptRecord}`` sorted by number, including attempts known only from their reports),
    ``generations`` (``{generation_id: GenerationRecord}``), ``writers`` (``{generation_id:
    attempt}``, :func:`.lineage.generation_writer`), ``resumes`` (``{number: Resume}``,
    :func:`.lineage.resolve_resumes`), ``live`` (the live attempt's number, None without
    attempts: the newest, unless it ended while an older one kept going,
    :func:`.concurrency.live_attempt`), ``id_strata`` (strata reported as sample ids).

    Methods: :meth:`lineage`, :meth:`counts`, :meth:`frontier`, :meth:`floors`,
    :meth:`untracked_ids`, :meth:`epoch_length`, :meth:`recreated_order`, :meth:`global_batch`,
    :meth:`reaches`, :meth:`fetched`."""

    def __init__(self, run: RunInput, ledger: Ledger, now: float | None = None,
                 settle_seconds: float = DEFAULT_SETTLE_SECONDS) -> None:
        self.run = run
        self.ledger = ledger
        #: the run's heartbeats folded (:class:`.heartbeats.HeartbeatFold`): the ledger's fold,
        #: plus ``run.heartbeats`` when the input carries heartbeats of its own
        self.beats = ledger.beats
        if run.heartbeats:
            self.beats = ledger.beats.copy()
            self.beats.absorb(run.heartbeats)
        #: the analysis time (POSIX seconds; None: no update settles by age) and the settle delay
        self.now = now
        self.settle_seconds = settle_seconds
        self._settled: dict = {}
        attempts = {a.attempt: a for a in run.attempts}
        seen = set(ledger.attempts) | {g.attempt for g in run.generations} \
            | set(self.beats.attempts)
        for number in seen - set(attempts):
            attempts[number] = AttemptRecord(attempt=number)
        self.attempts: dict[int, AttemptRecord] = dict(sorted(attempts.items()))
        self.generations = {g.generation_id: g for g in run.generations}
        #: ``{generation_id: attempt}``: who wrote each generation
        #: (:func:`.lineage.generation_writer`)
        self.writers = {gid: generation_writer(g, self.attempts, ledger)
                        for gid, g in self.generations.items()}
        firsts = {number: state.updates.min() for number, state in ledger.attempts.items()
                  if state.updates}
        self.resumes = resolve_resumes(self.attempts, self.generations, self.writers, firsts)
        #: the live attempt (docs/definitions.md#concurrent-attempts): the newest, unless it
        #: ended while an older attempt kept going
        self.live = live_attempt(self.attempts, ledger)
        self._lineages: dict = {}
        self._counts: dict = {}
        self._lengths: dict = {}
        self._units: dict = {}
        self._recreated: dict = {}

    @property
    def id_strata(self) -> set:
        return self.ledger.id_strata

    def lineage(self, attempt: int, cap: int | None = None) -> Lineage:
        """docs/definitions.md#lineage: attempt ``attempt``'s lineage, restricted to updates at
        or below ``cap`` when given (the state a generation at ``cap`` holds)."""
        handle = (attempt, cap)
        found = self._lineages.get(handle)
        if found is None:
            found = self._lineages[handle] = lineage_of(attempt, self.resumes, cap)
        return found

    def settled_upto(self, attempt: int) -> int | None:
        """docs/definitions.md#updates-counted-once-complete: the highest update of ``attempt``
        at or below which every update is *settled*, None when all of them are. An update is
        settled when it is complete (a coordinator's report, or reports of ``world_size``
        distinct data-parallel ranks; any report when the world size is unknown), when a later
        update of the attempt is complete (the missing part is not coming), when its first
        report is ``settle_seconds`` old at ``now``, or when a newer attempt exists. An
        ``attempt_ended`` does not settle the attempt's updates: the lead reporter sends it at
        once while the other ranks' last updates come with their exit (docs/definitions.md#
        updates-counted-once-complete). Only the newest updates of the live attempt can be
        unsettled."""
        if attempt in self._settled:
            return self._settled[attempt]
        record = self.attempts.get(attempt)
        state = self.ledger.attempts.get(attempt)
        top = None
        if record is not None and state is not None and state.updates \
                and record.world_size and attempt == self.live:
            newest = state.updates.max()
            top = state.complete_top(record.world_size)
            if (top is None or top < newest) and self.now is not None:
                aged = state.reported_by(self.now - self.settle_seconds)
                if aged is not None and (top is None or aged > top):
                    top = aged
            if top is not None and top >= newest:
                top = None
            elif top is None:
                top = -1
        self._settled[attempt] = top
        return top

    def earliest_unsettled(self) -> float | None:
        """The earliest first report time (POSIX seconds) of an update that is not settled at
        ``now`` (:meth:`settled_upto`), None when every update is settled or ``now`` is None.
        With the inputs unchanged, :meth:`settled_upto` answers the same at every later
        analysis time ``t`` with ``t - settle_seconds`` below it (computed so: the comparison
        the age rule makes), and at no time when it is None. Reads only the unsettled updates
        (the newest of the live attempt, all first reported after ``now - settle_seconds``)."""
        if self.now is None:
            return None
        earliest = None
        for attempt in self.attempts:
            top = self.settled_upto(attempt)
            state = self.ledger.attempts.get(attempt)
            if top is None or state is None:
                continue
            for update in state.updates.iter_equal_or_larger(top + 1):
                when = state.update_time(update)
                if when is not None and (earliest is None or when < earliest):
                    earliest = when
        return earliest

    def is_settled(self, attempt: int, update: int) -> bool:
        """Whether ``update`` of ``attempt`` is settled (:meth:`settled_upto`)."""
        top = self.settled_upto(attempt)
        return top is None or update <= top

    def settled(self, lineage: Lineage) -> Lineage:
        """``lineage`` without the updates that are not settled (:meth:`settled_upto`): what the
        counting counts. The same object when every update is settled."""
        segments = []
        changed = False
        for seg in lineage.segments:
            top = self.settled_upto(seg.attempt)
            if top is not None and (seg.upto is None or top < seg.upto):
                seg = Segment(seg.attempt, seg.after, max(top, seg.after))
                changed = True
            segments.append(seg)
        if not changed:
            return lineage
        return Lineage(tuple(segments), lineage.pretracked, lineage.root, lineage.unknown_root)

    def counts(self, lineage: Lineage) -> dict:
        """``{key: KeyCount}`` of ``lineage`` (:func:`.lineage.lineage_counts`), cached; callers
        must not mutate it."""
        found = self._counts.get(lineage)
        if found is None:
            found = self._counts[lineage] = lineage_counts(self.ledger, lineage)
        return found

    def frontier(self, lineage: Lineage) -> dict:
        """``{key: max consumed position + 1}`` of ``lineage`` from run geometry
        (docs/definitions.md#frontier, :func:`.lineage.lineage_frontier`)."""
        return lineage_frontier(self.ledger, lineage)

    def floors(self, lineage: Lineage) -> dict:
        """``{key: floor}`` where a lineage with an unknown root started tracking each key
        (:func:`.lineage.lineage_floors`; empty for a fresh root)."""
        return lineage_floors(self.ledger, lineage)

    def untracked_ids(self, lineage: Lineage) -> set:
        """Keys of sample-id strata whose ids before tracking are unknown
        (:func:`.lineage.untracked_id_keys`; empty for a fresh root)."""
        return untracked_id_keys(self.ledger, lineage)

    def epoch_length(self, stratum: str) -> int | None:
        """Positions per epoch of ``stratum`` (``sampler.epoch_length``) from the newest attempt
        whose sampler names the stratum; None when none does."""
        if stratum not in self._lengths:
            length = None
            for record in reversed(self.attempts.values()):
                lengths = (record.sampler or {}).get("epoch_length") or {}
                if stratum in lengths:
                    length = int(lengths[stratum])
                    break
            self._lengths[stratum] = length
        return self._lengths[stratum]

    def recreated_order(self, key: tuple) -> RecreatedOrder | None:
        """The order of position key ``key`` ``(stratum, epoch, order)`` as the server re-creates
        it (docs/definitions.md#re-created-orders, :func:`.samplers.recreated_order`): a
        ``DistributedSampler`` order that the settings an attempt declared name, newest attempt
        first; None when none does (its samples are known only from the reports). Cached."""
        if key not in self._recreated:
            self._recreated[key] = recreated_order(key[2], key[0], key[1],
                                                   reversed(self.attempts.values()))
        return self._recreated[key]

    def units(self, stratum: str) -> str:
        """The unit of ``stratum``'s positions (docs/definitions.md#units): ``"tokens"`` or
        ``"samples"``, from the newest attempt whose ``sampler.units`` names the stratum;
        ``"samples"`` when none does."""
        found = self._units.get(stratum)
        if found is None:
            found = SAMPLES
            for record in reversed(self.attempts.values()):
                declared = (record.sampler or {}).get("units") or {}
                if isinstance(declared, dict) and stratum in declared:
                    found = TOKENS if declared[stratum] == TOKENS else SAMPLES
                    break
            self._units[stratum] = found
        return found

    def global_batch(self, lineage: Lineage, key: tuple) -> int | None:
        """The global batch (samples per update, :meth:`.inputs.AttemptRecord.global_batch`)
        that bounds the drop_last remainder of position key ``key`` in ``lineage``: that of the
        newest lineage attempt that consumed the key, else (pre-tracking positions) the root's.
        None when that attempt declares no batch (then no tail is dropped)."""
        for seg in lineage.segments:
            if self.ledger.consumed_key(seg.attempt, key, seg.after, seg.upto):
                return self.attempts[seg.attempt].global_batch()
        return self.root_batch(lineage)

    def root_batch(self, lineage: Lineage) -> int | None:
        """The global batch (samples) the root attempt of ``lineage`` declares, None when the
        root is unknown or declares none."""
        root = self.attempts.get(lineage.root) if lineage.root is not None else None
        return root.global_batch() if root is not None else None

    def leaving_batch(self, lineage: Lineage, stratum: str, epoch: int) -> int | None:
        """docs/definitions.md#drop-last-threshold: the global batch that bounds the drop_last
        remainder of epoch ``epoch`` of ``stratum`` once ``lineage`` moved on from it: that of
        the attempt that *left* the epoch, the one holding the lineage's earliest update that
        consumed a later epoch of the stratum (the root's, when the root's pre-tracking cursor
        already stands in a later epoch). None when that attempt declares no batch (no tail is
        dropped), or when the lineage never left the epoch."""
        if any(s == stratum and e > epoch for s, e, _p, _o in lineage.pretracked):
            return self.root_batch(lineage)
        ledger = self.ledger
        for seg in reversed(lineage.segments):  # oldest first: segments are ordered by update
            state = ledger.attempts.get(seg.attempt)
            if state is None:
                continue
            if any(key[0] == stratum and key[1] > epoch
                   and ledger.consumed_key(seg.attempt, key, seg.after, seg.upto)
                   for key in state.keys()):
                return self.attempts[seg.attempt].global_batch()
        return None

    def reaches(self, lineage: Lineage, update: int) -> bool:
        """Whether the ledger holds ``update`` of ``lineage``, settled (:meth:`settled_upto`:
        every rank's part in), so a data cursor at ``update`` can be compared (its top
        segment's start counts: a resume at U needs no report of U)."""
        if update == lineage.segments[-1].after:
            return True
        return any(seg.holds(update) and update in self.ledger.attempt(seg.attempt).updates
                   and self.is_settled(seg.attempt, update) for seg in lineage.segments)

    def fetched(self, attempt: int) -> list:
        """Attempt ``attempt``'s read cursors: its heartbeats' furthest ``fetched`` per
        ``(stratum, epoch, order)`` (:meth:`.heartbeats.HeartbeatFold.fetched`), then
        ``attempt_ended``'s (docs/definitions.md#recomputed)."""
        record = self.attempts.get(attempt)
        return self.beats.fetched(attempt) + list(
            (record.end_fetched if record is not None else None) or [])
