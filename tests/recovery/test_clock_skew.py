"""docs/definitions.md#clock-skew: durations between trainer clocks that come out negative are
counted as 0 with a clock_skew finding, and the cost figures never take the verdicts down."""
from __future__ import annotations

import pytest
from test_definitions import generation, worked_example

from recoverydash.recovery import analysis as analysis_module
from recoverydash.recovery import analyze, restore_plan
from recoverydash.recovery.costs import clamp_duration


def test_a_commit_10_ms_before_its_start_gives_a_save_cost_of_0_and_a_finding():
    """The break test: 10 ms of skew made young_interval take sqrt of a negative save cost
    ("math domain error"), the run was never analysed and the restore plan answered 503."""
    run = worked_example(80_000)
    g = run.generations[0]
    g.started_at = g.committed_at + 0.010
    result = analyze(run, now=2100.0)
    costs = result.costs
    assert costs.median_save_seconds == 0.0
    assert costs.young_interval_seconds == 0.0
    assert costs.findings == [{"code": "clock_skew", "detail":
                               "generation g1250 committed before it started by 0.010 s: the "
                               "trainers' clocks disagree; counted as 0 s"}]
    assert result.generations[0].status == "restorable"
    assert result.restarts[0].verdict == "exact"
    assert restore_plan(result).status_code == 200
    assert result.to_dict()["costs"]["findings"] == costs.findings


def test_the_median_save_cost_counts_a_skewed_save_as_0():
    run = worked_example(80_000)
    run.generations.append(generation("g1200", 0, 1200, 76_800, 1205.0))
    run.generations[1].started_at = 1205.0 - 4.0      # a 4 s save
    run.generations[0].started_at = 1255.0 + 2.0      # committed 2 s before it started
    costs = analyze(run, now=2100.0).costs
    assert costs.median_save_seconds == 2.0  # median of [0, 4]
    assert [f["code"] for f in costs.findings] == ["clock_skew"]


def test_a_failure_reported_before_the_commit_of_u_gives_0_lost_seconds_and_a_finding():
    run = worked_example(80_000)
    run.attempts[0].ended_at = 1240.0  # the failing host's clock is 10 s behind
    restart = analyze(run, now=2100.0).restarts[0]
    assert restart.lost_seconds == 0.0
    assert restart.recovery_seconds == 2000.0 - 1240.0
    assert [f.to_dict() for f in restart.findings if f.code == "clock_skew"] == [
        {"code": "clock_skew", "detail": "attempt 0 failed before update 1250 was committed by "
                                         "10.000 s: the trainers' clocks disagree; counted as "
                                         "0 s"}]
    assert restart.verdict == "exact"


def test_a_first_commit_before_the_failure_gives_0_recovery_seconds_and_a_finding():
    run = worked_example(80_000)
    run.attempts[0].ended_at = 2500.0  # the new attempt committed at 2,000 on its own clock
    restart = analyze(run, now=2600.0).restarts[0]
    assert restart.recovery_seconds == 0.0
    assert restart.lost_seconds == 2500.0 - 1250.0
    assert [f.detail for f in restart.findings if f.code == "clock_skew"] == [
        "attempt 1 committed its first update before attempt 0 failed by 500.000 s: the "
        "trainers' clocks disagree; counted as 0 s"]


def test_a_run_whose_first_event_is_ahead_of_now_has_0_wall_seconds_and_a_finding():
    costs = analyze(worked_example(80_000), now=-5.0).costs
    assert costs.wall_seconds == 0.0 and costs.goodput is None
    assert any(f["detail"].startswith("the run's first event is later than now")
               for f in costs.findings)


@pytest.mark.parametrize("seconds, expected", [
    (3.5, (3.5, None)), (0.0, (0.0, None)), (None, (None, None)),
    (-0.25, (0.0, "x by 0.250 s: the trainers' clocks disagree; counted as 0 s")),
    (float("inf"), (None, "x: the duration is inf; not counted")),
    (float("nan"), (None, "x: the duration is nan; not counted")),
])
def test_clamp_duration(seconds, expected):
    value, finding = clamp_duration(seconds, "x")
    assert (value, finding.detail if finding else None) == expected
    assert finding is None or finding.code == "clock_skew"


def test_a_costs_failure_never_fails_the_verdicts(monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("math domain error")

    monkeypatch.setattr(analysis_module, "cost_basis", broken)
    result = analyze(worked_example(80_048), now=2100.0)
    assert result.costs.findings == [{"code": "costs_unavailable",
                                      "detail": "ValueError: math domain error"}]
    assert result.restarts[0].verdict == "omission" and result.restarts[0].omitted == 48
    assert result.generations[0].status == "restorable"
    assert result.health == "failing"
    assert restore_plan(result).status_code == 200
