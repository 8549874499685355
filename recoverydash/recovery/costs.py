"""Cost of recovery (DESIGN.md, "Cost of recovery"; seed 004's teaching run).

All durations are wall seconds. ``goodput`` is a share in [0, 1].
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field


@dataclass
class Costs:
    """Run-level recovery costs. ``incidents``: per restart ``{"attempt", "lost_updates",
    "lost_seconds", "recovery_seconds"}``."""

    incidents: list = field(default_factory=list)
    wall_seconds: float = 0.0
    useful_seconds: float = 0.0
    goodput: float | None = None
    failures: int = 0
    mtbf_seconds: float | None = None
    median_save_seconds: float | None = None
    young_interval_seconds: float | None = None
    observed_interval_seconds: float | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def useful_seconds(update_count: int, first_commit: float | None,
                   last_commit: float | None) -> float:
    """Wall time spent on ``update_count`` consecutive surviving updates of one lineage segment:
    ``(last - first) * n / (n - 1)``, i.e. n times the mean time per update (start-up and restore
    time before the first update is not time spent on updates). 0 for fewer than 2 updates."""
    if update_count < 2 or first_commit is None or last_commit is None:
        return 0.0
    return (last_commit - first_commit) * update_count / (update_count - 1)


def goodput(useful: float, wall: float) -> float | None:
    """Wall time spent on updates that survive in the lineage / wall time (None if no time)."""
    return min(1.0, useful / wall) if wall > 0 else None


def mtbf(wall: float, failures: int) -> float | None:
    """Mean time between failures: wall seconds / failures (None without a failure)."""
    return wall / failures if failures else None


def median_save_cost(save_seconds: list) -> float | None:
    """Median of checkpoint_started -> checkpoint_committed durations (None if none)."""
    return statistics.median(save_seconds) if save_seconds else None


def young_interval(save_cost: float | None, mean_time_between_failures: float | None) -> \
        float | None:
    """Young's checkpoint interval sqrt(2 * save cost * MTBF), the interval that minimises the
    expected loss (None when either input is unknown)."""
    if save_cost is None or mean_time_between_failures is None:
        return None
    return math.sqrt(2.0 * save_cost * mean_time_between_failures)


def observed_interval(commit_times: list) -> float | None:
    """Median gap between consecutive restorable generations' commits (None for fewer than 2)."""
    times = sorted(t for t in commit_times if t is not None)
    gaps = [b - a for a, b in zip(times, times[1:])]
    return statistics.median(gaps) if gaps else None
