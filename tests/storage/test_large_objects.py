"""Large objects are read in full, each in a task of its own: the generation stays committed,
with its verification progress on the API and the generation page, until the last one is read;
a task handed out twice reads once; a re-check of a large object read in full before stops at
its size."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from recoverydash.runs.models import CheckpointObject
from recoverydash.storage import verification

from .conftest import checks, generation, manifest, run_events, write_generation

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def held(monkeypatch, settings):
    """Object tasks are held (their pks listed) instead of sent; every 256-byte object of the
    test generations counts as large."""
    settings.RECOVERYDASH_VERIFY_INLINE_MAX_BYTES = 200
    sent: list = []
    monkeypatch.setattr(verification, "_send_object_tasks",
                        lambda pks, before: sent.extend((pk, before) for pk in pks) or len(pks))
    return sent


def _recovery_generation(client, token, run_id, generation_id):
    r = client.get(f"/api/v1/runs/{run_id}/recovery", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert r.status_code == 200, r.content
    return next(g for g in r.json()["generations"] if g["generation_id"] == generation_id)


def test_each_large_object_is_read_in_a_task_of_its_own_and_the_generation_waits(
        project, tmp_path, declare_location, ingest, held, client, full_token):
    location = tmp_path / "ckpt"
    declare_location(project, location)
    objects = write_generation(location, "g1")
    ingest(project, run_events("big", [manifest("g1", 2, objects)], 2))
    assert len(held) == 5 and {s for s, _ in checks("big").values()} == {"pending"}
    assert generation("big", "g1").status == "committed"
    got = _recovery_generation(client, full_token, "big", "g1")
    assert got["status"] == "committed"
    assert got["verifying"] == {"objects_checked": 0, "objects_total": 5, "bytes_checked": 0,
                                "bytes_total": 1280, "done": False,
                                "text": "verifying: 0 of 5 objects, 0 kB of 1.3 kB"}
    for pk, before in held[:2]:
        assert verification.verify_one(pk, before) == "ok"
        assert verification.verify_one(pk, before) == ""  # handed out twice: read once
    got = _recovery_generation(client, full_token, "big", "g1")
    assert (got["status"], got["verifying"]["text"]) == \
        ("committed", "verifying: 2 of 5 objects, 0.5 kB of 1.3 kB")
    from django.urls import reverse

    from tests.dashboard.conftest import _user

    client.force_login(_user("olivia", project))
    page = client.get(reverse("generation", args=[project.name, "big", "g1"]))
    assert page.status_code == 200
    assert "verifying: 2 of 5 objects, 0.5 kB of 1.3 kB: not restorable before the last byte " \
           "is checked." in page.content.decode()
    # another task holds the third object (its heartbeat is fresh): this one leaves it alone
    pk3, before3 = held[2]
    CheckpointObject.objects.filter(pk=pk3).update(hash_heartbeat_at=timezone.now())
    assert verification.verify_one(pk3, before3) == "held"
    assert CheckpointObject.objects.get(pk=pk3).check_status == "pending"
    # ... until that heartbeat is older than HEARTBEAT_STALE_S (its holder died)
    CheckpointObject.objects.filter(pk=pk3).update(
        hash_heartbeat_at=timezone.now() - timedelta(seconds=verification.HEARTBEAT_STALE_S + 1))
    for pk, before in held[2:]:
        assert verification.verify_one(pk, before) == "ok"
    assert generation("big", "g1").status == "restorable"
    assert _recovery_generation(client, full_token, "big", "g1")["verifying"] is None
    row = CheckpointObject.objects.get(pk=pk3)
    assert (row.hashed_bytes, row.hash_heartbeat_at, row.check_attempts) == (0, None, 0)


def test_a_large_object_corrupted_after_commit_is_rejected_by_its_own_task(
        project, tmp_path, declare_location, ingest, held):
    location = tmp_path / "ckpt"
    declare_location(project, location)
    objects = write_generation(location, "g1")
    path = location / "g1" / "optimizer" / "__0_0.distcp"
    data = bytearray(path.read_bytes())
    data[100] ^= 1  # one byte flipped after commit, the size kept
    path.write_bytes(bytes(data))
    ingest(project, run_events("flip", [manifest("g1", 2, objects)], 2))
    assert generation("flip", "g1").status == "committed"
    statuses = {verification.verify_one(pk, before) for pk, before in held}
    assert statuses == {"ok", "digest_mismatch"}
    g = generation("flip", "g1")
    assert g.status == "rejected" and [r["code"] for r in g.reasons] == ["digest_mismatch"]


def test_a_recheck_of_a_large_object_read_in_full_before_stops_at_its_size(
        project, tmp_path, declare_location, ingest, settings):
    settings.RECOVERYDASH_VERIFY_INLINE_MAX_BYTES = 200
    location = tmp_path / "ckpt"
    declare_location(project, location)
    objects = write_generation(location, "g1")
    ingest(project, run_events("again", [manifest("g1", 2, objects)], 2))  # tasks run eagerly
    g = generation("again", "g1")
    assert g.status == "restorable"
    sha = {o.uri: o.observed_sha256 for o in CheckpointObject.objects.filter(generation=g)}
    assert verification.verify_generation(g.pk, recheck=True) == 5
    rows = CheckpointObject.objects.filter(generation=g)
    assert {o.uri: o.observed_sha256 for o in rows} == sha
    assert all("sha256 read in full at" in o.check_detail for o in rows)
