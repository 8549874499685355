"""Restart figures (docs/ingest-v1.md#recovery ``restarts``; docs/definitions.md#expected-cursor
through #recovery-seconds and #verdict; the worked example there).

A restart is attempt k resuming generation g at update U, with predecessor attempt k-1 (the
highest attempt number below k). Notation used by every docstring here:

* ``L_U``: the lineage of the restored state (k's lineage without k's own segment), including its
  root's pre-tracking positions;
* ``K``: positions consumed by k's own updates above U;
* ``R``: positions of k-1's updates that are not on k's lineage (rolled back);
* ``F``: positions below k-1's read cursors (heartbeat and attempt_ended ``fetched``; a cursor
  without ``order`` covers every order of its (stratum, epoch)).

All counts are positions (samples or tokens, per ``sampler.units``), compared per
``(stratum, epoch, order)`` key. Seed 003 as numbers: 64 positions per update, g at update 1,250
(cursor 80,000), read cursor 80,048 at the crash. Resume at 80,000: exact, recomputed 48. At
80,048: omitted 48. At 79,936: replayed 64.
"""
from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from pyroaring import BitMap64

from .costs import clamp_duration
from .counting import (
    HASHED_IDS,
    INTEGER_IDS,
    SAMPLES,
    KeyCount,
    below,
    epoch_tail,
    stratum_kind,
    unit_word,
    units_of,
)
from .generations import Reason
from .ledger import COORDINATOR_RANK
from .lineage import Lineage, Resume, Segment, cursor_of
from .result import RestartEntry

if TYPE_CHECKING:  # view imports this module
    from .inputs import AttemptRecord
    from .view import RunView

Finding = Reason


@dataclass
class Restart:
    """One entry of spec 5 ``restarts``. Seconds are wall seconds; positions are counts."""

    attempt: int
    resumed_from: str | None
    resumed_update: int
    world_size_before: int | None
    world_size_after: int | None
    expected_cursor: list
    resume_cursor: list
    replayed: int
    omitted: int
    recomputed: int
    lost_updates: int
    lost_seconds: float | None
    recovery_seconds: float | None
    verdict: str
    findings: list = field(default_factory=list)
    #: the unit of replayed, omitted and recomputed (docs/definitions.md#units): that of the
    #: strata k consumed, ``"mixed"`` when they differ
    units: str = SAMPLES

    def to_dict(self) -> RestartEntry:
        return {"attempt": self.attempt, "resumed_from": self.resumed_from,
                "resumed_update": self.resumed_update, "world_size_before": self.world_size_before,
                "world_size_after": self.world_size_after,
                "expected_cursor": self.expected_cursor, "resume_cursor": self.resume_cursor,
                "replayed": self.replayed, "omitted": self.omitted, "recomputed": self.recomputed,
                "lost_updates": self.lost_updates, "lost_seconds": self.lost_seconds,
                "recovery_seconds": self.recovery_seconds, "verdict": self.verdict,
                "units": self.units, "findings": [f.to_dict() for f in self.findings]}


def expected_cursor(frontiers_at_u: dict, id_strata: set) -> list:
    """docs/definitions.md#expected-cursor: the lineage's frontier at U, per stratum (see
    :func:`.lineage.cursor_of`)."""
    return cursor_of(frontiers_at_u, id_strata)


def resume_cursor(resume: Resume, starts: dict) -> list:
    """The cursor k declares in ``resumed_from``, else the first positions it consumes per
    stratum (``starts`` from :meth:`.ledger.Ledger.first_positions`)."""
    if resume.cursor:
        return [{"stratum": c["stratum"], "epoch": int(c.get("epoch", 0)),
                 "position": int(c.get("position", 0))} for c in resume.cursor]
    return [{"stratum": st, "epoch": e, "position": p}
            for st, (_u, e, p, _o) in sorted(starts.items())]


def cursor_gaps(expected: list, resume: list) -> list[dict]:
    """Per stratum of a restart's ``expected_cursor`` and ``resume_cursor`` (wire cursors;
    docs/definitions.md#expected-cursor, #resume-cursor): ``{"stratum", "expected", "resume",
    "gap"}`` with ``gap`` = resume position - expected position, in positions, when both cursors
    are in the same epoch (positive: positions skipped, a possible omission; negative: positions
    read again, a possible replay), else None. A cursor absent on one side is None. Sorted by
    stratum. The verdict's counts are :func:`omitted` and :func:`replayed`; the gap is where
    the two cursors stand."""
    exp = {str(c.get("stratum")): c for c in expected or []}
    res = {str(c.get("stratum")): c for c in resume or []}
    rows = []
    for stratum in sorted(set(exp) | set(res)):
        e, r = exp.get(stratum), res.get(stratum)
        gap = int(r["position"]) - int(e["position"]) \
            if e and r and e.get("epoch") == r.get("epoch") else None
        rows.append({"stratum": stratum, "expected": e, "resume": r, "gap": gap})
    return rows


def replayed(own: dict, before: dict) -> int:
    """Positions K consumes that L_U already consumed, same key: sum over keys |K & L_U| (L_U's
    pre-tracking prefix counted as an interval)."""
    return sum(before[key].hits(count.positions) for key, count in own.items() if key in before)


def omitted(own: dict, before: dict, starts: dict, view, lineage,
            floors: dict | None = None, untracked: AbstractSet = frozenset(),
            mixed: AbstractSet = frozenset()) -> int:
    """Positions between the expected cursor and where k actually starts that the lineage never
    consumes, per stratum k consumes (docs/definitions.md#omitted). With k's start
    ``(e1, s1, o1)`` and L_U's highest epoch ``e0`` of the stratum, frontier ``f0`` there:

    * same epoch and L_U used order ``o1`` in it: ``|[f0, s1) - K|``; and when K then moves on
      to a later epoch of the stratum, the tail of the resumed epoch that neither L_U nor K
      consumed, under the tail rule: ``epoch_length - max(f0, frontier of K there)`` (a loader
      that restarts the epoch while its trainer ends the epoch by a batch count: Lightning with
      a plain DataLoader feeds the first batches again and never the last ones; refinement of
      docs/definitions.md);
    * same epoch under another order: 0 here (by identity: :func:`compare_orders`);
    * later epoch: the abandoned epoch's tail ``epoch_length - f0`` under the tail rule, plus
      ``epoch_length`` for every epoch strictly between ``e0`` and ``e1`` of which K consumes
      nothing (skipped whole: no drop_last exemption; refinement of docs/definitions.md), plus
      ``|[0, s1) - K|`` of the new epoch;
    * earlier epoch: 0;
    * a stratum L_U never consumed: ``|[0, s1) - K|``.
    An epoch in ``mixed`` (consumed under several orders by k's lineage) counts 0 here: it is
    compared by identity (:func:`compare_orders`, docs/definitions.md#epochs-under-several-
    orders). Strata of integer sample ids: :func:`omitted_ids`; of hashed ids: none. ``view``
    (:class:`~.view.RunView`) gives epoch lengths and the global batch that bounds a drop_last
    tail: that of the attempt of ``lineage`` (k's) that left the epoch, here k
    (:meth:`~.view.RunView.leaving_batch`, docs/definitions.md#drop-last-threshold).
    ``floors`` (k's lineage, :func:`.lineage.lineage_floors`):
    when k's start key has a floor, the lineage's root is unknown and tracking of that key starts
    with k: positions below ``s1`` of that key are unknown, not omitted (the ``[0, s1)`` terms
    are 0). ``untracked``: id keys of k's lineage whose earlier ids are unknown
    (:func:`.lineage.untracked_id_keys`).
    """
    total = 0
    for stratum, start in starts.items():
        kind = stratum_kind(view.ledger, stratum)
        if kind == HASHED_IDS:
            continue
        if kind == INTEGER_IDS:
            total += omitted_ids(stratum, start[1], start[3], own, before, view, lineage,
                                 untracked, mixed)
            continue
        total += _omitted_positions(stratum, start, own, before, view, lineage,
                                    (floors or {}).get((stratum, start[1], start[3]), 0), mixed)
    return total


def _omitted_positions(stratum: str, start: tuple, own: dict, before: dict, view, lineage,
                       floor: int, mixed) -> int:
    """:func:`omitted` for one stratum of positions; ``start`` is k's ``(update, e1, s1, o1)``,
    ``floor`` that of k's start key."""
    _u, e1, s1, o1 = start
    mine = own.get((stratum, e1, o1))

    def gap(lo: int, hi: int) -> int:
        lo = max(lo, floor)
        if hi <= lo or (stratum, e1) in mixed:
            return 0
        return hi - lo - (mine.positions.range_cardinality(lo, hi) if mine else 0)

    keys = [k for k in before if k[0] == stratum]
    if not keys:
        return gap(0, s1)
    e0 = max(k[1] for k in keys)
    f0 = max(before[k].frontier() for k in keys if k[1] == e0)
    length = view.epoch_length(stratum)
    if e1 == e0:
        key = (stratum, e1, o1)
        if key not in before:
            return 0
        total = gap(f0, s1)
        if (stratum, e1) not in mixed and any(k[0] == stratum and k[1] > e1 for k in own):
            # k left the epoch
            reached = max(before[key].frontier(),
                          mine.positions.max() + 1 if mine and len(mine.positions) else 0)
            total += epoch_tail(reached, length, view.leaving_batch(lineage, stratum, e1))
        return total
    if e1 < e0:
        return 0
    total = 0 if (stratum, e0) in mixed else \
        epoch_tail(f0, length, view.leaving_batch(lineage, stratum, e0))
    if length and length > 0 and e1 > e0 + 1:
        later = {k[1] for k in own if k[0] == stratum and e0 < k[1] < e1}
        total += (e1 - e0 - 1 - len(later)) * length
    return total + gap(0, s1)


def omitted_ids(stratum: str, e1: int, o1, own: dict, before: dict, view, lineage,
                untracked: AbstractSet = frozenset(), mixed=frozenset()) -> int:
    """:func:`omitted` for a stratum of integer sample ids (docs/definitions.md#sample-id-strata):
    ids have no order, so what a restart skipped is known only once an epoch is left. With k's
    first epoch ``e1`` (order ``o1``), L_U's highest epoch ``e0`` of the stratum and its
    ``epoch_length`` L known:

    * ``e1 == e0`` and K moves on to a later epoch: the ids of ``[0, L)`` that neither L_U nor K
      consumed in that epoch, under the tail rule (fewer than one global batch is the drop_last
      remainder);
    * ``e1 > e0``: per key of epoch ``e0`` in L_U, its ids of ``[0, L)`` never consumed, under
      the tail rule, plus L for every epoch strictly between ``e0`` and ``e1`` of which K
      consumes nothing;
    * otherwise 0 (k is still in the epoch, or went back, or L_U never consumed the stratum,
      or L is unknown). Keys in ``untracked`` (ids before tracking unknown) owe nothing; epochs
      in ``mixed`` (several orders) are compared by :func:`compare_orders`."""
    length = view.epoch_length(stratum)
    keys = [k for k in before if k[0] == stratum]
    if not length or length <= 0 or not keys:
        return 0
    e0 = max(k[1] for k in keys)
    if e1 == e0:
        key = (stratum, e1, o1)
        if key not in before or key in untracked or (stratum, e1) in mixed \
                or not any(k[0] == stratum and k[1] > e1 for k in own):
            return 0
        seen = before[key].positions | own[key].positions if key in own \
            else before[key].positions
        return epoch_tail(seen.range_cardinality(0, length), length,
                          view.leaving_batch(lineage, stratum, e1))
    if e1 < e0:
        return 0
    total = 0 if (stratum, e0) in mixed else sum(
        epoch_tail(before[k].positions.range_cardinality(0, length), length,
                   view.leaving_batch(lineage, stratum, e0))
        for k in keys if k[1] == e0 and k not in untracked)
    later = {k[1] for k in own if k[0] == stratum and e0 < k[1] < e1}
    return total + max(0, e1 - e0 - 1 - len(later)) * length


def recomputed(own: dict, before: dict, rolled_back: dict, fetched: list) -> int:
    """Positions K consumes that k-1 consumed in rolled-back updates (R) or had fetched (F), and
    that L_U had not consumed (those are replays): sum over keys |K & ((R | F) - L_U)|.

    F = ``[0, bound)`` and L_U's pre-tracking prefix are intervals, never bitmaps (a read cursor
    may be anywhere below 2**63): only sets bounded by K are built."""
    total = 0
    for key, count in own.items():
        stratum, epoch, order = key
        bound = max((int(c.get("position", 0)) for c in fetched
                     if c.get("stratum") == stratum and int(c.get("epoch", 0)) == epoch
                     and c.get("order", order) == order), default=0)
        mine, floor = count.positions, 0
        if key in before:
            mine = mine - before[key].positions
            floor = before[key].prefix
        if bound > floor:
            total += mine.range_cardinality(floor, bound)
        if key in rolled_back:
            both = mine & rolled_back[key].positions
            total += len(both) - below(both, max(floor, bound))
    return total


def lost_updates(last_update_before: int, update: int) -> int:
    """docs/definitions.md#lost-updates: last update k-1 committed minus U (never below 0), also
    when k resumed from an untracked or unknown state: k-1's last committed update and the U k
    declares are both known, so the difference is too (refinement
    docs/definitions.md#lost-updates-from-an-untracked-state; ``lost_seconds`` stays None there,
    as no commit time of U is known)."""
    return max(0, last_update_before - update)


def lost_seconds(commit_time_of_u: float | None, failure_time: float | None) -> float | None:
    """From the commit of update U to the failure of k-1 (None when either is unknown). A
    negative result (clocks that disagree) is clamped by :func:`analyse_restart`
    (docs/definitions.md#clock-skew)."""
    if commit_time_of_u is None or failure_time is None:
        return None
    return failure_time - commit_time_of_u


def recovery_seconds(failure_time: float | None, first_commit: float | None) -> float | None:
    """From the failure of k-1 to k's first committed update (None until k commits). A
    negative result is clamped by :func:`analyse_restart` (docs/definitions.md#clock-skew)."""
    if failure_time is None or first_commit is None:
        return None
    return first_commit - failure_time


def first_update_complete(state, update: int, world_size: int | None) -> bool:
    """Whether k's first committed update is complete: a coordinator's global report, or reports
    of ``world_size`` distinct data-parallel ranks (any number when the world size is unknown).

    Ranks report separately, so their first reports reach the server at different times; until
    every rank's part of the first update is in, where k starts is not known and a verdict would
    flip as the rest arrives (a false ``omission`` alert). docs/definitions.md#verdict's
    "unverified until k has committed an update" is read as: until the first update is fully
    reported."""
    absorbed = state.absorbed
    coordinator = absorbed.get(COORDINATOR_RANK)
    if coordinator is not None and update in coordinator:
        return True
    if not world_size:
        return True
    ranks = sum(1 for rank, updates in absorbed.items() if rank >= 0 and update in updates)
    return ranks >= world_size


def incomplete_first_update(ledger, attempt: int, update: int,
                            world_size: int) -> tuple[list, int]:
    """docs/definitions.md#incomplete-first-update: for a first update of ``attempt`` that some
    data-parallel ranks never reported, ``(missing ranks, room)``: the ranks of
    ``range(world_size)`` with no report of ``update``, and how many positions their part may
    hold: the number of missing ranks times the present ranks' mean share of the update
    (consumed positions, rounded up). A gap before k's start that the missing part may hold
    is no omission proven; the restart's omitted counts only what lies beyond ``room``."""
    absorbed = ledger.attempts[attempt].absorbed
    present = [rank for rank, updates in absorbed.items() if rank >= 0 and update in updates]
    missing = [rank for rank in range(world_size) if rank not in present]
    count = max(len(missing), world_size - len(present), 0)
    consumed = sum(c.consumed for c in ledger.segment(attempt, update - 1, update).values())
    share = -(-consumed // len(present)) if present else 0
    return missing, count * share


def _short_ranks(ranks: list) -> str:
    shown = ", ".join(str(r) for r in ranks[:8])
    return shown + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def verdict(replay_count: int, omission_count: int, committed: bool, known: bool,
            undetermined: bool = False) -> str:
    """docs/definitions.md#verdict: ``unverified`` until k has committed an update, when the
    lineage before U is unknown, or when what k did cannot be decided (``known`` False: an order
    changed and the sample ids of an order were not recorded); ``replay``, ``omission`` or
    ``replay_and_omission`` when proven; ``unverified`` again when nothing is proven but some
    positions are ``undetermined`` (skipped under a changed order, their samples perhaps consumed
    under the earlier one, decided once the epoch is left); else ``exact``."""
    if not committed or not known:
        return "unverified"
    if replay_count and omission_count:
        return "replay_and_omission"
    if replay_count:
        return "replay"
    if omission_count:
        return "omission"
    return "unverified" if undetermined else "exact"


def order_changes(own: dict, before: dict) -> list:
    """(stratum, epoch, order) keys K consumes under an order L_U did not use for that epoch,
    where L_U consumed that (stratum, epoch) under some other order."""
    seen: dict = {}
    for (stratum, epoch, order) in before:
        seen.setdefault((stratum, epoch), set()).add(order)
    return sorted(((s, e, o) for (s, e, o) in own if (s, e) in seen and o not in seen[(s, e)]),
                  key=lambda k: (k[0], k[1], "" if k[2] is None else k[2]))


@dataclass
class OrderComparison:
    """:func:`compare_orders`: replayed and omitted samples of the epochs of k's lineage
    consumed under several orders (by identity), the epochs where that could not be decided:
    ``unknown`` (identities of an order not recorded) and ``undetermined`` (``{(stratum, epoch):
    positions}`` skipped under the newest order whose samples an older order may have consumed),
    and ``mixed``: those epochs (the positional rules leave them out)."""

    replayed: int = 0
    omitted: int = 0
    unknown: list = field(default_factory=list)
    undetermined: dict = field(default_factory=dict)
    mixed: set = field(default_factory=set)


def _epoch_sides(view, lineage, counts_before: dict) -> list:
    """``[(counts, lineage, {(stratum, epoch): keys}, {stratum: top epoch}, untracked)]`` of
    k's lineage and of L_U, for :func:`compare_orders`."""
    from .epochs import epoch_keys

    sides = []
    for counts, line in ((view.counts(lineage), lineage),
                         (counts_before, lineage.before_own())):
        grouped = epoch_keys(counts)
        top: dict = {}
        for (stratum, epoch) in grouped:
            top[stratum] = max(epoch, top.get(stratum, epoch))
        sides.append((counts, line, grouped, top, view.untracked_ids(line)))
    return sides


def compare_orders(view, lineage, own: dict, counts_before: dict) -> OrderComparison:
    """docs/definitions.md#epochs-under-several-orders, for a restart: per (stratum, epoch) that
    k's lineage consumed under several orders and that k touched (consumed, or left: its
    lineage moved on from it while L_U had not), the difference k made to what the lineage owes
    there (:func:`.epochs.epoch_count` on k's lineage, minus on L_U): replayed = the duplicates
    by identity it added (samples consumed before under another order, consumed again),
    omitted = the omissions it added (never below 0). ``lineage``: k's; ``own``: K's counts;
    ``counts_before``: L_U's."""
    from .epochs import EpochCount, epoch_count

    out = OrderComparison()
    (after_side, prior_side) = sides = _epoch_sides(view, lineage, counts_before)
    out.mixed = {e for e, keys in after_side[2].items() if len(keys) > 1}
    for stratum, epoch in sorted(out.mixed):
        moved = [epoch < top.get(stratum, epoch) for _c, _l, _g, top, _u in sides]
        if not any(k[:2] == (stratum, epoch) for k in own) and moved[0] == moved[1]:
            continue  # k neither consumed the epoch nor left it
        after, prior = (epoch_count(view, line, counts, grouped[(stratum, epoch)], move, unt)
                        if (stratum, epoch) in grouped else None
                        for (counts, line, grouped, _t, unt), move in zip(sides, moved))
        prior_dup, prior_om = (prior.duplicates, prior.omissions) if prior else (0, 0)
        after = cast(EpochCount, after)  # k's side: the epoch is k's or k moved past it
        out.omitted += max(0, after.omissions - prior_om)
        if not after.known:
            out.unknown.append((stratum, epoch))
            continue
        out.replayed += max(0, after.duplicates - prior_dup)
        if after.undetermined:
            out.undetermined[(stratum, epoch)] = after.undetermined
    return out


@dataclass
class _Restart:
    """What every step of :func:`analyse_restart` reads: k (``number``), k-1 (``before``), their
    records, k's resume and lineage, L_U, K's counts (``own``), L_U's (``counts_before``) and
    k's first positions per stratum (``starts``)."""

    view: RunView
    number: int
    before: int
    record: AttemptRecord
    before_record: AttemptRecord
    resume: Resume
    lineage: Lineage
    before_lineage: Lineage
    own_segment: Segment
    own: dict
    counts_before: dict
    starts: dict

    @classmethod
    def of(cls, view, number: int, before: int) -> _Restart:
        ledger = view.ledger
        resume = view.resumes[number]
        lineage = view.lineage(number)
        own_segment = lineage.segments[0]
        before_lineage = lineage.before_own()
        return cls(view, number, before, view.attempts[number], view.attempts[before], resume,
                   lineage, before_lineage, own_segment,
                   ledger.segment(number, own_segment.after, own_segment.upto),
                   view.counts(before_lineage), ledger.first_positions(number, own_segment.after))

    def rolled_back(self) -> dict:
        """R: k-1's positions in updates not on k's lineage, per key."""
        ledger, p = self.view.ledger, self.before
        mine = [seg for seg in self.lineage.segments if seg.attempt == p]
        rolled: dict = {}
        pieces = [(-1, mine[0].after), (mine[0].upto, None)] if mine else [(-1, None)]
        for after, upto in pieces:
            if after is None:
                continue
            for key, count in ledger.segment(p, after, upto).items():
                into = rolled.setdefault(key, KeyCount(0, BitMap64()))
                into.positions |= count.positions
        return rolled


def _first_update(r: _Restart, omission_count: int, words: str) -> tuple:
    """``(committed, first commit time, findings, omission_count)``: whether k's first update
    is decided (docs/definitions.md#incomplete-first-update), and the omitted count less the
    room a missing rank's part may hold (``words``: the restart's unit, :func:`unit_word`)."""
    view, k, record = r.view, r.number, r.record
    ledger = view.ledger
    findings: list = []
    if not ledger.updates_in(k, r.own_segment.after, None) > 0:
        return False, None, findings, omission_count
    state = ledger.attempts[k]  # k has absorbed updates
    first_update = next(iter(state.updates.iter_equal_or_larger(r.own_segment.after + 1)))
    first_commit = ledger.update_time(k, first_update)
    if first_update_complete(state, first_update, record.world_size):
        return True, first_commit, findings, omission_count
    if not view.is_settled(k, first_update):
        return False, first_commit, findings, omission_count
    # complete whatever reported when the world size is unknown (first_update_complete)
    missing, room = incomplete_first_update(ledger, k, first_update, cast(int, record.world_size))
    findings.append(Finding("incomplete_first_update", (
        f"rank {_short_ranks(missing)} of {record.world_size} never reported "
        f"update {first_update}, k's first; decided from the reports that are in "
        f"(later updates complete, or the first reports {view.settle_seconds:g} s "
        f"old): up to {room} {words} their part may hold are not counted as "
        f"omitted")))
    return True, first_commit, findings, max(0, omission_count - room)


def _declared_findings(r: _Restart, status_of) -> list:
    """Findings from what k and k-1 declared: world size, dataset version, global batch, the
    generation k resumed from, and the update it resumed at."""
    findings = []
    record, before_record, resume = r.record, r.before_record, r.resume
    for code, attr in (("world_size_changed", "world_size"),
                       ("dataset_version_changed", "dataset_version")):
        was, now = getattr(before_record, attr), getattr(record, attr)
        if was is not None and now is not None and was != now:
            findings.append(Finding(code, f"{attr} {was!r} -> {now!r}"))
    was, now = before_record.global_batch(), record.global_batch()
    if was is not None and now is not None and was != now:
        findings.append(Finding("global_batch_changed", f"global batch {was} -> {now}"))
    status = status_of(resume.generation_id) if resume.kind == "generation" else None
    if status in ("pending", "rejected", "abandoned"):
        findings.append(Finding("resumed_from_unrestorable",
                                f"generation {resume.generation_id} is {status}"))
    if resume.kind == "untracked":
        findings.append(Finding("resumed_from_unknown",
                                f"generation {resume.generation_id!r} is not known"
                                if resume.generation_id is not None
                                else "no generation named"))
    mismatches = []
    if resume.kind == "generation" and resume.declared_update != resume.update:
        mismatches.append(f"declared update {resume.declared_update}, generation "
                          f"{resume.update}")
    state = r.view.ledger.attempts.get(r.number)
    if state is not None and state.updates and state.updates.min() != resume.update + 1:
        mismatches.append(f"first committed update {state.updates.min()}, expected "
                          f"{resume.update + 1}")
    if mismatches:
        findings.append(Finding("update_mismatch", "; ".join(mismatches)))
    return findings


def unseen_writer(r: _Restart) -> str | None:
    """docs/definitions.md#resume-from-a-generation-the-server-had-not-seen: the detail of the
    finding ``predecessor_unknown`` when k resumed a generation whose writer never reached the
    server (:attr:`.lineage.Resume.unseen`) and the generation's data cursor names no position
    for some stratum k consumes: what was consumed there before U is unknown, so the restart
    is unverified. None otherwise: the cursor is the evidence the restart is compared with."""
    resume = r.resume
    if resume.kind != "generation" or not r.view.resumes[cast(int, resume.writer)].unseen:
        return None
    named = {c["stratum"] for c in resume.generation_cursor}
    missing = sorted({key[0] for key in r.own} - named)
    if not missing:
        return None
    return (f"nothing of attempt {resume.writer}, which wrote {resume.generation_id}, reached "
            f"the server, and the generation's data cursor names no position of "
            f"{', '.join(missing)}: what was consumed before update {resume.update} is "
            f"unknown, so replay and omission are unknown")


def first_restart(view, number: int) -> Restart | None:
    """docs/definitions.md#resume-from-a-generation-the-server-had-not-seen: the restart row of
    the first attempt the server heard of (``number``) when it already resumed: it declared a
    ``resumed_from``, or it is numbered above 0 and sent no ``attempt_started``, while nothing
    of the attempts before it arrived. Unverified (nothing to compare with), replayed and
    omitted 0 (positions before the resume are unknown, never omissions), lost updates 0, lost
    and recovery seconds null; the finding ``predecessor_unknown`` says why in words, with
    ``resumed_from_unknown`` when the generation is unknown. None when the attempt started
    fresh (or resumed a known generation, which has a writer before it)."""
    resume = view.resumes[number]
    record = view.attempts[number]
    if resume.kind != "untracked" or resume.unseen \
            or (number == 0 and record.resumed_from is None):
        return None
    starts = view.ledger.first_positions(number, resume.after)
    own = view.ledger.segment(number, resume.after, None)
    what = (f"resumed from {resume.generation_id!r} at update {resume.update}"
            if resume.generation_id is not None else
            f"resumed at update {resume.update}" if record.resumed_from is not None else
            "is numbered above 0 and declared no resume")
    findings = [Finding("predecessor_unknown", (
        f"attempt {number} is the first attempt the server heard of, and it {what}: nothing "
        f"of the attempts before it arrived, so what they consumed is unknown: replay and "
        f"omission unknown; positions before the resume are not counted as omissions"))]
    if record.resumed_from is not None:
        findings.append(Finding("resumed_from_unknown",
                                f"generation {resume.generation_id!r} is not known"
                                if resume.generation_id is not None else "no generation named"))
    return Restart(
        attempt=number, resumed_from=resume.generation_id, resumed_update=resume.update,
        world_size_before=None, world_size_after=record.world_size, expected_cursor=[],
        resume_cursor=resume_cursor(resume, starts), replayed=0, omitted=0, recomputed=0,
        lost_updates=0, lost_seconds=None, recovery_seconds=None, verdict="unverified",
        findings=findings,
        units=units_of([view.units(s) for s in sorted({key[0] for key in own})]))


def _order_findings(r: _Restart, compared: OrderComparison, committed: bool) -> list:
    """``order_changed`` (k consumes an epoch under an order L_U did not use), and, once k's
    first update is decided, ``samples_unknown`` (an order's sample ids were not recorded: the
    restart is unverified) and ``samples_undetermined`` (positions skipped under the new order
    whose samples may have been consumed under the old one)."""
    findings = []
    changes = order_changes(r.own, r.counts_before)
    if changes:
        findings.append(Finding("order_changed", "; ".join(
            f"{s} epoch {e} under order {o!r}" for s, e, o in changes)))
    if not committed:
        return findings
    if compared.unknown:
        where = ", ".join(f"{s} epoch {e}" for s, e in compared.unknown)
        findings.append(Finding("samples_unknown", "order changed and sample ids were not "
                                f"recorded: replay and omission unknown ({where})"))
    if compared.undetermined:
        where = ", ".join(f"{n} {unit_word(r.view.units(s))} of {s} epoch {e}"
                          for (s, e), n in sorted(compared.undetermined.items()))
        findings.append(Finding("samples_undetermined", "order changed: the samples at "
                                f"{where} skipped under the new order may have been trained "
                                "on under the old one; decided once the epoch is left"))
    return findings


def _times(r: _Restart, first_commit: float | None) -> tuple:
    """``(lost_updates, lost_seconds, recovery_seconds, clock findings)`` of the restart."""
    view, update, resume = r.view, r.resume.update, r.resume
    ledger, p, k = view.ledger, r.before, r.number
    last = max([x for x in (ledger.last_update(p), r.before_record.end_update) if x is not None],
               default=None)
    if last is None:
        last = update
    holder = [seg for seg in r.before_lineage.segments if seg.holds(update)]
    commit_u = ledger.update_time(holder[0].attempt, update) if holder else None
    failure = r.before_record.failure_time()
    lost, skew = clamp_duration(lost_seconds(commit_u, failure),
                                f"attempt {p} failed before update {update} was committed")
    recovery, skew2 = clamp_duration(recovery_seconds(failure, first_commit),
                                     f"attempt {k} committed its first update before attempt {p} "
                                     "failed")
    # no attempt_started: no U was declared, so nothing says what was lost
    lost_count = lost_updates(last, update) if resume.kind != "untracked" \
        or resume.declared_update is not None else 0
    return lost_count, lost, recovery, [f for f in (skew, skew2) if f is not None]


def analyse_restart(view, number: int, before: int, status_of) -> Restart:
    """Every field of the restart of attempt ``number`` (k) after its predecessor ``before``
    (k-1), read through ``view`` (:class:`~.view.RunView`); ``status_of(generation_id)`` gives a
    generation's status or None. docs/definitions.md#a-restart: replayed and omitted along the
    order where k kept L_U's order (:func:`replayed`, :func:`omitted`), by sample identity where
    it changed it (:func:`compare_orders`)."""
    r = _Restart.of(view, number, before)
    update = r.resume.update
    compared = compare_orders(view, r.lineage, r.own, r.counts_before)
    replay_count = replayed(r.own, r.counts_before) + compared.replayed
    omission_count = omitted(r.own, r.counts_before, r.starts, view, r.lineage,
                             view.floors(r.lineage), view.untracked_ids(r.lineage),
                             compared.mixed) + compared.omitted
    units = units_of([view.units(s) for s in sorted({key[0] for key in r.own})])
    words = unit_word(units)
    committed, first_commit, findings, omission_count = _first_update(r, omission_count, words)
    if replay_count:
        findings.append(Finding("replay", f"{replay_count} {words} committed at or below "
                                          f"update {update} consumed again"))
    if omission_count:
        findings.append(Finding("omission", f"{omission_count} {words} skipped at the resume"))
    findings += _declared_findings(r, status_of)
    findings += _order_findings(r, compared, committed)
    lost_count, lost, recovery, skews = _times(r, first_commit)
    findings += skews
    unproven = unseen_writer(r)
    if unproven is not None:
        findings.append(Finding("predecessor_unknown", unproven))
    return Restart(
        attempt=number, resumed_from=r.resume.generation_id, resumed_update=update,
        world_size_before=r.before_record.world_size, world_size_after=r.record.world_size,
        expected_cursor=expected_cursor(view.frontier(r.before_lineage), view.id_strata),
        resume_cursor=resume_cursor(r.resume, r.starts),
        replayed=replay_count, omitted=omission_count,
        recomputed=recomputed(r.own, r.counts_before, r.rolled_back(), view.fetched(before)),
        lost_updates=lost_count, lost_seconds=lost, recovery_seconds=recovery,
        verdict=verdict(replay_count, omission_count, committed,
                        r.resume.kind != "untracked" and not compared.unknown
                        and unproven is None,
                        bool(compared.undetermined)),
        findings=findings, units=units)
