"""The worked scenarios of tests/scenarios/ posted through the real ingest API reach their
``expect`` through ``/recovery`` and ``/restore-plan``, with objects verified from files (tasks run
eagerly here; ``test_worker_process.py`` runs the same path through a real Celery worker and
Redis)."""

from __future__ import annotations

import json

import pytest
from scenarios import NAMES as SCENARIOS


def post_events(client, token, events, batch=500):
    for i in range(0, len(events), batch):
        response = client.post("/api/v1/events", data=json.dumps({"events": events[i:i + batch]}),
                               content_type="application/json",
                               HTTP_AUTHORIZATION=f"Bearer {token}")
        assert response.status_code == 202, response.content


def check_expect(recovery: dict, plan_status: int, plan: dict, expect: dict) -> None:
    """Assert every key of a scenario's ``expect`` (see tests/scenarios/README.md)."""
    generations = {g["generation_id"]: g for g in recovery["generations"]}
    for gid, want in expect.get("generations", {}).items():
        got = generations[gid]
        if "status" in want:
            assert got["status"] == want["status"], (gid, got)
        if "status_in" in want:
            assert got["status"] in want["status_in"], (gid, got)
        if "reason_any" in want:
            codes = {r["code"] for r in got["reasons"]}
            assert codes & set(want["reason_any"]), (gid, got)
    if "last_restorable" in expect:
        last = recovery["last_restorable"]
        assert (last and last["generation_id"]) == expect["last_restorable"]
    if "restore_plan" in expect:
        if expect["restore_plan"] is None:
            assert plan_status == 409 and plan["error"] == "no_restorable_generation"
        else:
            assert plan_status == 200 and plan["generation_id"] == expect["restore_plan"]
    restarts = {str(r["attempt"]): r for r in recovery["restarts"]}
    for attempt, want in expect.get("restarts", {}).items():
        got = restarts[attempt]
        for field, value in want.items():
            if field == "findings_include":
                assert set(value) <= {f["code"] for f in got["findings"]}, got
            else:
                assert got[field] == value, (attempt, field, got)
    strata = {s["stratum"]: s for s in recovery["strata"]}
    for name, want in expect.get("strata", {}).items():
        for field, value in want.items():
            assert strata[name][field] == value, (name, field, strata[name])
    open_rules = {a["rule"] for a in recovery["alerts"] if a["state"] != "resolved"}
    assert set(expect.get("alerts_include", [])) <= open_rules, open_rules
    assert not set(expect.get("alerts_exclude", [])) & open_rules, open_rules


def read(client, token, run_id):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    recovery = client.get(f"/api/v1/runs/{run_id}/recovery", **auth)
    assert recovery.status_code == 200, recovery.content
    plan = client.get(f"/api/v1/runs/{run_id}/restore-plan", **auth)
    assert plan.status_code in (200, 409), plan.content
    return recovery.json(), plan.status_code, plan.json()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", SCENARIOS)
def test_it_reaches_the_scenario_verdicts_through_the_api(name, client, full_token, project,
                                                          scenario_loader, tmp_path, settings,
                                                          declare_location):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.RECOVERYDASH_RATE_LIMIT_PER_SECOND = 0
    declare_location(project, tmp_path)
    events, expect = scenario_loader(name, str(tmp_path))
    post_events(client, full_token, events)
    recovery, plan_status, plan = read(client, full_token, events[0]["run_id"])
    assert recovery["pending_analysis"] is False
    check_expect(recovery, plan_status, plan, expect)


@pytest.mark.django_db
def test_it_refreshes_an_old_analysis_before_evaluating_time_based_alerts(project, settings):
    """A run whose events stopped still turns stale: the periodic evaluation re-analyses it."""
    from datetime import timedelta

    from django.utils import timezone

    from recoverydash.alerts.evaluation import evaluate_all
    from recoverydash.alerts.models import Alert
    from recoverydash.ingest.actions import ingest_batch
    from recoverydash.runs.analysis import analyze
    from recoverydash.runs.models import Analysis, Run

    settings.CELERY_TASK_ALWAYS_EAGER = True
    start = (timezone.now() - timedelta(hours=2)).isoformat()
    ingest_batch(project, [{"event_id": "a0", "type": "attempt_started", "run_id": "quiet",
                            "attempt": 0, "time": start, "world_size": 1,
                            "dataset_version": "v1"}])
    run = Run.objects.get(run_id="quiet")
    analyze(run, now=(timezone.now() - timedelta(hours=2)).timestamp())
    Analysis.objects.filter(run=run).update(computed_at=timezone.now() - timedelta(hours=2))
    assert Analysis.objects.get(run=run).health == "ok"
    assert evaluate_all() == 1
    analysis = Analysis.objects.get(run=run)
    assert analysis.health == "failing"  # no restorable generation for 2 h > 1 h limit
    assert Alert.objects.filter(run=run, rule="checkpoint_stale", state="firing").exists()
