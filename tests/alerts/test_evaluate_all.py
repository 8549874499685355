"""The periodic alert evaluation reaches every run that has not ended, in chunks of a stable
order, whatever the number of runs; the clock-driven rules are computed for every run from stored
columns and only runs whose alerts change are evaluated in full, raising and resolving exactly
what a full evaluation of every run does; stale analyses are requested from the workers, oldest
first, within a budget."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
from django.db import transaction
from django.utils import timezone
from seen_rows import set_ranks_seen

from recoverydash.alerts import evaluation
from recoverydash.alerts.models import Alert, AlertFlip
from recoverydash.alerts.rules import evaluate_run
from recoverydash.runs.models import Analysis, Attempt, Run

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def fleet(project, count, ended=()):
    runs = Run.objects.bulk_create([Run(project=project, run_id=f"r{i:05d}")
                                    for i in range(count)])
    now = timezone.now()
    Analysis.objects.bulk_create([Analysis(run=r, health="ended" if i in ended else "ok",
                                           computed_at=now - timedelta(minutes=i))
                                  for i, r in enumerate(runs)])
    return runs


def test_it_reaches_every_run_not_ended_chunk_by_chunk(project, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    runs = fleet(project, 2_503, ended={5, 2_000})
    chunks = []
    real = evaluation.clock_changes
    with mock.patch.object(evaluation, "clock_changes",
                           side_effect=lambda pks, now: chunks.append(pks) or real(pks, now)), \
            mock.patch.object(evaluation, "evaluate_runs") as evaluate_runs:
        assert evaluation.evaluate_all(chunk=200, refresh_budget=0) == 2_501
    evaluate_runs.assert_not_called()  # nothing holds for any of them: no full evaluation
    assert [pk for pks in chunks for pk in pks] == [r.pk for i, r in enumerate(runs)
                                                    if i not in (5, 2_000)]  # each once, in order
    assert [len(pks) for pks in chunks] == [200] * 12 + [101]


def test_it_hands_each_chunk_to_a_worker_task(project, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    runs = fleet(project, 450)
    with mock.patch.object(evaluation, "enqueue", return_value=True) as enqueue:
        assert evaluation.evaluate_all(chunk=200, refresh_budget=0) == 450
    chunks = [c.args for c in enqueue.call_args_list]
    assert [name for name, _, _ in chunks] == ["workers.tasks.evaluate_alerts_chunk"] * 3
    assert [pk for _, pks, _ in chunks for pk in pks] == [r.pk for r in runs]
    assert [len(pks) for _, pks, _ in chunks] == [200, 200, 50]
    assert [refresh for _, _, refresh in chunks] == [[], [], []]


def test_it_requests_the_oldest_analyses_again_within_the_budget(project, settings):
    runs = fleet(project, 30)  # run i analysed i minutes ago
    Run.objects.update(ingest_seq=1)
    Analysis.objects.filter(run=runs[29]).update(error_seq=1)  # refused since its last events
    Run.objects.filter(pk=runs[28].pk).update(analysis_queued_at=timezone.now())  # queued
    requested = []
    with mock.patch("recoverydash.runs.analysis.request_analysis",
                    side_effect=lambda pk: requested.append(pk) or True):
        assert evaluation.refresh_stale(refresh_after_s=120, budget=5) == 5
        assert requested == [r.pk for r in runs[27:22:-1]]  # the five oldest left, oldest first
        requested.clear()
        assert evaluation.refresh_stale(refresh_after_s=120, budget=0) == 0
        settings.RECOVERYDASH_BEAT_REFRESH_BUDGET = 3
        settings.RECOVERYDASH_BEAT_REFRESH_AFTER_S = 25.5 * 60
        assert evaluation.refresh_stale() == 2  # runs 26 and 27 only are older than 25 min
    assert requested == [runs[27].pk, runs[26].pk]


def test_it_requests_again_an_ended_run_whose_last_update_is_not_settled(project):
    # ended runs: one whose analysis left an update unsettled (a rank's part of its last update
    # never came: it counts once the settle delay passed), one settled (null), one without basis
    runs = fleet(project, 3, ended={0, 1, 2})
    Run.objects.update(ingest_seq=1)
    Analysis.objects.filter(run=runs[0]).update(clock_basis={"earliest_unsettled": 1.8e9})
    Analysis.objects.filter(run=runs[1]).update(clock_basis={"earliest_unsettled": None})
    requested = []
    with mock.patch("recoverydash.runs.analysis.request_analysis",
                    side_effect=lambda pk: requested.append(pk) or True):
        assert evaluation.refresh_stale(refresh_after_s=0, budget=5) == 1
    assert requested == [runs[0].pk]


def varied_fleet(project):
    """Runs whose clock-driven alerts are in every situation at ``T0 + 2 h``: limits of 1 h."""
    def make(name, *, committed=None, first=T0, seen=None, ended=None, health="ok",
             received=None, interval=None):
        run = Run.objects.create(project=project, run_id=name, first_event_at=first,
                                 last_received_at=received, ingest_seq=1,
                                 contract={"max_checkpoint_age_s": 3600})
        result = {"health": health, "generations": [], "restarts": [],
                  "first_event_at": first.isoformat(),
                  "last_restorable": None if committed is None else {
                      "generation_id": "g1", "update": 10, "committed_at": committed.isoformat()}}
        if interval is not None:
            result["update_interval"] = interval
        Analysis.objects.create(run=run, result=result, health=health, ingest_seq=1,
                                computed_at=T0)
        if seen is not None:
            set_ranks_seen(Attempt.objects.create(run=run, attempt=0, ended_at=ended), seen)
        return run

    h = timedelta(hours=1)
    fresh = {"0": T0 + 2 * h, "1": T0 + 2 * h}
    return [
        make("fresh", committed=T0 + 1.9 * h, seen=fresh),
        make("stale", committed=T0 + 0.1 * h, seen=fresh),           # warning, 1.9 h
        make("very-stale", committed=T0 - h, seen=fresh),            # critical, 3 h
        make("no-checkpoint", seen=fresh, first=T0 - 2 * h),
        make("rank-gone", committed=T0 + 1.9 * h, interval={"attempt": 0, "median_s": 10.0},
             seen={"0": T0 + 2 * h, "1": T0 + 1.9 * h, "2": T0 + 1.8 * h}),
        make("slow-ranks", committed=T0 + 1.9 * h, interval={"attempt": 0, "median_s": 600.0},
             seen={"0": T0 + 2 * h, "1": T0 + 1.5 * h}),          # 30 min under 5 x 10 min
        make("silent", committed=T0 + 1.9 * h, seen={"0": T0 + 1.7 * h}),
        make("ended-attempt", committed=T0 + 1.9 * h, seen={"0": T0 + 2 * h, "1": T0},
             ended=T0 + 2 * h),
        make("no-attempt", committed=T0 + 1.9 * h, received=T0),
        make("never-reported", committed=T0 + 1.9 * h, seen={}, received=T0 + 2 * h),
        make("ended", committed=T0, seen={"0": T0}, health="ended"),
    ]


def alerts_now() -> list:
    """Every alert: run, rule, state, severity, subjects, key, then its words (summary and each
    subject's) and when it was last seen."""
    return sorted((a.run.run_id, a.rule, a.state, a.severity,
                   tuple(s["subject"] for s in a.subjects), a.dedup_key, a.summary,
                   tuple(sorted((k, str(v)) for s in a.subjects for k, v in s.items())),
                   a.last_seen_at)
                  for a in Alert.objects.select_related("run"))


def flips_now() -> list:
    return sorted((f.alert.run.run_id, f.alert.rule, f.old_state, f.new_state,
                   tuple(sorted((f.change or {}).get("added", []))),
                   tuple(sorted((f.change or {}).get("removed", []))))
                  for f in AlertFlip.objects.select_related("alert__run"))


def full_cycle(now):
    for run in Run.objects.select_related("analysis", "project").order_by("pk"):
        if run.analysis.health != "ended":
            evaluate_run(run, now=now)


def test_it_raises_and_resolves_exactly_what_a_full_evaluation_of_every_run_does(
        project, settings):
    """Three cycles over the varied fleet, the stored state moved between them (a rank returns,
    a checkpoint commits, one alert acknowledged, one per-subject alert stored before grouping):
    after each, the alerts and flips of the bulk path equal those of evaluating every run in
    full, and only the runs whose alerts changed were evaluated in full."""
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.RECOVERYDASH_RUN_SILENT_S = 900.0
    settings.RECOVERYDASH_RANK_SILENT_FLOOR_S = 120.0
    runs = {r.run_id: r for r in varied_fleet(project)}
    h = timedelta(hours=1)

    def step(now, expect_full):
        with transaction.atomic():
            full_cycle(now)
            expected = (alerts_now(), flips_now())
            transaction.set_rollback(True)
        evaluated = []
        real = evaluation.evaluate_runs
        with mock.patch.object(evaluation, "evaluate_runs",
                               side_effect=lambda runs, now: evaluated.extend(
                                   r.run_id for r in runs) or real(runs, now=now)):
            assert evaluation.evaluate_all(chunk=4, refresh_budget=0, now=now) == 10
        assert (alerts_now(), flips_now()) == expected
        assert sorted(evaluated) == sorted(expect_full)
        return expected

    alerts, _ = step(T0 + 2 * h, ["stale", "very-stale", "no-checkpoint", "rank-gone",
                                  "silent", "no-attempt"])
    assert [a[:5] for a in alerts] == [
        ("no-attempt", "run_silent", "firing", "warning", ("",)),
        ("no-checkpoint", "checkpoint_stale", "firing", "critical", ("",)),
        ("rank-gone", "rank_silent", "firing", "warning", ("1", "2")),
        ("silent", "run_silent", "firing", "warning", ("",)),
        ("stale", "checkpoint_stale", "firing", "warning", ("",)),
        ("very-stale", "checkpoint_stale", "firing", "critical", ("",))]
    # nothing moved but the clock by a minute: no run changes, nothing evaluated in full; the
    # alerts that hold have the words the full evaluation gives them a minute later
    alerts, _ = step(T0 + 2 * h + timedelta(minutes=1), [])
    assert {a[0]: a[6] for a in alerts if a[1] != "rank_silent"} == {
        "no-attempt": "No event from the run for 2h 01m (limit 15m 00s: no update interval known"
                      " yet) while the run has not ended.",
        "no-checkpoint": "No restorable checkpoint for 4h 01m (limit 1h 00m); no restorable "
                         "checkpoint yet.",
        "silent": "No event from attempt 0 for 19m 00s (limit 15m 00s: no update interval "
                  "known yet) while the run has not ended.",
        "stale": "No restorable checkpoint for 1h 55m (limit 1h 00m); last restorable g1 at "
                 "update 10.",
        "very-stale": "No restorable checkpoint for 3h 01m (limit 1h 00m); last restorable g1 "
                      "at update 10."}
    # ten minutes later: rank 2 returns (rank 1 stays silent), the silent run reports again,
    # "stale" turns critical past twice its limit, an acknowledged alert that still holds stays
    # as it is, and a per-subject alert stored before alerts grouped is resolved
    later = T0 + 2 * h + timedelta(minutes=10)
    set_ranks_seen(Attempt.objects.filter(run=runs["rank-gone"]), {
        "0": later.isoformat(), "1": (T0 + 1.9 * h).isoformat(), "2": later.isoformat()})
    set_ranks_seen(Attempt.objects.filter(run=runs["silent"]), {"0": later.isoformat()})
    Alert.objects.get(run=runs["very-stale"]).change_state("acknowledged", by="oncall")
    Alert.objects.create(run=runs["slow-ranks"], rule="generation_rejected", subject="g9",
                         dedup_key="slow-ranks:generation_rejected:g9", severity="warning",
                         summary="per subject, stored before alerts grouped", opened_at=T0,
                         last_seen_at=T0)
    alerts, flips = step(later, ["stale", "rank-gone", "silent", "slow-ranks"])
    assert [a[:5] for a in alerts if a[2] != "resolved"] == [
        ("no-attempt", "run_silent", "firing", "warning", ("",)),
        ("no-checkpoint", "checkpoint_stale", "firing", "critical", ("",)),
        ("rank-gone", "rank_silent", "firing", "warning", ("1",)),
        ("stale", "checkpoint_stale", "firing", "critical", ("",)),
        ("very-stale", "checkpoint_stale", "acknowledged", "critical", ("",))]
    assert [f for f in flips if f[0] in ("rank-gone", "silent", "slow-ranks")] == [
        ("rank-gone", "rank_silent", "", "firing", (), ()),
        ("rank-gone", "rank_silent", "firing", "firing", (), ("2",)),
        ("silent", "run_silent", "", "firing", (), ()),
        ("silent", "run_silent", "firing", "resolved", (), ()),
        ("slow-ranks", "generation_rejected", "firing", "resolved", (), ())]
    held = Alert.objects.get(run=runs["no-attempt"])
    assert held.last_seen_at == later  # still holding: seen by the bulk path's one UPDATE


def test_an_alert_another_evaluation_wrote_since_it_was_read_is_left_as_written(project,
                                                                                settings):
    """The words of alerts that still hold are written only on alerts as they were read: one an
    analysis evaluated in between (last_seen_at and words moved) keeps what that wrote."""
    settings.RECOVERYDASH_RUN_SILENT_S = 900.0
    settings.RECOVERYDASH_RANK_SILENT_FLOOR_S = 120.0
    runs = {r.run_id: r for r in varied_fleet(project)}
    now = T0 + timedelta(hours=2)
    full_cycle(now)
    later = now + timedelta(minutes=1)
    changed, holding, _ = evaluation.clock_changes(sorted(r.pk for r in runs.values()), later)
    assert changed == []
    meanwhile = Alert.objects.get(run=runs["stale"])
    Alert.objects.filter(pk=meanwhile.pk).update(summary="written by an analysis meanwhile",
                                                 last_seen_at=later - timedelta(seconds=1))
    assert evaluation._keep_holding(holding, later) == len(holding) - 1
    meanwhile.refresh_from_db()
    assert (meanwhile.summary, meanwhile.last_seen_at) == (
        "written by an analysis meanwhile", later - timedelta(seconds=1))
    held = Alert.objects.get(run=runs["very-stale"])
    assert held.last_seen_at == later
    assert held.summary == ("No restorable checkpoint for 3h 01m (limit 1h 00m); last "
                            "restorable g1 at update 10.")
    assert [s["summary"] for s in held.subjects] == [held.summary]
