"""Alert rules ``run_silent`` and ``rank_silent`` (docs/definitions.md#silence): the newest
attempt silent for 3 x its median update interval (900 s the floor), one rank silent for
5 x the interval (120 s the floor) while the others report."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from recoverydash.alerts.models import Alert
from recoverydash.alerts.rules import DEFAULT_CONTRACT, conditions, evaluate_run, silence_of
from recoverydash.runs.models import Analysis, Attempt, LedgerRow, Run

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


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
def test_it_measures_silence_from_the_stored_reports_and_resolves_when_the_rank_returns(
        project):
    run = Run.objects.create(project=project, run_id="quiet", first_event_at=T0,
                             last_received_at=T0)
    Analysis.objects.create(run=run, result=result(), health="ok")
    att = Attempt.objects.create(run=run, attempt=0, last_update=4)
    for u, t in ((1, 0), (2, 10), (3, 20), (4, 30)):
        for rank in (0, 1):
            LedgerRow.objects.create(run=run, attempt=0, update=u, rank=rank,
                                     time=T0 + timedelta(seconds=t - rank))
    att.note_rank_seen(0, T0 + timedelta(seconds=300))
    att.note_rank_seen(1, T0 + timedelta(seconds=30))
    att.note_rank_seen(1, T0 + timedelta(seconds=20))  # an older time never replaces a newer
    att.save()
    now = T0 + timedelta(seconds=301)
    assert silence_of(run, now) == {"attempt": 0, "ended": False, "median": 10.0,
                                    "ages": {"0": 1.0, "1": 271.0}}
    [flip] = evaluate_run(run, now=now)
    assert (flip.alert.rule, flip.alert.subject, flip.alert.dedup_key) == (
        "rank_silent", "1", "quiet:rank_silent:")
    assert flip.alert.summary.startswith("Rank 1 of attempt 0 sent nothing for 4m 31s")
    att.note_rank_seen(1, T0 + timedelta(seconds=300))
    att.save()
    [flip] = evaluate_run(run, now=now)
    assert (flip.alert.rule, flip.new_state) == ("rank_silent", "resolved")
    assert Alert.objects.get().state == "resolved"
