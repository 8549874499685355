"""Facts about a past restart (event rules: restart_replay, restart_omission,
resumed_from_unrestorable, restore_failed, ...) stay open until a person resolves them, also once
the run has ended; conditions about the run now (checkpoint_stale, run_silent) resolve when it
ends (docs/operator-guide.md 'Alerts and webhooks', docs/definitions.md#alert-rules)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from recoverydash.alerts.models import Alert
from recoverydash.alerts.rules import evaluate_run
from recoverydash.runs.models import Analysis, Attempt, Run
from tests.alerts.test_rules import T0, restart, result

pytestmark = pytest.mark.django_db

LATE = T0 + timedelta(hours=2)  # past the default 1 h checkpoint age


def facts():
    return [restart(attempt=1, replayed=64, verdict="replay"),
            restart(attempt=2, omitted=48, verdict="omission"),
            restart(attempt=3, verdict="unverified",
                    findings=[{"code": "resumed_from_unrestorable", "detail": "x"}])]


def reload(run, res, health):
    Analysis.objects.filter(run=run).update(result=res, health=health)
    return Run.objects.select_related("analysis", "project").get(pk=run.pk)


def states(run):
    return {a.rule: a.state for a in Alert.objects.filter(run=run)}


def test_it_keeps_facts_about_past_restarts_open_after_the_run_ends_until_a_person_resolves(
        project):
    run = Run.objects.create(project=project, run_id="sticky", first_event_at=T0,
                             last_received_at=T0)
    Analysis.objects.create(run=run, result=result(restarts=facts()), health="failing")
    att = Attempt.objects.create(run=run, attempt=3)
    att.note_restore_failure("g60", "object_damaged", "size", T0, None)
    att.save()
    run = Run.objects.select_related("analysis", "project").get(pk=run.pk)
    opened = evaluate_run(run, now=LATE)
    assert sorted((f.alert.rule, f.new_state) for f in opened) == [
        ("checkpoint_stale", "firing"), ("restart_omission", "firing"),
        ("restart_replay", "firing"), ("restore_failed", "firing"),
        ("resumed_from_unrestorable", "firing"), ("run_silent", "firing")]

    # the run ends; a later analysis no longer finds the restart facts (a contract edited to
    # allow more, a refined verdict): the facts happened all the same
    ended = result(health="ended", restarts=[])
    Attempt.objects.filter(run=run).update(restore_failures=[])
    run = reload(run, ended, "ended")
    flips = evaluate_run(run, now=LATE + timedelta(minutes=1))

    assert sorted((f.alert.rule, f.old_state, f.new_state) for f in flips) == [
        ("checkpoint_stale", "firing", "resolved"), ("run_silent", "firing", "resolved")]
    assert states(run) == {"checkpoint_stale": "resolved", "run_silent": "resolved",
                           "restart_replay": "firing", "restart_omission": "firing",
                           "resumed_from_unrestorable": "firing", "restore_failed": "firing"}
    replay = Alert.objects.get(run=run, rule="restart_replay")
    assert [s["subject"] for s in replay.subjects] == ["1"]
    assert evaluate_run(run, now=LATE + timedelta(minutes=2)) == []  # no flapping

    replay.change_state("resolved", by="oncall")
    assert evaluate_run(run, now=LATE + timedelta(minutes=3)) == []
    assert Alert.objects.get(pk=replay.pk).state == "resolved"
    assert Alert.objects.filter(run=run, rule="restart_replay").count() == 1  # never reopened


def test_it_keeps_a_per_restart_alert_stored_before_grouping_open_after_the_run_ends(project):
    run = Run.objects.create(project=project, run_id="legacy", first_event_at=T0,
                             last_received_at=T0)
    Analysis.objects.create(run=run, result=result(health="ended", restarts=facts()[:1]),
                            health="ended")
    old = Alert.objects.create(run=run, rule="restart_replay", subject="1",
                               dedup_key="legacy:restart_replay:1", severity="critical",
                               summary="Attempt 1 replayed 64 committed positions")
    run = Run.objects.select_related("analysis", "project").get(pk=run.pk)

    assert evaluate_run(run, now=LATE) == []  # told once already: no grouped alert either

    old.refresh_from_db()
    assert old.state == "firing"
    assert list(Alert.objects.filter(run=run).values_list("dedup_key", flat=True)) == [
        "legacy:restart_replay:1"]
