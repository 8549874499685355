"""Cost of recovery (docs/definitions.md#goodput, #mtbf, #save-cost, #young-interval,
#observed-interval).

All durations are wall seconds. ``goodput`` is a share in [0, 1]. :func:`costs` assembles the
run's :class:`Costs` from the functions below, each named after its figure. A duration taken
between two trainer clocks that comes out negative or not finite is clamped by
:func:`clamp_duration` and reported as a ``clock_skew`` finding (docs/definitions.md#clock-skew).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from .generations import Reason
from .result import CostsEntry


@dataclass
class Costs:
    """Run-level recovery costs, stored under these names (the dashboard reads them as they
    are): ``incidents``: per restart ``{"attempt", "lost_updates", "lost_seconds",
    "recovery_seconds"}``; ``wall_seconds`` and ``useful_seconds`` (:func:`goodput`'s inputs);
    ``goodput``; ``failures`` and ``mtbf_seconds`` (:func:`mtbf`); ``median_save_seconds``
    (:func:`save_cost`); ``young_interval_seconds`` (:func:`young_interval`);
    ``observed_interval_seconds`` (:func:`observed_interval`); ``findings``: ``clock_skew``
    findings ``{"code", "detail"}`` of the durations these rest on (:func:`clamp_duration`), or
    ``costs_unavailable`` when they could not be computed at all (the verdicts stand)."""

    incidents: list = field(default_factory=list)
    wall_seconds: float = 0.0
    useful_seconds: float = 0.0
    goodput: float | None = None
    failures: int = 0
    mtbf_seconds: float | None = None
    median_save_seconds: float | None = None
    young_interval_seconds: float | None = None
    observed_interval_seconds: float | None = None
    findings: list = field(default_factory=list)

    def to_dict(self) -> CostsEntry:
        return {"incidents": self.incidents, "wall_seconds": self.wall_seconds,
                "useful_seconds": self.useful_seconds, "goodput": self.goodput,
                "failures": self.failures, "mtbf_seconds": self.mtbf_seconds,
                "median_save_seconds": self.median_save_seconds,
                "young_interval_seconds": self.young_interval_seconds,
                "observed_interval_seconds": self.observed_interval_seconds,
                "findings": self.findings}


def clamp_duration(seconds: float | None, what: str) -> tuple[float | None, Reason | None]:
    """docs/definitions.md#clock-skew: a duration between two trainer clocks (two hosts, or one
    whose clock was stepped) that comes out negative is counted as 0.0 seconds, one that is not
    finite as None; either way with a ``clock_skew`` Reason naming ``what`` (a phrase such as
    "generation g5 committed before it started") and by how much. Returns (seconds, None) for
    a duration that needs neither, (None, None) for None."""
    if seconds is None:
        return None, None
    if not math.isfinite(seconds):
        return None, Reason("clock_skew", f"{what}: the duration is {seconds!r}; not counted")
    if seconds < 0:
        return 0.0, Reason("clock_skew", f"{what} by {-seconds:.3f} s: the trainers' clocks "
                                         "disagree; counted as 0 s")
    return seconds, None


def useful_seconds(update_count: int, first_commit: float | None,
                   last_commit: float | None) -> float:
    """Wall time spent on ``update_count`` consecutive surviving updates of one lineage segment:
    ``(last - first) * n / (n - 1)``, i.e. n times the mean time per update (start-up and restore
    time before the first update is not time spent on updates). 0 for fewer than 2 updates."""
    if update_count < 2 or first_commit is None or last_commit is None:
        return 0.0
    return (last_commit - first_commit) * update_count / (update_count - 1)


def goodput(useful: float, wall: float) -> float | None:
    """docs/definitions.md#goodput: wall time spent on updates that survive in the live lineage
    (:func:`useful_seconds` summed over its segments) / wall time of the run (from its first
    event to now, or to the newest attempt's end), capped at 1. None when no time passed."""
    return min(1.0, useful / wall) if wall > 0 else None


def mtbf(wall: float, failures: int) -> float | None:
    """docs/definitions.md#mtbf: mean time between failures, wall seconds / failures (an
    attempt followed by another that did not end ``completed`` or ``cancelled``); None without
    a failure."""
    return wall / failures if failures else None


def save_cost(save_seconds: list) -> float | None:
    """docs/definitions.md#save-cost: the measured save cost, median of the committed
    generations' ``checkpoint_started`` -> ``checkpoint_committed`` durations in seconds (None if
    none)."""
    return statistics.median(save_seconds) if save_seconds else None


def young_interval(save_cost: float | None, mean_time_between_failures: float | None) -> \
        float | None:
    """docs/definitions.md#young-interval: Young's checkpoint interval sqrt(2 * save cost *
    MTBF) in seconds, the interval that minimises the expected loss (None when either input is
    unknown)."""
    if save_cost is None or mean_time_between_failures is None:
        return None
    return math.sqrt(2.0 * save_cost * mean_time_between_failures)


def observed_interval(commit_times: list) -> float | None:
    """docs/definitions.md#observed-interval: the interval the run actually uses, median gap in
    seconds between consecutive commits of the live lineage's restorable generations (None for
    fewer than 2)."""
    times = sorted(t for t in commit_times if t is not None)
    gaps = [b - a for a, b in zip(times, times[1:])]
    return statistics.median(gaps) if gaps else None


def costs(ledger, attempts: dict, live_lineage, restarts: list, verdicts: list, on_lineage: list,
          now: float, first_event: float) -> Costs:
    """The run's :class:`Costs`. ``attempts``: ``{number: AttemptRecord}``; ``live_lineage``:
    the live attempt's Lineage; ``restarts``: Restart list; ``verdicts``: GenerationVerdict list;
    ``on_lineage``: the restorable verdicts of the live lineage; ``now`` and ``first_event``:
    POSIX seconds. Wall time runs from the first event to ``now``, or to the newest attempt's
    failure time once it ended. The same as :func:`costs_at` of :func:`cost_basis` at
    ``now``."""
    return costs_at(cost_basis(ledger, attempts, live_lineage, restarts, verdicts, on_lineage,
                               first_event), now)


def cost_basis(ledger, attempts: dict, live_lineage, restarts: list, verdicts: list,
               on_lineage: list, first_event: float) -> dict:
    """Everything :func:`costs` reads of a run apart from the clock, as a JSON-ready dict
    (arguments as :func:`costs`'): ``first_event`` and ``end`` (the newest attempt's failure
    time once it ended, else None: the clock), ``wall_what`` (the phrase of the wall time's
    clock_skew finding), ``useful`` (seconds), ``failures``, ``median_save`` (seconds or None),
    ``observed`` (:func:`observed_interval`, seconds or None), ``incidents`` and ``findings``
    (the clock_skew findings of the durations other than the wall time, in order)."""
    newest = attempts[max(attempts)]
    ended = newest.end_reason is not None
    skews: list[Reason] = []

    def clamped(seconds, what):
        value, skew = clamp_duration(seconds, what)
        if skew is not None:
            skews.append(skew)
        return value

    useful = 0.0
    for seg in live_lineage.segments:
        state = ledger.attempts.get(seg.attempt)
        n = ledger.updates_in(seg.attempt, seg.after, seg.upto)
        if state is None or n < 2:
            continue
        first = next(iter(state.updates.iter_equal_or_larger(seg.after + 1)))
        # the highest reported update at or below the segment's top (n >= 2: one exists)
        top = seg.upto if seg.upto is not None else state.updates.max()
        last = state.updates[state.updates.rank(top) - 1]
        useful += clamped(useful_seconds(n, ledger.update_time(seg.attempt, first),
                                         ledger.update_time(seg.attempt, last)),
                          f"attempt {seg.attempt} reported update {last} before update "
                          f"{first}") or 0.0
    numbers = list(attempts)
    failures = sum(1 for before in numbers[:-1]
                   if attempts[before].end_reason not in ("completed", "cancelled"))
    saves = [clamped(v.committed_at - v.started_at,
                     f"generation {v.generation_id} committed before it started")
             for v in verdicts
             if v.has_manifest and v.committed_at is not None and v.started_at is not None]
    saves = [d for d in saves if d is not None]
    return {
        "first_event": first_event, "end": newest.failure_time() if ended else None,
        "wall_what": ("the newest attempt ended before the run's first event" if ended
                      else "the run's first event is later than now (a trainer clock ahead)"),
        "useful": useful, "failures": failures, "median_save": save_cost(saves),
        "observed": observed_interval([v.committed_at for v in on_lineage]),
        "incidents": [{"attempt": r.attempt, "lost_updates": r.lost_updates,
                       "lost_seconds": r.lost_seconds, "recovery_seconds": r.recovery_seconds}
                      for r in restarts],
        "findings": [f.to_dict() for f in skews]}


def costs_at(basis: dict, now: float) -> Costs:
    """The run's :class:`Costs` at ``now`` (POSIX seconds) from ``basis`` (:func:`cost_basis`):
    the wall time from the first event to ``now`` or to the newest attempt's end (clamped,
    :func:`clamp_duration`: its finding comes first), and what divides by it (:func:`goodput`,
    :func:`mtbf`, :func:`young_interval`)."""
    end = basis["end"]
    wall, skew = clamp_duration((end if end is not None else now) - basis["first_event"],
                                basis["wall_what"])
    wall = wall or 0.0
    useful, failures, median = basis["useful"], basis["failures"], basis["median_save"]
    between = mtbf(wall, failures)
    return Costs(
        incidents=[dict(i) for i in basis["incidents"]],
        wall_seconds=wall, useful_seconds=useful, goodput=goodput(useful, wall),
        failures=failures, mtbf_seconds=between, median_save_seconds=median,
        young_interval_seconds=young_interval(median, between),
        observed_interval_seconds=basis["observed"],
        findings=([skew.to_dict()] if skew is not None else []) + [dict(f) for f in
                                                                    basis["findings"]])
