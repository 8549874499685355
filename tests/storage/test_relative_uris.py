"""Objects named relative to their generation folder, and trainer paths mapped to what the
server sees: a manifest found in storage resolves against the folder it was found in (so a
copied folder verifies against the copy), one that came by event against the ``base_uri`` or
``location`` it declares, and ``StorageLocation.trainer_url`` rewrites the trainers' prefix."""

from __future__ import annotations

import shutil
import uuid

import pytest

from recoverydash.checkpoints.objects import write_manifest_atomically
from recoverydash.ingest.discovery import discover_all
from recoverydash.runs.models import CheckpointObject

from .conftest import checks, generation, manifest, run_events, write_generation

pytestmark = pytest.mark.django_db(transaction=True)


def resolved(run_id: str) -> dict:
    return dict(CheckpointObject.objects.filter(generation__run__run_id=run_id)
                .values_list("uri", "resolved_uri"))


def test_relative_objects_resolve_against_the_location_the_manifest_declares(
        project, tmp_path, declare_location, ingest):
    server = tmp_path / "data" / "ckpt"
    trainer = f"/mnt/ckpt-{uuid.uuid4().hex[:6]}"  # a path only the trainers have
    declare_location(project, server, trainer_url=f"file://{trainer}")
    objects = write_generation(server / "run1", "g1", relative=True)
    ingest(project, run_events("rel", [manifest("g1", 2, objects,
                                                location=f"file://{trainer}/run1")], 2))
    assert generation("rel", "g1").status == "restorable"
    assert resolved("rel")["model/__0_0.distcp"] == \
        f"file://{server.resolve()}/run1/g1/model/__0_0.distcp"
    status, detail = checks("rel")["model/__0_0.distcp"]
    assert status == "ok" and detail.endswith(
        f"(at file://{server.resolve()}/run1/g1/model/__0_0.distcp)")


def test_relative_objects_resolve_against_the_base_uri_the_manifest_declares(
        project, tmp_path, declare_location, ingest):
    location = tmp_path / "ckpt"
    declare_location(project, location)
    objects = write_generation(location, "g1", relative=True)
    ingest(project, run_events("base", [manifest(
        "g1", 2, objects, base_uri=f"file://{location.resolve()}/g1/")], 2))
    assert generation("base", "g1").status == "restorable"


def test_a_relative_object_with_no_folder_to_resolve_against_is_not_read(
        project, tmp_path, declare_location, ingest):
    location = tmp_path / "ckpt"
    declare_location(project, location)
    objects = write_generation(location, "g1", relative=True)
    ingest(project, run_events("nobase", [manifest("g1", 2, objects)], 2))
    status, detail = checks("nobase")["model/__0_0.distcp"]
    assert (status, detail) == ("object_outside_locations", "relative object URI "
                                "'model/__0_0.distcp' and no folder to resolve it against: "
                                "never read")


def test_absolute_trainer_paths_are_mapped_to_the_servers(project, tmp_path, declare_location,
                                                          ingest):
    server = tmp_path / "data" / "ckpt"
    trainer = f"/mnt/ckpt-{uuid.uuid4().hex[:6]}"
    declare_location(project, server, trainer_url=trainer)
    objects = write_generation(server, "g1", uri_root=trainer)  # file:///mnt/ckpt-.../g1/...
    ingest(project, run_events("mapped", [manifest("g1", 2, objects)], 2))
    assert generation("mapped", "g1").status == "restorable"
    assert resolved("mapped")[f"file://{trainer}/g1/rng/__0_0.distcp"] == \
        f"file://{server.resolve()}/g1/rng/__0_0.distcp"


def test_a_mapped_prefix_cannot_be_left_with_dot_dot(project, tmp_path, declare_location, ingest):
    server = tmp_path / "data" / "ckpt"
    trainer = f"/mnt/ckpt-{uuid.uuid4().hex[:6]}"
    declare_location(project, server, trainer_url=trainer)
    (tmp_path / "data").mkdir(parents=True, exist_ok=True)
    (tmp_path / "data" / "secret").write_text("x")
    objects = write_generation(server, "g1", uri_root=trainer)
    escape = f"file://{trainer}/../../{tmp_path.relative_to('/')}/data/secret"
    objects[0] = dict(objects[0], uri=escape, size=1)
    ingest(project, run_events("escape", [manifest("g1", 2, objects)], 2))
    assert checks("escape")[escape][0] == "object_outside_locations"


def test_a_copied_folder_is_verified_against_the_copy_where_its_manifest_was_found(
        project, tmp_path, declare_location, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    original, copy = tmp_path / "original", tmp_path / "copy"
    objects = write_generation(original, "g1", relative=True)
    write_manifest_atomically(str(original), manifest("g1", 0, objects, run_id="copied",
                                                      attempt=0))
    shutil.copytree(original, copy)
    (copy / "g1" / "optimizer" / "__0_0.distcp").write_bytes(b"truncated in the copy")
    declare_location(project, copy)  # only the copy is this project's
    assert discover_all() == 1
    gen = generation("copied", "g1")
    assert gen.found_at == f"file://{copy.resolve()}/g1"
    got = checks("copied")
    assert got["optimizer/__0_0.distcp"] == (
        "size_mismatch", f"the file's size differs from the manifest's 256 bytes (at "
                         f"file://{copy.resolve()}/g1/optimizer/__0_0.distcp)")
    assert {s for u, (s, _) in got.items() if not u.startswith("optimizer")} == {"ok"}
    assert gen.status == "rejected"
