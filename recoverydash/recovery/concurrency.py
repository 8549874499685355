"""Two attempts alive at once (docs/definitions.md#concurrent-attempts): a requeued duplicate
launch, a zombie that kept running after its restart.

Times are the trainers' clocks (POSIX seconds), as every duration of the core: attempt a is
alive beside a newer attempt b when a committed an update after b started (an ``attempt_ended``
or a heartbeat stamped a little late is no such evidence: clocks of two hosts may disagree). The
live attempt is the newest one, unless it ended while an older one kept going
(:func:`live_attempt`); a restart whose predecessor was still alive has no failure to measure from
(no lost or recovery seconds, no ``clock_skew`` for them), and says so with the finding
``concurrent_attempts``.
"""
from __future__ import annotations

from .generations import Reason
from .inputs import format_time


def attempt_start(record, state) -> float | None:
    """When an attempt started (POSIX seconds): its ``attempt_started`` time, else the time of
    its first committed update, else its last event; None when nothing of it is timed.
    ``record``: its AttemptRecord; ``state``: its ledger state (None: no update)."""
    if record.started_at is not None:
        return record.started_at
    if state is not None and state.updates:
        first = state.update_time(state.updates.min())
        if first is not None:
            return first
    return record.last_event_at


def last_commit(state) -> float | None:
    """The time (POSIX seconds) of an attempt's newest committed update, from its ledger state
    ``state`` (None: no update, or its time unknown)."""
    if state is None or not state.updates:
        return None
    return state.update_time(state.updates.max())


def _ended(record) -> bool:
    return record.ended_at is not None or record.end_reason is not None


def live_attempt(attempts: dict, ledger) -> int | None:
    """docs/definitions.md#concurrent-attempts: the live attempt. The newest attempt, unless it
    ended (``attempt_ended``, any reason) and an older attempt that did not end committed an
    update after that end (it is still committing): then the newest such older attempt. A
    requeued duplicate that cancelled itself while the original kept training never makes the
    run ``ended``: the original is live. None without attempts. ``attempts``: ``{number:
    AttemptRecord}``; ``ledger``: the run's Ledger."""
    if not attempts:
        return None
    newest = max(attempts)
    record = attempts[newest]
    if not _ended(record):
        return newest
    end = record.failure_time()
    if end is None:
        return newest
    alive = [n for n, r in attempts.items() if n < newest and not _ended(r)
             and (last_commit(ledger.attempts.get(n)) or end) > end]
    return max(alive) if alive else newest


def stored_live_attempt(stored, newest: int | None, newest_ended: bool) -> int | None:
    """docs/definitions.md#concurrent-attempts: the live attempt (:func:`live_attempt`) as the
    stored analysis found it, for readers of stored state (silence rules, attempt state, the
    fleet), never recomputed outside the core. ``stored``: a stored result or clock (a dict with
    ``live_attempt`` and ``newest_attempt``, the newest attempt that analysis saw), or None;
    ``newest``: the newest attempt number stored now (None: no attempt); ``newest_ended``:
    whether it sent ``attempt_ended``.

    The newest attempt while it has not ended (the core's rule: an attempt not ended is live).
    Once it ended, the stored ``live_attempt`` when that analysis saw this same newest attempt
    (an older analysis knew nothing of it); else the newest. A requeued duplicate that
    cancelled itself while the original keeps committing is therefore never the live attempt
    once the analysis has seen both."""
    if newest is None or not newest_ended or not isinstance(stored, dict):
        return newest
    live, seen = stored.get("live_attempt"), stored.get("newest_attempt")
    if type(live) is int and type(seen) is int and seen == newest and 0 <= live <= newest:
        return live
    return newest


def concurrency(attempts: dict, ledger, before: int, number: int) -> str | None:
    """The detail of the finding ``concurrent_attempts`` for the restart of attempt ``number``
    after ``before`` (docs/definitions.md#concurrent-attempts), None when ``before`` committed no
    update after ``number`` started (:func:`attempt_start`): how many it committed since, up to
    which update, and when the last one was."""
    start = attempt_start(attempts[number], ledger.attempts.get(number))
    state = ledger.attempts.get(before)
    last = last_commit(state)
    if start is None or last is None or last <= start:
        return None
    below = state.reported_by(start)
    count = ledger.updates_in(before, -1 if below is None else below, None)
    return (f"attempt {before} was still committing after attempt {number} started at "
            f"{format_time(start)}: {count} updates (up to update {state.updates.max()}), the "
            f"last at {format_time(last)} (trainers' clocks). Two attempts were alive at once "
            f"(a duplicate launch, or a zombie); attempt {before} had not failed, so no lost or "
            f"recovery seconds are measured")


def mark_concurrent(view, restarts: list) -> None:
    """Add the finding ``concurrent_attempts`` to every restart whose predecessor was alive
    after it started (:func:`concurrency`), in place: its ``lost_seconds`` and
    ``recovery_seconds`` become None (the predecessor did not fail before it), the
    ``clock_skew`` findings they gave are dropped (no clock is wrong), and when the predecessor
    is the live attempt (the restart was a duplicate launch) its ``lost_updates`` are 0: the
    live lineage lost nothing.
    ``view``: the RunView; ``restarts``: Restart list in attempt order."""
    numbers = list(view.attempts)
    for restart in restarts:
        i = numbers.index(restart.attempt)
        detail = concurrency(view.attempts, view.ledger, numbers[i - 1], restart.attempt) \
            if i > 0 else None
        if detail is None:
            continue
        restart.lost_seconds = restart.recovery_seconds = None
        if view.live == numbers[i - 1]:  # a duplicate beside the live attempt rolled nothing back
            restart.lost_updates = 0
        restart.findings = [f for f in restart.findings if f.code != "clock_skew"]
        restart.findings.append(Reason("concurrent_attempts", detail))
