"""Alert rules ``run_silent`` and ``rank_silent`` (docs/definitions.md#silence): the newest
attempt silent for 3 x its median update interval (900 s the floor), one rank silent for
5 x the interval (120 s the floor) while the others report."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone as dj_timezone
from seen_rows import set_ranks_seen

from recoverydash.alerts.models import Alert
from recoverydash.alerts.rules import DEFAULT_CONTRACT, conditions, evaluate_run, silence_of
from recoverydash.runs.models import Analysis, Attempt, LedgerRow, Run

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def result():
    return {"health": "ok", "generations": [], "restarts": [],
            "last_restorable": {"generation_id": "g1", "update": 1,
                                "committed_at": T0.isoformat()}}


def rules_of(silence, ended=False):
    found = conditions(result(), dict(DEFAULT_CONTRACT), now=T0 + timedelta(seconds=60),
                       first_event_at=T0, last_received_at=T0, ended=ended, silence=silence)
    return [(c.rule, c.subject, c.severity, c.summary) for c in found]


def test_it_fires_rank_silent_naming_the_stopped_rank():
    silence = {"attempt": 1, "ended": False, "median": 10.0,
               "ages": {"0": 2.0, "1": 130.0, "2": 1.0}}
    assert rules_of(silence) == [(
        "rank_silent", "1", "warning",
        "Rank 1 of attempt 1 sent nothing for 2m 10s while 2 other reporter(s) keep reporting "
        "(limit 2m 00s: 5 × the median update interval, at least 2m 00s). A dead rank usually "
        "hangs the job.")]
    two = dict(silence, ages={"0": 2.0, "1": 130.0, "2": 1.0, "10": 500.0})
    assert [(r[0], r[1]) for r in rules_of(two)] == [("rank_silent", "1"), ("rank_silent", "10")]


def test_it_fires_run_silent_after_three_median_intervals_with_the_floor():
    slow = {"attempt": 2, "ended": False, "median": 600.0, "ages": {"0": 1801.0, "1": 1900.0}}
    assert rules_of(slow) == [(
        "run_silent", "", "warning",
        "No event from attempt 2 for 30m 01s (limit 30m 00s: 3 × its median update interval of "
        "10m 00s, at least 15m 00s) while the run has not ended.")]
    assert rules_of(dict(slow, ages={"0": 1700.0, "1": 1750.0})) == []  # under 1,800 s
    fast = {"attempt": 2, "ended": False, "median": 10.0, "ages": {"0": 899.0, "1": 899.0}}
    assert rules_of(fast) == []  # 3 x 10 s is under the 900 s floor
    assert [r[0] for r in rules_of(dict(fast, ages={"0": 901.0, "1": 950.0}))] == ["run_silent"]


def test_it_stays_quiet_for_an_ended_run_and_for_ranks_of_an_ended_attempt():
    silence = {"attempt": 1, "ended": True, "median": 10.0, "ages": {"0": 2.0, "1": 500.0}}
    assert rules_of(silence) == []
    assert rules_of(dict(silence, ended=False), ended=True) == []


@pytest.mark.django_db
def test_it_measures_silence_from_the_stored_state_and_resolves_when_the_rank_returns(
        project):
    run = Run.objects.create(project=project, run_id="quiet", first_event_at=T0,
                             last_received_at=T0)
    Analysis.objects.create(run=run, result=dict(result(), update_interval={
        "attempt": 0, "median_s": 10.0}), health="ok")
    att = Attempt.objects.create(run=run, attempt=0, last_update=4)
    att.note_rank_seen(0, T0 + timedelta(seconds=300))
    att.note_rank_seen(1, T0 + timedelta(seconds=30))
    att.note_rank_seen(1, T0 + timedelta(seconds=20))  # an older time never replaces a newer
    att.save()
    now = T0 + timedelta(seconds=301)
    assert silence_of(run, now) == {"attempt": 0, "ended": False, "median": 10.0,
                                    "ages": {"0": 1.0, "1": 271.0}}
    assert LedgerRow.objects.count() == 0  # no raw row is read
    [flip] = evaluate_run(run, now=now)
    assert (flip.alert.rule, flip.alert.subject, flip.alert.dedup_key) == (
        "rank_silent", "1", "quiet:rank_silent:")
    assert flip.alert.summary.startswith("Rank 1 of attempt 0 sent nothing for 4m 31s")
    att.note_rank_seen(1, T0 + timedelta(seconds=300))
    att.save()
    [flip] = evaluate_run(run, now=now)
    assert (flip.alert.rule, flip.new_state) == ("rank_silent", "resolved")
    assert Alert.objects.get().state == "resolved"


@pytest.mark.django_db
def test_it_takes_the_floors_when_the_analysis_observed_no_interval_of_the_attempt(project):
    run = Run.objects.create(project=project, run_id="q", first_event_at=T0, last_received_at=T0)
    set_ranks_seen(Attempt.objects.create(run=run, attempt=1), {"0": T0.isoformat()})
    for stored in ({"attempt": 0, "median_s": 600.0},  # of the attempt before
                   {"attempt": 1, "median_s": None},  # fewer than two updates
                   None):  # stored before the core wrote it
        assert silence_of(run, T0, dict(result(), update_interval=stored))["median"] is None
    assert silence_of(run, T0, {"update_interval": {"attempt": 1, "median_s": 600}}) == {
        "attempt": 1, "ended": False, "median": 600.0, "ages": {"0": 0.0}}


def update(u, rank, s):
    return {"event_id": f"u{u}-{rank}", "type": "update_committed", "run_id": "c", "attempt": 0,
            "rank": rank, "time": (T0 + timedelta(seconds=s)).isoformat(), "update": u,
            "spans": [{"stratum": "m", "epoch": 0,
                       "ranges": [[16 * (u - 1) + 8 * rank, 16 * (u - 1) + 8 * rank + 8]]}]}


def silence_flips(run, now):
    return [f for f in evaluate_run(run, now=now) if f.alert.rule in ("rank_silent", "run_silent")]


@pytest.mark.django_db
def test_a_compacted_run_still_raises_and_resolves_its_silence_alerts(project, settings):
    """Updates 1-4 and 6 of two ranks, 10 s apart on rank 0's clock (rank 1 a second later):
    the core keeps each update's earliest report, steps 10, 10, 10 and 20 / 2 = 10 s per update:
    a median of 10 s, kept in the stored analysis. Once the raw rows are compacted the silence
    rules read the same stored figure and the attempt's RankSeen rows."""
    from recoverydash.ingest.actions import ingest_batch
    from recoverydash.runs import analysis as bridge
    from recoverydash.runs.compaction import compact

    settings.RECOVERYDASH_RUN_SILENT_S = 25.0  # floors under 3 x and 5 x 10 s
    settings.RECOVERYDASH_RANK_SILENT_FLOOR_S = 5.0
    ingest_batch(project, [{"event_id": "s", "type": "attempt_started", "run_id": "c",
                            "attempt": 0, "time": T0.isoformat(), "world_size": 2,
                            "dataset_version": "v"}]
                 + [update(u, r, 10 * u + r) for u in (1, 2, 3, 4, 6) for r in (0, 1)])
    run = Run.objects.get(run_id="c")
    analysis = bridge.analyze(run, now=(T0 + timedelta(seconds=61)).timestamp())
    assert analysis.result["update_interval"] == {"attempt": 0, "median_s": 10.0}
    assert analysis.clock["update_interval"] == {"attempt": 0, "median_s": 10.0}
    assert compact(now=dj_timezone.now() + timedelta(days=30)) > 0
    assert LedgerRow.objects.filter(run=run).count() == 0
    seen = T0 + timedelta(seconds=100)
    set_ranks_seen(Attempt.objects.filter(run=run), {"0": seen.isoformat(),
                                                     "1": (seen - timedelta(seconds=51))
                                                     .isoformat()})
    run = Run.objects.select_related("analysis").get(pk=run.pk)
    now = seen + timedelta(seconds=1)
    assert silence_of(run, now) == {"attempt": 0, "ended": False, "median": 10.0,
                                    "ages": {"0": 1.0, "1": 52.0}}
    [flip] = silence_flips(run, now)  # 52 s over 5 x 10 s
    assert (flip.alert.rule, flip.alert.subjects[0]["subject"], flip.new_state) == (
        "rank_silent", "1", "firing")
    later = now + timedelta(seconds=30)  # both silent: 31 s over 3 x 10 s
    assert sorted((f.alert.rule, f.new_state) for f in silence_flips(run, later)) == [
        ("rank_silent", "resolved"), ("run_silent", "firing")]
    run_silent = Alert.objects.get(rule="run_silent")
    assert run_silent.summary == ("No event from attempt 0 for 31s (limit 30s: 3 × its median "
                                  "update interval of 10s, at least 25s) while the run has not "
                                  "ended.")
    set_ranks_seen(Attempt.objects.filter(run=run), {"0": later.isoformat(),
                                                     "1": later.isoformat()})
    [flip] = silence_flips(run, later)
    assert (flip.alert.rule, flip.new_state) == ("run_silent", "resolved")
