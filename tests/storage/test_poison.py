"""Hostile and unlucky objects end quickly and alone: a FIFO or a device is never read, a file
that grows is read only up to its declared size + 1, a digest that takes too long is abandoned
at the deadline, an over-long name, a transient error or a check that never finished is stored as
that object's state, and the periodic tasks go on for everyone else."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from recoverydash.checkpoints.objects import TransientStorageError, verify_object
from recoverydash.runs.models import CheckpointObject, Generation
from recoverydash.runs.seq import mark_changed
from recoverydash.storage import verification
from recoverydash.storage.locations import LocationRefused, check_location
from recoverydash.storage.models import StorageLocation

from .conftest import checks, generation, manifest, run_events, write_generation

pytestmark = pytest.mark.django_db(transaction=True)


def within(seconds: float, fn, *args, **kwargs):
    """``fn(*args)`` in a thread; fails the test when it has not returned after ``seconds``."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc
        finally:
            from django.db import connection

            connection.close()

    t = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"], time.monotonic() - started


def test_a_fifo_in_the_location_is_never_read(project, tmp_path, declare_location, ingest):
    location = tmp_path / "ckpt"
    declare_location(project, location)
    objects = write_generation(location, "g1")
    fifo = location / "g1" / "model" / "__0_0.distcp"
    fifo.unlink()
    os.mkfifo(fifo)  # nobody ever writes: a blocking open or read would hang the worker
    _, seconds = within(10, ingest, project, run_events("fifo", [manifest("g1", 2, objects)], 2))
    status, detail = checks("fifo")[objects[0]["uri"]]
    assert (status, detail) == ("object_missing", f"{fifo} is not a regular file (a FIFO): "
                                                  "never read as a checkpoint object")
    assert generation("fifo", "g1").status == "rejected"


def test_a_device_is_never_read_even_under_a_location_forced_onto_dev(project, ingest):
    # Declaring /dev is refused; a row put there by hand is still safe: fstat says character
    # device and nothing is read.
    StorageLocation.objects.create(project=project, url="file:///dev")
    objects = [{"uri": "file:///dev/zero", "shard": "rank0", "component": c, "size": 1 << 40,
                "sha256": "0" * 64} for c in ("model",)]
    m = manifest("g1", 2, objects, components=["model"])
    _, seconds = within(10, ingest, project, run_events("zero", [m], 2))
    assert checks("zero")["file:///dev/zero"][0] == "object_missing"
    assert "not a regular file (a character device)" in checks("zero")["file:///dev/zero"][1]


@pytest.mark.parametrize("url, why", [
    ("file:///", "the file system root"),
    ("file:///dev", "the system folder /dev"),
    ("file:///proc/self", "the system folder /proc"),
    ("file:///etc", "the system folder /etc"),
    ("relative/folder", "expected file:///absolute/folder or s3://bucket/prefix"),
    ("ftp://host/x", "expected file:///absolute/folder or s3://bucket/prefix"),
])
def test_it_refuses_to_declare_a_location_that_exposes_the_system(url, why):
    with pytest.raises(LocationRefused) as refused:
        check_location(StorageLocation(url=url))
    assert why in str(refused.value)


def test_it_refuses_to_declare_a_folder_holding_the_servers_own_files(settings, tmp_path):
    settings.VAR_DIR = tmp_path / "srv" / "var"
    with pytest.raises(LocationRefused) as refused:
        check_location(StorageLocation(url=f"file://{tmp_path / 'srv'}"))
    assert "holds the server's own files" in str(refused.value)
    url, _ = check_location(StorageLocation(url=f"file://{tmp_path / 'srv' / 'var' / 'ckpt'}/"))
    assert url == f"file://{tmp_path / 'srv' / 'var' / 'ckpt'}"


def test_a_file_that_grows_is_read_only_up_to_its_declared_size_plus_one():
    # /proc files say 0 bytes and then yield more: the read stops at 1 byte.
    check = verify_object("file:///proc/self/status", 0, "e3b0c442" + "0" * 56)
    assert check.status == "size_mismatch"
    assert check.detail == ("the file changed while it was read (its size differs from the "
                            "manifest's 0 bytes)")


def test_a_digest_that_takes_too_long_is_abandoned_at_the_deadline(tmp_path):
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(4 * 1024 ** 3)  # sparse: real bytes to hash, nothing on disk
    deadline = time.monotonic() + 0.3
    check, seconds = within(10, verify_object, f"file://{big}", 4 * 1024 ** 3, "0" * 64,
                            deadline=deadline)
    assert check.status == "storage_unverified" and check.timed_out
    assert check.detail == (f"size {4 * 1024 ** 3} matches; sha256 not checked: reading took "
                            "longer than the time allowed")
    assert seconds < 2.0


def test_an_over_long_file_name_is_that_objects_state_not_an_error(project, tmp_path,
                                                                   declare_location, ingest):
    location = tmp_path / "ckpt"
    declare_location(project, location)
    objects = write_generation(location, "g1")
    long_uri = f"file://{location.resolve()}/g1/model/{'x' * 300}"
    objects[0] = dict(objects[0], uri=long_uri)
    ingest(project, run_events("long", [manifest("g1", 2, objects)], 2))
    assert checks("long")[long_uri] == ("object_missing",
                                        "no file can have this name (File name too long)")
    assert {s for u, (s, _) in checks("long").items() if u != long_uri} == {"ok"}


def test_a_transient_error_on_one_object_is_stored_as_its_state_and_the_others_verify(
        project, tmp_path, declare_location, ingest, monkeypatch):
    location = tmp_path / "ckpt"
    declare_location(project, location)
    objects = write_generation(location, "g1")
    flaky = objects[2]["uri"]
    real = verification.verify_object

    def verify(uri, *args, **kwargs):
        if uri == flaky:
            raise TransientStorageError("stat: Input/output error")
        return real(uri, *args, **kwargs)

    monkeypatch.setattr(verification, "verify_object", verify)
    ingest(project, run_events("flaky", [manifest("g1", 2, objects)], 2))
    got = checks("flaky")
    assert got.pop(flaky) == ("error", "storage did not answer: stat: Input/output error")
    assert {s for s, _ in got.values()} == {"ok"}
    assert generation("flaky", "g1").status == "committed"  # not proven either way


def test_one_generation_that_fails_does_not_stop_the_recheck_of_the_others(
        project, tmp_path, declare_location, ingest, monkeypatch, settings):
    location = tmp_path / "ckpt"
    declare_location(project, location)
    for run in ("r1", "r2", "r3"):
        ingest(project, run_events(run, [manifest("g1", 2, write_generation(
            location / run, "g1"))], 2))
    assert {g.status for g in Generation.objects.all()} == {"restorable"}
    Generation.objects.update(verified_at=timezone.now() - timedelta(days=1))
    poisoned = generation("r2", "g1").pk
    real = verification.verify_generation

    def verify(pk, recheck_before=None):
        if pk == poisoned:
            raise RuntimeError("a bug while verifying this one")
        return real(pk, recheck_before)

    monkeypatch.setattr(verification, "verify_generation", verify)  # what the task calls
    (location / "r3" / "g1" / "rng" / "__0_0.distcp").write_bytes(b"truncated")
    assert verification.recheck() == 2
    assert generation("r3", "g1").status == "rejected"
    assert generation("r1", "g1").status == "restorable"


def test_an_object_whose_checks_never_finish_is_not_tried_again(project, tmp_path,
                                                                declare_location, ingest,
                                                                settings, opened):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    location = tmp_path / "ckpt"
    declare_location(project, location)
    objects = write_generation(location, "g1")
    ingest(project, run_events("poison", [manifest("g1", 2, objects)], 2))
    gen = generation("poison", "g1")
    # three checks of the model started and died (the worker was killed each time)
    CheckpointObject.objects.filter(generation=gen, component="model").update(
        check_status="pending", check_attempts=settings.RECOVERYDASH_VERIFY_MAX_ATTEMPTS)
    seen = opened(location / "g1" / "model" / "__0_0.distcp")
    verification.verify_generation(gen.pk)
    obj = CheckpointObject.objects.get(generation=gen, component="model")
    assert obj.check_status == "storage_unverified"
    assert obj.check_detail.startswith("not verified: 3 checks of this object started and "
                                       "never finished")
    assert not [p for p in seen if "model" in p]


def test_the_sweep_requeues_a_generation_left_unchecked_and_waits_for_a_running_one(
        project, tmp_path, declare_location, ingest, settings):
    location = tmp_path / "ckpt"
    declare_location(project, location)
    ingest(project, run_events("stuck", [manifest("g1", 2, write_generation(location, "g1"))], 2))
    gen = generation("stuck", "g1")
    assert gen.status == "restorable"
    # as if the worker died in the middle: two objects checked long ago, three never
    long_ago = timezone.now() - timedelta(hours=1)
    CheckpointObject.objects.filter(generation=gen, component__in=["model", "optimizer",
                                                                   "scheduler"]).update(
        check_status="pending", checked_at=None, check_started_at=long_ago, check_attempts=1)
    CheckpointObject.objects.filter(generation=gen).exclude(check_status="pending").update(
        checked_at=long_ago)
    Generation.objects.filter(pk=gen.pk).update(status="committed")
    # the writers of these rows mark the generation changed (runs.seq.mark_changed)
    mark_changed(gen.run_id, gen.pk)
    settings.RECOVERYDASH_VERIFY_STALE_S = 600
    assert verification.sweep_unverified() == 1
    assert {o.check_status for o in CheckpointObject.objects.filter(generation=gen)} == {"ok"}
    assert generation("stuck", "g1").status == "restorable"
    # one whose check started a minute ago may still be running: left alone
    CheckpointObject.objects.filter(generation=gen, component="model").update(
        check_status="pending", check_started_at=timezone.now() - timedelta(seconds=60))
    assert verification.sweep_unverified() == 0
