"""The first window after a restart: expected sample identities beside the observed ones
(docs/definitions.md#first-window-after-a-restart).

What a trainer already sends is compared, nothing is inferred: ``audit_window`` events (readable
sample identities per update, rank and accumulation slot, docs/ingest-v1.md#audit_window) and the
``ids_digest`` of ``update_committed`` (a hash of one rank's ordered ids in one update).

A restart is attempt k resuming at update U after its predecessor k-1. The *expected* window of
``(update, rank, slot)`` for an update above U is the window k-1 sent for the same
``(update, rank, slot)``: what the data stream delivered past U before the failure, the suffix of
the lineage's order that a faithful resume delivers again. It is known only when k-1 committed
that update, sent a window for it, and the world size did not change (a rank's share depends on
the world size). The *observed* window is the one k sent. The lineage's windows at or below U
(``before``) are what the restored state had already trained on.

Each observed identity is marked

- ``replayed``: a window of the lineage at or below U holds it, in the same epoch (or either epoch
  is unknown): trained on before the checkpoint and again after the resume;
- ``expected``: the expected window of the same ``(update, rank, slot)`` holds it;
- ``moved``: the expected window of another compared place holds it (delivered early or late, or
  by another rank or slot);
- ``other``: none of these.

Each expected identity is marked ``seen`` (the observed window of the same place holds it),
``moved`` (another compared window of k holds it) or ``skipped`` (no compared window of k holds
it: the resume did not deliver it where the stream had).

Pure Python; the dashboard's restart page draws the result.
"""

from __future__ import annotations

from typing import Iterable, Mapping

REPLAYED, EXPECTED, OTHER = "replayed", "expected", "other"
SEEN, MOVED, SKIPPED = "seen", "moved", "skipped"


def _key(w: Mapping) -> tuple:
    return int(w["update"]), int(w["rank"]), int(w.get("slot", w.get("accum_slot", 0)) or 0)


def _index(windows: Iterable[Mapping]) -> dict:
    """``{(update, rank, slot): (ids, epoch)}``; a repeated place keeps its ids in arrival order."""
    out: dict = {}
    for w in windows:
        ids, epoch = out.get(_key(w), ([], w.get("epoch")))
        out[_key(w)] = (ids + list(w.get("ids") if "ids" in w else w.get("sample_ids") or []),
                        epoch)
    return out


def first_window_comparison(resumed_update: int, before: Iterable[Mapping],
                            rolled_back: Iterable[Mapping], observed: Iterable[Mapping], *,
                            same_world_size: bool = True,
                            digests_before: Mapping | None = None,
                            digests_after: Mapping | None = None) -> dict:
    """Compare the identities a restart delivered after update ``resumed_update`` (U) with those
    the stream had delivered there before the failure.

    ``before``: the lineage's windows at updates <= U; ``rolled_back``: k-1's windows at updates
    > U (the expected windows); ``observed``: k's windows at updates > U. Each window is a mapping
    with ``update``, ``rank``, ``slot`` (or ``accum_slot``), ``ids`` (or ``sample_ids``: ints or
    strings) and optionally ``epoch`` (int or None: unknown). Windows of ``rolled_back`` and
    ``observed`` at U or below are ignored. ``same_world_size``: False when k's world size
    differs from k-1's; then no window is expected (a rank's share changed).
    ``digests_before`` / ``digests_after``: ``{(update, rank): ids_digest}`` of k-1 and of k for
    updates above U; compared where both sent one.

    Returns a dict: ``resumed_update``; ``updates`` (the compared updates, ascending: those k sent
    a window for, and those k-1 sent one for when k sent any); ``rows``, one per compared
    ``(update, rank, slot)`` in that order, each ``{"update", "rank", "slot", "expected"
    (list or None: unknown), "observed" (list or None: not sent), "observed_marks" (replayed,
    expected, moved, other), "expected_marks" (seen, moved, skipped; lists parallel to the ids), "same" (True when both are known and equal in order, False when
    both are known and differ, None otherwise)}``; totals ``observed_ids``, ``expected_ids``,
    ``replayed_ids``, ``skipped_ids``, ``moved_ids``, ``in_place_ids`` (expected ids seen in place);
    ``expected_known`` (any expected window); ``world_size_changed``; ``digests``: one per
    ``(update, rank)`` both sides sent, ``{"update", "rank", "expected", "observed", "same"}``.
    Raises KeyError when a window lacks ``update`` or ``rank``.
    """
    u = int(resumed_update)
    old = _index(before)
    old = {k: v for k, v in old.items() if k[0] <= u}
    expected = {k: v for k, v in _index(rolled_back).items() if k[0] > u} if same_world_size else {}
    seen = {k: v for k, v in _index(observed).items() if k[0] > u}
    updates = sorted({k[0] for k in seen})
    if updates:
        # k-1's windows for the updates k sent, and any earlier one k skipped sending
        updates = sorted(set(updates) | {k[0] for k in expected if k[0] <= updates[-1]})
    places = sorted({k for k in seen if k[0] in updates} | {k for k in expected
                                                             if k[0] in updates})
    # ids the lineage had trained on, by epoch (None: unknown epoch)
    trained: dict = {}
    for ids, epoch in old.values():
        trained.setdefault(epoch, set()).update(ids)
    trained_any = set().union(*trained.values()) if trained else set()

    def was_trained(i, epoch) -> bool:
        if epoch is None:
            return i in trained_any
        return i in trained.get(epoch, ()) or i in trained.get(None, ())

    expected_anywhere = set()
    for k in places:
        if k in expected:
            expected_anywhere.update(expected[k][0])
    delivered = set()
    for k in places:
        if k in seen:
            delivered.update(seen[k][0])
    rows = []
    totals = {"observed_ids": 0, "expected_ids": 0, "replayed_ids": 0, "skipped_ids": 0,
              "moved_ids": 0, "in_place_ids": 0}
    for k in places:
        obs, obs_epoch = seen.get(k, (None, None))
        exp = expected.get(k, (None, None))[0]
        exp_set = set(exp or ())
        obs_set = set(obs or ())
        obs_marks = []
        for i in obs or ():
            mark = (REPLAYED if was_trained(i, obs_epoch) else
                    EXPECTED if i in exp_set else MOVED if i in expected_anywhere else OTHER)
            obs_marks.append(mark)
        exp_marks = [SEEN if i in obs_set else MOVED if i in delivered else SKIPPED
                     for i in exp or ()]
        totals["observed_ids"] += len(obs or ())
        totals["expected_ids"] += len(exp or ())
        totals["replayed_ids"] += obs_marks.count(REPLAYED)
        totals["skipped_ids"] += exp_marks.count(SKIPPED)
        totals["moved_ids"] += exp_marks.count(MOVED)
        totals["in_place_ids"] += exp_marks.count(SEEN)
        rows.append({"update": k[0], "rank": k[1], "slot": k[2], "expected": exp,
                     "observed": obs, "observed_marks": obs_marks, "expected_marks": exp_marks,
                     "same": None if exp is None or obs is None else list(exp) == list(obs)})
    digests = []
    a, b = digests_before or {}, digests_after or {}
    for key in sorted(set(a) & set(b)):
        if key[0] > u and a[key] and b[key] and same_world_size:
            digests.append({"update": key[0], "rank": key[1], "expected": a[key],
                            "observed": b[key], "same": a[key] == b[key]})
    return {"resumed_update": u, "updates": updates, "rows": rows, **totals,
            "expected_known": bool(expected) and any(r["expected"] is not None for r in rows),
            "world_size_changed": not same_world_size, "digests": digests}
