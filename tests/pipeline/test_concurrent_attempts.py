"""docs/definitions.md#concurrent-attempts outside the core: through ingest, the worker's
analysis and the stored result, a requeued duplicate launch that cancelled itself at once while
the original attempt keeps training and saving is not the live attempt for the silence rules,
the fleet's attempt state, the run page's time axis or the restore plan."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import pytest
from seen_rows import set_ranks_seen

from recoverydash.alerts.evaluation import clock_changes
from recoverydash.alerts.rules import evaluate_run, silence_of
from recoverydash.checkpoints.objects import ObjectCheck
from recoverydash.dashboard.charts import run_window
from recoverydash.dashboard.fleet_order import ATTEMPT_STATES, annotate_attempt_state
from recoverydash.dashboard.queries import _attempt_states
from recoverydash.ingest.actions import ingest_batch
from recoverydash.runs import analysis as bridge
from recoverydash.runs.live import live_attempts
from recoverydash.runs.models import Attempt, CheckpointObject, Generation, Run
from recoverydash.storage.verification import _store

pytestmark = pytest.mark.django_db

RUN = "dup"
T0 = datetime(2026, 11, 1, tzinfo=UTC)
COMPONENTS = ["model", "optimizer", "data_progress"]


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def update(u: int) -> dict:
    return {"event_id": f"u{u}", "type": "update_committed", "run_id": RUN, "attempt": 0,
            "time": at(10 * u), "update": u, "rank": 0,
            "spans": [{"stratum": "main", "epoch": 0, "ranges": [[4 * u - 4, 4 * u]]}]}


def commit(u: int) -> dict:
    gid = f"g{u}"
    objects = [{"uri": f"file:///ckpt/{gid}/{c}.pt", "shard": "rank0", "component": c,
                "size": 100 + u, "sha256": hashlib.sha256(f"{gid}/{c}".encode()).hexdigest()}
               for c in COMPONENTS]
    manifest = {"schema_revision": 1, "generation_id": gid, "update": u, "world_size": 1,
                "required_shards": ["rank0"], "components": COMPONENTS, "objects": objects,
                "dataset_version": "ds", "committed_at": at(10 * u + 5), "attempt": 0,
                "data_progress": {"cursor": [{"stratum": "main", "epoch": 0,
                                              "position": 4 * u}]}}
    return {"event_id": f"c{u}", "type": "checkpoint_committed", "run_id": RUN, "attempt": 0,
            "time": at(10 * u + 5), "manifest": manifest}


def started(attempt: int, s: float, resumed_from=None) -> dict:
    return {"event_id": f"s{attempt}", "type": "attempt_started", "run_id": RUN,
            "attempt": attempt, "time": at(s), "world_size": 1, "dataset_version": "ds",
            "global_batch_size": 4, "contract": {"required_components": COMPONENTS},
            "resumed_from": resumed_from}


@pytest.fixture
def duplicate(project, settings):
    """Attempt 0 commits updates 1..60 (update u at u x 10 s) and saves at 20, 40 and 60 (every
    object verified). A requeued duplicate, attempt 1, starts from g20 at 250 s and cancels
    itself at 251 s; attempt 0 goes on. Analysed at 610 s; the run is silent after 60 s."""
    settings.RECOVERYDASH_RUN_SILENT_S = 60.0
    cursor = [{"stratum": "main", "epoch": 0, "position": 80}]
    events = [started(0, 0)]
    for u in range(1, 61):
        events.append(update(u))
        if u % 20 == 0:
            events.append(commit(u))
    events += [started(1, 250, {"generation_id": "g20", "update": 20, "cursor": cursor}),
               {"event_id": "e1", "type": "attempt_ended", "run_id": RUN, "attempt": 1,
                "time": at(251), "reason": "cancelled", "update": 20}]
    assert ingest_batch(project, events).accepted
    run = Run.objects.get(run_id=RUN)
    for obj in CheckpointObject.objects.filter(generation__run=run, in_manifest=True):
        _store(obj, ObjectCheck("ok", "verified", obj.size, obj.sha256))
    bridge.analyze(run, now=(T0 + timedelta(seconds=610)).timestamp())
    # the server last heard attempt 1 at 251 s, attempt 0 a second ago
    set_ranks_seen(Attempt.objects.get(run=run, attempt=1), {"0": at(251)})
    set_ranks_seen(Attempt.objects.get(run=run, attempt=0), {"0": at(609)})
    Run.objects.filter(pk=run.pk).update(last_received_at=T0 + timedelta(seconds=609))
    return Run.objects.select_related("analysis").get(pk=run.pk)


def test_the_stored_analysis_names_the_original_attempt_live(duplicate):
    result = duplicate.analysis.result
    assert (result["live_attempt"], result["newest_attempt"], result["health"]) == (0, 1, "ok")
    assert duplicate.analysis.clock["live_attempt"] == 0
    assert result["last_restorable"]["generation_id"] == "g60"
    (restart,) = result["restarts"]
    codes = [f["code"] for f in restart["findings"]]
    assert "concurrent_attempts" in codes and "clock_skew" not in codes
    att0 = Attempt.objects.get(run=duplicate, attempt=0)
    assert live_attempts([duplicate.pk]) == {duplicate.pk: (att0.pk, 0, None)}


def test_a_cancelled_duplicate_never_makes_the_running_run_ended(duplicate):
    now = T0 + timedelta(seconds=610)
    item = [duplicate.pk] + [None] * 8 + [duplicate.last_received_at, None]
    assert _attempt_states([item], now) == {duplicate.pk: 0}
    assert item[10] == "running"
    (state,) = annotate_attempt_state(Run.objects.filter(pk=duplicate.pk), now, 60.0) \
        .values_list("f_attempt", flat=True)
    assert ATTEMPT_STATES[state] == "running"
    attempts = list(Attempt.objects.filter(run=duplicate).order_by("attempt"))
    assert run_window(duplicate, attempts, now, duplicate.analysis.result)[1] == now


def test_no_silence_alert_for_the_duplicates_end(duplicate):
    now = T0 + timedelta(seconds=610)
    assert silence_of(duplicate, now) == {"attempt": 0, "ended": False, "median": 10.0,
                                          "ages": {"0": 1.0}}
    rules = {f.alert.rule for f in evaluate_run(duplicate, now=now)}
    assert not rules & {"run_silent", "rank_silent"}
    changed, _holding, read = clock_changes([duplicate.pk], now)
    assert (changed, read) == ([], 1)
    # once attempt 0 too is quiet past the limit, it is attempt 0 that is silent
    later = now + timedelta(seconds=61)
    flips = [f for f in evaluate_run(duplicate, now=later) if f.alert.rule == "run_silent"]
    assert [f.alert.summary[:35] for f in flips] == ["No event from attempt 0 for 1m 02s "]


def test_the_restore_plan_stays_on_the_live_attempts_newest_restorable(duplicate):
    plan = bridge.plan_restore(duplicate)
    assert (plan.status_code, plan.body["generation_id"], plan.body["update"]) == (200, "g60", 60)
    assert plan.body["cursor"] == [{"stratum": "main", "epoch": 0, "position": 240}]
    assert Generation.objects.filter(run=duplicate, status="restorable").count() == 3
