"""Hand-offs around the worker's analysis. docs/ingest-v1.md#recovery: ``pending_analysis`` turns
false only together with the alerts of that analysis (they are evaluated in the transaction that
stores it), and evaluations of one run are serialised on its Analysis row (two of them raced on
the open-alert constraint). And what ingest stores reaches the core as the trainer meant it (the
writer of a generation reported by a later attempt)."""

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


@pytest.mark.django_db
def test_it_ties_a_restart_to_a_generation_whose_commit_the_next_launch_reported(project):
    """Through ingest and the worker's analysis: attempt 1 reports the checkpoint_committed of
    g2 (a manifest it found; attempt 0 died before reporting it) and resumes it. The writer is
    attempt 0, which committed update 2 (docs/definitions.md#writer-of-a-generation)."""
    t = timezone.now() - timedelta(minutes=5)

    def at(s):
        return (t + timedelta(seconds=s)).isoformat()

    def upd(attempt, u, s):
        return {"event_id": f"u{attempt}-{u}", "type": "update_committed", "run_id": "w",
                "attempt": attempt, "rank": 0, "time": at(s), "update": u,
                "spans": [{"stratum": "m", "epoch": 0, "ranges": [[8 * (u - 1), 8 * u]]}]}

    start = {"type": "attempt_started", "run_id": "w", "world_size": 1, "dataset_version": "v"}
    manifest = {"schema_revision": 1, "generation_id": "g2", "update": 2, "world_size": 1,
                "required_shards": [], "components": [], "objects": [],
                "data_progress": {"cursor": [{"stratum": "m", "epoch": 0, "position": 16}]},
                "dataset_version": "v", "committed_at": at(3)}
    ingest_batch(project, [dict(start, event_id="s0", attempt=0, time=at(0))]
                 + [upd(0, u, u) for u in (1, 2, 3)])
    ingest_batch(project, [
        dict(start, event_id="s1", attempt=1, time=at(10), resumed_from={
            "generation_id": "g2", "update": 2, "cursor": manifest["data_progress"]["cursor"]}),
        {"event_id": "c2", "type": "checkpoint_committed", "run_id": "w", "attempt": 1,
         "time": at(11), "manifest": manifest}] + [upd(1, u, 10 + u) for u in (3, 4)])
    run = Run.objects.get(run_id="w")
    bridge.analyze(run)
    result = Analysis.objects.get(run=run).result
    (restart,) = result["restarts"]
    assert (restart["verdict"], restart["resumed_from"], restart["lost_updates"]) == \
        ("exact", "g2", 1)
    assert "resumed_from_unknown" not in {f["code"] for f in restart["findings"]}
    assert [(g["generation_id"], g["attempt"]) for g in result["generations"]] == [("g2", 0)]
