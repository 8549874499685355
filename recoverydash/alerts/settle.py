"""When an alert rule's evidence is settled, and when an alert that cleared was a flap
(docs/definitions.md#settled-evidence, #flaps).

A generation of status ``committed`` is *undecided* (the core's
``recovery.figures.undecided_generations``, stored as the result's ``undecided``): its objects
are not verified yet, storage could not check them, or the ledger has not settled at its update.
A rule that would read it as absent (no restorable generation, a checkpoint too old, a rejected
generation not superseded) waits for it while it is younger than ``RECOVERYDASH_UNDECIDED_BOUND_S``
(``recovery.figures.awaited``), and stops waiting once one of the generations it waits for has
outlived that bound, saying so. The rules call :func:`no_restorable_wait`,
:func:`rejected_wait` and :func:`stale_wait`; a condition that waits is not *settled*
(``rules.Condition.settled``) and never opens an alert nor adds a subject.

When a subject leaves an alert (the alert resolves, or a state rule's subject clears),
:func:`departure` says whether the fact that cleared it is new (a generation committed after the
subject joined, an event received, the run ended) or was already there when it joined (evidence
that was on its way): the latter, within ``RECOVERYDASH_FLAP_WINDOW_S`` of joining, is a flap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from django.conf import settings

from recoverydash.recovery.figures import RESUMED_FROM_NOT_SEEN, awaited
from recoverydash.recovery.inputs import format_time, parse_time
from recoverydash.recovery.result import AnalysisResult

#: Rules whose subjects are cleared by a restorable generation (the fact is its commit time).
CLEARED_BY_RESTORABLE = ("checkpoint_stale", "no_restorable_generation")


def bound_s() -> float:
    """``RECOVERYDASH_UNDECIDED_BOUND_S``: seconds a rule waits for an undecided generation."""
    return float(settings.RECOVERYDASH_UNDECIDED_BOUND_S)


def _names(entries: Sequence[Mapping[str, Any]], limit: int = 3) -> str:
    ids = [str(g.get("generation_id")) for g in entries]
    return ", ".join(ids[:limit]) + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def overdue_words(overdue: Sequence[Mapping[str, Any]], now, duration) -> str:
    """``u4, u6 committed 12m 00s ago and still undecided (storage_unverified)``: the undecided
    generations a rule stopped waiting for, the oldest's age, and why they are undecided."""
    unseen = [g for g in overdue if RESUMED_FROM_NOT_SEEN in (g.get("reasons") or [])]
    if unseen:  # the live attempt resumed from it: its start is the time waited from
        since = min((float(parse_time(g["committed_at"])) for g in unseen
                     if g.get("committed_at") is not None), default=None)
        ago = f" {duration(parse_time(now) - since)} ago" if since is not None else ""
        return (f"{_names(unseen)}, which the live attempt resumed from{ago}, never reached "
                f"the server nor was found in storage within the {duration(bound_s())} the "
                "rules wait")
    oldest = min((float(parse_time(g["committed_at"])) for g in overdue
                  if g.get("committed_at") is not None), default=None)
    codes = sorted({c for g in overdue for c in g.get("reasons") or []})
    why = ", ".join(codes) if codes else "not verified, or the ledger not settled at its update"
    age = f" {duration(parse_time(now) - oldest)} ago" if oldest is not None else ""
    return (f"{_names(overdue)} committed{age} and still undecided ({why}), past the "
            f"{duration(bound_s())} the rules wait")


def no_restorable_wait(undecided: Sequence[Mapping[str, Any]], now, duration) -> tuple[bool, str]:
    """``no_restorable_generation`` (docs/definitions.md#settled-evidence): ``(settled, words)``.
    The undecided generations of the live lineage (``live``) are *maybe* restorable: the rule
    waits while some is within the bound and none has outlived it (verification that stalls
    pages once the oldest is past the bound, whatever was committed since). ``words``: what the
    summary adds (the overdue ones, or the ones still awaited), "" when there are none."""
    live = [g for g in undecided if g.get("live")]
    waiting, overdue = awaited(live, now, bound_s())
    if overdue:
        return True, "; " + overdue_words(overdue, now, duration)
    if waiting:
        return False, f"; {_names(waiting)} not decided yet"
    return True, ""


def rejected_wait(undecided: Sequence[Mapping[str, Any]], update: int, now) -> bool:
    """``generation_rejected`` of a generation at ``update``: settled unless an undecided
    generation at a higher update (which would supersede it once restorable, as a restorable one
    does) is within the bound and none of those has outlived it."""
    newer = [g for g in undecided if isinstance(g.get("update"), int) and g["update"] > update]
    waiting, overdue = awaited(newer, now, bound_s())
    return not waiting or bool(overdue)


def stale_wait(undecided: Sequence[Mapping[str, Any]], now, age: float,
               max_age: float) -> tuple[bool, list]:
    """``checkpoint_stale`` at checkpoint age ``age`` over the limit ``max_age`` (seconds):
    ``(settled, overdue)``. It waits for the undecided generations of the live lineage committed
    before the age crossed the limit (``now - age + max_age``) whose commit, once restorable,
    would keep the age under the limit now; while some is within the bound and none has
    outlived it. A generation committed after the crossing never holds an alert back: the
    checkpoint was already too old when it came."""
    end = parse_time(now)
    crossing = end - age + max_age
    relevant = []
    for g in undecided:
        at = parse_time(g.get("committed_at"))
        if g.get("live") and at is not None and at <= crossing and end - at <= max_age:
            relevant.append(g)
    waiting, overdue = awaited(relevant, now, bound_s())
    return (not waiting or bool(overdue)), overdue


def _since(item: dict, alert) -> float | None:
    """When the subject ``item`` joined its alert (POSIX seconds): its ``since``, else the
    alert's ``opened_at`` (subjects stored before ``since`` was kept)."""
    when = parse_time(item.get("since"))
    if when is None and alert is not None and alert.opened_at is not None:
        when = alert.opened_at.timestamp()
    return when


def departure(rule: str, item: dict, alert, result: AnalysisResult, now: datetime,
              ended: bool) -> dict:
    """Why the subject ``item`` (an ``Alert.subjects`` entry) of ``alert`` clears at ``now``,
    judged on the stored analysis ``result``: ``{"subject", "held_s", "cause", "detail",
    "flap"}``. ``cause``: ``"changed"`` (a new fact: a restorable generation committed after
    the subject joined, the run ended, an event received), ``"unchanged"`` (the fact that
    cleared it was there when it joined: evidence on its way, which settled) or ``"unknown"``.
    ``flap``: unchanged and cleared within ``RECOVERYDASH_FLAP_WINDOW_S`` of joining
    (docs/definitions.md#flaps)."""
    since = _since(item, alert)
    held = max(0.0, now.timestamp() - since) if since is not None else None
    cause, detail = _cause(rule, item, result, since, ended)
    window = float(settings.RECOVERYDASH_FLAP_WINDOW_S)
    return {"subject": item.get("subject", ""), "held_s": None if held is None else round(held, 3),
            "cause": cause, "detail": detail,
            "flap": cause == "unchanged" and held is not None and held <= window}


def _committed_after(generation: Mapping[str, Any] | None,
                     since: float | None) -> tuple[str, str]:
    """The cause a restorable ``generation`` (``{"generation_id", "committed_at"}``) gives."""
    if not generation:
        return "unknown", ""
    at = parse_time(generation.get("committed_at"))
    name = generation.get("generation_id", "a generation")
    if at is None or since is None:
        return "unknown", f"{name} restorable"
    if at > since:
        return "changed", f"{name} restorable, committed at {format_time(at)}"
    return "unchanged", (f"{name} restorable, committed at {format_time(at)}, before this was "
                         "told: the evidence was not settled")


def _cause(rule: str, item: dict, result: AnalysisResult, since: float | None,
           ended: bool) -> tuple[str, str]:
    if ended:
        return "changed", "the run ended"
    if rule in CLEARED_BY_RESTORABLE:
        return _committed_after(result.get("last_restorable"), since)
    if rule == "generation_rejected":
        gid = item.get("subject")
        mine = next((g for g in result.get("generations") or []
                     if g.get("generation_id") == gid), None)
        if mine is None:
            return "unknown", "no longer listed"
        if mine.get("status") != "rejected":
            return "unchanged", (f"{mine.get('status')} now: it was rejected on evidence that "
                                 "was not settled")
        last = result.get("last_restorable")
        top = last.get("update") if last else None
        if isinstance(top, int) and top > (mine.get("update") or -1):
            return _committed_after(last, since)
        return "unknown", "superseded by a newer restorable generation"
    if rule in ("run_silent", "rank_silent"):
        return "changed", "events arrived"
    return "unknown", ""
