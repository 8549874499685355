"""Attacks of an ingest-only token on the server's files: a manifest naming objects outside the
project's storage locations is recorded as ``object_outside_locations`` and nothing outside is
opened (every ``open`` in this process is watched); neither a page nor the API shows what a
failing object holds."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from .conftest import checks, generation, manifest, run_events, write_generation

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def secret(tmp_path):
    """A file of the server's outside every location, whose size and digest the attacker
    knows (the strongest case: an equality oracle would confirm them)."""
    folder = tmp_path / "server"
    folder.mkdir()
    path = folder / "secret_key-7f3a"
    path.write_bytes(b"django-insecure-the-real-secret\n")
    return path


def attack_uris(location, secret):
    """Ways to name ``secret`` from a manifest of a project whose location is ``location``."""
    loc = location.resolve()
    link = loc / "g1" / "linked"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(secret.parent, target_is_directory=True)
    return {
        "absolute": f"file://{secret}",
        "plain path": str(secret),
        "dot-dot": f"file://{loc}/g1/../../server/{secret.name}",
        "percent-encoded dot-dot": f"file://{loc}/g1/%2e%2e/%2E%2e/server/{secret.name}",
        "duplicate slashes": f"file:////{str(secret).lstrip('/')}",
        "localhost host": f"file://localhost{secret}",
        "another host": f"file://fileserver.internal{secret}",
        "symlink inside the location": f"file://{loc}/g1/linked/{secret.name}",
        "relative with dot-dot": f"../../server/{secret.name}",
    }


ATTACKS = ["absolute", "plain path", "dot-dot", "percent-encoded dot-dot", "duplicate slashes",
           "localhost host", "another host", "symlink inside the location",
           "relative with dot-dot"]


@pytest.mark.parametrize("how", ATTACKS)
def test_an_ingest_token_cannot_make_the_server_open_a_file_outside_the_locations(
        how, project, tmp_path, secret, declare_location, ingest, opened):
    location = tmp_path / "ckpt"
    declare_location(project, location)
    objects = write_generation(location, "g1")
    uri = attack_uris(location, secret)[how]
    data = secret.read_bytes()
    objects[0] = dict(objects[0], uri=uri, size=len(data), sha256=hashlib.sha256(data).hexdigest())
    m = manifest("g1", 2, objects, location=f"file://{location.resolve()}")
    control = location / "g1" / "scheduler" / "__0_0.distcp"
    seen = opened(secret, control)
    ingest(project, run_events("attack", [m], updates=2))

    assert seen and all(p.endswith("__0_0.distcp") for p in seen)  # the watch sees opens...
    assert not [p for p in seen if secret.name in p]  # ...and the secret was never opened
    status, detail = checks("attack")[uri]
    assert status == "object_outside_locations", (status, detail)
    assert "never read" in detail and data.decode().strip() not in detail
    gen = generation("attack", "g1")
    assert gen.status == "rejected"
    assert [r["code"] for r in gen.reasons] == ["object_outside_locations"]


def test_the_other_objects_of_that_generation_are_still_verified(
        project, tmp_path, secret, declare_location, ingest):
    location = tmp_path / "ckpt"
    declare_location(project, location)
    objects = write_generation(location, "g1")
    objects[0] = dict(objects[0], uri=f"file://{secret}")
    ingest(project, run_events("mixed", [manifest("g1", 2, objects)], updates=2))
    statuses = {uri: s for uri, (s, _) in checks("mixed").items()}
    assert statuses.pop(f"file://{secret}") == "object_outside_locations"
    assert set(statuses.values()) == {"ok"}


def test_a_symlink_swapped_in_after_the_check_is_not_followed(tmp_path):
    """What was checked is what is opened: files are opened beneath the location's folder one
    component at a time with O_NOFOLLOW, so a folder replaced by a link in between fails."""
    from recoverydash.checkpoints import paths

    root = tmp_path / "ckpt"
    (root / "g1").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "model").write_bytes(b"x")
    (root / "g1" / "model").write_bytes(b"x")
    fd = paths.open_beneath(str(root), "g1/model")
    os.close(fd)
    (root / "g1" / "model").unlink()
    (root / "g1").rmdir()
    (root / "g1").symlink_to(tmp_path / "outside", target_is_directory=True)
    with pytest.raises(OSError):
        paths.open_beneath(str(root), "g1/model")


def test_it_never_shows_the_digest_or_size_of_an_object_that_fails(
        project, tmp_path, declare_location, ingest, owner_user_client, full_token, client):
    location = tmp_path / "ckpt"
    declare_location(project, location)
    objects = write_generation(location, "g1")
    truth = (location / "g1" / "model" / "__0_0.distcp").read_bytes()
    observed = hashlib.sha256(truth).hexdigest()
    objects[0] = dict(objects[0], sha256="0" * 64)                  # digest differs
    objects[1] = dict(objects[1], size=objects[1]["size"] + 1000)   # size differs
    ingest(project, run_events("leak", [manifest("g1", 2, objects)], updates=2))

    from recoverydash.runs.models import CheckpointObject

    rows = {o.component: o for o in CheckpointObject.objects.filter(generation__run__run_id="leak")}
    assert rows["model"].check_status == "digest_mismatch"
    assert rows["model"].check_detail == "sha256 of the file differs from the manifest's"
    assert (rows["model"].observed_sha256, rows["model"].observed_size) == ("", None)
    assert rows["optimizer"].check_status == "size_mismatch"
    assert rows["optimizer"].check_detail == \
        "the file's size differs from the manifest's 1256 bytes"
    assert rows["optimizer"].observed_size is None
    assert rows["scheduler"].observed_sha256 and rows["scheduler"].observed_size == 256

    gen = generation("leak", "g1")
    page = owner_user_client.get(
        f"/p/{gen.run.project.name}/runs/{gen.run.run_id}/generations/g1/").content.decode()
    api = client.get("/api/v1/runs/leak/recovery",
                     HTTP_AUTHORIZATION=f"Bearer {full_token}").content.decode()
    for text in (page, api):
        assert observed not in text and observed[:16] not in text
    assert "sha256 of the file differs from the manifest&#x27;s" in page
    assert json.loads(api)["generations"][0]["status"] == "rejected"


@pytest.fixture
def owner_user_client(client, project, django_user_model):
    from django.test import Client

    from recoverydash.runs.models import Membership

    user = django_user_model.objects.create_user("oncall", password="pw")
    Membership.objects.create(project=project, user=user)
    c = Client()
    c.force_login(user)
    return c
