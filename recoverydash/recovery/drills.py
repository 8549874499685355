"""Failure drills: how a drill run is compared with its control run (docs/definitions.md#drill).

A drill crashes a disposable run at a step of the checkpoint protocol, resumes it with the same
command and compares it with an uninterrupted control run of the same command. The inputs are the
trainer's own traces (``recoverydash.sdk.faults``): per update and rank the positions consumed,
in the order recorded (``[stratum, epoch, position]``), and the parameters after the update (a
sha256 ``digest`` and a ``fingerprint``: per tensor its sum and L2 norm). Pure Python; the SDK's
drill runner (``recoverydash.sdk.drill``) and the server's Drills page use these definitions.
"""

from __future__ import annotations

import math
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
    the result has it, :func:`expected_at_restore`; else ``expected``), the consumed sequence
    has no divergence, the state matched for the updates compared, and, when the server was
    asked, its verdict of the restart is ``exact``."""
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
    if result.get("first_divergence") is not None:
        out.append("the consumed sequence diverges from the control's")
    state = result.get("state") or {}
    if not state.get("match"):
        out.append("the state after the resume differs from the control's"
                   if state.get("first_mismatch") is not None else "no update after the resume")
    server = result.get("server")
    if server is not None and server.get("verdict") != "exact":
        out.append(f"the server's verdict is {server.get('verdict')!r}"
                   + (f" ({server['error']})" if server.get("error") else ""))
    return out
