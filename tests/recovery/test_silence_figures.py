"""The silence figures (docs/definitions.md#silence) and staleness of ended runs, with exact
values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from recoverydash.recovery.figures import (
    attempt_silent,
    checkpoint_stale,
    median_update_interval,
    reporter_ages,
    silence_limit,
    silent_reporters,
    youngest_silent,
)

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def test_it_takes_the_median_update_interval_per_update_across_gaps():
    # the worked example: updates 1, 2, 3, 6 at 0, 10, 30, 60 s -> steps 10, 20, 10
    assert median_update_interval({1: 0.0, 2: 10.0, 3: 30.0, 6: 60.0}) == 10.0
    assert median_update_interval([(1, 0.0), (2, 10.0), (3, 30.0), (4, 60.0)]) == 20.0
    assert median_update_interval([(2, 5.0), (1, 0.0), (3, 9.0), (4, 17.0)]) == 5.0
    assert median_update_interval({1: 0.0, 2: 2.0, 3: 4.0, 4: 10.0}) == 2.0
    assert median_update_interval({1: 0.0, 2: 4.0, 3: 10.0, 4: 20.0, 5: 21.0}) == 5.0


def test_it_counts_a_negative_step_as_zero_and_needs_two_updates():
    assert median_update_interval({1: 10.0, 2: 4.0, 3: 5.0}) == 0.5
    assert median_update_interval({7: 3.0}) is None
    assert median_update_interval([]) is None


def test_it_ages_each_reporter_on_the_servers_clock():
    now = T0 + timedelta(seconds=100)
    ages = reporter_ages({"0": T0.isoformat(), "1": (T0 + timedelta(seconds=97)).isoformat(),
                          "c": (T0 + timedelta(seconds=130)).timestamp()}, now)
    assert ages == {"0": 100.0, "1": 3.0, "c": 0.0}


def test_it_puts_the_silence_limit_at_a_multiple_of_the_median_with_a_floor():
    assert silence_limit(10.0, 3, 900.0) == 900.0
    assert silence_limit(600.0, 3, 900.0) == 1800.0
    assert silence_limit(600.0, 5, 120.0) == 3000.0
    assert silence_limit(None, 3, 900.0) == 900.0


def test_it_calls_the_attempt_silent_only_when_every_reporter_is():
    assert attempt_silent({"0": 901.0, "1": 950.0}, 10.0) == 901.0
    assert attempt_silent({"0": 900.0, "1": 950.0}, 10.0) is None  # 900 is not above 900
    assert attempt_silent({"0": 1000.0, "1": 20.0}, 10.0) is None
    assert attempt_silent({"0": 1500.0}, 600.0) is None  # limit 1,800 s
    assert attempt_silent({"0": 1801.0}, 600.0) == 1801.0
    assert attempt_silent({}, 10.0) is None


def test_it_names_the_ranks_that_stopped_while_others_report():
    ages = {"0": 2.0, "1": 121.0, "2": 3.0, "3": 400.0}
    assert silent_reporters(ages, 10.0) == {"1": 121.0, "3": 400.0}   # limit 120 s
    assert silent_reporters(ages, 30.0) == {"3": 400.0}               # limit 150 s
    assert silent_reporters({"0": 130.0, "1": 140.0}, 10.0) == {}     # all silent: run_silent
    assert silent_reporters({"0": 1.0, "1": 2.0}, 10.0) == {}
    assert silent_reporters({"0": 1.0, "1": 61.0}, 10.0, floor_s=60.0) == {"1": 61.0}


def test_it_reads_the_same_figures_from_a_bulk_summary():
    """What the beat reads in bulk: the youngest age alone, and only the reporters over the
    rank limit with the attempt's count of reporters."""
    assert youngest_silent(901.0, 10.0) == 901.0 == attempt_silent({"0": 901.0, "1": 950.0}, 10.0)
    assert youngest_silent(900.0, 10.0) is None  # 900 is not above 900
    assert youngest_silent(1801.0, 600.0) == 1801.0
    assert silent_reporters({"1": 121.0, "3": 400.0}, 10.0, reporters=4) == {"1": 121.0, "3": 400.0}
    assert silent_reporters({"1": 121.0, "3": 400.0}, 10.0, reporters=2) == {}  # all silent
    assert silent_reporters({}, 10.0, reporters=16384) == {}


def test_it_never_calls_an_ended_run_stale():
    assert checkpoint_stale(7200.0, 3600.0) is True
    assert checkpoint_stale(7200.0, 3600.0, ended=True) is False
    assert checkpoint_stale(None, 0.0) is False


def test_it_puts_an_ended_run_at_no_risk_in_the_attention_order():
    from recoverydash.recovery.attention import at_risk_ratio, needs_attention

    assert at_risk_ratio(7200, 3600) == 2.0
    assert at_risk_ratio(7200, 3600, ended=True) == 0.0
    assert not needs_attention(critical=0, warning=0, ratio=at_risk_ratio(7200, 3600, ended=True),
                               health="ended")
