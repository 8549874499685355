"""docs/ingest-v1.md#recovery: ``pending_analysis`` turns false only together with the alerts of
that analysis (they are evaluated in the transaction that stores it), and evaluations of one run
are serialised on its Analysis row (two of them raced on the open-alert constraint)."""

from __future__ import annotations

import threading
from datetime import timedelta
from unittest import mock

import pytest
from django.db import connection
from django.utils import timezone

from recoverydash.alerts import rules
from recoverydash.alerts.models import Alert
from recoverydash.ingest.actions import ingest_batch
from recoverydash.ingest.read_api import recovery_view
from recoverydash.runs import analysis as bridge
from recoverydash.runs.models import Analysis, Run


def start(project, run_id="r", when=None):
    when = when or timezone.now()
    ingest_batch(project, [{"event_id": f"{run_id}-s", "type": "attempt_started",
                            "run_id": run_id, "attempt": 0, "time": when.isoformat(),
                            "world_size": 1, "dataset_version": "v1"}])
    return Run.objects.get(project=project, run_id=run_id)


@pytest.mark.django_db
def test_it_stores_an_analysis_only_together_with_its_alerts(project):
    run = start(project, when=timezone.now() - timedelta(hours=2))
    assert recovery_view(run)["pending_analysis"] is True
    bridge.analyze(run)  # the analysis alone, not the task around it
    body = recovery_view(run)
    assert body["pending_analysis"] is False
    assert [(a["rule"], a["state"]) for a in body["alerts"]] == [("checkpoint_stale", "firing")]


@pytest.mark.django_db
def test_it_keeps_the_analysis_pending_when_its_alerts_cannot_be_evaluated(project):
    run = start(project, when=timezone.now() - timedelta(hours=2))
    with mock.patch.object(rules, "conditions", side_effect=RuntimeError("rules down")):
        with pytest.raises(RuntimeError):
            bridge.analyze(run)
    assert recovery_view(run)["pending_analysis"] is True
    assert not Alert.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_it_serialises_concurrent_evaluations_of_one_run(project):
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL (SQLite serialises every write anyway)")
    run = start(project, when=timezone.now() - timedelta(hours=2))
    bridge.analyze(run)
    Alert.objects.all().delete()
    errors, gate = [], threading.Barrier(4)

    def evaluate():
        try:
            mine = Run.objects.select_related("analysis", "project").get(pk=run.pk)
            gate.wait()
            rules.evaluate_run(mine)
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=evaluate) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert Alert.objects.filter(run=run, rule="checkpoint_stale").count() == 1
    assert Analysis.objects.filter(run=run).count() == 1
