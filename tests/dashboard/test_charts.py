"""Server-side figure building: downsampling bounds, the sawtooth, and what each figure draws."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from recoverydash.dashboard import charts


def sawtooth(n: int, period: int) -> tuple[list, list]:
    xs = list(range(n))
    return xs, [float(i % period) for i in xs]


def test_a_million_points_become_at_most_2000_and_keep_every_sawtooth_peak():
    xs, ys = sawtooth(1_000_000, 5_000)  # 200 teeth, peaks of 4,999
    out_x, out_y = charts.downsample(xs, ys)
    assert len(out_x) == len(out_y) <= 2000
    assert out_x == sorted(out_x)
    assert (out_x[0], out_x[-1]) == (0, 999_999)
    peaks = [x for x, y in zip(out_x, out_y) if y == 4999.0]
    assert len(peaks) == 200  # every tooth's peak, at its exact position
    assert all(x % 5000 == 4999 for x in peaks)
    assert min(out_y) == 0.0 and max(out_y) == max(ys)


def test_downsampling_keeps_an_isolated_spike_and_dip():
    rng = random.Random(3)
    ys = [rng.random() for _ in range(300_000)]
    ys[123_457], ys[222_222] = 50.0, -50.0
    out_x, out_y = charts.downsample(list(range(len(ys))), ys, max_points=500)
    assert len(out_x) <= 500
    assert (123_457, 50.0) in zip(out_x, out_y) and (222_222, -50.0) in zip(out_x, out_y)


def test_a_short_series_is_returned_unchanged():
    xs, ys = sawtooth(1500, 100)
    assert charts.downsample(xs, ys) == (xs, ys)
    with pytest.raises(ValueError):
        charts.downsample([1, 2], [1])


def test_thin_bounds_point_clouds_and_keeps_the_ends():
    items = list(range(10_001))
    out = charts.thin(items, 2000)
    assert len(out) <= 2000 and out[0] == 0 and out[-1] == 10_000


def test_the_tslrc_series_is_the_cores_extended_to_now_by_the_cores_figure():
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    result = {"last_restorable": {"generation_id": "g2", "update": 2,
                                  "committed_at": (t0 + timedelta(minutes=90)).isoformat()},
              "first_event_at": t0.isoformat(), "ended_at": None,
              "charts": {"tslrc": {"time": [t0.isoformat(),
                                            (t0 + timedelta(minutes=90)).isoformat(),
                                            (t0 + timedelta(minutes=90)).isoformat(),
                                            (t0 + timedelta(minutes=100)).isoformat()],
                                   "seconds": [0.0, 5400.0, 0.0, 600.0]}}}
    now = t0 + timedelta(minutes=130)
    xs, ys = charts.tslrc_series(result, now)
    assert ys == [0.0, 5400.0, 0.0, 600.0, 2400.0] and xs[-1] == now.isoformat()
    ended = dict(result, ended_at=(t0 + timedelta(minutes=100)).isoformat())
    assert charts.tslrc_series(ended, now)[1] == [0.0, 5400.0, 0.0, 600.0]
    assert charts.tslrc_series({"charts": {}}, now) == ([], [])


def test_tslrc_figure_of_a_million_point_series_reaches_the_browser_bounded():
    t0 = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    xs = [t0 + i for i in range(1_000_000)]
    ys = [float(i % 3600) for i in range(1_000_000)]
    fig = charts.tslrc_figure(xs, ys, 3000.0)
    line, limit = fig["data"]
    assert len(line["x"]) <= 2000 and charts.points_in(fig) <= 2002
    assert max(line["y"]) == pytest.approx(3599 / 60, abs=1e-3)  # minutes
    assert limit["y"] == [50.0, 50.0] and "3000" in limit["name"]


def test_restart_figures_label_each_restart_with_its_numbers():
    restarts = [{"attempt": 1, "replayed": 0, "omitted": 48, "recomputed": 0,
                 "lost_seconds": 5.0, "recovery_seconds": None},
                {"attempt": 2, "replayed": 64, "omitted": 0, "recomputed": 48,
                 "lost_seconds": 300.0, "recovery_seconds": 120.0}]
    pos = charts.restart_positions_figure(restarts)
    assert [t["name"] for t in pos["data"]] == ["replayed", "omitted", "recomputed"]
    assert pos["data"][1]["y"] == [48, 0] and pos["data"][1]["x"] == ["attempt 1", "attempt 2"]
    secs = charts.restart_seconds_figure(restarts)
    assert secs["data"][1]["text"][0] == "not known yet"
    assert secs["data"][0]["name"] == "lost (minutes)" and secs["data"][0]["y"] == [0.08, 5.0]


def test_strata_figure_draws_rates_in_percent():
    fig = charts.strata_figure([{"stratum": "web", "consumed": 1000, "duplicates": 10,
                                 "omissions": 0, "duplicate_rate": 0.01, "omission_rate": 0.0}])
    assert fig["data"][0]["y"] == [1.0] and fig["data"][0]["text"] == ["1% (10)"]


def test_the_interval_figure_draws_the_cores_young_and_observed_intervals():
    fig = charts.interval_figure({"young_interval_seconds": 600,
                                  "observed_interval_seconds": 1800})
    assert fig["data"][0]["x"] == [10.0, 30.0] and fig["data"][0]["text"][1] == "30.0 minutes"
    assert charts.interval_figure({"mtbf_seconds": 3600, "median_save_seconds": 50})["empty"]


def test_empty_inputs_give_a_figure_that_says_why():
    assert charts.restart_positions_figure([])["empty"] is True
    fig = charts.strata_figure([])
    assert fig["layout"]["annotations"][0]["text"] == "No committed update yet."


@pytest.mark.django_db
def test_the_committed_cursor_drawn_is_the_cores_series(known_run, known_result):
    figures = charts.build_run_figures(known_run)
    committed = next(t for t in figures["cursors"]["data"] if t["name"] == "committed")
    series = known_result["charts"]["committed_cursor"]
    assert [a["attempt"] for a in series] == [0, 1]
    drawn = [y for y in committed["y"] if y is not None]
    assert drawn == [p["cursor"][0]["position"] for a in series for p in a["points"]]
    assert drawn[-1] == 80_048 + 10 * 64  # attempt 1's own frontier after update 1,260
    fetched = next(t for t in figures["cursors"]["data"] if t["name"] == "fetched")
    assert fetched["y"] == [80_048, 80_048]  # heartbeat and attempt_ended read cursors


@pytest.mark.django_db
def test_a_committed_series_of_100_attempts_is_downsampled_and_keeps_its_restart_gaps(known_run):
    """The core keeps 200 points per attempt; 100 attempts make 20,000 points, drawn bounded."""
    from recoverydash.runs.models import Analysis

    t0 = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    result = dict(Analysis.objects.get(run=known_run).result)
    series = [{"attempt": k, "points": [
        {"time": datetime.fromtimestamp(t0 + 1000 * k + i, tz=UTC).isoformat(),
         "update": 200 * k + i, "cursor": [{"stratum": "main", "epoch": 0,
                                            "position": 64 * (200 * k + i)}]}
        for i in range(1, 201)]} for k in range(100)]
    result["charts"] = dict(result["charts"], committed_cursor=series)
    Analysis.objects.filter(run=known_run).update(result=result)
    figures = charts.build_run_figures(known_run)
    committed = next(t for t in figures["cursors"]["data"] if t["name"] == "committed")
    assert len(committed["x"]) <= 2000 + 100 and committed["y"][-1] == 64 * 20_000
    assert committed["y"].count(None) == 99  # one break per restart
    assert all(charts.points_in(f) <= 4 * 2000 for f in figures.values())


@pytest.mark.django_db
@pytest.mark.parametrize("contract, limit", [({"max_checkpoint_age_s": 0}, 0.0),
                                             ({"max_checkpoint_age_s": 900}, 900.0),
                                             ({"max_replay_samples": 5}, 3600.0),
                                             ({}, 3600.0)])
def test_the_tslrc_limit_line_is_the_contracts_limit_and_zero_stays_zero(known_run, contract,
                                                                          limit):
    known_run.contract = contract
    known_run.save(update_fields=["contract"])
    line = charts.build_run_figures(known_run)["tslrc"]["data"][1]
    assert line["name"] == f"limit (max_checkpoint_age_s = {limit:g})"
    assert line["y"][0] == line["y"][1] and (line["y"][0] == 0.0) == (limit == 0.0)


def test_a_gapped_series_keeps_its_gaps_and_its_bound():
    xs = list(range(300_000))
    ys = [i if i % 100_000 else None for i in xs]
    out_x, out_y = charts.downsample_gapped(xs, ys, 1000)
    assert len(out_x) <= 1000 + 3
    assert out_y.count(None) == 2  # the gaps at 100,000 and 200,000 (the first None is a start)
    assert max(y for y in out_y if y is not None) == 299_999


def test_the_cores_committed_cursor_becomes_one_line_per_stratum_broken_at_restarts():
    block = {"committed_cursor": [
        {"attempt": 0, "points": [{"time": "2026-01-01T00:00:01+00:00", "update": 1,
                                   "cursor": [{"stratum": "main", "epoch": 0, "position": 64}]},
                                  {"time": "2026-01-01T00:00:02+00:00", "update": 2,
                                   "cursor": [{"stratum": "main", "epoch": 0, "position": 128}]}]},
        {"attempt": 1, "points": [{"time": "2026-01-01T00:01:00+00:00", "update": 2,
                                   "cursor": [{"stratum": "main", "epoch": 0, "position": 176}]}]},
    ], "fetched": [{"attempt": 0, "points": [{"time": "2026-01-01T00:00:02+00:00", "rank": None,
                                              "update": 2, "fetched": [
                                                  {"stratum": "main", "epoch": 0,
                                                   "position": 160}]}]}]}
    committed = charts.committed_from_core(block)
    assert committed["cursor"]["main"] == [64, 128, None, 176]
    fetched = charts.fetched_from_core(block)
    assert fetched == {"main": (["2026-01-01T00:00:02+00:00"], [160])}
    fig = charts.cursors_figure(committed, fetched, {})
    assert [t["name"] for t in fig["data"]] == ["committed", "fetched"]
    assert fig["data"][0]["y"] == [64, 128, None, 176]
