"""Each run-level figure and chart series of the core, pinned with exact values from the core's
output (the run of docs/definitions.md#worked-example: 64 positions per update, generation g1250
at update 1,250 committed at t = 1,255 s, attempt 0 fails at 1,300 s, attempt 1 resumes g1250 and
commits 1,251..1,260 at 2,000..2,009 s; analysed at 2,100 s). docs/definitions.md names each
figure."""
from __future__ import annotations

import math

import pytest
from test_definitions import PER_UPDATE, generation, strided, worked_example

from recoverydash.recovery import analyze, format_time
from recoverydash.recovery.costs import goodput, mtbf, observed_interval, save_cost, young_interval
from recoverydash.recovery.figures import (
    checkpoint_stale,
    seconds_since_last_restorable,
    tslrc_sawtooth,
)

NOW = 2100.0


def worked_example_with(*extra_generations, resume_at=80_000):
    run = worked_example(resume_at)
    run.generations += list(extra_generations)
    return run


def test_seconds_since_last_restorable_is_now_minus_the_live_lineages_newest_restorable_commit():
    analysis = analyze(worked_example(80_000), now=NOW)
    assert analysis.last_restorable.generation_id == "g1250"
    assert analysis.seconds_since_last_restorable == NOW - 1255.0 == 845.0
    stored = analysis.to_dict()
    assert stored["seconds_since_last_restorable"] == 845.0
    # a reader of the stored result at a later time computes the same figure the core would
    assert seconds_since_last_restorable(stored, 2200.0) == 945.0
    assert seconds_since_last_restorable(stored, 2200.0) == \
        analyze(worked_example(80_000), now=2200.0).seconds_since_last_restorable
    assert seconds_since_last_restorable(stored, format_time(2200.0)) == 945.0


def test_seconds_since_last_restorable_counts_from_the_first_event_when_none_is_restorable():
    run = worked_example(80_000)
    run.generations[0].object_checks = {}  # not verified yet: committed, not restorable
    analysis = analyze(run, now=NOW)
    assert analysis.last_restorable is None
    assert analysis.seconds_since_last_restorable == NOW - 0.0
    # a stored result written before the core stored first_event_at: the caller's time is used
    legacy = {k: v for k, v in analysis.to_dict().items() if k != "first_event_at"}
    assert seconds_since_last_restorable(legacy, NOW, first_event_at=100.0) == NOW - 100.0
    assert seconds_since_last_restorable({}, NOW) is None


def test_seconds_since_last_restorable_is_never_negative():
    """A commit time ahead of now (two machines' clocks) is 0 seconds, not a negative age."""
    analysis = analyze(worked_example(80_000), now=1250.0)
    assert analysis.seconds_since_last_restorable == 0.0
    assert seconds_since_last_restorable(analysis.to_dict(), 1200.0) == 0.0


def test_seconds_since_last_restorable_stops_at_the_end_of_an_ended_run():
    run = worked_example(80_000)
    run.attempts[1].end_reason, run.attempts[1].ended_at = "completed", 2050.0
    analysis = analyze(run, now=NOW)
    assert analysis.health == "ended" and analysis.ended_at == 2050.0
    assert analysis.seconds_since_last_restorable == 2050.0 - 1255.0
    assert seconds_since_last_restorable(analysis.to_dict(), 10 ** 6) == 795.0
    run.attempts[1].end_reason = "failed"  # a failed attempt not yet replaced: still at risk
    assert analyze(run, now=NOW).seconds_since_last_restorable == 845.0


def test_checkpoint_stale_compares_with_the_limit_and_a_limit_of_zero_stays_zero():
    assert checkpoint_stale(3600.0, 3600) is False
    assert checkpoint_stale(3600.5, 3600) is True
    assert checkpoint_stale(0.5, 0) is True and checkpoint_stale(0.0, 0) is False
    assert checkpoint_stale(None, 0) is False
    run = worked_example(80_000)
    run.contract = {"max_checkpoint_age_s": 0}
    assert analyze(run, now=NOW).health == "at_risk"
    run.contract = {"max_checkpoint_age_s": 845}
    assert analyze(run, now=NOW).health == "ok"


def test_updates_at_risk_are_the_live_lineages_updates_after_the_last_restorable():
    assert analyze(worked_example(80_000), now=NOW).updates_at_risk == 10   # 1,251..1,260
    g1255 = generation("g1255", 1, 1255, 80_000 + 5 * PER_UPDATE, 2006.0)
    assert analyze(worked_example_with(g1255), now=NOW).updates_at_risk == 5  # 1,256..1,260
    unverified = worked_example(80_000)
    unverified.generations[0].object_checks = {}  # committed, not restorable yet
    assert analyze(unverified, now=NOW).updates_at_risk == 1260  # the whole live lineage
    unknown = worked_example(80_000)
    unknown.generations = []  # attempt 1 resumed an unknown g1250: its lineage starts with it
    assert analyze(unknown, now=NOW).updates_at_risk == 10


def test_goodput_is_time_on_surviving_updates_over_wall_time():
    """Attempt 0's 1,250 updates, 1 s apart, and attempt 1's 10 updates, 1 s apart, survive:
    1,260 s of the 2,100 s since the first event."""
    costs = analyze(worked_example(80_000), now=NOW).costs
    assert (costs.useful_seconds, costs.wall_seconds) == (1260.0, 2100.0)
    assert costs.goodput == 1260.0 / 2100.0 == 0.6
    assert goodput(1260.0, 2100.0) == 0.6 and goodput(5.0, 0.0) is None
    assert goodput(30.0, 20.0) == 1.0
    # attempt 1 resumed behind the checkpoint: a rolled-back update does not survive
    rolled = worked_example(80_000)
    rolled.ledger += strided(0, 1251, 80_000, 1251.0) + strided(0, 1252, 80_064, 1252.0)
    costs = analyze(rolled, now=NOW).costs
    assert costs.useful_seconds == 1260.0 and costs.goodput == 0.6


def test_mtbf_is_wall_time_over_failures():
    costs = analyze(worked_example(80_000), now=NOW).costs
    assert (costs.failures, costs.mtbf_seconds) == (1, 2100.0)
    assert mtbf(2100.0, 1) == 2100.0 and mtbf(2100.0, 0) is None


def test_save_cost_is_the_median_of_started_to_committed():
    assert analyze(worked_example(80_000), now=NOW).costs.median_save_seconds == 1255.0 - 1253.0
    assert save_cost([2.0, 9.0, 4.0]) == 4.0 and save_cost([]) is None


def test_young_interval_is_sqrt_of_two_times_save_cost_times_mtbf():
    costs = analyze(worked_example(80_000), now=NOW).costs
    assert costs.young_interval_seconds == math.sqrt(2 * 2.0 * 2100.0)
    assert young_interval(2.0, 2100.0) == math.sqrt(8400.0)
    assert young_interval(None, 2100.0) is None and young_interval(2.0, None) is None


def test_observed_interval_is_the_median_gap_between_live_restorable_commits():
    g1260 = generation("g1260", 1, 1260, 80_000 + 10 * PER_UPDATE, 2010.0)
    assert analyze(worked_example(80_000), now=NOW).costs.observed_interval_seconds is None
    assert analyze(worked_example_with(g1260), now=NOW).costs.observed_interval_seconds \
        == 2010.0 - 1255.0
    assert observed_interval([10.0, None, 30.0, 35.0]) == 12.5


def test_the_tslrc_sawtooth_drops_only_at_restorable_generations_of_the_live_lineage():
    """g1255 of attempt 0 (rolled back: attempt 1 resumed g1250) is restorable but not in the
    live lineage: the sawtooth must not drop there, and its last point is the headline."""
    run = worked_example(80_000)
    run.ledger += [r for u in range(1251, 1256)
                   for r in strided(0, u, (u - 1) * PER_UPDATE, float(u))]
    run.attempts[0].end_update = 1255
    run.generations.append(generation("g1255", 0, 1255, 1255 * PER_UPDATE, 1258.0))
    run.generations.append(generation("g1260", 1, 1260, 80_000 + 10 * PER_UPDATE, 2010.0))
    analysis = analyze(run, now=NOW)
    assert {v.generation_id: v.status for v in analysis.generations} == \
        {"g1250": "restorable", "g1255": "restorable", "g1260": "restorable"}
    assert analysis.restorable_elsewhere == ["g1255"]
    series = analysis.to_dict()["charts"]["tslrc"]
    assert series == {"time": [format_time(t) for t in (0.0, 1255.0, 1255.0, 2010.0, 2010.0,
                                                        NOW)],
                      "seconds": [0.0, 1255.0, 0.0, 755.0, 0.0, 90.0]}
    assert series["seconds"][-1] == analysis.seconds_since_last_restorable


def test_the_tslrc_sawtooth_ignores_a_slow_save_of_an_older_update():
    """Newest is by update: g5 committed after g10 does not reset the clock (the headline keeps
    counting from g10's commit)."""
    series = tslrc_sawtooth([(10, 100.0), (5, 130.0)], 0.0, 200.0)
    assert series["seconds"] == [0.0, 100.0, 0.0, 100.0]
    assert tslrc_sawtooth([], 0.0, 60.0)["seconds"] == [0.0, 60.0]


def test_the_committed_frontier_series_is_each_attempts_own_frontier_after_its_updates():
    charts = analyze(worked_example(79_936), now=NOW).to_dict()["charts"]
    first, second = charts["committed_cursor"]
    assert first["attempt"] == 0 and len(first["points"]) == 200
    assert first["points"][0] == {"time": format_time(1.0), "update": 1, "cursor": [
        {"stratum": "main", "epoch": 0, "position": 64}]}
    assert [p["update"] for p in first["points"][:3]] == [1, 7, 13]  # stride (1250 - 1) // 199
    assert first["points"][-1]["cursor"][0]["position"] == 80_000
    # attempt 1 resumed one update behind the checkpoint: its own frontier shows the replay
    assert [p["cursor"][0]["position"] for p in second["points"]] == \
        [79_936 + 64 * i for i in range(1, 11)]


def test_the_fetched_cursor_series_holds_heartbeats_and_the_attempt_ended_read_cursor():
    charts = analyze(worked_example(80_000), now=NOW).to_dict()["charts"]
    assert charts["fetched"] == [{"attempt": 0, "points": [
        {"time": format_time(1300.0), "rank": None, "update": 1250,
         "fetched": [{"stratum": "main", "epoch": 0, "position": 80_048}]}]}]


@pytest.mark.parametrize("resume_at, health", [(80_000, "ok"), (80_048, "failing"),
                                               (79_936, "failing")])
def test_health_follows_the_last_restarts_verdict_against_the_contract(resume_at, health):
    assert analyze(worked_example(resume_at), now=NOW).health == health
    lenient = worked_example(resume_at)
    lenient.contract = {"max_replay_samples": 64, "max_omission_samples": 48}
    assert analyze(lenient, now=NOW).health == "ok"


@pytest.mark.parametrize("resume_at, gap", [(80_000, 0), (80_048, 48), (79_936, -64)])
def test_the_cursor_gap_is_resume_minus_expected_position_in_one_epoch(resume_at, gap):
    from recoverydash.recovery.restarts import cursor_gaps

    restart = analyze(worked_example(resume_at), now=NOW).to_dict()["restarts"][0]
    assert cursor_gaps(restart["expected_cursor"], restart["resume_cursor"]) == [
        {"stratum": "main", "expected": {"stratum": "main", "epoch": 0, "position": 80_000},
         "resume": {"stratum": "main", "epoch": 0, "position": resume_at}, "gap": gap}]
    assert cursor_gaps([{"stratum": "main", "epoch": 0, "position": 10}],
                       [{"stratum": "main", "epoch": 1, "position": 0},
                        {"stratum": "other", "epoch": 0, "position": 3}]) == [
        {"stratum": "main", "expected": {"stratum": "main", "epoch": 0, "position": 10},
         "resume": {"stratum": "main", "epoch": 1, "position": 0}, "gap": None},
        {"stratum": "other", "expected": None,
         "resume": {"stratum": "other", "epoch": 0, "position": 3}, "gap": None}]


def test_the_tslrc_sawtooth_keeps_the_highest_tooth_of_each_slice_beyond_its_bound():
    """docs/definitions.md#seconds-since-last-restorable: up to TSLRC_TEETH resets the series
    is every tooth; beyond, each of TSLRC_TEETH equal slices of [origin, end] keeps its highest
    tooth, exact, and the last point is still the headline's."""
    from recoverydash.recovery.figures import TSLRC_TEETH, parse_time
    small = [(u, 10.0 * u) for u in range(1, TSLRC_TEETH + 1)]
    series = tslrc_sawtooth(small, 0.0, 10.0 * TSLRC_TEETH + 7)
    assert len(series["time"]) == 2 + 2 * TSLRC_TEETH
    assert series["seconds"][-1] == 7.0
    # 4 resets per slice: gaps 3, 5, 1, 1 seconds, slice width 10 s (end 10 * TSLRC_TEETH)
    commits, t = [], 0.0
    for _slot in range(TSLRC_TEETH):
        for gap in (3.0, 5.0, 1.0, 1.0):
            t += gap
            commits.append((len(commits) + 1, t))
    end = 10.0 * TSLRC_TEETH + 0.5
    series = tslrc_sawtooth(commits, 0.0, end)
    peaks = [(parse_time(x), y) for x, y in zip(series["time"][1:-1:2], series["seconds"][1:-1:2])]
    assert len(peaks) == TSLRC_TEETH
    assert [p for _, p in peaks] == [5.0] * TSLRC_TEETH  # each slice: resets at +3, +8, +9, +10
    assert peaks[1] == (18.0, 5.0)  # the second slice's 5 s tooth, at its reset time
    assert series["seconds"][2:-1:2] == [0.0] * TSLRC_TEETH
    assert series["seconds"][-1] == 0.5 and parse_time(series["time"][-1]) == end


def test_a_result_lists_the_newest_generations_and_counts_them_all():
    """docs/definitions.md#listed-generations: beyond GENERATIONS_SHOWN the result lists the
    newest ones and the last restorable, and counts every generation by status."""
    from recoverydash.recovery import (
        GENERATIONS_SHOWN,
        GenerationVerdict,
        generations_summary,
        shown_generations,
    )
    verdicts = [GenerationVerdict(f"g{i}", 0, i, "rejected" if i else "restorable")
                for i in range(GENERATIONS_SHOWN + 50)]
    shown = shown_generations(verdicts, verdicts[0])
    assert [v.generation_id for v in shown] == ["g0"] + [f"g{i}" for i in
                                                          range(50, GENERATIONS_SHOWN + 50)]
    assert generations_summary(verdicts, len(shown)) == {
        "total": GENERATIONS_SHOWN + 50, "shown": GENERATIONS_SHOWN + 1,
        "by_status": {"rejected": GENERATIONS_SHOWN + 49, "restorable": 1}}
    assert shown_generations(verdicts[:GENERATIONS_SHOWN]) == verdicts[:GENERATIONS_SHOWN]
    run = worked_example(80_000)
    out = analyze(run, now=NOW).to_dict()
    assert out["generations_summary"] == {"total": 1, "shown": 1,
                                          "by_status": {"restorable": 1}}
