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

from collections.abc import Iterable, Mapping

REPLAYED, EXPECTED, OTHER = "replayed", "expected", "other"
SEEN, MOVED, SKIPPED = "seen", "moved", "skipped"


def _key(w: Mapping) -> tuple:
    return int(w["update"]), int(w["rank"]), int(w.get("slot", w.get("accum_slot", 0)) or 0)


def _index(windows: Iterable[Mapping]) -> dict:
    """``{(update, rank, slot): (ids, epoch)}``; a repeated place keeps its ids in arrival order."""
    out: dict = {}
    for w in windows:
        ids, epoch = out.get(_key(w), ([], w.get("epoch")))
        given = w.get("ids") if "ids" in w else w.get("sample_ids")
        out[_key(w)] = (ids + list(given or []), epoch)
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
    expected, moved, other), "expected_marks" (seen, moved, skipped; lists parallel to the
    ids), "same" (True when both are known and equal in order, False when both are known and
    differ, None otherwise)}``; totals ``observed_ids``, ``expected_ids``,
    ``replayed_ids``, ``skipped_ids``, ``moved_ids``, ``in_place_ids`` (expected ids seen in place);
    ``expected_known`` (any expected window); ``world_size_changed``; ``digests``: one per
    ``(update, rank)`` both sides sent, ``{"update", "rank", "expected", "observed", "same"}``.
    Raises KeyError when a window lacks ``update`` or ``rank``.
    """
    u = int(resumed_update)
    old = {k: v for k, v in _index(before).items() if k[0] <= u}
    expected = {k: v for k, v in _index(rolled_back).items() if k[0] > u} if same_world_size else {}
    seen = {k: v for k, v in _index(observed).items() if k[0] > u}
    updates = sorted({k[0] for k in seen})
    if updates:
        # k-1's windows for the updates k sent, and any earlier one k skipped sending
        updates = sorted(set(updates) | {k[0] for k in expected if k[0] <= updates[-1]})
    places = sorted({k for k in seen if k[0] in updates} | {k for k in expected
                                                             if k[0] in updates})
    was_trained = _trained_test(old)
    expected_anywhere, delivered = _ids_at(places, expected), _ids_at(places, seen)
    rows = [_window_row(k, seen, expected, was_trained, expected_anywhere, delivered)
            for k in places]
    totals = _totals(rows)
    digests = _digest_rows(u, digests_before or {}, digests_after or {}) \
        if same_world_size else []
    return {"resumed_update": u, "updates": updates, "rows": rows, **totals,
            "expected_known": bool(expected) and any(r["expected"] is not None for r in rows),
            "world_size_changed": not same_world_size, "digests": digests}


def _ids_at(places: list, windows: dict) -> set:
    """Every id of ``windows`` (``{place: (ids, epoch)}``) at the places ``places``."""
    out: set = set()
    for k in places:
        if k in windows:
            out.update(windows[k][0])
    return out


def _totals(rows: list[dict]) -> dict:
    """The id counts of :func:`first_window_comparison`'s rows: observed, expected, replayed,
    skipped, moved and in place (expected ids seen where expected)."""
    totals = {"observed_ids": 0, "expected_ids": 0, "replayed_ids": 0, "skipped_ids": 0,
              "moved_ids": 0, "in_place_ids": 0}
    for r in rows:
        totals["observed_ids"] += len(r["observed"] or ())
        totals["expected_ids"] += len(r["expected"] or ())
        totals["replayed_ids"] += r["observed_marks"].count(REPLAYED)
        totals["skipped_ids"] += r["expected_marks"].count(SKIPPED)
        totals["moved_ids"] += r["expected_marks"].count(MOVED)
        totals["in_place_ids"] += r["expected_marks"].count(SEEN)
    return totals


def _trained_test(old: dict):
    """``was_trained(id, epoch)``: whether the lineage had trained on the id before the restart
    (``old``: its windows ``{place: (ids, epoch)}`` at updates <= U), in that epoch or in one
    unknown (None); with the epoch unknown, in any epoch."""
    trained: dict = {}
    for ids, epoch in old.values():
        trained.setdefault(epoch, set()).update(ids)
    trained_any = set().union(*trained.values()) if trained else set()

    def was_trained(i, epoch) -> bool:
        if epoch is None:
            return i in trained_any
        return i in trained.get(epoch, ()) or i in trained.get(None, ())

    return was_trained


def _window_row(k: tuple, seen: dict, expected: dict, was_trained, expected_anywhere: set,
                delivered: set) -> dict:
    """One row of :func:`first_window_comparison` for the place ``k`` (update, rank, slot): the
    observed ids marked replayed, expected, moved or other, the expected ones seen, moved or
    skipped, and whether the two windows are the same."""
    obs, obs_epoch = seen.get(k, (None, None))
    exp = expected.get(k, (None, None))[0]
    exp_set = set(exp or ())
    obs_set = set(obs or ())
    obs_marks = [REPLAYED if was_trained(i, obs_epoch) else
                 EXPECTED if i in exp_set else MOVED if i in expected_anywhere else OTHER
                 for i in obs or ()]
    exp_marks = [SEEN if i in obs_set else MOVED if i in delivered else SKIPPED
                 for i in exp or ()]
    return {"update": k[0], "rank": k[1], "slot": k[2], "expected": exp,
            "observed": obs, "observed_marks": obs_marks, "expected_marks": exp_marks,
            "same": None if exp is None or obs is None else list(exp) == list(obs)}


def _digest_rows(u: int, a: Mapping, b: Mapping) -> list[dict]:
    """The digest comparisons of :func:`first_window_comparison`: one per ``(update, rank)``
    above ``u`` where both k-1 (``a``) and k (``b``) sent a digest."""
    return [{"update": key[0], "rank": key[1], "expected": a[key], "observed": b[key],
             "same": a[key] == b[key]}
            for key in sorted(set(a) & set(b)) if key[0] > u and a[key] and b[key]]
