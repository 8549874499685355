"""``GET /metrics``: the values are the core's numbers (scenario s2 through ingest and the eager
worker path), the series stay bounded with 10,000 runs, a token sees only its project, and the
service's own figures (ingest answers, analysis lag, verification queue, deliveries)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from recoverydash.alerts.models import Alert, AlertFlip, Delivery, WebhookEndpoint
from recoverydash.metrics import collector
from recoverydash.metrics.collector import METRICS
from recoverydash.recovery.figures import seconds_since_last_restorable
from recoverydash.runs.models import Analysis, ApiToken, CheckpointObject, Generation, Run

from .conftest import scrape

S2 = "s2_resume_at_read_cursor_omission"


def post(client, token, events, batch=500):
    for i in range(0, len(events), batch):
        response = client.post("/api/v1/events", data=json.dumps({"events": events[i:i + batch]}),
                               content_type="application/json",
                               HTTP_AUTHORIZATION=f"Bearer {token}")
        assert response.status_code == 202, response.content


@pytest.fixture
def s2_run(client, full_token, scenario_loader, tmp_path, settings):
    """Scenario s2 posted through the API, analysed by the worker's code path (eager tasks)."""
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.RECOVERYDASH_RATE_LIMIT_PER_SECOND = 0
    events, _ = scenario_loader(S2, str(tmp_path))
    post(client, full_token, events)
    return Run.objects.select_related("analysis", "project").get(run_id=events[0]["run_id"])


@pytest.mark.django_db(transaction=True)
def test_it_exports_the_cores_numbers_for_scenario_s2(client, s2_run, metrics_token, full_token,
                                                       monkeypatch):
    now = timezone.now() + timedelta(hours=3)
    monkeypatch.setattr(collector.timezone, "now", lambda: now)
    page = scrape(client, metrics_token)
    run = {"project": "alpha", "run_id": s2_run.run_id}
    result = s2_run.analysis.result
    recovery = client.get(f"/api/v1/runs/{s2_run.run_id}/recovery",
                          HTTP_AUTHORIZATION=f"Bearer {full_token}").json()
    last = result["restarts"][-1]

    # The core's figure at the scrape's instant, and the stored core output for the rest.
    assert page.value("recoverydash_run_seconds_since_last_restorable", **run) == \
        seconds_since_last_restorable(result, now, s2_run.first_event_at)
    assert page.value("recoverydash_run_updates_at_risk", **run) == result["updates_at_risk"] \
        == recovery["updates_at_risk"]
    assert page.value("recoverydash_run_last_restart_attempt", **run) == last["attempt"] == 1
    assert page.value("recoverydash_run_last_restart_replayed", **run) == last["replayed"] == 0
    assert page.value("recoverydash_run_last_restart_omitted", **run) == last["omitted"] == 48
    assert page.value("recoverydash_run_last_restart_recomputed", **run) == last["recomputed"]
    assert page.value("recoverydash_run_last_restart_verdict", verdict="omission", **run) == 1
    assert page.value("recoverydash_run_last_restart_verdict", verdict="exact", **run) == 0
    assert page.value("recoverydash_run_restarts", **run) == len(result["restarts"]) == 1
    [stratum] = result["strata"]
    assert page.value("recoverydash_run_stratum_omission_rate", stratum="main", **run) == \
        stratum["omission_rate"] == recovery["strata"][0]["omission_rate"] > 0
    assert page.value("recoverydash_run_stratum_duplicate_rate", stratum="main", **run) == \
        stratum["duplicate_rate"] == 0
    if result["costs"].get("goodput") is None:
        assert "recoverydash_run_goodput" not in page.samples
    else:
        assert page.value("recoverydash_run_goodput", **run) == result["costs"]["goodput"]
    assert page.value("recoverydash_run_health", health=result["health"], **run) == 1
    assert sum(page.value("recoverydash_run_health", health=h, **run)
               for h in collector.HEALTHS) == 1
    opened = {a.severity for a in Alert.objects.filter(run=s2_run).exclude(state="resolved")}
    assert page.value("recoverydash_run_alerts_open", severity="critical", **run) == \
        Alert.objects.filter(run=s2_run, severity="critical").exclude(state="resolved").count() \
        >= 1 and "critical" in opened  # restart_omission
    assert page.value("recoverydash_run_contract_max_checkpoint_age_seconds", **run) == 3600
    assert page.value("recoverydash_run_contract_max_omission_samples", **run) == 0
    assert page.value("recoverydash_run_analysis_pending", **run) == 0
    assert page.value("recoverydash_metrics_runs_eligible") == 1
    assert page.value("recoverydash_metrics_runs_exported") == 1
    # The ingest answers of the scenario's batches, counted by the middleware.
    batches = -(-len(list(s2_run.events.all())) // 500)
    assert page.value("recoverydash_ingest_requests_total", project="alpha", status="202") \
        >= batches
    assert page.value("recoverydash_ingest_events_total", project="alpha",
                      outcome="accepted") >= s2_run.event_count
    # Every family is declared with its type.
    for name, spec in METRICS.items():
        assert page.families.get(name) == spec.kind, name


@pytest.mark.django_db
def test_it_bounds_the_series_with_10000_runs(client, project, metrics_token, settings):
    settings.RECOVERYDASH_METRICS_MAX_RUNS = 100
    settings.RECOVERYDASH_METRICS_ENDED_WINDOW_S = 3600
    now = timezone.now()
    result = {"health": "ok", "updates_at_risk": 7, "first_event_at": "2026-01-01T00:00:00Z",
              "ended_at": None, "last_restorable": {"generation_id": "g1", "update": 10,
                                                    "committed_at": "2026-01-01T01:00:00Z"},
              "restarts": [{"attempt": 1, "replayed": 0, "omitted": 0, "recomputed": 3,
                            "verdict": "exact"}],
              "strata": [{"stratum": f"s{i}", "consumed": 100 - i, "duplicates": 0,
                          "omissions": 0, "duplicate_rate": 0.0, "omission_rate": 0.0}
                         for i in range(30)],
              "costs": {"goodput": 0.9}, "charts": {"big": list(range(100))}}
    runs = Run.objects.bulk_create(
        Run(project=project, run_id=f"run-{i:05d}", ingest_seq=1,
            last_received_at=now - timedelta(seconds=i)) for i in range(10_000))
    ended = {**result, "health": "ended", "ended_at": "2026-01-01T02:00:00Z"}
    Analysis.objects.bulk_create(
        Analysis(run=r, ingest_seq=1, health="ended" if i % 2 else "ok",
                 result=ended if i % 2 else result)
        for i, r in enumerate(runs))
    # The ended runs among the newest 100 ended long ago by the server's clock: not eligible.
    Run.objects.filter(pk__in=[r.pk for i, r in enumerate(runs) if i % 2]).update(
        last_received_at=now - timedelta(days=2))
    page = scrape(client, metrics_token)
    exported = page.label_values("recoverydash_run_updates_at_risk", "run_id")
    assert len(exported) == 100
    assert exported == {f"run-{i:05d}" for i in range(0, 200, 2)}  # newest live runs
    assert page.value("recoverydash_metrics_runs_eligible") == 5000
    assert page.value("recoverydash_metrics_runs_exported") == 100
    for name in page.samples:
        if name.startswith("recoverydash_run_"):
            assert page.label_values(name, "run_id") <= exported
    # 20 strata of 30 per run, and a fixed number of series per run besides.
    assert len(page.samples["recoverydash_run_stratum_omission_rate"]) == 100 * 20
    per_run = sum(len(v) for k, v in page.samples.items() if k.startswith("recoverydash_run_"))
    assert per_run == 100 * (1 + 1 + 4 + 1 + 1 + 3 + 5 + 2 * 20 + 1 + 3 + 3 + 1)
    assert page.series() < per_run + 50


@pytest.mark.django_db
def test_it_answers_only_with_a_metrics_token_or_the_operators_password(client, project,
                                                                        other_project,
                                                                        metrics_token,
                                                                        full_token, settings):
    Analysis.objects.create(run=Run.objects.create(project=project, run_id="mine"),
                            result={"health": "ok"})
    Analysis.objects.create(run=Run.objects.create(project=other_project, run_id="theirs"),
                            result={"health": "ok"})
    missing = scrape(client, status=401)
    assert "Basic" in missing["WWW-Authenticate"] and "Bearer" in missing["WWW-Authenticate"]
    assert missing.json()["error"] == "unauthorized"
    assert scrape(client, full_token, status=403).json()["error"] == "forbidden"
    assert scrape(client, basic=("ops", "x" * 16), status=401)  # no operator credentials set
    page = scrape(client, metrics_token)
    assert page.label_values("recoverydash_run_restarts", "run_id") == {"mine"}
    assert page.label_values("recoverydash_analysis_lag_seconds", "project") == {"alpha"}
    settings.RECOVERYDASH_METRICS_USERNAME, settings.RECOVERYDASH_METRICS_PASSWORD = \
        "ops", "a long operator passphrase"
    assert scrape(client, basic=("ops", "wrong passphrase!!"), status=401)
    everything = scrape(client, basic=("ops", "a long operator passphrase"))
    assert everything.label_values("recoverydash_run_restarts", "run_id") == {"mine", "theirs"}
    assert everything.label_values("recoverydash_analysis_lag_seconds", "project") == \
        {"alpha", "beta"}


@pytest.mark.django_db
def test_it_counts_ingest_answers_by_project_and_status(client, project, ingest_token,
                                                        metrics_token, other_token):
    def count(page, status, name="alpha"):
        return page.value("recoverydash_ingest_requests_total", project=name,
                          status=status) or 0

    before = scrape(client, metrics_token)
    event = {"event_id": "e1", "type": "heartbeat", "run_id": "r", "attempt": 0,
             "time": "2026-11-29T08:00:00Z", "update": 0}
    for body, token in ((json.dumps({"events": [event]}), ingest_token),
                        (json.dumps({"events": [event]}), ingest_token),
                        ("not json", ingest_token),
                        (json.dumps({"events": [event]}), "rdt_unknown"),
                        (json.dumps({"events": [event]}), other_token)):
        client.post("/api/v1/events", data=body, content_type="application/json",
                    HTTP_AUTHORIZATION=f"Bearer {token}")
    after = scrape(client, metrics_token)
    assert count(after, "202") - count(before, "202") == 2
    assert count(after, "400") - count(before, "400") == 1
    accepted = ("recoverydash_ingest_events_total", {"project": "alpha", "outcome": "accepted"})
    duplicate = ("recoverydash_ingest_events_total", {"project": "alpha", "outcome": "duplicate"})
    assert (after.value(accepted[0], **accepted[1]) or 0) - \
        (before.value(accepted[0], **accepted[1]) or 0) == 1
    assert (after.value(duplicate[0], **duplicate[1]) or 0) - \
        (before.value(duplicate[0], **duplicate[1]) or 0) == 1
    # Another project's answers and unauthenticated ones are not this token's to see.
    assert after.label_values("recoverydash_ingest_requests_total", "project") == {"alpha"}


@pytest.mark.django_db
def test_it_reports_analysis_lag_verification_queue_and_delivery_failures(client, project,
                                                                          metrics_token,
                                                                          monkeypatch):
    now = timezone.now()
    monkeypatch.setattr(collector.timezone, "now", lambda: now)
    queued = Run.objects.create(project=project, run_id="queued", ingest_seq=5,
                                analysis_queued_at=now - timedelta(seconds=90),
                                last_received_at=now - timedelta(seconds=10))
    Analysis.objects.create(run=queued, ingest_seq=3, result={"health": "ok"})
    Run.objects.create(project=project, run_id="unmarked", ingest_seq=2,
                       last_received_at=now - timedelta(seconds=40))  # never analysed
    failed = Run.objects.create(project=project, run_id="refused", ingest_seq=4,
                                last_received_at=now - timedelta(hours=5))
    Analysis.objects.create(run=failed, ingest_seq=1, error="ValueError", error_seq=4,
                            result={"health": "ok"})
    generation = Generation.objects.create(run=queued, generation_id="g1", update=1)
    for i, status in enumerate(("pending", "error", "ok", "pending")):
        CheckpointObject.objects.create(generation=generation, uri=f"file:///c/{i}",
                                        in_manifest=i != 3, check_status=status)
    endpoint = WebhookEndpoint.objects.create(project=project, url="https://a.example/",
                                              kind="slack")
    WebhookEndpoint.objects.create(project=project, url="https://b.example/", enabled=False)
    alert = Alert.objects.create(run=queued, rule="run_silent", dedup_key="queued:run_silent:",
                                 severity="warning", summary="s")
    for status in ("failed", "failed", "pending", "delivered"):
        flip = AlertFlip.objects.create(alert=alert, new_state="firing")
        Delivery.objects.create(flip=flip, endpoint=endpoint, payload={}, status=status)
    page = scrape(client, metrics_token)
    assert page.value("recoverydash_analysis_lag_seconds", project="alpha") == 90.0
    assert page.value("recoverydash_analysis_pending_runs", project="alpha") == 2
    assert page.value("recoverydash_analysis_failed_runs", project="alpha") == 1
    assert page.value("recoverydash_verification_queue_depth", project="alpha") == 2
    assert page.value("recoverydash_webhook_deliveries_failed_total", project="alpha",
                      kind="slack") == 2
    assert page.value("recoverydash_webhook_deliveries_failed_total", project="alpha",
                      kind="standard") == 0
    assert page.value("recoverydash_webhook_deliveries_pending", project="alpha",
                      kind="slack") == 1
    assert page.value("recoverydash_webhook_endpoints_disabled", project="alpha") == 1
    # The queued run's mark goes: its lag counts from its newest event, the unmarked run's too.
    Run.objects.filter(pk=queued.pk).update(analysis_queued_at=None)
    assert scrape(client, metrics_token).value("recoverydash_analysis_lag_seconds",
                                               project="alpha") == 40.0
    assert ApiToken.objects.filter(project=project, scopes=["metrics"]).exists()


@pytest.mark.django_db
def test_it_counts_flaps_per_rule_of_the_tokens_project(client, project, other_project,
                                                       metrics_token):
    def alert(p, run_id, rule, flaps, state="resolved"):
        run = Run.objects.get_or_create(project=p, run_id=run_id)[0]
        return Alert.objects.create(run=run, rule=rule, dedup_key=f"{run_id}:{rule}:",
                                    severity="warning", summary="s", flaps=flaps, state=state)

    alert(project, "a", "generation_rejected", 2)
    alert(project, "b", "generation_rejected", 1)
    alert(project, "b", "no_restorable_generation", 1, state="firing")
    alert(project, "b", "checkpoint_stale", 0)
    alert(other_project, "c", "generation_rejected", 7)  # not this token's project
    page = scrape(client, metrics_token)
    assert page.value("recoverydash_alert_flaps_total", project="alpha",
                      rule="generation_rejected") == 3
    assert page.value("recoverydash_alert_flaps_total", project="alpha",
                      rule="no_restorable_generation") == 1
    # every rule is exported, 0 when it never flapped; no series of another project
    assert page.value("recoverydash_alert_flaps_total", project="alpha",
                      rule="checkpoint_stale") == 0
    assert page.value("recoverydash_alert_flaps_total", project="beta",
                      rule="generation_rejected") is None
