"""Verify at the moment of the question, on moto's S3 server over HTTP (a location declared with
its own endpoint_url and keys): the restore plan re-checks the sizes (HEAD) of the generation it
is about to name, falls back to the previous restorable one when an object was replaced by a
short one after the run ended, flips the broken one and says so; the periodic re-check keeps
looking at ended runs and a change it finds raises ``generation_rejected``. The same behaviours
on files: test_restore_plan_recheck.py."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from recoverydash.alerts.models import Alert
from recoverydash.runs.models import Analysis, Generation
from recoverydash.storage import verification

from .conftest import generation, manifest, run_events
from .test_s3_tenants import CountingS3, put_generation

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def s3():
    server = CountingS3()
    yield server
    server.stop()


@pytest.fixture
def ended_s3_run(s3, project, declare_location, ingest):
    """Run ``r`` ended after generations g2 (update 2) and g4 (update 4) in
    ``s3://<bucket>/runs``, both restorable; returns (client, bucket, g2, g4)."""
    bucket = f"plan-{uuid.uuid4().hex[:8]}"
    client = s3.client("plan-key")
    client.create_bucket(Bucket=bucket)
    declare_location(project, f"s3://{bucket}/runs", endpoint_url=s3.endpoint,
                     access_key_id="plan-key", secret_access_key="secret")
    g2 = manifest("g2", 2, put_generation(client, bucket, "runs", "g2"))
    g4 = manifest("g4", 4, put_generation(client, bucket, "runs", "g4"))
    ingest(project, run_events("r", [g2, g4], updates=5))
    assert Analysis.objects.get(run__run_id="r").health == "ended"
    assert {g.generation_id: g.status for g in Generation.objects.all()} == \
        {"g2": "restorable", "g4": "restorable"}
    return client, bucket, g2, g4


def plan(client, token, run_id="r"):
    return client.get(f"/api/v1/runs/{run_id}/restore-plan",
                      HTTP_AUTHORIZATION=f"Bearer {token}")


def test_it_falls_back_on_s3_when_an_object_was_cut_short_after_the_run_ended(
        ended_s3_run, s3, client, full_token, settings):
    # moto runs in this process on a shared machine: a budget its HEADs always fit in (the
    # budget itself: test_restore_plan_recheck.py)
    settings.RECOVERYDASH_RESTORE_RECHECK_S = 60
    bucket_client, bucket, g2, g4 = ended_s3_run
    assert plan(client, full_token).json()["generation_id"] == "g4"
    key = "runs/g4/optimizer/__0_0.distcp"
    bucket_client.put_object(Bucket=bucket, Key=key, Body=b"\0" * 100)  # replaced, short
    s3.requests.clear()

    answer = plan(client, full_token)

    assert answer.status_code == 200
    assert answer.json() == {
        "generation_id": "g2", "update": 2, "logger_rewind_update": 2,
        "committed_at": "2026-11-01T00:01:02+00:00",
        "objects": [{k: o[k] for k in ("uri", "shard", "component", "size", "sha256")}
                    | {"update": None} for o in g2["objects"]],
        "cursor": [{"stratum": "main", "epoch": 0, "position": 8}],
        "warnings": [{"code": "generation_rejected", "detail": (
            f"g4 failed the storage re-check just now (size_mismatch: s3://{bucket}/{key}: "
            "the object's size differs from the manifest's 256 bytes); it is rejected and not "
            "planned")}],
        "newer_undecided": [],  # g4 is rejected now: decided
    }
    assert g4["objects"][1]["uri"] == f"s3://{bucket}/{key}"
    assert {r["key"] for r in s3.requests} == {"plan-key"}  # the location's own keys
    # the plan: one HEAD per object of g4, then of g2; the full verification it queued for the
    # flipped g4 (run eagerly here) reads its four intact objects again; g2 is never downloaded
    seen = Counter((r["method"], r["path"].split("/")[3]) for r in s3.requests)
    assert seen == {("HEAD", "g4"): 10, ("HEAD", "g2"): 5, ("GET", "g4"): 4}
    g = generation("r", "g4")
    assert g.status == "rejected"
    assert [r["code"] for r in g.reasons] == ["size_mismatch"]
    alert = Alert.objects.get(run__run_id="r", rule="generation_rejected")
    assert alert.state == "firing"
    assert [s["subject"] for s in alert.subjects] == ["g4"]
    assert alert.summary == "Generation g4 (update 4) is rejected: size_mismatch."
    assert generation("r", "g2").status == "restorable"


def test_it_keeps_rechecking_an_ended_run_on_s3_and_a_deleted_object_raises_generation_rejected(
        ended_s3_run, s3, settings):
    bucket_client, bucket, _, _ = ended_s3_run
    settings.RECOVERYDASH_RECHECK_ENDED_S = 3600
    now = timezone.now()
    s3.requests.clear()
    assert verification.recheck(now=now) == 0  # verified just now: not due
    assert s3.requests == []
    bucket_client.delete_object(Bucket=bucket, Key="runs/g4/rng/__0_0.distcp")

    assert verification.recheck(now=now + timedelta(seconds=3601)) == 1

    assert {r["key"] for r in s3.requests} == {"plan-key"}
    g = generation("r", "g4")
    assert g.status == "rejected"
    assert [r["code"] for r in g.reasons] == ["object_missing"]
    alert = Alert.objects.get(run__run_id="r", rule="generation_rejected")
    assert (alert.state, alert.subject) == ("firing", "g4")
    assert alert.summary == "Generation g4 (update 4) is rejected: object_missing."
    assert Analysis.objects.get(run__run_id="r").result["last_restorable"]["generation_id"] == "g2"
