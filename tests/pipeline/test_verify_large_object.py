"""Issue 28's check, through a real worker process: a 300 MiB object (over the 256 MiB the
worker used to check by size only) with one byte flipped after commit, its size kept, is
rejected ``digest_mismatch`` (read in full in a task of its own) before the restore plan can
name its generation.

Marked slow: it starts a worker process."""

from __future__ import annotations

import hashlib

import pytest

from recoverydash.runs.models import CheckpointObject, Generation

from .conftest import wait_for
from .test_scenarios_api import post_events, read
from .test_worker_process import MACHINE_REDIS, analysed

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
MiB = 1024 * 1024


def test_a_300_mib_object_corrupted_after_commit_is_rejected_before_the_plan_names_it(
        client, full_token, scenario_loader, tmp_path, settings, workers_on, project,
        declare_location):
    settings.RECOVERYDASH_RATE_LIMIT_PER_SECOND = 0
    declare_location(project, tmp_path)
    events, _ = scenario_loader("s1_resume_at_checkpoint_exact", str(tmp_path))
    big = tmp_path / "model-shard.bin"
    size = 300 * MiB
    with open(big, "wb") as f:  # sparse: real bytes to hash, little on disk
        f.truncate(size)
    digest = hashlib.sha256(b"\0" * size).hexdigest()  # what the trainer wrote and committed
    for ev in events:
        if ev["type"] == "checkpoint_committed":
            ev["manifest"]["objects"][0].update(uri=f"file://{big}", size=size, sha256=digest)
    with open(big, "r+b") as f:  # after the commit: one byte flipped, the size kept
        f.seek(150 * MiB)
        f.write(b"\x01")
    assert big.stat().st_size == size
    workers_on(MACHINE_REDIS)
    post_events(client, full_token, events)
    wait_for(lambda: analysed("s1-exact"), timeout=180)
    gen = Generation.objects.get(generation_id="g1250")
    obj = CheckpointObject.objects.get(generation=gen, uri=f"file://{big}")
    assert (obj.check_status, obj.check_detail) == \
        ("digest_mismatch", "sha256 of the file differs from the manifest's")
    assert obj.observed_sha256 == "" and obj.observed_size is None  # never shown
    assert gen.status == "rejected" and [r["code"] for r in gen.reasons] == ["digest_mismatch"]
    recovery, plan_status, plan = read(client, full_token, "s1-exact")
    assert recovery["last_restorable"] is None
    assert plan_status == 409 and plan["error"] == "no_restorable_generation"
    assert [(r["generation_id"], [c["code"] for c in r["reasons"]]) for r in plan["rejected"]] \
        == [("g1250", ["digest_mismatch"])]
