"""Poison through real worker processes: a FIFO, a link to /dev/zero and a huge file end within
the task's time limit; a worker SIGKILLed mid-verification is re-run by the sweep; the embedded
(filesystem) broker drops empty and corrupt message files with a log line and keeps serving.

Marked slow: each test starts worker processes."""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from recoverydash.ingest.actions import ingest_batch
from recoverydash.runs.models import CheckpointObject, Generation

from .conftest import Worker, point_app_at, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
MACHINE_REDIS = "redis://127.0.0.1:6379/0"
HUGE = 1 << 40
COMPONENTS = ["model", "optimizer", "scheduler", "rng", "data_progress"]


def generation_files(folder, generation_id="g1"):
    objects = []
    for component in COMPONENTS:
        path = folder / generation_id / component
        path.parent.mkdir(parents=True, exist_ok=True)
        data = hashlib.sha256(f"{generation_id}{component}".encode()).digest() * 8
        path.write_bytes(data)
        objects.append({"uri": f"file://{path}", "shard": "rank0", "component": component,
                        "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    return objects


def events(run_id, objects, generation_id="g1"):
    t = "2026-11-01T00:00:0{}Z"
    return [
        {"event_id": f"{run_id}:s", "type": "attempt_started", "run_id": run_id, "attempt": 0,
         "time": t.format(0), "world_size": 1, "dataset_version": "ds-v1"},
        {"event_id": f"{run_id}:u1", "type": "update_committed", "run_id": run_id, "attempt": 0,
         "time": t.format(1), "update": 1, "rank": 0,
         "spans": [{"stratum": "main", "epoch": 0, "ranges": [[0, 4]]}]},
        {"event_id": f"{run_id}:c", "type": "checkpoint_committed", "run_id": run_id,
         "attempt": 0, "time": t.format(2), "manifest": {
             "schema_revision": 1, "generation_id": generation_id, "update": 1,
             "world_size": 1, "required_shards": ["rank0"], "components": COMPONENTS,
             "objects": objects, "dataset_version": "ds-v1", "committed_at": t.format(2),
             "data_progress": {"cursor": [{"stratum": "main", "epoch": 0, "position": 4}]}}},
    ]


def sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def statuses(run_id):
    return {o.component: (o.check_status, o.check_detail) for o in
            CheckpointObject.objects.filter(generation__run__run_id=run_id, in_manifest=True)}


def settled(run_id):
    got = statuses(run_id)
    return len(got) == 5 and all(s not in ("pending", "error") for s, _ in got.values()) and got


def start_worker(settings, broker, **env) -> Worker:
    queue = f"test-{os.getpid()}-{time.monotonic_ns()}"
    point_app_at(broker, queue, settings)
    worker = Worker(broker, queue)
    worker.env.update({k: str(v) for k, v in env.items()})
    return worker.start()


def test_a_fifo_a_link_to_dev_zero_and_a_huge_file_end_within_the_time_limit(
        project, tmp_path, declare_location, settings):
    location = tmp_path / "ckpt"
    declare_location(project, location)
    objects = generation_files(location)
    os.unlink(location / "g1" / "model")
    os.mkfifo(location / "g1" / "model")                     # never written to
    os.unlink(location / "g1" / "optimizer")
    os.symlink("/dev/zero", location / "g1" / "optimizer")   # endless bytes
    huge = location / "g1" / "scheduler"
    with open(huge, "wb") as f:   # sparse: 1 TiB of holes, minutes to hash on any machine
        f.truncate(HUGE)
    objects[2].update(size=HUGE, sha256="0" * 64)            # never reached within 2.8 s
    objects[1].update(size=1 << 40)
    # a large object's task may read for VERIFY_BASE_S + size / VERIFY_MIN_BYTES_PER_S seconds:
    # 2 s + 1.1 s here (the read stops at 90 % of it), so the 1 TiB is abandoned, not hashed
    settings.RECOVERYDASH_VERIFY_BASE_S = 2.0
    settings.RECOVERYDASH_VERIFY_MIN_BYTES_PER_S = 1e12
    worker = start_worker(settings, MACHINE_REDIS, RECOVERYDASH_TASK_SOFT_TIME_LIMIT_S=3,
                          RECOVERYDASH_TASK_TIME_LIMIT_S=5, RECOVERYDASH_VERIFY_BASE_S=2.0,
                          RECOVERYDASH_VERIFY_MIN_BYTES_PER_S=1e12)
    try:
        time.sleep(2.0)  # the worker connects before the work arrives
        started = time.monotonic()
        ingest_batch(project, events("poison", objects))
        got = wait_for(lambda: settled("poison"), timeout=60)
        elapsed = time.monotonic() - started
        # the generation is judged by the analysis the last object's result asks for
        wait_for(lambda: Generation.objects.filter(generation_id="g1",
                                                   status="rejected").exists(), timeout=60)
        assert worker.proc.poll() is None  # the worker lives on
    finally:
        worker.stop()
    # the huge file's digest is abandoned within its own task's time (90 % of 3.1 s); the other
    # objects are checked beside it
    assert elapsed < 2 * 3 + 5
    assert got["model"] == ("object_missing", f"{location / 'g1' / 'model'} is not a regular "
                                              "file (a FIFO): never read as a checkpoint object")
    assert got["optimizer"][0] == "object_outside_locations"
    assert "leads out of the storage location" in got["optimizer"][1]
    assert got["scheduler"] == ("storage_unverified", f"size {HUGE} matches; sha256 not "
                                "checked: reading took longer than the time allowed")
    assert got["rng"][0] == got["data_progress"][0] == "ok"
    assert Generation.objects.get(generation_id="g1").status == "rejected"


def test_a_worker_killed_mid_verification_is_rerun_by_the_sweep(project, tmp_path,
                                                                declare_location, settings):
    location = tmp_path / "ckpt"
    declare_location(project, location)
    objects = generation_files(location)
    big = location / "g1" / "model"
    objects[0].update(size=6 * 1024 ** 3, sha256=sparse(big, 6 * 1024 ** 3))
    # the broker would hand the task out again only after an hour
    first = start_worker(settings, MACHINE_REDIS, RECOVERYDASH_BROKER_VISIBILITY_TIMEOUT_S=3600)
    second = None
    try:
        time.sleep(2.0)
        ingest_batch(project, events("killed", objects))
        model = CheckpointObject.objects.get(generation__run__run_id="killed", component="model")
        wait_for(lambda: CheckpointObject.objects.filter(
            pk=model.pk, check_attempts=1).exists(), timeout=30)
        time.sleep(0.5)  # hashing the 6 GiB now
        first.kill()
        model.refresh_from_db()
        assert model.check_status == "pending"
        second = Worker(first.env["CELERY_BROKER_URL"], first.queue)
        second.env.update(first.env)
        second.start()
        time.sleep(5.0)
        model.refresh_from_db()
        assert model.check_status == "pending"  # nobody re-runs it by itself
        from recoverydash.storage.verification import sweep_unverified

        later = timezone.now() + timedelta(seconds=settings.RECOVERYDASH_VERIFY_STALE_S + 1)
        assert sweep_unverified(now=later) == 1
        got = wait_for(lambda: settled("killed"), timeout=120)
        wait_for(lambda: Generation.objects.filter(generation_id="g1",
                                                   status="restorable").exists(), timeout=60)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert {s for s, _ in got.values()} == {"ok"}
    model.refresh_from_db()
    assert model.check_attempts == 0
    assert Generation.objects.get(generation_id="g1").status == "restorable"


def test_the_embedded_broker_drops_an_empty_message_and_keeps_serving(
        project, tmp_path, declare_location, settings):
    broker_dir = tmp_path / "broker"
    for sub in ("queue", "processed", "control"):
        (broker_dir / sub).mkdir(parents=True)
    from workers.broker import install
    from workers.celery import app

    install()
    saved = app.conf.broker_transport_options
    app.conf.broker_transport_options = {
        "data_folder_in": str(broker_dir / "queue"), "data_folder_out": str(broker_dir / "queue"),
        "processed_folder": str(broker_dir / "processed"),
        "control_folder": str(broker_dir / "control"), "store_processed": False}
    location = tmp_path / "ckpt"
    declare_location(project, location)
    worker = start_worker(settings, "filesystem://", CELERY_BROKER_DIR=broker_dir)
    try:
        queue = worker.queue
        # a torn write and a corrupt file, older than any real message
        (broker_dir / "queue" / f"0_{uuid.uuid4()}.{queue}.msg").write_bytes(b"")
        (broker_dir / "queue" / f"00_{uuid.uuid4()}.{queue}.msg").write_bytes(b"{\"body\": ")
        ingest_batch(project, events("broker", generation_files(location)))
        got = wait_for(lambda: settled("broker"), timeout=60)
        assert worker.proc.poll() is None
    finally:
        worker.stop()
        app.conf.broker_transport_options = saved
    assert {s for s, _ in got.values()} == {"ok"}
    assert sorted(p.name.split("_")[0] for p in (broker_dir / "bad").iterdir()) == ["0", "00"]
