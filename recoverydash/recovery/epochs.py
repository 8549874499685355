"""What a lineage owes in one epoch of one stratum (docs/definitions.md#omissions, #duplicates,
#epochs-under-several-orders): the one computation the strata (:func:`.counting.count_strata`)
and a restart (:func:`.restarts.analyse_restart`) both read, so that the run page's two numbers
for the same samples never contradict each other.

An epoch consumed under one order is counted along that order, position by position
(:func:`.counting.omissions`). An epoch consumed under several orders (a restart that changed the
seed, the world size, the sampler or the dataset length) cannot be compared by position; it is
compared by **sample identity**: the dataset indices each order's positions held (a span's
``indices``, docs/ingest-v1.md section 3; for strata of sample ids, the ids themselves; for a
``DistributedSampler`` order, re-created from its settings: :mod:`.samplers`). When some
order's identities are unknown, only what is proven without them is counted, and the epoch says
so (``known`` False): a restart over it is ``unverified``.
"""
from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import cast

from pyroaring import BitMap64

from .counting import (
    HASHED_IDS,
    INTEGER_IDS,
    StratumCount,
    duplicates,
    epoch_tail,
    omissions,
    skipped_epochs,
    stratum_kind,
)


@dataclass
class EpochCount:
    """One (stratum, epoch) of a lineage. ``duplicates``: samples consumed under two orders or
    more, counted once per extra time (by identity; the repeats within one order are the keys'
    own :func:`.counting.duplicates`); ``omissions``: samples the epoch owes (units of the
    stratum); ``known``: every order's identities are known (always True for one order);
    ``undetermined``: positions the newest order skipped whose samples may or may not have been
    consumed under an earlier order (decided once the epoch is left)."""

    duplicates: int = 0
    omissions: int = 0
    known: bool = True
    undetermined: int = 0


def epoch_keys(counts: dict) -> dict:
    """``{(stratum, epoch): [keys]}`` of a lineage's ``counts`` (keys sorted, order None first)."""
    out: dict = {}
    for key in counts:
        out.setdefault(key[:2], []).append(key)
    for keys in out.values():
        keys.sort(key=lambda k: "" if k[2] is None else k[2])
    return out


def key_identities(view, lineage, key: tuple, count) -> BitMap64 | None:
    """The sample identities ``lineage`` consumed at position key ``key`` (``count`` its
    :class:`~.counting.KeyCount`): the positions themselves for a stratum of sample ids, else the
    dataset indices the lineage's reports named (:meth:`.ledger.Ledger.identities`), else, when
    the key's order is one the server re-creates (a ``DistributedSampler`` order,
    :meth:`.view.RunView.recreated_order`), the dataset indices its positions and pre-tracking
    cursor hold in that order (docs/definitions.md#re-created-orders). None when unknown: some
    report named none, or positions behind a pre-tracking cursor, and the order is not
    re-created."""
    if key[0] in view.id_strata:
        return count.positions
    found = None if count.prefix else _reported_identities(view, lineage, key)
    if found is None:
        order = view.recreated_order(key)
        if order is not None:
            return order.identities(count.positions, count.prefix)
    return found


def _reported_identities(view, lineage, key: tuple) -> BitMap64 | None:
    """The dataset indices ``lineage``'s reports of ``key`` named, None when one named none."""
    ledger = view.ledger
    out = BitMap64()
    for seg in lineage.segments:
        if not ledger.consumed_key(seg.attempt, key, seg.after, seg.upto):
            continue
        found = ledger.identities(seg.attempt, key, seg.after, seg.upto)
        if found is None:
            return None
        out |= found
    return out


def newest_key(view, lineage, keys: list) -> tuple:
    """Of ``keys`` (one epoch of one stratum), the order the lineage consumed last: a key of the
    newest segment that consumed any of them, there the one whose first update is highest."""
    ledger = view.ledger
    for seg in lineage.segments:  # newest first
        firsts = ledger.first_by_key(seg.attempt, seg.after, seg.upto)
        mine = [(firsts[k][0], i, k) for i, k in enumerate(keys) if k in firsts]
        if mine:
            return max(mine)[2]
    return keys[-1]


def exempt_tail(view, lineage, key: tuple, count, moved_on: bool) -> int:
    """The drop_last remainder of ``key``'s epoch: ``epoch_length - frontier`` when the lineage
    moved on and it is shorter than the global batch of the attempt that left the epoch
    (docs/definitions.md#drop-last-threshold), else 0."""
    length = view.epoch_length(key[0])
    if not moved_on or length is None:
        return 0
    tail = length - count.frontier()
    batch = view.leaving_batch(lineage, key[0], key[1])
    return tail if 0 < tail and batch is not None and tail < batch else 0


def epoch_count(view, lineage, counts: dict, keys: list, moved_on: bool,
                untracked: AbstractSet = frozenset()) -> EpochCount:
    """docs/definitions.md#epochs-under-several-orders: what ``lineage`` (its ``counts``) owes in
    the epoch of ``keys`` (one stratum and epoch, :func:`epoch_keys`); ``moved_on``: the lineage
    consumed a later epoch of the stratum; ``untracked``: id keys whose earlier ids are unknown
    (:func:`.lineage.untracked_id_keys`).

    One order: the key's :func:`.counting.omissions`. Several orders, identities ``I_o`` of each
    known, union ``I``: duplicates ``sum |I_o| - |I|`` (over the orders whose identities are
    known, when some are not); omissions, once the lineage moved on and
    the epoch length L is known, ``L - |I & [0, L)|`` minus the newest order's tail when that is
    a drop_last remainder (for integer ids: the tail rule on the whole count, as
    docs/definitions.md#sample-id-strata); while the epoch is in progress (or L is unknown), the
    proven part: of the ``g`` positions the newest order skipped (:meth:`.counting.KeyCount.gaps`)
    at most ``|I - I_newest|`` hold samples consumed under the other orders, so
    ``max(0, g - |I - I_newest|)`` are omitted, ``min(g, |I - I_newest|)`` undetermined. Some
    identities unknown: the duplicates among the known orders, and once moved on with L known
    ``max(0, L - sum of distinct positions - exempt tail)`` omissions are (``known`` False).
    Strata of hashed ids owe nothing."""
    stratum = keys[0][0]
    kind = stratum_kind(view.ledger, stratum)
    length = view.epoch_length(stratum)
    if len(keys) == 1:
        key = keys[0]
        batch = view.leaving_batch(lineage, stratum, key[1]) if moved_on else None
        return EpochCount(omissions=omissions(key, counts[key], moved_on, length, batch,
                                              HASHED_IDS if key in untracked else kind))
    last = newest_key(view, lineage, keys)
    ids = {k: key_identities(view, lineage, k, counts[k]) for k in keys}
    known = [v for v in ids.values() if v is not None]
    union = BitMap64.union(*known) if known else BitMap64()
    dup = sum(len(v) for v in known) - len(union)
    if len(known) < len(ids):
        unknown = _unknown(view, lineage, counts, keys, last, moved_on, kind)
        unknown.duplicates = dup
        return unknown
    if kind == HASHED_IDS or any(k in untracked for k in keys):
        return EpochCount(dup)
    if kind == INTEGER_IDS:
        if not moved_on or not length or length <= 0:
            return EpochCount(dup)
        batch = view.leaving_batch(lineage, stratum, keys[0][1])
        return EpochCount(dup, epoch_tail(union.range_cardinality(0, length), length, batch))
    if moved_on and length is not None and length > 0:
        missing = length - union.range_cardinality(0, length)
        exempt = exempt_tail(view, lineage, last, counts[last], moved_on)
        return EpochCount(dup, max(0, missing - exempt))
    gaps, others = counts[last].gaps(), len(union - cast(BitMap64, ids[last]))  # all known here
    return EpochCount(dup, max(0, gaps - others), True, min(gaps, others))


def _unknown(view, lineage, counts, keys, last, moved_on, kind) -> EpochCount:
    """:func:`epoch_count` when some order's identities are unknown: what is proven."""
    length = view.epoch_length(keys[0][0])
    if kind == HASHED_IDS or not moved_on or length is None or length <= 0:
        return EpochCount(known=False)
    distinct = sum(counts[k].distinct for k in keys)
    exempt = exempt_tail(view, lineage, last, counts[last], moved_on) \
        if kind != INTEGER_IDS else 0
    return EpochCount(omissions=max(0, length - distinct - exempt), known=False)


def count_strata(view, lineage) -> list[StratumCount]:
    """Per stratum figures of ``lineage`` (docs/definitions.md#counting), read through ``view``
    (:class:`~.view.RunView`: the lineage's counts, each stratum's epoch length, and the global
    batch that bounds the drop_last remainder of an epoch: that of the attempt that left it,
    :meth:`~.view.RunView.leaving_batch`). Sorted by stratum.

    Each (stratum, epoch) owes what :func:`epoch_count` says: along its order when one
    order consumed it (:func:`.counting.omissions`), by sample identity when several did
    (docs/definitions.md#epochs-under-several-orders; samples consumed under two orders are
    duplicates then). Refinement of the tail rule: an epoch the lineage skipped entirely (no
    position of that (stratum, epoch) under any order, while an earlier and a later epoch of the
    stratum were consumed) counts ``epoch_length`` omissions when the epoch length is known; the
    drop_last exemption is for a tail, not for a whole epoch. Epochs are compared per stratum,
    not per order, as for the tail (an order may be named per epoch). Strata of integer sample
    ids count omissions by :func:`.counting.omissions`' id rule (not for a key joined mid-way by
    a lineage whose root is unknown: :func:`.lineage.untracked_id_keys`) and skipped epochs the
    same way; strata of hashed ids count none."""
    counts = view.counts(lineage)
    kinds = {stratum: stratum_kind(view.ledger, stratum) for (stratum, _e, _o) in counts}
    untracked = view.untracked_ids(lineage) if INTEGER_IDS in kinds.values() else set()
    grouped = epoch_keys(counts)
    top_epoch: dict = {}
    for (stratum, epoch) in grouped:
        top_epoch[stratum] = max(epoch, top_epoch.get(stratum, epoch))
    out: dict = {}
    for (stratum, epoch), keys in grouped.items():
        row = out.get(stratum)
        if row is None:
            row = out[stratum] = StratumCount(stratum, units=view.units(stratum))
        for key in keys:
            row.consumed += counts[key].consumed
            row.distinct += counts[key].distinct
            row.duplicates += duplicates(counts[key])
        owed = epoch_count(view, lineage, counts, keys, epoch < top_epoch[stratum], untracked)
        row.duplicates += owed.duplicates
        row.distinct -= owed.duplicates
        row.omissions += owed.omissions
    for stratum in out:
        length = view.epoch_length(stratum)
        if length and length > 0 and kinds[stratum] != HASHED_IDS:
            seen = {epoch for (s, epoch), keys in grouped.items() if s == stratum
                    and not all(counts[k].pretracked_only for k in keys)}  # before the resume
            out[stratum].omissions += skipped_epochs(seen) * length
    return [out[s] for s in sorted(out)]
