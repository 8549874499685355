"""A run whose events the core refuses: the error is stored and shown, reads never answer 500,
the sweep does not retry it until new events arrive, and one run's failure or a run_id shared
by two projects never stops the other runs' alerts."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from recoverydash.alerts import evaluation
from recoverydash.alerts.models import Alert
from recoverydash.ingest.actions import ingest_batch
from recoverydash.runs import analysis as bridge
from recoverydash.runs.models import Analysis, Run

pytestmark = pytest.mark.django_db


def start(project, run_id="r", when=None):
    when = when or timezone.now()
    ingest_batch(project, [{"event_id": f"{run_id}-s", "type": "attempt_started",
                            "run_id": run_id, "attempt": 0, "time": when.isoformat(),
                            "world_size": 1, "dataset_version": "v1"}])
    return Run.objects.get(project=project, run_id=run_id)


def test_it_stores_a_refused_analysis_and_does_not_retry_it_until_new_events(project):
    run = start(project)
    with mock.patch.object(bridge.recovery, "analyze", side_effect=ValueError("bad range")):
        with pytest.raises(bridge.AnalysisFailed):
            bridge.analyze(run)
        assert evaluation.analyze_and_alert(run.pk) is None  # the task ends, no retry
    analysis = Analysis.objects.get(run=run)
    assert analysis.error == "ValueError: bad range" and analysis.error_seq == run.ingest_seq
    with mock.patch.object(bridge, "request_analysis") as request:
        bridge.sweep()
        request.assert_not_called()
        ingest_batch(project, [{"event_id": "r-hb", "type": "heartbeat", "run_id": "r",
                                "attempt": 0, "time": timezone.now().isoformat(), "update": 0}])
        bridge.sweep()
        request.assert_called_once_with(run.pk)
    bridge.analyze(run)  # the core accepts the inputs again: the error is cleared
    assert Analysis.objects.get(run=run).error == ""


def test_it_answers_503_not_500_when_the_restore_plan_cannot_be_analysed(client, project,
                                                                        read_token):
    start(project)
    with mock.patch.object(bridge.recovery, "analyze", side_effect=OverflowError("too large")):
        response = client.get("/api/v1/runs/r/restore-plan",
                              HTTP_AUTHORIZATION=f"Bearer {read_token}")
    assert response.status_code == 503
    assert response.json()["error"] == "analysis_failed"
    recovery = client.get("/api/v1/runs/r/recovery", HTTP_AUTHORIZATION=f"Bearer {read_token}")
    assert recovery.status_code == 200
    assert recovery.json()["analysis_error"] == "OverflowError: too large"


def test_it_keeps_alerts_of_two_projects_with_the_same_run_id_apart(project, other_project,
                                                                     settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    old = timezone.now() - timedelta(hours=2)
    mine, theirs = start(project, "shared", old), start(other_project, "shared", old)
    for run in (mine, theirs):
        bridge.analyze(run)
        Analysis.objects.filter(run=run).update(computed_at=old)
    assert evaluation.evaluate_all() == 2
    stale = Alert.objects.filter(rule="checkpoint_stale", state="firing")
    assert sorted(a.run.project.name for a in stale) == ["alpha", "beta"]
    assert {a.dedup_key for a in stale} == {"shared:checkpoint_stale:"}


def test_it_evaluates_the_other_runs_when_one_run_fails(project, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    old = timezone.now() - timedelta(hours=2)
    first, second = start(project, "a", old), start(project, "b", old)
    for run in (first, second):
        bridge.analyze(run)
    Alert.objects.all().delete()  # both runs' checkpoint_stale to open: both evaluated in full
    real = evaluation.evaluate_runs

    def evaluate_runs(runs, now=None):  # the chunk's batch fails, then run "a" alone
        if any(run.run_id == "a" for run in runs):
            raise RuntimeError("boom")
        return real(runs, now=now)

    with mock.patch.object(evaluation, "evaluate_runs", side_effect=evaluate_runs):
        assert evaluation.evaluate_all() == 1
    assert Alert.objects.filter(run=second, rule="checkpoint_stale").exists()
