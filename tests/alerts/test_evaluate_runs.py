"""The alert evaluation of many runs together (alerts.rules.evaluate_runs, the beat's path for the
runs whose alerts change) and the deliveries of their flips made together
(alerts.delivery.process_flips) give exactly what evaluating each run alone and processing each
flip alone gives: the same alerts (state, severity, subjects, summaries), the same flips in the
same order and the same deliveries to the same endpoints with the same bodies, in a fixed
number of queries."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from seen_rows import set_ranks_seen

from recoverydash.alerts import delivery
from recoverydash.alerts.models import Alert, AlertFlip, Delivery, RuleRunbook, WebhookEndpoint
from recoverydash.alerts.rules import evaluate_run, evaluate_runs
from recoverydash.runs.models import Analysis, Attempt, Run
from tests.alerts.test_grouping import rejected
from tests.alerts.test_rules import T0, restart, result

pytestmark = pytest.mark.django_db

H = timedelta(hours=1)
STEP1, STEP2 = T0 + 2 * H, T0 + 2 * H + timedelta(minutes=7)


def make(project, run_id, res, *, seen=None, failures=None, attempts=1, health="ok"):
    run = Run.objects.create(project=project, run_id=run_id, first_event_at=T0,
                             last_received_at=STEP1, contract={"max_checkpoint_age_s": 3600})
    Analysis.objects.create(run=run, result=dict(res, health=health), health=health)
    for n in range(attempts):
        attempt = Attempt.objects.create(run=run, attempt=n, restore_failures=failures or [],
                                         restore_generation_id="g1" if failures else "")
        if seen is not None:  # every attempt reported; the newest one's rows are read
            set_ranks_seen(attempt, seen if n == attempts - 1 else {"0": T0})
    return run


def fleet(project, other):
    """Runs in every situation the rules know at STEP1, in two projects."""
    fresh = {"0": STEP1, "1": STEP1}
    committed = {"generation_id": "g9", "update": 90, "committed_at": (T0 + 1.9 * H).isoformat()}
    ok = result(last_restorable=committed)
    runs = [
        make(project, "rejects", result(last_restorable=committed,
                                        generations=rejected(20, 30)), seen=fresh),
        make(project, "replays", result(last_restorable=committed, restarts=[
            restart(attempt=1, replayed=10_000)]), seen=fresh, attempts=2),
        make(project, "stale", result(), seen=fresh),  # committed at T0: critical at 2 h
        make(project, "restore", ok, seen=fresh, failures=[
            {"generation_id": "g7", "reason": "missing_object", "message": "no shard 3"}]),
        make(project, "rank-gone", result(last_restorable=committed, update_interval={
            "attempt": 2, "median_s": 10.0}), attempts=3,
            seen={"0": STEP1, "1": STEP1 - timedelta(minutes=5), "2": STEP1 - H}),
        make(project, "legacy", ok, seen=fresh),
        make(project, "silenced", result(), seen=fresh),
        make(project, "ended", result(restarts=[restart(attempt=1, omitted=10_000)]),
             seen={"0": T0}, health="ended", attempts=2),
        make(project, "quiet", ok, seen=fresh),
        make(other, "rejects", result(generations=rejected(5)), seen={"0": T0}),
    ]
    Alert.objects.create(run=runs[5], rule="generation_rejected", subject="g9",
                         dedup_key="legacy:generation_rejected:g9", severity="warning",
                         summary="per subject, stored before alerts grouped", opened_at=T0,
                         last_seen_at=T0)
    for p, min_severity in ((project, "info"), (other, "critical")):
        WebhookEndpoint.objects.create(project=p, name="all", url="https://hooks.example/a",
                                       min_severity=min_severity)
    WebhookEndpoint.objects.create(project=project, name="critical", kind="slack",
                                   url="https://hooks.example/s", min_severity="critical")
    WebhookEndpoint.objects.create(project=project, name="off", url="https://hooks.example/o",
                                   enabled=False)
    RuleRunbook.objects.create(project=project, rule="generation_rejected",
                               url="https://wiki.example/rejected")
    return runs


def move(runs):
    """Between the two evaluations: subjects join and leave, conditions clear, a person
    acknowledges one alert and silences another."""
    by = {(r.project.name, r.run_id): r for r in runs}
    committed = {"generation_id": "g9", "update": 90, "committed_at": (T0 + 1.9 * H).isoformat()}
    Analysis.objects.filter(run=by["alpha", "rejects"]).update(result=result(
        last_restorable=committed, generations=rejected(20, 40, 50)))
    Analysis.objects.filter(run=by["alpha", "replays"]).update(result=result(
        last_restorable=committed, restarts=[restart(attempt=1, replayed=10_000),
                                             restart(attempt=2, replayed=20_000)]))
    Analysis.objects.filter(run=by["alpha", "stale"]).update(result=result(
        last_restorable=committed))
    set_ranks_seen(Attempt.objects.get(run=by["alpha", "rank-gone"], attempt=2),
                   {"0": STEP2, "1": STEP2, "2": STEP1 - H})
    Alert.objects.get(run=by["alpha", "replays"]).change_state("acknowledged", by="oncall")
    Alert.objects.filter(run=by["alpha", "silenced"]).update(
        silenced_until=timezone.now() + H)  # Alert.is_silenced reads the wall clock
    Analysis.objects.filter(run=by["alpha", "silenced"]).update(result=result(
        last_restorable=committed))


def world() -> tuple:
    """Every alert, flip and delivery, primary keys replaced by what they stand for (the two
    ways run in one database, so their keys differ) and wall-clock times by whether set."""
    key = {a.pk: (a.run.project.name, a.dedup_key, a.opened_at.isoformat())
           for a in Alert.objects.select_related("run__project")}

    def body(snapshot):
        snapshot = dict(snapshot or {})
        pk = int(snapshot.pop("id", "al_0")[3:] or 0)
        snapshot.pop("url", None)
        snapshot["resolved_at"] = bool(snapshot.get("resolved_at"))
        return key.get(pk), json.dumps(snapshot, sort_keys=True)

    alerts = sorted((key[a.pk], a.rule, a.subject, json.dumps(a.subjects, sort_keys=True),
                     a.severity, a.state, a.summary, a.last_seen_at, a.acknowledged_by,
                     a.resolved_by, a.resolved_at is not None)
                    for a in Alert.objects.all())
    flips = [(key[f.alert_id], f.old_state, f.new_state, f.reason,
              f.created_at if f.created_at in (STEP1, STEP2) else "wall clock",
              f.notify, f.processed_at is not None, f.change, body(f.snapshot))
             for f in AlertFlip.objects.order_by("pk")]
    index = {pk: i for i, pk in enumerate(AlertFlip.objects.order_by("pk")
                                          .values_list("pk", flat=True))}
    deliveries = []
    for d in Delivery.objects.select_related("endpoint").order_by("pk"):
        payload = dict(d.payload)
        payload["alert"] = body(payload["alert"])
        deliveries.append((index[d.flip_id], d.endpoint.project.name, d.endpoint.name,
                           d.status, json.dumps(payload, sort_keys=True)))
    return alerts, flips, deliveries


def one_by_one(runs, now):
    # each run evaluated alone; the flips processed as together does (the flips of one alert
    # are one notification: in STEP2 a person's acknowledgement and a subject added since)
    for run in sorted(runs, key=lambda r: r.pk):
        evaluate_run(Run.objects.select_related("analysis").get(pk=run.pk), now=now)
    delivery.process_flips()


def together(runs, now):
    evaluate_runs(list(Run.objects.select_related("analysis").filter(pk__in=[r.pk for r in runs])
                       .order_by("-pk")), now=now)  # the order given does not matter
    delivery.process_flips()


def test_many_runs_together_give_exactly_what_each_run_alone_gives(project, other_project):
    runs = fleet(project, other_project)
    expected = []
    with transaction.atomic():
        one_by_one(runs, STEP1)
        expected.append(world())
        move(runs)
        one_by_one(runs, STEP2)
        expected.append(world())
        transaction.set_rollback(True)
    together(runs, STEP1)
    first = world()
    assert first == expected[0]
    move(runs)
    together(runs, STEP2)
    assert world() == expected[1]

    alerts, flips, deliveries = first
    assert [(a[0][:2], a[4], a[5], [i["subject"] for i in json.loads(a[3])])
            for a in alerts] == [
        (("alpha", "ended:restart_omission:"), "critical", "firing", ["1"]),  # told, ended
        (("alpha", "legacy:generation_rejected:g9"), "warning", "resolved", []),
        (("alpha", "rank-gone:rank_silent:"), "warning", "firing", ["1", "2"]),
        (("alpha", "rejects:generation_rejected:"), "warning", "firing", ["g20", "g30"]),
        (("alpha", "replays:restart_replay:"), "critical", "firing", ["1"]),
        (("alpha", "restore:restore_failed:"), "warning", "firing", ["0:g7"]),
        (("alpha", "silenced:checkpoint_stale:"), "warning", "firing", [""]),
        (("alpha", "stale:checkpoint_stale:"), "warning", "firing", [""]),  # 2 h: not above
        (("beta", "rejects:checkpoint_stale:"), "warning", "firing", [""]),
        (("beta", "rejects:generation_rejected:"), "warning", "firing", ["g5"]),
        (("beta", "rejects:run_silent:"), "warning", "firing", [""])]
    # alpha's 8 flips to its info endpoint, its 2 critical ones to its slack endpoint too; the
    # disabled endpoint nothing, beta's critical-only endpoint nothing (all warnings)
    assert [(d[0], d[2]) for d in deliveries] == [
        (0, "all"), (1, "all"), (1, "critical"), (2, "all"), (3, "all"), (4, "all"),
        (5, "all"), (6, "all"), (7, "all"), (7, "critical")]
    alerts, flips, deliveries = expected[1]
    assert [(f[0][1], f[1], f[2], f[5], f[7]) for f in flips[len(first[1]):]] == [
        ("replays:restart_replay:", "firing", "acknowledged", True, None),  # by a person
        ("rejects:generation_rejected:", "firing", "firing", True,
         {"added": ["g40", "g50"], "removed": ["g30"]}),
        ("replays:restart_replay:", "acknowledged", "acknowledged", True,
         {"added": ["2"], "removed": []}),
        ("stale:checkpoint_stale:", "firing", "resolved", True, None),
        ("rank-gone:rank_silent:", "firing", "firing", True, {"added": [], "removed": ["1"]}),
        ("silenced:checkpoint_stale:", "firing", "resolved", False, None)]
    beta = {a[0][1]: a[4] for a in alerts if a[0][0] == "beta"}
    assert beta["rejects:checkpoint_stale:"] == "critical"  # 2 h 07 m: above twice the limit


def test_the_queries_do_not_grow_with_the_runs(project, other_project):
    runs = fleet(project, other_project)
    loaded = list(Run.objects.select_related("analysis").order_by("pk"))
    with CaptureQueriesContext(connection) as few:
        evaluate_runs(loaded[:2], now=STEP1)
    with CaptureQueriesContext(connection) as many:
        evaluate_runs(loaded[2:], now=STEP1)
    with CaptureQueriesContext(connection) as flips:
        delivery.process_flips()
    assert len(runs) == 10 and Delivery.objects.count() == 10
    # a savepoint, five reads, the writes (alerts kept: seen, words moved; opened; resolved;
    # flips), the release
    assert len(few) <= 12 and len(many) <= 12
    # the pending flips, a savepoint, the flips locked, runbooks, endpoints, the claim, the
    # deliveries
    assert len(flips) <= 8
