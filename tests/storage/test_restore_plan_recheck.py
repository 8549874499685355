"""Verify at the moment of the question: the restore plan re-checks the sizes of the generation it
is about to name, falls back to the previous restorable one when a shard was truncated after the
run ended, flips the broken one and says so; the run page does the same for its first card; the
periodic re-check keeps looking at ended runs and a change it finds raises
``generation_rejected``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from recoverydash.alerts.models import Alert
from recoverydash.runs.models import Analysis, Generation
from recoverydash.storage import verification

from .conftest import generation, manifest, run_events, write_generation

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ended_run(project, tmp_path, declare_location, ingest):
    """Run ``r`` ended after generations g2 (update 2) and g4 (update 4), both restorable."""
    location = tmp_path / "ckpt"
    declare_location(project, location)
    g2 = manifest("g2", 2, write_generation(location, "g2"))
    g4 = manifest("g4", 4, write_generation(location, "g4"))
    ingest(project, run_events("r", [g2, g4], updates=5))
    assert Analysis.objects.get(run__run_id="r").health == "ended"
    assert {g.generation_id: g.status for g in Generation.objects.all()} == \
        {"g2": "restorable", "g4": "restorable"}
    return location, g2, g4


def plan(client, token, run_id="r"):
    return client.get(f"/api/v1/runs/{run_id}/restore-plan",
                      HTTP_AUTHORIZATION=f"Bearer {token}")


def test_the_restore_plan_falls_back_when_a_shard_was_truncated_after_the_run_ended(
        ended_run, client, full_token):
    location, g2, g4 = ended_run
    assert plan(client, full_token).json()["generation_id"] == "g4"
    shard = location / "g4" / "optimizer" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])  # truncated after the run ended

    answer = plan(client, full_token)

    assert answer.status_code == 200
    assert answer.json() == {
        "generation_id": "g2", "update": 2, "logger_rewind_update": 2,
        "committed_at": "2026-11-01T00:01:02+00:00",
        "objects": [{k: o[k] for k in ("uri", "shard", "component", "size", "sha256")}
                    | {"update": None} for o in g2["objects"]],
        "cursor": [{"stratum": "main", "epoch": 0, "position": 8}],
        "warnings": [{"code": "generation_rejected", "detail": (
            f"g4 failed the storage re-check just now (size_mismatch: {g4['objects'][1]['uri']}: "
            "the file's size differs from the manifest's 256 bytes); it is rejected and not "
            "planned")}],
        "newer_undecided": [],  # g4 is rejected now: decided
    }
    g = generation("r", "g4")
    assert g.status == "rejected"
    assert [r["code"] for r in g.reasons] == ["size_mismatch"]
    alert = Alert.objects.get(run__run_id="r", rule="generation_rejected", subject="g4")
    assert alert.state == "firing"


def test_the_plan_says_409_when_the_only_generation_is_gone(project, tmp_path, declare_location,
                                                            ingest, client, full_token):
    location = tmp_path / "ckpt"
    declare_location(project, location)
    ingest(project, run_events("r", [manifest("g2", 2, write_generation(location, "g2"))], 3))
    (location / "g2" / "model" / "__0_0.distcp").unlink()
    answer = plan(client, full_token)
    assert answer.status_code == 409
    body = answer.json()
    assert body["error"] == "no_restorable_generation"
    (rejected,) = body["rejected"]
    assert rejected["generation_id"] == "g2" and rejected["status"] == "rejected"
    assert [r["code"] for r in rejected["reasons"]] == ["object_missing"]


def test_the_plan_says_what_it_could_not_recheck_in_time(ended_run, client, full_token,
                                                         settings):
    settings.RECOVERYDASH_RESTORE_RECHECK_S = 0.000001
    body = plan(client, full_token).json()
    assert body["generation_id"] == "g4"
    (warning,) = body["warnings"]
    assert warning["code"] == "storage_recheck_incomplete"
    assert warning["detail"].startswith("sizes of 0 of 5 objects of g4 re-checked within 1e-06 s;"
                                        " the others were last verified 20")


def test_the_run_page_names_the_previous_generation_once_a_shard_is_truncated(
        ended_run, project, django_user_model):
    from django.test import Client

    from recoverydash.runs.models import Membership

    location, _, _ = ended_run
    user = django_user_model.objects.create_user("oncall", password="pw")
    Membership.objects.create(project=project, user=user)
    browser = Client()
    browser.force_login(user)
    run_pk = generation("r", "g4").run_id
    (location / "g4" / "model" / "__0_0.distcp").write_bytes(b"")
    Generation.objects.update(verified_at=timezone.now() - timedelta(minutes=5))
    # the old address redirects
    page = browser.get(f"/runs/{run_pk}/", follow=True).content.decode()
    assert Analysis.objects.get(run_id=run_pk).result["last_restorable"]["generation_id"] == "g2"
    assert "g2" in page
    assert generation("r", "g4").status == "rejected"


def test_ended_runs_keep_being_rechecked_and_a_change_raises_generation_rejected(
        ended_run, settings):
    location, _, _ = ended_run
    settings.RECOVERYDASH_RECHECK_ENDED_S = 3600
    now = timezone.now()
    assert verification.recheck(now=now) == 0  # verified just now: not due
    (location / "g4" / "rng" / "__0_0.distcp").unlink()
    assert verification.recheck(now=now + timedelta(seconds=3601)) == 1
    assert generation("r", "g4").status == "rejected"
    assert Alert.objects.get(run__run_id="r", rule="generation_rejected",
                             subject="g4").state == "firing"
    assert Analysis.objects.get(run__run_id="r").result["last_restorable"]["generation_id"] == "g2"
