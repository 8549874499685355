"""Dashboard fixtures: an owner and a teammate of ``project``, an outsider (member of
``other_project`` only), and ``known_run``: the omission restart of scenario s2
(docs/definitions.md#worked-example) written straight into the tables with a stored analysis whose
every figure the tests know."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest

T0 = datetime(2026, 11, 1, 0, 0, 5, tzinfo=timezone.utc)
COMMIT = datetime(2026, 11, 1, 0, 21, 1, tzinfo=timezone.utc)
PASSWORD = "correct horse battery"


def _user(username, project=None, **extra):
    from django.contrib.auth import get_user_model

    from recoverydash.runs.models import Membership

    user = get_user_model().objects.create_user(username, password=PASSWORD, **extra)
    if project is not None:
        Membership.objects.create(project=project, user=user)
    return user


@pytest.fixture
def owner(project):
    return _user("olivia", project)


@pytest.fixture
def teammate(project):
    return _user("tariq", project)


@pytest.fixture
def outsider(other_project):
    return _user("oscar", other_project)


@pytest.fixture
def admin_user(db):
    return _user("root", None, is_superuser=True, is_staff=True)


def known_result() -> dict:
    """A stored analysis (docs/ingest-v1.md#recovery shape plus costs) of scenario s2: resume at
    80,048 instead of 80,000, 48 positions omitted."""
    return {
        "run_id": "s2-omission",
        "health": "failing",
        "last_restorable": {"generation_id": "g1250", "update": 1250,
                            "committed_at": COMMIT.isoformat()},
        "updates_at_risk": 10,
        "generations": [{"generation_id": "g1250", "attempt": 0, "update": 1250,
                         "status": "restorable", "reasons": []},
                        {"generation_id": "g1255", "attempt": 1, "update": 1255,
                         "status": "rejected",
                         "reasons": [{"code": "shard_missing", "detail": "rank7 never written"}]}],
        "restarts": [{
            "attempt": 1, "resumed_from": "g1250", "resumed_update": 1250,
            "world_size_before": 8, "world_size_after": 8,
            "expected_cursor": [{"stratum": "main", "epoch": 0, "position": 80000}],
            "resume_cursor": [{"stratum": "main", "epoch": 0, "position": 80048}],
            "replayed": 0, "omitted": 48, "recomputed": 0, "lost_updates": 0,
            "lost_seconds": 5.0, "recovery_seconds": 70.0, "verdict": "omission",
            "findings": [{"code": "omission",
                          "detail": "48 positions between 80,000 and 80,048 never consumed"}],
        }],
        "strata": [{"stratum": "main", "consumed": 80640, "duplicates": 0, "omissions": 48,
                    "duplicate_rate": 0.0, "omission_rate": 48 / (48 + 80640)}],
        "costs": {"goodput": 0.9375, "mtbf_s": 1261.0, "save_cost_s": 5.0,
                  "young_interval_s": 112.29, "observed_interval_s": 1256.0},
    }


@pytest.fixture
def known_run(project):
    """The run, two attempts, generations g1250 (restorable, 40 objects verified) and g1255
    (rejected), a little ledger, audit windows around the restart, a firing restart_omission
    alert and the stored analysis of ``known_result``."""
    from recoverydash.alerts.models import Alert
    from recoverydash.runs.models import (Analysis, Attempt, AuditWindow, CheckpointObject,
                                          Generation, Heartbeat, LedgerRow, Run, ShardReport)

    now = datetime.now(timezone.utc)
    run = Run.objects.create(project=project, run_id="s2-omission", first_event_at=T0,
                             last_event_at=now - timedelta(seconds=30),
                             last_received_at=now - timedelta(seconds=30), ingest_seq=7,
                             contract={"max_checkpoint_age_s": 3600})
    Attempt.objects.create(run=run, attempt=0, started_at=T0, world_size=8,
                           dataset_version="ds-v1", global_batch_size=64,
                           ended_at=COMMIT + timedelta(seconds=5), end_reason="failed",
                           end_update=1250, last_update=1250,
                           fetched=[{"stratum": "main", "epoch": 0, "position": 80048}])
    Attempt.objects.create(run=run, attempt=1, started_at=COMMIT + timedelta(seconds=70),
                           world_size=8, dataset_version="ds-v1", global_batch_size=64,
                           resumed_from={"generation_id": "g1250", "update": 1250,
                                         "cursor": [{"stratum": "main", "epoch": 0,
                                                     "position": 80048}]},
                           last_update=1260, restore_generation_id="g1250",
                           restored_at=COMMIT + timedelta(seconds=72))
    shards = [f"rank{r}" for r in range(8)]
    components = ["model", "optimizer", "scheduler", "rng", "data_progress"]
    manifest = {"schema_revision": 1, "generation_id": "g1250", "update": 1250, "world_size": 8,
                "required_shards": shards, "components": components, "objects": [],
                "data_progress": {"cursor": [{"stratum": "main", "epoch": 0, "position": 80000}]},
                "dataset_version": "ds-v1", "committed_at": COMMIT.isoformat()}
    g = Generation.objects.create(run=run, generation_id="g1250", attempt=0, update=1250,
                                  started_at=COMMIT - timedelta(seconds=5),
                                  required_shards=shards, components=components,
                                  committed_at=COMMIT, manifest=manifest, status="restorable",
                                  verified_at=COMMIT + timedelta(seconds=2))
    for s in shards:
        ShardReport.objects.create(generation=g, shard=s, update=1250, reported_at=COMMIT)
        for c in components:
            CheckpointObject.objects.create(
                generation=g, uri=f"file:///ckpt/g1250/{s}/{c}", shard=s, component=c,
                size=4096, in_manifest=True, check_status="ok", observed_size=4096,
                checked_at=COMMIT + timedelta(seconds=2))
    bad = Generation.objects.create(
        run=run, generation_id="g1255", attempt=1, update=1255, required_shards=shards,
        components=components, committed_at=COMMIT + timedelta(seconds=120), status="rejected",
        reasons=[{"code": "shard_missing", "detail": "rank7 never written"}],
        manifest=dict(manifest, generation_id="g1255", update=1255))
    CheckpointObject.objects.create(generation=bad, uri="file:///ckpt/g1255/rank7/model",
                                    shard="rank7", component="model", size=4096,
                                    check_status="object_missing", check_detail="no such file",
                                    checked_at=COMMIT + timedelta(seconds=121))
    for update in range(1245, 1251):
        for rank in range(8):
            start = (update - 1) * 64
            LedgerRow.objects.create(run=run, attempt=0, update=update, rank=rank,
                                     time=COMMIT - timedelta(seconds=(1250 - update)),
                                     spans=[{"stratum": "main", "epoch": 0,
                                             "ranges": [[start + rank, start + 64, 8]]}])
    Heartbeat.objects.create(run=run, attempt=0, time=COMMIT + timedelta(seconds=3), update=1250,
                             fetched=[{"stratum": "main", "epoch": 0, "position": 80048}])
    for attempt, update in ((0, 1249), (0, 1250), (1, 1251), (1, 1252)):
        for rank in range(2):
            for slot in range(2):
                base = (update - 1) * 64 + (48 if attempt == 1 else 0)
                AuditWindow.objects.create(run=run, attempt=attempt, update=update, rank=rank,
                                           accum_slot=slot, time=COMMIT,
                                           sample_ids=[f"s{base + slot * 16 + rank}",
                                                       f"s{base + slot * 16 + rank + 8}"])
    Analysis.objects.create(run=run, computed_at=now - timedelta(seconds=20), ingest_seq=7,
                            health="failing", result=known_result())
    Alert.objects.create(run=run, rule="restart_omission", subject="1",
                         dedup_key="s2-omission:restart_omission:1", severity="critical",
                         summary="Attempt 1 skipped 48 positions that were never trained on "
                                 "(contract allows 0).")
    return run


@pytest.fixture
def owner_client(client, owner):
    client.force_login(owner)
    return client


def without_definition_links(html: str) -> str:
    """A page's HTML without the "?" links to docs/definitions.md beside its figures, so that
    tests can read a sentence as people do."""
    return re.sub(r'<a class="def" [^>]*>\?</a>', "", html)


def analyse(run):
    """Analyse a run the way the workers do, synchronously: verify every generation's objects in
    storage (``storage.verification.verify_generation``), then ``alerts.evaluation.analyze_and_alert``
    (the recovery core, the stored Analysis and generation statuses, the alert rules)."""
    from recoverydash.alerts.evaluation import analyze_and_alert
    from recoverydash.runs.models import Generation, Run
    from recoverydash.storage.verification import verify_generation

    for pk in Generation.objects.filter(run=run).values_list("pk", flat=True):
        verify_generation(pk)
    analyze_and_alert(run.pk)
    return Run.objects.get(pk=run.pk)


def post_scenario(client, token, loader, name, objects_dir):
    """Post a worked scenario's events through the real ingest API and analyse the run."""
    import json

    from recoverydash.runs.models import Run

    events, expect = loader(name, str(objects_dir))
    response = client.post("/api/v1/events", data=json.dumps({"events": events}),
                           content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 202, response.content
    run = Run.objects.get(run_id=events[0]["run_id"])
    return analyse(run), expect


@pytest.fixture
def s2_run(client, full_token, scenario_loader, tmp_path, project):
    """Scenario s2 (the worked example, resume at 80,048: 48 positions omitted), ingested and
    analysed."""
    run, _ = post_scenario(client, full_token, scenario_loader,
                           "s2_resume_at_read_cursor_omission", tmp_path)
    return run
