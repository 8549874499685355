"""Failure drills: how a drill run is compared with its control run (docs/definitions.md#drill).

A drill crashes a disposable run at a step of the checkpoint protocol, resumes it with the same
command and compares it with an uninterrupted control run of the same command. The inputs are the
trainer's own traces (``recoverydash.sdk.faults``): per update and rank the positions consumed,
in the order recorded (``[stratum, epoch, position]``), and the parameters after the update (a
sha256 ``digest`` and a ``fingerprint``: per tensor its sum and L2 norm) and, from this version
on, the sample ids (dataset indices) each rank received for the update (``ids``,
:func:`compact_ids`). Pure Python; the SDK's
drill runner (``recoverydash.sdk.drill``) and the server's Drills page use these definitions.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

CRASH_POINTS = ("before_shards", "during_shard", "before_commit", "after_commit",
                "corrupt_after_commit")
"""The crash points, in protocol order: before any shard of the generation is written; during
one shard (a truncated file); after every shard, before the commit marker (the manifest); after
the commit marker, before ``checkpoint_committed`` reached the server; and a shard of a
committed generation corrupted after the commit (its size kept, its sha256 not)."""

Key = tuple[int, int]  # (update, rank)


def drill_lineage(crashed: dict[Key, dict], resumed: dict[Key, dict]) -> dict[Key, dict]:
    """The updates of a drill run's lineage: the crashed launch's ``{(update, rank): record}``
    below the resumed launch's first update, then the resumed launch's (the updates the crash
    rolled back are the resumed launch's recomputation)."""
    if not resumed:
        return dict(crashed)
    start = min(u for u, _ in resumed)
    out = {k: v for k, v in crashed.items() if k[0] < start}
    out.update(resumed)
    return out


def first_divergence(control: dict[Key, dict], drill: dict[Key, dict]) -> dict | None:
    """The first divergence of the sequence of ``(update, rank, position)`` consumed: walking the
    updates in order, then the ranks, then the positions in the order each update recorded them,
    the first index where the drill's position differs from the control's (or one of them has
    none). Returns ``{"update", "rank", "index", "control": [stratum, epoch, position] | None,
    "drill": ... | None}``, or None when the sequences are equal."""
    for key in sorted(set(control) | set(drill)):
        a = (control.get(key) or {}).get("consumed") or []
        b = (drill.get(key) or {}).get("consumed") or []
        if a == b and key in control and key in drill:
            continue
        n = next((i for i in range(max(len(a), len(b)))
                  if i >= len(a) or i >= len(b) or a[i] != b[i]), 0)
        return {"update": key[0], "rank": key[1], "index": n,
                "control": a[n] if n < len(a) else None, "drill": b[n] if n < len(b) else None}
    return None


def _id_of(i: Any) -> int | str:
    """An id that is neither int nor str: an integer-like (numpy, a 0-d tensor) as its int,
    anything else (a bool included) as its string."""
    if not isinstance(i, bool) and hasattr(i, "__index__"):
        try:
            return int(i.__index__())
        except (TypeError, ValueError):
            pass
    return str(i)


def compact_ids(ids: list) -> list:
    """The sample ids one rank received for one update, in the order received, as a drill trace
    records them (``ids``): every run of three or more integers with a constant non-zero step
    becomes ``[start, stop]`` (step 1) or ``[start, stop, step]`` (``stop`` = last + step, as
    ``range``), other ids stay as they are (integers or strings; anything else integer-like,
    numpy or a 0-d tensor, as its int, the rest as its string). Repeats are kept: it is a list,
    not a set. :func:`expand_ids` is its inverse."""
    vals: list[Any] = [i if (type(i) is int or type(i) is str) else _id_of(i) for i in ids]
    out: list = []
    i, n = 0, len(vals)
    while i < n:
        v = vals[i]
        if type(v) is int and i + 2 < n and type(vals[i + 1]) is int:
            step = vals[i + 1] - v
            j = i + 1
            while step and j + 1 < n and type(vals[j + 1]) is int and vals[j + 1] - vals[j] == step:
                j += 1
            if step and j - i >= 2:
                out.append([v, vals[j] + step] if step == 1 else [v, vals[j] + step, step])
                i = j + 1
                continue
        out.append(v)
        i += 1
    return out


def expand_ids(items: list) -> list:
    """The ids of :func:`compact_ids`' ``items``, in order (a ``[start, stop(, step)]`` item is
    ``range(start, stop, step)``). Raises ValueError on an item that is none of the three."""
    out: list = []
    for it in items:
        if type(it) is list and len(it) in (2, 3) and all(type(x) is int for x in it):
            out.extend(range(*it))
        elif type(it) is int or type(it) is str:
            out.append(it)
        else:
            raise ValueError(f"not a sample id nor a run of ids: {it!r}")
    return out


def ids_recorded(control: dict[Key, dict], drill: dict[Key, dict]) -> bool:
    """Whether every update record of both sides carries the sample ids its rank received
    (``ids``; traces written before the ids were recorded have none). Without them the drill
    can compare positions only (:func:`first_divergence`)."""
    recs = [*control.values(), *drill.values()]
    return bool(recs) and all(isinstance(r.get("ids"), list) for r in recs)


def _sorted_ids(ids) -> list:
    return sorted(ids, key=lambda i: (type(i) is str, i))


def data_divergence(control: dict[Key, dict], drill: dict[Key, dict]) -> dict | None:
    """The first update and rank whose *samples* differ (docs/definitions.md#drill, data
    divergence): walking the updates in order, then the ranks, the first ``(update, rank)``
    where the multiset of sample ids the drill's rank received differs from the control's (a
    side without that update received none). The order within an update does not count (the
    update's gradient is taken over the whole set), nor do the positions: the same samples at
    other positions (an order renumbered) are no divergence, and other samples at the same
    positions (the order changed: another seed, world size or sampler) are one. Needs
    :func:`ids_recorded`; raises ValueError otherwise.

    Returns ``{"update", "rank", "control_only": [ids], "drill_only": [ids],
    "positions_equal": bool}`` (the ids the control's rank received and the drill's did not,
    and the reverse, each sorted, a repeated id as often as it is in excess;
    ``positions_equal``: both sides recorded the same positions for that update and rank), or
    None when every update and rank received the same samples."""
    if not ids_recorded(control, drill):
        raise ValueError("sample ids were not recorded on every update of both sides")
    for key in sorted(set(control) | set(drill)):
        a, b = control.get(key), drill.get(key)
        ca = Counter(expand_ids(a["ids"])) if a is not None else Counter()
        cb = Counter(expand_ids(b["ids"])) if b is not None else Counter()
        if ca == cb:
            continue
        pa = (a or {}).get("consumed") or []
        pb = (b or {}).get("consumed") or []
        return {"update": key[0], "rank": key[1],
                "control_only": _sorted_ids((ca - cb).elements()),
                "drill_only": _sorted_ids((cb - ca).elements()),
                "positions_equal": a is not None and b is not None
                and sorted(map(tuple, pa)) == sorted(map(tuple, pb))}
    return None


def reordered(control: dict[Key, dict], drill: dict[Key, dict]) -> list[Key]:
    """The ``(update, rank)`` where the positions consumed differ from the control's but the
    sample ids received are the same multiset: an order whose positions were renumbered, not a
    divergence of the data. Sorted; empty without :func:`ids_recorded`."""
    if not ids_recorded(control, drill):
        return []
    out = []
    for key in sorted(set(control) & set(drill)):
        a, b = control[key], drill[key]
        if (a.get("consumed") or []) != (b.get("consumed") or []) and \
                Counter(expand_ids(a["ids"])) == Counter(expand_ids(b["ids"])):
            out.append(key)
    return out


def _id_set_text(ids: list, limit: int = 8) -> str:
    shown = ", ".join(str(i) for i in ids[:limit])
    return "{" + shown + (f", ... {len(ids) - limit} more" if len(ids) > limit else "") + "}"


def data_divergence_text(d: dict, state: dict | None = None) -> str:
    """The failure of a drill whose data diverged (:func:`data_divergence` ``d``), in words,
    with what the state comparison (``state``: ``match``, ``first_mismatch``,
    ``updates_compared``) can still say about the restored model state: when the parameters
    matched the control's for one update or more after the resume and before the divergence,
    the model state was restored correctly; when they first differ at or after the divergence's
    update with no matching update before it, the data explains the difference and the restored
    state is unverified; when they differ before it, the state is blamed separately
    (:func:`drill_failures`)."""
    u = d["update"]
    text = (f"at update {u} rank {d['rank']} received samples {_id_set_text(d['drill_only'])} "
            f"where the uninterrupted run received {_id_set_text(d['control_only'])}: the data "
            "stream diverged")
    if d.get("positions_equal"):
        text += " (same positions, other samples: the order changed)"
    state = state or {}
    mismatch = state.get("first_mismatch")
    if state.get("match") or (state.get("updates_compared") or 0) > 0 and \
            (mismatch is None or mismatch >= u):
        return text + ("; the model state was restored correctly (the parameters matched the "
                       f"control's for {state.get('updates_compared')} update(s) after the "
                       "resume)")
    if mismatch is not None and mismatch >= u:
        return text + (f"; the parameters differ from update {mismatch} on, which the data "
                       "explains: whether the model state was restored correctly is unverified "
                       "(no update after the resume came before the divergence)")
    return text


def _close(a: list, b: list, tol: float) -> bool:
    if len(a) != len(b):
        return False
    return all(len(x) == len(y) and all(math.isclose(p, q, rel_tol=tol, abs_tol=tol)
                                        for p, q in zip(x, y)) for x, y in zip(a, b))


def compare_state(control: dict[Key, dict], resumed: dict[Key, dict], first: int, last: int,
                  tolerance: float | None) -> tuple[bool, int | None, int]:
    """The state after the resume against the control's, update by update from ``first`` to
    ``last`` (every rank the control has at that update). Exact (``tolerance`` None): the
    parameters' sha256 digests are equal. Within a tolerance T: every tensor's sum and L2 norm
    are ``math.isclose`` with relative and absolute tolerance T. Returns ``(match,
    first_mismatch, updates_compared)``: the first update where a rank differs (or is missing
    from the resumed launch), and how many updates matched before it; no update to compare is
    no match, ``first_mismatch`` then ``first``."""
    compared = 0
    for u in range(first, last + 1):
        ranks = sorted(r for (uu, r) in control if uu == u)
        if not ranks:
            break
        for r in ranks:
            a, b = control[(u, r)], resumed.get((u, r))
            if b is None or a.get("digest") is None:
                return False, u, compared
            same = a["digest"] == b.get("digest") if tolerance is None else \
                _close(a.get("fingerprint") or [], b.get("fingerprint") or [], tolerance)
            if not same:
                return False, u, compared
        compared += 1
    return compared > 0, None if compared > 0 else first, compared


def expected_generation(manifests: list[dict], corrupted: str | None = None) -> dict | None:
    """The generation the rules restore after a drill's crash: the newest (by update, then
    ``committed_at``) whose commit marker (manifest) is in storage, except the one whose shard
    was corrupted (its bytes no longer match the manifest's sha256). A generation without its
    marker is never restorable; one whose marker is in storage is, also when the server never
    received its ``checkpoint_committed``. None: a fresh start."""
    ok = [m for m in manifests if m.get("generation_id") != corrupted]
    ok.sort(key=lambda m: (m.get("update") if isinstance(m.get("update"), int) else -1,
                           m.get("committed_at") or ""), reverse=True)
    return ok[0] if ok else None


def expected_at_restore(expected: str | None,
                        plan: dict | None) -> tuple[str | None, str | None]:
    """docs/definitions.md#drill, expected at the restore: the generation a correct trainer
    restores, judged against what could be known at the moment of its restore. ``expected``:
    :func:`expected_generation`'s id (the rules', with every fact in); ``plan``: what the
    resumed launch's ``restore_plan`` answered, as traced (``source``, ``generation_id``,
    ``newer_undecided`` still listed when its wait of ``wait_undecided_s`` seconds expired).

    Returns ``(generation id, warning)``: when the server named another generation and still
    listed ``expected`` as not decided yet (committed, not verified) after the wait, the newest
    restorable at that moment was the one it named: that one, with a warning saying so (a
    difference from the rules, not a failure); otherwise ``expected`` and None."""
    if not plan or plan.get("source") != "server" or plan.get("generation_id") == expected \
            or expected is None:
        return expected, None
    waiting = next((g for g in plan.get("newer_undecided") or []
                    if g.get("generation_id") == expected), None)
    if waiting is None:
        return expected, None
    named = plan.get("generation_id")
    return named, (
        f"the rules restore {expected}, which the server had not decided yet "
        f"({waiting.get('status')}) when the resumed launch's wait of "
        f"{float(plan.get('wait_undecided_s') or 0):g} s expired; it named "
        f"{named or 'no generation'}, the newest restorable then")


def drill_failures(result: dict[str, Any]) -> list[str]:
    """Why a drill run fails its contract (empty: it passes). It passes when the crash happened
    where it was injected (``crash.reached``, a non-zero exit), the resumed launch exited 0,
    the restored generation is the one expected at the restore (``expected_at_restore`` when
    the result has it, :func:`expected_at_restore`; else ``expected``), the data has no
    divergence, the state matched for the updates compared, and, when the server was asked,
    its verdict of the restart is ``exact``.

    The data: with sample ids recorded (``ids_recorded`` True), the samples each rank received
    per update (``data_divergence``, :func:`data_divergence_text`); a difference of positions
    alone is no failure, and a state that first differs at or after the data's divergence is
    not blamed (the data explains it). Without them (``ids_recorded`` False), the positions
    (``first_divergence``), saying the ids were not recorded; a result without the key (an
    older report) as before."""
    out = []
    crash = result.get("crash") or {}
    if not crash.get("reached"):
        out.append("the crash point was not reached (no fault in the trace)")
    elif crash.get("returncode") == 0:
        out.append("the crashed launch exited 0")
    if result.get("point") == "corrupt_after_commit" and not result.get("corrupted"):
        out.append("no committed generation to corrupt")
    rc = (result.get("resume") or {}).get("returncode")
    if rc != 0:
        out.append(f"the resumed launch exited {rc}")
    wanted = result.get("expected_at_restore", result.get("expected"))
    if result.get("restored") != wanted:
        out.append(f"restored {result.get('restored')}, the rules say {wanted}")
    state = result.get("state") or {}
    data = result.get("data_divergence") if result.get("ids_recorded") else None
    if data is not None:
        out.append(data_divergence_text(data, state))
    elif result.get("first_divergence") is not None and not result.get("ids_recorded"):
        out.append("the consumed sequence diverges from the control's" + (
            " (sample ids were not recorded: whether other samples were received or the same "
            "ones at other positions is unknown)" if result.get("ids_recorded") is False else ""))
    blamed = data is None or (state.get("first_mismatch") is not None
                              and state["first_mismatch"] < data["update"])
    if not state.get("match") and blamed:
        out.append("the state after the resume differs from the control's"
                   if state.get("first_mismatch") is not None else "no update after the resume")
    server = result.get("server")
    if server is not None and server.get("verdict") != "exact":
        out.append(f"the server's verdict is {server.get('verdict')!r}"
                   + (f" ({server['error']})" if server.get("error") else ""))
    return out
