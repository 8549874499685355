"""The fleet's order in SQL (dashboard.fleet_order) is the core's: over a few hundred varied runs
(ties, ended runs, runs without an analysis, a limit of 0, commits ahead of now, drills, resolved
and info alerts) the pages of the fleet list the runs exactly as ``sorted(..., key=attention_key)``
does, and the "needs attention" view holds exactly what ``needs_attention`` holds."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.utils import timezone

from recoverydash.alerts.models import Alert
from recoverydash.dashboard import queries
from recoverydash.recovery.attention import at_risk_ratio, attention_key, needs_attention
from recoverydash.recovery.contract import DEFAULT_CONTRACT
from recoverydash.recovery.figures import seconds_since_last_restorable
from recoverydash.runs.models import Analysis, Run

pytestmark = pytest.mark.django_db

LIMITS = (None, 0, 0.0, 600, 600, 3600, 1.5, "soon")    # "soon": not a number, the default's
AGES = (0, 30, 600, 600, 900, 1800, 3600, 7200, -120)   # seconds before now (-: in the future)


def build(project, n: int, seed: int, now):
    """``n`` runs with random contracts, analyses and alerts; returns what the core needs of
    each at ``now``: ``{run_id: (critical, warning, ratio, health, drill)}``."""
    rng = random.Random(seed)
    expected = {}
    for i in range(n):
        limit = rng.choice(LIMITS)
        contract = {} if limit is None else {"max_checkpoint_age_s": limit}
        first = now - timedelta(seconds=rng.choice((3600, 7200, 86400)))
        drill = rng.random() < 0.1
        run = Run.objects.create(project=project, run_id=f"r{i:04d}", contract=contract,
                                 first_event_at=first, last_received_at=now, is_drill=drill)
        health, ratio = "unknown", 0.0
        if rng.random() < 0.85:
            health = rng.choice(("ok", "ok", "at_risk", "failing", "ended", "ended"))
            result = {"health": health}
            if rng.random() < 0.8:
                committed = now - timedelta(seconds=rng.choice(AGES))
                result["last_restorable"] = {"generation_id": "g", "update": 1,
                                             "committed_at": committed.isoformat()}
            if rng.random() < 0.5:
                result["first_event_at"] = first.isoformat()
            if health == "ended" or rng.random() < 0.1:   # an end, perhaps with another word
                result["ended_at"] = (now - timedelta(seconds=rng.choice(AGES))).isoformat()
            Analysis.objects.create(run=run, health=health, result=result)
            limit_s = float(limit) if isinstance(limit, (int, float)) else \
                float(DEFAULT_CONTRACT["max_checkpoint_age_s"])
            seconds = seconds_since_last_restorable(result, now.timestamp(), run.first_event_at)
            ratio = at_risk_ratio(seconds, limit_s, ended=health == "ended")
        counts = {"critical": 0, "warning": 0}
        for k in range(rng.choice((0, 0, 0, 1, 2, 3))):
            severity = rng.choice(("critical", "warning", "warning", "info"))
            state = rng.choice(("firing", "firing", "acknowledged", "resolved"))
            Alert.objects.create(run=run, rule=f"rule{k}", dedup_key=f"{run.run_id}:rule{k}:",
                                 severity=severity, state=state, summary="x")
            if state != "resolved" and severity in counts:
                counts[severity] += 1
        expected[run.run_id] = (counts["critical"], counts["warning"], ratio, health, drill)
    return expected


def listed(user, **kwargs) -> list:
    """(run_id, ratio) of every row of every page of the fleet."""
    first = queries.fleet(user, **kwargs)
    names = []
    for page in range(1, first.pages + 1):
        names += [(r.run.run_id, r.ratio) for r in queries.fleet(user, page=page, **kwargs).rows]
    assert len(names) == first.total
    return names


@pytest.mark.parametrize("seed", [1, 2])
def test_it_orders_the_fleet_in_sql_exactly_as_the_core_key(owner, project, seed):
    now = timezone.now()
    expected = build(project, 300, seed, now)

    def key(run_id):
        crit, warn, ratio, health, drill = expected[run_id]
        return attention_key(critical=crit, warning=warn, ratio=ratio, health=health,
                             drill=drill) + (run_id,)

    got = listed(owner, now=now, view="all")
    assert [name for name, _ in got] == sorted(expected, key=key)
    # the ratio shown is the core's figure for that run
    assert all(ratio == expected[name][2] for name, ratio in got)
    assert [name for name, _ in listed(owner, now=now, view="all", sort="-attention")] == \
        sorted(expected, key=key, reverse=True)
    attention = [name for name in sorted(expected, key=key)
                 if needs_attention(critical=expected[name][0], warning=expected[name][1],
                                    ratio=expected[name][2], health=expected[name][3],
                                    drill=expected[name][4])]
    assert [name for name, _ in listed(owner, now=now)] == attention
    assert [name for name, _ in listed(owner, now=now, view="all", sort="age")] == \
        sorted(expected, key=lambda n: (-expected[n][2], n))
    unknown = listed(owner, now=now, view="all", health="unknown", sort="run")
    assert [name for name, _ in unknown] == sorted(n for n in expected
                                                   if expected[n][3] == "unknown")


def test_it_keeps_the_order_columns_with_the_contract_and_the_analysis(project):
    run = Run.objects.create(project=project, run_id="r", contract={"max_checkpoint_age_s": 5})
    assert Run.objects.get(pk=run.pk).max_checkpoint_age_s == 5.0
    run.contract = {"max_checkpoint_age_s": "x"}
    run.save(update_fields=["contract"])
    assert Run.objects.get(pk=run.pk).max_checkpoint_age_s is None
    analysis = Analysis.objects.create(run=run, result={
        "first_event_at": 100.0, "last_restorable": {"committed_at": 250.5}, "ended_at": None})
    assert (Analysis.objects.get(pk=analysis.pk).clock_since_s,
            Analysis.objects.get(pk=analysis.pk).clock_ended_s) == (250.5, None)
    analysis.result = {"first_event_at": 100.0, "last_restorable": None, "ended_at": 300.0}
    analysis.save(update_fields=["result"])
    stored = Analysis.objects.get(pk=analysis.pk)
    assert (stored.clock_since_s, stored.clock_ended_s) == (100.0, 300.0)
