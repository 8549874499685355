"""Alert rule ``restore_failed`` (docs/definitions.md#alert-rules,
docs/ingest-v1.md#restore_failed): an attempt that could not load a generation leaves an alert,
also when it died before
``attempt_started``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from recoverydash.alerts.models import Alert
from recoverydash.alerts.rules import (
    DEFAULT_CONTRACT,
    conditions,
    evaluate_run,
    restore_failed_conditions,
)
from recoverydash.runs.models import Analysis, Attempt, Run

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def failure(**kw):
    f = {"attempt": 2, "generation_id": "g60", "reason": "object_damaged",
         "message": "model/__0_0.distcp: 512 bytes, manifest says 1024", "restored": ""}
    f.update(kw)
    return f


def test_it_fires_restore_failed_critical_when_nothing_was_restored():
    [c] = restore_failed_conditions([failure()])
    assert (c.rule, c.subject, c.severity, c.sticky) == ("restore_failed", "2:g60", "critical",
                                                         True)
    assert c.summary == ("Attempt 2 could not restore g60 (object_damaged: model/__0_0.distcp: "
                         "512 bytes, manifest says 1024); it restored nothing.")


def test_it_fires_restore_failed_as_a_warning_when_an_older_generation_was_restored():
    [c] = restore_failed_conditions([failure(restored="g40"), failure(restored="g40")])
    assert (c.subject, c.severity) == ("2:g60", "warning")
    assert c.summary.endswith("; it restored g40 instead.")


def test_it_holds_restore_failed_beside_the_other_rules_and_for_an_ended_run():
    res = {"health": "ended", "last_restorable": None, "generations": [], "restarts": []}
    found = conditions(res, dict(DEFAULT_CONTRACT), now=T0, first_event_at=T0,
                       last_received_at=T0, ended=True, restore_failures=[failure()])
    assert [(c.rule, c.subject) for c in found] == [("restore_failed", "2:g60")]


@pytest.mark.django_db
def test_it_opens_one_restore_failed_alert_per_attempt_and_generation_and_keeps_it(project):
    run = Run.objects.create(project=project, run_id="rf", first_event_at=T0,
                             last_received_at=T0)
    Analysis.objects.create(run=run, health="ok", result={
        "health": "ok", "generations": [], "restarts": [],
        "last_restorable": {"generation_id": "g40", "update": 40,
                            "committed_at": T0.isoformat()}})
    att = Attempt.objects.create(run=run, attempt=1)
    att.note_restore_failure("g60", "object_damaged", "size", T0, None)
    att.save()
    [flip] = evaluate_run(run, now=T0 + timedelta(seconds=5))
    assert (flip.alert.rule, flip.alert.dedup_key, flip.alert.severity) == (
        "restore_failed", "rf:restore_failed:", "critical")
    assert [(i["subject"], i["kind"], i["detail"]) for i in flip.alert.subjects] == [
        ("1:g60", "restore", "object_damaged")]
    # the attempt then restored g40: the alert stays (a fact), now a warning
    Attempt.objects.filter(pk=att.pk).update(restore_generation_id="g40",
                                             restored_at=T0 + timedelta(seconds=8))
    assert evaluate_run(run, now=T0 + timedelta(seconds=10)) == []
    alert = Alert.objects.get()
    assert (alert.state, alert.severity) == ("firing", "warning")
    alert.change_state("resolved", by="oncall")
    assert evaluate_run(run, now=T0 + timedelta(seconds=20)) == []
    assert Alert.objects.count() == 1
